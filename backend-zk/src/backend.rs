//! The `Backend` for ZooKeeper: connection setup, the Curator layout, and
//! the admin operations (inspect, break, revoke, kill, leftovers).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use lockcore::backend::{Backend, Capabilities, SessionLiveness, StoreSession};
use lockcore::{Contender, Error, ErrorKind, LockKind, LockName, LockState, LossReason, Result};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::config::{deadline_ttl, ZkConfig};
use crate::error::map;
use crate::session::ZkSession;

/// The data Curator's `Revoker` writes on a holder's node.
pub(crate) const REVOKE_MESSAGE: &[u8] = b"__REVOKE__";
/// The data `break_lock` writes on a holder's node before deleting it, so
/// that our holder (watching its own node) learns of the break one write
/// before any waiter can be granted.
pub(crate) const BREAK_MESSAGE: &[u8] = b"__BREAK__";
/// The text before the sequence number in a contender node's name.
pub(crate) const LOCK_MARKER: &str = "lock-";

/// A ZooKeeper backend: one ZooKeeper session per [`lockcore::LockClient`],
/// Curator's `InterProcessMutex` layout, `czxid` fencing tokens.
///
/// Cheap to clone; clones share counters and the admin connection.
#[derive(Clone)]
pub struct ZkBackend {
    pub(crate) shared: Arc<Shared>,
}

/// What the backend and its sessions share.
pub(crate) struct Shared {
    pub(crate) config: ZkConfig,
    connect_string: String,
    requests: AtomicU64,
    keepalives: AtomicU64,
    watch_events: AtomicU64,
    negotiated_ms: AtomicU64,
    /// Lock sessions opened by this instance, for `leftovers()`.
    opened: Mutex<Vec<(zk::SessionId, zk::StateWatcher)>>,
    /// A lazily opened session for admin reads and writes (inspect,
    /// break, revoke, leftovers); it never creates nodes of its own.
    admin: tokio::sync::Mutex<Option<zk::Client>>,
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("config", &self.shared.config)
            .finish()
    }
}

/// A session opened in this process: its id and password, and its
/// liveness.
#[derive(Clone)]
struct Registered {
    info: zk::SessionInfo,
    liveness: Weak<SessionLiveness>,
    state: zk::StateWatcher,
    /// Drops the owner's client (which then closes the session itself).
    shutdown: Option<Shutdown>,
}

/// Stops a lock session's tasks and drops its client.
pub(crate) type Shutdown = Arc<dyn Fn() + Send + Sync>;

/// Sessions opened in this process, by id, with what it takes to reattach
/// to them: ZooKeeper ends a session only for a client that presents its
/// id AND password, so [`Backend::kill_session`] can end sessions opened
/// by any `ZkBackend` of this process, not of other processes.
fn registry() -> &'static Mutex<HashMap<i64, Registered>> {
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

    fn root(&self) -> String {
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

    async fn admin(&self) -> Result<zk::Client> {
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

/// The marker of a read contender (Curator's `InterProcessReadWriteLock`).
pub(crate) const READ_MARKER: &str = "__READ__";
/// The marker of a write contender.
pub(crate) const WRITE_MARKER: &str = "__WRIT__";
/// The marker of a semaphore lease (Curator's `InterProcessSemaphoreV2`).
pub(crate) const LEASE_MARKER: &str = "lease-";
/// The child of a semaphore node holding its internal mutex.
pub(crate) const SEM_LOCKS: &str = "locks";
/// The child of a semaphore node holding its leases.
pub(crate) const SEM_LEASES: &str = "leases";

/// What a contender directly under a lock node asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// `-lock-`: a mutex; it waits like a writer.
    Mutex,
    /// `-__READ__`.
    Read,
    /// `-__WRIT__`.
    Write,
}

impl Role {
    pub(crate) fn of(kind: LockKind) -> Role {
        match kind {
            LockKind::Read => Role::Read,
            LockKind::Write => Role::Write,
            _ => Role::Mutex,
        }
    }

    pub(crate) fn marker(self) -> &'static str {
        match self {
            Role::Mutex => LOCK_MARKER,
            Role::Read => READ_MARKER,
            Role::Write => WRITE_MARKER,
        }
    }

    pub(crate) fn kind(self) -> LockKind {
        match self {
            Role::Mutex => LockKind::Exclusive,
            Role::Read => LockKind::Read,
            Role::Write => LockKind::Write,
        }
    }
}

