//! `consul://` (plain HTTP) checks no certificate, so it does not read the
//! system's certificate store: a store that cannot be parsed does not keep
//! a client from connecting, and connecting does not pay for parsing it
//! (hundreds of PEM files, for each of a client's two HTTP clients).
//!
//! The store is pointed at by `SSL_CERT_FILE` and `SSL_CERT_DIR`, which
//! rustls-native-certs reads: process-wide, hence this file's one test,
//! which sets them before any other thread runs.

use quorumlock_conformance::support::{env_or_skip as env, unique_namespace};

/// A PEM certificate block whose contents are no certificate: rustls
/// refuses it, and a client that loads the system's roots fails to build
/// when no other root parses.
const NOT_A_CERTIFICATE: &str =
    "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n";

#[test]
fn plain_http_reads_no_system_certificate() {
    let Some(base) = env("QUORUMLOCK_TEST_CONSUL_URL") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("roots.pem");
    std::fs::write(&file, NOT_A_CERTIFICATE).unwrap();
    std::env::set_var("SSL_CERT_FILE", &file);
    std::env::set_var("SSL_CERT_DIR", dir.path().join("no-such-dir"));
    let url = format!("{base}/{}", unique_namespace("plain-http"));
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let backend = quorumlock_consul::ConsulBackend::connect(&url)
            .await
            .expect("consul:// connects whatever the system's certificate store holds");
        let client = quorumlock_core::LockClient::new(std::sync::Arc::new(backend));
        let guard = client.lock("x").unwrap().acquire().await.unwrap();
        guard.release().await.unwrap();
        client.close().await;
    });
}
