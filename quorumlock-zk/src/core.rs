//! The state and one request: [`ZkCore`], the backend-wide state (the
//! configuration, counters, connecting with retries, the admin session,
//! the registry of this process's sessions for `kill_session`), and
//! [`SessionState`], one session's state shared by its tasks, with its
//! requests: counted, mapped, and read for what they prove about the
//! session's liveness.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use futures::FutureExt;
use quorumlock_core::backend::{
    AcquireRequest, Backoff, EntrySignals, GrantMemory, SessionLiveness,
};
use quorumlock_core::{Error, ErrorKind, LockName, LossReason, Result};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use crate::config::{deadline_ttl, ZkConfig};
use crate::error::map;
use crate::layout;
use crate::tls::TlsFiles;

/// The backend-wide state: what the backend, its admin operations and
/// every session it opened share (through an `Arc`).
pub(crate) struct ZkCore {
    pub(crate) config: ZkConfig,
    pub(crate) connect_string: String,
    pub(crate) requests: AtomicU64,
    pub(crate) keepalives: AtomicU64,
    pub(crate) watch_events: AtomicU64,
    pub(crate) negotiated_ms: AtomicU64,
    /// Lock sessions opened by this instance, for `leftovers()`.
    pub(crate) opened: Mutex<Vec<(zk::SessionId, zk::StateWatcher)>>,
    /// A lazily opened session for admin reads and writes (inspect,
    /// break, revoke, leftovers, fenced writes) while no lock session is
    /// open; it never creates nodes of its own. The next lock session
    /// takes it over instead of connecting ([`ZkCore::take_admin`]).
    pub(crate) admin: tokio::sync::Mutex<Option<zk::Client>>,
    /// Change feeds watching on the admin session ([`ZkCore::follow`]).
    /// While there is one, the admin session is neither taken over by a
    /// lock session (whose close would wait for the feed's clone) nor
    /// closed after admin work.
    pub(crate) following: AtomicUsize,
    /// The newest lock session: admin work runs on its connection while
    /// it is open, so that a backend holds one ZooKeeper connection, not
    /// two (a server takes 60 per client address by default,
    /// `maxClientCnxns`).
    pub(crate) current: Mutex<Weak<SessionState>>,
    /// Lock nodes seen to exist, a hint only (a container may be reaped
    /// since): the first acquire of a node not in it creates the node and
    /// the contender in one transaction.
    pub(crate) known_dirs: Mutex<HashSet<Box<str>>>,
    /// The data version of held nodes of ours whose data was rewritten
    /// since their create (a proclaim, a revoke request): what a fenced
    /// write or a proclaim expects the node at. Absent: 0, the create's.
    /// A hint only: a wrong or forgotten version costs one read.
    pub(crate) versions: Mutex<HashMap<Box<str>, i32>>,
    /// Whether the negotiated session timeout passed
    /// [`ZkCore::check_ticks`].
    pub(crate) ticks_checked: AtomicBool,
}

/// The fewest of the server's ticks a session timeout may span (see
/// [`ZkCore::check_ticks`]).
pub(crate) const MIN_TICKS: u32 = 5;

/// At most this many entries in [`ZkCore::known_dirs`]; then it starts
/// over (a forgotten node costs one failed transaction, not a wrong grant).
const KNOWN_DIRS: usize = 65_536;

/// At most this many entries in [`ZkCore::versions`]; then it starts over.
const VERSIONS_KEPT: usize = 65_536;

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
/// id AND password, so
/// [`Backend::kill_session`](quorumlock_core::backend::Backend::kill_session)
/// can end sessions opened by any `ZkBackend` of this process, not of
/// other processes.
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

impl ZkCore {
    /// The state of a backend for `config`; nothing is contacted (the
    /// sessions are opened by `open_session`, the admin session on first
    /// use).
    pub(crate) fn new(config: ZkConfig) -> ZkCore {
        ZkCore {
            connect_string: config.connect_string(),
            config,
            requests: AtomicU64::new(0),
            keepalives: AtomicU64::new(0),
            watch_events: AtomicU64::new(0),
            negotiated_ms: AtomicU64::new(0),
            opened: Mutex::new(Vec::new()),
            admin: tokio::sync::Mutex::new(None),
            following: AtomicUsize::new(0),
            current: Mutex::new(Weak::new()),
            known_dirs: Mutex::new(HashSet::new()),
            versions: Mutex::new(HashMap::new()),
            ticks_checked: AtomicBool::new(false),
        }
    }

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

