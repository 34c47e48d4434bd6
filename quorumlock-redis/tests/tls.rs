//! `rediss://` against the TLS test server (mutual TLS required): CA file
//! and client certificate, and the errors of a wrong CA and a missing
//! client certificate.

use std::sync::Arc;

async fn connect(
    url: String,
) -> quorumlock_core::Result<Arc<dyn quorumlock_core::backend::Backend>> {
    Ok(Arc::new(quorumlock_redis::RedisBackend::connect(&url).await?) as _)
}

quorumlock_conformance::tls_suite!("QUORUMLOCK_TEST_REDIS_TLS_URL", connect);
