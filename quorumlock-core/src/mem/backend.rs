use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use super::config::MemConfig;
use super::core::MemCore;
use super::session::MemSession;
use super::store;
use crate::backend::{
    Backend, Capabilities, ChangeFeed, HeldEntry, KeyWrite, SessionLiveness, StoreSession,
};
use crate::url;
use crate::{LockName, LockState, Result};

/// The in-memory backend. Cheap to clone; clones share counters.
#[derive(Clone)]
pub struct MemBackend {
    core: Arc<MemCore>,
}

impl fmt::Debug for MemBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemBackend")
            .field("config", &self.core.config)
            .finish()
    }
}

impl MemBackend {
    /// A backend on the store named by `config`; the same shape as every
    /// backend's `from_config`. Its only error is a config that breaks
    /// the URL's rules ([`MemConfig::validate`]): a mem store is in this
    /// process, nothing to reach.
    ///
    /// # Cancel safety
    /// Nothing to cancel: a mem store is in this process.
    pub async fn from_config(config: MemConfig) -> Result<Self> {
        config.validate()?;
        Ok(MemBackend {
            core: Arc::new(MemCore::new(config)),
        })
    }

    /// Parses `mem://...` (see [`MemConfig::from_url`]); the same shape
    /// as every backend's `connect`. A bad URL is
    /// [`ErrorKind::InvalidUrl`](crate::ErrorKind::InvalidUrl).
    ///
    /// # Cancel safety
    /// Nothing to cancel: a mem store is in this process.
    pub async fn connect(url: impl AsRef<str>) -> Result<Self> {
        Self::from_config(MemConfig::parse(url.as_ref())?).await
    }

    /// The configuration.
    pub fn config(&self) -> &MemConfig {
        &self.core.config
    }

    /// Stops (or resumes) renewing this backend's sessions, as a paused
    /// process would: the store expires them after the TTL while the
    /// holder's local deadline fires first.
    pub fn pause_keepalive(&self, paused: bool) {
        self.core.pause_keepalive(paused);
    }
}

#[async_trait]
impl Backend for MemBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kill_session: true,
            rwlock: true,
            semaphore: true,
            session_ttl: self.core.config.ttl,
            proclaim: true,
            changes: true,
            acquire_many: true,
            upgradeable_read: true,
        }
    }

    fn describe(&self) -> String {
        let c = &self.core.config;
        let u = format!("mem://{}/{}", c.store, c.namespace);
        url::parse(&u).map(|u| url::redact(&u)).unwrap_or(u)
    }

    async fn open_session(&self, liveness: Arc<SessionLiveness>) -> Result<Arc<dyn StoreSession>> {
        let session = MemSession::open(self.core.clone(), liveness);
        if let Some(id) = store::parse_session_id(&session.id()) {
            self.core.opened.lock().expect("poisoned").push(id);
        }
        Ok(Arc::new(session))
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        Ok(self.core.inspect(name))
    }

    async fn list(&self, prefix: Option<&LockName>) -> Result<Vec<LockState>> {
        Ok(self.core.list(prefix))
    }

    async fn break_lock(&self, name: &LockName) -> Result<bool> {
        Ok(self.core.break_lock(name))
    }

    async fn request_revoke(&self, name: &LockName) -> Result<bool> {
        Ok(self.core.request_revoke(name))
    }

    async fn kill_session(&self, session: &str) -> Result<()> {
        self.core.kill_session(session)
    }

    async fn leftovers(&self) -> Result<Vec<String>> {
        Ok(self.core.leftovers())
    }

    fn requests_sent(&self) -> u64 {
        self.core.requests()
    }

    async fn fenced_write(&self, held: &[HeldEntry], write: &KeyWrite) -> Result<()> {
        self.core.fenced_write(held, write)
    }

    async fn read_key(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.core.read_key(key)
    }

    async fn write_key(&self, write: &KeyWrite) -> Result<()> {
        self.core.write_key(write)
    }

    fn changes(&self, name: &LockName) -> Option<ChangeFeed> {
        Some(self.core.changes(name))
    }
}
