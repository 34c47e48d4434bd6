//! The shared fault scenarios (`conformance_tests::fault_suite!`) against
//! a real ZooKeeper, clients behind a fault-injecting TCP proxy where the
//! scenario needs one. Sessions ask for a 2 s timeout (the dev and CI
//! servers run with tickTime=200 ms, so 2 s is granted) so that the
//! scenarios that wait for an expiry stay short.

conformance_tests::fault_suite!(conformance_tests::faults::FaultTarget::from_env(
    "zk",
    "QUORUMLOCK_TEST_ZK_URL",
    |url| async move { Ok(std::sync::Arc::new(backend_zk::ZkBackend::connect(&url).await?) as _) },
)
.map(|t| t.with_option("session_timeout", "2s")));
