//! TLS to ZooKeeper's `secureClientPort`: the client library's options
//! from the PEM files of the configuration, and a handshake probe that
//! names a certificate problem.
//!
//! Why the probe: `zookeeper-client` logs a failed handshake at debug level
//! and reports only "connection loss", then retries until the session
//! timeout; a wrong CA or a missing client certificate would look like an
//! unreachable server. The probe runs beside the library's own connect and
//! only its TLS verdict is used.

use std::sync::Arc;
use std::time::Duration;

use quorumlock_core::tls::{self, bad_pem, read_pem};
use quorumlock_core::{Error, ErrorKind, Result};
use rustls::pki_types::ServerName;
use tokio::io::AsyncReadExt;
use zookeeper_client as zk;

use crate::config::ZkConfig;

/// The PEM texts of a TLS configuration, read fresh on every connect (so a
/// rotated certificate is picked up by the next session).
pub(crate) struct TlsFiles {
    ca: String,
    identity: Option<(String, String)>,
}

impl TlsFiles {
    /// `None` without `ca=` (plain TCP).
    pub(crate) fn load(config: &ZkConfig) -> Result<Option<TlsFiles>> {
        let Some(ca) = &config.ca_file else {
            return Ok(None);
        };
        let identity = match (&config.client_cert_file, &config.client_key_file) {
            (Some(c), Some(k)) => Some((read_pem("cert", c)?, read_pem("key", k)?)),
            _ => None,
        };
        Ok(Some(TlsFiles {
            ca: read_pem("ca", ca)?,
            identity,
        }))
    }

    /// The client library's TLS options.
    pub(crate) fn options(&self) -> Result<zk::TlsOptions> {
        let mut o = zk::TlsOptions::new()
            .with_pem_ca(&self.ca)
            .map_err(|e| bad_pem("URL option ca=", e))?;
        if let Some((cert, key)) = &self.identity {
            o = o
                .with_pem_identity(cert, key)
                .map_err(|e| bad_pem("URL options cert= and key=", e))?;
        }
        Ok(o)
    }

    fn rustls_config(&self) -> Result<rustls::ClientConfig> {
        tls::client_config(
            Arc::new(rustls::crypto::ring::default_provider()),
            tls::pem_roots(&self.ca)?,
            self.identity
                .as_ref()
                .map(|(c, k)| (c.as_str(), k.as_str())),
            tls::HostCheck::ChainAndName,
        )
    }

    /// A TLS handshake with the first server that accepts a connection,
    /// then a short read for the alert a server sends after the handshake
    /// when it refuses our certificate (TLS 1.3). `Err` only for an
    /// [`ErrorKind::Tls`] verdict; anything else (unreachable, silence) is
    /// the library's to report.
    ///
    /// # Cancel safety
    /// Sends nothing but a handshake; safe to drop.
    pub(crate) async fn probe(&self, servers: &[(String, u16)]) -> Result<()> {
        let config = Arc::new(self.rustls_config()?);
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
            let what = format!("ZooKeeper {host}:{port}");
            let mut tls =
                match tokio::time::timeout(Duration::from_secs(3), connector.connect(name, tcp))
                    .await
                {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => return Err(tls_error(e, &what)),
                    Err(_) => return Ok(()),
                };
            let mut byte = [0u8; 1];
            return match tokio::time::timeout(Duration::from_secs(1), tls.read(&mut byte)).await {
                Ok(Err(e)) => Err(tls_error(e, &what)),
                _ => Ok(()),
            };
        }
        Ok(())
    }
}

/// The [`ErrorKind::Tls`] error of a handshake or post-handshake read, or
/// `Ok`-like silence (`Connection`) when it is not about TLS.
fn tls_error(e: std::io::Error, what: &str) -> Error {
    match Error::tls_failure(&e, what) {
        Some(t) => t.with_source(e),
        None => Error::new(ErrorKind::Connection, format!("{what}: TLS probe")).with_source(e),
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
        let e = tls_error(untrusted, "ZooKeeper h:2281");
        assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
        assert!(e.message().contains("check ca="), "{e}");
        let refused = io(rustls::Error::AlertReceived(
            rustls::AlertDescription::BadCertificate,
        ));
        let e = tls_error(refused, "ZooKeeper h:2281");
        assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
        assert!(e.message().contains("cert= and key="), "{e}");
        // Words alone (a reset with a TLS-like message) are not a verdict.
        let text = std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "received fatal alert: BadCertificate",
        );
        let e = tls_error(text, "ZooKeeper h:2281");
        assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    }
}
