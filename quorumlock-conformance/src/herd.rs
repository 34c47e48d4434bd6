//! The cost of one release with N waiters queued: the measurement every
//! backend's herd test runs, so that "herd-free" means the same thing on
//! every store.

use std::time::Duration;

use quorumlock_core::{LockClient, LockGuard};
use tokio::sync::{mpsc, oneshot};

use crate::Harness;

/// What one release cost, over every client of the case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseCost {
    /// Store requests sent by all clients from just before the holder's
    /// release to just after the next holder's grant, plus a settle delay.
    pub requests: u64,
    /// Clients that sent anything in that window (2 when herd-free: the
    /// releaser and the next holder).
    pub clients_woken: usize,
}

fn sent(clients: &[LockClient]) -> Vec<u64> {
    clients
        .iter()
        .map(|c| c.backend().requests_sent())
        .collect()
}

/// What the holder and the waiters take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Herd {
    /// A mutex.
    Mutex,
    /// A mutex whose holder came through the queue (it waited behind a
    /// short holder): on stores where a free lock is taken without
    /// queueing, the next waiter then waits on the holder's own entry.
    MutexQueued,
    /// The write side of a read-write lock.
    Write,
    /// A semaphore of 2 whose older permit stays held throughout: the
    /// released permit is the newer one, the worst case (the first and
    /// the second waiter both watch it).
    Semaphore2,
}

async fn take(c: &LockClient, kind: Herd) -> LockGuard {
    match kind {
        Herd::Mutex | Herd::MutexQueued => c.lock("herd").unwrap().acquire().await.unwrap(),
        Herd::Write => c.rwlock("herd").unwrap().write().await.unwrap(),
        Herd::Semaphore2 => c.semaphore("herd", 2).unwrap().acquire().await.unwrap(),
    }
}

/// Waits until `herd` shows `n` waiters.
async fn wait_waiters(c: &LockClient, n: usize) {
    let start = tokio::time::Instant::now();
    while c.inspect("herd").await.unwrap().waiters.len() < n {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "waiter {} never queued",
            n - 1
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// [`cost_of_release`] of a mutex.
pub async fn cost_of_one_release(h: &Harness, waiters: usize) -> ReleaseCost {
    cost_of_release(h, waiters, Herd::Mutex).await
}

/// Queues `waiters` clients one by one behind a holder of `kind`,
/// releases, and measures. Also asserts that the first in line is served
/// first, alone, and that the rest follow in order. Use a harness with a
/// long TTL ([`Harness::with_option`]) so that keepalives stay out of the
/// window.
pub async fn cost_of_release(h: &Harness, waiters: usize, kind: Herd) -> ReleaseCost {
    let case = h.case();
    let holder = case.client().await;
    let clients = case.clients(waiters).await;
    let other = match kind {
        Herd::Semaphore2 => Some(take(&case.client().await, kind).await),
        _ => None,
    };
    let g = match kind {
        Herd::MutexQueued => {
            let first = take(&case.client().await, kind).await;
            let h = holder.clone();
            let queued = tokio::spawn(async move { take(&h, kind).await });
            wait_waiters(&holder, 1).await;
            first.release().await.unwrap();
            queued.await.unwrap()
        }
        _ => take(&holder, kind).await,
    };

    let (granted_tx, mut granted_rx) = mpsc::unbounded_channel();
    let mut releases = Vec::new();
    let mut tasks = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let (c, granted) = (c.clone(), granted_tx.clone());
        let (rel_tx, rel_rx) = oneshot::channel::<()>();
        releases.push(rel_tx);
        tasks.push(tokio::spawn(async move {
            let g = take(&c, kind).await;
            granted.send(i).unwrap();
            let _ = rel_rx.await;
            g.release().await.unwrap();
        }));
        // Queue them one by one, so the arrival order is known.
        wait_waiters(&holder, i + 1).await;
    }
    // Let every waiter's watch reach the store before measuring.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut everyone = clients.clone();
    everyone.push(holder.clone());

    let before = sent(&everyone);
    g.release().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(30), granted_rx.recv())
        .await
        .expect("no waiter was granted")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = sent(&everyone);
    let cost = ReleaseCost {
        requests: after.iter().sum::<u64>() - before.iter().sum::<u64>(),
        clients_woken: after.iter().zip(&before).filter(|(a, b)| a != b).count(),
    };
    assert_eq!(first, 0, "the first waiter in line was not served first");
    assert!(
        granted_rx.try_recv().is_err(),
        "a second waiter was granted while the first holds"
    );

    // Let the rest go, in order.
    for (i, rel) in releases.into_iter().enumerate() {
        rel.send(()).unwrap();
        if i + 1 < waiters {
            let next = tokio::time::timeout(Duration::from_secs(30), granted_rx.recv())
                .await
                .expect("next waiter not granted")
                .unwrap();
            assert_eq!(next, i + 1, "waiters served out of order");
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    if let Some(o) = other {
        o.release().await.unwrap();
    }
    case.finish().await;
    cost
}
