//! Drives the `quorumlock` binary: on `mem://` (no server) and on each real
//! store named by `QUORUMLOCK_TEST_{ETCD,ETCD35,ZK,CONSUL}_URL`. A store whose
//! variable is unset is skipped loudly, or fails the test when
//! `QUORUMLOCK_TEST_REQUIRE=1`.

use std::path::Path;
use std::process::{Child, Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::Command;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
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

    /// Waits at most `limit` for the exit code; returns it with stderr.
    fn wait(self, limit: Duration) -> (i32, String) {
        let (code, _, err) = self.wait_output(limit);
        (code, err)
    }

    /// Waits at most `limit` for the exit code; returns it with stdout
    /// and stderr.
    fn wait_output(mut self, limit: Duration) -> (i32, String, String) {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.0.try_wait().unwrap() {
                use std::io::Read;
                let (mut out, mut err) = (String::new(), String::new());
                if let Some(mut o) = self.0.stdout.take() {
                    let _ = o.read_to_string(&mut out);
                }
                if let Some(mut e) = self.0.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                let code = st.code().unwrap_or_else(|| {
                    use std::os::unix::process::ExitStatusExt;
                    128 + st.signal().unwrap_or(0)
                });
                return (code, out, err);
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
    send(holder.pid(), Signal::SIGKILL);
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
    // A bad lock name (too long, or empty), before anything is connected.
    ql("mem://")
        .args(["lock", &"n".repeat(201), "--", "true"])
        .assert()
        .code(USAGE)
        .stderr(predicate::str::contains("invalid name"));
    ql("mem://").args(["status", ""]).assert().code(USAGE);
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
    ql("memcached://127.0.0.1:11211")
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
fn no_url_is_a_usage_error_and_runs_nothing() {
    // Before, a missing QUORUMLOCK_URL meant a private mem:// store: the
    // command ran "locked" and excluded nobody.
    let dir = tmpdir();
    let ran = dir.path().join("ran");
    let touch = format!("touch {}", ran.display());
    let commands: [&[&str]; 6] = [
        &["lock", "deploy/prod", "--", "sh", "-c", &touch],
        &["lock", "-c", &touch, "deploy/prod"],
        &["status", "deploy/prod"],
        &["revoke", "deploy/prod"],
        &["break", "--yes", "deploy/prod"],
        &["list"],
    ];
    for args in commands {
        Command::new(BIN)
            .env_remove("QUORUMLOCK_URL")
            .env_remove("RUST_LOG")
            .args(args)
            .timeout(Duration::from_secs(30))
            .assert()
            .code(USAGE)
            .stderr(predicate::str::contains("--url"))
            .stderr(predicate::str::contains("QUORUMLOCK_URL"));
    }
    assert!(!ran.exists(), "the command ran without a store");
    // An empty variable is no store either; mem:// named explicitly works.
    Command::new(BIN)
        .env("QUORUMLOCK_URL", "")
        .args(["status", "a"])
        .assert()
        .code(USAGE);
    Command::new(BIN)
        .env("QUORUMLOCK_URL", "mem://")
        .args(["lock", "a", "--", "true"])
        .assert()
        .success();
}

#[test]
fn mem_c_runs_a_shell_command() {
    // A pipe and a variable: only a shell does both.
    ql("mem://")
        .args([
            "lock",
            "-c",
            "echo \"$QUORUMLOCK_NAME\" | tr a-z A-Z; exit 6",
            "jobs/report",
        ])
        .assert()
        .code(6)
        .stdout("JOBS/REPORT\n");
    // -c and a command after -- together, or neither: usage errors.
    ql("mem://")
        .args(["lock", "-c", "true", "a", "--", "true"])
        .assert()
        .code(USAGE);
    ql("mem://").args(["lock", "a"]).assert().code(USAGE);
}

#[test]
fn mem_durations_are_humantime() {
    ql("mem://")
        .args([
            "lock",
            "--timeout",
            "1.5s",
            "--grace",
            "250ms",
            "a",
            "--",
            "true",
        ])
        .assert()
        .success();
    ql("mem://")
        .args(["lock", "-w", "1m30s", "--ttl", "2.5s", "a", "--", "true"])
        .assert()
        .success();
    ql("mem://")
        .args(["lock", "--wait", "0.5", "a", "--", "true"])
        .assert()
        .success();
    for bad in ["1.5x", "soon", "-1s"] {
        ql("mem://")
            .args(["lock", "--timeout", bad, "a", "--", "true"])
            .assert()
            .code(USAGE);
    }
    // -n and a timeout contradict each other.
    ql("mem://")
        .args(["lock", "-n", "-w", "1s", "a", "--", "true"])
        .assert()
        .code(USAGE);
}

#[test]
fn completions_and_man_page_name_every_subcommand() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = Command::new(BIN)
            .env_remove("QUORUMLOCK_URL")
            .args(["completions", shell])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        let out = String::from_utf8(out).unwrap();
        for sub in ["lock", "status", "revoke", "break", "list"] {
            assert!(out.contains(sub), "{shell}: {sub} missing");
        }
        assert!(out.contains("nonblock"), "{shell}: lock's options missing");
    }
    let man = Command::new(BIN)
        .env_remove("QUORUMLOCK_URL")
        .arg("man")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let man = String::from_utf8(man).unwrap();
    assert!(man.starts_with(".ie") || man.starts_with(".TH"), "not roff");
    for section in [
        ".TH quorumlock 1",
        ".SH \"QUORUMLOCK LOCK\"",
        ".SH \"QUORUMLOCK LIST\"",
        ".SH \"QUORUMLOCK STATUS\"",
        "conflict\\-exit\\-code",
        "QUORUMLOCK_URL",
    ] {
        assert!(man.contains(section), "{section} missing from the man page");
    }
    Command::new(BIN)
        .args(["completions", "tcsh"])
        .assert()
        .code(USAGE);
}

#[test]
fn unreachable_store_is_69_not_a_hang() {
    // Nothing listens on port 1: connecting is refused until the connect
    // timeout, then `Unavailable`, instead of retrying quietly.
    for url in [
        "etcd://127.0.0.1:1/ns?timeout=1s&connect_timeout=1s",
        "zk://127.0.0.1:1/ns?connect_timeout=500ms",
        "consul://127.0.0.1:1/ns?connect_timeout=1s",
    ] {
        ql(url)
            .args(["lock", "a", "--", "true"])
            .assert()
            .code(UNAVAILABLE)
            .stderr(predicate::str::starts_with("quorumlock: unavailable"));
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
    for sub in ["list", "completions", "man"] {
        assert!(help.contains(sub), "{sub} missing from --help");
    }
    let out = ql("mem://")
        .args(["lock", "--help"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let help = String::from_utf8(out).unwrap();
    for opt in [
        "-c, --command",
        "-n, --nonblock",
        "-w, --timeout",
        "--wait",
        "-E, --conflict-exit-code",
        "--lost-exit-code",
        "--write",
        "-s, --shared",
        "1m30s",
    ] {
        assert!(help.contains(opt), "{opt} missing from lock --help");
    }
    let out = ql("mem://")
        .args(["status", "--help"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert!(String::from_utf8(out).unwrap().contains("-w, --watch"));
    ql("mem://")
        .args(["elect", "--help"])
        .assert()
        .success()
        .stdout(predicate::str::contains("-l, --listen"));
}

#[test]
fn secrets_in_the_url_are_never_printed() {
    // Nothing listens on port 1: the connection fails (or, without the
    // backend built in, the scheme is refused), and nothing may show the
    // password or the token, even at trace level.
    for url in [
        "consul://bob:s3cret@127.0.0.1:1/ns?token=t0ps3cret&connect_timeout=1s",
        "etcd://bob:s3cret@127.0.0.1:1/ns?connect_timeout=1s",
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
    send(holder.pid(), Signal::SIGTERM);
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
    send(waiter.pid(), Signal::SIGTERM);
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

/// The JSON of `status --json NAME`.
fn status_json(url: &str, name: &str) -> serde_json::Value {
    let out = ql(url)
        .args(["status", "--json", name])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    serde_json::from_slice(&out).unwrap()
}

/// Waits until `name` has `n` waiters.
fn wait_waiters(url: &str, name: &str, n: usize) {
    let t0 = Instant::now();
    loop {
        let v = status_json(url, name);
        if v["waiters"].as_array().is_some_and(|w| w.len() == n) {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "never {n} waiters: {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A holder started with `-c`: `-n` gives up at once with 75, or with the
/// code `-E` names; `-w`/`--wait` are `--timeout`.
fn nonblock_and_conflict_codes(url: &str) {
    let dir = tmpdir();
    let tok = dir.path().join("token");
    let holder = Bg::spawn(
        url,
        &[
            "lock",
            "held",
            "-c",
            &format!("echo $QUORUMLOCK_TOKEN > {}; sleep 30", tok.display()),
        ],
    );
    let token: u64 = wait_file(&tok, Duration::from_secs(15)).parse().unwrap();
    assert!(token > 0);

    let t0 = Instant::now();
    ql(url)
        .args(["lock", "-n", "held", "--", "true"])
        .assert()
        .code(NOT_ACQUIRED)
        .stderr("");
    ql(url)
        .args(["lock", "--nonblock", "-E", "3", "held", "-c", "exit 0"])
        .assert()
        .code(3);
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "-n waited: {:?}",
        t0.elapsed()
    );

    let t0 = Instant::now();
    ql(url)
        .args([
            "lock",
            "-w",
            "0.7",
            "--conflict-exit-code",
            "9",
            "held",
            "--",
            "true",
        ])
        .assert()
        .code(9);
    ql(url)
        .args(["lock", "--wait", "300ms", "held", "--", "true"])
        .assert()
        .code(NOT_ACQUIRED);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(1000),
        "did not wait: {took:?}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    wait_waiters(url, "held", 0);
    send(holder.pid(), Signal::SIGTERM);
    let (code, err) = holder.wait(Duration::from_secs(15));
    assert_eq!(code, 128 + 15, "{err}");
}

/// `--lost-exit-code` replaces 76 when the lock is broken under the
/// command.
fn lost_exit_code(url: &str) {
    let dir = tmpdir();
    let up = dir.path().join("up");
    let holder = Bg::spawn(
        url,
        &[
            "lock",
            "--lost-exit-code",
            "90",
            "--grace",
            "1s",
            "gone",
            "-c",
            &format!("echo up > {}; exec sleep 30", up.display()),
        ],
    );
    wait_file(&up, Duration::from_secs(15));
    ql(url).args(["break", "--yes", "gone"]).assert().success();
    let (code, err) = holder.wait(Duration::from_secs(20));
    assert_eq!(code, 90, "{err}");
}

/// `--write` is the write side: it waits for `--shared` readers and they
/// wait for it, and a plain `lock` waits for it too.
fn write_side_excludes_readers(url: &str) {
    let dir = tmpdir();
    let d = dir.path().display().to_string();
    let reader = Bg::spawn(
        url,
        &[
            "lock",
            "--shared",
            "rw",
            "-c",
            &format!("echo r > {d}/r; sleep 3"),
        ],
    );
    wait_file(&dir.path().join("r"), Duration::from_secs(15));
    ql(url)
        .args(["lock", "--write", "-n", "rw", "--", "true"])
        .assert()
        .code(NOT_ACQUIRED);
    // Another reader shares with the first.
    ql(url)
        .args(["lock", "--shared", "-n", "rw", "--", "true"])
        .assert()
        .success();
    let (code, err) = reader.wait(Duration::from_secs(20));
    assert_eq!(code, 0, "{err}");

    let writer = Bg::spawn(
        url,
        &[
            "lock",
            "--write",
            "rw",
            "-c",
            &format!("echo w > {d}/w; sleep 3"),
        ],
    );
    wait_file(&dir.path().join("w"), Duration::from_secs(15));
    let v = status_json(url, "rw");
    assert_eq!(v["holders"][0]["kind"], "write", "{v}");
    for args in [&["--shared", "-n"][..], &["--write", "-n"], &["-n"]] {
        ql(url)
            .arg("lock")
            .args(args)
            .args(["rw", "--", "true"])
            .assert()
            .code(NOT_ACQUIRED);
    }
    let (code, err) = writer.wait(Duration::from_secs(20));
    assert_eq!(code, 0, "{err}");
}

/// `list` shows a held lock with its token and waiter, nested names, and
/// nothing outside the prefix; `--json` has the same.
fn list_shows_holders_and_waiters(url: &str) {
    let dir = tmpdir();
    let tok = dir.path().join("token");
    let _holder = Bg::spawn(
        url,
        &[
            "lock",
            "jobs/a",
            "-c",
            &format!("echo $QUORUMLOCK_TOKEN > {}; sleep 30", tok.display()),
        ],
    );
    let token = wait_file(&tok, Duration::from_secs(15));
    let _waiter = Bg::spawn(url, &["lock", "jobs/a", "--", "true"]);
    let other = dir.path().join("other");
    let _other = Bg::spawn(
        url,
        &[
            "lock",
            "jobsx",
            "-c",
            &format!("echo up > {}; sleep 30", other.display()),
        ],
    );
    wait_file(&other, Duration::from_secs(15));
    // A name outside the native characters: escaped on the store, listed
    // by its name.
    let odd = dir.path().join("odd");
    let _odd = Bg::spawn(
        url,
        &[
            "lock",
            "odd/42 caf\u{e9}@x",
            "-c",
            &format!("echo up > {}; sleep 30", odd.display()),
        ],
    );
    wait_file(&odd, Duration::from_secs(15));
    wait_waiters(url, "jobs/a", 1);

    let out = ql(url)
        .args(["list", "jobs"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(lines[0].starts_with("jobs/a  exclusive"), "{text}");
    assert!(
        lines[0].contains(&format!("token {token} (exclusive)")),
        "{text}"
    );
    assert!(lines[0].ends_with("waiters 1"), "{text}");

    let out = ql(url)
        .args(["list", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let locks = v["locks"].as_array().unwrap();
    let names: Vec<&str> = locks.iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["jobs/a", "jobsx", "odd/42 caf\u{e9}@x"], "{v}");
    assert_eq!(locks[0]["holders"][0]["token"].to_string(), token, "{v}");
    assert!(
        locks[0]["holders"][0]["session"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "{v}"
    );
    assert_eq!(locks[0]["waiters"].as_array().map(Vec::len), Some(1), "{v}");
    ql(url)
        .args(["list", &"n".repeat(201)])
        .assert()
        .code(USAGE);
    let out = ql(url).args(["list", "odd"]).assert().success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(text.starts_with("odd/42 caf\u{e9}@x  exclusive"), "{text}");
    ql(url)
        .args(["list", "nothing"])
        .assert()
        .success()
        .stdout("");
}

/// `status --watch` prints the lock free, then each holder with its
/// token (holds of 100 ms: it follows the store's notifications, where
/// `--interval`'s default of 500 ms missed them), and ends with 0 on
/// SIGTERM.
fn status_watch_prints_changes(url: &str) {
    let watch = Bg::spawn(url, &["status", "--watch", "watched"]);
    std::thread::sleep(Duration::from_millis(500));
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let out = ql(url)
            .args(["lock", "watched", "-c", "echo $QUORUMLOCK_TOKEN; sleep 0.1"])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        tokens.push(String::from_utf8(out).unwrap().trim().to_string());
    }
    std::thread::sleep(Duration::from_millis(500));
    send(watch.pid(), Signal::SIGTERM);
    let (code, out, err) = watch.wait_output(Duration::from_secs(10));
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines.first().is_some_and(|l| l.contains("watched  free")),
        "{out}"
    );
    assert!(
        lines.last().is_some_and(|l| l.contains("watched  free")),
        "{out}"
    );
    let held: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.contains("held by"))
        .collect();
    assert_eq!(held.len(), 2, "{out}");
    for (line, token) in held.iter().zip(&tokens) {
        assert!(line.contains(&format!("token {token} ")), "{token}: {out}");
    }
}

/// `lock --value` puts the value in our entry; `status`, `status --json`
/// and `list` show it, and a holder without `--value` shows
/// `<hostname>:<pid>` (the pid of that `lock` process).
fn holder_values_shown(url: &str) {
    let dir = tmpdir();
    let tok = dir.path().join("token");
    let script = format!("echo $PPID > {}; sleep 30", tok.display());
    let holder = Bg::spawn(
        url,
        &[
            "lock",
            "--value",
            "deploy by ci#42",
            "valued",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    wait_file(&tok, Duration::from_secs(15));
    let v = status_json(url, "valued");
    assert_eq!(v["holders"][0]["value"], "deploy by ci#42", "{v}");
    ql(url)
        .args(["status", "valued"])
        .assert()
        .success()
        .stdout(predicate::str::contains("value \"deploy by ci#42\""));
    ql(url)
        .args(["list"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "(exclusive) value \"deploy by ci#42\"",
        ));
    send(holder.pid(), Signal::SIGTERM);
    holder.wait(Duration::from_secs(15));

    let pidfile = dir.path().join("pid");
    let script = format!("echo $PPID > {}; sleep 30", pidfile.display());
    let holder = Bg::spawn(url, &["lock", "plain", "--", "sh", "-c", &script]);
    let pid = wait_file(&pidfile, Duration::from_secs(15));
    let v = status_json(url, "plain");
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    assert_eq!(v["holders"][0]["value"], format!("{host}:{pid}"), "{v}");
    send(holder.pid(), Signal::SIGTERM);
    holder.wait(Duration::from_secs(15));
}

/// `elect NAME VALUE -- CMD` runs CMD once leader; a second candidate
/// waits; the leader's loss (a break) stops its command and exits 76, and
/// the second leads with a larger token; `elect --listen` prints each
/// leader as `VALUE<TAB>TOKEN`, in order.
fn elect_and_listen(url: &str) {
    let dir = tmpdir();
    let listen = Bg::spawn(url, &["elect", "--listen", "boss"]);
    let (t1, t2) = (dir.path().join("t1"), dir.path().join("t2"));
    let run = |t: &Path| format!("echo $QUORUMLOCK_TOKEN > {}; sleep 30", t.display());
    let first = Bg::spawn(
        url,
        &["elect", "boss", "first", "--", "sh", "-c", &run(&t1)],
    );
    let tok1: u64 = wait_file(&t1, Duration::from_secs(15)).parse().unwrap();
    let second = Bg::spawn(
        url,
        &["elect", "boss", "second", "--", "sh", "-c", &run(&t2)],
    );
    wait_waiters(url, "boss", 1);
    std::thread::sleep(Duration::from_millis(500));
    assert!(!t2.exists(), "two leaders at once");
    let v = status_json(url, "boss");
    assert_eq!(v["holders"][0]["value"], "first", "{v}");

    ql(url).args(["break", "--yes", "boss"]).assert().success();
    let (code, err) = first.wait(Duration::from_secs(20));
    assert_eq!(code, 76, "{err}");
    let tok2: u64 = wait_file(&t2, Duration::from_secs(20)).parse().unwrap();
    assert!(tok2 > tok1, "{tok2} <= {tok1}");
    // `--listen` polls every 200 ms: a leader shorter than that may be
    // missed, so this one leads for a while.
    std::thread::sleep(Duration::from_millis(1000));
    send(second.pid(), Signal::SIGTERM);
    let (code, err) = second.wait(Duration::from_secs(20));
    assert_eq!(code, 128 + 15, "{err}");

    std::thread::sleep(Duration::from_millis(800));
    send(listen.pid(), Signal::SIGTERM);
    let (code, out, err) = listen.wait_output(Duration::from_secs(20));
    assert_eq!(code, 0, "{err}");
    let leaders: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(
        leaders,
        [format!("first\t{tok1}"), format!("second\t{tok2}")],
        "{out:?}"
    );
}

/// Sends `sig` to `pid`, a child we spawned and have not reaped.
fn send(pid: i32, sig: Signal) {
    kill(Pid::from_raw(pid), sig).unwrap_or_else(|e| panic!("kill {pid} {sig}: {e}"));
}

/// Waits until `name` is held; fails at once, with its stderr, if
/// `holder` exits first. Returns `status --json`.
fn wait_held(url: &str, name: &str, holder: &mut Bg) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let v = status_json(url, name);
        if v["held"] == true {
            return v;
        }
        if let Ok(Some(st)) = holder.0.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = holder.0.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            panic!("the holder of {name} exited ({st}) without holding it: {err}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "{name} never held: {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The lines `bg` prints on stdout, as they come.
fn stdout_lines(bg: &mut Bg) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let out = bg.0.stdout.take().expect("stdout is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// A signal that ends a process by default, other than SIGINT, SIGTERM
/// and SIGHUP, sent to a `lock` holder: before, it killed quorumlock and
/// the lock stayed held for the whole TTL (20 s here). Now it is
/// forwarded to the command like those three; `sleep` dies of it, its
/// status is passed on, and the lock is free at once. A realtime signal,
/// which cannot be forwarded, stops the command with SIGTERM and exits
/// 128+N; a waiter it interrupts leaves no entry behind.
fn other_signals_release_the_lock(url: &str) {
    const TTL: Duration = Duration::from_secs(20);
    let free_at_once = |name: &str, what: &str| {
        let t0 = Instant::now();
        let out = ql(url)
            .args(["lock", "--timeout", "10s", name, "--", "true"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{what}: the lock was not free within TTL/2 after its holder got {what}: {}, {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(t0.elapsed() < TTL / 2, "{what}: {:?}", t0.elapsed());
    };
    let signals = [
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGALRM,
        Signal::SIGQUIT,
    ];
    for sig in signals {
        let name = format!("sig/{}", sig.as_str());
        let mut holder = Bg::spawn(url, &["lock", "--ttl", "20s", &name, "--", "sleep", "60"]);
        wait_held(url, &name, &mut holder);
        send(holder.pid(), sig);
        let (code, err) = holder.wait(Duration::from_secs(15));
        assert_eq!(code, 128 + sig as i32, "{sig}: {err}");
        free_at_once(&name, sig.as_str());
    }

    let mut holder = Bg::spawn(
        url,
        &["lock", "--ttl", "20s", "sig/rt", "--", "sleep", "60"],
    );
    wait_held(url, "sig/rt", &mut holder);
    let sent = StdCommand::new("sh")
        .arg("-c")
        .arg(format!("kill -s RTMIN+1 {}", holder.pid()))
        .status()
        .unwrap();
    assert!(sent.success());
    let (code, err) = holder.wait(Duration::from_secs(15));
    assert_eq!(code, 128 + nix::libc::SIGRTMIN() + 1, "{err}");
    assert!(err.contains("sending SIGTERM to the command"), "{err}");
    free_at_once("sig/rt", "SIGRTMIN+1");

    // While waiting: the wait ends with 128+N and takes its entry along.
    let mut holder = Bg::spawn(url, &["lock", "sig/wait", "--", "sleep", "60"]);
    wait_held(url, "sig/wait", &mut holder);
    let waiter = Bg::spawn(url, &["lock", "--ttl", "20s", "sig/wait", "--", "true"]);
    wait_waiters(url, "sig/wait", 1);
    send(waiter.pid(), Signal::SIGUSR2);
    let (code, err) = waiter.wait(Duration::from_secs(15));
    assert_eq!(code, 128 + Signal::SIGUSR2 as i32, "{err}");
    let v = status_json(url, "sig/wait");
    assert_eq!(v["waiters"].as_array().map(Vec::len), Some(0), "{v}");
    send(holder.pid(), Signal::SIGTERM);
    let (code, err) = holder.wait(Duration::from_secs(15));
    assert_eq!(code, 128 + 15, "{err}");
}

/// A command that handles a forwarded signal goes on, and so does the
/// lock: quorumlock neither dies of the signal nor lets go early.
fn handled_signal_keeps_the_lock(url: &str) {
    let dir = tmpdir();
    let (up, got) = (dir.path().join("up"), dir.path().join("got"));
    let script = format!(
        "trap 'echo got > {got}' USR1; echo up > {up}; while :; do sleep 0.1; done",
        got = got.display(),
        up = up.display()
    );
    let mut holder = Bg::spawn(url, &["lock", "usr1", "--", "sh", "-c", &script]);
    wait_file(&up, Duration::from_secs(15));
    wait_held(url, "usr1", &mut holder);
    send(holder.pid(), Signal::SIGUSR1);
    wait_file(&got, Duration::from_secs(15));
    assert!(
        matches!(holder.0.try_wait(), Ok(None)),
        "quorumlock ended on a signal its command handled"
    );
    assert_eq!(status_json(url, "usr1")["held"], true);
    send(holder.pid(), Signal::SIGTERM);
    let (code, err) = holder.wait(Duration::from_secs(15));
    assert_eq!(code, 128 + 15, "{err}");
}

/// `-n` on a lock held elsewhere prints nothing at all, as flock does
/// (cron mails whatever a job prints): `-E 0` exits 0, without it 75;
/// `--timeout 0` is the same. `-v` says why.
fn nonblock_is_quiet(url: &str) {
    let mut holder = Bg::spawn(url, &["lock", "quiet", "--", "sleep", "60"]);
    wait_held(url, "quiet", &mut holder);
    let cases: [(&[&str], i32); 4] = [
        (&["-n", "-E", "0"], 0),
        (&["-n"], NOT_ACQUIRED),
        (&["--nonblock", "--conflict-exit-code", "3"], 3),
        (&["--timeout", "0"], NOT_ACQUIRED),
    ];
    for (args, code) in cases {
        ql(url)
            .arg("lock")
            .args(args)
            .args(["quiet", "-c", "echo ran"])
            .assert()
            .code(code)
            .stdout("")
            .stderr("");
    }
    ql(url)
        .args(["-v", "lock", "-n", "-E", "0", "quiet", "--", "true"])
        .assert()
        .code(0)
        .stderr(predicate::str::contains("quiet is held by someone else"));
    send(holder.pid(), Signal::SIGTERM);
    let (code, err) = holder.wait(Duration::from_secs(15));
    assert_eq!(code, 128 + 15, "{err}");
}

/// `-s` is `--shared`, as in flock: `-s` holders share, a plain `lock`
/// is refused.
fn short_shared(url: &str) {
    let mut holder = Bg::spawn(url, &["lock", "-s", "rs", "--", "sleep", "60"]);
    let v = wait_held(url, "rs", &mut holder);
    assert_eq!(v["holders"][0]["kind"], "read", "{v}");
    ql(url)
        .args(["lock", "-s", "-n", "rs", "--", "true"])
        .assert()
        .success();
    ql(url)
        .args(["lock", "-n", "rs", "--", "true"])
        .assert()
        .code(NOT_ACQUIRED);
    send(holder.pid(), Signal::SIGTERM);
    let (code, err) = holder.wait(Duration::from_secs(15));
    assert_eq!(code, 128 + 15, "{err}");
}

/// `elect -l` is `elect --listen`, as in etcdctl.
fn elect_short_listen(url: &str) {
    let mut listen = Bg::spawn(url, &["elect", "-l", "chief"]);
    let lines = stdout_lines(&mut listen);
    let dir = tmpdir();
    let tok = dir.path().join("token");
    let script = format!("echo $QUORUMLOCK_TOKEN > {}; exec sleep 60", tok.display());
    let leader = Bg::spawn(url, &["elect", "chief", "one", "--", "sh", "-c", &script]);
    let want = format!("one\t{}", wait_file(&tok, Duration::from_secs(15)));
    let t0 = Instant::now();
    loop {
        let left = Duration::from_secs(15).saturating_sub(t0.elapsed());
        match lines.recv_timeout(left) {
            Ok(line) if line == want => break,
            Ok(_) => {}
            Err(e) => {
                let (code, err) = listen.wait(Duration::from_secs(15));
                panic!("elect -l never printed {want:?} ({e}): exit {code}, {err}");
            }
        }
    }
    send(leader.pid(), Signal::SIGTERM);
    let (code, err) = leader.wait(Duration::from_secs(15));
    assert_eq!(code, 128 + 15, "{err}");
    send(listen.pid(), Signal::SIGTERM);
    let (code, err) = listen.wait(Duration::from_secs(15));
    assert_eq!(code, 0, "{err}");
}

/// As `etcdctl lock NAME CMD` does, the command gets `ETCD_LOCK_KEY` (the
/// key of our entry: under the lock's prefix, named by our lease, as
/// etcdctl's own would be) and `ETCD_LOCK_REV` (its create revision, the
/// fencing token there) on etcd; on a store whose tool gives none, neither.
#[test]
fn etcd_command_gets_etcdctl_lock_variables() {
    let script = r#"echo "key=$ETCD_LOCK_KEY rev=$ETCD_LOCK_REV token=$QUORUMLOCK_TOKEN""#;
    let on_mem = ql("mem://")
        .args(["lock", "jobs/etcdctl-env", "--", "sh", "-c", script])
        .assert()
        .success();
    let line = String::from_utf8_lossy(&on_mem.get_output().stdout).to_string();
    assert!(line.starts_with("key= rev= token="), "{line}");
    let Some(url) = store("QUORUMLOCK_TEST_ETCD_URL") else {
        return;
    };
    let ns = url.rsplit('/').next().unwrap().to_string();
    let on_etcd = ql(&url)
        .args(["lock", "jobs/etcdctl-env", "--", "sh", "-c", script])
        .assert()
        .success();
    let line = String::from_utf8_lossy(&on_etcd.get_output().stdout).to_string();
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [key, rev, token] = fields[..] else {
        panic!("{line}");
    };
    let key = key.strip_prefix("key=").unwrap();
    let lease = key
        .strip_prefix(&format!("{ns}/jobs/etcdctl-env/"))
        .unwrap_or_else(|| panic!("ETCD_LOCK_KEY {key:?} is not under the lock's prefix"));
    assert!(
        !lease.is_empty() && lease.chars().all(|c| c.is_ascii_hexdigit()),
        "{key}"
    );
    let rev = rev.strip_prefix("rev=").unwrap();
    assert!(rev.parse::<u64>().unwrap() > 0, "{line}");
    assert_eq!(rev, token.strip_prefix("token=").unwrap(), "{line}");
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
            fn nonblock_gives_the_conflict_code_at_once() {
                if let Some(url) = store($var) {
                    nonblock_and_conflict_codes(&url);
                }
            }

            #[test]
            fn lost_exit_code_replaces_76() {
                if let Some(url) = store($var) {
                    lost_exit_code(&url);
                }
            }

            #[test]
            fn write_side_excludes_shared_readers() {
                if let Some(url) = store($var) {
                    write_side_excludes_readers(&url);
                }
            }

            #[test]
            fn list_shows_a_held_lock_and_a_waiter() {
                if let Some(url) = store($var) {
                    list_shows_holders_and_waiters(&url);
                }
            }

            #[test]
            fn status_watch_prints_each_change_of_holder() {
                if let Some(url) = store($var) {
                    status_watch_prints_changes(&url);
                }
            }

            #[test]
            fn status_and_list_show_holder_values() {
                if let Some(url) = store($var) {
                    holder_values_shown(&url);
                }
            }

            #[test]
            fn elect_runs_the_command_while_leader_and_listen_prints_leaders() {
                if let Some(url) = store($var) {
                    elect_and_listen(&url);
                }
            }

            #[test]
            fn interrupted_waiter_exits_143_and_leaves_nothing() {
                if let Some(url) = store($var) {
                    interrupted_waiter_leaves_nothing(&url);
                }
            }

            #[test]
            fn other_signals_are_forwarded_and_release_the_lock() {
                if let Some(url) = store($var) {
                    other_signals_release_the_lock(&url);
                }
            }

            #[test]
            fn a_handled_signal_keeps_the_command_and_the_lock() {
                if let Some(url) = store($var) {
                    handled_signal_keeps_the_lock(&url);
                }
            }

            #[test]
            fn nonblock_prints_nothing_when_held() {
                if let Some(url) = store($var) {
                    nonblock_is_quiet(&url);
                }
            }

            #[test]
            fn s_is_shared() {
                if let Some(url) = store($var) {
                    short_shared(&url);
                }
            }

            #[test]
            fn elect_l_is_listen() {
                if let Some(url) = store($var) {
                    elect_short_listen(&url);
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
