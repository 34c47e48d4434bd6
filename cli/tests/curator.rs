//! `quorumlock lock --write` against Java services that use Curator's
//! `InterProcessReadWriteLock` on the same ZooKeeper path: the CLI's
//! writer keeps Curator's readers out (a plain `lock` is a Curator mutex,
//! which Curator's readers do not look at), and waits for them.
//!
//! The Curator side is quorumlock-zk's test peer (`tests/java/CuratorPeer.java`
//! there), compiled with `javac`. Needs `QUORUMLOCK_TEST_ZK_URL`,
//! `javac`/`java` and the Curator jars (`QUORUMLOCK_CURATOR_CP`, else the
//! Debian jars under /usr/share/java); skipped loudly without them, or
//! failed when `QUORUMLOCK_TEST_REQUIRE=1`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command as StdCommand, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use assert_cmd::Command;

const BIN: &str = env!("CARGO_BIN_EXE_quorumlock");
const NOT_ACQUIRED: i32 = 75;
const SOON: Duration = Duration::from_secs(20);
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

fn skip(why: &str) -> Option<()> {
    if std::env::var("QUORUMLOCK_TEST_REQUIRE").as_deref() == Ok("1") {
        panic!("{why} and QUORUMLOCK_TEST_REQUIRE=1");
    }
    eprintln!("SKIPPED: {why}");
    None
}

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
            skip(&format!(
                "{} is missing (or set QUORUMLOCK_CURATOR_CP)",
                p.display()
            ))?;
        }
        parts.push(p.display().to_string());
    }
    Some(parts.join(":"))
}

/// A running CuratorPeer: commands on stdin, answers read by a thread.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Peer {
    fn start(classes: &Path, cp: &str, connect: &str) -> Peer {
        let mut child = StdCommand::new("java")
            .arg("-Xmx128m")
            .arg("-cp")
            .arg(format!("{}:{cp}", classes.display()))
            .arg("CuratorPeer")
            .arg(connect)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting java");
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut p = Peer {
            child,
            stdin,
            lines,
        };
        p.expect("ready", SOON);
        p
    }

    fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The next line starting with `prefix` within `wait`, or `None`;
    /// an `error` line fails the test.
    fn says(&mut self, prefix: &str, wait: Duration) -> Option<String> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with("error") => panic!("CuratorPeer: {l}"),
                Ok(l) if l.starts_with(prefix) => return Some(l),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => return None,
                Err(RecvTimeoutError::Disconnected) => panic!("CuratorPeer exited"),
            }
        }
    }

    fn expect(&mut self, prefix: &str, wait: Duration) -> String {
        self.says(prefix, wait)
            .unwrap_or_else(|| panic!("CuratorPeer did not say {prefix:?}"))
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `quorumlock --url URL ARGS...`, run to its end.
fn ql(url: &str) -> Command {
    let mut c = Command::new(BIN);
    c.env_remove("QUORUMLOCK_URL")
        .env_remove("RUST_LOG")
        .arg("--url")
        .arg(url)
        .timeout(Duration::from_secs(30));
    c
}

fn wait_file(path: &Path) {
    let t0 = Instant::now();
    while !std::fs::read_to_string(path).is_ok_and(|s| s.ends_with('\n')) {
        assert!(t0.elapsed() < SOON, "{} never written", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn write_side_excludes_curator_readers_and_waits_for_them() {
    let Some(base) = std::env::var("QUORUMLOCK_TEST_ZK_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        skip("QUORUMLOCK_TEST_ZK_URL is unset");
        return;
    };
    let Some(cp) = curator_classpath() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../quorumlock-zk/tests/java/CuratorPeer.java");
    let javac = match StdCommand::new("javac")
        .arg("-d")
        .arg(dir.path())
        .arg("-cp")
        .arg(&cp)
        .arg(&src)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            skip(&format!("javac not runnable ({e})"));
            return;
        }
    };
    assert!(
        javac.status.success(),
        "javac: {}",
        String::from_utf8_lossy(&javac.stderr)
    );

    // zk://HOSTS[/...]?query -> the peer's connect string and our URL.
    let hosts = base
        .strip_prefix("zk://")
        .expect("a zk:// URL")
        .split(['/', '?'])
        .next()
        .unwrap()
        .to_string();
    let ns = format!("clitest-{}", uuid::Uuid::new_v4().simple());
    let url = format!("zk://{hosts}/{ns}");
    let path = format!("/{ns}/deploy");
    let mut peer = Peer::start(dir.path(), &cp, &hosts);

    // Our writer holds: Curator's reader waits until its command ends.
    let held = dir.path().join("held");
    let mut writer = StdCommand::new(BIN)
        .env_remove("QUORUMLOCK_URL")
        .args(["--url", &url, "lock", "--write", "deploy", "-c"])
        .arg(format!("echo held > {}; sleep 2", held.display()))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    wait_file(&held);
    peer.send(&format!("rwlock r1 {path} read"));
    peer.expect("ok", SOON);
    peer.send("acquire r1");
    assert!(
        peer.says("acquired r1", Duration::from_millis(1000))
            .is_none(),
        "Curator's reader got in beside `lock --write`"
    );
    assert!(writer.wait().unwrap().success());
    peer.expect("acquired r1", SOON);

    // Curator's reader holds: our writer cannot get in, our reader can.
    ql(&url)
        .args(["lock", "--write", "-n", "deploy", "--", "true"])
        .assert()
        .code(NOT_ACQUIRED);
    ql(&url)
        .args(["lock", "--shared", "-n", "deploy", "--", "true"])
        .assert()
        .success();
    // A waiting writer gets in once the reader lets go.
    let t0 = Instant::now();
    let waiting = StdCommand::new(BIN)
        .env_remove("QUORUMLOCK_URL")
        .args([
            "--url", &url, "lock", "--write", "-w", "20s", "deploy", "--", "true",
        ])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    peer.send("release r1");
    peer.expect("released r1", SOON);
    let out = waiting.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(t0.elapsed() >= Duration::from_millis(700));
    peer.send("quit");
    let _ = peer.says("bye", Duration::from_secs(5));
}
