//! The shared fault scenarios (`quorumlock_conformance::fault_suite!`) against
//! a real Consul, clients behind a fault-injecting TCP proxy where the
//! scenario needs one. Sessions use Consul's smallest TTL (10 s) so that
//! the scenarios that wait for an expiry stay short (about 75 s in all).

quorumlock_conformance::fault_suite!(quorumlock_conformance::faults::FaultTarget::from_env(
    "consul",
    "QUORUMLOCK_TEST_CONSUL_URL",
    |url| async move {
        Ok(
            std::sync::Arc::new(quorumlock_consul::ConsulBackend::connect(&url).await?)
                as std::sync::Arc<dyn quorumlock_core::backend::Backend>,
        )
    },
)
.map(|t| t.with_option("ttl", "10s")));
quorumlock_conformance::process_fault_suite!(
    quorumlock_conformance::faults::FaultTarget::from_env(
        "consul",
        "QUORUMLOCK_TEST_CONSUL_URL",
        |url| async move {
            Ok(
                std::sync::Arc::new(quorumlock_consul::ConsulBackend::connect(&url).await?)
                    as std::sync::Arc<dyn quorumlock_core::backend::Backend>,
            )
        },
    )
    .map(|t| t.with_option("ttl", "10s"))
);
