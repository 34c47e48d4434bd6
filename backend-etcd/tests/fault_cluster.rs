//! The shared cluster fault scenarios against a three-member etcd cluster
//! started on 127.0.0.2-4 (`#[ignore]`d: scripts/chaos.sh runs them with
//! `--include-ignored`).

conformance_tests::cluster_fault_suite!(
    conformance_tests::faults::StoreKind::Etcd,
    |url| async move {
        Ok(
            std::sync::Arc::new(backend_etcd::EtcdBackend::connect(&url).await?)
                as std::sync::Arc<dyn lockcore::backend::Backend>,
        )
    },
    "ttl",
    "2s"
);
