//! The state: [`EtcdCore`], what the backend and its sessions share (the
//! client, the request counter, the watch stream, a lazy backend's
//! credentials until they are sent, one request: counted, bounded by the
//! timeout, errors mapped), and [`SessionState`], what one session shares
//! with its tasks.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use etcd_client::{
    Client, GetOptions, GetResponse, SortOrder, SortTarget, Txn, TxnOpResponse, TxnResponse,
};
use quorumlock_core::backend::SessionLiveness;
use quorumlock_core::url::Secret;
use quorumlock_core::{Error, ErrorKind, LockName, Result};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use crate::config::EtcdConfig;
use crate::error;
use crate::watch::WatchHub;

/// The backend-wide state of an [`crate::EtcdBackend`] (its clones share
/// it), held by every session it opened.
pub(crate) struct EtcdCore {
    pub(crate) config: EtcdConfig,
    pub(crate) client: Client,
    /// Requests sent, for `requests_sent` (the watch task counts too).
    pub(crate) requests: Arc<AtomicU64>,
    /// The one watch stream that every watch of the backend shares.
    pub(crate) hub: WatchHub,
    /// Leases this instance granted, for `leftovers`.
    pub(crate) opened: Mutex<Vec<i64>>,
    /// A lazy backend's credentials: its client was built without them
    /// (etcd-client authenticates inside `Client::connect`, which would
    /// send a request at connect), and they are sent before the first
    /// request instead. `None` when the client authenticated at connect,
    /// has no credentials, or is the caller's.
    pub(crate) lazy_auth: Option<LazyAuth>,
}

/// The credentials a lazy backend sends before its first request.
pub(crate) struct LazyAuth {
    pub(crate) user: String,
    pub(crate) password: Secret,
    /// Set once etcd accepted them; a failed attempt leaves it unset, and
    /// the next request tries again.
    pub(crate) done: OnceCell<()>,
}

/// One session's state, shared by its tasks: the session's acquires,
/// releases and removals (`EtcdSession`, in `session.rs`), its lease
/// keepalive, and the watch of each held entry (`monitor.rs`, called on
/// the backend's watch task). Held in an `Arc`.
pub(crate) struct SessionState {
    pub(crate) core: Arc<EtcdCore>,
    /// The session's etcd lease, which every key of its entries is bound to.
    pub(crate) lease: i64,
    pub(crate) liveness: Arc<SessionLiveness>,
    /// Ends the keepalive when the session is closed or dropped.
    pub(crate) stop: CancellationToken,
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

impl EtcdCore {
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
    /// A lazy backend authenticates first, once.
    pub(crate) async fn call<T, F, Fut>(&self, what: &str, f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.authenticate().await?;
        self.send(what, f).await
    }

    /// Sends a lazy backend's credentials (one `Authenticate`, as a
    /// non-lazy connect sends), unless etcd accepted them already; the
    /// token goes to every request of the client from then on (and is
    /// refreshed on expiry, as after a non-lazy connect). Refused
    /// credentials are [`ErrorKind::Unauthenticated`]; an unreachable etcd
    /// [`ErrorKind::Connection`], as for any request.
    async fn authenticate(&self) -> Result<()> {
        let Some(auth) = &self.lazy_auth else {
            return Ok(());
        };
        auth.done
            .get_or_try_init(|| {
                self.send("authenticating with etcd", || {
                    let mut client = self.client.clone();
                    let creds = (auth.user.clone(), auth.password.expose().to_string());
                    async move { client.update_user(Some(creds)).await }
                })
            })
            .await?;
        Ok(())
    }

    /// [`EtcdCore::call`] without the authentication.
    async fn send<T, F, Fut>(&self, what: &str, mut f: F) -> Result<T>
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
