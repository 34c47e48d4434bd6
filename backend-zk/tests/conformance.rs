conformance_tests::suite!(conformance_tests::Harness::from_env(
    "QUORUMLOCK_TEST_ZK_URL",
    |url| async move { Ok(std::sync::Arc::new(backend_zk::ZkBackend::connect(&url).await?) as _) },
));
