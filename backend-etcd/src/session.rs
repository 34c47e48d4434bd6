//! One etcd lease per client session, its ONE keepalive task, and the lock
//! protocol of Go's `concurrency.Mutex` on top of it.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, WatchFilterType};
use lockcore::{
    AcquireRequest, Acquired, EntrySignals, Error, ErrorKind, LossReason, Result, SessionLiveness,
    StoreSession,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::{first_created, header_revision, last_created_before, range_at, Inner};
use crate::error;
use crate::watch::WatchEvent;

/// One lease, shared by every lock of one client.
pub(crate) struct EtcdSession {
    inner: Arc<Inner>,
    lease: i64,
    liveness: Arc<SessionLiveness>,
    stop: CancellationToken,
    /// Watchers of held entries by key, stopped by release/abandon before
    /// the key is deleted (so that our own delete is not taken for a loss).
    watchers: Mutex<HashMap<String, CancellationToken>>,
}

impl fmt::Debug for EtcdSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdSession")
            .field("lease", &format_args!("{:x}", self.lease))
            .finish()
    }
}

impl EtcdSession {
    /// Grants the lease (confirming it with the grant's send time) and
    /// starts the keepalive task.
    pub(crate) async fn open(inner: Arc<Inner>, liveness: Arc<SessionLiveness>) -> Result<Self> {
        // A retried grant (see `Inner::call`) keeps the first send time:
        // earlier is the safe side for the deadline.
        let sent = Instant::now();
        let ttl_secs = inner.config.ttl_secs();
        let resp = inner
            .call("lease grant", || {
                let mut lease = inner.client.lease_client();
                async move { lease.grant(ttl_secs, None).await }
            })
            .await?;
        if resp.ttl() <= 0 || resp.id() == 0 {
            return Err(Error::new(
                ErrorKind::Store,
                format!(
                    "etcd granted a lease with ttl {} and id {}",
                    resp.ttl(),
                    resp.id()
                ),
            ));
        }
        let id = resp.id();
        let granted = Duration::from_secs(resp.ttl() as u64);
        inner.record_lease(id);
        liveness.confirm(sent, granted);
        let stop = CancellationToken::new();
        tokio::spawn(
            keepalive(inner.clone(), id, granted, liveness.clone(), stop.clone()).instrument(
                tracing::debug_span!("etcd_keepalive", lease = %format_args!("{id:x}")),
            ),
        );
        tracing::debug!(lease = %format_args!("{id:x}"), ttl = ?granted, "etcd lease granted");
        Ok(EtcdSession {
            inner,
            lease: id,
            liveness,
            stop,
            watchers: Mutex::new(HashMap::new()),
        })
    }

    fn key(&self, pfx: &str) -> String {
        // Exactly Go's `pfx + "/" + fmt.Sprintf("%x", lease)`.
        format!("{pfx}/{:x}", self.lease)
    }

    fn session_lost(&self, why: &str) -> Error {
        Error::new(ErrorKind::SessionLost, why.to_string())
    }

