//! A release wakes one waiter: the store requests caused by one release
//! (over every client) are a small constant, the same with 4 waiters as
//! with 16, and only the releaser and the next holder send any.

use std::sync::Arc;

use quorumlock_conformance::herd::cost_of_one_release;
use quorumlock_conformance::Harness;

/// A harness whose clients use a one-hour session TTL, so that renewals
/// and mailbox reads (one per TTL/3 each) do not fall inside the measured
/// window.
fn harness() -> Option<Harness> {
    Harness::from_env("QUORUMLOCK_TEST_REDIS_URL", |url| async move {
        Ok(Arc::new(quorumlock_redis::RedisBackend::connect(&url).await?) as _)
    })
    .map(|h| h.with_option("ttl", "1h"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_costs_the_same_with_4_and_16_waiters() {
    let Some(h) = harness() else { return };
    let four = cost_of_one_release(&h, 4).await;
    let sixteen = cost_of_one_release(&h, 16).await;
    eprintln!("one release: {four:?} with 4 waiters, {sixteen:?} with 16 waiters");
    assert_eq!(four.clients_woken, 2, "{four:?}");
    assert_eq!(sixteen.clients_woken, 2, "{sixteen:?}");
    // Releaser: 1 script. Next in line: its mailbox read returns with the
    // grant, it sends the next read and 1 check script. Nobody else: 3.
    assert_eq!(four.requests, 3, "{four:?}");
    assert_eq!(sixteen.requests, 3, "{sixteen:?}");
}
