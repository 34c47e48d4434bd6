//! `consuls://` against the TLS test agent (HTTPS with
//! `verify_incoming_https`): client certificate, CA file, and the errors
//! of a wrong CA and a missing client certificate.

use std::sync::Arc;

async fn connect(
    url: String,
) -> quorumlock_core::Result<Arc<dyn quorumlock_core::backend::Backend>> {
    Ok(Arc::new(quorumlock_consul::ConsulBackend::connect(&url).await?) as _)
}

quorumlock_conformance::tls_suite!("QUORUMLOCK_TEST_CONSUL_TLS_URL", connect);
