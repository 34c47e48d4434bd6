//! The shared fault scenarios (`quorumlock_conformance::fault_suite!`)
//! against one real PostgreSQL, the faulty clients behind the suite's TCP
//! proxy (their transactions' connections and their sessions' listeners
//! alike), and a holder in a separate process that is stopped and killed
//! (`process_fault_suite!`). Sessions use a 3 s TTL so that the scenarios
//! that wait for an expiry stay short. The explorer steps the server's
//! clock (for its namespace's sessions) in some schedules.

mod common;

fn target() -> Option<quorumlock_conformance::faults::FaultTarget> {
    quorumlock_conformance::faults::FaultTarget::from_env(
        "postgres",
        "QUORUMLOCK_TEST_POSTGRES_URL",
        |url| async move {
            Ok(
                std::sync::Arc::new(quorumlock_postgres::PostgresBackend::connect(&url).await?)
                    as _,
            )
        },
    )
    .map(|t| {
        t.with_option("ttl", "3s")
            .with_clock_step(common::step_namespace_clock)
    })
}

quorumlock_conformance::fault_suite!(target());
quorumlock_conformance::process_fault_suite!(target());
