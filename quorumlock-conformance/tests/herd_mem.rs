//! The herd measurement on the reference model: one release wakes one
//! waiter, whatever the queue length.

use std::sync::Arc;

use quorumlock_conformance::herd::cost_of_one_release;
use quorumlock_conformance::Harness;
use quorumlock_core::backend::Backend;
use quorumlock_core::mem::MemBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_wakes_one_waiter() {
    let base = quorumlock_core::url::parse("mem://herd").unwrap();
    let h = Harness::new("mem", base, |url| async move {
        Ok(Arc::new(MemBackend::connect(&url).await?) as Arc<dyn Backend>)
    })
    .with_option("ttl", "1h");
    let four = cost_of_one_release(&h, 4).await;
    let sixteen = cost_of_one_release(&h, 16).await;
    assert_eq!(four.clients_woken, 2, "{four:?}");
    assert_eq!(
        four, sixteen,
        "the cost of a release grows with the waiters"
    );
}
