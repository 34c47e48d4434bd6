//! A holder in a separate process among a schedule's clients, paused with
//! SIGSTOP past its TTL and resumed (a GC pause, a frozen VM) or killed
//! with SIGKILL, as the seed says.
//!
//! The process is the test binary again, running the ignored test
//! `explorer_holder_child` ([`fault_suite!`](crate::fault_suite)) with
//! [`HOLDER_ENV`] set. It prints `ACQUIRING <ms>`, waits for the
//! schedule's first mutex, prints `HELD <token> <ms>`, then every 20 ms `TICK <ms> held=<bool>
//! write=<ok|refused>`: the wall-clock time the tick began, what its
//! guard said, and whether its fenced write of the mutex's store key was
//! accepted. It stops ticking once its guard says lost and the store
//! refused its write; at the end of its stdin it releases, closes its
//! client and prints `CLOSED`.
//!
//! The schedule puts into its history the process's hold, from `HELD`
//! to the last tick that said held (so a tick begun after the resume that
//! still said held overlaps whoever the store granted during the pause),
//! and each of its fenced writes, judged as the other clients' are.

use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, BufReader};

use super::super::process::{signal, this_test_binary};
use super::*;

/// Set in the child: `<target name>\t<namespace>\t<fenced key>`.
pub const HOLDER_ENV: &str = "QUORUMLOCK_EXPLORER_HOLDER";

/// The mutex the process holds.
const LOCK: &str = MUTEXES[0];

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The child's side; returns at once when this process is not a holder
/// process for `t`.
pub async fn holder_child(t: &FaultTarget) {
    let Ok(spec) = std::env::var(HOLDER_ENV) else {
        return;
    };
    let mut parts = spec.split('\t');
    let (Some(store), Some(ns), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
        panic!("{HOLDER_ENV}={spec:?}: expected '<store>\\t<namespace>\\t<key>'");
    };
    if store != t.name() {
        return;
    }
    let c = t.client(ns).await;
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let lock = c.lock(LOCK).expect("the schedule's mutex");
    println!("ACQUIRING {}", now_ms());
    let g = tokio::select! {
        g = lock.acquire() => g,
        _ = stdin.next_line() => {
            c.close().await;
            println!("CLOSED");
            return;
        }
    };
    let g = match g {
        Ok(g) => g,
        Err(e) => {
            println!("FAILED {e}");
            c.close().await;
            println!("CLOSED");
            return;
        }
    };
    println!("HELD {} {}", g.token(), now_ms());
    let mut ended = false;
    loop {
        let began = now_ms();
        let held = g.is_held();
        let write = g.fenced_put(key, g.token().to_string().into_bytes()).await;
        println!(
            "TICK {began} held={held} write={}",
            if write.is_ok() { "ok" } else { "refused" }
        );
        if !held && write.is_err() {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            _ = stdin.next_line() => {
                ended = true;
                break;
            }
        }
    }
    if !ended {
        let _ = stdin.next_line().await;
    }
    let _ = g.release().await;
    c.close().await;
    println!("CLOSED");
}

/// What the seed makes of the holder process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// SIGSTOP past the TTL, then SIGCONT.
    Paused,
    /// SIGKILL.
    Killed,
    /// Nothing: it holds until the schedule ends.
    Spared,
}

