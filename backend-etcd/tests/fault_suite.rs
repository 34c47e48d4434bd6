//! The shared fault scenarios (`conformance_tests::fault_suite!`) against
//! real etcd 3.4 and 3.5, faulty clients behind the suite's TCP proxy.
//! Leases use a 3 s TTL so that the scenarios that wait for an expiry
//! stay short.

mod etcd34 {
    conformance_tests::fault_suite!(conformance_tests::faults::FaultTarget::from_env(
        "etcd34",
        "QUORUMLOCK_TEST_ETCD_URL",
        |url| async move {
            Ok(std::sync::Arc::new(backend_etcd::EtcdBackend::connect(&url).await?) as _)
        },
    )
    .map(|t| t.with_option("ttl", "3s")));
    conformance_tests::process_fault_suite!(conformance_tests::faults::FaultTarget::from_env(
        "etcd34",
        "QUORUMLOCK_TEST_ETCD_URL",
        |url| async move {
            Ok(std::sync::Arc::new(backend_etcd::EtcdBackend::connect(&url).await?) as _)
        },
    )
    .map(|t| t.with_option("ttl", "3s")));
}

mod etcd35 {
    conformance_tests::fault_suite!(conformance_tests::faults::FaultTarget::from_env(
        "etcd35",
        "QUORUMLOCK_TEST_ETCD35_URL",
        |url| async move {
            Ok(std::sync::Arc::new(backend_etcd::EtcdBackend::connect(&url).await?) as _)
        },
    )
    .map(|t| t.with_option("ttl", "3s")));
    conformance_tests::process_fault_suite!(conformance_tests::faults::FaultTarget::from_env(
        "etcd35",
        "QUORUMLOCK_TEST_ETCD35_URL",
        |url| async move {
            Ok(std::sync::Arc::new(backend_etcd::EtcdBackend::connect(&url).await?) as _)
        },
    )
    .map(|t| t.with_option("ttl", "3s")));
}
