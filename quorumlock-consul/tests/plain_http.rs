//! `consul://` (plain HTTP) checks no certificate, so it does not read the
//! system's certificate store: a store that cannot be parsed does not keep
//! a client from connecting, and connecting does not pay for parsing it
//! (hundreds of PEM files, for each of a client's two HTTP clients). An
//! `https://` proxy for plain HTTP is the exception: its certificate is
//! checked against that store.
//!
//! The store is pointed at by `SSL_CERT_FILE` and `SSL_CERT_DIR`, which
//! rustls-native-certs reads, the proxy by `http_proxy`: process-wide,
//! hence this file's one test, which sets them before any other thread
//! runs.

use quorumlock_conformance::support::{env_or_skip as env, unique_namespace};
use quorumlock_core::ErrorKind;

/// A PEM certificate block whose contents are no certificate: rustls
/// refuses it, and a client that loads the system's roots fails to build
/// when no other root parses.
const NOT_A_CERTIFICATE: &str =
    "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n";

/// A backend that sends nothing at connect (`lazy=true`), to an address
/// nobody answers on: only the client's own set-up can fail.
const LAZY: &str = "consul://127.0.0.1:1/plain-http?lazy=true";

#[test]
fn plain_http_reads_no_system_certificate() {
    for v in ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"] {
        std::env::remove_var(v);
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("roots.pem");
    std::fs::write(&file, NOT_A_CERTIFICATE).unwrap();
    std::env::set_var("SSL_CERT_FILE", &file);
    std::env::set_var("SSL_CERT_DIR", dir.path().join("no-such-dir"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        quorumlock_consul::ConsulBackend::connect(LAZY)
            .await
            .expect("consul:// builds its clients whatever the system's certificate store holds");
        // The store is read after all for an https:// proxy, and its
        // failure is the client's.
        std::env::set_var("http_proxy", "https://127.0.0.1:1");
        let e = quorumlock_consul::ConsulBackend::connect(LAZY)
            .await
            .expect_err("with an https:// proxy the unparsable store is read");
        assert_eq!(e.kind(), ErrorKind::Internal, "{e:?}");
        std::env::remove_var("http_proxy");
    });
    let Some(base) = env("QUORUMLOCK_TEST_CONSUL_URL") else {
        return;
    };
    let url = format!("{base}/{}", unique_namespace("plain-http"));
    rt.block_on(async {
        let backend = quorumlock_consul::ConsulBackend::connect(&url)
            .await
            .expect("consul:// connects whatever the system's certificate store holds");
        let client = quorumlock_core::LockClient::new(std::sync::Arc::new(backend));
        let guard = client.lock("x").unwrap().acquire().await.unwrap();
        guard.release().await.unwrap();
        client.close().await;
    });
}
