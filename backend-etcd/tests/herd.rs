//! A release wakes one waiter: the store requests caused by one release
//! (over every client) are a small constant, the same with 4 waiters as
//! with 16; for a mutex, the write side of a read-write lock, and a
//! semaphore of 2 (where a release wakes at most 2 waiters).

use std::sync::Arc;
use std::time::Duration;

use conformance_tests::Harness;
use lockcore::{LockClient, LockGuard};
use tokio::sync::{mpsc, oneshot};

/// A harness whose clients use a long lease TTL, so that keepalives (one
/// per TTL/3) do not fall inside the measured window.
fn harness() -> Option<Harness> {
    Harness::from_env("QUORUMLOCK_TEST_ETCD_URL", |mut url| async move {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .filter(|(k, _)| k != "ttl")
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        url.query_pairs_mut()
            .clear()
            .extend_pairs(pairs)
            .append_pair("ttl", "120s");
        Ok(Arc::new(backend_etcd::EtcdBackend::connect(&url).await?) as _)
    })
}

fn total(clients: &[LockClient]) -> u64 {
    clients.iter().map(|c| c.backend().requests_sent()).sum()
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Mutex,
    Write,
    /// A semaphore of 2 whose older permit stays held throughout.
    Semaphore2,
}

async fn take(c: &LockClient, kind: Kind) -> LockGuard {
    match kind {
        Kind::Mutex => c.lock("herd").unwrap().acquire().await.unwrap(),
        Kind::Write => c.rwlock("herd").unwrap().write().await.unwrap(),
        Kind::Semaphore2 => c.semaphore("herd", 2).unwrap().acquire().await.unwrap(),
    }
}

/// Requests sent by all clients between the holder's release and the next
/// holder's grant, plus a settle delay.
async fn requests_per_release(h: &Harness, waiters: usize, kind: Kind) -> u64 {
    let case = h.case();
    let holder = case.client().await;
    let clients = case.clients(waiters).await;
    // For the semaphore, the released permit is the newer of the two: the
    // worst case (both the first and the second waiter watch it).
    let other = match kind {
        Kind::Semaphore2 => Some(take(&case.client().await, kind).await),
        _ => None,
    };
    let g = take(&holder, kind).await;

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
        let start = tokio::time::Instant::now();
        while holder.inspect("herd").await.unwrap().waiters.len() < i + 1 {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "waiter {i} never queued"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // Let every waiter's watch reach the store before measuring.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut everyone = clients.clone();
    everyone.push(holder.clone());

    let before = total(&everyone);
    g.release().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(30), granted_rx.recv())
        .await
        .expect("no waiter was granted")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let delta = total(&everyone) - before;
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
    delta
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_costs_the_same_with_4_and_16_waiters() {
    let Some(h) = harness() else { return };
    let four = requests_per_release(&h, 4, Kind::Mutex).await;
    let sixteen = requests_per_release(&h, 16, Kind::Mutex).await;
    eprintln!("requests per release: {four} with 4 waiters, {sixteen} with 16 waiters");
    // release txn + its watch cancel (holder); the waiter's predecessor
    // watch cancel, 1 txn (re-check) and its held watch create: 5.
    assert!(four <= 10, "{four} requests for one release with 4 waiters");
    assert_eq!(
        four, sixteen,
        "the cost of a release grows with the waiters"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_side_release_costs_the_same_with_4_and_16_waiters() {
    let Some(h) = harness() else { return };
    let four = requests_per_release(&h, 4, Kind::Write).await;
    let sixteen = requests_per_release(&h, 16, Kind::Write).await;
    eprintln!("write side: {four} with 4 waiters, {sixteen} with 16 waiters");
    assert!(four <= 10, "{four} requests for one release with 4 waiters");
    assert_eq!(
        four, sixteen,
        "the cost of a release grows with the waiters"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_release_costs_the_same_with_4_and_16_waiters() {
    let Some(h) = harness() else { return };
    let four = requests_per_release(&h, 4, Kind::Semaphore2).await;
    let sixteen = requests_per_release(&h, 16, Kind::Semaphore2).await;
    eprintln!("semaphore of 2: {four} with 4 waiters, {sixteen} with 16 waiters");
    // Two waiters watch the released permit: each re-reads and watches
    // again; the first is granted.
    assert!(four <= 16, "{four} requests for one release with 4 waiters");
    assert_eq!(
        four, sixteen,
        "the cost of a release grows with the waiters"
    );
}
