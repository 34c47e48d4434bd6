//! The cases. Each takes a [`Harness`], uses a fresh namespace, asserts
//! something a broken backend would fail, and ends with the leak check.
//! One file per topic; the helpers they share are here.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::{self, StreamExt};
use quorumlock_core::{ErrorKind, LockClient, LockGuard, LossReason};
use tokio::time::Instant;

use crate::{Flavor, Harness};

mod cancel;
mod election;
mod fenced;
mod kinds;
mod limits;
mod list;
mod multi;
mod mutex;
mod names;
mod rwlock;
mod semaphore;
mod session;
mod values;

pub use cancel::*;
pub use election::*;
pub use fenced::*;
pub use kinds::*;
pub use limits::*;
pub use list::*;
pub use multi::*;
pub use mutex::*;
pub use names::*;
pub use rwlock::*;
pub use semaphore::*;
pub use session::*;
pub use values::*;

/// Generous bound for anything that should happen "soon" on a real store.
const SOON: Duration = Duration::from_secs(30);

/// Polls `check` every 20 ms until it holds, panicking after `SOON`.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < SOON, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn waiters(c: &LockClient, name: &str) -> usize {
    c.inspect(name).await.expect("inspect").waiters.len()
}

/// The lock `name` on `c`, as the flavor under test.
#[derive(Debug)]
enum Handle {
    Mutex(quorumlock_core::Lock),
    Semaphore(quorumlock_core::Semaphore),
    Write(quorumlock_core::RwLock),
}

fn handle(f: Flavor, c: &LockClient, name: &str) -> Handle {
    match f {
        Flavor::Mutex => Handle::Mutex(c.lock(name).unwrap()),
        Flavor::Semaphore1 => Handle::Semaphore(c.semaphore(name, 1).unwrap()),
        Flavor::RwWrite => Handle::Write(c.rwlock(name).unwrap()),
    }
}

impl Handle {
    async fn acquire(&self) -> quorumlock_core::Result<LockGuard> {
        match self {
            Handle::Mutex(l) => l.acquire().await,
            Handle::Semaphore(s) => s.acquire().await,
            Handle::Write(rw) => rw.write().await,
        }
    }
    async fn try_acquire(&self) -> quorumlock_core::Result<LockGuard> {
        match self {
            Handle::Mutex(l) => l.try_acquire().await,
            Handle::Semaphore(s) => s.try_acquire().await,
            Handle::Write(rw) => rw.try_write().await,
        }
    }
    async fn acquire_timeout(&self, d: Duration) -> quorumlock_core::Result<LockGuard> {
        match self {
            Handle::Mutex(l) => l.acquire_timeout(d).await,
            Handle::Semaphore(s) => s.acquire_timeout(d).await,
            Handle::Write(rw) => rw.write_timeout(d).await,
        }
    }
}

async fn acquire(f: Flavor, c: &LockClient, name: &str) -> LockGuard {
    tokio::time::timeout(SOON, handle(f, c, name).acquire())
        .await
        .unwrap_or_else(|_| panic!("acquiring {name} took longer than {SOON:?}"))
        .unwrap_or_else(|e| panic!("acquiring {name}: {e}"))
}

async fn wait_lost(g: &LockGuard) -> LossReason {
    tokio::time::timeout(SOON, g.lost())
        .await
        .expect("the loss future did not fire")
}

fn assert_kind<T: std::fmt::Debug>(r: quorumlock_core::Result<T>, kind: ErrorKind, what: &str) {
    match r {
        Err(e) => assert_eq!(e.kind(), kind, "{what}: {e}"),
        Ok(v) => panic!("{what}: expected {kind}, got Ok({v:?})"),
    }
}

/// Counts holders inside the critical section and records every token in
/// the order the holders got the lock.
#[derive(Default)]
struct CriticalSection {
    inside: AtomicUsize,
    overlaps: AtomicUsize,
    tokens: Mutex<Vec<u64>>,
}

impl CriticalSection {
    async fn run(&self, g: &LockGuard) {
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        assert!(
            g.is_held(),
            "guard says not held inside the critical section"
        );
        self.tokens.lock().unwrap().push(g.token());
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    fn check(&self, expected_rounds: usize) {
        assert_eq!(
            self.overlaps.load(Ordering::SeqCst),
            0,
            "two holders at once"
        );
        let tokens = self.tokens.lock().unwrap();
        assert_eq!(tokens.len(), expected_rounds);
        for w in tokens.windows(2) {
            assert!(
                w[0] < w[1],
                "fencing tokens not strictly increasing: {tokens:?}"
            );
        }
    }
}

async fn contend(f: Flavor, clients: &[LockClient], tasks_per_client: usize, rounds: usize) {
    let cs = Arc::new(CriticalSection::default());
    let mut tasks = Vec::new();
    for (ci, c) in clients.iter().enumerate() {
        for t in 0..tasks_per_client {
            let (c, cs) = (c.clone(), cs.clone());
            tasks.push(tokio::spawn(async move {
                for r in 0..rounds {
                    let g = acquire(f, &c, "contended").await;
                    cs.run(&g).await;
                    // Half the releases confirm, half go through Drop.
                    if (ci + t + r) % 2 == 0 {
                        g.release().await.expect("release");
                    } else {
                        drop(g);
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("contender task panicked");
    }
    cs.check(clients.len() * tasks_per_client * rounds);
}