    pub(crate) fn dir_known(&self, dir: &str) -> bool {
        self.known_dirs.lock().expect("poisoned").contains(dir)
    }

    pub(crate) fn note_dir(&self, dir: &str, exists: bool) {
        let mut known = self.known_dirs.lock().expect("poisoned");
        if !exists {
            known.remove(dir);
        } else if !known.contains(dir) {
            if known.len() >= KNOWN_DIRS {
                known.clear();
            }
            known.insert(dir.into());
        }
    }

    /// The data version our held `node` is expected at (see
    /// [`ZkCore::versions`]).
    pub(crate) fn data_version(&self, node: &str) -> i32 {
        let versions = self.versions.lock().expect("poisoned");
        versions.get(node).copied().unwrap_or(0)
    }

    /// Notes that our held `node` is at data `version`, unmarked.
    pub(crate) fn note_version(&self, node: &str, version: i32) {
        let mut versions = self.versions.lock().expect("poisoned");
        if version == 0 {
            versions.remove(node);
            return;
        }
        if versions.len() >= VERSIONS_KEPT && !versions.contains_key(node) {
            versions.clear();
        }
        versions.insert(node.into(), version);
    }

    /// Forgets `node` (released).
    pub(crate) fn forget_version(&self, node: &str) {
        self.versions.lock().expect("poisoned").remove(node);
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
        let (client, started) = self.open(session, self.config.session_timeout).await?;
        self.negotiated_ms.store(
            client.session_timeout().as_millis() as u64,
            Ordering::Relaxed,
        );
        Ok((client, started))
    }

