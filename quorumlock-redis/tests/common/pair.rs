//! A Redis primary with a replica, started by the test on free ports: the
//! failover tests' servers, the address a failover moves, and a
//! [`Pair`] that the explorer fails over.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::faults::{Failover, FaultTarget, NetControl, NetMode, TcpProxy};
use quorumlock_conformance::support::{env_or_skip, free_port};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// The `redis-server` binary (`scripts/stores.sh up redis` exports it),
/// or a loud skip (a panic when `QUORUMLOCK_TEST_REQUIRE=1`).
pub fn server_binary() -> Option<String> {
    env_or_skip("QUORUMLOCK_REDIS_SERVER")
}

/// A `redis-server` of this test, killed when dropped, with its own
/// directory (a replica writes the synced data there), removed too.
pub struct Server {
    pub child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    pub async fn start(bin: &str, extra: &[&str]) -> Server {
        let port = free_port();
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(bin);
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir.path())
            .args(extra)
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true);
        let child = cmd.spawn().expect("starting redis-server");
        let s = Server {
            child,
            port,
            _dir: dir,
        };
        for _ in 0..100 {
            if s.query::<String>(&mut redis::cmd("PING")).await.is_ok() {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("redis-server on {port} did not answer");
    }

    pub async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &mut redis::Cmd,
    ) -> redis::RedisResult<T> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.port))?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        cmd.query_async(&mut conn).await
    }

    /// Its `INFO replication`.
    pub async fn replication(&self) -> redis::RedisResult<String> {
        self.query(redis::cmd("INFO").arg("replication")).await
    }

    pub fn url(&self, port: u16, ns: &str) -> quorumlock_core::url::Url {
        let _ = self;
        quorumlock_core::url::parse(&format!("redis://127.0.0.1:{port}/{ns}?ttl=2s")).unwrap()
    }
}

