//! The shared fault scenarios (`conformance_tests::fault_suite!`) against
//! one real Redis, faulty clients behind the suite's TCP proxy. Sessions
//! use a 3 s TTL so that the scenarios that wait for an expiry stay short.

conformance_tests::fault_suite!(
    conformance_tests::faults::FaultTarget::from_env(
        "redis",
        "QUORUMLOCK_TEST_REDIS_URL",
        |url| async move {
            Ok(std::sync::Arc::new(backend_redis::RedisBackend::connect(&url).await?) as _)
        },
    )
    .map(|t| t.with_option("ttl", "3s"))
);
conformance_tests::process_fault_suite!(
    conformance_tests::faults::FaultTarget::from_env(
        "redis",
        "QUORUMLOCK_TEST_REDIS_URL",
        |url| async move {
            Ok(std::sync::Arc::new(backend_redis::RedisBackend::connect(&url).await?) as _)
        },
    )
    .map(|t| t.with_option("ttl", "3s"))
);