/// The role of a contender and the part of its name that orders it: the
/// text after the LAST marker (Curator's `fixForSorting`, which the
/// read-write lock applies for both of its markers). `None` for other
/// children (nested locks, a semaphore's `locks`/`leases`).
pub(crate) fn classify(child: &str) -> Option<(Role, &str)> {
    let mut best: Option<(usize, Role)> = None;
    for role in [Role::Mutex, Role::Read, Role::Write] {
        if let Some(i) = child.rfind(role.marker()) {
            match best {
                Some((j, _)) if j >= i => {}
                _ => best = Some((i, role)),
            }
        }
    }
    best.map(|(i, role)| (role, &child[i + role.marker().len()..]))
}

/// The part of a contender's name that orders it.
pub(crate) fn sort_key(child: &str) -> &str {
    classify(child).map_or(child, |(_, k)| k)
}

/// Contender children (mutex, read and write entries: one queue) sorted by
/// their sequence number; other children (nested locks) are left out.
pub(crate) fn sort_contenders(children: Vec<String>) -> Vec<String> {
    let mut v: Vec<String> = children
        .into_iter()
        .filter(|c| classify(c).is_some())
        .collect();
    v.sort_by(|a, b| sort_key(a).cmp(sort_key(b)));
    v
}

/// What the entry at `index` of `sorted` (of `role`) waits for: `None` if
/// it holds, else the index of the one entry it watches. A reader waits
/// for the nearest mutex or writer ahead of it; anything else for its
/// predecessor.
pub(crate) fn blocker(sorted: &[String], index: usize, role: Role) -> Option<usize> {
    match role {
        Role::Read => (0..index)
            .rev()
            .find(|&j| !matches!(classify(&sorted[j]), Some((Role::Read, _)))),
        Role::Mutex | Role::Write => index.checked_sub(1),
    }
}

/// Lease (or semaphore lock) children sorted by their sequence number.
pub(crate) fn sort_by_marker(children: Vec<String>, marker: &str) -> Vec<String> {
    let key = |c: &String| c.rfind(marker).map_or(c.len(), |i| i + marker.len());
    let mut v: Vec<String> = children
        .into_iter()
        .filter(|c| c.contains(marker))
        .collect();
    v.sort_by(|a, b| a[key(a)..].cmp(&b[key(b)..]));
    v
}

/// The data of our semaphore nodes: `permits=<N>`.
pub(crate) fn permits_data(permits: u32) -> Vec<u8> {
    format!("permits={permits}").into_bytes()
}

/// The permit count in a semaphore node's data (ours write `permits=N`,
/// also after a revoke marker); `None` for Curator's (its host address or
/// user data).
pub(crate) fn parse_permits(data: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(data).ok()?;
    let i = s.rfind("permits=")?;
    s[i + "permits=".len()..].trim().parse().ok()
}

/// The `_c_<uuid>-` prefix of a protected node name, if it has one.
pub(crate) fn guid_prefix(child: &str) -> Option<&str> {
    let rest = child.strip_prefix("_c_")?;
    (rest.len() > 37 && rest.as_bytes()[36] == b'-').then(|| &child[..3 + 37])
}

impl ZkBackend {
    /// A backend for `config`. Connects lazily: sessions are opened by
    /// [`Backend::open_session`], the admin session on first admin use.
    pub fn new(config: ZkConfig) -> Self {
        ZkBackend {
            shared: Arc::new(Shared {
                connect_string: config.connect_string(),
                config,
                requests: AtomicU64::new(0),
                keepalives: AtomicU64::new(0),
                watch_events: AtomicU64::new(0),
                negotiated_ms: AtomicU64::new(0),
                opened: Mutex::new(Vec::new()),
                admin: tokio::sync::Mutex::new(None),
            }),
        }
    }

    /// Parses and validates `url` (nothing is contacted for bad input),
    /// then checks that the servers answer by opening the admin session.
    ///
    /// # Cancel safety
    /// Dropping it may leave the admin session half open; it is closed when
    /// the backend is dropped, or expires by its timeout.
    pub async fn connect(url: impl AsRef<str>) -> Result<ZkBackend> {
        let b = ZkBackend::new(ZkConfig::parse(url.as_ref())?);
        b.shared.admin().await?;
        Ok(b)
    }

    /// The configuration.
    pub fn config(&self) -> &ZkConfig {
        &self.shared.config
    }