/// The process's side of a schedule: spawns it (client number `pci` in
/// the history), faults it as `rng` says while it holds, feeds its hold
/// and writes to the history, and ends it once the schedule stops.
/// Returns what was done to it.
pub(super) async fn holder_process(
    t: &FaultTarget,
    ns: &str,
    pci: usize,
    mut rng: StdRng,
    sh: Arc<Shared>,
    ttl: Duration,
) -> FaultCounts {
    let mut counts = FaultCounts::default();
    let Some(key) = sh.fenced_keys.get(LOCK).cloned() else {
        return counts;
    };
    // When the acquire was called: the child says (`ACQUIRING`); until
    // then, the spawn.
    let mut started = Instant::now();
    let base = (Instant::now(), now_ms());
    let at = |ms: u64| base.0 + Duration::from_millis(ms.saturating_sub(base.1));
    let spawned = this_test_binary(
        "explorer_holder_child",
        HOLDER_ENV,
        format!("{}\t{ns}\t{key}", t.name()),
    )
    .stdin(Stdio::piped())
    .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            sh.errors
                .lock()
                .unwrap()
                .push(format!("spawning the holder process: {e}"));
            return counts;
        }
    };
    let stdin = child.stdin.take();
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let fate = match rng.gen_range(0..4) {
        0 | 1 => Fate::Paused,
        2 => Fate::Killed,
        _ => Fate::Spared,
    };
    let fault_after = Duration::from_millis(rng.gen_range(0..=ttl.as_millis() as u64));
    // Past the TTL, by up to another TTL.
    let ttl_ms = ttl.as_millis() as u64;
    let pause = ttl + Duration::from_millis(rng.gen_range(ttl_ms / 2..=ttl_ms));
    // (hold id, token, the last instant it said held, whether its last
    // report said held)
    let mut hold: Option<(usize, u64, Instant, bool)> = None;
    let mut fault_at: Option<Instant> = None;
    let mut killed_at = None;
    let mut stdin = stdin;
    // Once the schedule stopped: how long the process may take to let go.
    let mut give_up: Option<Instant> = None;
    loop {
        if sh.stop.load(Ordering::SeqCst) {
            // The schedule ended: the process lets go and closes.
            stdin = None;
            fault_at = None;
            let give_up =
                *give_up.get_or_insert_with(|| Instant::now() + ttl * 2 + Duration::from_secs(10));
            if Instant::now() > give_up {
                sh.errors
                    .lock()
                    .unwrap()
                    .push("the holder process did not close after the schedule".into());
                break;
            }
        }
        let wake = fault_at.unwrap_or_else(|| Instant::now() + Duration::from_millis(100));
        let line = match tokio::time::timeout_at(wake, lines.next_line()).await {
            Ok(line) => line,
            Err(_) => {
                if fault_at.take().is_some() {
                    match fate {
                        Fate::Paused => {
                            if signal(&child, "-STOP") {
                                counts.process_pauses += 1;
                                tokio::time::sleep(pause).await;
                                if !signal(&child, "-CONT") {
                                    let _ = child.start_kill();
                                }
                            }
                        }
                        Fate::Killed => {
                            let _ = child.start_kill();
                            killed_at = Some(Instant::now());
                            counts.process_kills += 1;
                        }
                        Fate::Spared => {}
                    }
                }
                continue;
            }
        };
        let Ok(Some(line)) = line else { break };
        if let Some(rest) = line.find("ACQUIRING ").map(|i| &line[i + 10..]) {
            if let Ok(ms) = rest.trim().parse() {
                // Truncated milliseconds: at most a millisecond early,
                // which only widens the window a break is excused in.
                started = at(ms);
            }
        } else if let Some(rest) = line.find("HELD ").map(|i| &line[i + 5..]) {
            let mut p = rest.split(' ');
            let token: u64 = p.next().and_then(|s| s.parse().ok()).unwrap_or(0);
            let id = sh.log.begin(LOCK, pci, Held::Exclusive, token, started);
            // As every hold of the workload does when it is granted.
            let _ = sh.registers[LOCK].write("process", token);
            hold = Some((id, token, Instant::now(), true));
            if stdin.is_some() {
                fault_at = Some(Instant::now() + fault_after);
            }
        } else if let Some(rest) = line.find("TICK ").map(|i| &line[i + 5..]) {
            let mut p = rest.split(' ');
            let began = at(p.next().and_then(|s| s.parse().ok()).unwrap_or(0));
            let held = p.next() == Some("held=true");
            let accepted = p.next() == Some("write=ok");
            if let Some((_, token, last, said_held)) = &mut hold {
                if held && began > *last {
                    *last = began;
                }
                *said_held = held;
                // Milliseconds of the wall clock, truncated: the write may
                // have been sent up to a millisecond before `began` reads.
                let sent = began.checked_sub(Duration::from_millis(2)).unwrap_or(began);
                sh.log
                    .fenced_write(LOCK, pci, *token, sent, Instant::now(), accepted);
            }
        } else if let Some(i) = line.find("FAILED ") {
            sh.errors.lock().unwrap().push(format!(
                "the holder process could not take {LOCK}: {}",
                &line[i + 7..]
            ));
        } else if line.contains("CLOSED") {
            break;
        }
    }
    if let Some((id, _, last, said_held)) = hold {
        // A process that still said held when it was killed believed
        // until it died.
        let end = match killed_at {
            Some(k) if said_held => k.max(last),
            _ => last,
        };
        sh.log.end(id, end, "the holder process's last belief");
    }
    drop(stdin);
    match tokio::time::timeout(ttl * 2 + Duration::from_secs(10), child.wait()).await {
        Ok(_) => {}
        Err(_) => {
            let _ = child.kill().await;
            sh.errors
                .lock()
                .unwrap()
                .push("the holder process did not end after its stdin closed".into());
        }
    }
    counts
}
