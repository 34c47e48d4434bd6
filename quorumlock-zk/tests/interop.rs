//! Curator's own `InterProcessMutex` (Debian's libcurator-recipes-java,
//! compiled here with `javac`) against our client on the same path:
//! mutual exclusion over several rounds, FIFO across the two kinds of
//! client, and cooperative revoke both ways (Curator's `Revoker` reaches
//! our holder; our `request_revoke` reaches a revocable Curator holder).
//! Curator's `InterProcessReadWriteLock` against our read-write lock: a
//! Curator writer and our reader exclude each other in both directions,
//! and a Curator reader shares with ours. Curator's
//! `InterProcessSemaphoreV2` and our semaphore count the same leases.
//! Curator's `LeaderLatch` (LatchPeer.java) and our elections on one path
//! are one election.
//!
//! Needs `QUORUMLOCK_TEST_ZK_URL`, `javac`/`java`, and the Curator jars
//! (`QUORUMLOCK_CURATOR_CP`, else the Debian jars under /usr/share/java).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::{Case, Harness};
use quorumlock_core::LockClient;
use quorumlock_zk::{ZkBackend, ZkConfig};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const SOON: Duration = Duration::from_secs(15);
const JARS: &[&str] = &[
    "curator-recipes",
    "curator-framework",
    "curator-client",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
    "slf4j-nop",
];

fn harness() -> Option<Harness> {
    Harness::from_env("QUORUMLOCK_TEST_ZK_URL", |url| async move {
        Ok(Arc::new(ZkBackend::connect(&url).await?) as _)
    })
}

fn require() -> bool {
    std::env::var("QUORUMLOCK_TEST_REQUIRE").is_ok_and(|v| v == "1")
}

fn skip(why: &str) -> Option<String> {
    if require() {
        panic!("{why} and QUORUMLOCK_TEST_REQUIRE=1");
    }
    eprintln!("SKIPPED: {why}");
    None
}

/// The Curator class path: `QUORUMLOCK_CURATOR_CP`, else Debian's jars.
fn curator_classpath() -> Option<String> {
    if let Ok(cp) = std::env::var("QUORUMLOCK_CURATOR_CP") {
        if !cp.is_empty() {
            return Some(cp);
        }
    }
    let mut parts = Vec::new();
    for jar in JARS {
        let p = PathBuf::from(format!("/usr/share/java/{jar}.jar"));
        if !p.exists() {
            return skip(&format!(
                "{} is missing (apt-get install libcurator-recipes-java zookeeper libslf4j-java, or set QUORUMLOCK_CURATOR_CP)",
                p.display()
            ));
        }
        parts.push(p.display().to_string());
    }
    Some(parts.join(":"))
}