    /// Deletes our key if it is still the one created at `rev`.
    async fn delete_if(&self, key: &str, rev: i64) -> Result<()> {
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, rev)])
            .and_then([TxnOp::delete(key, None)]);
        self.inner.txn("delete contender", txn).await.map(|_| ())
    }

    /// Starts watching a held entry: its own key for deletion, the revoke
    /// marker for a put naming it. Stops when the entry is finished.
    fn watch_held(&self, req: &AcquireRequest, key: String, token: i64, rev: i64) {
        let stop = CancellationToken::new();
        let old = self
            .watchers
            .lock()
            .expect("poisoned")
            .insert(key.clone(), stop.clone());
        if let Some(old) = old {
            old.cancel();
        }
        let held = Held {
            stop,
            inner: self.inner.clone(),
            liveness: self.liveness.clone(),
            lease: self.lease,
            signals: req.signals.clone(),
            marker: self.inner.marker_key(&req.name),
            key,
            token,
        };
        tokio::spawn(held.run(rev + 1));
    }

    /// Runs a read-only or idempotent txn, retrying connection trouble
    /// while the lease can still be alive: a waiter keeps its place in the
    /// queue across a short outage instead of re-queueing at the end.
    async fn retrying(&self, what: &str, txn: Txn) -> Result<etcd_client::TxnResponse> {
        let mut delay = Duration::from_millis(50);
        loop {
            match self.inner.txn(what, txn.clone()).await {
                Err(e) if e.kind() == ErrorKind::Connection && self.liveness.is_alive() => {
                    tracing::debug!(error = %e, "{what} failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
                r => return r,
            }
        }
    }

    /// Stops the watcher of `key` before we delete it ourselves.
    fn stop_watching(&self, key: &str) {
        if let Some(t) = self.watchers.lock().expect("poisoned").remove(key) {
            t.cancel();
        }
    }
}

/// The keepalive loop: one `LeaseKeepAlive` stream, one request every
/// TTL/3 (every TTL/10 while the link is slow). Requests are not held back by slow answers: etcd answers them in
/// order, so each answer is matched with its request's send time, and an
/// answer with `ttl > 0` confirms the lease from that send time, however
/// late it comes. An answer with ttl 0 (or "lease not found") means the
/// lease is gone. A stream that breaks, or leaves a request unanswered for
/// a whole TTL, is replaced.
async fn keepalive(
    inner: Arc<Inner>,
    id: i64,
    ttl: Duration,
    liveness: Arc<SessionLiveness>,
    stop: CancellationToken,
) {
    let period = ttl / 3;
    let fast = ttl / 10;
    let retry = period.min(Duration::from_millis(300));
    let mut next = Instant::now() + period;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = liveness.lost() => return,
            _ = tokio::time::sleep_until(next) => {}
        }
        // Opening the stream sends the first keepalive and waits for its
        // answer; it fails with "lease not found" when the lease is gone.
        let sent = Instant::now();
        inner.requests.fetch_add(1, Ordering::Relaxed);
        let mut lease = inner.client.lease_client();
        let opened = tokio::select! {
            _ = stop.cancelled() => return,
            _ = liveness.lost() => return,
            r = tokio::time::timeout(ttl, lease.keep_alive(id)) => r,
        };
        let (mut keeper, mut answers) = match opened {
            Ok(Ok(s)) => {
                liveness.confirm(sent, ttl);
                s
            }
            Ok(Err(e)) => {
                let e = error::map(e, "lease keepalive");
                if e.kind() == ErrorKind::SessionLost {
                    tracing::warn!("etcd lease not found");
                    liveness.lose(LossReason::SessionExpired);
                    return;
                }
                tracing::debug!(error = %e, "opening the keepalive stream failed; retrying");
                next = Instant::now() + retry;
                continue;
            }
            Err(_) => {
                tracing::debug!("the keepalive stream did not open within the TTL; retrying");
                next = Instant::now();
                continue;
            }
        };
        let mut last_sent = sent;
        let mut last_rtt = sent.elapsed();
        let mut pending: VecDeque<Instant> = VecDeque::new();
        loop {
            let stale = pending.front().map(|s| *s + ttl);
            // A slow link (an answer took more than TTL/10, or one is
            // overdue by that much) renews every TTL/10 instead of TTL/3:
            // the deadline runs from the send time of the newest answered
            // request, so sending more often keeps it from falling behind
            // by the latency plus a whole period.
            let slow = last_rtt > fast || pending.front().is_some_and(|s| s.elapsed() > fast);
            let next = last_sent + if slow { fast } else { period };
            // Also wake when the oldest answer becomes overdue, to switch.
            let wake = match pending.front() {
                Some(f) if !slow => next.min(*f + fast),
                _ => next,
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = liveness.lost() => return,
                _ = tokio::time::sleep_until(wake) => {
                    let now = Instant::now();
                    if now < next {
                        continue;
                    }
                    inner.requests.fetch_add(1, Ordering::Relaxed);
                    if keeper.keep_alive().await.is_err() {
                        break;
                    }
                    pending.push_back(now);
                    last_sent = now;
                }
                answer = answers.message() => match answer {
                    Ok(Some(r)) => {
                        let Some(sent) = pending.pop_front() else { continue };
                        last_rtt = sent.elapsed();
                        if r.ttl() > 0 {
                            liveness.confirm(sent, Duration::from_secs(r.ttl() as u64));
                        } else {
                            tracing::warn!("etcd lease expired");
                            liveness.lose(LossReason::SessionExpired);
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let e = error::map(e, "lease keepalive");
                        if e.kind() == ErrorKind::SessionLost {
                            liveness.lose(LossReason::SessionExpired);
                            return;
                        }
                        tracing::debug!(error = %e, "keepalive stream failed");
                        break;
                    }
                },
                _ = tokio::time::sleep_until(stale.unwrap_or(next)), if stale.is_some() => {
                    tracing::debug!("a keepalive went unanswered for a TTL; reopening the stream");
                    break;
                }
            }
        }
        next = Instant::now() + retry;
    }
}

