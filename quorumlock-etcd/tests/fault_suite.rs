//! The shared fault scenarios (`quorumlock_conformance::fault_suite!`) against
//! real etcd 3.4 and 3.5, faulty clients behind the suite's TCP proxy.
//! Leases use a 3 s TTL so that the scenarios that wait for an expiry
//! stay short.

mod etcd34 {
    quorumlock_conformance::fault_suite!(quorumlock_conformance::faults::FaultTarget::from_env(
        "etcd34",
        "QUORUMLOCK_TEST_ETCD_URL",
        |url| async move {
            Ok(std::sync::Arc::new(quorumlock_etcd::EtcdBackend::connect(&url).await?) as _)
        },
    )
    .map(|t| t.with_option("ttl", "3s")));
    quorumlock_conformance::process_fault_suite!(
        quorumlock_conformance::faults::FaultTarget::from_env(
            "etcd34",
            "QUORUMLOCK_TEST_ETCD_URL",
            |url| async move {
                Ok(std::sync::Arc::new(quorumlock_etcd::EtcdBackend::connect(&url).await?) as _)
            },
        )
        .map(|t| t.with_option("ttl", "3s"))
    );
}

mod etcd35 {
    quorumlock_conformance::fault_suite!(quorumlock_conformance::faults::FaultTarget::from_env(
        "etcd35",
        "QUORUMLOCK_TEST_ETCD35_URL",
        |url| async move {
            Ok(std::sync::Arc::new(quorumlock_etcd::EtcdBackend::connect(&url).await?) as _)
        },
    )
    .map(|t| t.with_option("ttl", "3s")));
    quorumlock_conformance::process_fault_suite!(
        quorumlock_conformance::faults::FaultTarget::from_env(
            "etcd35",
            "QUORUMLOCK_TEST_ETCD35_URL",
            |url| async move {
                Ok(std::sync::Arc::new(quorumlock_etcd::EtcdBackend::connect(&url).await?) as _)
            },
        )
        .map(|t| t.with_option("ttl", "3s"))
    );
}