    /// [`ZkCore::connect`], asking for `session_timeout`.
    async fn open(
        &self,
        session: Option<zk::SessionInfo>,
        session_timeout: Duration,
    ) -> Result<(zk::Client, Instant)> {
        let deadline = Instant::now() + self.config.connect_timeout;
        let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
        let tls = TlsFiles::load(&self.config)?;
        if tls.is_some() {
            // The library builds its rustls config on the process-wide
            // provider; ring, as everywhere in quorumlock. An error means
            // one is installed already, which is as good.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let mut probed = false;
        loop {
            let mut c = zk::Client::connector().with_session_timeout(session_timeout);
            if let Some(t) = &tls {
                c = c.with_tls(t.options()?);
            }
            if let Some((user, pw)) = &self.config.auth {
                c = c.with_auth("digest", format!("{user}:{}", pw.expose()).as_bytes());
            }
            if let Some(s) = &session {
                c = c.with_session(s.clone());
            }
            self.count(1);
            let started = Instant::now();
            let attempt = async {
                if tls.is_some() {
                    c.secure_connect(&self.connect_string).await
                } else {
                    c.connect(&self.connect_string).await
                }
            };
            let attempt = tokio::time::timeout_at(deadline, attempt);
            // The library reports a refused handshake as a lost connection
            // and retries: the probe, beside the first attempt, names it.
            let outcome = match &tls {
                Some(t) if !probed => {
                    probed = true;
                    tokio::pin!(attempt);
                    let probe = t.probe(&self.config.servers);
                    tokio::select! {
                        r = &mut attempt => r,
                        Err(e) = probe => {
                            if e.kind() == ErrorKind::Tls {
                                return Err(e);
                            }
                            attempt.await
                        }
                    }
                }
                _ => attempt.await,
            };
            let err = match outcome {
                Ok(Ok(client)) => return Ok((client, started)),
                Ok(Err(e)) => map(e, "opening a session"),
                Err(elapsed) => Error::new(
                    ErrorKind::Connection,
                    format!(
                        "ZooKeeper: no session with {} within connect_timeout={:?}",
                        self.config.describe(),
                        self.config.connect_timeout
                    ),
                )
                .with_source(elapsed),
            };
            let delay = backoff.next_delay();
            if err.kind() != ErrorKind::Connection || Instant::now() + delay >= deadline {
                return Err(err);
            }
            tracing::debug!(error = %err, "connecting failed, retrying");
            tokio::time::sleep(delay).await;
        }
    }

    /// The tick rule: refuses ([`ErrorKind::InvalidUrl`]) a `negotiated`
    /// session timeout under [`MIN_TICKS`] of the server's ticks, once per
    /// backend (at `connect()`, or with a lazy backend at its first
    /// session). The local deadline falls before the leader's earliest
    /// expiry of the session only from that many ticks on (see
    /// [`crate::config::deadline_ttl`] and the README's "Safety on an
    /// ensemble"); ZooKeeper itself grants down to 2.
    ///
    /// The server does not say its `tickTime`; it shows in the timeout it
    /// grants a session that asks for less than its minimum (by default
    /// 2 ticks). A timeout that the server raised to its minimum is that
    /// minimum, 2 ticks: refused. Otherwise one short session asks for 2/5
    /// of the negotiated timeout (2 ticks if the timeout is 5): granted as
    /// asked, the minimum, and so 2 ticks, is at most that, and the timeout
    /// at least 5 ticks; raised, a tick is more than a fifth of the
    /// timeout: refused, naming the tick. A server whose
    /// `minSessionTimeout` is set above 2 ticks makes this stricter (asks
    /// for 2.5 times that minimum); one set below 2 ticks hides its tick.
    pub(crate) async fn check_ticks(&self, negotiated: Duration) -> Result<()> {
        if self.ticks_checked.load(Ordering::Acquire) {
            return Ok(());
        }
        let requested = self.config.session_timeout;
        let minimum = if negotiated > requested {
            Some(negotiated)
        } else {
            let probe = negotiated * 2 / MIN_TICKS;
            let (c, _) = self.open(None, probe).await?;
            let granted = c.session_timeout();
            let state = c.state_watcher();
            self.count(1); // closeSession
            drop(c);
            if !wait_terminal(state, Duration::from_secs(1)).await {
                tracing::debug!("the tick probe's session did not close in time; it will expire");
            }
            (granted > probe).then_some(granted)
        };
        if let Some(minimum) = minimum {
            let tick = minimum / 2;
            let need = tick * MIN_TICKS;
            return Err(Error::new(
                ErrorKind::InvalidUrl,
                format!(
                    "ZooKeeper: the session timeout {negotiated:?} (asked for {requested:?}) is under \
                     {MIN_TICKS} ticks of the server: it grants at least {minimum:?}, 2 ticks unless \
                     minSessionTimeout is set, so a tick is about {tick:?}. The local loss deadline \
                     falls before the server can expire the session only from {MIN_TICKS} ticks on \
                     (quorumlock-zk README, \"Safety on an ensemble\"): ask for ttl={}ms or more",
                    need.as_millis()
                ),
            ));
        }
        self.ticks_checked.store(true, Ordering::Release);
        Ok(())
    }

    /// Remembers a new lock session for `leftovers()` and `kill_session`.
    /// Sessions that have ended are forgotten here, so that the lists hold
    /// the sessions still open (and, in the process-wide registry, those
    /// whose owner still cares), not every session ever opened.
    pub(crate) fn record_opened(&self, client: &zk::Client, liveness: &Arc<SessionLiveness>) {
        self.remember(client);
        register_session(client, liveness);
    }

    /// Remembers a session of this backend for `leftovers()`, without
    /// making it a lock session.
    pub(crate) fn remember(&self, client: &zk::Client) {
        let mut opened = self.opened.lock().expect("poisoned");
        // An ended session is never a leftover (`leftovers_once` skips it).
        opened.retain(|(_, state)| !state.peek_state().is_terminated());
        opened.push((client.session_id(), client.state_watcher()));
    }

    /// The client admin work runs on: with [`AdminUse::Brief`], the open
    /// lock session's; else (or with none open) the admin session, opened
    /// if needed.
    pub(crate) async fn admin(&self, use_: AdminUse) -> Result<zk::Client> {
        if use_ == AdminUse::Brief {
            if let Some(c) = self.current_client() {
                return Ok(c);
            }
        }
        self.admin_in(&mut *self.admin.lock().await).await
    }

    /// The admin session in `slot` (the locked [`ZkCore::admin`] slot),
    /// opened there if it is missing or ended.
    async fn admin_in(&self, slot: &mut Option<zk::Client>) -> Result<zk::Client> {
        if let Some(c) = slot.as_ref().filter(|c| !c.state().is_terminated()) {
            return Ok(c.clone());
        }
        let (c, _) = self.connect(None).await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Closes the admin session in `slot` (the locked slot) unless a
    /// change feed watches on it: a lock session is open, whose
    /// connection admin work uses.
    fn close_admin_in(&self, slot: &mut Option<zk::Client>) {
        if !self.followed() {
            slot.take();
        }
    }

    /// The newest lock session's client, while that session is open.
    fn current_client(&self) -> Option<zk::Client> {
        let state = self.current.lock().expect("poisoned").upgrade()?;
        let client = state.client.lock().expect("poisoned").clone()?;
        (!client.state().is_terminated()).then_some(client)
    }

    /// Makes `state` the session admin work runs on.
    pub(crate) fn set_current(&self, state: &Arc<SessionState>) {
        *self.current.lock().expect("poisoned") = Arc::downgrade(state);
        // An admin session opened while this one was opening is not
        // needed any more (if its slot is busy, the next admin call
        // closes it).
        if let Ok(mut slot) = self.admin.try_lock() {
            self.close_admin_in(&mut slot);
        }
    }

    /// Whether a change feed watches on the admin session.
    fn followed(&self) -> bool {
        self.following.load(Ordering::Acquire) > 0
    }

    /// The admin session's client for a change feed, opened if needed,
    /// kept open while the returned [`Following`] lives: an observer adds
    /// no connection (and no pings) to the one a backend holds for its
    /// admin reads.
    pub(crate) async fn follow(self: &Arc<Self>) -> Result<Following> {
        let mut slot = self.admin.lock().await;
        let client = self.admin_in(&mut slot).await?;
        // Counted under the slot's lock: `take_admin` looks under it.
        self.following.fetch_add(1, Ordering::AcqRel);
        Ok(Following {
            client: Some(client),
            core: self.clone(),
        })
    }

    /// The admin session, taken out of its slot to become a lock session
    /// (one connection instead of two); `None` if there is none open.
    pub(crate) async fn take_admin(&self) -> Option<zk::Client> {
        let mut slot = self.admin.lock().await;
        if self.followed() {
            return None;
        }
        let client = slot.take()?;
        (!client.state().is_terminated()).then_some(client)
    }

    /// Runs an admin operation (see [`ZkCore::admin`]); if its session
    /// turns out to be gone (expired while the server was away), once
    /// more on a new one. Then, while a lock session is open, the admin
    /// session is closed: one connection per backend.
    pub(crate) async fn with_admin<'a, T, F, Fut>(&'a self, use_: AdminUse, op: F) -> Result<T>
    where
        F: Fn(zk::Client) -> Fut,
        Fut: Future<Output = Result<T>> + 'a,
    {
        let c = self.admin(use_).await?;
        let failed = c.session_id();
        let r = match op(c).await {
            Err(e) if e.kind() == ErrorKind::SessionLost => {
                tracing::debug!(error = %e, "admin session lost; retrying on a new one");
                // Only the session that failed, or one that ended: the
                // slot may hold a newer one by now (a feed's, opened when
                // it saw the old one end).
                let mut slot = self.admin.lock().await;
                if slot
                    .as_ref()
                    .is_some_and(|s| s.session_id() == failed || s.state().is_terminated())
                {
                    slot.take();
                }
                drop(slot);
                match self.admin(use_).await {
                    Ok(c) => op(c).await,
                    Err(e) => Err(e),
                }
            }
            r => r,
        };
        if self.current_client().is_some() {
            self.close_admin_in(&mut *self.admin.lock().await);
        }
        r
    }
}

/// The admin session's client as a change feed holds it
/// ([`ZkCore::follow`]).
pub(crate) struct Following {
    client: Option<zk::Client>,
    core: Arc<ZkCore>,
}

impl Following {
    pub(crate) fn client(&self) -> &zk::Client {
        self.client.as_ref().expect("held until dropped")
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        // The clone goes first: once the count is down, a lock session
        // may take the admin session over.
        self.client.take();
        let core = &self.core;
        // The last feed gone while a lock session is open: the admin
        // session is not needed any more (as after admin work; if its
        // slot is busy, whoever holds it closes it or uses it).
        if core.following.fetch_sub(1, Ordering::AcqRel) == 1 && core.current_client().is_some() {
            if let Ok(mut slot) = core.admin.try_lock() {
                core.close_admin_in(&mut slot);
            }
        }
    }
}

/// Which session an admin operation may run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AdminUse {
    /// A few requests (inspect, list, revoke, fenced writes): on the open
    /// lock session's connection, so that a backend holds one.
    Brief,
    /// An operation that waits (a break gives the holder time to read
    /// its mark; `leftovers` waits for sessions to end): on the admin
    /// session, as a clone of the lock session's client held that long
    /// would keep that session open past its `close()` or its loss.
    Waits,
}