/// Watches one held entry until the client layer finishes with it.
struct Held {
    stop: CancellationToken,
    inner: Arc<Inner>,
    liveness: Arc<SessionLiveness>,
    lease: i64,
    signals: EntrySignals,
    marker: String,
    key: String,
    token: i64,
}

impl Held {
    async fn run(self, mut from: i64) {
        let mut delay = Duration::from_millis(100);
        loop {
            let mut own = self
                .inner
                .hub
                .watch(self.key.clone(), from, WatchFilterType::NoPut);
            let mut mark =
                self.inner
                    .hub
                    .watch(self.marker.clone(), from, WatchFilterType::NoDelete);
            loop {
                tokio::select! {
                    _ = self.signals.finished() => return,
                    _ = self.stop.cancelled() => return,
                    ev = own.next() => match ev {
                        WatchEvent::Delete => return self.deleted().await,
                        WatchEvent::Put(_) => {}
                        WatchEvent::Lost => break,
                    },
                    ev = mark.next() => match ev {
                        WatchEvent::Put(kv) => self.marked(&kv),
                        WatchEvent::Delete => {}
                        WatchEvent::Lost => break,
                    },
                }
            }
            drop((own, mark));
            // The watch broke (connection, compaction): re-read the entry
            // and the marker, then watch again from there.
            loop {
                tokio::select! {
                    _ = self.signals.finished() => return,
                    _ = self.stop.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(2));
                let txn = Txn::new().and_then([
                    TxnOp::get(self.key.clone(), None),
                    TxnOp::get(self.marker.clone(), None),
                ]);
                let resp = match self.inner.txn("re-read held entry", txn).await {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::debug!(error = %e, key = %self.key, "re-reading a held entry failed");
                        continue;
                    }
                };
                let (Ok(own), Ok(mark)) = (range_at(&resp, 0), range_at(&resp, 1)) else {
                    continue;
                };
                match own.kvs().first() {
                    Some(kv) if kv.create_revision() == self.token => {}
                    _ => return self.deleted().await,
                }
                if let Some(kv) = mark.kvs().first() {
                    self.marked(kv);
                }
                from = header_revision(&resp) + 1;
                break;
            }
        }
    }

    fn marked(&self, kv: &KeyValue) {
        if kv.value() == self.key.as_bytes() && kv.mod_revision() > self.token {
            tracing::debug!(key = %self.key, "revoke requested");
            self.signals.request_revoke();
        }
    }

    /// Our key is gone: a forced break, or our lease ended with it.
    async fn deleted(&self) {
        if let Some(reason) = self.liveness.loss() {
            self.signals.lose(reason);
            return;
        }
        match self.inner.lease_alive(self.lease).await {
            Ok(false) => {
                self.signals.lose(LossReason::SessionExpired);
                self.liveness.lose(LossReason::SessionExpired);
            }
            _ => self.signals.lose(LossReason::EntryDeleted),
        }
        tracing::debug!(key = %self.key, reason = ?self.signals.loss(), "held entry lost");
    }
}

