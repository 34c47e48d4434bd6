//! The contended measurement again outside the bench's process: an
//! outside check that the bench does not measure itself (its tasks, its
//! counting allocator, its histograms on one runtime of two workers,
//! beside the clients' own tasks). Two shapes: each client in a process
//! of its own (one runtime thread each, as a program holding one lock
//! runs), and all the clients in one other process (on tokio's default
//! runtime, as the bench's own clients are): the program of an outside
//! check with the same API.
//!
//! The parent starts the workers (copies of this program); each connects
//! its clients, opens their sessions (one acquire and release of another
//! lock) and says `ready`; once all are ready the parent says `go` to
//! each, and each client takes and gives back the lock until the run's
//! seconds are over; each worker then prints how many grants its clients
//! had. Only the rate is compared: gaps between processes would need one
//! clock, and the figure to check is the rate.

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use crate::floor::{text, Result};

/// The lock every worker of a run contends for.
const LOCK: &str = "contended-processes";

/// `n` clients contend for one lock of `url` (a run's namespace, used as
/// it is) for `secs`, in `processes` worker processes (`n` divisible by
/// it): handoffs per second, from the parent's `go` to the last worker's
/// end, as [`crate::contended`] counts from its start to its last task's
/// end.
pub async fn contended(url: &str, n: usize, processes: usize, secs: f64) -> Result<Value> {
    let exe = std::env::current_exe().map_err(text)?;
    let mut workers = Vec::new();
    for _ in 0..processes {
        let mut child = Command::new(&exe)
            .args(["--process-worker", "--url", url])
            .arg(format!("--process-clients={}", n / processes))
            .arg(format!("--contended-secs={secs}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(text)?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
        workers.push((child, stdin, stdout));
    }
    for (_, _, out) in &mut workers {
        let line = tokio::time::timeout(Duration::from_secs(60), out.next_line())
            .await
            .map_err(|_| "a worker was not ready in 60 s")?
            .map_err(text)?;
        if line.as_deref() != Some("ready") {
            return Err(format!("a worker said {line:?} instead of ready"));
        }
    }
    let start = Instant::now();
    for (_, stdin, _) in &mut workers {
        stdin.write_all(b"go\n").await.map_err(text)?;
        stdin.flush().await.map_err(text)?;
    }
    // Each worker says its grants when its last release returned (before
    // it closes): the time is taken at the last of them. A worker stuck
    // past the run by a minute fails it.
    let late = Duration::from_secs_f64(secs) + Duration::from_secs(60);
    let mut grants = 0u64;
    for (_, _, out) in &mut workers {
        let line = tokio::time::timeout(late, out.next_line())
            .await
            .map_err(|_| "a worker did not end its run")?
            .map_err(text)?
            .unwrap_or_default();
        let got: u64 = line
            .strip_prefix("grants ")
            .and_then(|g| g.parse().ok())
            .ok_or_else(|| format!("a worker said {line:?} instead of its grants"))?;
        grants += got;
    }
    let elapsed = start.elapsed();
    for (mut child, _, _) in workers {
        let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .map_err(|_| "a worker did not exit")?
            .map_err(text)?;
        if !status.success() {
            return Err(format!("a worker ended with {status}"));
        }
    }
    Ok(json!({
        "clients": n,
        "processes": processes,
        "handoffs": grants,
        "handoffs_per_s": grants as f64 / elapsed.as_secs_f64(),
    }))
}

/// One worker with `clients` clients: what [`contended`] starts.
pub async fn worker(url: &str, clients: usize, secs: f64) -> quorumlock::Result<()> {
    let cs = crate::clients(url, clients).await?;
    for c in &cs {
        c.lock("warm")?.acquire().await?.release().await?;
    }
    println!("ready");
    let mut line = String::new();
    BufReader::new(tokio::io::stdin())
        .read_line(&mut line)
        .await
        .map_err(|e| quorumlock::Error::new(quorumlock::ErrorKind::Internal, e.to_string()))?;
    let run = if line.trim() == "go" {
        contend(&cs, secs).await
    } else {
        // The bench went away before the start: nothing to measure.
        Err(quorumlock::Error::new(
            quorumlock::ErrorKind::Internal,
            format!("the bench said {line:?} instead of go"),
        ))
    };
    if let Ok(grants) = &run {
        println!("grants {grants}");
    }
    // Closed on an error too: nothing of a failed worker stays held.
    for c in &cs {
        c.close().await;
    }
    run.map(drop)
}

/// Each of `cs` takes and gives back [`LOCK`] on a task of its own (as
/// the bench's own contended clients run) for `secs`: the grants of all.
async fn contend(cs: &[quorumlock::LockClient], secs: f64) -> quorumlock::Result<u64> {
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for c in cs {
        let lock = c.lock(LOCK)?;
        tasks.push(tokio::spawn(async move {
            let mut grants = 0u64;
            while Instant::now() < end {
                lock.acquire().await?.release().await?;
                grants += 1;
            }
            Ok::<_, quorumlock::Error>(grants)
        }));
    }
    let mut grants = 0;
    for t in tasks {
        grants += t.await.expect("a worker task panicked")?;
    }
    Ok(grants)
}
