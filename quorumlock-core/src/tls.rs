//! TLS client settings from the URL's PEM files (`ca=`, `cert=`, `key=`),
//! for the backends whose store client takes a `rustls` configuration
//! (PostgreSQL) and for the handshake [`probe`] of those whose client
//! hides why a handshake failed (ZooKeeper, etcd). The crypto provider is
//! the backend's: this crate links none.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::AsyncReadExt;

use crate::{Error, ErrorKind, Result};

/// The text of the PEM file of URL option `opt` (`ca`, `cert`, `key`).
pub fn read_pem(opt: &str, path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| {
        Error::new(
            ErrorKind::InvalidUrl,
            format!("URL option {opt}={}: cannot read it", path.display()),
        )
        .with_source(e)
    })
}

/// The error of a PEM text that does not parse (`what` names the option).
pub fn bad_pem(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::new(ErrorKind::InvalidUrl, format!("{what}: not usable PEM")).with_source(e)
}

/// The certificates of `ca=`'s PEM text as trust roots; none is an error.
pub fn pem_roots(ca: &str) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        let c = c.map_err(|e| bad_pem("URL option ca=", e))?;
        roots.add(c).map_err(|e| bad_pem("URL option ca=", e))?;
    }
    if roots.is_empty() {
        return Err(Error::new(
            ErrorKind::InvalidUrl,
            "URL option ca=: the file holds no certificate",
        ));
    }
    Ok(roots)
}

/// Whether the server's certificate must name the host the URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostCheck {
    /// The chain and the name (libpq's `verify-full`, every HTTPS client).
    ChainAndName,
    /// The chain only (libpq's `verify-ca`): for servers reached by an
    /// address their certificate does not list.
    ChainOnly,
}

/// A client configuration trusting `roots`, presenting `identity` (the
/// PEM texts of `cert=` and `key=`) when given, with `provider`'s crypto.
pub fn client_config(
    provider: Arc<CryptoProvider>,
    roots: RootCertStore,
    identity: Option<(&str, &str)>,
    check: HostCheck,
) -> Result<rustls::ClientConfig> {
    let internal =
        |e: rustls::Error| Error::new(ErrorKind::Internal, "rustls setup").with_source(e);
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(internal)?;
    let builder = match check {
        HostCheck::ChainAndName => builder.with_root_certificates(roots),
        HostCheck::ChainOnly => {
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| bad_pem("URL option ca=", e))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly(webpki)))
        }
    };
    Ok(match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| bad_pem("URL option cert=", e))?;
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
                .map_err(|e| bad_pem("URL option key=", e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| bad_pem("URL options cert= and key=", e))?
        }
    })
}

/// A TLS handshake with the first of `servers` that accepts a TCP
/// connection, then a short read for the alert a server sends after the
/// handshake when it refuses our certificate (TLS 1.3). `Err` only for an
/// [`ErrorKind::Tls`] verdict; anything else is `Ok`, the store client's
/// to report: `Ok(true)` when a server was reached (its handshake worked
/// and no alert came within a second, or it stayed silent), `Ok(false)`
/// when none accepted a connection (the verdict is still to come). `store` names the store in the message (`"etcd"`).
///
/// Why: a store client that sends its first request as soon as its own
/// handshake ends can meet the server's close before the alert that
/// explains it (the close resets the socket, and the reset discards the
/// alert unread), and reports connection trouble, which is retried until
/// the connect timeout. The probe writes nothing after its handshake, so
/// the alert is read.
///
/// # Cancel Safety
/// Sends nothing but a handshake; safe to drop.
pub async fn probe(
    config: Arc<rustls::ClientConfig>,
    servers: &[(String, u16)],
    store: &str,
) -> Result<bool> {
    let connector = tokio_rustls::TlsConnector::from(config);
    for (host, port) in servers {
        let Ok(name) = ServerName::try_from(host.clone()) else {
            continue;
        };
        let tcp = match tokio::time::timeout(
            Duration::from_secs(3),
            tokio::net::TcpStream::connect((host.as_str(), *port)),
        )
        .await
        {
            Ok(Ok(s)) => s,
            _ => continue,
        };
        let what = format!("{store} {host}:{port}");
        let mut tls = match tokio::time::timeout(
            Duration::from_secs(3),
            connector.connect(name, tcp),
        )
        .await
        {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(probe_error(e, &what)),
            // A server that accepts TCP and stays silent: nothing to say
            // about TLS, and no use asking it again.
            Err(_) => return Ok(true),
        };
        let mut byte = [0u8; 1];
        return match tokio::time::timeout(Duration::from_secs(1), tls.read(&mut byte)).await {
            Ok(Err(e)) => Err(probe_error(e, &what)),
            _ => Ok(true),
        };
    }
    Ok(false)
}

/// The [`ErrorKind::Tls`] error of a handshake or post-handshake read, or
/// an [`ErrorKind::Connection`] error when it is not about TLS.
fn probe_error(e: std::io::Error, what: &str) -> Error {
    match Error::tls_failure(&e, what) {
        Some(t) => t.with_source(e),
        None => Error::new(ErrorKind::Connection, format!("{what}: TLS probe")).with_source(e),
    }
}

/// The WebPKI check without the name check: every other verdict (an
/// unknown issuer, an expired certificate, a bad signature) stands.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(e: rustls::Error) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }

    /// The probe's verdict goes by rustls' error, as tokio-rustls hands
    /// it over (inside an io::Error), not by the error's text.
    #[test]
    fn the_probe_classifies_by_type() {
        let untrusted = io(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        ));
        let e = probe_error(untrusted, "ZooKeeper h:2281");
        assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
        assert!(e.message().contains("check ca="), "{e}");
        let refused = io(rustls::Error::AlertReceived(
            rustls::AlertDescription::BadCertificate,
        ));
        let e = probe_error(refused, "ZooKeeper h:2281");
        assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
        assert!(e.message().contains("cert= and key="), "{e}");
        // Words alone (a reset with a TLS-like message) are not a verdict.
        let text = std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "received fatal alert: BadCertificate",
        );
        let e = probe_error(text, "ZooKeeper h:2281");
        assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    }
}
