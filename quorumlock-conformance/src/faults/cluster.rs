//! A launcher for three-node clusters of etcd, ZooKeeper and Consul on
//! loopback (127.0.0.2, .3, .4, each node on its own address, ports of
//! our own), able to kill -9, stop (SIGSTOP), continue, restart and find
//! the leader, and (etcd and Consul, [`Cluster::start_linked`]) to cut one
//! member from another while both serve their clients.
//!
//! Binaries: `/usr/bin/etcd` (or `QUORUMLOCK_ETCD_BIN`); ZooKeeper through
//! `java` and `/usr/share/java/zookeeper.jar`; Consul from
//! `QUORUMLOCK_CONSUL_BIN` (`scripts/stores.sh env` prints it). Every
//! process is a child of the test and is killed when the [`Cluster`] is
//! dropped; data lives in a temporary directory removed then.

use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use super::links::{PeerLinks, Pids};

fn parse_ip(ip: &str) -> std::net::IpAddr {
    ip.parse().expect("a literal address")
}

/// Which store a cluster runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// etcd (client port 32379, peer port 32380).
    Etcd,
    /// ZooKeeper (client 32181, quorum 32888, election 32889, tickTime 200).
    Zk,
    /// Consul servers (HTTP 38500, server 38300, serf 38301/38302).
    Consul,
}

const IPS: [&str; 3] = ["127.0.0.2", "127.0.0.3", "127.0.0.4"];

/// Where the members of a linked cluster listen for their peers (and,
/// Consul, dial from): their advertised peer address is a router of
/// [`PeerLinks`].
const INNER_IPS: [&str; 3] = ["127.0.0.12", "127.0.0.13", "127.0.0.14"];

/// One node of a [`Cluster`].
#[derive(Debug)]
struct Node {
    ip: &'static str,
    child: Option<Child>,
    stopped: bool,
}

/// A three-node cluster on 127.0.0.2-4.
#[derive(Debug)]
pub struct Cluster {
    kind: StoreKind,
    dir: PathBuf,
    nodes: Vec<Node>,
    /// The members' process ids, for [`PeerLinks`] to tell who dialed.
    pids: Pids,
    /// Per-link faults between members, if started linked.
    links: Option<PeerLinks>,
}

fn tmpdir(kind: StoreKind) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "quorumlock-cluster-{kind:?}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    std::fs::create_dir_all(&d).expect("cluster dir");
    d
}

/// Serializes clusters within one test process: they share ports.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Where processes take turns: every cluster uses the same addresses and
/// ports, so test processes of different crates must not run clusters at
/// once.
const LOCK_DIR: &str = "/tmp/quorumlock-cluster.lock";

/// The right to run a cluster: this process's turn (an in-process mutex)
/// and the machine's (a lock directory holding the owner's pid; a dead
/// owner's lock is taken over). Hold it as long as the [`Cluster`].
#[derive(Debug)]
pub struct ClusterTurn {
    _local: tokio::sync::MutexGuard<'static, ()>,
}

