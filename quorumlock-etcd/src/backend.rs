//! [`EtcdBackend`]: the constructors (the connection) and `impl Backend`,
//! each method a delegation to `admin.rs`, `session.rs` or `fenced.rs`.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use quorumlock_core::backend::connect::check_connect;
use quorumlock_core::backend::{
    Backend, Capabilities, ChangeFeed, HeldEntry, KeyWrite, SessionLiveness, StoreSession,
};
use quorumlock_core::{tls, Error, ErrorKind, LockName, LockState, Result};

use crate::config::EtcdConfig;
use crate::core::{EtcdCore, LazyAuth};
use crate::error;
use crate::session::EtcdSession;
use crate::watch::WatchHub;

/// The etcd backend: one connection (a balanced gRPC channel over the
/// URL's endpoints), one watch stream shared by every watch, and the
/// sessions (leases) opened through it. Cheap to clone.
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) core: Arc<EtcdCore>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("url", &self.core.config.describe())
            .finish()
    }
}

impl EtcdBackend {
    /// Parses `url` ([`EtcdConfig::from_url`]) and connects.
    ///
    /// Nothing is written to etcd. Unless the URL says `lazy=true`, etcd
    /// must answer within `connect_timeout` (see
    /// [`EtcdBackend::from_config`] for the errors).
    ///
    /// # Cancel Safety
    /// Writes nothing; safe to drop at any point.
    pub async fn connect(url: impl AsRef<str>) -> Result<EtcdBackend> {
        let config = EtcdConfig::from_url(&quorumlock_core::url::parse(url.as_ref())?)?;
        Self::from_config(config).await
    }

    /// Connects with a configuration ([`EtcdConfig::validate`]d first: a
    /// config breaking the URL's rules is [`ErrorKind::InvalidArgument`],
    /// nothing read or sent; then the TLS files are read).
    ///
    /// Unless [`EtcdConfig::lazy`], one status request (after the
    /// `Authenticate` of credentials) must be answered within
    /// [`EtcdConfig::connect_timeout`]: every attempt refused is
    /// [`ErrorKind::Unavailable`], no answer at all is
    /// [`ErrorKind::Timeout`], bad credentials are
    /// [`ErrorKind::Unauthenticated`] at once. Lazy sends nothing, not
    /// even the credentials: they go before the first request, which
    /// fails with what a connect would have met.
    ///
    /// # Cancel Safety
    /// Writes nothing; safe to drop at any point.
    pub async fn from_config(config: EtcdConfig) -> Result<EtcdBackend> {
        config.validate()?;
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(config.timeout)
            .with_keep_alive(Duration::from_secs(10), config.timeout)
            .with_auto_token_refresh(true);
        let mut authenticates = false;
        let mut lazy_auth = None;
        if let (Some(user), Some(pw)) = (&config.user, &config.password) {
            if config.lazy {
                // etcd-client authenticates inside Client::connect; a lazy
                // backend builds its client without the credentials and
                // sends them with its first request (EtcdCore::call).
                lazy_auth = Some(LazyAuth {
                    user: user.clone(),
                    password: pw.clone(),
                    done: Default::default(),
                });
            } else {
                opts = opts.with_user(user.clone(), pw.expose().to_string());
                authenticates = true;
            }
        }
        if config.tls {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &config.ca {
                tls = tls.ca_certificate(Certificate::from_pem(read_file(ca, "ca")?));
            }
            if let Some((cert, key)) = &config.client_cert {
                tls = tls.identity(Identity::from_pem(
                    read_file(cert, "cert")?,
                    read_file(key, "key")?,
                ));
            }
            opts = opts.with_tls(tls);
        }
        let requests = Arc::new(AtomicU64::new(0));
        let slot: Mutex<Option<Client>> = Mutex::new(None);
        let connect = || async {
            let cached = slot.lock().expect("poisoned").clone();
            let client = match cached {
                Some(c) => c,
                None => {
                    if authenticates {
                        requests.fetch_add(1, Ordering::Relaxed); // Authenticate
                    }
                    let c = Client::connect(config.endpoints.clone(), Some(opts.clone()))
                        .await
                        .map_err(|e| error::map(e, "connecting to etcd"))?;
                    *slot.lock().expect("poisoned") = Some(c.clone());
                    c
                }
            };
            if !config.lazy {
                requests.fetch_add(1, Ordering::Relaxed);
                client
                    .maintenance_client()
                    .status()
                    .await
                    .map_err(|e| error::map(e, "asking etcd for its status"))?;
            }
            Ok(())
        };
        let probe = tls_probe(&config)?;
        // Connection trouble over TLS may be a refused certificate whose
        // alert the client never read: the probe reads it, until it has
        // once reached a server (each probe of a server that accepts us
        // waits a second for an alert that does not come).
        let probed = std::sync::atomic::AtomicBool::new(false);
        let attempt = || async {
            let outcome: Result<()> = connect().await;
            if let (Err(e), Some((tls_config, servers))) = (&outcome, &probe) {
                if e.kind() == ErrorKind::Connection && !probed.load(Ordering::Relaxed) {
                    let reached = tls::probe(tls_config.clone(), servers, "etcd").await?;
                    probed.store(reached, Ordering::Relaxed);
                }
            }
            outcome
        };
        check_connect(&config.describe(), config.connect_timeout, attempt).await?;
        let client = slot.into_inner().expect("poisoned").expect("connected");
        Ok(Self::assemble(config, client, requests, lazy_auth))
    }

