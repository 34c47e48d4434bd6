//! The `Backend` for ZooKeeper: connection setup, the Curator layout, and
//! the admin operations (inspect, break, revoke, kill, leftovers).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use lockcore::url::Url;
use lockcore::{
    Backend, Capabilities, Contender, Error, ErrorKind, LockKind, LockName, LockState, Result,
    SessionLiveness, StoreSession,
};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::error::map;
use crate::session::ZkSession;

/// The data Curator's `Revoker` writes on a holder's node.
pub(crate) const REVOKE_MESSAGE: &[u8] = b"__REVOKE__";
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

/// Sessions opened in this process, by id, with what it takes to reattach
/// to them: ZooKeeper ends a session only for a client that presents its
/// id AND password, so [`Backend::kill_session`] can end sessions opened
/// by any `ZkBackend` of this process, not of other processes.
fn registry() -> &'static Mutex<HashMap<i64, (String, zk::SessionInfo)>> {
    static R: OnceLock<Mutex<HashMap<i64, (String, zk::SessionInfo)>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

pub(crate) fn register_session(connect: &str, info: &zk::SessionInfo) {
    registry()
        .lock()
        .expect("registry poisoned")
        .insert(info.id().0, (connect.to_string(), info.clone()));
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
        match self.config.namespace.as_str() {
            "" => {
                if name.segments().next() == Some("zookeeper") {
                    return Err(Error::new(
                        ErrorKind::InvalidName,
                        "without a namespace, a lock name must not start with zookeeper (the server's own tree)",
                    ));
                }
                Ok(format!("/{name}"))
            }
            ns => Ok(format!("/{ns}/{name}")),
        }
    }

    fn root(&self) -> String {
        match self.config.namespace.as_str() {
            "" => "/".to_string(),
            ns => format!("/{ns}"),
        }
    }

    /// Opens a ZooKeeper session (or reattaches to `session`), within the
    /// connect timeout.
    pub(crate) async fn connect(&self, session: Option<zk::SessionInfo>) -> Result<zk::Client> {
        let mut c = zk::Client::connector().with_session_timeout(self.config.session_timeout);
        if let Some((user, pw)) = &self.config.auth {
            c = c.with_auth("digest", format!("{user}:{}", pw.expose()).as_bytes());
        }
        if let Some(s) = session {
            c = c.with_session(s);
        }
        self.count(1);
        let connect = c.connect(&self.connect_string);
        match tokio::time::timeout(self.config.connect_timeout, connect).await {
            Ok(Ok(client)) => {
                self.negotiated_ms.store(
                    client.session_timeout().as_millis() as u64,
                    Ordering::Relaxed,
                );
                Ok(client)
            }
            Ok(Err(e)) => Err(map(e, "opening a session")),
            Err(_) => Err(Error::new(
                ErrorKind::Connection,
                format!(
                    "ZooKeeper: no session with {} within connect_timeout={:?}",
                    self.config.display, self.config.connect_timeout
                ),
            )),
        }
    }

    pub(crate) fn record_opened(&self, client: &zk::Client) {
        self.opened
            .lock()
            .expect("poisoned")
            .push((client.session_id(), client.state_watcher()));
        register_session(&self.connect_string, client.session());
    }

    async fn admin(&self) -> Result<zk::Client> {
        let mut slot = self.admin.lock().await;
        if let Some(c) = slot.as_ref() {
            if !c.state().is_terminated() {
                return Ok(c.clone());
            }
        }
        let c = self.connect(None).await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Contender children of `dir` sorted as Curator sorts them (by the text
    /// after the last `lock-`); other children (nested locks) are not
    /// contenders. `None` if the lock node does not exist.
    pub(crate) async fn sorted(&self, c: &zk::Client, dir: &str) -> Result<Option<Vec<String>>> {
        self.count(1);
        match c.list_children(dir).await {
            Ok(children) => Ok(Some(sort_contenders(children))),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(map(e, "listing contenders")),
        }
    }
}

/// The part of a contender's name that orders it (Curator's
/// `StandardLockInternalsDriver.fixForSorting`).
pub(crate) fn sort_key(child: &str) -> &str {
    match child.rfind(LOCK_MARKER) {
        Some(i) => &child[i + LOCK_MARKER.len()..],
        None => child,
    }
}

pub(crate) fn sort_contenders(children: Vec<String>) -> Vec<String> {
    let mut v: Vec<String> = children
        .into_iter()
        .filter(|c| c.contains(LOCK_MARKER))
        .collect();
    v.sort_by(|a, b| sort_key(a).cmp(sort_key(b)));
    v
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
    pub async fn connect(url: &Url) -> Result<ZkBackend> {
        let b = ZkBackend::new(ZkConfig::from_url(url)?);
        b.shared.admin().await?;
        Ok(b)
    }

    /// As [`ZkBackend::connect`], for a URL given as text; accepts a port
    /// per server (`zk://a:2181,b:2182/ns`).
    ///
    /// # Cancel safety
    /// As [`ZkBackend::connect`].
    pub async fn connect_str(url: &str) -> Result<ZkBackend> {
        let b = ZkBackend::new(ZkConfig::parse(url)?);
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

    /// Watch events received by this instance's lock sessions (waiters'
    /// predecessor watches and holders' own-node watches).
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

#[async_trait]
impl Backend for ZkBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kill_session: true,
            rwlock: false,
            semaphore: false,
            session_ttl: self
                .negotiated_session_timeout()
                .unwrap_or(self.shared.config.session_timeout),
        }
    }

    fn describe(&self) -> String {
        self.shared.config.display.clone()
    }

    async fn open_session(&self, liveness: Arc<SessionLiveness>) -> Result<Arc<dyn StoreSession>> {
        let sent = Instant::now();
        let client = self.shared.connect(None).await?;
        liveness.confirm(sent, client.session_timeout());
        self.shared.record_opened(&client);
        tracing::debug!(session = %client.session_id(), timeout = ?client.session_timeout(), "ZooKeeper session opened");
        Ok(Arc::new(ZkSession::start(
            self.shared.clone(),
            client,
            liveness,
        )))
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        let dir = self.shared.lock_dir(name)?;
        let c = self.shared.admin().await?;
        let Some(sorted) = self.shared.sorted(&c, &dir).await? else {
            return Ok(LockState::free(name.clone()));
        };
        // Pipelined: every request is sent before the first reply is read.
        self.shared.count(sorted.len() as u64);
        let paths: Vec<String> = sorted.iter().map(|s| format!("{dir}/{s}")).collect();
        let stats = futures::future::join_all(paths.iter().map(|p| c.check_stat(p))).await;
        let mut all = Vec::new();
        for (path, stat) in paths.into_iter().zip(stats) {
            match stat {
                Ok(Some(st)) => all.push(Contender {
                    session: session_text(st.ephemeral_owner),
                    token: st.czxid as u64,
                    entry: path,
                    kind: LockKind::Exclusive,
                    since: u64::try_from(st.ctime)
                        .ok()
                        .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
                }),
                Ok(None) => {} // gone meanwhile
                Err(e) => return Err(map(e, "reading a contender")),
            }
        }
        let waiters = if all.is_empty() {
            Vec::new()
        } else {
            all.split_off(1)
        };
        Ok(LockState {
            name: name.clone(),
            holders: all,
            waiters,
        })
    }

    async fn break_lock(&self, name: &LockName) -> Result<bool> {
        let dir = self.shared.lock_dir(name)?;
        let c = self.shared.admin().await?;
        loop {
            let Some(sorted) = self.shared.sorted(&c, &dir).await? else {
                return Ok(false);
            };
            let Some(holder) = sorted.first() else {
                return Ok(false);
            };
            self.shared.count(1);
            match c.delete(&format!("{dir}/{holder}"), None).await {
                Ok(()) => {
                    tracing::info!(lock = %name, node = %holder, "lock broken");
                    return Ok(true);
                }
                Err(zk::Error::NoNode) => continue, // released meanwhile: look again
                Err(e) => return Err(map(e, "deleting the holder's node")),
            }
        }
    }

    async fn request_revoke(&self, name: &LockName) -> Result<bool> {
        let dir = self.shared.lock_dir(name)?;
        let c = self.shared.admin().await?;
        loop {
            let Some(sorted) = self.shared.sorted(&c, &dir).await? else {
                return Ok(false);
            };
            let Some(holder) = sorted.first() else {
                return Ok(false);
            };
            self.shared.count(1);
            match c
                .set_data(&format!("{dir}/{holder}"), REVOKE_MESSAGE, None)
                .await
            {
                Ok(_) => return Ok(true),
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(map(e, "marking the holder's node for revoke")),
            }
        }
    }

    async fn kill_session(&self, session: &str) -> Result<()> {
        let id = session
            .strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .map(|v| v as i64)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Store,
                    format!("{session:?} is not a ZooKeeper session id (0x...)"),
                )
            })?;
        let known = registry()
            .lock()
            .expect("registry poisoned")
            .get(&id)
            .cloned();
        let Some((_connect, info)) = known else {
            return Err(Error::new(
                ErrorKind::Store,
                format!(
                    "cannot kill session {session}: ZooKeeper ends a session only for a client that knows its password, \
                     and only sessions opened in this process are known"
                ),
            ));
        };
        // Reattach with the session's id and password, then close it: the
        // server ends the session and drops its ephemeral nodes; the
        // original client learns on its next reconnect that it expired.
        for _ in 0..5 {
            match self.shared.connect(Some(info.clone())).await {
                Ok(c) => {
                    let state = c.state_watcher();
                    self.shared.count(1); // closeSession
                    drop(c);
                    if wait_terminal(state, self.shared.config.connect_timeout).await {
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

    async fn leftovers(&self) -> Result<Vec<String>> {
        let c = self.shared.admin().await?;
        let mut out = Vec::new();
        self.walk(&c, self.shared.root(), &mut out).await?;
        for (id, state) in self.shared.opened.lock().expect("poisoned").iter() {
            if !state.peek_state().is_terminated() {
                out.push(format!("session {} still open", session_text(id.0)));
            }
        }
        Ok(out)
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
}
