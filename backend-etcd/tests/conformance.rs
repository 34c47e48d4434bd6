//! The shared conformance suite against real etcd servers: 3.4 (the
//! Debian bookworm package) and 3.5 (trixie), each from its own variable:
//! the mutex cases, the read-write lock cases and the semaphore cases.

mod etcd34 {
    conformance_tests::suite!(conformance_tests::Harness::from_env(
        "QUORUMLOCK_TEST_ETCD_URL",
        |url| async move {
            Ok(std::sync::Arc::new(backend_etcd::EtcdBackend::connect(&url).await?) as _)
        },
    ));
}

mod etcd35 {
    conformance_tests::suite!(conformance_tests::Harness::from_env(
        "QUORUMLOCK_TEST_ETCD35_URL",
        |url| async move {
            Ok(std::sync::Arc::new(backend_etcd::EtcdBackend::connect(&url).await?) as _)
        },
    ));
}