    /// How many of [`Backend::requests_sent`] were keepalive reads (one per
    /// session every third of the session timeout).
    pub fn keepalives_sent(&self) -> u64 {
        self.shared.keepalives.load(Ordering::Relaxed)
    }

    /// Wake-ups of waiting acquires: watch events on the predecessor
    /// node received by this instance's lock sessions (a release should
    /// cause exactly one, in the next waiter).
    pub fn watch_events(&self) -> u64 {
        self.shared.watch_events.load(Ordering::Relaxed)
    }

    /// The session timeout the server granted last (`None` before the
    /// first session).
    pub fn negotiated_session_timeout(&self) -> Option<Duration> {
        match self.shared.negotiated_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// Runs an admin operation on the admin session; if that session
    /// turns out to be gone (expired while the server was away), once
    /// more on a new one.
    async fn with_admin<'a, T, F, Fut>(&'a self, op: F) -> Result<T>
    where
        F: Fn(zk::Client) -> Fut,
        Fut: std::future::Future<Output = Result<T>> + 'a,
    {
        let c = self.shared.admin().await?;
        match op(c).await {
            Err(e) if e.kind() == ErrorKind::SessionLost => {
                tracing::debug!(error = %e, "admin session lost; retrying on a new one");
                self.shared.admin.lock().await.take();
                op(self.shared.admin().await?).await
            }
            r => r,
        }
    }

    async fn inspect_once(&self, c: zk::Client, name: &LockName) -> Result<LockState> {
        let dir = self.shared.lock_dir(name)?;
        let mut state = LockState::free(name.clone());
        self.shared.count(1);
        let children = match c.list_children(&dir).await {
            Ok(ch) => ch,
            Err(zk::Error::NoNode) => return Ok(state),
            Err(e) => return Err(map(e, "listing contenders")),
        };
        let semaphore = children.iter().any(|c| c == SEM_LEASES || c == SEM_LOCKS);
        let sorted = sort_contenders(children);
        // Pipelined: every request is sent before the first reply is read.
        self.shared.count(sorted.len() as u64);
        let stats =
            futures::future::join_all(sorted.iter().map(|s| c.check_stat(&format!("{dir}/{s}"))))
                .await;
        let mut alive = Vec::new();
        for (child, stat) in sorted.into_iter().zip(stats) {
            match stat {
                Ok(Some(st)) => {
                    let role = classify(&child).map_or(Role::Mutex, |(r, _)| r);
                    let entry = format!("{dir}/{child}");
                    alive.push((child, contender(&st, entry, role.kind())));
                }
                Ok(None) => {} // gone meanwhile
                Err(e) => return Err(map(e, "reading a contender")),
            }
        }
        let names: Vec<String> = alive.iter().map(|(n, _)| n.clone()).collect();
        for (i, (child, cont)) in alive.into_iter().enumerate() {
            let role = classify(&child).map_or(Role::Mutex, |(r, _)| r);
            if blocker(&names, i, role).is_none() {
                state.holders.push(cont);
            } else {
                state.waiters.push(cont);
            }
        }
        if semaphore {
            self.inspect_semaphore(&c, &dir, &mut state).await?;
        }
        Ok(state)
    }