/// One lock session's state: its ZooKeeper client and what its tasks (the
/// acquires and releases of its guards, the keepalive, the watch
/// dispatcher) share, through an `Arc`.
pub(crate) struct SessionState {
    pub(crate) core: Arc<ZkCore>,
    /// `None` once closed; every task holds a clone only while it runs.
    pub(crate) client: Mutex<Option<zk::Client>>,
    pub(crate) id: zk::SessionId,
    pub(crate) timeout: Duration,
    pub(crate) liveness: Arc<SessionLiveness>,
    pub(crate) stop: CancellationToken,
    pub(crate) state: zk::StateWatcher,
    /// Held entries by contender id, watched by the session's one watch
    /// dispatcher. An entry is removed before we delete our own node, so
    /// that its deletion is not reported as a loss.
    pub(crate) held: Mutex<HashMap<uuid::Uuid, HeldNode>>,
    /// Tells the dispatcher to watch a newly held entry, with the read
    /// that set its watch already when the grant had one.
    pub(crate) arm: mpsc::UnboundedSender<(uuid::Uuid, Option<WatchedRead>)>,
    /// Per lock directory, by the sequence number of our node when it was
    /// the only child: what lets the next acquire skip the listing (see
    /// [`ParentWatch`]). At most [`CHAINS_KEPT`].
    pub(crate) chains: GrantMemory<Option<ParentWatch>>,
}

