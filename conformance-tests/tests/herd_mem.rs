//! The herd measurement on the reference model: one release wakes one
//! waiter, whatever the queue length.

use std::sync::Arc;

use conformance_tests::herd::cost_of_one_release;
use conformance_tests::Harness;
use lockcore::backend::Backend;
use lockcore::mem::MemBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_wakes_one_waiter() {
    let base = lockcore::url::parse("mem://herd").unwrap();
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
