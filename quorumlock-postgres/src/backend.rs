//! [`PostgresBackend`]: the constructors (the connection check, the
//! tables, the pooler check) and `impl Backend`, each method a delegation
//! to `admin.rs`, `session.rs` or `fenced.rs`.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_trait::async_trait;
use quorumlock_core::backend::connect::check_connect;
use quorumlock_core::backend::{
    Backend, Capabilities, ChangeFeed, HeldEntry, KeyWrite, SessionLiveness, StoreSession,
};
use quorumlock_core::{Error, ErrorKind, LockName, LockState, Result};

use tokio_postgres::config::SslMode;

use crate::config::PostgresConfig;
use crate::core::{PostgresCore, Work};
use crate::error;
use crate::session::PostgresSession;

/// The PostgreSQL backend: a few pooled connections for its transactions
/// (one transaction at a time each), and one more connection per session
/// that listens on the session's channel. Cheap to clone.
#[derive(Clone)]
pub struct PostgresBackend {
    pub(crate) core: Arc<PostgresCore>,
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("url", &self.core.config.describe())
            .finish()
    }
}

impl PostgresBackend {
    /// Parses `url` ([`PostgresConfig::from_url`]) and connects (see
    /// [`PostgresBackend::from_config`]).
    ///
    /// # Cancel safety
    /// Writes nothing but the tables (created once, in one transaction);
    /// safe to drop at any point.
    pub async fn connect(url: impl AsRef<str>) -> Result<PostgresBackend> {
        let url = quorumlock_core::url::parse(url.as_ref())?;
        Self::from_config(PostgresConfig::from_url(&url)?).await
    }

    /// Connects with a configuration. Unless [`PostgresConfig::lazy`], the
    /// server must answer within [`PostgresConfig::connect_timeout`]:
    /// refused until then is [`ErrorKind::Unavailable`], no answer
    /// [`ErrorKind::Timeout`], bad credentials
    /// [`ErrorKind::Unauthenticated`] at once; the tables are created if
    /// missing; and a pooler in transaction mode in between (pgbouncer's
    /// `pool_mode = transaction`), which would split a session's
    /// statements over server connections, is refused with
    /// [`ErrorKind::InvalidArgument`].
    ///
    /// # Cancel safety
    /// As [`PostgresBackend::connect`].
    pub async fn from_config(config: PostgresConfig) -> Result<PostgresBackend> {
        config.validate()?;
        let pg = config.client_config();
        Self::from_client(pg, config).await
    }

    /// A backend over a `tokio_postgres::Config` the caller built (its
    /// hosts, credentials and options are used; those of `config` are
    /// not; `config` gives the namespace, schema, TTL and timeouts, and
    /// how TLS is checked: its `ca_file`, client certificate and
    /// `sslmode`'s name check). TLS is used when `pg`'s `ssl_mode` is
    /// `Require`; `Prefer`, its default, connects without TLS, as the
    /// URL's `sslmode=prefer` does.
    /// A `tokio_postgres::Client` alone is not enough: it is one
    /// connection, and the backend needs one per concurrent transaction
    /// plus one per session for `LISTEN`. Checked as
    /// [`PostgresBackend::from_config`].
    ///
    /// # Cancel safety
    /// As [`PostgresBackend::connect`].
    pub async fn from_client(
        pg: tokio_postgres::Config,
        config: PostgresConfig,
    ) -> Result<PostgresBackend> {
        config.validate()?;
        let mut pg = pg;
        // `Prefer` (tokio-postgres's default) means what the URL's
        // `sslmode=prefer` means here: no TLS, rather than TLS unchecked.
        if pg.get_ssl_mode() == SslMode::Prefer {
            pg.ssl_mode(SslMode::Disable);
        }
        let tls = config.tls_connector(pg.get_ssl_mode() != SslMode::Disable)?;
        let b = PostgresBackend {
            core: Arc::new(PostgresCore::new(config, pg, tls)),
        };
        let c = &b.core.config;
        if !c.lazy {
            check_connect(&c.describe(), c.connect_timeout, || async {
                let core = b.core.clone();
                let work: Work<()> = Box::new(move |client| {
                    Box::pin(async move {
                        let _ = &core;
                        client.execute_typed("SELECT 1", &[]).await?;
                        Ok(())
                    })
                });
                b.core.run("connecting", work).await
            })
            .await?;
            b.check_not_pooled().await?;
        }
        tracing::debug!(url = %c.describe(), "postgres backend ready");
        Ok(b)
    }

    /// The configuration.
    pub fn config(&self) -> &PostgresConfig {
        &self.core.config
    }

    /// Refuses a pooler in transaction (or statement) mode: two client
    /// connections open at once must have two server backends, and one
    /// connection must keep its backend between two statements. Behind
    /// transaction pooling the second connection's statement runs on the
    /// backend the first one just gave back (or the first connection's
    /// second statement on another one).
    async fn check_not_pooled(&self) -> Result<()> {
        let core = &self.core;
        let (a, b) = (core.connect().await?, core.connect().await?);
        let first = backend_pid(core, &a).await?;
        let other = backend_pid(core, &b).await?;
        let again = backend_pid(core, &a).await?;
        if first == other || first != again {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "{}: a connection pooler in transaction or statement mode is in between \
                     (two connections shared server backend {other}, or one connection moved \
                     from backend {first} to {again}): a session's LISTEN and its statements \
                     would be split over server connections. Connect to PostgreSQL directly, \
                     or through a pooler in session mode (pgbouncer pool_mode = session)",
                    core.config.describe()
                ),
            ));
        }
        Ok(())
    }
}

/// The server process behind connection `c`.
async fn backend_pid(core: &PostgresCore, c: &tokio_postgres::Client) -> Result<i32> {
    core.count();
    let what = "asking for the backend pid";
    match tokio::time::timeout(
        core.config.timeout,
        c.query_typed_one("SELECT pg_backend_pid()", &[]),
    )
    .await
    {
        Ok(r) => r
            .and_then(|r| r.try_get::<_, i32>(0))
            .map_err(|e| error::map(e, what)),
        Err(_) => Err(error::timed_out(what, core.config.timeout)),
    }
}

#[async_trait]
impl Backend for PostgresBackend {
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
            PostgresSession::open(self.core.clone(), liveness).await?,
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
