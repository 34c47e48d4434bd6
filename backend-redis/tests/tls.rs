//! `rediss://` against the TLS test server (mutual TLS required): CA file
//! and client certificate, and the errors of a wrong CA and a missing
//! client certificate.

use std::sync::Arc;

use conformance_tests::tls::{self, TlsStore};

fn store() -> Option<TlsStore> {
    TlsStore::from_env("QUORUMLOCK_TEST_REDIS_TLS_URL")
}

async fn connect(url: String) -> lockcore::Result<Arc<dyn lockcore::backend::Backend>> {
    Ok(Arc::new(backend_redis::RedisBackend::connect(&url).await?) as _)
}

#[tokio::test]
async fn tls_with_ca_and_client_cert_locks() {
    let Some(s) = store() else { return };
    tls::works(&s, "", connect).await;
}

#[tokio::test]
async fn wrong_ca_is_a_tls_error() {
    let Some(s) = store() else { return };
    tls::wrong_ca_is_a_tls_error(&s, "", connect).await;
}

#[tokio::test]
async fn missing_client_cert_is_a_tls_error() {
    let Some(s) = store() else { return };
    tls::missing_client_cert_is_a_tls_error(&s, "", connect).await;
}