    /// A backend over an `etcd_client::Client` the caller built (its
    /// endpoints, credentials and TLS are the client's; those of `config`
    /// are not used). `config` is [`EtcdConfig::validate`]d first; unless
    /// [`EtcdConfig::lazy`], checks that etcd answers as
    /// [`EtcdBackend::from_config`] does.
    ///
    /// # Cancel Safety
    /// Writes nothing; safe to drop at any point.
    pub async fn from_client(client: Client, config: EtcdConfig) -> Result<EtcdBackend> {
        config.validate()?;
        let requests = Arc::new(AtomicU64::new(0));
        if !config.lazy {
            check_connect(&config.describe(), config.connect_timeout, || async {
                requests.fetch_add(1, Ordering::Relaxed);
                client
                    .maintenance_client()
                    .status()
                    .await
                    .map(drop)
                    .map_err(|e| error::map(e, "asking etcd for its status"))
            })
            .await?;
        }
        Ok(Self::assemble(config, client, requests, None))
    }

    fn assemble(
        config: EtcdConfig,
        client: Client,
        requests: Arc<AtomicU64>,
        lazy_auth: Option<LazyAuth>,
    ) -> EtcdBackend {
        let hub = WatchHub::new(client.watch_client(), requests.clone(), config.timeout);
        tracing::debug!(url = %config.describe(), "etcd backend ready");
        EtcdBackend {
            core: Arc::new(EtcdCore {
                config,
                client,
                requests,
                hub,
                opened: Mutex::new(Vec::new()),
                lazy_auth,
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdConfig {
        &self.core.config
    }
}

/// For `etcds://` with `ca=`: the rustls configuration of the URL's TLS
/// files and the endpoints' hosts and ports, for [`tls::probe`].
#[allow(clippy::type_complexity)]
fn tls_probe(
    config: &EtcdConfig,
) -> Result<Option<(Arc<rustls::ClientConfig>, Vec<(String, u16)>)>> {
    let (true, Some(ca)) = (config.tls, &config.ca) else {
        return Ok(None);
    };
    let identity = match &config.client_cert {
        Some((cert, key)) => Some((tls::read_pem("cert", cert)?, tls::read_pem("key", key)?)),
        None => None,
    };
    let tls_config = tls::client_config(
        Arc::new(rustls::crypto::ring::default_provider()),
        tls::pem_roots(&tls::read_pem("ca", ca)?)?,
        identity.as_ref().map(|(c, k)| (c.as_str(), k.as_str())),
        tls::HostCheck::ChainAndName,
    )?;
    let servers = config
        .endpoints
        .iter()
        .filter_map(|e| {
            let u = url::Url::parse(e).ok()?;
            Some((u.host_str()?.to_string(), u.port_or_known_default()?))
        })
        .collect();
    Ok(Some((Arc::new(tls_config), servers)))
}

fn read_file(p: &std::path::Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(p).map_err(|e| {
        Error::new(
            ErrorKind::InvalidUrl,
            format!("URL option {what}={}: cannot read the file", p.display()),
        )
        .with_source(e)
    })
}

#[async_trait]
impl Backend for EtcdBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kill_session: true,
            rwlock: true,
            semaphore: true,
            session_ttl: self.core.config.ttl,
            proclaim: true,
            changes: true,
            acquire_many: true,
            upgradeable_read: true,
        }
    }

    fn describe(&self) -> String {
        self.core.config.describe()
    }

    async fn open_session(&self, liveness: Arc<SessionLiveness>) -> Result<Arc<dyn StoreSession>> {
        let s = EtcdSession::open(self.core.clone(), liveness).await?;
        Ok(Arc::new(s))
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        self.core.inspect(name).await
    }

    async fn list(&self, prefix: Option<&LockName>) -> Result<Vec<LockState>> {
        self.core.list(prefix).await
    }

    async fn break_lock(&self, name: &LockName) -> Result<bool> {
        self.core.break_lock(name).await
    }

    async fn request_revoke(&self, name: &LockName) -> Result<bool> {
        self.core.request_revoke(name).await
    }

    async fn kill_session(&self, session: &str) -> Result<()> {
        self.core.kill_session(session).await
    }

    async fn leftovers(&self) -> Result<Vec<String>> {
        self.core.leftovers().await
    }

    fn requests_sent(&self) -> u64 {
        self.core.requests.load(Ordering::Relaxed)
    }

    async fn fenced_write(&self, held: &[HeldEntry], write: &KeyWrite) -> Result<()> {
        crate::fenced::fenced_write(&self.core, held, write).await
    }

    async fn read_key(&self, key: &str) -> Result<Option<Vec<u8>>> {
        crate::fenced::read_key(&self.core, key).await
    }

    async fn write_key(&self, write: &KeyWrite) -> Result<()> {
        crate::fenced::write_key(&self.core, write).await
    }

    fn changes(&self, name: &LockName) -> Option<ChangeFeed> {
        Some(self.core.changes(name))
    }
}