/// Compiles tests/java/`class`.java into a temporary directory.
async fn compile_peer(cp: &str, class: &str) -> Option<(tempdir::Dir, String)> {
    let dir = tempdir::Dir::new();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/java/{class}.java"));
    let out = match Command::new("javac")
        .arg("-d")
        .arg(dir.path())
        .arg("-cp")
        .arg(cp)
        .arg(&src)
        .output()
        .await
    {
        Ok(o) => o,
        Err(e) => return skip(&format!("javac not runnable ({e})")).map(|_| unreachable!()),
    };
    assert!(
        out.status.success(),
        "javac failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run_cp = format!("{}:{cp}", dir.path().display());
    Some((dir, run_cp))
}

/// A tiny self-deleting temporary directory (no extra dependency).
mod tempdir {
    use std::path::{Path, PathBuf};

    pub struct Dir(PathBuf);

    impl Dir {
        pub fn new() -> Dir {
            let p = std::env::temp_dir().join(format!("qlzk-{}", uuid::Uuid::new_v4().simple()));
            std::fs::create_dir_all(&p).expect("temp dir");
            Dir(p)
        }
        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A running Java peer (CuratorPeer, LatchPeer): commands on its stdin,
/// one line per event on its stdout.
struct Peer {
    class: &'static str,
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    /// Lines read while looking for another one.
    seen: Vec<String>,
}

impl Peer {
    async fn start(cp: &str, class: &'static str, connect: &str) -> Peer {
        let mut child = Command::new("java")
            .arg("-Xmx128m")
            .arg("-cp")
            .arg(cp)
            .arg(class)
            .arg(connect)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting java");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut p = Peer {
            class,
            child,
            stdin,
            lines,
            seen: Vec::new(),
        };
        p.expect("ready").await;
        p
    }

    async fn send(&mut self, cmd: &str) {
        self.stdin
            .write_all(format!("{cmd}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// Waits for a line equal to `want` or starting with `want ` (also
    /// among lines seen before); fails on an `error` line.
    async fn expect(&mut self, want: &str) -> String {
        let matches = |l: &str| l == want || l.starts_with(&format!("{want} "));
        if let Some(i) = self.seen.iter().position(|l| matches(l)) {
            return self.seen.remove(i);
        }
        let class = self.class;
        let read = async {
            loop {
                let line = self
                    .lines
                    .next_line()
                    .await
                    .unwrap()
                    .unwrap_or_else(|| panic!("{class} exited"));
                assert!(!line.starts_with("error"), "{class}: {line}");
                if matches(&line) {
                    return line;
                }
                self.seen.push(line);
            }
        };
        tokio::time::timeout(SOON, read)
            .await
            .unwrap_or_else(|_| panic!("{class} did not say {want:?}"))
    }

    /// Whether such a line arrives within `wait`.
    async fn says_within(&mut self, want: &str, wait: Duration) -> bool {
        tokio::time::timeout(wait, self.expect(want)).await.is_ok()
    }

    /// The leader's participant id as the latch `id` reads it (LatchPeer).
    async fn leader_seen_by(&mut self, id: &str) -> String {
        self.send(&format!("leader {id}")).await;
        let line = self.expect(&format!("leaderis {id}")).await;
        line.splitn(3, ' ').nth(2).unwrap_or_default().to_string()
    }

    async fn quit(mut self) {
        self.send("quit").await;
        self.expect("bye").await;
        let _ = tokio::time::timeout(SOON, self.child.wait()).await;
    }
}

struct Setup {
    case: Case,
    peer: Peer,
    ns_path: String,
    _classes: tempdir::Dir,
}

async fn setup() -> Option<Setup> {
    let h = harness()?;
    let cp = curator_classpath()?;
    let (classes, run_cp) = compile_peer(&cp, "CuratorPeer").await?;
    let case = h.case();
    let cfg = ZkConfig::from_url(&h.url_for(case.namespace())).unwrap();
    let peer = Peer::start(&run_cp, "CuratorPeer", &cfg.connect_string()).await;
    Some(Setup {
        ns_path: format!("/{}", cfg.namespace),
        case,
        peer,
        _classes: classes,
    })
}

/// A plain ZooKeeper client on the test's server.
async fn raw_client(s: &Setup) -> zookeeper_client::Client {
    let cfg = ZkConfig::from_url(&s.case.harness().url_for(s.case.namespace())).unwrap();
    zookeeper_client::Client::connect(&cfg.connect_string())
        .await
        .unwrap()
}

async fn waiters(c: &LockClient, name: &str) -> usize {
    c.inspect(name).await.unwrap().waiters.len()
}

async fn wait_waiters(c: &LockClient, name: &str, n: usize) {
    let t = tokio::time::timeout(SOON, async {
        while waiters(c, name).await != n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    t.await
        .unwrap_or_else(|_| panic!("never saw {n} waiters on {name}"));
}

/// Several rounds each, both kinds of client on one path at once: never
/// two holders (every `start` line is followed by its own `end`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_ours_exclude_each_other() {
    let Some(mut s) = setup().await else { return };
    let dir = tempdir::Dir::new();
    let file = dir.path().join("history");
    std::fs::write(&file, "").unwrap();
    let rounds = 8;
    s.peer
        .send(&format!(
            "rounds {}/shared {rounds} {}",
            s.ns_path,
            file.display()
        ))
        .await;
    let mut tasks = Vec::new();
    for who in ["ours-a", "ours-b"] {
        let c = s.case.client().await;
        let file = file.clone();
        tasks.push(tokio::spawn(async move {
            let lock = c.lock("shared").unwrap();
            for i in 0..rounds {
                let g = lock.acquire().await.unwrap();
                append(&file, &format!("start {who} {i}"));
                tokio::time::sleep(Duration::from_millis(5)).await;
                append(&file, &format!("end {who} {i}"));
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("our rounds stuck")
            .unwrap();
    }
    s.peer.expect("rounds-done").await;
    let history = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = history.lines().collect();
    assert_eq!(lines.len(), 2 * 3 * rounds, "{history}");
    for pair in lines.chunks(2) {
        let (a, b) = (pair[0], pair[1]);
        assert!(
            a.starts_with("start ") && b == a.replacen("start", "end", 1),
            "two holders at once:\n{history}"
        );
    }
    let switches = lines
        .chunks(2)
        .zip(lines.chunks(2).skip(1))
        .filter(|(x, y)| x[0].contains("curator") != y[0].contains("curator"))
        .count();
    eprintln!(
        "history: {} holds, {switches} hand-overs between Curator and ours",
        lines.len() / 2
    );
    s.peer.quit().await;
    s.case.finish().await;
}

fn append(file: &Path, line: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(file).unwrap();
    f.write_all(format!("{line}\n").as_bytes()).unwrap();
}

/// Our holder, then a Curator waiter, then our waiter: the lock goes to
/// Curator first, then to ours, in queue order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_across_curator_and_ours() {
    let Some(mut s) = setup().await else { return };
    let (a, b) = (s.case.client().await, s.case.client().await);
    let g = a.lock("fifo").unwrap().acquire().await.unwrap();
    s.peer.send(&format!("lock c1 {}/fifo", s.ns_path)).await;
    s.peer.expect("ok").await;
    s.peer.send("acquire c1").await;
    wait_waiters(&a, "fifo", 1).await;
    let b2 = b.clone();
    let ours = tokio::spawn(async move { b2.lock("fifo").unwrap().acquire().await });
    wait_waiters(&a, "fifo", 2).await;
    let st = a.inspect("fifo").await.unwrap();
    assert_eq!(st.waiters[1].session, b.session_id().await.unwrap());
    let first_token = g.token();
    g.release().await.unwrap();
    let line = s.peer.expect("acquired c1").await;
    eprintln!("Curator: {line}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!ours.is_finished(), "our waiter overtook Curator's");
    let st = a.inspect("fifo").await.unwrap();
    assert!(line.ends_with(&st.holders[0].entry), "{line} vs {st:?}");
    s.peer.send("release c1").await;
    s.peer.expect("released c1").await;
    let g2 = tokio::time::timeout(SOON, ours)
        .await
        .expect("our waiter not granted after Curator released")
        .unwrap()
        .unwrap();
    assert!(g2.token() > first_token);
    g2.release().await.unwrap();
    s.peer.quit().await;
    s.case.finish().await;
}

/// Curator's `Revoker.attemptRevoke` on our holder's node fires our
/// guard's `revoke_requested()`; our `request_revoke` reaches a Curator
/// holder that called `makeRevocable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_both_ways() {
    let Some(mut s) = setup().await else { return };
    let a = s.case.client().await;
    // Curator -> ours.
    let g = a.lock("rv").unwrap().acquire().await.unwrap();
    assert!(!g.is_revoke_requested());
    s.peer.send(&format!("revoke {}", g.entry())).await;
    s.peer.expect("revoked").await;
    tokio::time::timeout(SOON, g.revoke_requested())
        .await
        .expect("Revoker.attemptRevoke did not reach our holder");
    assert!(g.is_held(), "a revoke request is not a loss");
    g.release().await.unwrap();
    // Ours -> Curator.
    s.peer.send(&format!("lock c2 {}/rv", s.ns_path)).await;
    s.peer.expect("ok").await;
    s.peer.send("acquire c2").await;
    s.peer.expect("acquired c2").await;
    assert!(a.request_revoke("rv").await.unwrap());
    assert!(
        s.peer.says_within("revoke-requested c2", SOON).await,
        "our request_revoke did not reach Curator's revocable holder"
    );
    s.peer.send("release c2").await;
    s.peer.expect("released c2").await;
    s.peer.quit().await;
    s.case.finish().await;
}

/// A Curator `InterProcessReadWriteLock` writer keeps our reader out (and
/// hands over to it in queue order); our reader keeps a Curator writer out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_curator_writer_and_our_reader_exclude_each_other() {
    let Some(mut s) = setup().await else { return };
    let (a, b) = (s.case.client().await, s.case.client().await);
    // Curator writer -> our reader.
    s.peer
        .send(&format!("rwlock w1 {}/rw write", s.ns_path))
        .await;
    s.peer.expect("ok").await;
    s.peer.send("acquire w1").await;
    s.peer.expect("acquired w1").await;
    let st = a.inspect("rw").await.unwrap();
    assert_eq!(st.holders.len(), 1, "{st:?}");
    assert_eq!(
        st.holders[0].kind,
        quorumlock_core::LockKind::Write,
        "{st:?}"
    );
    assert!(st.holders[0].entry.contains("-__WRIT__"), "{st:?}");
    let e = a.rwlock("rw").unwrap().try_read().await.unwrap_err();
    assert_eq!(e.kind(), quorumlock_core::ErrorKind::WouldBlock, "{e}");
    let b2 = b.clone();
    let reader = tokio::spawn(async move { b2.rwlock("rw").unwrap().read().await });
    wait_waiters(&a, "rw", 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !reader.is_finished(),
        "our reader got in beside Curator's writer"
    );
    s.peer.send("release w1").await;
    s.peer.expect("released w1").await;
    let r = tokio::time::timeout(SOON, reader)
        .await
        .expect("our reader not granted after Curator's writer released")
        .unwrap()
        .unwrap();
    assert!(r.entry().contains("-__READ__"), "{}", r.entry());
    // Our reader -> Curator writer.
    s.peer
        .send(&format!("rwlock w2 {}/rw write", s.ns_path))
        .await;
    s.peer.expect("ok").await;
    s.peer.send("acquire w2").await;
    wait_waiters(&a, "rw", 1).await;
    assert!(
        !s.peer
            .says_within("acquired w2", Duration::from_millis(300))
            .await,
        "Curator's writer got in beside our reader"
    );
    r.release().await.unwrap();
    s.peer.expect("acquired w2").await;
    let e = a.rwlock("rw").unwrap().try_read().await.unwrap_err();
    assert_eq!(e.kind(), quorumlock_core::ErrorKind::WouldBlock, "{e}");
    s.peer.send("release w2").await;
    s.peer.expect("released w2").await;
    s.peer.quit().await;
    s.case.finish().await;
}

/// A Curator reader and our reader hold at the same time; a writer of
/// ours waits for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_curator_reader_shares_with_ours() {
    let Some(mut s) = setup().await else { return };
    let a = s.case.client().await;
    s.peer
        .send(&format!("rwlock r1 {}/rw read", s.ns_path))
        .await;
    s.peer.expect("ok").await;
    s.peer.send("acquire r1").await;
    s.peer.expect("acquired r1").await;
    let r = tokio::time::timeout(SOON, a.rwlock("rw").unwrap().read())
        .await
        .expect("our reader waited for Curator's reader")
        .unwrap();
    let st = a.inspect("rw").await.unwrap();
    assert_eq!(st.holders.len(), 2, "{st:?}");
    assert!(st
        .holders
        .iter()
        .all(|h| h.kind == quorumlock_core::LockKind::Read));
    let e = a.rwlock("rw").unwrap().try_write().await.unwrap_err();
    assert_eq!(e.kind(), quorumlock_core::ErrorKind::WouldBlock, "{e}");
    // Curator's reader lets go; ours still keeps a writer out.
    s.peer.send("release r1").await;
    s.peer.expect("released r1").await;
    let e = a.rwlock("rw").unwrap().try_write().await.unwrap_err();
    assert_eq!(e.kind(), quorumlock_core::ErrorKind::WouldBlock, "{e}");
    r.release().await.unwrap();
    a.rwlock("rw")
        .unwrap()
        .try_write()
        .await
        .expect("free after both readers left")
        .release()
        .await
        .unwrap();
    s.peer.quit().await;
    s.case.finish().await;
}

/// Curator's `InterProcessSemaphoreV2` and our semaphore on one path with
/// the same count: leases of both kinds count against the limit, and both
/// queue on the same internal mutex.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_leases_count_across_curator_and_ours() {
    let Some(mut s) = setup().await else { return };
    let (a, b) = (s.case.client().await, s.case.client().await);
    s.peer
        .send(&format!("semaphore c1 {}/pool 2", s.ns_path))
        .await;
    s.peer.expect("ok").await;
    s.peer
        .send(&format!("semaphore c2 {}/pool 2", s.ns_path))
        .await;
    s.peer.expect("ok").await;
    s.peer.send("acquire c1").await;
    s.peer.expect("acquired c1").await;
    let g = tokio::time::timeout(SOON, a.semaphore("pool", 2).unwrap().acquire())
        .await
        .expect("our permit beside one Curator lease")
        .unwrap();
    let st = a.inspect("pool").await.unwrap();
    assert_eq!(st.holders.len(), 2, "{st:?}");
    let e = b
        .semaphore("pool", 2)
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), quorumlock_core::ErrorKind::WouldBlock, "{e}");
    // A Curator waiter takes the permit we free.
    s.peer.send("acquire c2").await;
    wait_waiters(&a, "pool", 1).await;
    assert!(
        !s.peer
            .says_within("acquired c2", Duration::from_millis(300))
            .await,
        "Curator took a third lease of 2"
    );
    g.release().await.unwrap();
    s.peer.expect("acquired c2").await;
    // Our waiter takes the permit Curator frees.
    let b2 = b.clone();
    let ours = tokio::spawn(async move { b2.semaphore("pool", 2).unwrap().acquire().await });
    wait_waiters(&a, "pool", 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!ours.is_finished(), "we took a third lease of 2");
    s.peer.send("release c1").await;
    s.peer.expect("released c1").await;
    let g = tokio::time::timeout(SOON, ours)
        .await
        .expect("our waiter not granted after Curator returned its lease")
        .unwrap()
        .unwrap();
    g.release().await.unwrap();
    s.peer.send("release c2").await;
    s.peer.expect("released c2").await;
    s.peer.quit().await;
    s.case.finish().await;
}

/// Our `request_revoke` on a semaphore held only by Curator leases (whose
/// data carries no permit count) must not write a guessed count into the
/// revoke marker: our semaphore of 3 then still takes the third permit
/// beside Curator's two (it used to read back the guess, 2, and fail with
/// `Conflict`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_of_curator_leases_writes_no_guessed_count() {
    let Some(mut s) = setup().await else { return };
    let a = s.case.client().await;
    for id in ["c1", "c2"] {
        s.peer
            .send(&format!("semaphore {id} {}/sem 3", s.ns_path))
            .await;
        s.peer.expect("ok").await;
        s.peer.send(&format!("acquire {id}")).await;
        s.peer.expect(&format!("acquired {id}")).await;
    }
    assert!(a.request_revoke("sem").await.unwrap(), "no holder marked");
    let raw = raw_client(&s).await;
    let leases_dir = format!("{}/sem/leases", s.ns_path);
    for lease in raw.list_children(&leases_dir).await.unwrap() {
        let (data, _) = raw
            .get_data(&format!("{leases_dir}/{lease}"))
            .await
            .unwrap();
        assert_eq!(
            data,
            b"__REVOKE__",
            "the marker on Curator's lease {lease}: {:?}",
            String::from_utf8_lossy(&data)
        );
    }
    drop(raw);
    let g = tokio::time::timeout(SOON, a.semaphore("sem", 3).unwrap().try_acquire())
        .await
        .expect("our third permit")
        .unwrap_or_else(|e| panic!("our semaphore of 3 beside two revoked Curator leases: {e}"));
    assert_eq!(a.inspect("sem").await.unwrap().holders.len(), 3);
    g.release().await.unwrap();
    for id in ["c1", "c2"] {
        s.peer.send(&format!("release {id}")).await;
        s.peer.expect(&format!("released {id}")).await;
    }
    s.peer.quit().await;
    s.case.finish().await;
}

/// A break marks the holder's node, then deletes it. A Curator holder
/// does not watch for the mark, so if the breaker died between the two the
/// marked node would stay: `inspect` shows nobody holding it (its holder
/// is being broken), and the next break still finds it and deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_finishes_the_mark_of_a_breaker_that_died() {
    let Some(mut s) = setup().await else { return };
    let a = s.case.client().await;
    s.peer.send(&format!("lock c1 {}/bk", s.ns_path)).await;
    s.peer.expect("ok").await;
    s.peer.send("acquire c1").await;
    s.peer.expect("acquired c1").await;
    let st = a.inspect("bk").await.unwrap();
    assert_eq!(st.holders.len(), 1, "{st:?}");
    let node = st.holders[0].entry.clone();
    let raw = raw_client(&s).await;
    // The mark of a break whose breaker then died.
    raw.set_data(&node, b"__BREAK__", None).await.unwrap();
    let st = a.inspect("bk").await.unwrap();
    assert!(
        st.holders.is_empty(),
        "a marked node shown as holding: {st:?}"
    );
    assert!(
        a.break_lock("bk").await.unwrap(),
        "the marked node was not broken"
    );
    assert_eq!(
        raw.check_stat(&node).await.unwrap(),
        None,
        "{node} is still there"
    );
    drop(raw);
    let g = tokio::time::timeout(SOON, a.lock("bk").unwrap().acquire())
        .await
        .expect("the lock after the break")
        .unwrap();
    g.release().await.unwrap();
    s.peer.send("release c1").await;
    s.peer.expect("released c1").await;
    s.peer.quit().await;
    s.case.finish().await;
}

/// Several permits of one client count one by one against Curator's
/// `InterProcessSemaphoreV2`: beside one Curator lease of 3, one client of
/// ours holds two permits at once; a second Curator lease then waits
/// until one of ours is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_permits_count_against_curator() {
    let Some(mut s) = setup().await else { return };
    let a = s.case.client().await;
    for c in ["m1", "m2"] {
        s.peer
            .send(&format!("semaphore {c} {}/mpool 3", s.ns_path))
            .await;
        s.peer.expect("ok").await;
    }
    s.peer.send("acquire m1").await;
    s.peer.expect("acquired m1").await;
    let sem = a.semaphore("mpool", 3).unwrap();
    let g1 = tokio::time::timeout(SOON, sem.acquire())
        .await
        .expect("our first permit beside one Curator lease")
        .unwrap();
    let g2 = tokio::time::timeout(SOON, sem.acquire())
        .await
        .expect("our second permit on the same client")
        .unwrap();
    let st = a.inspect("mpool").await.unwrap();
    assert_eq!(st.holders.len(), 3, "{st:?}");
    let e = sem.try_acquire().await.unwrap_err();
    assert_eq!(e.kind(), quorumlock_core::ErrorKind::WouldBlock, "{e}");
    s.peer.send("acquire m2").await;
    assert!(
        !s.peer
            .says_within("acquired m2", Duration::from_millis(500))
            .await,
        "Curator took a fourth lease of 3"
    );
    g2.release().await.unwrap();
    s.peer.expect("acquired m2").await;
    assert!(g1.is_held());
    g1.release().await.unwrap();
    for c in ["m1", "m2"] {
        s.peer.send(&format!("release {c}")).await;
        s.peer.expect(&format!("released {c}")).await;
    }
    s.peer.quit().await;
    s.case.finish().await;
}

/// Several permits at once against Curator's `acquire(qty)` on one
/// `InterProcessSemaphoreV2` of 3: while Curator holds 2, our request for
/// 2 waits (never 1 of them held); once Curator returns its leases ours
/// holds both, and then Curator's request for 2 waits until ours are
/// released. Both count leases one by one, under the same internal mutex.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_permits_at_once_count_against_curator_acquire_qty() {
    let Some(mut s) = setup().await else { return };
    let a = s.case.client().await;
    for c in ["q1", "q2"] {
        s.peer
            .send(&format!("semaphore {c} {}/qpool 3", s.ns_path))
            .await;
        s.peer.expect("ok").await;
    }
    s.peer.send("acquire-many q1 2").await;
    s.peer.expect("acquired q1").await;
    let sem = a.semaphore("qpool", 3).unwrap();
    let e = sem.try_acquire_many(2).await.unwrap_err();
    assert_eq!(e.kind(), quorumlock_core::ErrorKind::WouldBlock, "{e}");
    let ours = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire_many(2).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !ours.is_finished(),
        "2 permits granted beside Curator's 2 of 3"
    );
    let st = a.inspect("qpool").await.unwrap();
    assert_eq!(
        st.holders.len(),
        2,
        "one of our 2 permits held early: {st:?}"
    );
    s.peer.send("release q1").await;
    s.peer.expect("released q1").await;
    let g = tokio::time::timeout(SOON, ours)
        .await
        .expect("our 2 permits after Curator's release")
        .unwrap()
        .unwrap();
    assert_eq!(g.count(), 2);
    s.peer.send("acquire-many q2 2").await;
    assert!(
        !s.peer
            .says_within("acquired q2", Duration::from_millis(500))
            .await,
        "Curator took 2 leases beside our 2 of 3"
    );
    g.release().await.unwrap();
    s.peer.expect("acquired q2").await;
    s.peer.send("release q2").await;
    s.peer.expect("released q2").await;
    s.peer.quit().await;
    s.case.finish().await;
}

