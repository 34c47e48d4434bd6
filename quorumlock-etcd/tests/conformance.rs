//! The shared conformance suite against real etcd servers: 3.4 (the
//! Debian bookworm package) and 3.5 (trixie), each from its own variable:
//! the mutex cases, the read-write lock cases and the semaphore cases.

mod etcd34 {
    quorumlock_conformance::suite!(quorumlock_conformance::Harness::from_env(
        "QUORUMLOCK_TEST_ETCD_URL",
        |url| async move {
            Ok(std::sync::Arc::new(quorumlock_etcd::EtcdBackend::connect(&url).await?) as _)
        },
    ));
}

mod etcd35 {
    quorumlock_conformance::suite!(quorumlock_conformance::Harness::from_env(
        "QUORUMLOCK_TEST_ETCD35_URL",
        |url| async move {
            Ok(std::sync::Arc::new(quorumlock_etcd::EtcdBackend::connect(&url).await?) as _)
        },
    ));
}
