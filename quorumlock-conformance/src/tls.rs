//! TLS checks run on every store against its TLS-enabled test server
//! (scripts/stores.sh `*-tls`, every one requiring a client certificate):
//! the right certificates connect and lock; a wrong CA and a missing client
//! certificate are [`ErrorKind::Tls`] errors that name the problem and come
//! back fast (not retried until some timeout).
//!
//! Every backend takes the same URL options: `ca=`, `cert=`, `key=`.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quorumlock_core::backend::Backend;
use quorumlock_core::{ErrorKind, LockClient};

use crate::harness::require;

/// How long a refused handshake may take to come back as an error: a few
/// round trips and a little retry of connection trouble, not a timeout.
pub const FAIL_FAST: Duration = Duration::from_secs(8);

/// A TLS-enabled store from the environment and the test certificates.
#[derive(Debug, Clone)]
pub struct TlsStore {
    /// Base URL, e.g. `etcds://127.0.0.1:2389` (no path, no query).
    pub url: String,
    /// The CA that signed the server's and the client's certificates.
    pub ca: String,
    /// Client certificate and key (PEM).
    pub cert: String,
    /// The client certificate's key.
    pub key: String,
    /// An unrelated CA: the wrong one.
    pub other_ca: String,
}

impl TlsStore {
    /// The store in `var` and the certificates in `QUORUMLOCK_TEST_TLS_*`.
    /// Unset: a loud skip (`None`), or a panic with `QUORUMLOCK_TEST_REQUIRE=1`.
    pub fn from_env(var: &str) -> Option<TlsStore> {
        let get = |v: &str| std::env::var(v).ok().filter(|s| !s.is_empty());
        let all = (
            get(var),
            get("QUORUMLOCK_TEST_TLS_CA"),
            get("QUORUMLOCK_TEST_TLS_CERT"),
            get("QUORUMLOCK_TEST_TLS_KEY"),
            get("QUORUMLOCK_TEST_TLS_OTHER_CA"),
        );
        match all {
            (Some(url), Some(ca), Some(cert), Some(key), Some(other_ca)) => Some(TlsStore {
                url,
                ca,
                cert,
                key,
                other_ca,
            }),
            _ if require() => panic!(
                "{var} or QUORUMLOCK_TEST_TLS_* is not set and QUORUMLOCK_TEST_REQUIRE=1: \
                 this test needs its TLS store (run scripts/test.sh)"
            ),
            _ => {
                eprintln!(
                    "SKIPPED: {var} is not set; start the TLS stores with scripts/stores.sh up"
                );
                None
            }
        }
    }

    /// A URL for namespace `ns` trusting `ca`, with the client certificate
    /// when `client_cert` is set, and `extra` query options (`a=b&c=d`).
    pub fn url_with(&self, ns: &str, ca: &str, client_cert: bool, extra: &str) -> String {
        let mut u = format!("{}/{ns}?ca={ca}", self.url);
        if client_cert {
            u += &format!("&cert={}&key={}", self.cert, self.key);
        }
        if !extra.is_empty() {
            u += "&";
            u += extra;
        }
        u
    }

    /// The URL that works: the right CA and the client certificate.
    pub fn good_url(&self, ns: &str, extra: &str) -> String {
        self.url_with(ns, &self.ca, true, extra)
    }
}

