//! The shared fault scenarios (`quorumlock_conformance::fault_suite!`) against
//! one real Redis, faulty clients behind the suite's TCP proxy. Sessions
//! use a 3 s TTL so that the scenarios that wait for an expiry stay short.
//! The explorer steps the server's clock (for its namespace's keys) in
//! some schedules, deletes a lock's entries by hand (`DEL`) in some
//! rounds; and it fails over a primary and replica of its own
//! (`explore_random_schedules_with_failovers`).

mod common;

quorumlock_conformance::fault_suite!(quorumlock_conformance::faults::FaultTarget::from_env(
    "redis",
    "QUORUMLOCK_TEST_REDIS_URL",
    |url| async move {
        Ok(std::sync::Arc::new(quorumlock_redis::RedisBackend::connect(&url).await?) as _)
    },
)
.map(|t| t
    .with_option("ttl", "3s")
    .with_clock_step(common::step_namespace_clock)
    .with_entry_delete(common::delete_lock_entries)));
quorumlock_conformance::process_fault_suite!(
    quorumlock_conformance::faults::FaultTarget::from_env(
        "redis",
        "QUORUMLOCK_TEST_REDIS_URL",
        |url| async move {
            Ok(std::sync::Arc::new(quorumlock_redis::RedisBackend::connect(&url).await?) as _)
        },
    )
    .map(|t| t.with_option("ttl", "3s"))
);

/// The explorer over a primary and its replica of this test: in every
/// schedule the replication link is cut, a client takes a mutex (a grant
/// the replica never gets), the workload goes on, and the replica is
/// promoted, the clients moved to it. The checker holds the store to what
/// section "Failover" of the README promises: tokens keep growing, the
/// lost holder's fenced writes are refused, it is told within a TTL (at
/// its next renewal), and nothing is left behind. Schedules run one at a
/// time (a failover hits every namespace); `scripts/chaos.sh` gives it
/// its share of the explorer's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explore_random_schedules_with_failovers() {
    let Some(bin) = common::pair::server_binary() else {
        return;
    };
    let pair = std::sync::Arc::new(common::pair::Pair::start(&bin).await);
    quorumlock_conformance::faults::explorer::explore_random_schedules(&pair.target("3s")).await;
    // (A replayed seed may end before its failover.)
    if std::env::var_os("QUORUMLOCK_EXPLORE_SEED").is_none() {
        assert!(
            pair.failovers() > 0,
            "no schedule failed the pair over: the fault was not explored"
        );
    }
}
