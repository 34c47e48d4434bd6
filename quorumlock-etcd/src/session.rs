//! One etcd lease per client session, its ONE keepalive task, and the lock
//! protocol of Go's `concurrency.Mutex` on top of it.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, GetOptions, GetResponse, KeyValue, PutOptions, Txn, TxnOp, WatchFilterType,
};
use quorumlock_core::backend::{
    removed_if_found, AcquireRequest, Acquired, Backoff, ContendedLocks, InFlightWrites, LastGrant,
    QuietGrants, SessionLiveness, StoreSession,
};
use quorumlock_core::{Error, ErrorKind, LockKind, Result};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::core::{first_created, header_revision, range_at, EtcdCore, SessionState};
use crate::layout;
use crate::monitor::{keepalive, Seen, WatchedEntry};
use crate::watch::WatchEvent;

/// One lease, shared by every lock of one client.
pub(crate) struct EtcdSession {
    /// What the keepalive and the watches of our held entries share with
    /// us: the core, the lease, its liveness and the keepalive's stop.
    state: Arc<SessionState>,
    /// Per lock prefix, our last grant that found no other contender (by
    /// the revision that created our key): after a quiet cycle the next
    /// acquire is one put (a one-op txn guarded by compares only: the
    /// attempt's fence is absent, the key is new), like the floor, instead
    /// of Go's txn with its reads (see [`QuietGrants`]). A put at any other revision than
    /// two past the grant sends the acquire on to the enqueue txn, which
    /// finds the key the put made and reads the lock. At most
    /// [`LONE_GRANTS_KEPT`] prefixes.
    lone_grants: QuietGrants,
    /// Per lock prefix, whether our last enqueue found others in line:
    /// the next waiting mutex or writer then reads what it waits for in
    /// its enqueue txn (see `enqueue`). At most [`LONE_GRANTS_KEPT`].
    contended: ContendedLocks,
    /// The create revision of each unfinished attempt's key, by attempt,
    /// once the enqueue answer has told it: what `abandon` deletes. A
    /// mutex or semaphore key is the same for every attempt of the lease,
    /// so only the create revision tells this attempt's key from the next
    /// one's (issue 17, finding 2).
    attempts: Mutex<HashMap<uuid::Uuid, i64>>,
}

/// An entry a waiter waits for: its key and create revision.
type Predecessor = (Vec<u8>, i64);

/// What the enqueue txn of an acquire learned.
struct Enqueued {
    /// Our key's create revision.
    my_rev: i64,
    /// The revision of the latest read.
    rev: i64,
    /// Whether our key was rewritten (a revoke request) when last read.
    revoked: bool,
    /// The oldest contender other than us, if any.
    oldest: Option<KeyValue>,
    /// What we wait for, if the enqueue txn read it already.
    first: Option<Vec<KeyValue>>,
}

/// How many lock prefixes a session remembers a lone grant for.
const LONE_GRANTS_KEPT: usize = 1024;

impl fmt::Debug for EtcdSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdSession")
            .field("lease", &format_args!("{:x}", self.state.lease))
            .finish()
    }
}

