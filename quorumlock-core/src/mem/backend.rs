use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::config::MemConfig;
use super::core::Core;
use super::session::MemSession;
use super::store::{self, MemStore};
use crate::backend::{
    check_kinds, refused, Backend, Capabilities, HeldEntry, KeyWrite, SessionLiveness, StoreSession,
};
use crate::url;
use crate::{Error, ErrorKind, LockName, LockState, LossReason, Result};

/// The in-memory backend. Cheap to clone; clones share counters.
#[derive(Clone)]
pub struct MemBackend {
    inner: Arc<Inner>,
}

struct Inner {
    core: Arc<Core>,
    /// Sessions opened by this backend, for [`Backend::leftovers`].
    opened: Mutex<Vec<u64>>,
}

impl fmt::Debug for MemBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemBackend")
            .field("config", &self.inner.core.config)
            .finish()
    }
}

impl MemBackend {
    /// A backend on the store named by `config`.
    pub fn new(config: MemConfig) -> Self {
        MemBackend {
            inner: Arc::new(Inner {
                core: Arc::new(Core::new(config)),
                opened: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Parses `mem://...` (see [`MemConfig::from_url`]); the same shape
    /// as every backend's `connect`. A bad URL is
    /// [`ErrorKind::InvalidUrl`].
    ///
    /// # Cancel safety
    /// Nothing to cancel: a mem store is in this process.
    pub async fn connect(url: impl AsRef<str>) -> Result<Self> {
        Ok(Self::new(MemConfig::from_url(&url::parse(url.as_ref())?)?))
    }

    /// The configuration.
    pub fn config(&self) -> &MemConfig {
        &self.inner.core.config
    }

    /// Stops (or resumes) renewing this backend's sessions, as a paused
    /// process would: the store expires them after the TTL while the
    /// holder's local deadline fires first.
    pub fn pause_keepalive(&self, paused: bool) {
        self.inner.core.pause_keepalive(paused);
    }

    fn core(&self) -> &Core {
        &self.inner.core
    }

    fn store(&self) -> &MemStore {
        self.core().store()
    }

    fn count_request(&self) {
        self.core().count_request();
    }

    fn key(&self, name: &LockName) -> String {
        self.core().key(name)
    }
}

#[async_trait]
impl Backend for MemBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kill_session: true,
            rwlock: true,
            semaphore: true,
            session_ttl: self.inner.core.config.ttl,
            proclaim: true,
        }
    }

    fn describe(&self) -> String {
        let c = &self.inner.core.config;
        let u = format!("mem://{}/{}", c.store, c.namespace);
        url::parse(&u).map(|u| url::redact(&u)).unwrap_or(u)
    }

    async fn open_session(&self, liveness: Arc<SessionLiveness>) -> Result<Arc<dyn StoreSession>> {
        let session = MemSession::open(self.inner.core.clone(), liveness);
        if let Some(id) = store::parse_session_id(&session.id()) {
            self.inner.opened.lock().expect("poisoned").push(id);
        }
        Ok(Arc::new(session))
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        self.count_request();
        let (holders, waiters) = self.store().state().contenders(&self.key(name));
        Ok(LockState {
            name: name.clone(),
            holders,
            waiters,
        })
    }

    async fn list(&self, prefix: Option<&LockName>) -> Result<Vec<LockState>> {
        self.count_request();
        let under = self.core().config.namespace.prefix();
        let st = self.store().state();
        let key = prefix.map(|p| self.key(p));
        let mut out = Vec::new();
        for k in st.keys_under(&under, key.as_deref()) {
            let Some(name) = LockName::from_key(&k[under.len()..]) else {
                continue;
            };
            let (holders, waiters) = st.contenders(&k);
            out.push(LockState {
                name,
                holders,
                waiters,
            });
        }
        Ok(out)
    }

    async fn break_lock(&self, name: &LockName) -> Result<bool> {
        self.count_request();
        Ok(self.store().state().break_holders(&self.key(name)))
    }

    async fn request_revoke(&self, name: &LockName) -> Result<bool> {
        self.count_request();
        Ok(self.store().state().revoke_holders(&self.key(name)))
    }

    async fn kill_session(&self, session: &str) -> Result<()> {
        self.count_request();
        let id = store::parse_session_id(session).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("{session:?} is not a mem session id"),
            )
        })?;
        // Idempotent, as the stores are: a session already gone is fine.
        self.store()
            .state()
            .end_session(id, LossReason::SessionExpired);
        Ok(())
    }

    async fn leftovers(&self) -> Result<Vec<String>> {
        let st = self.store().state();
        let mut out = st.entries_under(&self.core().config.namespace.prefix());
        for id in self.inner.opened.lock().expect("poisoned").iter() {
            if st.session_exists(*id) {
                out.push(format!("session {}", store::session_id(*id)));
            }
        }
        Ok(out)
    }

    fn requests_sent(&self) -> u64 {
        self.core().requests()
    }

    async fn fenced_write(&self, held: &[HeldEntry], write: &KeyWrite) -> Result<()> {
        write.validate(&self.core().config.namespace.prefix())?;
        check_kinds(held)?;
        self.count_request();
        let mut st = self.store().state();
        let all_there = held.iter().all(|h| {
            store::parse_entry_name(&h.entry)
                .is_some_and(|(key, index)| st.entry_exists(key, index))
        });
        if !all_there {
            return Err(refused(write, held));
        }
        st.kv_write(write);
        Ok(())
    }

    async fn read_key(&self, key: &str) -> Result<Option<Vec<u8>>> {
        KeyWrite::Delete { key: key.into() }.validate(&self.core().config.namespace.prefix())?;
        self.count_request();
        Ok(self.store().state().kv_get(key))
    }

    async fn write_key(&self, write: &KeyWrite) -> Result<()> {
        write.validate(&self.core().config.namespace.prefix())?;
        self.count_request();
        self.store().state().kv_write(write);
        Ok(())
    }
}
