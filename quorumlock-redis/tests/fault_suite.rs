//! The shared fault scenarios (`quorumlock_conformance::fault_suite!`) against
//! one real Redis, faulty clients behind the suite's TCP proxy. Sessions
//! use a 3 s TTL so that the scenarios that wait for an expiry stay short.
//! The explorer steps the server's clock (for its namespace's keys) in
//! some schedules.

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
    .with_clock_step(common::step_namespace_clock)));
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
