//! Herd-freedom on a real ZooKeeper: with N waiters (each its own client
//! and session) queued on one lock, one release costs the same small,
//! constant number of requests and wakes exactly one waiter, for N = 4
//! and N = 16.
//!
//! Keepalive reads (one per session every third of the session timeout)
//! are counted by `requests_sent()` too; they are subtracted here
//! (`ZkBackend::keepalives_sent`) because they depend on the clock, not
//! on the release.

use std::sync::Arc;
use std::time::Duration;

use backend_zk::ZkBackend;
use conformance_tests::Harness;
use lockcore::{LockClient, LockGuard};

const SOON: Duration = Duration::from_secs(15);
const SETTLE: Duration = Duration::from_millis(300);

fn harness() -> Option<Harness> {
    Harness::from_env("QUORUMLOCK_TEST_ZK_URL", |url| async move {
        Ok(Arc::new(ZkBackend::connect(&url).await?) as _)
    })
}

#[derive(Debug, PartialEq, Eq)]
struct Cost {
    requests: u64,
    watch_events: u64,
}

fn totals(bs: &[ZkBackend]) -> Cost {
    use lockcore::Backend;
    Cost {
        requests: bs
            .iter()
            .map(|b| b.requests_sent() - b.keepalives_sent())
            .sum(),
        watch_events: bs.iter().map(|b| b.watch_events()).sum(),
    }
}

/// What one release costs with `n` queued waiters.
async fn release_cost(h: &Harness, n: usize) -> Cost {
    let case = h.case();
    let url = h.url_for(case.namespace());
    let mut backends = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..=n {
        let b = ZkBackend::connect(&url).await.expect("connect");
        clients.push(LockClient::new(Arc::new(b.clone())));
        backends.push(b);
    }
    let holder = clients[0].lock("herd").unwrap().acquire().await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, LockGuard)>();
    for (i, c) in clients.iter().enumerate().skip(1) {
        let (c, tx) = (c.clone(), tx.clone());
        tokio::spawn(async move {
            let g = c.lock("herd").unwrap().acquire().await.unwrap();
            let _ = tx.send((i, g));
        });
        tokio::time::timeout(SOON, async {
            while clients[0].inspect("herd").await.unwrap().waiters.len() != i {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("waiter did not queue");
    }
    tokio::time::sleep(SETTLE).await;
    let before = totals(&backends);
    holder.release().await.unwrap();
    let (first, g) = tokio::time::timeout(SOON, rx.recv())
        .await
        .expect("no waiter granted")
        .unwrap();
    tokio::time::sleep(SETTLE).await;
    let after = totals(&backends);
    assert_eq!(first, 1, "the lock skipped the head of the queue");
    let cost = Cost {
        requests: after.requests - before.requests,
        watch_events: after.watch_events - before.watch_events,
    };
    eprintln!("{n} waiters: one release cost {cost:?}");
    // Hand the lock down the queue and clean up.
    drop(g);
    for expect in 2..=n {
        let (i, g) = tokio::time::timeout(SOON, rx.recv())
            .await
            .expect("queue stuck")
            .unwrap();
        assert_eq!(i, expect, "not FIFO");
        g.release().await.unwrap();
    }
    for c in &clients {
        c.wait_idle().await;
        c.close().await;
    }
    for b in &backends {
        use lockcore::Backend;
        let left = b.leftovers().await.unwrap();
        assert!(left.is_empty(), "{left:?}");
    }
    case.finish().await;
    cost
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_wakes_one_waiter() {
    let Some(h) = harness() else { return };
    let small = release_cost(&h, 4).await;
    let large = release_cost(&h, 16).await;
    // delete by the holder; the next waiter's re-list; its holder watch.
    assert!(small.requests <= 4, "{small:?}");
    // Exactly one waiter woke up: the next one.
    assert_eq!(small.watch_events, 1, "{small:?}");
    assert_eq!(small, large, "the cost of a release grows with the queue");
}