/// The backoff of a session's request retried while the connection is
/// down and the session alive (a listing, setting a watch): from 20 ms,
/// doubling, up to 1 s, with jitter.
pub(crate) fn retry_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(20), Duration::from_secs(1))
}

/// How many lock directories a session remembers a lone grant for.
pub(crate) const CHAINS_KEPT: usize = 256;

/// A repeat acquire of an uncontended lock knows that it is first without
/// listing the children, so that its cycle is one create and one delete,
/// like the floor.
///
/// ZooKeeper numbers a sequential node with the count of children ever
/// created under the parent (deletes do not count; the `cversion` it shows
/// does, so it cannot stand in). If our new node's number is one past our
/// last one's, nobody created a child in between, so the children are
/// those we saw beside our last node (none), minus deletions: ours alone.
/// That holds while the parent is the same node: a container parent is
/// reaped once empty and may be created anew with a fresh count. A watch
/// on the parent says so; the session state says whether a reconnect
/// happened, after which events may arrive late. The watch is armed on
/// the second acquire, so that a lock taken once costs no watch.
///
/// A watch on a lock directory, and the session state since it was set.
pub(crate) struct ParentWatch {
    fired: Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>,
    state: zk::StateWatcher,
    /// Set once the watch fired or the state changed; never polled again.
    spent: bool,
}

