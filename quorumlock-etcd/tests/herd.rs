//! A release wakes one waiter: the store requests caused by one release
//! (over every client) are a small constant, the same with 4 waiters as
//! with 16; for a mutex, the write side of a read-write lock, and a
//! semaphore of 2 (where a release wakes at most 2 waiters).

use std::sync::Arc;

use quorumlock_conformance::herd::{cost_of_release, Herd};
use quorumlock_conformance::Harness;

/// A harness whose clients use a long lease TTL, so that keepalives (one
/// per TTL/3) do not fall inside the measured window.
fn harness() -> Option<Harness> {
    Harness::from_env("QUORUMLOCK_TEST_ETCD_URL", |url| async move {
        Ok(Arc::new(quorumlock_etcd::EtcdBackend::connect(&url).await?) as _)
    })
    .map(|h| h.with_option("ttl", "120s"))
}

/// Requests sent by all clients between the holder's release and the next
/// holder's grant, plus a settle delay (the shared measurement).
async fn requests_per_release(h: &Harness, waiters: usize, kind: Herd) -> u64 {
    cost_of_release(h, waiters, kind).await.requests
}

/// The cost of one release with 16 waiters is the cost with 4, give or
/// take `extra_watches`: a waiter keeps a second set of watches on what it
/// waits for when the store moved while etcd created the first (issue 20:
/// etcd may serve those late), and a woken waiter cancels them (and may
/// create them again). A herd wakes all 16.
fn assert_same_cost(four: u64, sixteen: u64, extra_watches: u64) {
    assert!(
        four.abs_diff(sixteen) <= extra_watches,
        "the cost of a release grows with the waiters: {four} with 4, {sixteen} with 16"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_costs_the_same_with_4_and_16_waiters() {
    let Some(h) = harness() else { return };
    let four = requests_per_release(&h, 4, Herd::Mutex).await;
    let sixteen = requests_per_release(&h, 16, Herd::Mutex).await;
    eprintln!("requests per release: {four} with 4 waiters, {sixteen} with 16 waiters");
    // release txn + its watch cancel (holder); the waiter's predecessor
    // watch cancel (or two), 1 txn (re-check) and its held watch create:
    // 5 or 6.
    assert!(four <= 10, "{four} requests for one release with 4 waiters");
    assert_same_cost(four, sixteen, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_side_release_costs_the_same_with_4_and_16_waiters() {
    let Some(h) = harness() else { return };
    let four = requests_per_release(&h, 4, Herd::Write).await;
    let sixteen = requests_per_release(&h, 16, Herd::Write).await;
    eprintln!("write side: {four} with 4 waiters, {sixteen} with 16 waiters");
    assert!(four <= 10, "{four} requests for one release with 4 waiters");
    assert_same_cost(four, sixteen, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_release_costs_the_same_with_4_and_16_waiters() {
    let Some(h) = harness() else { return };
    let four = requests_per_release(&h, 4, Herd::Semaphore2).await;
    let sixteen = requests_per_release(&h, 16, Herd::Semaphore2).await;
    eprintln!("semaphore of 2: {four} with 4 waiters, {sixteen} with 16 waiters");
    // Two waiters watch the released permit: each re-reads and watches
    // again; the first is granted.
    assert!(four <= 16, "{four} requests for one release with 4 waiters");
    // Each of the two woken waiters may cancel, and create again, a
    // second watch.
    assert_same_cost(four, sixteen, 4);
}