/// Curator's `LeaderLatch` (tests/java/LatchPeer.java) and our elections
/// on one path are one election: never two leaders at once, leadership
/// passes both ways on close/resign, and each side reads the other's
/// leader value (`LeaderLatch.getLeader()` reads our node's data; our
/// `leader()` reads the participant id Curator writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_leader_latch_and_ours_are_one_election() {
    let Some(h) = harness() else { return };
    let Some(cp) = curator_classpath() else {
        return;
    };
    let Some((classes, run_cp)) = compile_peer(&cp, "LatchPeer").await else {
        return;
    };
    let case = h.case();
    let cfg = ZkConfig::from_url(&h.url_for(case.namespace())).unwrap();
    let path = format!("/{}/leader", cfg.namespace);
    let mut peer = Peer::start(&run_cp, "LatchPeer", &cfg.connect_string()).await;
    let (ours, other) = (case.client().await, case.client().await);
    let election = ours.election("leader").unwrap();

    // 1. A Curator latch leads; ours waits behind it and reads its id.
    peer.send(&format!("latch c1 {path} curator-1")).await;
    peer.expect("started c1").await;
    peer.expect("leader c1").await;
    let e = election.clone();
    let ours_next = tokio::spawn(async move { e.campaign("ours-1").await });
    tokio::time::timeout(SOON, async {
        while other.inspect("leader").await.unwrap().waiters.len() != 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("our candidate never queued behind Curator's");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!ours_next.is_finished(), "two leaders at once");
    let leader = quorumlock_conformance::support::leader_of(&other, "leader").await;
    assert_eq!(leader.value, b"curator-1", "Curator's participant id");

    // 2. Curator closes its latch: ours leads; a second Curator latch
    // waits and reads our value as the leader's id.
    peer.send("close c1").await;
    peer.expect("closed c1").await;
    let mut g = tokio::time::timeout(SOON, ours_next)
        .await
        .expect("ours not elected after Curator's latch closed")
        .unwrap()
        .unwrap();
    assert!(g.token() > leader.token);
    // A proclaim (before a Curator latch waits behind us: a data change
    // fires LeaderLatch's one-shot watch on its predecessor, which it then
    // ignores without watching again; see the README).
    g.proclaim("ours-1b").await.unwrap();
    assert!(g.is_leader());
    peer.send(&format!("latch c2 {path} curator-2")).await;
    peer.expect("started c2").await;
    assert!(
        !peer
            .says_within("leader c2", Duration::from_millis(1000))
            .await,
        "Curator's latch leads while ours does"
    );
    // 3. Curator's getLeader() reads our (proclaimed) value.
    assert_eq!(peer.leader_seen_by("c2").await, "ours-1b");

    // 4. We resign: Curator's latch leads.
    g.resign().await.unwrap();
    peer.expect("leader c2").await;
    let now = quorumlock_conformance::support::leader_of(&other, "leader").await;
    assert_eq!(now.value, b"curator-2");
    peer.send("close c2").await;
    peer.expect("closed c2").await;
    peer.quit().await;
    drop(classes);
    case.finish().await;
}

