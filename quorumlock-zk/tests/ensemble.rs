//! A three-server ZooKeeper ensemble whose quorum links (follower ->
//! leader peer ports) each go through a TCP proxy, so that one follower
//! can be cut from the leader while its clients stay connected to it.
//!
//! That follower keeps answering reads from its own (stale) copy until
//! `syncLimit x tickTime` runs out, while the leader expires the sessions
//! of its clients after their timeout and grants their locks to others.
//! A holder must report the loss before that grant.
//!
//! Needs `java` and `/usr/share/java/zookeeper.jar`; runs when
//! `QUORUMLOCK_TEST_ZK_URL` is set (the real store is installed), else
//! skips loudly (fails with `QUORUMLOCK_TEST_REQUIRE=1`).
//! `QUORUMLOCK_ENSEMBLE_RUNS` (default 3) sets how many cut/heal rounds
//! the safety test makes on one ensemble.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::faults::{NetControl, NetMode, TcpProxy};
use quorumlock_conformance::support::free_port;
use quorumlock_core::{LockClient, LossReason};
use tokio::time::Instant;

const TICK_MS: u64 = 200;
/// Large, so that a cut-off follower serves its stale copy for 5 s.
const SYNC_LIMIT: u64 = 25;
const JAR: &str = "/usr/share/java/zookeeper.jar";
/// ZooKeeper logs through SLF4J; without a binding on the class path it
/// logs nothing, and a member that fails leaves no trace in its `log`.
const SLF4J_BINDING: &str = "/usr/share/java/slf4j-simple.jar";

/// Ensembles of this file run one at a time (CPU, not ports: every
/// ensemble takes free ports of its own).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Server {
    client: u16,
    quorum: u16,
    election: u16,
    child: Option<Child>,
}

/// Three ZooKeeper servers on 127.0.0.1; server `i` reaches server `j`'s
/// quorum port through `links[i][j]`.
struct Ensemble {
    dir: PathBuf,
    servers: Vec<Server>,
    links: Vec<Vec<Option<TcpProxy>>>,
}

