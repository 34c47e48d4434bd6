//! [`EtcdBackend`]: the connection, the key layout, and the admin
//! operations (inspect, break, revoke, kill a lease, leftovers).

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, GetResponse, Identity,
    KeyValue, PutOptions, SortOrder, SortTarget, TlsOptions, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};
use lockcore::backend::{Backend, Capabilities, SessionLiveness, StoreSession};
use lockcore::{Contender, Error, ErrorKind, LockKind, LockName, LockState, Result};

use crate::config::EtcdConfig;
use crate::error;
use crate::layout;
use crate::session::EtcdSession;
use crate::watch::WatchHub;

/// The etcd backend: one connection (a balanced gRPC channel over the
/// URL's endpoints), one watch stream shared by every watch, and the
/// sessions (leases) opened through it. Cheap to clone.
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: EtcdConfig,
    pub(crate) client: Client,
    pub(crate) requests: Arc<AtomicU64>,
    pub(crate) hub: WatchHub,
    /// Leases this instance granted, for `leftovers`.
    opened: Mutex<Vec<i64>>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("url", &self.inner.config.display)
            .finish()
    }
}

impl EtcdBackend {
    /// Parses `url` ([`EtcdConfig::from_url`]) and connects.
    ///
    /// Nothing is written to etcd; with credentials in the URL, one
    /// `Authenticate` request checks them (bad ones give
    /// [`ErrorKind::Unauthenticated`]).
    ///
    /// # Cancel safety
    /// Writes nothing; safe to drop at any point.
    pub async fn connect(url: impl AsRef<str>) -> Result<EtcdBackend> {
        let config = EtcdConfig::from_url(&lockcore::url::parse(url.as_ref())?)?;
        Self::new(config).await
    }

