//! What the backend and its sessions share: the configuration, the
//! counters, connecting (with retries), the admin session, and the
//! registry of the sessions opened in this process (for `kill_session`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use lockcore::backend::SessionLiveness;
use lockcore::{Error, ErrorKind, LockName, Result};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::error::map;

/// What the backend and its sessions share.
pub(crate) struct Shared {
    pub(crate) config: ZkConfig,
    pub(crate) connect_string: String,
    pub(crate) requests: AtomicU64,
    pub(crate) keepalives: AtomicU64,
    pub(crate) watch_events: AtomicU64,
    pub(crate) negotiated_ms: AtomicU64,
    /// Lock sessions opened by this instance, for `leftovers()`.
    pub(crate) opened: Mutex<Vec<(zk::SessionId, zk::StateWatcher)>>,
    /// A lazily opened session for admin reads and writes (inspect,
    /// break, revoke, leftovers); it never creates nodes of its own.
    pub(crate) admin: tokio::sync::Mutex<Option<zk::Client>>,
}

#[derive(Clone)]
pub(crate) struct Registered {
    pub(crate) info: zk::SessionInfo,
    pub(crate) liveness: Weak<SessionLiveness>,
    pub(crate) state: zk::StateWatcher,
    /// Drops the owner's client (which then closes the session itself).
    pub(crate) shutdown: Option<Shutdown>,
}

/// Stops a lock session's tasks and drops its client.
pub(crate) type Shutdown = Arc<dyn Fn() + Send + Sync>;

/// Sessions opened in this process, by id, with what it takes to reattach
/// to them: ZooKeeper ends a session only for a client that presents its
/// id AND password, so [`Backend::kill_session`] can end sessions opened
/// by any `ZkBackend` of this process, not of other processes.
pub(crate) fn registry() -> &'static Mutex<HashMap<i64, Registered>> {
    static R: OnceLock<Mutex<HashMap<i64, Registered>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

pub(crate) fn register_session(client: &zk::Client, liveness: &Arc<SessionLiveness>) {
    let mut registry = registry().lock().expect("registry poisoned");
    // Ended sessions nobody holds any more (dropped without `close`):
    // nothing is left to kill. A dropped owner with a session still open
    // stays, so that `kill_session` can still end it.
    registry.retain(|_, r| r.liveness.strong_count() > 0 || !r.state.peek_state().is_terminated());
    registry.insert(
        client.session_id().0,
        Registered {
            info: client.session().clone(),
            liveness: Arc::downgrade(liveness),
            state: client.state_watcher(),
            shutdown: None,
        },
    );
}

pub(crate) fn set_shutdown(id: zk::SessionId, shutdown: Shutdown) {
    if let Some(r) = registry().lock().expect("registry poisoned").get_mut(&id.0) {
        r.shutdown = Some(shutdown);
    }
}

pub(crate) fn unregister_session(id: zk::SessionId) {
    registry().lock().expect("registry poisoned").remove(&id.0);
}

/// The text form of a session id, as `StoreSession::id` and `inspect`
/// report it: ZooKeeper's own `0x...` hex.
pub(crate) fn session_text(id: i64) -> String {
    format!("{id:#x}")
}

/// Waits until a dropped client's session reaches a terminal state.
pub(crate) async fn wait_terminal(mut state: zk::StateWatcher, limit: Duration) -> bool {
    let wait = async {
        loop {
            if state.peek_state().is_terminated() {
                return;
            }
            state.changed().await;
        }
    };
    tokio::time::timeout(limit, wait).await.is_ok()
}

impl Shared {
    pub(crate) fn count(&self, n: u64) {
        self.requests.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn count_keepalive(&self) {
        self.keepalives.fetch_add(1, Ordering::Relaxed);
        self.count(1);
    }

    pub(crate) fn count_watch_event(&self) {
        self.watch_events.fetch_add(1, Ordering::Relaxed);
    }

    /// The path of the lock node of `name`: `/<namespace>/<name>`.
    pub(crate) fn lock_dir(&self, name: &LockName) -> Result<String> {
        if self.config.namespace.is_empty() && name.segments().next() == Some("zookeeper") {
            return Err(Error::new(
                ErrorKind::InvalidName,
                "without a namespace, a lock name must not start with zookeeper (the server's own tree)",
            ));
        }
        Ok(format!("/{}", self.config.namespace.lock_key(name)))
    }

    pub(crate) fn root(&self) -> String {
        format!("/{}", self.config.namespace)
    }

    /// Opens a ZooKeeper session (or reattaches to `session`), retrying
    /// until the connect timeout: the library gives up on one attempt
    /// after about a session timeout, and a server that is restarting or
    /// a link that is healing deserves the whole `connect_timeout`.
    ///
    /// Returns the client and the start of the attempt that succeeded (no
    /// later than the server's creation of the session).
    pub(crate) async fn connect(
        &self,
        session: Option<zk::SessionInfo>,
    ) -> Result<(zk::Client, Instant)> {
        let deadline = Instant::now() + self.config.connect_timeout;
        let mut backoff = Duration::from_millis(20);
        loop {
            let mut c = zk::Client::connector().with_session_timeout(self.config.session_timeout);
            if let Some((user, pw)) = &self.config.auth {
                c = c.with_auth("digest", format!("{user}:{}", pw.expose()).as_bytes());
            }
            if let Some(s) = &session {
                c = c.with_session(s.clone());
            }
            self.count(1);
            let started = Instant::now();
            let err = match tokio::time::timeout_at(deadline, c.connect(&self.connect_string)).await
            {
                Ok(Ok(client)) => {
                    self.negotiated_ms.store(
                        client.session_timeout().as_millis() as u64,
                        Ordering::Relaxed,
                    );
                    return Ok((client, started));
                }
                Ok(Err(e)) => map(e, "opening a session"),
                Err(_) => Error::new(
                    ErrorKind::Connection,
                    format!(
                        "ZooKeeper: no session with {} within connect_timeout={:?}",
                        self.config.display, self.config.connect_timeout
                    ),
                ),
            };
            if err.kind() != ErrorKind::Connection || Instant::now() + backoff >= deadline {
                return Err(err);
            }
            tracing::debug!(error = %err, "connecting failed, retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    /// Remembers a new lock session for `leftovers()` and `kill_session`.
    /// Sessions that have ended are forgotten here, so that the lists hold
    /// the sessions still open (and, in the process-wide registry, those
    /// whose owner still cares), not every session ever opened.
    pub(crate) fn record_opened(&self, client: &zk::Client, liveness: &Arc<SessionLiveness>) {
        let mut opened = self.opened.lock().expect("poisoned");
        // An ended session is never a leftover (`leftovers_once` skips it).
        opened.retain(|(_, state)| !state.peek_state().is_terminated());
        opened.push((client.session_id(), client.state_watcher()));
        drop(opened);
        register_session(client, liveness);
    }

    pub(crate) async fn admin(&self) -> Result<zk::Client> {
        let mut slot = self.admin.lock().await;
        if let Some(c) = slot.as_ref() {
            if !c.state().is_terminated() {
                return Ok(c.clone());
            }
        }
        let (c, _) = self.connect(None).await?;
        *slot = Some(c.clone());
        Ok(c)
    }
}