    /// Leases (holders: the first `permits` of them by sequence; a lease
    /// beyond that belongs to the waiter that holds the internal mutex),
    /// then the internal mutex's queue (without that waiter's node).
    async fn inspect_semaphore(
        &self,
        c: &zk::Client,
        dir: &str,
        state: &mut LockState,
    ) -> Result<()> {
        let leases_dir = format!("{dir}/{SEM_LEASES}");
        let locks_dir = format!("{dir}/{SEM_LOCKS}");
        self.shared.count(2);
        let (leases, locks) =
            futures::join!(c.list_children(&leases_dir), c.list_children(&locks_dir));
        let leases = match leases {
            Ok(l) => sort_by_marker(l, LEASE_MARKER),
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(map(e, "listing leases")),
        };
        let locks = match locks {
            Ok(l) => sort_by_marker(l, LOCK_MARKER),
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(map(e, "listing the semaphore's queue")),
        };
        self.shared.count((leases.len() + locks.len()) as u64);
        let lease_reads = futures::future::join_all(
            leases
                .iter()
                .map(|l| c.get_data(&format!("{leases_dir}/{l}"))),
        );
        let lock_stats = futures::future::join_all(
            locks
                .iter()
                .map(|l| c.check_stat(&format!("{locks_dir}/{l}"))),
        );
        let (lease_reads, lock_stats) = futures::join!(lease_reads, lock_stats);
        let mut found = Vec::new();
        let mut permits = None;
        for (child, r) in leases.iter().zip(lease_reads) {
            match r {
                Ok((data, st)) => {
                    permits = permits.or(parse_permits(&data));
                    found.push((child, st));
                }
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(map(e, "reading a lease")),
            }
        }
        let permits = permits.unwrap_or(found.len() as u32);
        let kind = LockKind::Semaphore { permits };
        let mut guids = Vec::new();
        let mut waiting_lease_owner = None;
        for (i, (child, st)) in found.into_iter().enumerate() {
            guids.extend(guid_prefix(child));
            let cont = contender(&st, format!("{leases_dir}/{child}"), kind);
            if i < permits as usize {
                state.holders.push(cont);
            } else {
                waiting_lease_owner = Some(st.ephemeral_owner);
                state.waiters.push(cont);
            }
        }
        for (i, (child, r)) in locks.iter().zip(lock_stats).enumerate() {
            match r {
                Ok(Some(st)) => {
                    // The mutex holder is already shown by its lease: ours
                    // share the GUID; Curator's (another GUID) is the first
                    // in the queue, of the same session as the lease beyond
                    // the permits.
                    if guid_prefix(child).is_some_and(|g| guids.contains(&g))
                        || (i == 0 && waiting_lease_owner == Some(st.ephemeral_owner))
                    {
                        continue;
                    }
                    state
                        .waiters
                        .push(contender(&st, format!("{locks_dir}/{child}"), kind));
                }
                Ok(None) => {}
                Err(e) => return Err(map(e, "reading a semaphore waiter")),
            }
        }
        Ok(())
    }

    async fn break_once(&self, c: zk::Client, name: &LockName) -> Result<bool> {
        loop {
            let state = self.inspect_once(c.clone(), name).await?;
            if state.holders.is_empty() {
                return Ok(false);
            }
            let mut broke = false;
            for h in &state.holders {
                // Mark first: our holder watches its own node and reports the
                // loss on this write, before the delete below lets a waiter in.
                self.shared.count(1);
                match c.set_data(&h.entry, BREAK_MESSAGE, None).await {
                    Ok(_) => {}
                    Err(zk::Error::NoNode) => continue, // released meanwhile
                    Err(e) => return Err(map(e, "marking the holder's node")),
                }
                // A holder of the last few milliseconds may not watch its
                // node yet (it starts HELD_WATCH_DELAY after the grant, and
                // then reads the mark): give it that long before the
                // delete can let a waiter in.
                tokio::time::sleep(2 * lockcore::backend::HELD_WATCH_DELAY).await;
                self.shared.count(1);
                match c.delete(&h.entry, None).await {
                    // Gone already: our holder saw the mark and let go.
                    Ok(()) | Err(zk::Error::NoNode) => {
                        tracing::info!(lock = %name, node = %h.entry, "lock broken");
                        broke = true;
                    }
                    Err(e) => return Err(map(e, "deleting the holder's node")),
                }
            }
            if broke {
                return Ok(true);
            }
            // Every holder went before we could mark it: look again.
        }
    }

    async fn revoke_once(&self, c: zk::Client, name: &LockName) -> Result<bool> {
        loop {
            let state = self.inspect_once(c.clone(), name).await?;
            if state.holders.is_empty() {
                return Ok(false);
            }
            let mut marked = false;
            for h in &state.holders {
                let done = match h.kind {
                    LockKind::Semaphore { .. } => self.mark_lease(&c, &h.entry).await?,
                    _ => {
                        self.shared.count(1);
                        match c.set_data(&h.entry, REVOKE_MESSAGE, None).await {
                            Ok(_) => true,
                            Err(zk::Error::NoNode) => false,
                            Err(e) => return Err(map(e, "marking the holder's node for revoke")),
                        }
                    }
                };
                marked |= done;
            }
            if marked {
                return Ok(true);
            }
        }
    }