impl ClusterTurn {
    async fn take() -> std::io::Result<ClusterTurn> {
        let local = ONE_AT_A_TIME.lock().await;
        let me = std::process::id().to_string();
        let pid_file = Path::new(LOCK_DIR).join("pid");
        let start = Instant::now();
        loop {
            match std::fs::create_dir(LOCK_DIR) {
                Ok(()) => {
                    std::fs::write(&pid_file, &me)?;
                    return Ok(ClusterTurn { _local: local });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let owner = std::fs::read_to_string(&pid_file).unwrap_or_default();
                    let owner = owner.trim().to_string();
                    let gone = !owner.is_empty() && !Path::new("/proc").join(&owner).exists();
                    // Ours from an earlier panic, a dead owner's, or one
                    // that never got its pid written.
                    if owner == me
                        || gone
                        || (owner.is_empty() && start.elapsed() > Duration::from_secs(5))
                    {
                        let _ = std::fs::remove_dir_all(LOCK_DIR);
                        continue;
                    }
                    if start.elapsed() > Duration::from_secs(900) {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("process {owner} held {LOCK_DIR} for 15 minutes"),
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for ClusterTurn {
    fn drop(&mut self) {
        let pid_file = Path::new(LOCK_DIR).join("pid");
        let owner = std::fs::read_to_string(pid_file).unwrap_or_default();
        if owner.trim() == std::process::id().to_string() {
            let _ = std::fs::remove_dir_all(LOCK_DIR);
        }
    }
}

impl Cluster {
    /// Starts a cluster of `kind` and waits until it has a leader and every
    /// member serves (at most 90 s each). Clusters run one at a time on
    /// the machine (they share addresses and ports): hold the returned
    /// turn as long as the cluster, and drop the cluster first.
    pub async fn start(kind: StoreKind) -> std::io::Result<(Cluster, ClusterTurn)> {
        Self::start_with(kind, false).await
    }

    /// As [`start`](Self::start), with every member's peer traffic going
    /// through one proxy per link (etcd and Consul), so that
    /// [`cut`](Self::cut) can part two members while their clients still
    /// reach both. ZooKeeper: `InvalidInput` (its ensemble test proxies
    /// its quorum links itself).
    pub async fn start_linked(kind: StoreKind) -> std::io::Result<(Cluster, ClusterTurn)> {
        if kind == StoreKind::Zk {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "per-link faults are for etcd and Consul clusters",
            ));
        }
        Self::start_with(kind, true).await
    }

    async fn start_with(kind: StoreKind, linked: bool) -> std::io::Result<(Cluster, ClusterTurn)> {
        let guard = ClusterTurn::take().await?;
        let pids = Pids::default();
        let links = if linked {
            let port = Self::peer_port(kind);
            let at = |ips: [&str; 3]| ips.map(|ip| SocketAddr::from((parse_ip(ip), port)));
            Some(PeerLinks::start(at(IPS), at(INNER_IPS), pids.clone()).await?)
        } else {
            None
        };
        let mut c = Cluster {
            pids,
            links,
            kind,
            dir: tmpdir(kind),
            nodes: IPS
                .iter()
                .map(|ip| Node {
                    ip,
                    child: None,
                    stopped: false,
                })
                .collect(),
        };
        if kind == StoreKind::Zk {
            c.write_zk_config()?;
        }
        for i in 0..3 {
            c.spawn(i)?;
        }
        c.wait_leader(Duration::from_secs(90)).await?;
        c.wait_serving(Duration::from_secs(90)).await?;
        Ok((c, guard))
    }

    /// The store kind.
    pub fn kind(&self) -> StoreKind {
        self.kind
    }

    /// A URL naming every node, in each backend's syntax.
    pub fn url(&self) -> String {
        match self.kind {
            StoreKind::Etcd => format!(
                "etcd://{}:32379?endpoints={}:32379,{}:32379",
                IPS[0], IPS[1], IPS[2]
            ),
            // Every node listens on the same port, so the list parses as
            // one URL host.
            StoreKind::Zk => format!("zk://{},{},{}:32181", IPS[0], IPS[1], IPS[2]),
            // A Consul client talks to one agent; node 0 is it.
            StoreKind::Consul => format!("consul://{}:38500", IPS[0]),
        }
    }

    /// The port members reach each other on (raft).
    fn peer_port(kind: StoreKind) -> u16 {
        match kind {
            StoreKind::Etcd => 32380,
            StoreKind::Zk => 32888,
            StoreKind::Consul => 38300,
        }
    }

    /// Blackholes both directions of the link between members `a` and
    /// `b` (both keep serving their clients). Panics unless the cluster
    /// was started with [`start_linked`](Self::start_linked).
    pub fn cut(&self, a: usize, b: usize) {
        self.peer_links().cut(a, b);
    }

    /// Lets the link between `a` and `b` pass again.
    pub fn heal(&self, a: usize, b: usize) {
        self.peer_links().heal(a, b);
    }

    /// Whether the cluster was started with per-link proxies.
    pub fn is_linked(&self) -> bool {
        self.links.is_some()
    }

    /// [`start_linked`](Self::start_linked) where the store has per-link
    /// faults (etcd, Consul), [`start`](Self::start) otherwise.
    pub async fn start_linked_if_supported(
        kind: StoreKind,
    ) -> std::io::Result<(Cluster, ClusterTurn)> {
        Self::start_with(kind, kind != StoreKind::Zk).await
    }

    fn peer_links(&self) -> &PeerLinks {
        self.links
            .as_ref()
            .expect("per-link faults need a cluster started with Cluster::start_linked")
    }

    /// A URL naming member `i` only (a client of that member alone).
    pub fn member_url(&self, i: usize) -> String {
        let scheme = match self.kind {
            StoreKind::Etcd => "etcd",
            StoreKind::Zk => "zk",
            StoreKind::Consul => "consul",
        };
        format!("{scheme}://{}", self.client_addr(i))
    }

    /// The client address of node `i`.
    pub fn client_addr(&self, i: usize) -> SocketAddr {
        let port = match self.kind {
            StoreKind::Etcd => 32379,
            StoreKind::Zk => 32181,
            StoreKind::Consul => 38500,
        };
        format!("{}:{port}", IPS[i]).parse().expect("addr")
    }

    fn data(&self, i: usize) -> PathBuf {
        self.dir.join(format!("n{i}"))
    }

    fn write_zk_config(&self) -> std::io::Result<()> {
        for (i, my_ip) in IPS.iter().enumerate() {
            let d = self.data(i);
            std::fs::create_dir_all(&d)?;
            std::fs::write(d.join("myid"), format!("{}\n", i + 1))?;
            let mut cfg = format!(
                "tickTime=200\ninitLimit=50\nsyncLimit=10\ndataDir={}\nclientPort=32181\nclientPortAddress={}\n\
                 admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,mntr\nmaxSessionTimeout=20000\n",
                d.display(),
                my_ip
            );
            for (j, ip) in IPS.iter().enumerate() {
                cfg.push_str(&format!("server.{}={ip}:32888:32889\n", j + 1));
            }
            std::fs::write(d.join("zoo.cfg"), cfg)?;
        }
        Ok(())
    }

    fn command(&self, i: usize) -> Command {
        let ip = IPS[i];
        let d = self.data(i);
        match self.kind {
            StoreKind::Etcd => {
                let bin =
                    std::env::var("QUORUMLOCK_ETCD_BIN").unwrap_or_else(|_| "/usr/bin/etcd".into());
                let mut c = Command::new(bin);
                let cluster: Vec<String> = IPS
                    .iter()
                    .enumerate()
                    .map(|(j, ip)| format!("n{j}=http://{ip}:32380"))
                    .collect();
                c.args([
                    format!("--name=n{i}"),
                    format!("--data-dir={}", d.display()),
                    format!("--listen-client-urls=http://{ip}:32379"),
                    format!("--advertise-client-urls=http://{ip}:32379"),
                    format!("--listen-peer-urls=http://{}:32380", self.peer_listen_ip(i)),
                    format!("--initial-advertise-peer-urls=http://{ip}:32380"),
                    format!("--initial-cluster={}", cluster.join(",")),
                    "--initial-cluster-state=new".into(),
                    "--initial-cluster-token=quorumlock-faults".into(),
                    "--heartbeat-interval=100".into(),
                    "--election-timeout=1000".into(),
                ]);
                c
            }
            StoreKind::Zk => {
                let mut c = Command::new("java");
                c.args([
                    "-Xmx256m".to_string(),
                    "-Dzookeeper.log.dir=".to_string() + &d.display().to_string(),
                    "-cp".into(),
                    "/usr/share/java/zookeeper.jar".into(),
                    "org.apache.zookeeper.server.quorum.QuorumPeerMain".into(),
                    d.join("zoo.cfg").display().to_string(),
                ]);
                c
            }
            StoreKind::Consul => {
                let bin =
                    std::env::var("QUORUMLOCK_CONSUL_BIN").unwrap_or_else(|_| "consul".into());
                let mut c = Command::new(bin);
                c.args([
                    "agent".to_string(),
                    "-server".into(),
                    "-bootstrap-expect=3".into(),
                    format!("-data-dir={}", d.display()),
                    format!("-node=qlf-n{i}"),
                    // Linked: the server port (raft and RPC) is bound
                    // and dialed from the inner address, gossip stays on
                    // the member's own.
                    format!("-bind={}", self.peer_listen_ip(i)),
                    format!("-serf-lan-bind={ip}"),
                    format!("-serf-wan-bind={ip}"),
                    format!("-advertise={ip}"),
                    format!("-client={ip}"),
                    "-http-port=38500".into(),
                    "-server-port=38300".into(),
                    "-serf-lan-port=38301".into(),
                    "-serf-wan-port=38302".into(),
                    "-dns-port=-1".into(),
                    "-grpc-port=-1".into(),
                    // Elections in about 3 s instead of about 16 s (the
                    // default multiplier is for slow production links).
                    "-hcl=performance { raft_multiplier = 1 }".into(),
                    // Every proxied client dials from 127.0.0.1, and each
                    // waiting acquire holds a long poll: the default cap
                    // of 200 connections per client address would refuse
                    // a round of schedules (connections closed at once).
                    "-hcl=limits { http_max_conns_per_client = 4096 }".into(),
                ]);
                for (j, other) in IPS.iter().enumerate() {
                    if j != i {
                        c.arg(format!("-retry-join={other}:38301"));
                    }
                }
                c
            }
        }
    }

    /// Where member `i` listens for its peers: its own address, or behind
    /// the router of its links.
    fn peer_listen_ip(&self, i: usize) -> &'static str {
        if self.links.is_some() {
            INNER_IPS[i]
        } else {
            IPS[i]
        }
    }

    fn spawn(&mut self, i: usize) -> std::io::Result<()> {
        std::fs::create_dir_all(self.data(i))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data(i).join("log"))?;
        let mut cmd = self.command(i);
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd.spawn()?;
        self.pids.lock().expect("poisoned")[i] = Some(child.id());
        self.nodes[i].child = Some(child);
        self.nodes[i].stopped = false;
        Ok(())
    }

    fn signal(&self, i: usize, sig: &str) {
        if let Some(c) = &self.nodes[i].child {
            let _ = Command::new("kill")
                .args([format!("-{sig}"), c.id().to_string()])
                .status();
        }
    }

    /// kill -9 node `i` (it stays down until [`restart`](Self::restart)).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.pids.lock().expect("poisoned")[i] = None;
    }

    /// SIGSTOP node `i`.
    pub fn stop(&mut self, i: usize) {
        self.signal(i, "STOP");
        self.nodes[i].stopped = true;
    }

    /// SIGCONT node `i`.
    pub fn cont(&mut self, i: usize) {
        self.signal(i, "CONT");
        self.nodes[i].stopped = false;
    }

    /// Starts node `i` again on its data (after [`kill`](Self::kill)).
    pub fn restart(&mut self, i: usize) -> std::io::Result<()> {
        self.kill(i);
        self.spawn(i)
    }

    /// Whether node `i` runs (not killed).
    pub fn is_up(&self, i: usize) -> bool {
        self.nodes[i].child.is_some()
    }

    /// The current leader's index, asked of every running node.
    pub async fn leader(&self) -> Option<usize> {
        let kind = self.kind;
        let up: Vec<(usize, &'static str)> = (0..3)
            .filter(|i| self.is_up(*i) && !self.nodes[*i].stopped)
            .map(|i| (i, self.nodes[i].ip))
            .collect();
        tokio::task::spawn_blocking(move || leader_blocking(kind, &up))
            .await
            .ok()
            .flatten()
    }

    /// Waits until a leader is known.
    pub async fn wait_leader(&self, within: Duration) -> std::io::Result<usize> {
        self.poll(within, "no leader", || self.leader()).await
    }

    /// Waits until every member runs and answers on its client port with
    /// a leader it knows: the faulty clients of a schedule dial the first
    /// member, which a round's fault may have just restarted.
    pub async fn wait_serving(&self, within: Duration) -> std::io::Result<()> {
        self.poll(within, "not every member serving", || async {
            let kind = self.kind;
            let ips: Vec<&'static str> = self.nodes.iter().map(|n| n.ip).collect();
            let up = (0..3).all(|i| self.is_up(i) && !self.nodes[i].stopped);
            let serving = up
                && tokio::task::spawn_blocking(move || {
                    ips.iter()
                        .all(|ip| status_blocking(kind, ip).is_some_and(|s| s.knows_leader))
                })
                .await
                .unwrap_or(false);
            serving.then_some(())
        })
        .await
    }

    /// Asks `check` every 200 ms until it answers, for at most `within`.
    async fn poll<T, F, Fut>(&self, within: Duration, failing: &str, check: F) -> std::io::Result<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let start = Instant::now();
        loop {
            if let Some(v) = check().await {
                return Ok(v);
            }
            if start.elapsed() > within {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "{:?} cluster: {failing} within {within:?}; logs in {}",
                        self.kind,
                        self.dir.display()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Where the nodes keep their data and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..3 {
            if self.nodes[i].stopped {
                self.cont(i);
            }
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A plain request on a fresh connection; the whole answer.
fn ask(addr: &str, req: &[u8]) -> Option<String> {
    let addr: SocketAddr = addr.parse().ok()?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(req).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// Whether the member at `addr` answers a read from its own copy, as a
/// member cut from its leader still does (etcd: a serializable range;
/// Consul: `?stale`; a missing key is an answer too).
pub(crate) fn answers_from_its_copy(kind: StoreKind, addr: SocketAddr) -> bool {
    let req: &[u8] = match kind {
        StoreKind::Etcd => b"POST /v3/kv/range HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: 34\r\n\r\n{\"key\":\"AA==\",\"serializable\":true}",
        StoreKind::Consul => b"GET /v1/kv/quorumlock-probe?stale HTTP/1.0\r\n\r\n",
        StoreKind::Zk => return ask(&addr.to_string(), b"ruok").is_some_and(|a| a == "imok"),
    };
    ask(&addr.to_string(), req).is_some_and(|a| {
        let status = a.split_whitespace().nth(1).unwrap_or_default();
        status == "200" || (kind == StoreKind::Consul && status == "404")
    })
}

/// What one member says of itself and its leader.
struct MemberStatus {
    /// This member leads.
    leads: bool,
    /// It knows a leader (itself or another).
    knows_leader: bool,
    /// The leader's address as it names it (Consul only).
    leader_ip: Option<String>,
}

/// The status of the member at `ip`, if it answers on its client port.
fn status_blocking(kind: StoreKind, ip: &str) -> Option<MemberStatus> {
    match kind {
        StoreKind::Zk => {
            let out = ask(&format!("{ip}:32181"), b"srvr")?;
            let leads = out.contains("Mode: leader");
            Some(MemberStatus {
                leads,
                knows_leader: leads || out.contains("Mode: follower"),
                leader_ip: None,
            })
        }
        StoreKind::Consul => {
            let out = ask(
                &format!("{ip}:38500"),
                b"GET /v1/status/leader HTTP/1.0\r\n\r\n",
            )?;
            let body = out.split("\r\n\r\n").nth(1)?.trim().trim_matches('"');
            let leader_ip = body.split(':').next().filter(|l| !l.is_empty());
            Some(MemberStatus {
                leads: leader_ip == Some(ip),
                knows_leader: leader_ip.is_some(),
                leader_ip: leader_ip.map(str::to_string),
            })
        }
        StoreKind::Etcd => {
            // Each member's /v3 maintenance status names the leader's id
            // and its own; the one where they match leads.
            let out = ask(
                &format!("{ip}:32379"),
                b"POST /v3/maintenance/status HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
            )?;
            let v: serde_json::Value = serde_json::from_str(out.split("\r\n\r\n").nth(1)?).ok()?;
            let leader = v.get("leader")?.as_str()?;
            let me = v.get("header")?.get("member_id")?.as_str()?;
            Some(MemberStatus {
                leads: leader == me,
                knows_leader: leader != "0",
                leader_ip: None,
            })
        }
    }
}

fn leader_blocking(kind: StoreKind, up: &[(usize, &'static str)]) -> Option<usize> {
    up.iter().find_map(|(i, ip)| {
        let status = status_blocking(kind, ip)?;
        match kind {
            // A follower may still name a leader that was just killed:
            // only a running member counts.
            StoreKind::Consul => {
                let leader_ip = status.leader_ip?;
                up.iter().find(|(_, ip)| *ip == leader_ip).map(|(i, _)| *i)
            }
            _ => status.leads.then_some(*i),
        }
    })
}
