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

use quorumlock_core::tls::{self, bad_pem, read_pem};
use quorumlock_core::Result;
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

    /// [`tls::probe`] with this configuration.
    ///
    /// # Cancel Safety
    /// Sends nothing but a handshake; safe to drop.
    pub(crate) async fn probe(&self, servers: &[(String, u16)]) -> Result<bool> {
        tls::probe(Arc::new(self.rustls_config()?), servers, "ZooKeeper").await
    }
}
