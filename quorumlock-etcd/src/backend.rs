//! [`EtcdBackend`]: the connection, the key layout, and the admin
//! operations (inspect, break, revoke, kill a lease, leftovers).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, KeyValue,
    PutOptions, SortOrder, SortTarget, TlsOptions, Txn, TxnOp,
};
use quorumlock_core::backend::connect::check_connect;
use quorumlock_core::backend::{
    Backend, Capabilities, HeldEntry, KeyWrite, SessionLiveness, StoreSession,
};
use quorumlock_core::{Contender, Error, ErrorKind, LockKind, LockName, LockState, Result};

use crate::config::EtcdConfig;
use crate::core::EtcdCore;
use crate::error;
use crate::layout;
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
    /// must answer within `connect_timeout` (see [`EtcdBackend::new`] for
    /// the errors).
    ///
    /// # Cancel Safety
    /// Writes nothing; safe to drop at any point.
    pub async fn connect(url: impl AsRef<str>) -> Result<EtcdBackend> {
        let config = EtcdConfig::from_url(&quorumlock_core::url::parse(url.as_ref())?)?;
        Self::new(config).await
    }

    /// Connects with a configuration (reads the TLS files first).
    ///
    /// Unless [`EtcdConfig::lazy`], one status request must be answered
    /// within [`EtcdConfig::connect_timeout`]: every attempt refused is
    /// [`ErrorKind::Unavailable`], no answer at all is
    /// [`ErrorKind::Timeout`], bad credentials are
    /// [`ErrorKind::Unauthenticated`] at once (etcd-client authenticates
    /// while connecting, so credentials are checked even when lazy).
    ///
    /// # Cancel Safety
    /// Writes nothing; safe to drop at any point.
    pub async fn new(config: EtcdConfig) -> Result<EtcdBackend> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(config.timeout)
            .with_keep_alive(Duration::from_secs(10), config.timeout)
            .with_auto_token_refresh(true);
        let mut authenticates = false;
        if let (Some(user), Some(pw)) = (&config.user, &config.password) {
            opts = opts.with_user(user.clone(), pw.expose().to_string());
            authenticates = true;
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
        check_connect(&config.describe(), config.connect_timeout, connect).await?;
        let client = slot.into_inner().expect("poisoned").expect("connected");
        Ok(Self::assemble(config, client, requests))
    }

    /// The same as [`EtcdBackend::new`] (every backend has a
    /// `from_config`).
    ///
    /// # Cancel Safety
    /// Writes nothing; safe to drop at any point.
    pub async fn from_config(config: EtcdConfig) -> Result<EtcdBackend> {
        Self::new(config).await
    }

    /// A backend over an `etcd_client::Client` the caller built (its
    /// endpoints, credentials and TLS are the client's; those of `config`
    /// are not used). Unless [`EtcdConfig::lazy`], checks that etcd
    /// answers as [`EtcdBackend::new`] does.
    ///
    /// # Cancel Safety
    /// Writes nothing; safe to drop at any point.
    pub async fn from_client(client: Client, config: EtcdConfig) -> Result<EtcdBackend> {
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
        Ok(Self::assemble(config, client, requests))
    }

    fn assemble(config: EtcdConfig, client: Client, requests: Arc<AtomicU64>) -> EtcdBackend {
        let hub = WatchHub::new(client.watch_client(), requests.clone(), config.timeout);
        tracing::debug!(url = %config.describe(), "etcd backend ready");
        EtcdBackend {
            core: Arc::new(EtcdCore {
                config,
                client,
                requests,
                hub,
                opened: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdConfig {
        &self.core.config
    }
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

/// The session id of a key: its lease in hex, or the key's last segment for
/// keys without a lease.
fn session_of(kv: &KeyValue) -> String {
    if kv.lease() != 0 {
        return format!("{:x}", kv.lease());
    }
    let key = String::from_utf8_lossy(kv.key());
    key.rsplit('/').next().unwrap_or_default().to_string()
}

fn contender(kv: &KeyValue) -> Contender {
    let (kind, since, value) = layout::parse(kv.value());
    Contender {
        session: session_of(kv),
        token: kv.create_revision() as u64,
        entry: String::from_utf8_lossy(kv.key()).into_owned(),
        kind,
        since,
        value,
    }
}

/// Compares that every one of `kvs` is still the entry we read.
fn unchanged(kvs: &[KeyValue]) -> Vec<Compare> {
    kvs.iter()
        .map(|kv| Compare::create_revision(kv.key(), CompareOp::Equal, kv.create_revision()))
        .collect()
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
        let (holders, waiters) = self.core.holders(name).await?;
        Ok(LockState {
            name: name.clone(),
            holders: holders.iter().map(contender).collect(),
            waiters: waiters.iter().map(contender).collect(),
        })
    }

    async fn list(&self, prefix: Option<&LockName>) -> Result<Vec<LockState>> {
        // One range read of the subtree: every entry is a direct child of
        // its lock's prefix, so a key's parent is its lock.
        let ns = self.core.namespace_prefix();
        let start = match prefix {
            Some(p) => format!("{}/", self.core.lock_prefix(p)),
            None => ns.clone(),
        };
        let (key, opts) = if start.is_empty() {
            (vec![0], GetOptions::new().with_all_keys())
        } else {
            (start.into_bytes(), GetOptions::new().with_prefix())
        };
        let opts = opts.with_sort(SortTarget::Create, SortOrder::Ascend);
        let resp = self.core.get("range locks", key, opts).await?;
        let mut locks: std::collections::BTreeMap<LockName, Vec<KeyValue>> = Default::default();
        for kv in resp.kvs() {
            let Ok(key) = std::str::from_utf8(kv.key()) else {
                continue;
            };
            let Some((parent, _)) = key.rsplit_once('/') else {
                continue;
            };
            // Keys that are not under a valid lock name are someone else's.
            let Some(name) = parent
                .strip_prefix(ns.as_str())
                .and_then(LockName::from_key)
            else {
                continue;
            };
            locks.entry(name).or_default().push(kv.clone());
        }
        Ok(locks
            .into_iter()
            .map(|(name, all)| {
                let kinds: Vec<LockKind> = all.iter().map(layout::kind_of).collect();
                let mut state = LockState::free(name);
                for (i, kv) in all.iter().enumerate() {
                    if quorumlock_core::backend::holds(&kinds, i) {
                        state.holders.push(contender(kv));
                    } else {
                        state.waiters.push(contender(kv));
                    }
                }
                state
            })
            .collect())
    }

    async fn break_lock(&self, name: &LockName) -> Result<bool> {
        // Every holder's key goes in one txn, guarded by their create
        // revisions; if the holders changed between our read and the txn,
        // read again.
        for _ in 0..10 {
            let (holders, _) = self.core.holders(name).await?;
            if holders.is_empty() {
                return Ok(false);
            }
            let txn = Txn::new().when(unchanged(&holders)).and_then(
                holders
                    .iter()
                    .map(|kv| TxnOp::delete(kv.key(), None))
                    .collect::<Vec<_>>(),
            );
            if self.core.txn("break lock", txn).await?.succeeded() {
                tracing::info!(lock = %name, holders = holders.len(), "lock broken");
                return Ok(true);
            }
        }
        Err(Error::new(
            ErrorKind::Store,
            format!("lock {name} changed holders ten times while breaking it"),
        ))
    }

    async fn request_revoke(&self, name: &LockName) -> Result<bool> {
        // A revoke request is a put on each holder's own key that keeps its
        // value and lease (so its create revision, the token, is kept too):
        // the holder's one watch sees a put on its key. Go clients do not
        // look at values or mod revisions.
        for _ in 0..10 {
            let (holders, _) = self.core.holders(name).await?;
            if holders.is_empty() {
                return Ok(false);
            }
            let keep = PutOptions::new().with_ignore_value().with_ignore_lease();
            let txn = Txn::new().when(unchanged(&holders)).and_then(
                holders
                    .iter()
                    .map(|kv| TxnOp::put(kv.key(), Vec::<u8>::new(), Some(keep.clone())))
                    .collect::<Vec<_>>(),
            );
            if self.core.txn("request revoke", txn).await?.succeeded() {
                return Ok(true);
            }
        }
        Err(Error::new(
            ErrorKind::Store,
            format!("lock {name} changed holders ten times while revoking it"),
        ))
    }

    async fn kill_session(&self, session: &str) -> Result<()> {
        let id = u64::from_str_radix(session, 16).map_err(|_| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("{session:?} is not an etcd lease id in hex"),
            )
        })? as i64;
        self.core
            .call("lease revoke", || {
                let mut lease = self.core.client.lease_client();
                async move { lease.revoke(id).await }
            })
            .await?;
        Ok(())
    }

    async fn leftovers(&self) -> Result<Vec<String>> {
        let prefix = self.core.namespace_prefix();
        let opts = if prefix.is_empty() {
            GetOptions::new().with_all_keys().with_keys_only()
        } else {
            GetOptions::new().with_prefix().with_keys_only()
        };
        let key = if prefix.is_empty() {
            vec![0]
        } else {
            prefix.into_bytes()
        };
        let resp = self.core.get("range namespace", key, opts).await?;
        let mut out: Vec<String> = resp
            .kvs()
            .iter()
            .map(|kv| format!("key {}", String::from_utf8_lossy(kv.key())))
            .collect();
        let leases: Vec<i64> = self.core.opened.lock().expect("poisoned").clone();
        let mut dead = Vec::new();
        for id in leases {
            if self.core.lease_alive(id).await? {
                out.push(format!("lease {id:x}"));
            } else {
                dead.push(id);
            }
        }
        self.core
            .opened
            .lock()
            .expect("poisoned")
            .retain(|id| !dead.contains(id));
        Ok(out)
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
}