impl ParentWatch {
    /// Whether the directory is the one the watch was set on and the
    /// connection has not broken since. The client library hands a watch
    /// event over before the reply to any later request, so once that
    /// reply is in, this sees every event that came before it.
    pub(crate) fn intact(&mut self) -> bool {
        if !self.spent {
            self.spent = self.state.changed().now_or_never().is_some()
                || self.fired.as_mut().now_or_never().is_some();
        }
        !self.spent
    }
}

/// A `getData` with a watch, answered: the data, the stat, the watch.
pub(crate) type WatchedRead = (Vec<u8>, zk::Stat, zk::OneshotWatcher);

/// Errors after which the session is over for good.
pub(crate) fn is_terminal(e: &zk::Error) -> bool {
    use zk::Error as E;
    matches!(
        e,
        E::SessionExpired | E::SessionMoved | E::AuthFailed | E::ClientClosed
    )
}

pub(crate) fn lost_session(why: &str) -> Error {
    Error::new(ErrorKind::SessionLost, why.to_string())
}

impl SessionState {
    pub(crate) fn client(&self) -> Result<zk::Client> {
        self.client
            .lock()
            .expect("poisoned")
            .clone()
            .ok_or_else(|| Error::new(ErrorKind::SessionLost, "the ZooKeeper session was closed"))
    }

    /// Counts `n` requests about to be sent and returns the send time.
    pub(crate) fn send(&self, n: u64) -> Instant {
        self.core.count(n);
        Instant::now()
    }

    /// A reply to a request that the LEADER answered (a write, or a
    /// `sync`) proves that the session was alive on the leader after the
    /// request left: confirm the local deadline from the send time. A
    /// follower forwards writes and syncs to the leader and answers them
    /// only once the leader has, after applying every earlier commit
    /// (a `closeSession` of our expired session included, which ends our
    /// connection first). Answers to reads prove nothing (see
    /// [`SessionState::heard_read`]). Only answers the server itself gives count;
    /// the library also fails in-flight requests with errors of its own
    /// when a connection breaks (`ConnectionLoss`, `Timeout`, I/O errors
    /// as `Custom`), and those prove nothing. A terminal session error is
    /// a loss.
    pub(crate) fn heard<T>(&self, sent: Instant, r: &std::result::Result<T, zk::Error>) {
        use zk::Error as E;
        match r {
            Ok(_) => self.liveness.confirm(sent, deadline_ttl(self.timeout)),
            Err(
                E::NoNode
                | E::NodeExists
                | E::NotEmpty
                | E::BadVersion
                | E::NoAuth
                | E::NoChildrenForEphemerals,
            ) => self.liveness.confirm(sent, deadline_ttl(self.timeout)),
            _ => self.heard_read(r),
        }
    }

    /// A reply to a read: a follower answers it from its own copy, also
    /// while it is cut off from the leader (until `syncLimit x tickTime`),
    /// when the leader may already have expired our session and handed
    /// our locks to others. So it never moves the deadline; only a
    /// terminal session error counts (as a loss).
    pub(crate) fn heard_read<T>(&self, r: &std::result::Result<T, zk::Error>) {
        use zk::Error as E;
        if let Err(E::SessionExpired | E::SessionMoved | E::AuthFailed) = r {
            self.liveness.lose(LossReason::SessionExpired)
        }
    }

    pub(crate) async fn list(&self, c: &zk::Client, dir: &str) -> Result<Option<Vec<String>>> {
        self.send(1);
        let r = c.list_children(dir).await;
        self.heard_read(&r);
        match r {
            Ok(children) => Ok(Some(children)),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(map(e, "listing contenders")),
        }
    }

    /// Makes the server's view include every write the leader had
    /// acknowledged (or was about to commit) when it answered: a `sync`.
    /// A follower that our session moved to after a connection loss may
    /// not yet have applied a create that the old server passed on, so a
    /// listing without it can miss our own node.
    pub(crate) async fn sync_dir(&self, c: &zk::Client, dir: &str) -> Result<()> {
        let sent = self.send(1);
        let r = c.sync(dir).await;
        self.heard(sent, &r);
        match r {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(map(e, "syncing with the leader")),
        }
    }

