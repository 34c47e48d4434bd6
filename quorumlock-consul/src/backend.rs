//! The Consul backend: its constructors and `impl Backend`, each method
//! a delegation to the admin operations (`admin.rs`), the session
//! (`session.rs`) or the fenced writes (`fenced.rs`). The top of the
//! crate: nothing imports it but `lib.rs`.

use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use quorumlock_core::backend::{
    Backend, Capabilities, ChangeFeed, HeldEntry, KeyWrite, SessionLiveness, StoreSession,
};
use quorumlock_core::{LockName, LockState, Result};

use quorumlock_core::backend::connect::check_connect;

use crate::api::Api;
use crate::config::ConsulConfig;
use crate::core::ConsulCore;
use crate::error::map;
use crate::fenced;
use crate::session::ConsulSession;

/// The key `connect()` reads under the namespace (absent, normally).
const PROBE_KEY: &str = ".quorumlock-connect-check";

/// The Consul backend: one instance per [`quorumlock_core::LockClient`].
///
/// Each [`StoreSession`] is one Consul session (TTL, behavior `delete`)
/// renewed by one task. See the crate documentation for the key layout.
#[derive(Clone)]
pub struct ConsulBackend {
    pub(crate) core: Arc<ConsulCore>,
}

impl fmt::Debug for ConsulBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsulBackend")
            .field("url", &self.core.config.describe())
            .finish()
    }
}

impl ConsulBackend {
    fn assemble(config: ConsulConfig, api: Api) -> ConsulBackend {
        ConsulBackend {
            core: Arc::new(ConsulCore {
                config,
                api,
                opened: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Parses and checks `url` (nothing is written for bad input), then,
    /// unless it says `lazy=true`, checks that the agent answers (see
    /// [`ConsulBackend::from_config`]).
    ///
    /// # Cancel Safety
    /// Only reads; safe to drop.
    pub async fn connect(url: impl AsRef<str>) -> Result<ConsulBackend> {
        Self::from_config(ConsulConfig::parse(url.as_ref())?).await
    }

    /// A backend for `config` ([`ConsulConfig::validate`]d first: a config
    /// breaking the URL's rules is [`ErrorKind::InvalidArgument`], nothing
    /// read or sent) that, unless [`ConsulConfig::lazy`], checks
    /// within [`ConsulConfig::connect_timeout`] that the agent answers
    /// `status/leader` and a read of the namespace with the token: an
    /// agent refusing connections (or without a leader) until then is
    /// [`ErrorKind::Unavailable`], no answer [`ErrorKind::Timeout`], an
    /// unknown token [`ErrorKind::Unauthenticated`] and one without read
    /// access [`ErrorKind::PermissionDenied`], at once. The CA and client
    /// certificate files of `config` are read first: one that cannot be
    /// read or holds no PEM is [`ErrorKind::InvalidUrl`], nothing sent.
    ///
    /// [`ErrorKind::Unavailable`]: quorumlock_core::ErrorKind::Unavailable
    /// [`ErrorKind::Timeout`]: quorumlock_core::ErrorKind::Timeout
    /// [`ErrorKind::Unauthenticated`]: quorumlock_core::ErrorKind::Unauthenticated
    /// [`ErrorKind::PermissionDenied`]: quorumlock_core::ErrorKind::PermissionDenied
    /// [`ErrorKind::InvalidUrl`]: quorumlock_core::ErrorKind::InvalidUrl
    /// [`ErrorKind::InvalidArgument`]: quorumlock_core::ErrorKind::InvalidArgument
    ///
    /// # Cancel Safety
    /// Only reads; safe to drop.
    pub async fn from_config(config: ConsulConfig) -> Result<ConsulBackend> {
        config.validate()?;
        let api = Api::new(&config)?;
        Self::checked(Self::assemble(config, api)).await
    }

    /// A backend over a `reqwest::Client` the caller built (its TLS
    /// roots, client certificate, proxy and timeouts), talking to the
    /// agent of `config` (`host`, `port`, `tls`, `token`, `datacenter`;
    /// `ca_file` is not read). Checked as [`ConsulBackend::from_config`].
    /// A redirect is followed or not by the client's own policy (a 3xx
    /// that reaches the backend is an error): build it with
    /// `redirect(reqwest::redirect::Policy::none())` to keep the ACL
    /// token, sent in `X-Consul-Token`, to the agent's address.
    ///
    /// # Cancel Safety
    /// Only reads; safe to drop.
    pub async fn from_client(http: reqwest::Client, config: ConsulConfig) -> Result<ConsulBackend> {
        config.validate()?;
        let api = Api::with_http(&config, http)?;
        Self::checked(Self::assemble(config, api)).await
    }

    async fn checked(b: ConsulBackend) -> Result<ConsulBackend> {
        let config = &b.core.config;
        if config.lazy {
            return Ok(b);
        }
        let probe = format!("{}{PROBE_KEY}", config.namespace_prefix());
        let leader = std::sync::Mutex::new(String::new());
        check_connect(&config.describe(), config.connect_timeout, || async {
            let l = b
                .core
                .api
                .leader()
                .await
                .map_err(|e| map(e, "asking the agent for its leader"))?;
            b.core
                .api
                .probe(&probe)
                .await
                .map_err(|e| map(e, "reading the namespace"))?;
            *leader.lock().expect("poisoned") = l;
            Ok(())
        })
        .await?;
        if leader.into_inner().expect("poisoned").is_empty() {
            tracing::warn!(url = %config.describe(), "the Consul agent has no leader yet");
        }
        Ok(b)
    }

    /// The configuration.
    pub fn config(&self) -> &ConsulConfig {
        &self.core.config
    }
}

#[async_trait]
impl Backend for ConsulBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kill_session: true,
            rwlock: true,
            semaphore: true,
            session_ttl: self.core.config.ttl,
            proclaim: true,
            changes: true,
            acquire_many: false,
            upgradeable_read: true,
        }
    }

    fn describe(&self) -> String {
        self.core.config.describe()
    }

    async fn open_session(&self, liveness: Arc<SessionLiveness>) -> Result<Arc<dyn StoreSession>> {
        let s = ConsulSession::open(self.core.clone(), liveness).await?;
        self.core
            .opened
            .lock()
            .expect("poisoned")
            .push(s.id_str().to_string());
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
        self.core.api.requests()
    }

    async fn fenced_write(&self, held: &[HeldEntry], write: &KeyWrite) -> Result<()> {
        fenced::fenced_write(&self.core, held, write).await
    }

    async fn read_key(&self, key: &str) -> Result<Option<Vec<u8>>> {
        fenced::read_key(&self.core, key).await
    }

    async fn write_key(&self, write: &KeyWrite) -> Result<()> {
        fenced::write_key(&self.core, write).await
    }

    fn changes(&self, name: &LockName) -> Option<ChangeFeed> {
        Some(self.core.changes(name))
    }
}
