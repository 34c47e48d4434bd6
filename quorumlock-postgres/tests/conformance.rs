//! The shared conformance suite against a real PostgreSQL
//! (`QUORUMLOCK_TEST_POSTGRES_URL`, started by `scripts/stores.sh up
//! postgres`): the mutex cases, the read-write lock cases, the semaphore
//! cases, cancellation at every await point and the leak check.

quorumlock_conformance::suite!(quorumlock_conformance::Harness::from_env(
    "QUORUMLOCK_TEST_POSTGRES_URL",
    |url| async move {
        Ok(std::sync::Arc::new(quorumlock_postgres::PostgresBackend::connect(&url).await?) as _)
    },
));
