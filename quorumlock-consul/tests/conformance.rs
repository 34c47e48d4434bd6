//! The shared conformance suite against a real Consul
//! (`QUORUMLOCK_TEST_CONSUL_URL`, e.g. `consul://127.0.0.1:8500`).

quorumlock_conformance::suite!(quorumlock_conformance::Harness::from_env(
    "QUORUMLOCK_TEST_CONSUL_URL",
    |url| async move {
        Ok(std::sync::Arc::new(quorumlock_consul::ConsulBackend::connect(&url).await?) as _)
    },
));