/// A TCP forwarder whose target can be switched: new connections go to
/// the new target, open ones are closed (what a client sees when a
/// failover moves the address it connects to).
pub struct Switch {
    pub addr: SocketAddr,
    target: Arc<AtomicU16>,
    conns: Arc<std::sync::Mutex<JoinSet<()>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Switch {
    pub async fn start(target: u16) -> Switch {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let target = Arc::new(AtomicU16::new(target));
        let conns = Arc::new(std::sync::Mutex::new(JoinSet::new()));
        let (t, c) = (target.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                // The port read under the lock `switch_to` takes: a
                // connection is to the new target, or closed by it.
                let mut conns = c.lock().unwrap();
                let port = t.load(Ordering::SeqCst);
                conns.spawn(async move {
                    if let Ok(mut out) = TcpStream::connect(("127.0.0.1", port)).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
            }
        });
        Switch {
            addr,
            target,
            conns,
            accept,
        }
    }

    pub fn switch_to(&self, port: u16) {
        let mut conns = self.conns.lock().unwrap();
        self.target.store(port, Ordering::SeqCst);
        conns.abort_all();
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Waits until `replica` reports its link to its primary up.
pub async fn synced(replica: &Server) {
    try_synced(replica).await.unwrap()
}

/// [`synced`], or why not within 10 s.
async fn try_synced(replica: &Server) -> Result<(), String> {
    let mut info = String::new();
    for _ in 0..200 {
        info = replica
            .replication()
            .await
            .map_err(|e| format!("INFO of the replica: {e}"))?;
        if info.contains("master_link_status:up") {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("the replica never synced: {info}"))
}

/// Waits until `replica` has everything `primary` had written when it
/// was called: the replica's processed offset (`slave_repl_offset`)
/// reaches the primary's `master_repl_offset`, read first; panics after
/// 10 s with both servers' `INFO replication`.
///
/// Not `WAIT`: it counts the replicas that acknowledged the asking
/// connection's own last write, and [`Server::query`] asks on a new
/// connection, which wrote nothing, so `WAIT 1` answers 1 at once while
/// the replica may still lack the last writes (a failure of the failover
/// test under load: the grant was still on its way when the test cut the
/// link).
pub async fn caught_up(primary: &Server, replica: &Server) {
    let offset = |info: &str, field: &str| -> Option<u64> {
        info.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
    };
    let info = primary.replication().await.unwrap();
    let written = offset(&info, "master_repl_offset").expect("the primary's master_repl_offset");
    let mut seen = String::new();
    for _ in 0..200 {
        seen = replica.replication().await.unwrap();
        if offset(&seen, "slave_repl_offset").is_some_and(|o| o >= written) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the replica did not reach the primary's offset {written} within 10 s: {} | {}",
        info.replace("\r\n", " "),
        seen.replace("\r\n", " ")
    );
}

/// Two servers, one the primary and one its replica, behind one address
/// ([`Switch`]) that a failover moves. Each replicates from the other
/// through a proxy of its own (`links[i]` leads to server `i`), so that
/// the explorer can cut the link before a failover.
pub struct Pair {
    servers: [Server; 2],
    links: [TcpProxy; 2],
    switch: Switch,
    /// Which of `servers` is the primary.
    primary: AtomicUsize,
    /// Promotions so far.
    promoted: AtomicUsize,
}

impl Pair {
    /// Server 0 the primary, server 1 its replica, synced. A full sync
    /// starts at once (not after Redis's default 5 s of waiting for more
    /// replicas), so that the old primary is a replica again soon after a
    /// failover.
    pub async fn start(bin: &str) -> Pair {
        const NO_DELAY: [&str; 2] = ["--repl-diskless-sync-delay", "0"];
        let first = Server::start(bin, &NO_DELAY).await;
        let to_first = TcpProxy::start(([127, 0, 0, 1], first.port).into())
            .await
            .unwrap();
        let to_first_port = to_first.addr().port().to_string();
        let second = Server::start(
            bin,
            &[
                NO_DELAY[0],
                NO_DELAY[1],
                "--replicaof",
                "127.0.0.1",
                &to_first_port,
            ],
        )
        .await;
        let to_second = TcpProxy::start(([127, 0, 0, 1], second.port).into())
            .await
            .unwrap();
        synced(&second).await;
        let switch = Switch::start(first.port).await;
        Pair {
            servers: [first, second],
            links: [to_first, to_second],
            switch,
            primary: AtomicUsize::new(0),
            promoted: AtomicUsize::new(0),
        }
    }

    /// The address clients use: the primary's, whichever it is.
    pub fn addr(&self) -> SocketAddr {
        self.switch.addr
    }

    /// A fault target on the pair (its address, sessions of `ttl`) that
    /// fails it over.
    pub fn target(self: &Arc<Self>, ttl: &str) -> FaultTarget {
        let base = quorumlock_core::url::parse(&format!("redis://{}/", self.addr())).unwrap();
        FaultTarget::new("redis-failover", base, |url| async move {
            Ok(Arc::new(quorumlock_redis::RedisBackend::connect(&url).await?) as _)
        })
        .with_option("ttl", ttl)
        .with_failover(self.clone())
    }

    /// How many times a replica was promoted.
    pub fn failovers(&self) -> usize {
        self.promoted.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl Failover for Pair {
    async fn partition(&self) -> Result<(), String> {
        let p = self.primary.load(Ordering::SeqCst);
        self.links[p].set_mode(NetMode::Cut);
        Ok(())
    }

    async fn promote(&self) -> Result<Instant, String> {
        let p = self.primary.load(Ordering::SeqCst);
        let r = 1 - p;
        let fail = |what: &str, e: redis::RedisError| format!("{what}: {e}");
        if let Err(e) = self.servers[r]
            .query::<()>(redis::cmd("REPLICAOF").arg("NO").arg("ONE"))
            .await
        {
            // No failover: the replica catches up again.
            self.links[p].set_mode(NetMode::Pass);
            return Err(fail("promoting the replica", e));
        }
        self.switch.switch_to(self.servers[r].port);
        let switched = Instant::now();
        self.primary.store(r, Ordering::SeqCst);
        self.promoted.fetch_add(1, Ordering::SeqCst);
        // The old primary, its writes since the cut dropped, replicates
        // from the new one (through the new one's link, not cut).
        let _: () = self.servers[p]
            .query(
                redis::cmd("REPLICAOF")
                    .arg("127.0.0.1")
                    .arg(self.links[r].addr().port()),
            )
            .await
            .map_err(|e| fail("making the old primary a replica", e))?;
        self.links[p].set_mode(NetMode::Pass);
        try_synced(&self.servers[p]).await?;
        Ok(switched)
    }
}
