//! Worker pool: several workers share a queue of jobs, and one lock makes
//! sure that only one job runs at a time. Every write to the shared
//! resource carries the fencing token of the lock it was made under, and
//! the resource rejects a write whose token is lower than one it has
//! already seen.
//!
//! The second half shows why that matters: a worker on "another machine"
//! takes the lock, then stalls (a GC pause, a swapped-out VM, SIGSTOP).
//! Meanwhile its lock is broken — by an operator, or because its session
//! expired — and a healthy worker takes over with a higher token. When the
//! stalled worker wakes up and writes, the resource turns it away.
//!
//! Runs on the embedded `mem://` store with no server:
//!
//! ```sh
//! cargo run -p quorumlock --example worker_pool
//! QUORUMLOCK_URL=etcd://127.0.0.1:2379/demo cargo run -p quorumlock --all-features --example worker_pool
//! ```

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The protected resource: think of a database row, a file in object
/// storage, or a service with a "fencing token" header. It remembers the
/// highest token it has seen and rejects anything older.
#[derive(Default)]
struct FencedResource {
    state: Mutex<ResourceState>,
}

#[derive(Default)]
struct ResourceState {
    highest_token: u64,
    log: Vec<String>,
}

#[derive(Debug)]
struct StaleToken {
    got: u64,
    highest: u64,
}

impl FencedResource {
    /// Accepts the write if `token` is at least the highest seen so far
    /// (the same holder writes several times with one token).
    fn write(&self, token: u64, entry: String) -> Result<(), StaleToken> {
        let mut s = self.state.lock().unwrap();
        if token < s.highest_token {
            return Err(StaleToken {
                got: token,
                highest: s.highest_token,
            });
        }
        s.highest_token = token;
        s.log.push(format!("[token {token:>4}] {entry}"));
        Ok(())
    }
}

#[tokio::main]
async fn main() -> quorumlock::Result<()> {
    let url = std::env::var(quorumlock::URL_ENV).unwrap_or_else(|_| quorumlock::DEFAULT_URL.into());
    let client = quorumlock::connect(&url).await?;
    println!("store: {}", client.backend().describe());

    let resource = Arc::new(FencedResource::default());
    let jobs = Arc::new(Mutex::new((1..=6).collect::<VecDeque<u32>>()));

    // Part 1: four workers drain the queue; the lock serialises the jobs.
    let mut workers = Vec::new();
    for worker in 1..=4 {
        let lock = client.lock("worker_pool/jobs")?;
        let (jobs, resource) = (jobs.clone(), resource.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let guard = lock.acquire().await?;
                let Some(job) = jobs.lock().unwrap().pop_front() else {
                    guard.release().await?;
                    return quorumlock::Result::Ok(());
                };
                let token = guard.token();
                resource
                    .write(token, format!("worker {worker}: job {job} started"))
                    .expect("a current holder is never stale");
                // The job itself. A long job would watch `guard.lost()` in a
                // `select!` and stop when it fires.
                tokio::time::sleep(Duration::from_millis(20)).await;
                resource
                    .write(token, format!("worker {worker}: job {job} finished"))
                    .expect("a current holder is never stale");
                guard.release().await?;
            }
        }));
    }
    for w in workers {
        w.await.expect("worker panicked")?;
    }

    // Part 2: a worker on another machine (its own client, its own
    // session) takes the lock and stalls.
    let other_machine = quorumlock::connect(&url).await?;
    let stalled = other_machine.lock("worker_pool/jobs")?.acquire().await?;
    let stale_token = stalled.token();
    println!("stalled worker holds the lock with token {stale_token}, then pauses");

    // While it is paused, an operator breaks its lock (`quorumlock break
    // --yes worker_pool/jobs`); a session expiry has the same effect.
    client.break_lock("worker_pool/jobs").await?;
    // A healthy worker takes over and writes with a newer token.
    let healthy = client.lock("worker_pool/jobs")?.acquire().await?;
    resource
        .write(healthy.token(), "healthy worker: job 7 finished".into())
        .expect("the new holder is current");
    println!(
        "healthy worker took over with token {} and wrote",
        healthy.token()
    );

    // The stalled worker wakes up. Its guard knows the lock is gone...
    println!(
        "stalled worker wakes up; its guard says held = {} ({})",
        stalled.is_held(),
        stalled.loss().map_or("-".into(), |r| r.to_string())
    );
    // ...but a process that was paused between its check and its write
    // cannot rely on that. The resource is the last line of defence:
    match resource.write(stale_token, "stalled worker: job 7 finished".into()) {
        Ok(()) => panic!("the resource accepted a stale write"),
        Err(e) => println!(
            "resource rejected the stalled worker's write: token {} < {}",
            e.got, e.highest
        ),
    }
    let _ = stalled.release().await; // reports LockLost: it was broken
    healthy.release().await?;

    println!("resource log:");
    for line in &resource.state.lock().unwrap().log {
        println!("  {line}");
    }
    other_machine.close().await;
    client.close().await;
    println!("worker pool done: one job at a time, stale writes rejected");
    Ok(())
}