impl EtcdSession {
    /// Grants the lease (confirming it with the grant's send time) and
    /// starts the keepalive task.
    pub(crate) async fn open(core: Arc<EtcdCore>, liveness: Arc<SessionLiveness>) -> Result<Self> {
        // A retried grant (see `EtcdCore::call`) keeps the first send time:
        // earlier is the safe side for the deadline.
        let sent = Instant::now();
        let ttl_secs = core.config.ttl_secs();
        let resp = core
            .call("lease grant", || {
                let mut lease = core.client.lease_client();
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
        core.record_lease(id);
        liveness.confirm(sent, granted);
        let state = Arc::new(SessionState {
            core,
            lease: id,
            liveness,
            stop: CancellationToken::new(),
        });
        tokio::spawn(
            keepalive(state.clone(), granted).instrument(
                tracing::debug_span!("etcd_keepalive", lease = %format_args!("{id:x}")),
            ),
        );
        tracing::debug!(lease = %format_args!("{id:x}"), ttl = ?granted, "etcd lease granted");
        Ok(EtcdSession {
            state,
            lone_grants: QuietGrants::new(LONE_GRANTS_KEPT),
            contended: ContendedLocks::new(LONE_GRANTS_KEPT),
            attempts: Mutex::new(HashMap::new()),
        })
    }

    fn session_lost(&self, why: &str) -> Error {
        Error::new(ErrorKind::SessionLost, why.to_string())
    }

    /// Deletes our key if it is still the one created at `rev`, and the
    /// other keys of its request of `count` permits.
    async fn delete_if(&self, key: &str, rev: i64, count: u32) -> Result<()> {
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, rev)])
            .and_then(deletes(key, count));
        self.state
            .core
            .txn("delete contender", txn)
            .await
            .map(|_| ())
    }

    /// The fence of `req`'s attempt: `<ns>/.fence/<lease hex>/<contender>`,
    /// outside every lock prefix (no segment of a lock's key starts with `.`),
    /// so Go's `concurrency.Mutex` and `etcdctl lock` never see it. Every
    /// write that creates the attempt's key requires it to be absent; it
    /// is written (with our lease, so it ends with the session) only when
    /// a write of the attempt may still land (see `fenced_removal`).
    fn fence_key(&self, req: &AcquireRequest) -> String {
        format!(
            "{}.fence/{:x}/{}",
            self.state.core.namespace_prefix(),
            self.state.lease,
            req.contender.simple()
        )
    }

    /// Removes the attempt's key `key` and fences the attempt off, in one
    /// txn, for an attempt with a write of unknown outcome
    /// ([`InFlightWrites::outcome_unknown`]): a late copy of that write
    /// then fails its compare on the fence and creates nothing. `rev` is
    /// the key's create revision if known (0: absent, or not known); a key
    /// found at another revision is this attempt's as well (the client
    /// layer starts no newer attempt of ours on the name until this
    /// returns, and the late copy of an abandon or release deletes nothing
    /// but the revision it names), and is removed with the same txn.
    /// Whether the key was at `rev` at the first try (for a release: our
    /// held key was still there).
    async fn fenced_removal(&self, req: &AcquireRequest, key: &str, rev: i64) -> Result<bool> {
        let fence = TxnOp::put(
            self.fence_key(req),
            "",
            Some(PutOptions::new().with_lease(self.state.lease)),
        );
        let mut rev = rev;
        for tries in 0..8 {
            let mut then = deletes(key, req.count);
            then.push(fence.clone());
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, rev)])
                .and_then(then)
                .or_else([TxnOp::get(key, None)]);
            let resp = self.state.core.txn("fence contender", txn).await?;
            if resp.succeeded() {
                return Ok(tries == 0);
            }
            rev = range_at(&resp, 0)?
                .kvs()
                .first()
                .map_or(0, |kv| kv.create_revision());
        }
        Err(Error::new(
            ErrorKind::Connection,
            "our etcd key kept changing while fencing off an attempt",
        ))
    }

    /// Watches a held entry's own key from `from`: a delete is a loss, a
    /// put a revoke request. The watch starts after
    /// [`quorumlock_core::backend::HELD_WATCH_DELAY`] (from `from`, so nothing in between
    /// is missed), and not at all if the lock is released before. No task
    /// and no channel per held entry: the backend's watch task calls the
    /// entry's [`Sink`](crate::watch::Sink).
    fn watch_held(&self, req: &AcquireRequest, key: String, token: i64, from: i64) {
        let held = WatchedEntry {
            session: self.state.clone(),
            signals: req.signals.clone(),
            key: key.into_boxed_str(),
            token,
            value: (req.kind == LockKind::Election).then(|| {
                Arc::new(std::sync::Mutex::new(Seen {
                    value: layout::election_value(&req.value),
                    rev: from - 1,
                }))
            }),
        };
        held.subscribe(from, true);
    }

    /// The grant of our key `key` created at `token`, known at revision
    /// `rev`: watches it from `rev + 1` and passes on a revoke request
    /// made while we waited.
    fn granted(
        &self,
        req: &AcquireRequest,
        key: String,
        token: i64,
        rev: i64,
        revoked: bool,
    ) -> Acquired {
        self.watch_held(req, key.clone(), token, rev + 1);
        if revoked {
            req.signals.request_revoke();
        }
        Acquired {
            token: token as u64,
            entry: key,
        }
    }

    /// Runs a read-only or idempotent txn, retrying connection trouble
    /// while the lease can still be alive: a waiter keeps its place in the
    /// queue across a short outage instead of re-queueing at the end.
    /// A txn that writes an attempt's entry passes the attempt's `writes`.
    /// Retries back off from 50 ms to 1 s, with jitter.
    async fn retrying(
        &self,
        what: &'static str,
        txn: Txn,
        writes: Option<&InFlightWrites>,
    ) -> Result<etcd_client::TxnResponse> {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            let sent = match writes {
                Some(w) => {
                    let (core, txn) = (self.state.core.clone(), txn.clone());
                    w.run_judged(async move { core.txn(what, txn).await }, unanswered)
                        .await
                }
                None => self.state.core.txn(what, txn.clone()).await,
            };
            match sent {
                Err(e) if e.kind() == ErrorKind::Connection && self.state.liveness.is_alive() => {
                    tracing::debug!(error = %e, "{what} failed; retrying");
                    backoff.wait().await;
                }
                r => return r,
            }
        }
    }

    /// The contenders that `kind` may have to wait for, when they are
    /// older than `before` (None: all, in the enqueue txn where everything
    /// else is older than our new key), newest first, at most `n`.
    fn ahead_op(&self, pfx: &str, kind: LockKind, before: Option<i64>) -> TxnOp {
        let (key, opts) = layout::ahead_query(pfx, kind, before);
        TxnOp::get(key, Some(opts))
    }

    /// Reads the range `key`/`opts` in one txn with our own key `mine`,
    /// which must still be the one created at `my_rev`: a decision taken
    /// on a range read must rest on a snapshot that shows our key (a key
    /// deleted between two reads must never be granted; issue 17,
    /// finding 4).
    async fn range_with_mine(
        &self,
        mine: &str,
        my_rev: i64,
        key: impl Into<Vec<u8>>,
        opts: GetOptions,
    ) -> Result<GetResponse> {
        let txn = Txn::new().and_then([TxnOp::get(mine, None), TxnOp::get(key, Some(opts))]);
        let resp = self.state.core.txn("range contenders", txn).await?;
        match range_at(&resp, 0)?.kvs().first() {
            Some(kv) if kv.create_revision() == my_rev => range_at(&resp, 1),
            _ => Err(self.session_lost(
                "our etcd key vanished while reading the lock (lease expired or key deleted)",
            )),
        }
    }

    /// The first contender among `kvs` (a range answer with `limit 1` of
    /// [`first_created`]); if that one was a nested lock's key, the whole
    /// range is read again (with our own key `mine`) and filtered.
    async fn first_contender(
        &self,
        pfx_slash: &str,
        kvs: &[KeyValue],
        mine: &str,
        my_rev: i64,
    ) -> Result<Option<KeyValue>> {
        match kvs.first() {
            None => return Ok(None),
            Some(kv) if layout::is_contender(pfx_slash, kv.key()) => return Ok(Some(kv.clone())),
            Some(_) => {}
        }
        let all = self
            .range_with_mine(mine, my_rev, pfx_slash, first_created())
            .await?;
        Ok(all
            .kvs()
            .iter()
            .find(|kv| layout::is_contender(pfx_slash, kv.key()))
            .cloned())
    }

    /// The entries `kind` waits for among the range answer `kvs` (direct
    /// children only, `mine` left out); if the limited answer contained
    /// other keys (nested lock names), the range is read again in full,
    /// with our own key.
    async fn ahead(
        &self,
        pfx: &str,
        kind: LockKind,
        before: Option<i64>,
        kvs: &[KeyValue],
        mine: &str,
        my_rev: i64,
    ) -> Result<Vec<KeyValue>> {
        let pfx_slash = format!("{pfx}/");
        let n = layout::ahead_limit(kind);
        let keep = |kv: &&KeyValue| {
            layout::is_contender(&pfx_slash, kv.key()) && kv.key() != mine.as_bytes()
        };
        let mut out: Vec<KeyValue> = kvs.iter().filter(keep).take(n).cloned().collect();
        if out.len() < n
            && kvs
                .iter()
                .any(|kv| !layout::is_contender(&pfx_slash, kv.key()))
        {
            let (key, opts) = layout::ahead_query(pfx, kind, before.or(Some(my_rev)));
            let all = self
                .range_with_mine(mine, my_rev, key, opts.with_limit(0))
                .await?;
            out = all.kvs().iter().filter(keep).take(n).cloned().collect();
        }
        Ok(out)
    }
    /// The acquire protocol (see the crate README, "On the store").
    ///
    /// # Cancel safety
    /// May be dropped at any await point: the client layer then calls
    /// `abandon`, which deletes this attempt's key by the create revision
    /// kept in `attempts`, or reads it first if it was never learned.
    async fn enqueue_and_wait(&self, req: &AcquireRequest) -> Result<Acquired> {
        if !self.state.liveness.is_alive() {
            return Err(self.session_lost("the etcd lease is lost"));
        }
        let pfx = self.state.core.lock_prefix(&req.name);
        let key = layout::request_key(&pfx, req, self.state.lease);
        let value = layout::value(req.kind, SystemTime::now(), &req.value);
        let fence = self.fence_key(req);
        let last = self.lone_grants.take(&pfx);
        if req.count <= 1 && last.is_some_and(|l| l.quiet) {
            if let Some(granted) = self
                .quiet_put(req, &pfx, &key, &value, &fence, last)
                .await?
            {
                return Ok(granted);
            }
        }
        let mut q = self.enqueue(req, &pfx, &key, value, fence).await?;
        self.contended.note(&pfx, q.oldest.is_some());
        self.wait_turn(req, &pfx, &key, &mut q).await?;
        if q.oldest.is_none() && req.count <= 1 {
            self.lone_grants.keep(&pfx, last, q.my_rev as u64);
        }
        Ok(self.granted(req, key, q.my_rev, q.rev, q.revoked))
    }

    /// After a quiet cycle: our key by one put; granted if nothing else was
    /// written since our last grant (`None`: the enqueue txn goes on).
    async fn quiet_put(
        &self,
        req: &AcquireRequest,
        pfx: &str,
        key: &str,
        value: &[u8],
        fence: &str,
        last: Option<LastGrant>,
    ) -> Result<Option<Acquired>> {
        let (key, value, fence) = (key.to_string(), value.to_vec(), fence.to_string());
        // After a quiet cycle: one put (see `lone_grants`), in a txn
        // only for its guards (still one request and one revision): the
        // attempt is not fenced off (see `fenced_removal`), and the key
        // is new (a late copy never rewrites a held key).
        let txn = Txn::new()
            .when([
                Compare::version(fence.clone(), CompareOp::Equal, 0),
                Compare::create_revision(key.clone(), CompareOp::Equal, 0),
            ])
            .and_then([TxnOp::put(
                key.clone(),
                value.clone(),
                Some(PutOptions::new().with_lease(self.state.lease)),
            )]);
        let core = self.state.core.clone();
        let put = async move { core.txn("enqueue", txn).await };
        match req.writes.run_judged(put, unanswered).await {
            Ok(r) => {
                let rev = header_revision(&r);
                if r.succeeded() && last.is_some_and(|l| l.alone_at(rev as u64)) {
                    self.lone_grants.keep(pfx, last, rev as u64);
                    return Ok(Some(self.granted(req, key, rev, rev, false)));
                }
                // Something else was written meanwhile: the enqueue
                // txn below finds our key and reads the lock.
                tracing::trace!(lock = %req.name, "a write since our last cycle");
            }
            // Unknown outcome: the enqueue txn finds out.
            Err(e) if e.kind() == ErrorKind::Connection && req.wait => {}
            Err(e) => return Err(e),
        }
        Ok(None)
    }

    /// The enqueue txn: creates our key (or finds it), reads the oldest
    /// contender, and what we would wait for; refuses a conflicting kind.
    async fn enqueue(
        &self,
        req: &AcquireRequest,
        pfx: &str,
        key: &str,
        value: Vec<u8>,
        fence: String,
    ) -> Result<Enqueued> {
        let kind = req.kind;
        let pfx_slash = format!("{pfx}/");
        let key = key.to_string();
        // One txn: create our key if it does not exist (else read it), read
        // the oldest contender (for the kind check), and what we would
        // wait for (all of it is older than a key this txn creates).
        // A mutex or writer holds when it is the oldest: that read is
        // enough (Go's one-request uncontended path), but for a lock our
        // last enqueue found contended, where it is likely to wait: then
        // it reads what it would wait for in the same txn as well, and,
        // queued, watches that at once instead of reading it first (one
        // request fewer per wait; a range read more per enqueue, which
        // cost the bench's 10,000 distinct free locks 11 %).
        let first_is_enough = matches!(kind, LockKind::Exclusive | LockKind::Write)
            && !(req.wait && self.contended.contains(pfx));
        let mut then = vec![
            TxnOp::put(
                key.clone(),
                value.clone(),
                Some(PutOptions::new().with_lease(self.state.lease)),
            ),
            TxnOp::get(pfx_slash.clone(), Some(first_created().with_limit(1))),
        ];
        if !first_is_enough {
            then.push(self.ahead_op(pfx, kind, None));
        }
        // A request for several permits: its other keys in the same txn
        // (one create revision), after the reads (which so show only ours
        // of them).
        then.extend(layout::sibling_keys(&key, req.count).into_iter().map(|k| {
            TxnOp::put(
                k,
                value.clone(),
                Some(PutOptions::new().with_lease(self.state.lease)),
            )
        }));
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                Compare::version(fence, CompareOp::Equal, 0),
            ])
            .and_then(then)
            .or_else([
                TxnOp::get(key.clone(), None),
                TxnOp::get(pfx_slash.clone(), Some(first_created().with_limit(1))),
            ]);
        // A lost reply is retried with the same txn: it finds the key the
        // first try created instead of creating a second one.
        // Each try runs to its end even if this acquire is dropped
        // (`req.writes`): etcd serves the streams of one connection
        // concurrently, so an abandon sent while the txn is in flight
        // could be applied before it and leave our new key behind.
        let resp = if req.wait {
            self.retrying("enqueue", txn, Some(&req.writes)).await?
        } else {
            let core = self.state.core.clone();
            req.writes
                .run_judged(async move { core.txn("enqueue", txn).await }, unanswered)
                .await?
        };
        let rev = header_revision(&resp);
        let mut revoked = false;
        let my_rev = if resp.succeeded() {
            rev
        } else {
            // Our key was there (a retried txn, or the put above).
            match range_at(&resp, 0)?.kvs().first() {
                Some(kv) => {
                    revoked = kv.mod_revision() > kv.create_revision();
                    kv.create_revision()
                }
                None => return Err(Error::new(ErrorKind::Internal, "own key vanished in a txn")),
            }
        };
        self.attempt_at(req, my_rev);
        // Semaphores mix only with semaphores of the same permit count.
        let oldest = self
            .first_contender(&pfx_slash, range_at(&resp, 1)?.kvs(), &key, my_rev)
            .await?
            .filter(|o| o.create_revision() != my_rev);
        // The conflict first: it needs no more reads (what we would wait
        // for may need a read of its own, which could fail first).
        if let Some(o) = &oldest {
            let theirs = layout::kind_of(o);
            if kind.conflicts_with(theirs) {
                // Conflict is the answer even if this delete fails: the
                // client layer abandons (deletes) the attempt after any
                // error but WouldBlock.
                if let Err(e) = self.delete_if(&key, my_rev, req.count).await {
                    tracing::debug!(error = %e, "removing a conflicting entry failed");
                }
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!("lock {} is in use as {theirs:?}, not {kind:?}", req.name),
                ));
            }
        }
        let first = if first_is_enough {
            // Not first: a try-acquire needs no more; a waiter reads
            // its nearest predecessor below.
            match &oldest {
                None => Some(Vec::new()),
                Some(o) if !req.wait => Some(vec![o.clone()]),
                Some(_) => None,
            }
        } else if resp.succeeded() {
            let kvs = range_at(&resp, 2)?;
            Some(self.ahead(pfx, kind, None, kvs.kvs(), &key, my_rev).await?)
        } else {
            None
        };

        Ok(Enqueued {
            my_rev,
            rev,
            revoked,
            oldest,
            first,
        })
    }

    /// Waits until nothing we wait for is ahead of our key (watching only
    /// that), re-reading after every change; `q` is updated with the
    /// revision of the last read.
    async fn wait_turn(
        &self,
        req: &AcquireRequest,
        pfx: &str,
        key: &str,
        q: &mut Enqueued,
    ) -> Result<()> {
        let kind = req.kind;
        let my_rev = q.my_rev;
        // Watches on the entries we wait for, created and confirmed by
        // etcd before the latest read: (their keys and create revisions,
        // the watches, the lowest store revision etcd created one at).
        let mut watching: Option<(Vec<Predecessor>, Vec<crate::watch::Watch>, i64)> = None;
        loop {
            let ahead = match q.first.take() {
                Some(a) => a,
                None => {
                    // Our own key and what we wait for, in one snapshot.
                    let txn = Txn::new().and_then([
                        TxnOp::get(key, None),
                        self.ahead_op(pfx, kind, Some(my_rev)),
                    ]);
                    let resp = self.retrying("find predecessor", txn, None).await?;
                    q.rev = header_revision(&resp);
                    // Never grant on an expired lease or a deleted key
                    // (etcd #11456, #9921, and the RWMutex recipe's
                    // double holder, #16221).
                    match range_at(&resp, 0)?.kvs().first() {
                        Some(kv) if kv.create_revision() == my_rev => {
                            q.revoked = kv.mod_revision() > my_rev;
                        }
                        _ => return Err(self.session_lost(
                            "our etcd key vanished while waiting (lease expired or key deleted)",
                        )),
                    }
                    let kvs = range_at(&resp, 1)?;
                    self.ahead(pfx, kind, Some(my_rev), kvs.kvs(), key, my_rev)
                        .await?
                }
            };
            // A semaphore entry never holds beside an older entry of
            // another kind (a Go mutex key that queued behind our permits,
            // or a conflicting request that is about to take its key
            // back): it waits for that one like for a writer.
            let foreign: Vec<KeyValue> = ahead
                .iter()
                .filter(|kv| kind.conflicts_with(layout::kind_of(kv)))
                .cloned()
                .collect();
            // Else the shared rule decides on the line our read shows.
            let ahead = if foreign.is_empty() {
                let kinds: Vec<LockKind> = ahead
                    .iter()
                    .map(|kv| layout::line_kind(kv.key(), kv.value()))
                    .collect();
                if kind == LockKind::Upgrade {
                    // Only the holder it waits for, wherever it is.
                    let line: Vec<(&[u8], LockKind)> =
                        ahead.iter().map(|kv| kv.key()).zip(kinds).collect();
                    match layout::waited_upgrade(key.as_bytes(), &line) {
                        Ok(None) => break,
                        Ok(Some(n)) => ahead[n - 1..n].to_vec(),
                        Err(()) => {
                            self.delete_if(key, my_rev, req.count).await?;
                            return Err(quorumlock_core::backend::refused_upgrade(&req.name));
                        }
                    }
                } else {
                    // Our other keys of a request for several permits are
                    // the nearest entries ahead of ours (one revision).
                    let siblings = req.count.max(1) as usize - 1;
                    let line: Vec<LockKind> =
                        std::iter::repeat_n(kind, siblings).chain(kinds).collect();
                    match layout::waited(kind, &line) {
                        None => break,
                        Some(n) => ahead[..n.saturating_sub(siblings).min(ahead.len())].to_vec(),
                    }
                }
            } else {
                foreign
            };
            if !req.wait {
                self.delete_if(key, my_rev, req.count).await?;
                return Err(Error::new(
                    ErrorKind::WouldBlock,
                    format!("lock {} is held", req.name),
                ));
            }
            // Watch only what we wait for: the nearest older contender
            // (writer), the nearest older writer (reader), or the
            // `permits` nearest older entries (semaphore).
            let preds: Vec<Predecessor> = ahead
                .iter()
                .map(|kv| (kv.key().to_vec(), kv.create_revision()))
                .collect();
            let mut ws = match watching.take() {
                // Watches etcd confirmed before the read above: they
                // report any delete after it. etcd starts a watch "from
                // now" at the revision it read before registering it; a
                // write that commits in between leaves the watch behind,
                // served by the 100 ms catch-up loop (issue 20). That can
                // only have happened if the store moved between a
                // watch's start and our read: then one more watch each,
                // from now, makes the wait late only if both are. (If
                // those cannot be created, the first ones still report.)
                Some((watched, mut ws, at)) if watched == preds => {
                    if q.rev > at {
                        if let Ok((more, _)) = self.watch_ahead(req, &preds).await {
                            ws.extend(more);
                        }
                    }
                    ws
                }
                _ => {
                    // Watch from now, not from `rev + 1`: etcd serves a
                    // watch that starts in the past from a loop that runs
                    // every 100 ms (the handoff tail of issue 20). Once
                    // etcd has created the watches, the loop reads again
                    // (at a revision at or after their start), so a delete
                    // between the read above and the watches is not
                    // missed; the grant still rests only on that read.
                    match self.watch_ahead(req, &preds).await {
                        Ok((ws, at)) => watching = Some((preds, ws, at)),
                        Err(pause) if !pause.is_zero() => tokio::time::sleep(pause).await,
                        Err(_) => {}
                    }
                    continue;
                }
            };
            tracing::trace!(lock = %req.name, waits_for = ahead.len(), "waiting");
            let pause = next_change(&mut ws).await;
            drop(ws);
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
            }
        }
        Ok(())
    }

    /// Watches `preds` from now: the watches, once etcd created every
    /// one, with the lowest revision it created one at (a write after that
    /// revision may have left a watch behind); else the pause that a failed
    /// create calls for (zero: read again at once), the watches dropped.
    async fn watch_ahead(
        &self,
        req: &AcquireRequest,
        preds: &[Predecessor],
    ) -> std::result::Result<(Vec<crate::watch::Watch>, i64), Duration> {
        let mut ws: Vec<_> = preds
            .iter()
            .map(|(k, _)| {
                self.state
                    .core
                    .hub
                    .watch(k.clone(), 0, WatchFilterType::NoPut)
            })
            .collect();
        // None: all created; Some(pause): read again after it
        // without keeping them.
        let mut pause = None;
        let mut created = i64::MAX;
        for w in &mut ws {
            pause = match w.next().await {
                WatchEvent::Created(at) => {
                    tracing::trace!(lock = %req.name, at, "predecessor watch created");
                    created = created.min(at);
                    continue;
                }
                WatchEvent::Lost => Some(Duration::from_millis(100)),
                WatchEvent::Refused => Some(Duration::from_secs(1)),
                // A delete already: read again at once.
                WatchEvent::Delete | WatchEvent::Put(_) => Some(Duration::ZERO),
            };
            break;
        }
        match pause {
            None => Ok((ws, created)),
            Some(pause) => Err(pause),
        }
    }

    /// Remembers the create revision of `req`'s key for `abandon`.
    fn attempt_at(&self, req: &AcquireRequest, rev: i64) {
        self.attempts
            .lock()
            .expect("poisoned")
            .insert(req.contender, rev);
    }

    /// `req` left nothing to abandon, or was abandoned.
    fn attempt_done(&self, req: &AcquireRequest) {
        self.attempts
            .lock()
            .expect("poisoned")
            .remove(&req.contender);
    }
}