impl Ensemble {
    async fn start() -> Ensemble {
        let dir = std::env::temp_dir().join(format!(
            "quorumlock-ensemble-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        let servers: Vec<Server> = (0..3)
            .map(|_| Server {
                client: free_port(),
                quorum: free_port(),
                election: free_port(),
                child: None,
            })
            .collect();
        let mut links: Vec<Vec<Option<TcpProxy>>> = Vec::new();
        for i in 0..3 {
            let mut row = Vec::new();
            for (j, s) in servers.iter().enumerate() {
                row.push(if i == j {
                    None
                } else {
                    let target: SocketAddr = format!("127.0.0.1:{}", s.quorum).parse().unwrap();
                    Some(TcpProxy::start(target).await.expect("proxy"))
                });
            }
            links.push(row);
        }
        let elections: Vec<u16> = servers.iter().map(|s| s.election).collect();
        for (i, s) in servers.iter().enumerate() {
            let d = dir.join(format!("n{i}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("myid"), format!("{}\n", i + 1)).unwrap();
            let mut cfg = format!(
                "tickTime={TICK_MS}\ninitLimit=50\nsyncLimit={SYNC_LIMIT}\ndataDir={}\nclientPort={}\n\
                 clientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
                 4lw.commands.whitelist=ruok,srvr,mntr,cons\nmaxSessionTimeout=20000\n",
                d.display(),
                s.client
            );
            for (j, link) in links[i].iter().enumerate() {
                // Our own line: the ports we listen on. Another server's:
                // its quorum port through our proxy, its election port
                // direct (elections are not what this test cuts).
                let quorum = link.as_ref().map_or(s.quorum, |p| p.addr().port());
                cfg.push_str(&format!(
                    "server.{}=127.0.0.1:{quorum}:{}\n",
                    j + 1,
                    elections[j]
                ));
            }
            std::fs::write(d.join("zoo.cfg"), cfg).unwrap();
        }
        let mut e = Ensemble {
            dir,
            servers,
            links,
        };
        for i in 0..3 {
            e.spawn(i);
        }
        e.wait_serving(&[0, 1, 2], Duration::from_secs(60)).await;
        e
    }

    fn spawn(&mut self, i: usize) {
        let d = self.dir.join(format!("n{i}"));
        let log = std::fs::File::create(d.join("log")).unwrap();
        let mut class_path = JAR.to_string();
        if std::path::Path::new(SLF4J_BINDING).exists() {
            class_path = format!("{class_path}:{SLF4J_BINDING}");
        }
        let child = Command::new("java")
            .args([
                "-Xmx256m".to_string(),
                format!("-Dzookeeper.log.dir={}", d.display()),
                // A member whose first election messages found no peer
                // listening yet backs off doubling up to this (default
                // 60 s) before it asks again: bounded here so that the
                // last one up joins within seconds.
                "-Dzookeeper.fastleader.maxNotificationInterval=1000".into(),
                "-cp".into(),
                class_path,
                "org.apache.zookeeper.server.quorum.QuorumPeerMain".into(),
                d.join("zoo.cfg").display().to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("java");
        self.servers[i].child = Some(child);
    }

    /// The answer of server `i` to a four-letter word.
    fn ask(&self, i: usize, word: &[u8]) -> Option<String> {
        use std::io::{Read, Write};
        let addr: SocketAddr = format!("127.0.0.1:{}", self.servers[i].client)
            .parse()
            .unwrap();
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.write_all(word).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    }

    /// `srvr` of server `i`: its mode if it serves clients.
    fn mode(&self, i: usize) -> Option<String> {
        self.ask(i, b"srvr")?
            .lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(str::to_string)
    }

    async fn modes(&self) -> Vec<Option<String>> {
        let ports: Vec<u16> = self.servers.iter().map(|s| s.client).collect();
        let probe = Ensemble {
            dir: PathBuf::new(),
            servers: ports
                .into_iter()
                .map(|client| Server {
                    client,
                    quorum: 0,
                    election: 0,
                    child: None,
                })
                .collect(),
            links: Vec::new(),
        };
        tokio::task::spawn_blocking(move || (0..3).map(|i| probe.mode(i)).collect())
            .await
            .unwrap()
    }

    /// Waits until servers `which` serve clients as leader or follower.
    async fn wait_serving(&mut self, which: &[usize], within: Duration) {
        let start = Instant::now();
        loop {
            let modes = self.modes().await;
            if which
                .iter()
                .all(|&i| matches!(modes[i].as_deref(), Some("leader") | Some("follower")))
                && modes.iter().any(|m| m.as_deref() == Some("leader"))
            {
                return;
            }
            // A member that exited (a port it could not bind: exit code
            // 14) never serves: no need to wait the whole bound for it.
            let exits: Vec<Option<std::process::ExitStatus>> = self
                .servers
                .iter_mut()
                .map(|s| s.child.as_mut().and_then(|c| c.try_wait().ok().flatten()))
                .collect();
            if start.elapsed() >= within || exits.iter().any(Option::is_some) {
                panic!(
                    "ensemble not serving within {within:?}: {modes:?}, exited: {exits:?}; \
                     logs in {}",
                    self.dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn leader(&self) -> usize {
        self.modes()
            .await
            .iter()
            .position(|m| m.as_deref() == Some("leader"))
            .expect("a leader")
    }

    fn url(&self, i: usize, namespace: &str, ttl: &str) -> String {
        format!(
            "zk://127.0.0.1:{}/{namespace}?ttl={ttl}",
            self.servers[i].client
        )
    }

    /// The quorum link from follower `f` to leader `l`.
    fn link(&self, f: usize, l: usize) -> &TcpProxy {
        self.links[f][l]
            .as_ref()
            .expect("a link between two servers")
    }
}

impl Drop for Ensemble {
    fn drop(&mut self) {
        for s in &mut self.servers {
            if let Some(mut c) = s.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if !self.dir.as_os_str().is_empty() && !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Whether the ensemble tests can run here; a loud skip (or a panic with
/// `QUORUMLOCK_TEST_REQUIRE=1`) if not.
fn available() -> bool {
    let require = std::env::var("QUORUMLOCK_TEST_REQUIRE").is_ok_and(|v| v == "1");
    let why = if std::env::var("QUORUMLOCK_TEST_ZK_URL").is_err() {
        Some("QUORUMLOCK_TEST_ZK_URL is not set")
    } else if !std::path::Path::new(JAR).exists() {
        Some("no /usr/share/java/zookeeper.jar")
    } else {
        None
    };
    match why {
        None => true,
        Some(why) if require => panic!("ensemble test cannot run: {why}"),
        Some(why) => {
            eprintln!("SKIPPED: ZooKeeper ensemble test: {why}");
            false
        }
    }
}

async fn client(url: &str) -> LockClient {
    let b = quorumlock_zk::ZkBackend::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    LockClient::new(Arc::new(b))
}

/// The holder A is connected to a follower only, the waiter B to the
/// leader. The follower's quorum link is blackholed (no FIN, as in a
/// partition): the follower keeps serving A for `syncLimit x tickTime`
/// (5 s), the leader expires A's session after its 2 s and grants B.
/// A's `lost()` must fire before B's grant, in every round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_cut_from_leader_holder_loses_before_waiter_is_granted() {
    if !available() {
        return;
    }
    let runs: usize = std::env::var("QUORUMLOCK_ENSEMBLE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut ens = Ensemble::start().await;
    for run in 0..runs {
        let l = ens.leader().await;
        let f = (l + 1) % 3;
        let ns = format!("ens{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let a = client(&ens.url(f, &ns, "2s")).await;
        let b = client(&ens.url(l, &ns, "4s")).await;
        let held = a.lock("x").unwrap().acquire().await.expect("A acquires");
        let b2 = b.clone();
        let waiter = tokio::spawn(async move {
            let g = b2.lock("x").unwrap().acquire().await;
            (Instant::now(), g)
        });
        while b.inspect("x").await.unwrap().waiters.len() != 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Let a keepalive or two pass, so that the cut falls at any phase.
        tokio::time::sleep(Duration::from_millis(300 + 170 * run as u64)).await;
        let lost = held.lost();
        let lost = tokio::spawn(async move {
            let why = lost.await;
            (Instant::now(), why)
        });
        let t0 = Instant::now();
        ens.link(f, l).set_mode(NetMode::Blackhole);
        let (granted_at, g) = tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .expect("B is granted once the leader expired A's session")
            .unwrap();
        let g = g.expect("B's acquire");
        let held_at_grant = held.is_held();
        let (lost_at, why) = tokio::time::timeout(Duration::from_secs(20), lost)
            .await
            .expect("A reports the loss")
            .unwrap();
        let ms = |t: Instant| t.saturating_duration_since(t0).as_millis();
        eprintln!(
            "run {run}: leader {l}, A on {f}: A lost at t0+{} ms ({why:?}), B granted at t0+{} ms",
            ms(lost_at),
            ms(granted_at)
        );
        assert!(
            lost_at < granted_at && !held_at_grant,
            "run {run}: two holders: B granted at t0+{} ms while A held until t0+{} ms",
            ms(granted_at),
            ms(lost_at)
        );
        assert!(matches!(
            why,
            LossReason::DeadlinePassed | LossReason::SessionExpired
        ));
        assert!(g.token() > held.token());
        g.release().await.expect("B releases");
        drop(held);
        // Heal: abort the stale quorum connection so the follower rejoins
        // at once instead of after its read timeout.
        ens.link(f, l).reset();
        b.close().await;
        a.close().await;
        ens.wait_serving(&[0, 1, 2], Duration::from_secs(30)).await;
    }
}

/// The keepalive's cost: median round trip of a read (`exists /`, the
/// keepalive before) and of a `sync /` (the keepalive now), on the
/// standalone dev server and on a follower of the ensemble. Ignored (a
/// measurement): `cargo test -p quorumlock-zk --release --test ensemble --
/// --ignored --nocapture keepalive_cost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn keepalive_cost() {
    use zookeeper_client as zk;
    async fn medians(connect: &str) -> (Duration, Duration) {
        let c = zk::Client::connect(connect).await.unwrap();
        let (mut read, mut sync) = (Vec::new(), Vec::new());
        for _ in 0..1000 {
            let t = Instant::now();
            c.check_stat("/").await.unwrap();
            read.push(t.elapsed());
            let t = Instant::now();
            c.sync("/").await.unwrap();
            sync.push(t.elapsed());
        }
        read.sort();
        sync.sort();
        (read[read.len() / 2], sync[sync.len() / 2])
    }
    if !available() {
        return;
    }
    let single = std::env::var("QUORUMLOCK_TEST_ZK_URL").unwrap();
    let single = single.trim_start_matches("zk://").trim_end_matches('/');
    let (r, s) = medians(single).await;
    eprintln!("standalone: read {r:?}, sync {s:?}");
    let _turn = ONE_AT_A_TIME.lock().await;
    let ens = Ensemble::start().await;
    let l = ens.leader().await;
    for i in 0..3 {
        let (r, s) = medians(&format!("127.0.0.1:{}", ens.servers[i].client)).await;
        let role = if i == l { "leader" } else { "follower" };
        eprintln!("ensemble {role}: read {r:?}, sync {s:?}");
    }
}

/// A create whose reply is lost, retried on a follower that has not yet
/// applied it (finding 5). The lock session is on the leader through a
/// client proxy, and both followers' quorum links are delayed by 150 ms
/// each way, so a create commits about 0.3 s after the leader got it and
/// reaches a follower 0.15 s later still. The proxy is cut 30 ms after the acquire
/// sent its create: the client reconnects to a follower, whose session
/// revalidation (through the leader) is answered before the create's
/// commit reaches it. A listing there misses our node; a second create
/// then queued us behind our own first node forever. The acquire must
/// complete with one node of ours, and leave nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_reply_lost_then_retried_on_a_lagging_follower() {
    if !available() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    let ens = Ensemble::start().await;
    let l = ens.leader().await;
    let (x, g) = ((l + 1) % 3, (l + 2) % 3);
    let ns = format!("ens{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let leader_addr: SocketAddr = format!("127.0.0.1:{}", ens.servers[l].client)
        .parse()
        .unwrap();
    // A client whose lock session went through the proxy to the leader
    // (the library picks a server of the list at random).
    let mut found = None;
    for _ in 0..20 {
        let proxy = TcpProxy::start(leader_addr).await.unwrap();
        let url = format!(
            "zk://127.0.0.1:{},127.0.0.1:{}/{ns}?ttl=4s",
            proxy.addr().port(),
            ens.servers[g].client
        );
        let c = client(&url).await;
        c.lock("x")
            .unwrap()
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let sid = c.session_id().await.expect("a lock session");
        let cons = tokio::task::spawn_blocking({
            let probe = ens.servers[l].client;
            move || {
                let e = Ensemble {
                    dir: PathBuf::new(),
                    servers: vec![Server {
                        client: probe,
                        quorum: 0,
                        election: 0,
                        child: None,
                    }],
                    links: Vec::new(),
                };
                e.ask(0, b"cons").unwrap_or_default()
            }
        })
        .await
        .unwrap();
        if cons.contains(&format!("sid={sid}")) {
            found = Some((proxy, c));
            break;
        }
        c.close().await;
    }
    let (proxy, c) = found.expect("a lock session on the leader through the proxy");
    for f in [x, g] {
        ens.link(f, l)
            .set_mode(NetMode::Delay(Duration::from_millis(150)));
    }
    let c2 = c.clone();
    let acquire = tokio::spawn(async move { c2.lock("x").unwrap().acquire().await });
    tokio::time::sleep(Duration::from_millis(30)).await;
    proxy.set_mode(NetMode::Cut);
    let mut acquire = acquire;
    let done = tokio::time::timeout(Duration::from_secs(15), &mut acquire).await;
    if done.is_err() {
        let other = client(&ens.url(l, &ns, "4s")).await;
        let st = other.inspect("x").await;
        panic!("the acquire never completed (waiting behind our own node?); the lock: {st:?}");
    }
    let g1 = done
        .unwrap()
        .unwrap()
        .expect("acquire after the lost create");
    let st = c.inspect("x").await.unwrap();
    assert_eq!(st.holders.len(), 1, "{st:?}");
    assert!(st.waiters.is_empty(), "a second node of ours: {st:?}");
    assert_eq!(st.holders[0].entry, g1.entry());
    g1.release().await.unwrap();
    for f in [x, g] {
        ens.link(f, l).set_mode(NetMode::Pass);
    }
    let st = c.inspect("x").await.unwrap();
    assert!(st.holders.is_empty() && st.waiters.is_empty(), "{st:?}");
    c.close().await;
}
