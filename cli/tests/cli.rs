//! Drives the `quorumlock` binary: on `mem://` (no server) and on each real
//! store named by `QUORUMLOCK_TEST_{ETCD,ETCD35,ZK,CONSUL}_URL`. A store whose
//! variable is unset is skipped loudly, or fails the test when
//! `QUORUMLOCK_TEST_REQUIRE=1`.

use std::path::Path;
use std::process::{Child, Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::Command;
use predicates::prelude::*;

const BIN: &str = env!("CARGO_BIN_EXE_quorumlock");

const USAGE: i32 = 64;
const UNAVAILABLE: i32 = 69;
const NOT_ACQUIRED: i32 = 75;
const LOCK_LOST: i32 = 76;

/// The binary on `url`, with no inherited `QUORUMLOCK_URL` or `RUST_LOG`.
fn ql(url: &str) -> Command {
    let mut c = Command::new(BIN);
    c.env_remove("QUORUMLOCK_URL")
        .env_remove("RUST_LOG")
        .arg("--url")
        .arg(url)
        .timeout(Duration::from_secs(30));
    c
}

/// A background `quorumlock` that is killed if the test panics.
struct Bg(Child);

impl Bg {
    fn spawn(url: &str, args: &[&str]) -> Bg {
        let child = StdCommand::new(BIN)
            .env_remove("QUORUMLOCK_URL")
            .env_remove("RUST_LOG")
            .arg("--url")
            .arg(url)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn quorumlock");
        Bg(child)
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    /// Waits at most `limit` for the exit code.
    fn wait(mut self, limit: Duration) -> (i32, String) {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.0.try_wait().unwrap() {
                let mut err = String::new();
                if let Some(mut e) = self.0.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
                }
                let code = st.code().unwrap_or_else(|| {
                    use std::os::unix::process::ExitStatusExt;
                    128 + st.signal().unwrap_or(0)
                });
                return (code, err);
            }
            assert!(
                t0.elapsed() < limit,
                "quorumlock did not exit within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn tmpdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// Waits until `path` exists and holds a line; returns it.
fn wait_file(path: &Path, limit: Duration) -> String {
    let t0 = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s.trim().to_string();
            }
        }
        assert!(t0.elapsed() < limit, "{} never written", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn alive(pid: i32) -> bool {
    // /proc/PID exists for running and zombie processes alike; a zombie
    // has state Z.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s.split_whitespace().nth(2).is_none_or(|st| st != "Z"),
        Err(_) => false,
    }
}

// ------------------------------------------------------------------ mem ---

#[test]
fn mem_child_gets_name_and_token_and_its_exit_status_is_passed_on() {
    ql("mem://")
        .args(["lock", "jobs/report", "--", "sh", "-c"])
        .arg(r#"echo "name=$QUORUMLOCK_NAME token=$QUORUMLOCK_TOKEN"; exit 3"#)
        .assert()
        .code(3)
        .stdout(predicate::str::is_match(r"^name=jobs/report token=[1-9][0-9]*\n$").unwrap());
    ql("mem://")
        .args(["lock", "--timeout", "0", "a", "--", "true"])
        .assert()
        .success();
}

#[test]
fn mem_killed_child_is_128_plus_signal_and_missing_command_is_127() {
    ql("mem://")
        .args(["lock", "a", "--", "sh", "-c", "kill -KILL $$"])
        .assert()
        .code(128 + 9);
    ql("mem://")
        .args(["lock", "a", "--", "/nonexistent/command"])
        .assert()
        .code(127)
        .stderr(predicate::str::contains("cannot run /nonexistent/command"));
}

#[test]
fn mem_command_is_stopped_when_quorumlock_is_killed() {
    // Nobody watches the lock once quorumlock is gone: the kernel sends
    // the command SIGTERM (PR_SET_PDEATHSIG).
    let dir = tmpdir();
    let pidfile = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    let holder = Bg::spawn("mem://", &["lock", "a", "--", "sh", "-c", &script]);
    let child: i32 = wait_file(&pidfile, Duration::from_secs(10))
        .parse()
        .unwrap();
    assert!(alive(child));
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(holder.pid(), libc::SIGKILL) };
    let (code, _) = holder.wait(Duration::from_secs(10));
    assert_eq!(code, 128 + 9);
    let t0 = Instant::now();
    while alive(child) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the command outlived quorumlock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn mem_usage_errors_are_64() {
    // A bad lock name, before anything is connected.
    ql("mem://")
        .args(["lock", "bad name", "--", "true"])
        .assert()
        .code(USAGE)
        .stderr(predicate::str::contains("invalid name"));
    ql("mem://").args(["status", "a//b"]).assert().code(USAGE);
    // Bad URLs and unknown schemes are typed errors, hence 64.
    ql("not a url")
        .args(["status", "a"])
        .assert()
        .code(USAGE)
        .stderr(predicate::str::contains("invalid url"));
    ql("mem://?ttl=forever")
        .args(["status", "a"])
        .assert()
        .code(USAGE);
    ql("redis://127.0.0.1:6379")
        .args(["status", "a"])
        .assert()
        .code(USAGE)
        .stderr(predicate::str::contains("unknown scheme"));
    // --ttl is checked like the URL's own option.
    ql("mem://")
        .args(["lock", "--ttl", "1ms", "a", "--", "true"])
        .assert()
        .code(USAGE);
    // No command, a bad duration, an unknown flag: clap errors, also 64.
    ql("mem://").args(["lock", "a"]).assert().code(USAGE);
    ql("mem://")
        .args(["lock", "--timeout", "soon", "a", "--", "true"])
        .assert()
        .code(USAGE);
    ql("mem://").args(["frobnicate"]).assert().code(USAGE);
}

#[test]
fn unreachable_store_is_69_not_a_hang() {
    // Nothing listens on port 1. `lock` reads the lock once before it
    // queues, so it fails at once instead of retrying quietly.
    for url in [
        "etcd://127.0.0.1:1/ns?timeout=1s",
        "zk://127.0.0.1:1/ns?connect_timeout=500ms",
        "consul://127.0.0.1:1/ns",
    ] {
        ql(url)
            .args(["lock", "a", "--", "true"])
            .assert()
            .code(UNAVAILABLE)
            .stderr(predicate::str::starts_with("quorumlock: connection"));
    }
}

#[test]
fn mem_break_without_yes_is_refused() {
    ql("mem://")
        .args(["break", "a"])
        .assert()
        .code(USAGE)
        .stderr(predicate::str::contains("--yes"));
    ql("mem://")
        .args(["break", "--yes", "a"])
        .assert()
        .success()
        .stdout(predicate::str::contains("not held"));
}

#[test]
fn mem_status_of_a_free_lock() {
    ql("mem://")
        .args(["status", "a"])
        .assert()
        .success()
        .stdout(predicate::str::contains("none (free)"));
    let out = ql("mem://")
        .args(["status", "--json", "a"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["held"], false);
    assert_eq!(v["name"], "a");
}

#[test]
fn help_documents_the_exit_codes() {
    let out = ql("mem://")
        .arg("--help")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let help = String::from_utf8(out).unwrap();
    for code in ["64", "69", "75", "76", "128+N"] {
        assert!(help.contains(code), "{code} missing from --help");
    }
}

#[test]
fn secrets_in_the_url_are_never_printed() {
    // Nothing listens on port 1: the connection fails (or, without the
    // backend built in, the scheme is refused), and nothing may show the
    // password or the token, even at trace level.
    for url in [
        "consul://bob:s3cret@127.0.0.1:1/ns?token=t0ps3cret",
        "etcd://bob:s3cret@127.0.0.1:1/ns",
        "zk://bob:s3cret@127.0.0.1:1/ns?connect_timeout=500ms",
    ] {
        let out = ql(url)
            .args(["-vvv", "status", "a"])
            .timeout(Duration::from_secs(60))
            .assert()
            .failure()
            .get_output()
            .clone();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!all.contains("s3cret"), "{all}");
        let code = out.status.code().unwrap();
        assert!(code == UNAVAILABLE || code == USAGE, "{code}: {all}");
    }
}

// --------------------------------------------------------- real stores ---

/// The URL of a fresh random namespace on the store in `var`, or `None`
/// (skipped) when the variable is unset.
fn store(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(u) if !u.is_empty() => {
            let ns = format!("clitest-{}", uuid::Uuid::new_v4().simple());
            let (base, query) = match u.split_once('?') {
                Some((b, q)) => (b.to_string(), format!("?{q}")),
                None => (u.clone(), String::new()),
            };
            Some(format!("{}/{ns}{query}", base.trim_end_matches('/')))
        }
        _ => {
            if std::env::var("QUORUMLOCK_TEST_REQUIRE").as_deref() == Ok("1") {
                panic!("{var} is unset and QUORUMLOCK_TEST_REQUIRE=1");
            }
            eprintln!("SKIPPED: {var} is unset (start the stores with `eval \"$(scripts/stores.sh up)\"`)");
            None
        }
    }
}

/// Two `lock` processes, three rounds each, on one name: the critical
/// sections never overlap (mkdir fails if they do) and the tokens strictly
/// increase in the order the sections ran.
fn never_overlap(url: &str) {
    let dir = tmpdir();
    let inside = dir.path().join("inside");
    let log = dir.path().join("tokens");
    let script = format!(
        "mkdir {inside} || exit 99; echo $QUORUMLOCK_TOKEN >> {log}; sleep 0.2; rmdir {inside}",
        inside = inside.display(),
        log = log.display()
    );
    let procs: Vec<std::thread::JoinHandle<()>> = (0..2)
        .map(|_| {
            let (url, script) = (url.to_string(), script.clone());
            std::thread::spawn(move || {
                for _ in 0..3 {
                    let bg = Bg::spawn(
                        &url,
                        &[
                            "lock",
                            "--timeout",
                            "20s",
                            "overlap",
                            "--",
                            "sh",
                            "-c",
                            &script,
                        ],
                    );
                    let (code, err) = bg.wait(Duration::from_secs(30));
                    assert_eq!(code, 0, "{err}");
                }
            })
        })
        .collect();
    for p in procs {
        p.join().expect("a lock process failed");
    }
    let tokens: Vec<u64> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(tokens.len(), 6, "{tokens:?}");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not increasing: {tokens:?}"
    );
    ql(url)
        .args(["status", "overlap"])
        .assert()
        .success()
        .stdout(predicate::str::contains("none (free)"));
}

/// A holder runs `sleep`: `status` shows its token, and a second `lock`
/// with `--timeout` gives up with 75 and leaves no waiter behind.
fn status_and_timeout(url: &str) {
    let dir = tmpdir();
    let tok = dir.path().join("token");
    let script = format!("echo $QUORUMLOCK_TOKEN > {}; sleep 30", tok.display());
    let holder = Bg::spawn(url, &["lock", "held", "--", "sh", "-c", &script]);
    let token = wait_file(&tok, Duration::from_secs(15));

    let out = ql(url)
        .args(["status", "--json", "held"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["held"], true, "{v}");
    assert_eq!(v["holders"][0]["token"].to_string(), token, "{v}");
    assert!(
        v["holders"][0]["session"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "{v}"
    );
    ql(url)
        .args(["status", "held"])
        .assert()
        .success()
        .stdout(predicate::str::contains(format!("token {token}")));

    let t0 = Instant::now();
    ql(url)
        .args(["lock", "--timeout", "700ms", "held", "--", "true"])
        .assert()
        .code(NOT_ACQUIRED)
        // stderr is not a terminal: no spinner, just the error.
        .stderr(predicate::str::contains("waiting for").not())
        .stderr(predicate::str::contains("not acquired in time"));
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    ql(url)
        .args(["lock", "--timeout", "0", "held", "--", "true"])
        .assert()
        .code(NOT_ACQUIRED);

    // The waiters gave up and removed their entries.
    let out = ql(url)
        .args(["status", "--json", "held"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["waiters"].as_array().map(Vec::len), Some(0), "{v}");

    // SIGTERM to the holder is forwarded: sleep dies, 128+15.
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(holder.pid(), libc::SIGTERM) };
    let (code, err) = holder.wait(Duration::from_secs(15));
    assert_eq!(code, 128 + 15, "{err}");
}

/// `break --yes` on a running holder: its command is killed and it exits
/// with 76; the next holder gets a higher token.
fn break_kills_the_child(url: &str) {
    let dir = tmpdir();
    let pidfile = dir.path().join("pid");
    let script = format!(
        "echo $QUORUMLOCK_TOKEN $$ > {}; exec sleep 30",
        pidfile.display()
    );
    let holder = Bg::spawn(
        url,
        &["lock", "--grace", "1s", "brk", "--", "sh", "-c", &script],
    );
    let line = wait_file(&pidfile, Duration::from_secs(15));
    let (token, child) = line.split_once(' ').unwrap();
    let (token, child): (u64, i32) = (token.parse().unwrap(), child.parse().unwrap());
    assert!(alive(child));

    ql(url).args(["break", "brk"]).assert().code(USAGE);
    ql(url)
        .args(["break", "--yes", "brk"])
        .assert()
        .success()
        .stdout(predicate::str::contains("broke brk"));
    let (code, err) = holder.wait(Duration::from_secs(20));
    assert_eq!(code, LOCK_LOST, "{err}");
    assert!(err.contains("lost"), "{err}");
    assert!(!alive(child), "the command survived the break");

    let out = ql(url)
        .args([
            "lock",
            "--timeout",
            "10s",
            "brk",
            "--",
            "sh",
            "-c",
            "echo $QUORUMLOCK_TOKEN",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let next: u64 = String::from_utf8(out).unwrap().trim().parse().unwrap();
    assert!(next > token, "{next} <= {token}");
}

/// `revoke` asks the holder to let go: its command gets SIGTERM.
fn revoke_terminates_the_child(url: &str) {
    let dir = tmpdir();
    let ready = dir.path().join("ready");
    let script = format!(
        "trap 'exit 5' TERM; echo up > {}; while :; do sleep 0.1; done",
        ready.display()
    );
    let holder = Bg::spawn(
        url,
        &["lock", "--ttl", "10s", "rev", "--", "sh", "-c", &script],
    );
    wait_file(&ready, Duration::from_secs(15));
    ql(url)
        .args(["revoke", "rev"])
        .assert()
        .success()
        .stdout(predicate::str::contains("asked the holder"));
    let (code, err) = holder.wait(Duration::from_secs(20));
    assert_eq!(code, 5, "{err}");
}

/// A waiter interrupted by SIGTERM exits with 143 and leaves no entry.
fn interrupted_waiter_leaves_nothing(url: &str) {
    let dir = tmpdir();
    let tok = dir.path().join("token");
    let script = format!("echo $QUORUMLOCK_TOKEN > {}; sleep 30", tok.display());
    let _holder = Bg::spawn(url, &["lock", "intr", "--", "sh", "-c", &script]);
    wait_file(&tok, Duration::from_secs(15));
    let waiter = Bg::spawn(url, &["lock", "intr", "--", "true"]);
    let t0 = Instant::now();
    loop {
        let out = ql(url)
            .args(["status", "--json", "intr"])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        if v["waiters"].as_array().is_some_and(|w| w.len() == 1) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the waiter never queued: {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(waiter.pid(), libc::SIGTERM) };
    let (code, err) = waiter.wait(Duration::from_secs(15));
    assert_eq!(code, 128 + 15, "{err}");
    let out = ql(url)
        .args(["status", "--json", "intr"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["waiters"].as_array().map(Vec::len), Some(0), "{v}");
}

/// `--permits 2`: three commands started together, at most two run at once
/// (each takes the lowest free slot directory; slot 2 would mean three).
/// `--shared`: two readers run together (each waits to see the other).
/// A plain `lock` of a name held `--shared` gives up with 75.
fn shared_and_permits(url: &str) {
    let dir = tmpdir();
    let d = dir.path().display().to_string();
    let slots = format!(
        "for i in 0 1 2; do if mkdir {d}/slot$i 2>/dev/null; then echo $i >> {d}/log; sleep 1; rmdir {d}/slot$i; exit 0; fi; done; exit 99"
    );
    let procs: Vec<Bg> = (0..3)
        .map(|_| {
            Bg::spawn(
                url,
                &[
                    "lock",
                    "--timeout",
                    "20s",
                    "--permits",
                    "2",
                    "pool",
                    "--",
                    "sh",
                    "-c",
                    &slots,
                ],
            )
        })
        .collect();
    for bg in procs {
        let (code, err) = bg.wait(Duration::from_secs(30));
        assert_eq!(code, 0, "{err}");
    }
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    assert!(!log.contains('2'), "three permit holders at once: {log:?}");
    assert!(
        log.contains('1'),
        "never two permit holders at once: {log:?}"
    );

    let reader = |me: &str, other: &str| {
        let script = format!(
            "touch {d}/{me}; i=0; while [ $i -lt 100 ]; do [ -e {d}/{other} ] && exit 0; sleep 0.1; i=$((i+1)); done; exit 98"
        );
        Bg::spawn(
            url,
            &[
                "lock",
                "--timeout",
                "20s",
                "--shared",
                "shared",
                "--",
                "sh",
                "-c",
                &script,
            ],
        )
    };
    let (a, b) = (reader("a", "b"), reader("b", "a"));
    for bg in [a, b] {
        let (code, err) = bg.wait(Duration::from_secs(30));
        assert_eq!(code, 0, "readers did not hold together: {err}");
    }

    let holder = Bg::spawn(
        url,
        &[
            "lock",
            "--shared",
            "mixed",
            "--",
            "sh",
            "-c",
            &format!("echo held > {d}/held; sleep 3"),
        ],
    );
    wait_file(&dir.path().join("held"), Duration::from_secs(20));
    ql(url)
        .args(["lock", "--timeout", "0", "mixed", "--", "true"])
        .assert()
        .code(75);
    let (code, err) = holder.wait(Duration::from_secs(30));
    assert_eq!(code, 0, "{err}");
}

macro_rules! store_tests {
    ($store:ident, $var:literal) => {
        mod $store {
            use super::*;

            #[test]
            fn two_lock_processes_never_overlap() {
                if let Some(url) = store($var) {
                    never_overlap(&url);
                }
            }

            #[test]
            fn status_shows_the_holder_and_timeout_gives_75() {
                if let Some(url) = store($var) {
                    status_and_timeout(&url);
                }
            }

            #[test]
            fn break_kills_the_child_and_exits_76() {
                if let Some(url) = store($var) {
                    break_kills_the_child(&url);
                }
            }

            #[test]
            fn revoke_sends_sigterm_to_the_child() {
                if let Some(url) = store($var) {
                    revoke_terminates_the_child(&url);
                }
            }

            #[test]
            fn shared_readers_overlap_and_permits_cap_holders() {
                if let Some(url) = store($var) {
                    shared_and_permits(&url);
                }
            }

            #[test]
            fn interrupted_waiter_exits_143_and_leaves_nothing() {
                if let Some(url) = store($var) {
                    interrupted_waiter_leaves_nothing(&url);
                }
            }
        }
    };
}

store_tests!(etcd, "QUORUMLOCK_TEST_ETCD_URL");
store_tests!(etcd35, "QUORUMLOCK_TEST_ETCD35_URL");
store_tests!(zk, "QUORUMLOCK_TEST_ZK_URL");
store_tests!(consul, "QUORUMLOCK_TEST_CONSUL_URL");
store_tests!(redis, "QUORUMLOCK_TEST_REDIS_URL");