    /// Connects with a parsed configuration (reads the TLS files first).
    ///
    /// # Cancel safety
    /// Writes nothing; safe to drop at any point.
    pub async fn new(config: EtcdConfig) -> Result<EtcdBackend> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(config.timeout)
            .with_keep_alive(Duration::from_secs(10), config.timeout)
            .with_auto_token_refresh(true);
        let requests = Arc::new(AtomicU64::new(0));
        if let (Some(user), Some(pw)) = (&config.user, &config.password) {
            opts = opts.with_user(user.clone(), pw.expose().to_string());
            requests.fetch_add(1, Ordering::Relaxed); // Authenticate
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
        let connect = Client::connect(config.endpoints.clone(), Some(opts));
        let client = match tokio::time::timeout(config.timeout, connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(error::map(e, "connecting to etcd")),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Connection,
                    format!("connecting to etcd took longer than {:?}", config.timeout),
                ))
            }
        };
        let hub = WatchHub::new(client.watch_client(), requests.clone(), config.timeout);
        tracing::debug!(url = %config.display, "etcd backend ready");
        Ok(EtcdBackend {
            inner: Arc::new(Inner {
                config,
                client,
                requests,
                hub,
                opened: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
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

/// `key` is a contender of the lock whose keys start with `pfx_slash`: a
/// direct child (`<pfx>/<lease hex>`). Keys of nested lock names
/// (`<pfx>/<child>/<lease hex>`) share the prefix but are not contenders.
pub(crate) fn is_contender(pfx_slash: &str, key: &[u8]) -> bool {
    key.strip_prefix(pfx_slash.as_bytes())
        .is_some_and(|rest| !rest.is_empty() && !rest.contains(&b'/'))
}

/// The first response of a txn's op responses as a range response.
pub(crate) fn range_at(resp: &TxnResponse, i: usize) -> Result<GetResponse> {
    match resp.op_responses().into_iter().nth(i) {
        Some(TxnOpResponse::Get(g)) => Ok(g),
        _ => Err(Error::new(
            ErrorKind::Internal,
            "etcd txn answered without the expected range response",
        )),
    }
}

pub(crate) fn header_revision(resp: &TxnResponse) -> i64 {
    resp.header().map_or(0, |h| h.revision())
}

/// Range of the oldest contender (what Go's `WithFirstCreate` asks).
pub(crate) fn first_created() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
}

impl Inner {
    /// `<ns>/<name>` (or `<name>` without a namespace): Go's mutex prefix
    /// without its trailing slash.
    pub(crate) fn lock_prefix(&self, name: &LockName) -> String {
        self.config.namespace.lock_key(name)
    }

    pub(crate) fn namespace_prefix(&self) -> String {
        self.config.namespace.prefix()
    }

    /// Runs one request: counts it, bounds it by the configured timeout and
    /// maps its error. A request that could not even connect (an endpoint
    /// of several is down, and the balanced channel picked it) never
    /// reached etcd, so it is sent again at once, up to once per endpoint.
    pub(crate) async fn call<T, F, Fut>(&self, what: &str, mut f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let mut attempts = self.config.endpoints.len() + 1;
        loop {
            attempts -= 1;
            self.requests.fetch_add(1, Ordering::Relaxed);
            match tokio::time::timeout(self.config.timeout, f()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if attempts > 0 && error::not_sent(&e) => {
                    tracing::debug!(error = %e, "{what}: endpoint unreachable; trying again");
                }
                Ok(Err(e)) => return Err(error::map(e, what)),
                Err(_) => {
                    return Err(Error::new(
                        ErrorKind::Connection,
                        format!(
                            "{what}: no answer from etcd within {:?}",
                            self.config.timeout
                        ),
                    ))
                }
            }
        }
    }

    pub(crate) async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse> {
        self.call(what, || {
            let (mut kv, txn) = (self.client.kv_client(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
    }

    pub(crate) async fn get(
        &self,
        what: &str,
        key: impl Into<Vec<u8>>,
        opts: GetOptions,
    ) -> Result<GetResponse> {
        let key = key.into();
        self.call(what, || {
            let (mut kv, key, opts) = (self.client.kv_client(), key.clone(), opts.clone());
            async move { kv.get(key, Some(opts)).await }
        })
        .await
    }

    /// Contenders of a lock in queue (create revision) order.
    async fn contenders(&self, name: &LockName) -> Result<Vec<KeyValue>> {
        let pfx_slash = format!("{}/", self.lock_prefix(name));
        let resp = self
            .get("range contenders", pfx_slash.clone(), first_created())
            .await?;
        Ok(resp
            .kvs()
            .iter()
            .filter(|kv| is_contender(&pfx_slash, kv.key()))
            .cloned()
            .collect())
    }

    /// The current holders (by the queue rules of [`layout::holds`]) and
    /// all contenders, in queue order.
    async fn holders(&self, name: &LockName) -> Result<(Vec<KeyValue>, Vec<KeyValue>)> {
        let all = self.contenders(name).await?;
        let kinds: Vec<LockKind> = all.iter().map(layout::kind_of).collect();
        let (holders, waiters): (Vec<_>, Vec<_>) = all
            .into_iter()
            .enumerate()
            .partition(|(i, _)| lockcore::backend::holds(&kinds, *i));
        Ok((
            holders.into_iter().map(|(_, kv)| kv).collect(),
            waiters.into_iter().map(|(_, kv)| kv).collect(),
        ))
    }

    pub(crate) fn record_lease(&self, id: i64) {
        let mut opened = self.opened.lock().expect("poisoned");
        opened.push(id);
    }

    /// Whether etcd still has lease `id` (TimeToLive reports ttl > 0).
    pub(crate) async fn lease_alive(&self, id: i64) -> Result<bool> {
        let r = self
            .call("lease time-to-live", || {
                let mut lease = self.client.lease_client();
                async move { lease.time_to_live(id, None).await }
            })
            .await?;
        Ok(r.ttl() > 0)
    }
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
    let (kind, since) = layout::parse(kv.value());
    Contender {
        session: session_of(kv),
        token: kv.create_revision() as u64,
        entry: String::from_utf8_lossy(kv.key()).into_owned(),
        kind,
        since,
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
            session_ttl: self.inner.config.ttl,
        }
    }

    fn describe(&self) -> String {
        self.inner.config.display.clone()
    }

    async fn open_session(&self, liveness: Arc<SessionLiveness>) -> Result<Arc<dyn StoreSession>> {
        let s = EtcdSession::open(self.inner.clone(), liveness).await?;
        Ok(Arc::new(s))
    }

    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        let (holders, waiters) = self.inner.holders(name).await?;
        Ok(LockState {
            name: name.clone(),
            holders: holders.iter().map(contender).collect(),
            waiters: waiters.iter().map(contender).collect(),
        })
    }

    async fn break_lock(&self, name: &LockName) -> Result<bool> {
        // Every holder's key goes in one txn, guarded by their create
        // revisions; if the holders changed between our read and the txn,
        // read again.
        for _ in 0..10 {
            let (holders, _) = self.inner.holders(name).await?;
            if holders.is_empty() {
                return Ok(false);
            }
            let txn = Txn::new().when(unchanged(&holders)).and_then(
                holders
                    .iter()
                    .map(|kv| TxnOp::delete(kv.key(), None))
                    .collect::<Vec<_>>(),
            );
            if self.inner.txn("break lock", txn).await?.succeeded() {
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
            let (holders, _) = self.inner.holders(name).await?;
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
            if self.inner.txn("request revoke", txn).await?.succeeded() {
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
        self.inner
            .call("lease revoke", || {
                let mut lease = self.inner.client.lease_client();
                async move { lease.revoke(id).await }
            })
            .await?;
        Ok(())
    }

    async fn leftovers(&self) -> Result<Vec<String>> {
        let prefix = self.inner.namespace_prefix();
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
        let resp = self.inner.get("range namespace", key, opts).await?;
        let mut out: Vec<String> = resp
            .kvs()
            .iter()
            .map(|kv| format!("key {}", String::from_utf8_lossy(kv.key())))
            .collect();
        let leases: Vec<i64> = self.inner.opened.lock().expect("poisoned").clone();
        let mut dead = Vec::new();
        for id in leases {
            if self.inner.lease_alive(id).await? {
                out.push(format!("lease {id:x}"));
            } else {
                dead.push(id);
            }
        }
        self.inner
            .opened
            .lock()
            .expect("poisoned")
            .retain(|id| !dead.contains(id));
        Ok(out)
    }

    fn requests_sent(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contenders_are_direct_children() {
        assert!(is_contender("ns/a/", b"ns/a/694d7c3a2f1b4e05"));
        assert!(!is_contender("ns/a/", b"ns/a/"));
        assert!(!is_contender("ns/a/", b"ns/a/beef/694d"));
        assert!(!is_contender("ns/a/", b"ns/ab/694d"));
    }
}