/// Waits for a change to any of `ws`: `None` for a delete (read again
/// at once), `Some(pause)` when a watch was lost or refused.
async fn next_change(ws: &mut [crate::watch::Watch]) -> Option<Duration> {
    loop {
        let nexts = ws.iter_mut().map(|w| Box::pin(w.next()));
        let (ev, _, _) = futures::future::select_all(nexts).await;
        match ev {
            // Created again on a new stream, from where it was.
            WatchEvent::Created(_) => continue,
            // Cancelled (compaction): re-check after a pause.
            WatchEvent::Lost => break Some(Duration::from_millis(100)),
            // Never created: re-check (a read that is refused too
            // ends the acquire), but do not hammer etcd with
            // creates it refuses.
            WatchEvent::Refused => break Some(Duration::from_secs(1)),
            _ => break None,
        }
    }
}

/// The deletes of our key `key` and of the other keys of its request of
/// `count` permits ([`layout::sibling_keys`]).
fn deletes(key: &str, count: u32) -> Vec<TxnOp> {
    layout::sibling_keys(key, count)
        .into_iter()
        .chain([key.to_string()])
        .map(|k| TxnOp::delete(k, None))
        .collect()
}

/// Whether a write ended without etcd's answer (a request timeout or a
/// transport error): it may have been applied, or be applied later.
fn unanswered<T>(r: &Result<T>) -> bool {
    r.as_ref().is_err_and(|e| e.kind() == ErrorKind::Connection)
}

