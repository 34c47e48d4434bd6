//! Curator's `LeaderLatch` (tests/java/LatchPeer.java, compiled with
//! `javac` as the lock interop test compiles its peer) and our elections
//! on one path are one election: never two leaders at once, leadership
//! passes both ways on close/resign, and each side reads the other's
//! leader value (`LeaderLatch.getLeader()` reads our node's data; our
//! `leader()` reads the participant id Curator writes).
//!
//! Needs `QUORUMLOCK_TEST_ZK_URL`, `javac`/`java`, and the Curator jars
//! (`QUORUMLOCK_CURATOR_CP`).

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use backend_zk::{ZkBackend, ZkConfig};
use conformance_tests::Harness;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const SOON: Duration = Duration::from_secs(15);

fn harness() -> Option<Harness> {
    Harness::from_env("QUORUMLOCK_TEST_ZK_URL", |url| async move {
        Ok(Arc::new(ZkBackend::connect(&url).await?) as _)
    })
}

fn classpath() -> Option<String> {
    match std::env::var("QUORUMLOCK_CURATOR_CP") {
        Ok(cp) if !cp.is_empty() => Some(cp),
        _ if std::env::var("QUORUMLOCK_TEST_REQUIRE").is_ok_and(|v| v == "1") => {
            panic!("QUORUMLOCK_CURATOR_CP is unset and QUORUMLOCK_TEST_REQUIRE=1")
        }
        _ => {
            eprintln!("SKIPPED: QUORUMLOCK_CURATOR_CP is unset");
            None
        }
    }
}

/// Compiles LatchPeer.java into `dir`; the class path to run it.
async fn compile(cp: &str, dir: &Path) -> String {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/java/LatchPeer.java");
    let out = Command::new("javac")
        .arg("-d")
        .arg(dir)
        .arg("-cp")
        .arg(cp)
        .arg(&src)
        .output()
        .await
        .expect("javac");
    assert!(
        out.status.success(),
        "javac failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    format!("{}:{cp}", dir.display())
}

struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    seen: Vec<String>,
}

impl Peer {
    async fn start(cp: &str, connect: &str) -> Peer {
        let mut child = Command::new("java")
            .args(["-Xmx128m", "-cp", cp, "LatchPeer", connect])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting java");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut p = Peer {
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
        let read = async {
            loop {
                let line = self
                    .lines
                    .next_line()
                    .await
                    .unwrap()
                    .expect("LatchPeer exited");
                assert!(!line.starts_with("error"), "LatchPeer: {line}");
                if matches(&line) {
                    return line;
                }
                self.seen.push(line);
            }
        };
        tokio::time::timeout(SOON, read)
            .await
            .unwrap_or_else(|_| panic!("LatchPeer did not say {want:?}"))
    }

    async fn says_within(&mut self, want: &str, wait: Duration) -> bool {
        tokio::time::timeout(wait, self.expect(want)).await.is_ok()
    }

    /// The leader's participant id as the latch `id` reads it.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_leader_latch_and_ours_are_one_election() {
    let Some(h) = harness() else { return };
    let Some(cp) = classpath() else { return };
    let classes =
        std::env::temp_dir().join(format!("qlzk-latch-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&classes).unwrap();
    let run_cp = compile(&cp, &classes).await;
    let case = h.case();
    let cfg = ZkConfig::from_url(&h.url_for(case.namespace())).unwrap();
    let path = format!("/{}/leader", cfg.namespace);
    let mut peer = Peer::start(&run_cp, &cfg.connect_string()).await;
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
    let leader = other
        .election("leader")
        .unwrap()
        .leader()
        .await
        .unwrap()
        .unwrap();
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
    let now = other
        .election("leader")
        .unwrap()
        .leader()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(now.value, b"curator-2");
    peer.send("close c2").await;
    peer.expect("closed c2").await;
    peer.quit().await;
    let _ = std::fs::remove_dir_all(&classes);
    case.finish().await;
}
