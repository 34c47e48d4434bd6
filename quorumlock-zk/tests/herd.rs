//! Herd-freedom on a real ZooKeeper: with N waiters (each its own client
//! and session) queued on one lock, one release costs the same small,
//! constant number of requests and wakes exactly one waiter, for N = 4
//! and N = 16. The same for writers of a read-write lock, and for a
//! semaphore of 2 permits (there a release wakes two clients: the waiter
//! that holds the internal mutex and watches the leases, which takes the
//! freed permit, and the next in the mutex queue, which takes its place).
//!
//! Keepalive reads (one per session every third of the session timeout)
//! are counted by `requests_sent()` too; they are subtracted here
//! (`ZkBackend::keepalives_sent`) because they depend on the clock, not
//! on the release.

use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::Harness;
use quorumlock_core::{LockClient, LockGuard};
use quorumlock_zk::ZkBackend;

const SOON: Duration = Duration::from_secs(15);
const SETTLE: Duration = Duration::from_millis(300);

/// The tests of this file run one at a time: each opens up to 36
/// connections, and ZooKeeper allows 60 per client address by default
/// (`maxClientCnxns`).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
    use quorumlock_core::backend::Backend;
    Cost {
        requests: bs
            .iter()
            .map(|b| b.requests_sent() - b.keepalives_sent())
            .sum(),
        watch_events: bs.iter().map(|b| b.watch_events()).sum(),
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Mutex,
    Write,
    Semaphore2,
}

async fn acquire(c: &LockClient, kind: Kind) -> LockGuard {
    match kind {
        Kind::Mutex => c.lock("herd").unwrap().acquire().await.unwrap(),
        Kind::Write => c.rwlock("herd").unwrap().write().await.unwrap(),
        Kind::Semaphore2 => c.semaphore("herd", 2).unwrap().acquire().await.unwrap(),
    }
}

/// What one release costs with `n` queued waiters.
async fn release_cost(h: &Harness, n: usize, kind: Kind) -> Cost {
    let case = h.case();
    let url = h.url_for(case.namespace());
    let mut backends = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..=n {
        let b = ZkBackend::connect(&url).await.expect("connect");
        clients.push(LockClient::new(Arc::new(b.clone())));
        backends.push(b);
    }
    let holder = acquire(&clients[0], kind).await;
    // A semaphore of 2 gets a second holder that stays.
    let co = match kind {
        Kind::Semaphore2 => {
            let b = ZkBackend::connect(&url).await.expect("connect");
            let c = LockClient::new(Arc::new(b));
            let g = acquire(&c, kind).await;
            Some((c, g))
        }
        _ => None,
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, LockGuard)>();
    for (i, c) in clients.iter().enumerate().skip(1) {
        let (c, tx) = (c.clone(), tx.clone());
        tokio::spawn(async move {
            let g = acquire(&c, kind).await;
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
    eprintln!("{kind:?}, {n} waiters: one release cost {cost:?}");
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
    if let Some((c, g)) = co {
        g.release().await.unwrap();
        c.close().await;
    }
    for c in &clients {
        c.wait_idle().await;
        c.close().await;
    }
    for b in &backends {
        use quorumlock_core::backend::Backend;
        let left = b.leftovers().await.unwrap();
        assert!(left.is_empty(), "{left:?}");
    }
    case.finish().await;
    cost
}

// One test, kinds in turn: ZooKeeper allows 60 connections per client
// address by default (`maxClientCnxns`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_wakes_one_waiter() {
    let Some(h) = harness() else { return };
    let _serial = SERIAL.lock().await;
    for kind in [Kind::Mutex, Kind::Write] {
        let small = release_cost(&h, 4, kind).await;
        let large = release_cost(&h, 16, kind).await;
        // delete by the holder; the next waiter's re-list; its holder watch.
        assert!(small.requests <= 4, "{kind:?}: {small:?}");
        // Exactly one waiter woke up: the next one.
        assert_eq!(small.watch_events, 1, "{kind:?}: {small:?}");
        assert_eq!(
            small, large,
            "{kind:?}: the cost of a release grows with the queue"
        );
    }
    // A semaphore of 2: the lease waiter takes the freed permit and leaves
    // the internal mutex, which wakes the next in its queue.
    let small = release_cost(&h, 4, Kind::Semaphore2).await;
    let large = release_cost(&h, 16, Kind::Semaphore2).await;
    assert_eq!(small.watch_events, 2, "{small:?}");
    assert!(small.requests <= 12, "{small:?}");
    assert_eq!(
        small, large,
        "semaphore: the cost of a release grows with the queue"
    );
}

/// The shared measurement (`quorumlock_conformance::herd`), as every backend
/// runs it: two clients send anything after a release (the releaser and
/// the next holder), for 4 and for 16 waiters. It counts keepalives too,
/// so it needs sessions whose keepalive period (a third of the timeout)
/// is far longer than the measuring window: it asks for 10 minutes and
/// is skipped, loudly, if the server caps the timeout below a minute
/// (`maxSessionTimeout`, by default 20 ticks); `one_release_wakes_one_waiter`
/// above measures the same without keepalives on any server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_cost_of_one_release() {
    let Some(h) = harness() else { return };
    let _serial = SERIAL.lock().await;
    let h = h.with_option("session_timeout", "10m");
    let probe = ZkBackend::connect(&h.url_for("probe"))
        .await
        .expect("connect");
    let granted = probe.negotiated_session_timeout().expect("a session");
    drop(probe);
    if granted < Duration::from_secs(60) {
        assert!(
            std::env::var("QUORUMLOCK_TEST_REQUIRE").as_deref() != Ok("1"),
            "the server caps session timeouts at {granted:?}: set maxSessionTimeout (scripts/stores.sh does)"
        );
        eprintln!(
            "SKIPPED: the server caps session timeouts at {granted:?} (< 60 s; set maxSessionTimeout), \
             so keepalives would fall into the measuring window"
        );
        return;
    }
    let four = quorumlock_conformance::herd::cost_of_one_release(&h, 4).await;
    let sixteen = quorumlock_conformance::herd::cost_of_one_release(&h, 16).await;
    eprintln!("shared measurement: 4 waiters {four:?}, 16 waiters {sixteen:?}");
    assert_eq!(four.clients_woken, 2, "{four:?}");
    assert_eq!(
        four, sixteen,
        "the cost of a release grows with the waiters"
    );
}
