//! `sslmode=` against the test server's TLS (scripts/stores.sh: the user
//! `quorumlock-test` logs in only over TLS with the test client
//! certificate): the right CA and certificate lock; a wrong CA is a fast
//! `Tls` error; without the client certificate the server refuses the
//! login (`Unauthenticated`, naming the certificate: PostgreSQL asks for
//! it after the handshake, in its own protocol); a name the certificate
//! does not list is refused under `verify-full` and accepted under
//! `verify-ca`; and plain TCP is refused for that user.

use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::tls::{self, TlsStore};
use quorumlock_core::ErrorKind;
use quorumlock_postgres::{PostgresBackend, PostgresConfig};

const VAR: &str = "QUORUMLOCK_TEST_POSTGRES_TLS_URL";

async fn connect(
    url: String,
) -> quorumlock_core::Result<Arc<dyn quorumlock_core::backend::Backend>> {
    Ok(Arc::new(PostgresBackend::connect(&url).await?) as _)
}

#[tokio::test]
async fn verify_full_with_ca_and_client_cert_locks() {
    let Some(s) = TlsStore::from_env(VAR) else {
        return;
    };
    tls::works(&s, "sslmode=verify-full", connect).await;
    tls::works(&s, "sslmode=require", connect).await;
}

#[tokio::test]
async fn wrong_ca_is_a_tls_error() {
    let Some(s) = TlsStore::from_env(VAR) else {
        return;
    };
    tls::wrong_ca_is_a_tls_error(&s, "sslmode=verify-full", connect).await;
    tls::wrong_ca_is_a_tls_error(&s, "sslmode=require", connect).await;
}

#[tokio::test]
async fn missing_client_cert_is_refused_by_the_server() {
    let Some(s) = TlsStore::from_env(VAR) else {
        return;
    };
    let url = s.url_with(&tls::namespace(), &s.ca, false, "sslmode=verify-full");
    let e = tokio::time::timeout(tls::FAIL_FAST, PostgresBackend::connect(&url))
        .await
        .expect("refused fast, not retried")
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");
    assert!(e.to_string().contains("certificate"), "{e}");
}

#[tokio::test]
async fn plain_tcp_is_refused_for_the_tls_user() {
    let Some(s) = TlsStore::from_env(VAR) else {
        return;
    };
    let url = format!("{}/{}", s.url, tls::namespace());
    let e = tokio::time::timeout(tls::FAIL_FAST, PostgresBackend::connect(&url))
        .await
        .expect("refused fast")
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");
}

/// The certificate lists 127.0.0.1, ::1 and localhost. Reached through a
/// name it does not list (the caller's own settings: `hostaddr` is the
/// address, `host` the name checked), `verify-full` refuses the server
/// and `verify-ca` accepts it: the chain is the same, only the name
/// differs.
#[tokio::test]
async fn verify_ca_skips_the_name_verify_full_does_not() {
    let Some(s) = TlsStore::from_env(VAR) else {
        return;
    };
    let url = s.good_url(&tls::namespace(), "sslmode=verify-full");
    let config = PostgresConfig::parse(&url).unwrap();
    let addr: std::net::IpAddr = config.host.parse().expect("the test server by address");
    let pg = |config: &PostgresConfig| {
        let mut pg = quorumlock_postgres::tokio_postgres::Config::new();
        pg.host("not-in-the-certificate.invalid")
            .hostaddr(addr)
            .port(config.port)
            .user(&config.user)
            .dbname(&config.database)
            .ssl_mode(quorumlock_postgres::tokio_postgres::config::SslMode::Require)
            .connect_timeout(Duration::from_secs(5));
        pg
    };
    let e = PostgresBackend::from_client(pg(&config), config.clone())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
    assert!(e.to_string().contains("certificate"), "{e}");

    let config = config.with_sslmode(quorumlock_postgres::SslMode::VerifyCa);
    let backend = PostgresBackend::from_client(pg(&config), config.clone())
        .await
        .unwrap_or_else(|e| panic!("verify-ca checks the chain, not the name: {e}"));
    let client = quorumlock_core::LockClient::new(Arc::new(backend));
    let guard = client
        .lock("name-check")
        .unwrap()
        .acquire_timeout(Duration::from_secs(30))
        .await
        .unwrap();
    guard.release().await.unwrap();
    client.close().await;
}