    /// Writes the revoke marker on a lease; whether the lease was there.
    /// A lease keeps its permit count after the marker, but only a count
    /// read from that lease's own data: `inspect` guesses the count when
    /// only Curator's leases (whose data is a host address) are present,
    /// and a guess written here would later be read back as a fact (a
    /// semaphore of another count then failed with `Conflict`). The write
    /// is conditional on the version read, so the count is the node's.
    async fn mark_lease(&self, c: &zk::Client, lease: &str) -> Result<bool> {
        loop {
            self.shared.count(1);
            let (data, stat) = match c.get_data(lease).await {
                Ok(r) => r,
                Err(zk::Error::NoNode) => return Ok(false),
                Err(e) => return Err(map(e, "reading a lease")),
            };
            let mut marker = REVOKE_MESSAGE.to_vec();
            if let Some(permits) = parse_permits(&data) {
                marker.push(b' ');
                marker.extend(permits_data(permits));
            }
            self.shared.count(1);
            match c.set_data(lease, &marker, Some(stat.version)).await {
                Ok(_) => return Ok(true),
                Err(zk::Error::NoNode) => return Ok(false),
                Err(zk::Error::BadVersion) => continue, // written meanwhile: read again
                Err(e) => return Err(map(e, "marking a lease for revoke")),
            }
        }
    }

    async fn leftovers_once(&self, c: zk::Client) -> Result<Vec<String>> {
        let mut out = Vec::new();
        self.walk(&c, self.shared.root(), &mut out).await?;
        let opened = self.shared.opened.lock().expect("poisoned").clone();
        for (id, state) in opened {
            // A session being closed (or whose expiry its client is about
            // to learn) gets a moment to reach its terminal state.
            let limit = self
                .shared
                .config
                .connect_timeout
                .min(Duration::from_secs(3));
            if !wait_terminal(state, limit).await {
                out.push(format!("session {} still open", session_text(id.0)));
            }
        }
        Ok(out)
    }

    async fn walk(&self, c: &zk::Client, path: String, out: &mut Vec<String>) -> Result<()> {
        let mut stack = vec![path];
        let root = self.shared.root();
        while let Some(p) = stack.pop() {
            self.shared.count(1);
            let (children, stat) = match c.get_children(&p).await {
                Ok(r) => r,
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(map(e, "listing the namespace")),
            };
            // The server shows containers as plain persistent nodes
            // (ephemeralOwner 0), so empty parents are not told apart from
            // containers; we never create persistent nodes, only
            // containers (reaped by the server) and ephemeral contenders.
            let owner = stat.ephemeral_owner;
            if owner != 0 {
                out.push(format!(
                    "{p} (ephemeral node of session {})",
                    session_text(owner)
                ));
            } else if stat.data_length > 0 && p != root {
                out.push(format!("{p} (parent node with data)"));
            }
            for child in children {
                if p == "/" && child == "zookeeper" {
                    continue;
                }
                let base = if p == "/" { String::new() } else { p.clone() };
                stack.push(format!("{base}/{child}"));
            }
        }
        Ok(())
    }
}

/// A contender as `inspect` reports it.
fn contender(st: &zk::Stat, entry: String, kind: LockKind) -> Contender {
    Contender {
        session: session_text(st.ephemeral_owner),
        token: st.czxid as u64,
        entry,
        kind,
        since: u64::try_from(st.ctime)
            .ok()
            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
    }
}

