//! `etcds://` against the TLS test server (mutual TLS required): CA file
//! and client certificate, and the errors of a wrong CA and a missing
//! client certificate.

use std::sync::Arc;

async fn connect(url: String) -> lockcore::Result<Arc<dyn lockcore::backend::Backend>> {
    Ok(Arc::new(backend_etcd::EtcdBackend::connect(&url).await?) as _)
}

conformance_tests::tls_suite!("QUORUMLOCK_TEST_ETCD_TLS_URL", connect);