#[async_trait]
impl StoreSession for EtcdSession {
    fn id(&self) -> String {
        format!("{:x}", self.state.lease)
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired> {
        let r = self.enqueue_and_wait(req).await;
        // Granted, or WouldBlock (the key is deleted already): nothing to
        // abandon. Any other error is followed by `abandon`, which needs
        // the revision (a dropped acquire never gets here).
        if r.is_ok() || r.as_ref().is_err_and(|e| e.kind() == ErrorKind::WouldBlock) {
            self.attempt_done(req);
        }
        r
    }

    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()> {
        // Delete only the key we were granted (etcd #22082: never a newer
        // key of the same lease). The client layer has finished the
        // entry's signals, so its watch ignores this delete and ends.
        let pfx = self.state.core.lock_prefix(&req.name);
        if req.writes.outcome_unknown() {
            // An earlier try of this attempt may still land (and create
            // the key again after this delete): fence it off as well.
            self.lone_grants.released(&pfx, held.token, false);
            let found = self
                .fenced_removal(req, &held.entry, held.token as i64)
                .await?;
            return removed_if_found(req, found);
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                held.entry.clone(),
                CompareOp::Equal,
                held.token as i64,
            )])
            .and_then(deletes(&held.entry, req.count));
        let released = self.state.core.txn("release", txn).await;
        // A release that lands later than one past the grant had writes
        // during the hold: the next acquire would miss, forget the grant.
        let one_write = matches!(&released, Ok(r) if r.succeeded()
            && u64::try_from(header_revision(r)).ok() == held.token.checked_add(1));
        self.lone_grants.released(&pfx, held.token, one_write);
        // Not at our grant's revision: deleted (a break, an expired
        // lease) and perhaps taken again, never ours to delete.
        removed_if_found(req, released?.succeeded())
    }

    async fn set_value(&self, req: &AcquireRequest, held: &Acquired, value: &[u8]) -> Result<()> {
        if req.kind != LockKind::Election {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "only an election candidate's value can change",
            ));
        }
        // Only while our key is the one we were granted (its create
        // revision is the token); the lease stays ours. Only a value that
        // differs from the one etcd has is written, decided by etcd in
        // the same txn: our watch takes a put that keeps the value for a
        // revoke request, and what the caller last proclaimed is not
        // necessarily what etcd has (a proclaim whose answer was lost may
        // have been applied; retried, it must write nothing, and the old
        // value proclaimed back must be written).
        let key = held.entry.as_str();
        let stored = layout::election_value(value);
        let txn = Txn::new()
            .when([
                Compare::create_revision(key, CompareOp::Equal, held.token as i64),
                Compare::value(key, CompareOp::NotEqual, stored.clone()),
            ])
            .and_then([TxnOp::put(
                key,
                stored,
                Some(PutOptions::new().with_lease(self.state.lease)),
            )])
            .or_else([TxnOp::get(key, None)]);
        let resp = self.state.core.txn("proclaim", txn).await?;
        if resp.succeeded() {
            return Ok(());
        }
        match range_at(&resp, 0)?.kvs().first() {
            // Still ours: it has this value already.
            Some(kv) if kv.create_revision() == held.token as i64 => Ok(()),
            _ => Err(Error::new(
                ErrorKind::LockLost,
                format!("{}: our key {} is gone", req.name, held.entry),
            )),
        }
    }

    async fn abandon(&self, req: &AcquireRequest) -> Result<()> {
        // Never a plain delete: a mutex or semaphore key is the same for
        // every attempt of the lease, and this request may reach etcd late
        // (its answer lost, retried meanwhile), after our next attempt
        // created the key again. Guarded by the attempt's create revision,
        // a late copy deletes nothing newer (issue 17, finding 2).
        let pfx = self.state.core.lock_prefix(&req.name);
        let key = layout::request_key(&pfx, req, self.state.lease);
        let known = self
            .attempts
            .lock()
            .expect("poisoned")
            .get(&req.contender)
            .copied();
        if req.writes.outcome_unknown() {
            // A write of this attempt may still land: remove and fence in
            // one txn (never a read first: the late write could land
            // between the read and the delete).
            let _ = self.fenced_removal(req, &key, known.unwrap_or(0)).await?;
            self.attempt_done(req);
            return Ok(());
        }
        let rev = match known {
            Some(rev) => rev,
            None => {
                // The enqueue answer never came: the key, if any, is this
                // attempt's (the client layer starts no newer attempt of
                // ours on the name until this returns); a late copy of the
                // read is harmless, and the delete below is guarded.
                let resp = self
                    .state
                    .core
                    .get("abandon", key.as_bytes(), GetOptions::new())
                    .await?;
                match resp.kvs().first() {
                    Some(kv) => kv.create_revision(),
                    None => {
                        self.attempt_done(req);
                        return Ok(());
                    }
                }
            }
        };
        self.delete_if(&key, rev, req.count).await?;
        self.attempt_done(req);
        Ok(())
    }

    async fn close(&self) -> Result<()> {
        self.state.stop.cancel();
        let id = self.state.lease;
        match self
            .state
            .core
            .call("lease revoke", || {
                let mut lease = self.state.core.client.lease_client();
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
        self.state.stop.cancel();
    }
}