    /// Hands a held node to the session's watch dispatcher, with the read
    /// that watches it already if the grant made one.
    pub(crate) fn watch_holder(
        &self,
        node: String,
        req: &AcquireRequest,
        watched: Option<WatchedRead>,
    ) {
        // An election's revoke request is written into the election's node
        // (see `layout::election_revoke_data`): its leader watches that too.
        let revoke_dir = match req.kind {
            quorumlock_core::LockKind::Election => node.rsplit_once('/').map(|(d, _)| d.into()),
            _ => None,
        };
        let entry = HeldNode {
            node: node.into_boxed_str(),
            signals: req.signals.clone(),
            revoke_dir,
        };
        self.held
            .lock()
            .expect("poisoned")
            .insert(req.contender, entry);
        let _ = self.arm.send((req.contender, watched));
    }

    /// Stops watching the entry of `contender` (our own delete is not a
    /// loss).
    pub(crate) fn mark_released(&self, contender: &uuid::Uuid) {
        self.held.lock().expect("poisoned").remove(contender);
    }

    /// Deletes our held `node`, expected at data `version` (see
    /// [`ZkCore::data_version`]): whether it was still ours. A node found
    /// rewritten is read: a break's mark means the hold was lost (the
    /// node is deleted all the same), a revoke request's mark does not.
    /// `false` too for a node already gone.
    pub(crate) async fn delete_held(
        &self,
        c: &zk::Client,
        node: &str,
        version: i32,
    ) -> Result<bool> {
        let sent = self.send(1);
        let r = c.delete(node, Some(version)).await;
        self.heard(sent, &r);
        match r {
            Ok(()) => return Ok(true),
            Err(zk::Error::NoNode) => return Ok(false),
            Err(zk::Error::BadVersion) => {}
            Err(e) => return Err(map(e, "deleting our contender node")),
        }
        self.send(1);
        let read = c.get_data(node).await;
        self.heard_read(&read);
        let broken = match read {
            Ok((data, _)) => layout::is_broken(&data),
            Err(zk::Error::NoNode) => return Ok(false),
            Err(e) => return Err(map(e, "reading our contender node")),
        };
        let deleted = self.delete(c, node).await?;
        Ok(deleted && !broken)
    }

    /// Deletes our node; whether it was still there.
    pub(crate) async fn delete(&self, c: &zk::Client, node: &str) -> Result<bool> {
        let sent = self.send(1);
        let r = c.delete(node, None).await;
        self.heard(sent, &r);
        match r {
            Ok(()) => Ok(true),
            Err(zk::Error::NoNode) => Ok(false),
            Err(e) => Err(map(e, "deleting our contender node")),
        }
    }

    /// Sets a watch on `dir` (sent at once) and gives its creation zxid.
    pub(crate) fn watch_parent<'a>(
        &'a self,
        c: &'a zk::Client,
        dir: &'a str,
    ) -> impl Future<Output = Option<(i64, ParentWatch)>> + 'a {
        // Before the request: a reconnect from now on shows.
        let mut state = self.state.clone();
        state.state();
        self.send(1);
        let watch = c.check_and_watch_stat(dir);
        async move {
            let r = watch.await;
            self.heard_read(&r);
            match r {
                Ok((Some(st), watcher)) => {
                    let fired = Box::pin(watcher.changed());
                    let spent = false;
                    Some((
                        st.czxid,
                        ParentWatch {
                            fired,
                            state,
                            spent,
                        },
                    ))
                }
                _ => None,
            }
        }
    }
}

/// A held node of this session, as the watch dispatcher watches it: its
/// path and where to report loss and revoke requests.
pub(crate) struct HeldNode {
    pub(crate) node: Box<str>,
    pub(crate) signals: EntrySignals,
    /// For an election's leader: the election's node, whose data carries
    /// a revoke request naming the leader's node.
    pub(crate) revoke_dir: Option<Box<str>>,
}
