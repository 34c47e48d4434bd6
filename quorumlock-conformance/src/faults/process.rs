//! A holder in a separate process: stopped with SIGSTOP past its TTL (a
//! GC pause, a frozen VM) and resumed, and killed with SIGKILL.
//!
//! The process is this test binary again, running the ignored test
//! `separate_process_holder_child` ([`process_fault_suite!`](crate::process_fault_suite))
//! with [`CHILD_ENV`] set: it takes the lock, then reports on stdout,
//! every 20 ms, the wall-clock time the report began, whether its guard
//! said held, and whether its fenced write of the store key was accepted.

use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quorumlock_core::LockClient;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use super::cancel::{finish, SETTLE};
use super::{FaultTarget, Row};
use crate::scratch::{remove_scratch, scratch_key};

/// Set in the child: `<target name> <namespace>`.
pub const CHILD_ENV: &str = "QUORUMLOCK_HOLDER_CHILD";

/// The lock the child holds.
const LOCK: &str = "p";

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis()
}

/// The child's side: holds the lock `p` in the namespace it was given and
/// reports until its guard says lost and the store refused its write;
/// then waits to be killed. Returns at once when this process is not a
/// child for `t`.
pub async fn holder_child(t: &FaultTarget) {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let Some((store, ns)) = spec.split_once(' ') else {
        panic!("{CHILD_ENV}={spec:?}: expected '<store> <namespace>'");
    };
    if store != t.name() {
        return;
    }
    let c = t.client(ns).await;
    let key = scratch_key(c.backend().as_ref(), ns, "p");
    let g = c
        .lock(LOCK)
        .unwrap()
        .acquire()
        .await
        .expect("the child's lock");
    println!("HELD {}", g.token());
    loop {
        // The time the tick began: a tick begun before the pause may end
        // after the resume, and its write may have been applied before.
        let began = now_ms();
        let held = g.is_held();
        let write = g
            .fenced_put(key.as_str(), format!("child {}", g.token()))
            .await;
        println!(
            "TICK {began} held={held} write={}",
            if write.is_ok() { "ok" } else { "refused" }
        );
        if !held && write.is_err() {
            println!("DONE");
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The parent kills us.
    std::future::pending::<()>().await;
}

/// This test binary again, running its ignored test `test` (by that name
/// inside any module: a child whose target is not its own returns at
/// once) with `var` set to `value`; stdout piped, killed when dropped.
pub(crate) fn this_test_binary(test: &str, var: &str, value: String) -> Command {
    let exe = std::env::current_exe().expect("the test binary");
    let mut cmd = Command::new(exe);
    cmd.args([test, "--ignored", "--nocapture", "--test-threads=1"])
        .env(var, value)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    cmd
}

/// Sends `sig` (`-STOP`, `-CONT`) to `child` with kill(1); whether it was
/// sent.
pub(crate) fn signal(child: &Child, sig: &str) -> bool {
    child.id().is_some_and(|pid| {
        std::process::Command::new("kill")
            .args([sig, pid.to_string().as_str()])
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// A child of this test binary holding [`LOCK`] in `ns`, and its output.
async fn spawn_child(t: &FaultTarget, ns: &str) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = this_test_binary(
        "separate_process_holder_child",
        CHILD_ENV,
        format!("{} {ns}", t.name()),
    )
    .spawn()
    .expect("spawning the holder process");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let held = tokio::time::timeout(SETTLE, async {
        while let Some(line) = lines.next_line().await.expect("the child's output") {
            // The harness prints `test <name> ... ` with no newline first.
            if line.contains("HELD ") {
                return;
            }
        }
        panic!("the holder process ended before it held the lock");
    });
    held.await
        .expect("the holder process did not take the lock in time");
    (child, lines)
}

/// A holder process paused with SIGSTOP past its TTL: another client gets
/// the lock once the store expired the paused session; resumed, the
/// holder's guard says lost before anything else it does, and its fenced
/// writes are refused (the key keeps the new holder's write). A holder
/// process killed with SIGKILL: the store frees its lock within a few
/// TTLs, and nothing of it is left.
pub async fn separate_process_holder(t: &FaultTarget) -> Row {
    let ns = format!("qlp-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut row = Row::new(t.name(), "separate_process_holder");
    let admin = t.client(&ns).await;
    let ttl = admin.backend().capabilities().session_ttl;
    let key = scratch_key(admin.backend().as_ref(), &ns, "p");

    // Paused past the TTL, then resumed.
    let (mut child, mut lines) = spawn_child(t, &ns).await;
    assert!(signal(&child, "-STOP"), "kill -STOP of the holder failed");
    row.faults += 1;
    let g = admin
        .lock(LOCK)
        .unwrap()
        .acquire_timeout(ttl * 4 + SETTLE)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the paused holder's lock was never freed on {}: {e}",
                t.name()
            )
        });
    g.fenced_put(key.as_str(), "admin").await.unwrap();
    let resumed = now_ms();
    assert!(signal(&child, "-CONT"), "kill -CONT of the holder failed");
    let mut after = 0;
    let report = tokio::time::timeout(SETTLE, async {
        while let Some(line) = lines.next_line().await.expect("the child's output") {
            if line == "DONE" {
                return;
            }
            let Some(rest) = line.strip_prefix("TICK ") else {
                continue;
            };
            let mut parts = rest.split(' ');
            let at: u128 = parts.next().unwrap().parse().unwrap();
            if at < resumed {
                continue;
            }
            after += 1;
            assert_eq!(
                parts.next(),
                Some("held=false"),
                "the resumed holder acted as a holder on {}: {line}",
                t.name()
            );
        }
        panic!("the resumed holder ended without reporting");
    });
    report
        .await
        .unwrap_or_else(|_| panic!("the resumed holder did not report its loss on {}", t.name()));
    assert!(after > 0, "no report after the resume");
    assert_eq!(
        admin.read_key(&key).await.unwrap().as_deref(),
        Some(&b"admin"[..]),
        "a fenced write of the resumed holder was accepted on {}",
        t.name()
    );
    child.kill().await.expect("killing the holder process");
    g.release().await.unwrap();
    row.cycles += 1;

    // Killed.
    let (mut child, _lines) = spawn_child(t, &ns).await;
    child.kill().await.expect("SIGKILL of the holder process");
    row.faults += 1;
    let g = admin
        .lock(LOCK)
        .unwrap()
        .acquire_timeout(ttl * 4 + SETTLE)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the killed holder's lock was never freed on {}: {e}",
                t.name()
            )
        });
    g.release().await.unwrap();
    row.cycles += 1;
    remove_scratch(&admin, &key).await;
    // What a killed process held goes with its session, after its TTL.
    let probe = LockClient::new(t.backend(&ns).await);
    let give_up = tokio::time::Instant::now() + ttl * 4 + SETTLE;
    loop {
        let left = probe.backend().leftovers().await.expect("leftovers");
        if left.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "the killed holder left {left:?} on {}",
            t.name()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    probe.close().await;
    finish(t, &ns, &[&admin], row).await
}

/// Expands to the separate-process holder scenario against the
/// [`FaultTarget`] that `$target` gives (a real store: `mem://` lives in
/// one process), and the ignored test that is its holder process.
#[macro_export]
macro_rules! process_fault_suite {
    ($target:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn separate_process_holder() {
            let Some(target) = $target else { return };
            $crate::faults::process::separate_process_holder(&target).await;
        }

        /// The holder process of `separate_process_holder`, which runs
        /// it; ignored otherwise.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "the holder process of separate_process_holder, run by it"]
        async fn separate_process_holder_child() {
            let Some(target) = $target else { return };
            $crate::faults::process::holder_child(&target).await;
        }
    };
}
