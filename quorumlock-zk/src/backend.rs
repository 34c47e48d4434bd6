//! The `Backend` for ZooKeeper: the constructors, and `impl Backend`,
//! each method a delegation (the admin operations to `admin.rs`, sessions
//! to `session.rs`, key writes to `fenced.rs`).

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use quorumlock_core::backend::connect::check_connect;
use quorumlock_core::backend::{
    Backend, Capabilities, ChangeFeed, HeldEntry, KeyWrite, SessionLiveness, StoreSession,
};
use quorumlock_core::{Error, ErrorKind, LockName, LockState, Result};
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::core::{AdminUse, ZkCore};
use crate::fenced;
use crate::session::ZkSession;

/// A ZooKeeper backend: one ZooKeeper session per [`quorumlock_core::LockClient`],
/// Curator's `InterProcessMutex` layout, `czxid` fencing tokens.
///
/// Cheap to clone; clones share counters and the admin connection.
#[derive(Clone)]
pub struct ZkBackend {
    pub(crate) core: Arc<ZkCore>,
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("config", &self.core.config)
            .finish()
    }
}

/// `Ok` once a TCP connection to one of `servers` succeeds;
/// [`ErrorKind::Connection`] if every one refuses.
async fn reachable(servers: &[(String, u16)]) -> Result<()> {
    let mut last = None;
    for (host, port) in servers {
        match tokio::net::TcpStream::connect((host.as_str(), *port)).await {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    let e = last.unwrap_or_else(|| std::io::Error::other("no servers"));
    Err(Error::new(
        ErrorKind::Connection,
        format!("ZooKeeper: cannot connect to any server: {e}"),
    )
    .with_source(e))
}

/// No session in time once a server accepted the TCP connection (the
/// library's own "timeout", or our `connect_timeout` running out): a
/// silent store, [`ErrorKind::Timeout`] for `check_connect`.
fn silent_as_timeout(e: Error) -> Error {
    // `cause()`, the error itself: `source()` is the cause's own source
    // (each message once in a chain report, since 11efa92), which skips
    // the `zk::Error` and `Elapsed` looked for here.
    let silent = e.cause().is_some_and(|s| {
        s.downcast_ref::<zk::Error>()
            .is_some_and(|z| matches!(z, zk::Error::Timeout))
            || s.is::<tokio::time::error::Elapsed>()
    });
    if e.kind() == ErrorKind::Connection && silent {
        Error::new(
            ErrorKind::Timeout,
            "ZooKeeper: no session (no server answered)",
        )
        .with_source(e)
    } else {
        e
    }
}

impl ZkBackend {
    /// Parses and validates `url` (nothing is contacted for bad input),
    /// then, unless it says `lazy=true`, checks that the servers answer
    /// (see [`ZkBackend::from_config`]).
    ///
    /// # Cancel Safety
    /// Dropping it may leave the admin session half open; it is closed when
    /// the backend is dropped, or expires by its timeout.
    pub async fn connect(url: impl AsRef<str>) -> Result<ZkBackend> {
        Self::from_config(ZkConfig::parse(url.as_ref())?).await
    }

    /// A backend for `config` ([`ZkConfig::validate`]d first: a config
    /// breaking the URL's rules is [`ErrorKind::InvalidArgument`], nothing
    /// contacted) that, unless [`ZkConfig::lazy`], checks the
    /// servers answer by opening the admin session within
    /// [`ZkConfig::connect_timeout`]: every server refusing the connection
    /// until then is [`ErrorKind::Unavailable`], no session in time is
    /// [`ErrorKind::Timeout`], refused digest credentials
    /// [`ErrorKind::Unauthenticated`] at once. A negotiated session timeout
    /// under 5 of the server's ticks is [`ErrorKind::InvalidUrl`] (the
    /// local loss deadline is sound only from 5 ticks on; see the README's
    /// "Safety on an ensemble"); a lazy backend fails its first session
    /// so. A lazy backend contacts nothing here: sessions are opened by
    /// [`Backend::open_session`], the admin session on first admin use.
    ///
    /// There is no constructor from a `zookeeper_client::Client`: the
    /// backend opens a session per [`quorumlock_core::LockClient`] session and a
    /// new one after a loss, and ends it to drop every entry at once; a
    /// client owned by the caller can do neither.
    ///
    /// # Cancel Safety
    /// As [`ZkBackend::connect`].
    pub async fn from_config(config: ZkConfig) -> Result<ZkBackend> {
        config.validate()?;
        let b = ZkBackend {
            core: Arc::new(ZkCore::new(config)),
        };
        if !b.core.config.lazy {
            let store = b.core.config.describe();
            check_connect(&store, b.core.config.connect_timeout, || async {
                // The client library retries a refused server until its
                // session timeout and then says "timeout", the word for a
                // silent one too; a TCP connect tells the two apart.
                reachable(&b.core.config.servers).await?;
                let admin = b
                    .core
                    .admin(AdminUse::Waits)
                    .await
                    .map_err(silent_as_timeout)?;
                // A timeout under 5 of the server's ticks is refused.
                b.core
                    .check_ticks(admin.session_timeout())
                    .await
                    .map_err(silent_as_timeout)
            })
            .await?;
        }
        Ok(b)
    }

    /// The configuration.
    pub fn config(&self) -> &ZkConfig {
        &self.core.config
    }

    /// How many of [`Backend::requests_sent`] were keepalive reads (one per
    /// session every third of the session timeout).
    pub fn keepalives_sent(&self) -> u64 {
        self.core.keepalives.load(Ordering::Relaxed)
    }

    /// Wake-ups of waiting acquires: watch events on the predecessor
    /// node received by this instance's lock sessions (a release should
    /// cause exactly one, in the next waiter).
    pub fn watch_events(&self) -> u64 {
        self.core.watch_events.load(Ordering::Relaxed)
    }

    /// The session timeout the server granted last (`None` before the
    /// first session).
    pub fn negotiated_session_timeout(&self) -> Option<Duration> {
        match self.core.negotiated_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
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
                .unwrap_or(self.core.config.session_timeout),
            proclaim: true,
            changes: true,
            acquire_many: true,
            upgradeable_read: true,
        }
    }

    fn describe(&self) -> String {
        self.core.config.display.clone()
    }

    async fn open_session(&self, liveness: Arc<SessionLiveness>) -> Result<Arc<dyn StoreSession>> {
        Ok(Arc::new(ZkSession::open(&self.core, liveness).await?))
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        self.core.inspect(name).await
    }

    async fn list(&self, prefix: Option<&LockName>) -> Result<Vec<LockState>> {
        self.core.list(prefix).await
    }

    async fn break_lock(&self, name: &LockName) -> Result<bool> {
        self.core.break_lock(name).await
    }

    async fn request_revoke(&self, name: &LockName) -> Result<bool> {
        self.core.request_revoke(name).await
    }

    async fn leftovers(&self) -> Result<Vec<String>> {
        self.core.leftovers().await
    }

    async fn kill_session(&self, session: &str) -> Result<()> {
        self.core.kill_session(session).await
    }

    fn requests_sent(&self) -> u64 {
        self.core.requests.load(Ordering::Relaxed)
    }

    async fn fenced_write(&self, held: &[HeldEntry], write: &KeyWrite) -> Result<()> {
        fenced::fenced_write(&self.core, held, write).await
    }

    async fn read_key(&self, key: &str) -> Result<Option<Vec<u8>>> {
        fenced::read_key(&self.core, key).await
    }

    async fn write_key(&self, write: &KeyWrite) -> Result<()> {
        fenced::write_key(&self.core, write).await
    }

    fn changes(&self, name: &LockName) -> Option<ChangeFeed> {
        Some(self.core.changes(name))
    }
}

/// Against the real server (`QUORUMLOCK_TEST_ZK_URL`): what a backend
/// keeps per session it ever opened.
#[cfg(test)]
mod store_tests {
    use super::*;
    use crate::core::{registry, wait_terminal};

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
        let kept = b.core.opened.lock().expect("poisoned").len();
        assert!(kept <= 2, "{kept} sessions kept after opening 41");
        // Sessions dropped without `close` (as a lost session is): gone
        // from both lists once they have ended and their owner is gone.
        for _ in 0..40 {
            let liveness = Arc::new(SessionLiveness::new());
            drop(b.open_session(liveness).await.unwrap());
        }
        let states: Vec<_> = b.core.opened.lock().expect("poisoned").clone();
        for (_, state) in states.into_iter().skip(1) {
            assert!(wait_terminal(state, Duration::from_secs(5)).await);
        }
        let last = b
            .open_session(Arc::new(SessionLiveness::new()))
            .await
            .unwrap();
        let kept = b.core.opened.lock().expect("poisoned").len();
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