#[async_trait]
impl StoreSession for EtcdSession {
    fn id(&self) -> String {
        format!("{:x}", self.lease)
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired> {
        if !self.liveness.is_alive() {
            return Err(self.session_lost("the etcd lease is lost"));
        }
        let pfx = self.inner.lock_prefix(&req.name);
        let pfx_slash = format!("{pfx}/");
        let key = self.key(&pfx);

        // One txn: create our key if it does not exist (else read it), and
        // read the oldest contender.
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key.clone(),
                    "",
                    Some(PutOptions::new().with_lease(self.lease)),
                ),
                TxnOp::get(pfx_slash.clone(), Some(first_created().with_limit(1))),
            ])
            .or_else([
                TxnOp::get(key.clone(), None),
                TxnOp::get(pfx_slash.clone(), Some(first_created().with_limit(1))),
            ]);
        // A lost reply is retried with the same txn: it finds the key the
        // first try created instead of creating a second one.
        let resp = if req.wait {
            self.retrying("enqueue", txn).await?
        } else {
            self.inner.txn("enqueue", txn).await?
        };
        let mut rev = header_revision(&resp);
        let my_rev = if resp.succeeded() {
            rev
        } else {
            let own = range_at(&resp, 0)?;
            match own.kvs().first() {
                Some(kv) => kv.create_revision(),
                None => return Err(Error::new(ErrorKind::Internal, "own key vanished in a txn")),
            }
        };
        let owner = self
            .inner
            .first_contender(&pfx_slash, range_at(&resp, 1)?.kvs(), first_created())
            .await?;
        let holds = owner.map_or(true, |kv| kv.create_revision() == my_rev);

        if !holds {
            if !req.wait {
                self.delete_if(&key, my_rev).await?;
                return Err(Error::new(
                    ErrorKind::WouldBlock,
                    format!("lock {} is held", req.name),
                ));
            }
            // Wait for the deletion of the nearest older contender, one at
            // a time: a release wakes only the next waiter.
            loop {
                let txn = Txn::new().and_then([
                    TxnOp::get(
                        pfx_slash.clone(),
                        Some(last_created_before(my_rev).with_limit(1)),
                    ),
                    TxnOp::get(key.clone(), None),
                ]);
                let resp = self.retrying("find predecessor", txn).await?;
                rev = header_revision(&resp);
                // Never grant on an expired lease (etcd #11456, #9921).
                match range_at(&resp, 1)?.kvs().first() {
                    Some(kv) if kv.create_revision() == my_rev => {}
                    _ => {
                        return Err(self.session_lost(
                            "our etcd key vanished while waiting (lease expired or key deleted)",
                        ))
                    }
                }
                let pred = self
                    .inner
                    .first_contender(
                        &pfx_slash,
                        range_at(&resp, 0)?.kvs(),
                        last_created_before(my_rev),
                    )
                    .await?;
                let Some(pred) = pred else { break };
                let mut w =
                    self.inner
                        .hub
                        .watch(pred.key().to_vec(), rev + 1, WatchFilterType::NoPut);
                tracing::trace!(
                    lock = %req.name,
                    waits_for = %String::from_utf8_lossy(pred.key()),
                    "waiting"
                );
                match w.next().await {
                    WatchEvent::Delete | WatchEvent::Put(_) => {}
                    WatchEvent::Lost => {
                        // Stream broke: re-check after a pause, do not spin.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }
        self.watch_held(req, key.clone(), my_rev, rev);
        Ok(Acquired {
            token: my_rev as u64,
            entry: key,
        })
    }

    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()> {
        // Delete only the key we were granted (etcd #22082: never a newer
        // key of the same lease), and the revoke marker with it.
        let pfx = self.inner.lock_prefix(&req.name);
        let key = self.key(&pfx);
        self.stop_watching(&key);
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                held.token as i64,
            )])
            .and_then([
                TxnOp::delete(key, None),
                TxnOp::delete(self.inner.marker_key(&req.name), None),
            ]);
        self.inner.txn("release", txn).await?;
        Ok(())
    }

    async fn abandon(&self, req: &AcquireRequest) -> Result<()> {
        // The client layer runs no newer attempt of ours on this name
        // while abandoning, so the key is this attempt's if it exists.
        let pfx = self.inner.lock_prefix(&req.name);
        let key = self.key(&pfx);
        let marker = self.inner.marker_key(&req.name);
        self.stop_watching(&key);
        let txn = Txn::new()
            .when([Compare::value(
                marker.clone(),
                CompareOp::Equal,
                key.clone(),
            )])
            .and_then([
                TxnOp::delete(key.clone(), None),
                TxnOp::delete(marker, None),
            ])
            .or_else([TxnOp::delete(key, None)]);
        self.inner.txn("abandon", txn).await?;
        Ok(())
    }

    async fn close(&self) -> Result<()> {
        self.stop.cancel();
        let id = self.lease;
        match self
            .inner
            .call("lease revoke", || {
                let mut lease = self.inner.client.lease_client();
                async move { lease.revoke(id).await }
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::SessionLost => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Drop for EtcdSession {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
