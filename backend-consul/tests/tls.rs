//! `consuls://` against the TLS test agent (HTTPS with
//! `verify_incoming_https`): client certificate, CA file, and the errors
//! of a wrong CA and a missing client certificate.

use std::sync::Arc;

async fn connect(url: String) -> lockcore::Result<Arc<dyn lockcore::backend::Backend>> {
    Ok(Arc::new(backend_consul::ConsulBackend::connect(&url).await?) as _)
}

conformance_tests::tls_suite!("QUORUMLOCK_TEST_CONSUL_TLS_URL", connect);
