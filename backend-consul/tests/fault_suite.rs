//! The shared fault scenarios (`conformance_tests::fault_suite!`) against
//! a real Consul, clients behind a fault-injecting TCP proxy where the
//! scenario needs one. Sessions use Consul's smallest TTL (10 s) so that
//! the scenarios that wait for an expiry stay short (about 75 s in all).

conformance_tests::fault_suite!(conformance_tests::faults::FaultTarget::from_env(
    "consul",
    "QUORUMLOCK_TEST_CONSUL_URL",
    |url| async move {
        Ok(
            std::sync::Arc::new(backend_consul::ConsulBackend::connect(&url).await?)
                as std::sync::Arc<dyn lockcore::backend::Backend>,
        )
    },
)
.map(|t| t.with_option("ttl", "10s")));
conformance_tests::process_fault_suite!(conformance_tests::faults::FaultTarget::from_env(
    "consul",
    "QUORUMLOCK_TEST_CONSUL_URL",
    |url| async move {
        Ok(
            std::sync::Arc::new(backend_consul::ConsulBackend::connect(&url).await?)
                as std::sync::Arc<dyn lockcore::backend::Backend>,
        )
    },
)
.map(|t| t.with_option("ttl", "10s")));
