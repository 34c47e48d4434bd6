//! The shared cluster scenarios (leader killed, whole cluster paused or
//! restarted while a lock is held) on a three-server Consul cluster that
//! the test starts on 127.0.0.2-4; our clients talk to the agent of node
//! 0. Runs only with `QUORUMLOCK_TEST_CLUSTERS=1` (and the `consul`
//! binary from `QUORUMLOCK_CONSUL_BIN`).
//!
//! The TTL is 60 s: Consul 1.8 with its default `raft_multiplier` (5)
//! needed about 16 s to elect a new leader after the leader was killed
//! here, and a session survives a leaderless period only if it is shorter
//! than the renew slack, TTL x (0.8 - 0.5) = 18 s at 60 s. With a 10 s TTL
//! every session is (rightly) declared lost during the election.

conformance_tests::cluster_fault_suite!(
    conformance_tests::faults::StoreKind::Consul,
    |url| async move {
        Ok(std::sync::Arc::new(backend_consul::ConsulBackend::connect(&url).await?) as _)
    },
    "ttl",
    "60s"
);
