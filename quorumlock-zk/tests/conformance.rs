quorumlock_conformance::suite!(quorumlock_conformance::Harness::from_env(
    "QUORUMLOCK_TEST_ZK_URL",
    |url| async move { Ok(std::sync::Arc::new(quorumlock_zk::ZkBackend::connect(&url).await?) as _) },
));
