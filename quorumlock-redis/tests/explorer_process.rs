//! The explorer's holder process (SIGSTOP past the TTL, then SIGCONT) must
//! catch a holder that still believes when it resumes. Only the process
//! is mutated ([`mutants::late_deadline`]: each confirmation taken for
//! three TTLs, longer than any pause the explorer makes, and no loss ever
//! heard); the schedule's own clients are not, so whatever the explorer
//! finds here, the process fault found.

use std::time::Duration;

use quorumlock_conformance::faults::{explorer, mutants, FaultTarget};

fn target() -> Option<FaultTarget> {
    FaultTarget::from_env("redis", "QUORUMLOCK_TEST_REDIS_URL", |url| async move {
        Ok(std::sync::Arc::new(quorumlock_redis::RedisBackend::connect(&url).await?) as _)
    })
    .map(|t| t.with_option("ttl", "2s"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorer_catches_a_paused_process_that_still_believes() {
    let Some(t) = target() else { return };
    let t = t.with_holder_processes();
    let shape = explorer::Shape {
        run_for: Duration::from_secs(6),
        ..explorer::Shape::default()
    };
    // A schedule has a holder process one time in two and pauses it one
    // time in two of those, once it holds: about one seed in four.
    let mut pauses = 0;
    for seed in 1..=32u64 {
        let o = explorer::explore(&t, seed, shape, None).await;
        pauses += o.faults.process_pauses;
        if let Some(v) = o.violations.first() {
            eprintln!("caught by seed {seed} (after {pauses} pauses): {v}");
            assert!(
                o.faults.process_pauses > 0,
                "seed {seed} found {v:?} without pausing the process"
            );
            return;
        }
    }
    panic!("the explorer missed the process that believes past its pause ({pauses} pauses in 32 schedules)");
}

/// The holder process of the test above (mutated), which runs it;
/// ignored otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a holder process of the explorer, run by it"]
async fn explorer_holder_child() {
    let Some(t) = target() else { return };
    let t = t.wrap_backends(|b| mutants::late_deadline(b, 3));
    explorer::holder_child(&t).await;
}