/// A fresh namespace for one test.
pub fn namespace() -> String {
    format!("qltls-{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// Connects with `url` and takes a lock: the first error of the two.
async fn connect_and_lock<F, Fut>(connect: &F, url: String) -> quorumlock_core::Result<()>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = quorumlock_core::Result<Arc<dyn Backend>>>,
{
    let backend = connect(url).await?;
    let client = LockClient::new(backend);
    let guard = client
        .lock("tls-check")?
        .acquire_timeout(Duration::from_secs(30))
        .await?;
    guard.release().await?;
    client.close().await;
    Ok(())
}

/// The right CA and the client certificate: a lock is taken and released,
/// twice (the second time by a second client, so the first released).
pub async fn works<F, Fut>(store: &TlsStore, extra: &str, connect: F)
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = quorumlock_core::Result<Arc<dyn Backend>>>,
{
    let ns = namespace();
    for _ in 0..2 {
        connect_and_lock(&connect, store.good_url(&ns, extra))
            .await
            .unwrap_or_else(|e| panic!("TLS with the right certificates failed: {e}"));
    }
}

/// `url` fails with [`ErrorKind::Tls`] within [`FAIL_FAST`], the message
/// containing one of `words`.
async fn refused<F, Fut>(connect: &F, url: String, words: &[&str], why: &str)
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = quorumlock_core::Result<Arc<dyn Backend>>>,
{
    let start = Instant::now();
    let r = tokio::time::timeout(FAIL_FAST * 3, connect_and_lock(connect, url)).await;
    let took = start.elapsed();
    let e = match r {
        Err(_) => panic!("{why}: no error within {:?} (retried?)", FAIL_FAST * 3),
        Ok(Ok(())) => panic!("{why}: connected and locked"),
        Ok(Err(e)) => e,
    };
    assert_eq!(e.kind(), ErrorKind::Tls, "{why}: {e}");
    let text = e.to_string();
    assert!(
        words.iter().any(|w| text.contains(w)),
        "{why}: the message names none of {words:?}: {text}"
    );
    assert!(took < FAIL_FAST, "{why}: took {took:?}: {text}");
}

/// A CA that did not sign the server's certificate: [`ErrorKind::Tls`]
/// naming the untrusted certificate, fast.
pub async fn wrong_ca_is_a_tls_error<F, Fut>(store: &TlsStore, extra: &str, connect: F)
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = quorumlock_core::Result<Arc<dyn Backend>>>,
{
    let url = store.url_with(&namespace(), &store.other_ca, true, extra);
    refused(
        &connect,
        url,
        &["UnknownIssuer", "certificate"],
        "a wrong CA",
    )
    .await;
}

/// No client certificate for a server that requires one:
/// [`ErrorKind::Tls`] saying the server refused the handshake, fast.
pub async fn missing_client_cert_is_a_tls_error<F, Fut>(store: &TlsStore, extra: &str, connect: F)
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = quorumlock_core::Result<Arc<dyn Backend>>>,
{
    let url = store.url_with(&namespace(), &store.ca, false, extra);
    refused(
        &connect,
        url,
        &["alert", "certificate"],
        "no client certificate",
    )
    .await;
}

/// Expands to the three TLS tests above for one store: `$var` names the
/// environment variable of its TLS test server, `$connect` is an
/// `async fn(String) -> quorumlock_core::Result<Arc<dyn Backend>>`.
///
/// ```ignore
/// quorumlock_conformance::tls_suite!("QUORUMLOCK_TEST_ETCD_TLS_URL", connect);
/// ```
#[macro_export]
macro_rules! tls_suite {
    ($var:expr, $connect:expr) => {
        #[tokio::test]
        async fn tls_with_ca_and_client_cert_locks() {
            let Some(s) = $crate::tls::TlsStore::from_env($var) else {
                return;
            };
            $crate::tls::works(&s, "", $connect).await;
        }

        #[tokio::test]
        async fn wrong_ca_is_a_tls_error() {
            let Some(s) = $crate::tls::TlsStore::from_env($var) else {
                return;
            };
            $crate::tls::wrong_ca_is_a_tls_error(&s, "", $connect).await;
        }

        #[tokio::test]
        async fn missing_client_cert_is_a_tls_error() {
            let Some(s) = $crate::tls::TlsStore::from_env($var) else {
                return;
            };
            $crate::tls::missing_client_cert_is_a_tls_error(&s, "", $connect).await;
        }
    };
}
