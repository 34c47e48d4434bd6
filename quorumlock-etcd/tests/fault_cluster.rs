//! The shared cluster fault scenarios against a three-member etcd cluster
//! started on 127.0.0.2-4 (`#[ignore]`d: scripts/chaos.sh runs them with
//! `--include-ignored`).

quorumlock_conformance::cluster_fault_suite!(
    quorumlock_conformance::faults::StoreKind::Etcd,
    |url| async move {
        Ok(
            std::sync::Arc::new(quorumlock_etcd::EtcdBackend::connect(&url).await?)
                as std::sync::Arc<dyn quorumlock_core::backend::Backend>,
        )
    },
    "ttl",
    "2s"
);

// A member cut from its leader while its clients still reach it (each
// link through its own proxy), and the mutant it must catch.
quorumlock_conformance::cluster_link_suite!(
    quorumlock_conformance::faults::StoreKind::Etcd,
    |url| async move {
        Ok(
            std::sync::Arc::new(quorumlock_etcd::EtcdBackend::connect(&url).await?)
                as std::sync::Arc<dyn quorumlock_core::backend::Backend>,
        )
    },
    "ttl",
    "2s"
);
