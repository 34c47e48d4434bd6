//! [`RedisBackend`]: the constructors (the client, the connect check) and
//! `impl Backend`, each method a delegation to `admin.rs`, `session.rs` or
//! `fenced.rs`.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use quorumlock_core::backend::connect::check_connect;
use quorumlock_core::backend::{
    Backend, Capabilities, ChangeFeed, HeldEntry, KeyWrite, SessionLiveness, StoreSession,
};
use quorumlock_core::{Error, ErrorKind, LockName, LockState, Result};

use crate::config::RedisConfig;
use crate::core::{lazy_manager, RedisCore};
use crate::error;
use crate::session::RedisSession;

/// The Redis backend: one multiplexed connection (reconnected after a
/// failure) for every request of every session, plus one blocking
/// connection per session for its mailbox. Cheap to clone.
#[derive(Clone)]
pub struct RedisBackend {
    pub(crate) core: Arc<RedisCore>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &self.core.config.describe())
            .finish()
    }
}

impl RedisBackend {
    /// Parses `url` ([`RedisConfig::from_url`]) and connects; unless the
    /// URL says `lazy=true`, Redis must answer a PING (see
    /// [`RedisBackend::from_config`]).
    ///
    /// # Cancel Safety
    /// Writes nothing; safe to drop at any point.
    pub async fn connect(url: impl AsRef<str>) -> Result<RedisBackend> {
        let url = quorumlock_core::url::parse(url.as_ref())?;
        Self::from_config(RedisConfig::from_url(&url)?).await
    }

    /// Connects with a configuration. Unless [`RedisConfig::lazy`], a
    /// PING must be answered within [`RedisConfig::connect_timeout`]:
    /// refused until then is [`ErrorKind::Unavailable`], no answer
    /// [`ErrorKind::Timeout`], a bad password [`ErrorKind::Unauthenticated`]
    /// at once (the connection's handshake sends it).
    ///
    /// # Cancel Safety
    /// Writes nothing; safe to drop at any point.
    pub async fn from_config(config: RedisConfig) -> Result<RedisBackend> {
        config.validate()?;
        if config.tls {
            // One process-wide crypto provider for rustls; an error means
            // one is installed already, which is as good.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let client = client(&config)?;
        Self::from_client(client, config).await
    }

    /// A backend over a `redis::Client` the caller built (its address,
    /// credentials, database and TLS are the client's; those of `config`
    /// are not used). Checked as [`RedisBackend::from_config`].
    ///
    /// # Cancel Safety
    /// Writes nothing; safe to drop at any point.
    pub async fn from_client(client: redis::Client, config: RedisConfig) -> Result<RedisBackend> {
        config.validate()?;
        let conn = lazy_manager(&client, &config, Some(config.timeout))?;
        let prefix = config.namespace.prefix();
        let b = RedisBackend {
            core: Arc::new(RedisCore {
                config,
                client,
                conn,
                requests: AtomicU64::new(0),
                prefix,
                opened: Mutex::new(Vec::new()),
                waits: Mutex::new(Vec::new()),
            }),
        };
        let c = &b.core.config;
        if !c.lazy {
            // A connection of its own, not the manager's: the manager
            // tries a refused handshake three times, and bad credentials
            // must be refused once.
            check_connect(&c.describe(), c.connect_timeout, || async {
                b.core.requests.fetch_add(1, Ordering::Relaxed);
                let mut conn = b
                    .core
                    .client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| error::map(e, "connecting to Redis"))?;
                redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .map(drop)
                    .map_err(|e| error::map(e, "PING"))
            })
            .await?;
        }
        tracing::debug!(url = %c.describe(), "redis backend ready");
        Ok(b)
    }

    /// The configuration.
    pub fn config(&self) -> &RedisConfig {
        &self.core.config
    }
}

#[async_trait]
impl Backend for RedisBackend {
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
        Ok(Arc::new(
            RedisSession::open(self.core.clone(), liveness).await?,
        ))
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

/// The `redis` client of `config`: with the CA file and the client
/// certificate when given (the crate then trusts that CA alone), else the
/// crate's own (the system's roots for `rediss://`).
fn client(config: &RedisConfig) -> Result<redis::Client> {
    let custom = config.ca_file.is_some() || config.client_cert_file.is_some();
    if !custom {
        return redis::Client::open(config.connection_info()?)
            .map_err(|e| error::map(e, "configuring the Redis client"));
    }
    let read = |opt: &str, p: &std::path::Path| {
        std::fs::read(p).map_err(|e| {
            Error::new(
                ErrorKind::InvalidUrl,
                format!("URL option {opt}={}: cannot read it", p.display()),
            )
            .with_source(e)
        })
    };
    let root_cert = match &config.ca_file {
        Some(p) => Some(read("ca", p)?),
        None => None,
    };
    let client_tls = match (&config.client_cert_file, &config.client_key_file) {
        (Some(c), Some(k)) => Some(redis::ClientTlsConfig {
            client_cert: read("cert", c)?,
            client_key: read("key", k)?,
        }),
        _ => None,
    };
    redis::Client::build_with_tls(
        config.connection_info()?,
        redis::TlsCertificates {
            client_tls,
            root_cert,
        },
    )
    .map_err(|e| {
        Error::new(
            ErrorKind::InvalidUrl,
            "URL options ca=, cert=, key=: not PEM certificates and a private key",
        )
        .with_source(e)
    })
}
