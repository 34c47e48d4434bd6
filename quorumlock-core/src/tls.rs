//! TLS client settings from the URL's PEM files (`ca=`, `cert=`, `key=`),
//! for the backends whose store client takes a `rustls` configuration
//! (ZooKeeper's handshake probe, PostgreSQL). The crypto provider is the
//! backend's: this crate links none.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

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