#[async_trait]
impl Backend for ZkBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kill_session: true,
            rwlock: true,
            semaphore: true,
            session_ttl: self
                .negotiated_session_timeout()
                .unwrap_or(self.shared.config.session_timeout),
        }
    }

    fn describe(&self) -> String {
        self.shared.config.display.clone()
    }

    async fn open_session(&self, liveness: Arc<SessionLiveness>) -> Result<Arc<dyn StoreSession>> {
        let (client, started) = self.shared.connect(None).await?;
        let timeout = client.session_timeout();
        liveness.confirm(started, deadline_ttl(timeout));
        if !liveness.is_alive() {
            // The connect took most of a timeout (hosts tried in turn):
            // confirm with a fresh round trip through the leader (a read
            // would be answered by a follower even when cut off from it).
            self.shared.count(1);
            let sent = Instant::now();
            match client.sync("/").await {
                Ok(_) => liveness.confirm(sent, deadline_ttl(timeout)),
                Err(e) => return Err(map(e, "confirming a new session")),
            }
        }
        self.shared.record_opened(&client, &liveness);
        tracing::debug!(session = %client.session_id(), timeout = ?client.session_timeout(), "ZooKeeper session opened");
        let id = client.session_id();
        let session = ZkSession::start(self.shared.clone(), client, liveness);
        set_shutdown(id, session.shutdown_handle());
        Ok(Arc::new(session))
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        self.shared.lock_dir(name)?; // checked before anything is sent
        self.with_admin(|c| self.inspect_once(c, name)).await
    }

    async fn break_lock(&self, name: &LockName) -> Result<bool> {
        self.shared.lock_dir(name)?; // checked before anything is sent
        self.with_admin(|c| self.break_once(c, name)).await
    }

    async fn request_revoke(&self, name: &LockName) -> Result<bool> {
        self.shared.lock_dir(name)?; // checked before anything is sent
        self.with_admin(|c| self.revoke_once(c, name)).await
    }

    async fn leftovers(&self) -> Result<Vec<String>> {
        self.with_admin(|c| self.leftovers_once(c)).await
    }

    async fn kill_session(&self, session: &str) -> Result<()> {
        let id = session
            .strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .map(|v| v as i64)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidArgument,
                    format!("{session:?} is not a ZooKeeper session id (0x...)"),
                )
            })?;
        let known = registry()
            .lock()
            .expect("registry poisoned")
            .get(&id)
            .cloned();
        let Some(Registered {
            info,
            liveness,
            state: victim,
            shutdown,
        }) = known
        else {
            return Err(Error::new(
                ErrorKind::Store,
                format!(
                    "cannot kill session {session}: ZooKeeper ends a session only for a client that knows its password, \
                     and only sessions opened in this process are known"
                ),
            ));
        };
        // ZooKeeper itself expires a session only after its owner has been
        // silent for the whole timeout, by which time the owner's local
        // deadline has fired. Ending it at once from outside has no such
        // order, so the owner (in this process) is told first.
        if let Some(l) = liveness.upgrade() {
            l.lose(LossReason::SessionExpired);
        }
        // The owner's client closes the session itself once dropped; that
        // is quick when it is connected.
        if let Some(shutdown) = shutdown {
            shutdown();
            if wait_terminal(victim.clone(), Duration::from_secs(1)).await {
                unregister_session(zk::SessionId(id));
                tracing::info!(%session, "session killed (closed by its owner's client)");
                return Ok(());
            }
        }
        // Else reattach with the session's id and password, then close it:
        // the server ends the session and drops its ephemeral nodes; the
        // original client learns on its next reconnect that it expired.
        for _ in 0..5 {
            match self.shared.connect(Some(info.clone())).await {
                Ok((c, _)) => {
                    let state = c.state_watcher();
                    self.shared.count(1); // closeSession
                    drop(c);
                    if wait_terminal(state, self.shared.config.connect_timeout).await {
                        // Closed on the server; the owner's client learns
                        // it on its next reconnect.
                        unregister_session(zk::SessionId(id));
                        tracing::info!(%session, "session killed");
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == ErrorKind::SessionLost => {
                    unregister_session(zk::SessionId(id));
                    return Ok(()); // already gone
                }
                Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => return Err(e),
            }
        }
        Err(Error::new(
            ErrorKind::Connection,
            format!("could not end session {session}"),
        ))
    }

    fn requests_sent(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_like_curator() {
        let kids = vec![
            "_c_b-lock-0000000003".to_string(),
            "nested".to_string(),
            "_c_a-lock-0000000001".to_string(),
            "_c_c-lock-0000000002".to_string(),
        ];
        assert_eq!(
            sort_contenders(kids),
            vec![
                "_c_a-lock-0000000001",
                "_c_c-lock-0000000002",
                "_c_b-lock-0000000003"
            ]
        );
        assert_eq!(sort_key("_c_x-lock-y-lock-0000000007"), "0000000007");
    }

    #[test]
    fn rw_and_mutex_entries_form_one_queue() {
        let kids = vec![
            "_c_b-__WRIT__0000000004".to_string(),
            "_c_a-__READ__0000000001".to_string(),
            "leases".to_string(),
            "_c_c-__READ__0000000002".to_string(),
            "_c_d-lock-0000000003".to_string(),
            "_c_e-__READ__0000000005".to_string(),
        ];
        let sorted = sort_contenders(kids);
        assert_eq!(
            sorted,
            vec![
                "_c_a-__READ__0000000001",
                "_c_c-__READ__0000000002",
                "_c_d-lock-0000000003",
                "_c_b-__WRIT__0000000004",
                "_c_e-__READ__0000000005",
            ]
        );
        // Both readers ahead of the mutex hold; the mutex waits for its
        // predecessor; the writer for the mutex; the last reader for the
        // nearest writer ahead.
        assert_eq!(blocker(&sorted, 0, Role::Read), None);
        assert_eq!(blocker(&sorted, 1, Role::Read), None);
        assert_eq!(blocker(&sorted, 2, Role::Mutex), Some(1));
        assert_eq!(blocker(&sorted, 3, Role::Write), Some(2));
        assert_eq!(blocker(&sorted, 4, Role::Read), Some(3));
        assert_eq!(blocker(&sorted, 0, Role::Write), None);
        assert_eq!(classify("locks"), None);
        assert_eq!(classify("leases"), None);
        assert_eq!(
            classify("_c_x-__READ__0000000009"),
            Some((Role::Read, "0000000009"))
        );
    }

    #[test]
    fn semaphore_helpers() {
        let leases = vec![
            "_c_9e2f5d6a-3b1c-4d2e-8f00-0123456789ab-lease-0000000002".to_string(),
            "_c_0e2f5d6a-3b1c-4d2e-8f00-0123456789ab-lease-0000000001".to_string(),
        ];
        let sorted = sort_by_marker(leases, LEASE_MARKER);
        assert!(sorted[0].ends_with("0000000001"));
        assert_eq!(
            guid_prefix(&sorted[0]),
            Some("_c_0e2f5d6a-3b1c-4d2e-8f00-0123456789ab-")
        );
        assert_eq!(guid_prefix("lease-0000000001"), None);
        assert_eq!(parse_permits(&permits_data(3)), Some(3));
        assert_eq!(parse_permits(b"__REVOKE__ permits=7"), Some(7));
        assert_eq!(parse_permits(b"192.168.0.1"), None);
        assert_eq!(parse_permits(b"__REVOKE__"), None);
    }
}

/// Against the real server (`QUORUMLOCK_TEST_ZK_URL`): what a backend
/// keeps per session it ever opened.
#[cfg(test)]
mod store_tests {
    use super::*;

    async fn backend() -> Option<ZkBackend> {
        let Ok(url) = std::env::var("QUORUMLOCK_TEST_ZK_URL") else {
            assert!(
                std::env::var("QUORUMLOCK_TEST_REQUIRE").as_deref() != Ok("1"),
                "QUORUMLOCK_TEST_ZK_URL is not set and QUORUMLOCK_TEST_REQUIRE=1"
            );
            eprintln!("SKIPPED: QUORUMLOCK_TEST_ZK_URL is not set");
            return None;
        };
        Some(ZkBackend::connect(&url).await.expect("connect"))
    }

    /// 40 sessions opened and closed one after the other: the list that
    /// `leftovers()` checks holds the open ones, not every one ever opened
    /// (it held 40).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sessions_kept_for_leftovers_are_bounded() {
        let Some(b) = backend().await else { return };
        let live = b
            .open_session(Arc::new(SessionLiveness::new()))
            .await
            .unwrap();
        for _ in 0..40 {
            let s = b
                .open_session(Arc::new(SessionLiveness::new()))
                .await
                .unwrap();
            s.close().await.unwrap();
        }
        let kept = b.shared.opened.lock().expect("poisoned").len();
        assert!(kept <= 2, "{kept} sessions kept after opening 41");
        // Sessions dropped without `close` (as a lost session is): gone
        // from both lists once they have ended and their owner is gone.
        for _ in 0..40 {
            let liveness = Arc::new(SessionLiveness::new());
            drop(b.open_session(liveness).await.unwrap());
        }
        let states: Vec<_> = b.shared.opened.lock().expect("poisoned").clone();
        for (_, state) in states.into_iter().skip(1) {
            assert!(wait_terminal(state, Duration::from_secs(5)).await);
        }
        let last = b
            .open_session(Arc::new(SessionLiveness::new()))
            .await
            .unwrap();
        let kept = b.shared.opened.lock().expect("poisoned").len();
        assert!(kept <= 2, "{kept} sessions kept after opening 82");
        let registered = registry().lock().expect("poisoned").len();
        assert!(registered <= 2, "{registered} sessions in the registry");
        last.close().await.unwrap();
        // The open one is still reported until it is closed.
        let before = b.leftovers().await.unwrap();
        assert!(before.iter().any(|l| l.contains(&live.id())), "{before:?}");
        live.close().await.unwrap();
        assert_eq!(b.leftovers().await.unwrap(), Vec::<String>::new());
    }
}