/// Issue 39, bug 2: a revoke request on our leader, with a Curator
/// `LeaderLatch` waiting right behind it, then a resign. The latch must
/// lead (it watches our node with a one-shot data watch that it acts on
/// only for a delete, and does not set again after a data change), and
/// the revoke must not change the leader's value as either side reads it.
/// The revoke is sent only once the latch's watch on our node is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_on_our_leader_keeps_a_curator_latch_behind_it() {
    let Some(h) = harness() else { return };
    let Some(cp) = curator_classpath() else {
        return;
    };
    let Some((classes, run_cp)) = compile_peer(&cp, "LatchPeer").await else {
        return;
    };
    let case = h.case();
    let cfg = ZkConfig::from_url(&h.url_for(case.namespace())).unwrap();
    let path = format!("/{}/rvl", cfg.namespace);
    let mut peer = Peer::start(&run_cp, "LatchPeer", &cfg.connect_string()).await;
    let (ours, other) = (case.client().await, case.client().await);
    let leader = ours
        .election("rvl")
        .unwrap()
        .campaign("ours-1")
        .await
        .unwrap();
    let our_node = leader.guard().entry().to_string();

    peer.send(&format!("latch c1 {path} curator-1")).await;
    peer.expect("started c1").await;
    // The latch watches our node once its getData answered.
    tokio::time::timeout(SOON, async {
        loop {
            peer.send("watches").await;
            let line = peer.expect("watches").await;
            if line.split([' ', ',']).any(|p| p == our_node) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the Curator latch never watched our leader's node");

    let mut problems = Vec::new();
    let asked = leader.guard().revoke_requested();
    assert!(other.request_revoke("rvl").await.unwrap());
    tokio::time::timeout(SOON, asked)
        .await
        .expect("our leader did not hear the revoke request");
    assert!(leader.is_leader(), "a revoke request is not a loss");
    let seen = quorumlock_conformance::support::leader_of(&other, "rvl").await;
    if seen.value != b"ours-1" {
        problems.push(format!(
            "after the revoke our leader() shows the value {:?}",
            String::from_utf8_lossy(&seen.value)
        ));
    }
    let curator_sees = peer.leader_seen_by("c1").await;
    if curator_sees != "ours-1" {
        problems.push(format!(
            "after the revoke Curator's getLeader() reads {curator_sees:?}"
        ));
    }
    let started = tokio::time::Instant::now();
    leader.resign().await.unwrap();
    // (Shorter than `expect`'s own limit, which panics.)
    if peer.says_within("leader c1", Duration::from_secs(10)).await {
        let now = quorumlock_conformance::support::leader_of(&other, "rvl").await;
        assert_eq!(now.value, b"curator-1");
    } else {
        let st = other.inspect("rvl").await.unwrap();
        problems.push(format!(
            "the Curator latch did not lead within {:?} of our resign (the store's holders: {:?})",
            started.elapsed(),
            st.holders
                .iter()
                .map(|c| String::from_utf8_lossy(&c.value).into_owned())
                .collect::<Vec<_>>()
        ));
    }
    peer.send("close c1").await;
    peer.expect("closed c1").await;
    peer.quit().await;
    drop(classes);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    case.finish().await;
}

/// Our upgradeable reader and its upgrade against Curator's
/// `InterProcessReadWriteLock`: Curator's reader shares with the
/// upgradeable hold and keeps the upgrade waiting until it leaves;
/// Curator's reader and writer that ask after the upgrade wait while it
/// holds; after the downgrade Curator's reader is let in beside our read
/// hold, and Curator's writer only once both have gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_curator_readers_and_writers_exclude_our_upgrade() {
    let Some(mut s) = setup().await else { return };
    let a = s.case.client().await;
    for (id, side) in [("r1", "read"), ("r2", "read"), ("w1", "write")] {
        s.peer
            .send(&format!("rwlock {id} {}/rw {side}", s.ns_path))
            .await;
        s.peer.expect("ok").await;
    }
    s.peer.send("acquire r1").await;
    s.peer.expect("acquired r1").await;
    let mut u = tokio::time::timeout(SOON, a.rwlock("rw").unwrap().upgradeable_read())
        .await
        .expect("our upgradeable reader waited for Curator's reader")
        .unwrap();
    assert!(u.entry().contains("-up-__READ__"), "{}", u.entry());
    let (granted_tx, mut granted) = tokio::sync::oneshot::channel();
    let (downgrade_tx, downgrade) = tokio::sync::oneshot::channel::<()>();
    let (release_tx, release) = tokio::sync::oneshot::channel::<()>();
    let upgrader = tokio::spawn(async move {
        {
            let up = u.upgrade().await.unwrap();
            granted_tx.send(up.entry().to_string()).unwrap();
            downgrade.await.unwrap();
            up.downgrade().await.unwrap();
        }
        release.await.unwrap();
        u.release().await.unwrap();
    });
    wait_waiters(&a, "rw", 1).await;
    s.peer.send("acquire r2").await;
    wait_waiters(&a, "rw", 2).await;
    s.peer.send("acquire w1").await;
    wait_waiters(&a, "rw", 3).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut granted)
            .await
            .is_err(),
        "our upgrade got in beside Curator's reader"
    );
    s.peer.send("release r1").await;
    s.peer.expect("released r1").await;
    let node = tokio::time::timeout(SOON, granted)
        .await
        .expect("our upgrade was not granted after Curator's reader left")
        .unwrap();
    assert!(node.contains("__WRIT__"), "{node}");
    assert!(
        !s.peer
            .says_within("acquired", Duration::from_millis(300))
            .await,
        "a Curator reader or writer got in beside our upgrade"
    );
    downgrade_tx.send(()).unwrap();
    s.peer.expect("acquired r2").await;
    assert!(
        !s.peer
            .says_within("acquired w1", Duration::from_millis(300))
            .await,
        "Curator's writer got in beside our upgradeable reader"
    );
    release_tx.send(()).unwrap();
    tokio::time::timeout(SOON, upgrader)
        .await
        .expect("the upgrader did not finish")
        .unwrap();
    s.peer.send("release r2").await;
    s.peer.expect("released r2").await;
    s.peer.expect("acquired w1").await;
    s.peer.send("release w1").await;
    s.peer.expect("released w1").await;
    s.peer.quit().await;
    s.case.finish().await;
}
