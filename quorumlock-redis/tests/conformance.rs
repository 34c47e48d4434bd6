//! The shared conformance suite against a real Redis
//! (`QUORUMLOCK_TEST_REDIS_URL`, started by `scripts/stores.sh up redis`):
//! the mutex cases, the read-write lock cases and the semaphore cases.

quorumlock_conformance::suite!(quorumlock_conformance::Harness::from_env(
    "QUORUMLOCK_TEST_REDIS_URL",
    |url| async move {
        Ok(std::sync::Arc::new(quorumlock_redis::RedisBackend::connect(&url).await?) as _)
    },
));
