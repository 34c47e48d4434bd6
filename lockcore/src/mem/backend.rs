use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::config::MemConfig;
use super::session::MemSession;
use super::store::{self, MemStore};
use crate::backend::{Backend, Capabilities, LockState, StoreSession};
use crate::signal::{LossReason, SessionLiveness};
use crate::url::{self, Url};
use crate::{Error, ErrorKind, LockName, Result};

/// The in-memory backend. Cheap to clone; clones share counters.
#[derive(Clone)]
pub struct MemBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: MemConfig,
    store: Arc<MemStore>,
    requests: AtomicU64,
    opened: Mutex<Vec<u64>>,
    keepalive_paused: AtomicBool,
}

impl fmt::Debug for MemBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemBackend")
            .field("config", &self.inner.config)
            .finish()
    }
}

impl MemBackend {
    /// A backend on the store named by `config`.
    pub fn new(config: MemConfig) -> Self {
        MemBackend {
            inner: Arc::new(Inner {
                store: store::store(&config.store),
                config,
                requests: AtomicU64::new(0),
                opened: Mutex::new(Vec::new()),
                keepalive_paused: AtomicBool::new(false),
            }),
        }
    }

    /// Parses `mem://...` (see [`MemConfig::from_url`]).
    pub fn from_url(url: &Url) -> Result<Self> {
        Ok(Self::new(MemConfig::from_url(url)?))
    }

    /// The configuration.
    pub fn config(&self) -> &MemConfig {
        &self.inner.config
    }

    /// Stops (or resumes) renewing this backend's sessions, as a paused
    /// process would: the store expires them after the TTL while the
    /// holder's local deadline fires first.
    pub fn pause_keepalive(&self, paused: bool) {
        self.inner.keepalive_paused.store(paused, Ordering::Release);
    }

    pub(super) fn keepalive_paused(&self) -> bool {
        self.inner.keepalive_paused.load(Ordering::Acquire)
    }

    pub(super) fn store(&self) -> &MemStore {
        &self.inner.store
    }

    pub(super) fn count_request(&self) {
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// The store key of a lock: namespace and name.
    pub(super) fn key(&self, name: &LockName) -> String {
        match self.inner.config.namespace.as_str() {
            "" => name.as_str().to_string(),
            ns => format!("{ns}/{name}"),
        }
    }

    fn prefix(&self) -> String {
        match self.inner.config.namespace.as_str() {
            "" => String::new(),
            ns => format!("{ns}/"),
        }
    }
}

#[async_trait]
impl Backend for MemBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kill_session: true,
            rwlock: true,
            semaphore: true,
            session_ttl: self.inner.config.ttl,
        }
    }

    fn describe(&self) -> String {
        let c = &self.inner.config;
        let u = format!("mem://{}/{}", c.store, c.namespace);
        url::parse(&u).map(|u| url::redact(&u)).unwrap_or(u)
    }

    async fn open_session(&self, liveness: Arc<SessionLiveness>) -> Result<Arc<dyn StoreSession>> {
        let session = MemSession::open(self, liveness);
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
        let under = self.prefix();
        let st = self.store().state();
        let key = prefix.map(|p| self.key(p));
        let mut out = Vec::new();
        for k in st.keys_under(&under, key.as_deref()) {
            let Ok(name) = LockName::new(&k[under.len()..]) else {
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
        let mut out = st.entries_under(&self.prefix());
        for id in self.inner.opened.lock().expect("poisoned").iter() {
            if st.session_exists(*id) {
                out.push(format!("session {}", store::session_id(*id)));
            }
        }
        Ok(out)
    }

    fn requests_sent(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }
}
