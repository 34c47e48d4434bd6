//! Mutants that only the explorer's faults on a real store catch.
//!
//! - The holder process (SIGSTOP past the TTL, then SIGCONT) must catch a
//!   holder that still believes when it resumes. Only the process is
//!   mutated ([`mutants::late_deadline`]: each confirmation taken for
//!   three TTLs, longer than any pause the explorer makes, and no loss
//!   ever heard); the schedule's own clients are not, so whatever the
//!   explorer finds there, the process fault found.
//! - The clock step (the server's clock forward by less than TTL/5 while
//!   a client's link is blackholed) must catch a client whose local
//!   deadline keeps no margin ([`mutants::no_margin`]), which nothing
//!   else the explorer does can tell from a correct one.
//! - The failover (a primary and its replica, the replication link cut
//!   before a grant, then the replica promoted) must catch a client that
//!   never hears that one of its entries is gone
//!   ([`mutants::deaf_to_entry_loss`]): the lost holder believes on,
//!   while a break's holder, as deaf, is already judged ended at the
//!   break and fenced off.
//! - An operator's `DEL` of a lock's entries (which tells nobody; the
//!   holder hears of it at its next renewal) must catch a release that
//!   answers `Ok` for an entry the store no longer has
//!   ([`mutants::release_ignores_gone_entry`]): the checker holds every
//!   release's outcome against the breaks before it.

mod common;

use std::time::Duration;

use quorumlock_conformance::faults::{explorer, mutants, FaultTarget};

fn target() -> Option<FaultTarget> {
    FaultTarget::from_env("redis", "QUORUMLOCK_TEST_REDIS_URL", |url| async move {
        Ok(std::sync::Arc::new(quorumlock_redis::RedisBackend::connect(&url).await?) as _)
    })
    .map(|t| t.with_option("ttl", "2s"))
}

fn shape() -> explorer::Shape {
    explorer::Shape {
        run_for: Duration::from_secs(6),
        ..explorer::Shape::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorer_catches_a_paused_process_that_still_believes() {
    let Some(t) = target() else { return };
    let t = t.with_holder_processes();
    let shape = shape();
    // A schedule has a holder process one time in two and pauses it one
    // time in two of those, once it holds: about one seed in four.
    let mut pauses = 0;
    for seed in 1..=32u64 {
        let o = explorer::explore(&t, seed, shape, None).await;
        pauses += o.faults.process_pauses;
        if let Some(v) = o.violations.first() {
            eprintln!("caught by seed {seed} (after {pauses} pauses): {v}");
            // The process is client 3 (after the workload's three).
            assert!(
                o.faults.process_pauses > 0
                    && v.contains("two holders at once")
                    && v.contains("client 3 "),
                "seed {seed} found {o:?}, not the paused process's belief"
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

/// A step of the server's clock by less than TTL/5 (the margin) while a
/// client's renewals cannot get through: a correct client's local
/// deadline passes before its session's stepped expiry, a client without
/// the margin believes until after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorer_catches_a_deadline_without_margin_by_a_clock_step() {
    let Some(t) = target() else { return };
    let t = t
        .with_clock_step(common::step_namespace_clock)
        .wrap_backends(mutants::no_margin);
    let mut steps = 0;
    for seed in 1..=32u64 {
        let o = explorer::explore(&t, seed, shape(), None).await;
        eprintln!("seed {seed}: {} holds, faults: {}", o.holds, o.faults);
        steps += o.faults.clock_steps;
        if let Some(v) = o.violations.first() {
            eprintln!("caught by seed {seed} (after {steps} clock steps): {v}");
            assert!(
                o.faults.clock_steps > 0,
                "seed {seed} found {v:?} without a clock step"
            );
            return;
        }
    }
    panic!("the explorer missed the deadline without margin ({steps} clock steps in 32 schedules)");
}

/// A failover that loses a grant: the holder must be told within a TTL
/// (at its next renewal, which finds its entry gone); a client deaf to
/// its entries' losses believes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorer_catches_a_client_deaf_to_entry_loss_by_a_failover() {
    let Some(bin) = common::pair::server_binary() else {
        return;
    };
    let pair = std::sync::Arc::new(common::pair::Pair::start(&bin).await);
    let t = pair.target("2s").wrap_backends(mutants::deaf_to_entry_loss);
    for seed in 1..=16u64 {
        let o = explorer::explore(&t, seed, shape(), None).await;
        eprintln!("seed {seed}: {} holds, faults: {}", o.holds, o.faults);
        if let Some(v) = o.violations.first() {
            eprintln!(
                "caught by seed {seed} (after {} failovers): {v}",
                pair.failovers()
            );
            assert!(
                o.faults.failovers > 0 && v.contains("a TTL after a failover lost its grant"),
                "seed {seed} found {v:?}, not the lost holder's belief"
            );
            return;
        }
    }
    panic!(
        "the explorer missed the client deaf to its entries' loss ({} failovers in 16 schedules)",
        pair.failovers()
    );
}

/// A release called after an operator deleted its entry must not answer
/// `Ok` (the store no longer has the entry); the explorer's operator
/// deletes must catch a client whose release does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorer_catches_a_release_that_ignores_its_gone_entry() {
    let Some(t) = target() else { return };
    let t = t
        .with_entry_delete(common::delete_lock_entries)
        .wrap_backends(mutants::release_ignores_gone_entry);
    let mut deletes = 0;
    for seed in 1..=32u64 {
        let o = explorer::explore(&t, seed, shape(), None).await;
        eprintln!("seed {seed}: {} holds, faults: {}", o.holds, o.faults);
        deletes += o.faults.operator_deletes;
        if let Some(v) = o.violations.first() {
            eprintln!("caught by seed {seed} (after {deletes} operator deletes): {v}");
            assert!(
                v.contains("returned Ok although a break"),
                "seed {seed} found {v:?}, not a release that ignored its gone entry"
            );
            return;
        }
    }
    panic!("the explorer missed the release that ignores its gone entry ({deletes} operator deletes in 32 schedules)");
}
