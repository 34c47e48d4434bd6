//! The shared cluster fault scenarios against a three-member etcd cluster
//! started on 127.0.0.2-4 (`#[ignore]`d: scripts/chaos.sh runs them with
//! `--include-ignored`).

use std::sync::Arc;

use quorumlock_core::backend::Backend;
use quorumlock_core::url::Url;

async fn connect(url: Url) -> quorumlock_core::Result<Arc<dyn Backend>> {
    Ok(Arc::new(quorumlock_etcd::EtcdBackend::connect(&url).await?))
}

quorumlock_conformance::cluster_fault_suite!(
    quorumlock_conformance::faults::StoreKind::Etcd,
    connect,
    "ttl",
    "2s"
);

// A member cut from its leader while its clients still reach it (each
// link through its own proxy), and the mutant it must catch.
quorumlock_conformance::cluster_link_suite!(
    quorumlock_conformance::faults::StoreKind::Etcd,
    connect,
    "ttl",
    "2s"
);
