//! One Consul session: acquire/release/abandon, the renew task and the
//! monitor of held locks.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lockcore::backend::{
    finish_on_drop, AcquireRequest, Acquired, EntrySignals, InFlightWrites, LastGrant, QuietGrants,
    SessionLiveness, StoreSession, HELD_WATCH_DELAY,
};
use lockcore::{Error, ErrorKind, LockKind, LossReason, Result};
use serde_json::json;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::{op, Block, KvEntry, Record, Txn, TxnError};
use crate::backend::{
    line_holds, now_ms, read_view, rw_revoke, Inner, Keys, View, FENCE_FLAGS, LOCK_FLAGS,
    QUEUE_FLAGS, READ_FLAGS, WRITE_FLAGS,
};
use crate::error::{map, ApiError};
use crate::semaphore::{SemLock, SemView, SEMAPHORE_FLAGS};

/// Longest wait of one blocking query (Consul caps it at 10 minutes).
const LONG_POLL: Duration = Duration::from_secs(300);
/// The monitor waits at least this long between two namespace reads, so
/// that a busy namespace costs a bounded request rate per client.
const MONITOR_MIN_GAP: Duration = Duration::from_millis(50);
/// Consecutive failed monitor reads tolerated before the held locks are
/// declared lost: at least this many, and for at least TTL/2 (so that a
/// leader election the session itself survives does not lose its locks).
const MONITOR_MAX_FAILURES: u32 = 6;
/// How long opening a session waits for the agent's answer. Long on
/// purpose: a waiter whose session was lost to a partition opens a new one
/// as soon as the partition heals, instead of failing the acquire.
const SESSION_CREATE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a session given up locally is retried to be destroyed.
const ABANDONED_DESTROY_PATIENCE: Duration = Duration::from_secs(600);
/// How many contended mutex names a session remembers (see
/// `Shared::contended`); past that it forgets them all.
const CONTENDED_MEMORY: usize = 1024;
/// Unexpected txn failures tolerated in one acquire before giving up.
const MAX_ACQUIRE_RETRIES: u32 = 20;
/// How long a session keeps an attempt's fence (see
/// [`ConsulSession::fence`]): far longer than any request of ours is in
/// flight (10 s timeout); a copy delivered later than this is not fenced.
const FENCE_KEEP: Duration = Duration::from_secs(15 * 60);
/// At most this many fences per session: past it the oldest go first.
const FENCE_MAX: usize = 1024;
/// At most this many old fences are deleted with a new one (a Consul txn
/// takes at most 64 ops).
const FENCE_DELETES: usize = 32;

/// One Consul session (behavior `delete`, TTL renewed at TTL/2).
pub(crate) struct ConsulSession {
    s: Arc<Shared>,
}

struct Shared {
    backend: Arc<Inner>,
    id: String,
    liveness: Arc<SessionLiveness>,
    stop: CancellationToken,
    watch: Mutex<Watch>,
    watch_changed: Notify,
    /// Per-lock write serialization: a write of an acquire runs to its end
    /// even if the acquire is dropped, and `abandon` queues behind it.
    ops: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Mutexes (by `.lock` key) that had other contenders of ours when
    /// this session last released them: their next acquire skips the
    /// one-txn fast path (it would only take `.lock` to give it back).
    contended: Mutex<std::collections::HashSet<String>>,
    /// Tokens of mutexes held through the fast path: they have no queue
    /// key, so their release is `.lock` and its revoke marker only.
    fast_held: Mutex<std::collections::HashSet<u64>>,
    /// Per mutex (`.lock` key), our last fast grant (by index) whose txn
    /// read nobody else in line: after a quiet cycle the next fast acquire
    /// leaves out its `get-tree`, like the floor's single `lock` (see
    /// [`QuietGrants`]; every Consul write is one raft entry, and a
    /// written key shows its index as `ModifyIndex`). At most
    /// [`CONTENDED_MEMORY`] mutexes.
    lone_grants: QuietGrants,
    /// Our fences (see [`ConsulSession::fence`]), oldest first, with the
    /// time each was written: deleted after [`FENCE_KEEP`] or past
    /// [`FENCE_MAX`], else they go with the session.
    fences: Mutex<VecDeque<(String, Instant)>>,
}

/// What [`ConsulSession::try_fast`] found when it took the lock.
struct FastTry {
    view: View,
    /// Our `.lock`'s index.
    token: u64,
    /// The view is the lock at the grant (not a read after it): a grant
    /// that finds nobody in line is remembered in `Shared::lone_grants`.
    at_grant: bool,
    /// What the acquire took from `lone_grants`.
    last: Option<LastGrant>,
}

/// Held locks that the monitor watches, and the index and key prefix of
/// its read in flight (`None`: no read in flight).
#[derive(Default)]
struct Watch {
    entries: HashMap<String, Watched>,
    inflight: Option<(u64, String)>,
}

/// The longest common prefix of the watched `.lock` keys: the narrowest
/// prefix one blocking query can watch them all under. For one held lock
/// it is `<ns>/<name>/.lock`, which also covers its `.lock.revoke`.
fn common_prefix<'a>(mut keys: impl Iterator<Item = &'a String>) -> String {
    let Some(first) = keys.next() else {
        return String::new();
    };
    let mut len = first.len();
    for k in keys {
        len = first
            .bytes()
            .zip(k.bytes())
            .take(len)
            .take_while(|(a, b)| a == b)
            .count();
    }
    while !first.is_char_boundary(len) {
        len -= 1;
    }
    first[..len].to_string()
}

struct Watched {
    token: u64,
    revoke_key: String,
    signals: EntrySignals,
    /// For a semaphore permit (the map key is our contender key).
    sem: Option<SemWatched>,
    /// When it was handed to the monitor.
    since: Instant,
    /// Compared with a namespace read at or after `token` at least once.
    checked: bool,
}

/// A held semaphore permit: our contender key must stay ours at
/// `contender_index`, and `.lock`'s holders must name our session.
struct SemWatched {
    lock_key: String,
    contender_index: u64,
}

/// How an acquire treats transient failures (`ErrorKind::Connection`):
/// a waiting acquire retries them with backoff while its session is alive
/// (the client layer cancels it when the session is lost); a try-acquire
/// returns them.
struct Transient<'a> {
    wait: bool,
    liveness: &'a SessionLiveness,
    backoff: Duration,
}

impl<'a> Transient<'a> {
    fn new(wait: bool, liveness: &'a SessionLiveness) -> Self {
        Transient {
            wait,
            liveness,
            backoff: Duration::from_millis(50),
        }
    }

    /// Returns `e` unless it is transient and we may wait; then sleeps.
    async fn absorb(&mut self, e: Error) -> Result<()> {
        if !(self.wait && e.kind() == ErrorKind::Connection && self.liveness.is_alive()) {
            return Err(e);
        }
        tracing::debug!(error = %e, "transient failure while waiting for a lock; retrying");
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(Duration::from_secs(2));
        Ok(())
    }

    /// Runs `f` until it succeeds or fails for good.
    async fn retry<T, F, Fut>(&mut self, mut f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        loop {
            match f().await {
                Err(e) => self.absorb(e).await?,
                ok => {
                    self.backoff = Duration::from_millis(50);
                    return ok;
                }
            }
        }
    }
}

impl fmt::Debug for ConsulSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsulSession")
            .field("id", &self.s.id)
            .finish()
    }
}

/// The index for the next blocking query after one at `index` answered
/// `idx`: always the answer's (so a query never spins on an old index), or
/// a fresh start if the index went backwards (Consul's advice: a restored
/// snapshot, a new leader with an older table).
fn next_index(index: u64, idx: u64) -> u64 {
    if idx < index {
        1
    } else {
        idx.max(1)
    }
}

fn go_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

fn session_lost(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::SessionLost, msg.into())
}

fn would_block(keys: &Keys) -> Error {
    Error::new(ErrorKind::WouldBlock, format!("lock {} is held", keys.lock))
}

/// Whether a rolled-back lock of a key named by our session says that the
/// session is gone: "invalid session", or a lock-delay, which Consul
/// checks first and puts only on keys of an invalidated session.
fn session_gone(what: &str) -> bool {
    what.contains("invalid session") || what.contains("lock delay")
}

/// Whether a txn that failed so may still be applied: no answer (a
/// timeout, a cut connection), or an agent's 5xx (a leader election, an
/// RPC timeout: the write may be on its way to the leader), or an answer
/// we could not read. A 4xx (429 included) was refused unapplied.
fn unanswered(e: &ApiError) -> bool {
    match e {
        ApiError::Transport(_) | ApiError::Decode(_) => true,
        ApiError::Status { code, .. } => *code >= 500,
    }
}

fn failed(what: &str, errs: &[TxnError]) -> Error {
    Error::new(
        ErrorKind::Store,
        format!("Consul: {what} was rolled back: {errs:?}"),
    )
}

impl ConsulSession {
    /// Creates the session, confirms it with the send time of the create,
    /// and starts the renew task and the monitor.
    pub(crate) async fn open(
        backend: Arc<Inner>,
        liveness: Arc<SessionLiveness>,
    ) -> Result<ConsulSession> {
        let cfg = &backend.config;
        let body = json!({
            "Name": format!("quorumlock:{}", cfg.namespace),
            "TTL": go_duration(cfg.ttl),
            "LockDelay": go_duration(cfg.lock_delay),
            "Behavior": "delete",
            // Both fields: Consul 1.8 takes `Checks: []` as "no node checks"
            // and otherwise defers to `NodeChecks`.
            "Checks": cfg.checks,
            "NodeChecks": cfg.checks,
        });
        let sent = Instant::now();
        let id = backend
            .api
            .session_create(&body, SESSION_CREATE_TIMEOUT)
            .await
            .map_err(|e| map(e, "creating a session"))?;
        liveness.confirm(sent, cfg.ttl);
        if sent.elapsed() > cfg.ttl / 4 {
            // A slow answer (a healed partition): the create's send time
            // is too old to vouch for the session; renew it now.
            let sent = Instant::now();
            match backend.api.session_renew(&id, SESSION_CREATE_TIMEOUT).await {
                Ok(true) => liveness.confirm(sent, cfg.ttl),
                Ok(false) => return Err(session_lost("the new Consul session is already gone")),
                Err(e) => {
                    let _ = backend.api.session_destroy(&id).await;
                    return Err(map(e, "renewing a new session"));
                }
            }
        }
        tracing::debug!(session = %id, ttl = ?cfg.ttl, "Consul session created");
        let s = Arc::new(Shared {
            backend,
            id,
            liveness,
            stop: CancellationToken::new(),
            watch: Mutex::new(Watch::default()),
            watch_changed: Notify::new(),
            ops: Mutex::new(HashMap::new()),
            contended: Mutex::new(Default::default()),
            fast_held: Mutex::new(Default::default()),
            lone_grants: QuietGrants::new(CONTENDED_MEMORY),
            fences: Mutex::new(VecDeque::new()),
        });
        tokio::spawn(keepalive(s.clone()));
        tokio::spawn(monitor(s.clone()));
        Ok(ConsulSession { s })
    }

    pub(crate) fn id_str(&self) -> &str {
        &self.s.id
    }

    /// Runs a write txn for one lock under the lock's write mutex, to its
    /// end even if the caller is dropped ([`finish_on_drop`]), so a write
    /// is never left half-known: a later `abandon` of the same lock runs
    /// after it.
    async fn write(&self, keys: &Keys, ops: Vec<op::Op>, what: &'static str) -> Result<Txn> {
        self.write_as(keys, ops, what, None).await
    }

    /// A write of attempt `req` that may create or take one of its keys:
    /// [`write`](Self::write), refused by the agent once the attempt is
    /// fenced off (a `check-not-exists` of its fence, last so that the op
    /// indexes of `ops` stay as they are; it reads nothing), and counted in
    /// `req.writes`, which records an end without the agent's answer (the
    /// txn may still be applied later: see [`ConsulSession::fence`]).
    async fn write_attempt(
        &self,
        keys: &Keys,
        req: &AcquireRequest,
        mut ops: Vec<op::Op>,
        what: &'static str,
    ) -> Result<Txn> {
        ops.push(op::check_not_exists(&self.fence_key(req)));
        self.write_as(keys, ops, what, Some(&req.writes)).await
    }

    async fn write_as(
        &self,
        keys: &Keys,
        ops: Vec<op::Op>,
        what: &'static str,
        writes: Option<&InFlightWrites>,
    ) -> Result<Txn> {
        let m = {
            let mut map = self.s.ops.lock().expect("poisoned");
            map.entry(keys.tree.clone()).or_default().clone()
        };
        let guard = m.lock_owned().await;
        // No await between taking the mutex and handing the write over: a
        // drop of the caller either sent nothing or leaves the write running.
        let s = self.s.clone();
        let tree = keys.tree.clone();
        let txn = async move {
            let r = s.backend.api.txn(ops).await;
            drop(guard);
            let mut map = s.ops.lock().expect("poisoned");
            if map.get(&tree).is_some_and(|m| Arc::strong_count(m) == 1) {
                map.remove(&tree);
            }
            r
        };
        let r = match writes {
            Some(w) => {
                w.run_judged(txn, |r| r.as_ref().is_err_and(unanswered))
                    .await
            }
            None => finish_on_drop(txn).await,
        };
        r.map_err(|e| map(e, what))
    }

    /// The fence of attempt `req`: `<ns>/.fence/<session>/<contender>`,
    /// outside every lock's keys (no lock-name segment starts with `.`),
    /// so neither our readers nor `consul lock` (`-n`) ever see it.
    fn fence_key(&self, req: &AcquireRequest) -> String {
        format!(
            "{}.fence/{}/{}",
            self.s.backend.config.namespace_prefix(),
            self.s.id,
            req.contender.simple()
        )
    }

    /// Fences attempt `req` off if one of its writes ended without the
    /// agent's answer ([`InFlightWrites::outcome_unknown`]): such a txn may
    /// still be applied, after this attempt was abandoned or released, and
    /// take `.lock` or a place in line for nobody. Every such write
    /// requires the fence to be absent ([`write_attempt`](Self::write_attempt)),
    /// so once it stands nothing of the attempt can appear any more, and
    /// the removal that follows sees the last of it. The fence is locked
    /// by our session (it goes with it); fences older than [`FENCE_KEEP`],
    /// or past the newest [`FENCE_MAX`], are deleted in the same txn.
    /// Called before the removal; idempotent (a retried removal writes it
    /// again). A transient failure fails the removal (the client layer
    /// retries it); a refusal for good (ACL) is logged, and the removal
    /// goes on without the fence.
    async fn fence(&self, keys: &Keys, req: &AcquireRequest) -> Result<()> {
        if !req.writes.outcome_unknown() {
            return Ok(());
        }
        let key = self.fence_key(req);
        let record = Record {
            quorumlock: 1,
            contender: Some(req.contender.to_string()),
            since_ms: Some(now_ms()),
            ..Record::default()
        };
        let mut ops = vec![op::lock(&key, &self.s.id, FENCE_FLAGS, &record.encode())];
        let expired = expired_fences(
            &self.s.fences.lock().expect("poisoned"),
            &key,
            Instant::now(),
        );
        ops.extend(expired.iter().map(|k| op::delete(k)));
        let written = match self.write(keys, ops, "fencing off an attempt").await {
            // Retried by the client layer, removal and all.
            Err(e) if e.is_retryable() => return Err(e),
            // Refused for good (an ACL without `ns/.fence/`): remove
            // without the fence rather than leave the attempt's keys.
            Err(e) => {
                tracing::warn!(lock = %keys.lock, error = %e,
                    "cannot fence off an attempt; a late write of it may still land");
                return Ok(());
            }
            Ok(t) => t,
        };
        match written {
            Txn::Done(_) => {
                let mut f = self.s.fences.lock().expect("poisoned");
                f.retain(|(k, _)| !expired.contains(k) && *k != key);
                f.push_back((key, Instant::now()));
                tracing::debug!(lock = %keys.lock, contender = %req.contender,
                    "a write of the attempt may still land: fenced it off");
                Ok(())
            }
            // Our session is gone, and every key of ours with it; a late
            // write names the session and fails as well.
            Txn::Failed(errs) if errs.iter().any(|e| session_gone(&e.what)) => Ok(()),
            Txn::Failed(errs) => {
                tracing::warn!(lock = %keys.lock, ?errs,
                    "cannot fence off an attempt; a late write of it may still land");
                Ok(())
            }
        }
    }

    async fn leave_queue(&self, keys: &Keys) -> Result<()> {
        match self
            .write(
                keys,
                vec![op::delete(&keys.queue(&self.s.id))],
                "leaving the queue",
            )
            .await?
        {
            Txn::Done(_) => Ok(()),
            Txn::Failed(errs) => Err(failed("leaving the queue", &errs)),
        }
    }

    /// Waits until `pred` (the entry ahead of ours) is gone: a blocking
    /// query on that exact key (not a prefix: a revoke marker next to it
    /// must not wake us), always from the index the last answer gave.
    ///
    /// # Cancel safety
    /// Only reads; safe to drop.
    async fn wait_gone(&self, pred: &KvEntry) -> Result<()> {
        let mut index = pred.modify_index.max(1);
        loop {
            let (idx, entry) = self
                .s
                .backend
                .api
                .kv_get(
                    &pred.key,
                    Block {
                        index,
                        wait: LONG_POLL,
                        consistent: false,
                    },
                )
                .await
                .map_err(|e| map(e, "waiting for the contender ahead"))?;
            let still =
                entry.is_some_and(|e| e.create_index == pred.create_index && e.holder().is_some());
            if !still {
                return Ok(());
            }
            index = next_index(index, idx);
        }
    }

    /// Waits until `.lock` (held by another session, or broken) changes;
    /// returns it as it is then. Blocks on the exact key `.lock` (the
    /// revoke marker `.lock.revoke` shares its prefix: a revoke request
    /// must not wake, let alone spin, the waiter), and always from the
    /// index the last answer gave.
    ///
    /// # Cancel safety
    /// Only reads; safe to drop.
    async fn wait_lock(&self, keys: &Keys, held: &KvEntry) -> Result<Option<KvEntry>> {
        let mut index = held.modify_index.max(1);
        loop {
            let (idx, entry) = self
                .s
                .backend
                .api
                .kv_get(
                    &keys.lock,
                    Block {
                        index,
                        wait: LONG_POLL,
                        consistent: true,
                    },
                )
                .await
                .map_err(|e| map(e, "waiting for the holder"))?;
            let same = entry.as_ref().is_some_and(|e| {
                e.modify_index == held.modify_index && e.holder() == held.holder()
            });
            if !same {
                return Ok(entry);
            }
            index = next_index(index, idx);
        }
    }

    /// Hands a granted lock to the monitor.
    fn watch(&self, keys: &Keys, token: u64, signals: &EntrySignals) {
        self.watch_key(&keys.lock, &keys.revoke, token, signals)
    }

    /// Hands a granted entry `key` (locked by this session, at
    /// `ModifyIndex == token` while we hold it) to the monitor.
    fn watch_key(&self, key: &str, revoke_key: &str, token: u64, signals: &EntrySignals) {
        self.watch_entry(key, revoke_key, token, signals, None)
    }

    fn watch_entry(
        &self,
        key: &str,
        revoke_key: &str,
        token: u64,
        signals: &EntrySignals,
        sem: Option<SemWatched>,
    ) {
        let covers = sem.as_ref().map(|s| s.lock_key.clone());
        let mut w = self.s.watch.lock().expect("poisoned");
        w.entries.insert(
            key.to_string(),
            Watched {
                token,
                revoke_key: revoke_key.to_string(),
                signals: signals.clone(),
                checked: false,
                since: Instant::now(),
                sem,
            },
        );
        // A read in flight from before the grant (index < token) over a
        // prefix that covers this lock returns by itself, since the grant
        // moved that prefix's index; one at or past the token may have been
        // judged without this entry, one over another prefix does not see
        // it: redo the read.
        let wake = w.inflight.as_ref().is_none_or(|(q, prefix)| {
            *q >= token
                || !key.starts_with(prefix.as_str())
                || covers
                    .as_ref()
                    .is_some_and(|c| !c.starts_with(prefix.as_str()))
        });
        drop(w);
        if wake {
            self.s.watch_changed.notify_one();
        }
    }

    fn unwatch(&self, keys: &Keys) {
        self.unwatch_key(&keys.lock)
    }

    fn unwatch_key(&self, key: &str) {
        self.s.watch.lock().expect("poisoned").entries.remove(key);
    }
}

#[async_trait]
impl StoreSession for ConsulSession {
    fn id(&self) -> String {
        self.s.id.clone()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired> {
        match req.kind {
            LockKind::Exclusive => {}
            LockKind::Read | LockKind::Write => return self.acquire_rw(req).await,
            LockKind::Semaphore { permits } => return self.acquire_sem(req, permits).await,
            _ => {
                return Err(Error::new(
                    ErrorKind::Store,
                    "the Consul backend does not know this lock kind",
                ))
            }
        }
        let s = &self.s;
        if !s.liveness.is_alive() {
            return Err(session_lost("the Consul session is lost"));
        }
        let keys = Keys::new(&s.backend.config, &req.name);
        let qkey = keys.queue(&s.id);
        let contender = req.contender.to_string();
        let record = || Record {
            quorumlock: 1,
            contender: Some(contender.clone()),
            since_ms: Some(now_ms()),
            ..Record::default()
        };
        // A `.lock` that this acquire wrote (its contender id, our session,
        // not rewritten by a break): ours, whatever the answer said.
        let mine = |l: &KvEntry| {
            l.holder() == Some(s.id.as_str())
                && l.flags == LOCK_FLAGS
                && l.record()
                    .is_some_and(|r| !r.broken && r.contender.as_deref() == Some(&contender))
        };

        // A waiting acquire rides out transient trouble (a reset, a leader
        // election) without losing its place in the queue: reads are
        // retried, and a write whose answer was lost is checked by reading
        // back. A try-acquire fails fast instead.
        let mut transient = Transient::new(req.wait, &s.liveness);
        let read = || read_view(&s.backend.api, &keys);

        // 0. Fast path, one request when the lock is free: take `.lock` in
        // one txn, guarded by `.lock` not existing, and read the whole
        // lock. No queue key: a waiter that comes while we hold treats us
        // as it treats a `consul lock` holder (it waits on `.lock`). If a
        // contender of ours was already queued (it is between the
        // previous holder's release and its own grant), we never report
        // the grant: one txn gives `.lock` back and joins the queue behind
        // it, so FIFO holds. Any failure (`.lock` held, a lock-delay,
        // another recipe's `.lock`) leaves nothing written and falls
        // through to the queued path.
        let mut fast = None;
        let contended = s.contended.lock().expect("poisoned").contains(&keys.lock);
        let tried = if contended {
            None
        } else {
            self.try_fast(req, &keys, record(), &mut transient).await?
        };
        if let Some(FastTry {
            view: v,
            token,
            at_grant,
            last,
        }) = tried
        {
            if v.line(&keys).is_empty() {
                // A marker of an earlier holder (see `release`) goes
                // with our release, as a queued holder's does.
                if v.revoke.is_none() {
                    self.s.fast_held.lock().expect("poisoned").insert(token);
                    if at_grant {
                        self.s.lone_grants.keep(&keys.lock, last, token);
                    }
                }
                self.watch(&keys, token, &req.signals);
                return Ok(Acquired {
                    token,
                    entry: keys.lock.clone(),
                });
            }
            self.note_contention(&keys, true);
            // Given back and joined: go on from the lock as that txn read
            // it. Else (our grant was taken from us first, or the join's
            // answer was lost and it did not go through) join below.
            fast = self
                .give_back(req, &keys, token, Some(record()), &mut transient)
                .await?
                .filter(|v| {
                    v.queue
                        .iter()
                        .any(|e| e.key == qkey && e.holder() == Some(s.id.as_str()))
                });
        } else if !contended {
            self.note_contention(&keys, true); // `.lock` is taken
        }

        // 1. Join our queue and read the whole lock in one request.
        let mut view = loop {
            if let Some(v) = fast.take() {
                break v;
            }
            let ops = vec![
                op::lock(&qkey, &s.id, QUEUE_FLAGS, &record().encode()),
                op::get_tree(&keys.tree),
            ];
            match self
                .write_attempt(&keys, req, ops, "joining the queue")
                .await
            {
                Ok(Txn::Done(results)) => {
                    break View::from_entries(&keys, read_after_lock(results));
                }
                // Our entry's key is named by our session: a lock-delay on
                // it means our own session was invalidated (Consul checks
                // the delay before the session, so it says that instead).
                Ok(Txn::Failed(errs)) if errs.iter().any(|e| session_gone(&e.what)) => {
                    return Err(session_lost("the Consul session is gone"));
                }
                Ok(Txn::Failed(errs)) => return Err(failed("joining the queue", &errs)),
                Err(e) => {
                    transient.absorb(e).await?;
                    let v = transient.retry(read).await?;
                    if v.queue
                        .iter()
                        .any(|e| e.key == qkey && e.holder() == Some(s.id.as_str()))
                    {
                        break v; // the join went through; its answer was lost
                    }
                }
            }
        };

        let mut retries = 0;
        let mut delay_wait = Duration::from_millis(50);
        loop {
            // Mutexes and read-write locks of one name share one line.
            let line = view.line(&keys);
            let pos = line
                .iter()
                .position(|(_, e)| e.key == qkey && e.holder() == Some(s.id.as_str()));
            // Our own `.lock` (a grant whose answer was lost, here or on the
            // fast path), at whatever place our queue key has: held by us
            // unless contenders of ours were in line before that grant,
            // then given back (at our token only).
            if let Some(l) = view.lock.clone().filter(|l| mine(l)) {
                let token = l.modify_index;
                let since = pos.map_or(token, |p| token.min(line[p].1.create_index));
                let ahead = line
                    .iter()
                    .any(|(_, e)| e.key != qkey && e.create_index < since);
                if !ahead {
                    self.watch(&keys, token, &req.signals);
                    return Ok(Acquired {
                        token,
                        entry: keys.lock.clone(),
                    });
                }
                if let Some(v) = self
                    .give_back(req, &keys, token, None, &mut transient)
                    .await?
                {
                    view = v;
                    continue;
                }
                view = transient.retry(read).await?;
                continue;
            }
            let Some(pos) = pos else {
                return Err(session_lost(
                    "our queue entry is gone (session expired or entry deleted)",
                ));
            };
            if pos > 0 {
                // 2. Not first among our contenders: wait for the one just
                // ahead to leave (herd-free: nobody else watches it).
                if !req.wait {
                    self.leave_queue(&keys).await?;
                    return Err(would_block(&keys));
                }
                let pred = line[pos - 1].1.clone();
                transient.retry(|| self.wait_gone(&pred)).await?;
                view = transient.retry(read).await?;
                continue;
            }
            // 3. First in our queue: only we look at `.lock`.
            if let Some(l) = &view.lock {
                if l.flags != LOCK_FLAGS {
                    return Err(Error::new(
                        ErrorKind::Conflict,
                        format!(
                            "{} has flags {:#x}, not the lock flags {LOCK_FLAGS:#x}: another recipe (a consul lock -n semaphore?) owns it",
                            keys.lock, l.flags
                        ),
                    ));
                }
                // Held by another session, or by ours but broken by an
                // operator (it goes at the end of the break's grace):
                // wait until it changes.
                let broken = l.record().is_some_and(|r| r.broken);
                if l.holder().is_some_and(|h| h != s.id || broken) {
                    if !req.wait {
                        self.leave_queue(&keys).await?;
                        return Err(would_block(&keys));
                    }
                    let held = l.clone();
                    view.lock = transient.retry(|| self.wait_lock(&keys, &held)).await?;
                    continue;
                }
            }
            let check = match &view.lock {
                Some(l) => op::check_index(&keys.lock, l.modify_index),
                None => op::check_not_exists(&keys.lock),
            };
            let ops = vec![
                check,
                op::check_session(&qkey, &s.id),
                op::lock(&keys.lock, &s.id, LOCK_FLAGS, &record().encode()),
                op::get(&keys.lock),
            ];
            let outcome = match self.write_attempt(&keys, req, ops, "taking the lock").await {
                Ok(o) => o,
                Err(e) => {
                    // Unknown outcome: read back (the loop recognizes our
                    // own grant by its contender id).
                    transient.absorb(e).await?;
                    view = transient.retry(read).await?;
                    continue;
                }
            };
            match outcome {
                Txn::Done(results) => {
                    let token = results
                        .iter()
                        .rev()
                        .find(|e| e.key == keys.lock)
                        .map(|e| e.modify_index)
                        .ok_or_else(|| {
                            Error::new(ErrorKind::Internal, "Consul txn returned no .lock entry")
                        })?;
                    self.watch(&keys, token, &req.signals);
                    return Ok(Acquired {
                        token,
                        entry: keys.lock.clone(),
                    });
                }
                Txn::Failed(errs) => {
                    let first = errs.first().cloned();
                    let (at, what) = first
                        .map(|e| (e.op_index, e.what))
                        .unwrap_or((usize::MAX, String::new()));
                    if at == 1 || what.contains("invalid session") {
                        return Err(session_lost(
                            "our queue entry or session is gone (session expired?)",
                        ));
                    }
                    if what.contains("lock delay") {
                        // The previous holder's session was invalidated
                        // within its lock-delay; nothing will wake us.
                        if !req.wait {
                            self.leave_queue(&keys).await?;
                            return Err(would_block(&keys));
                        }
                        tracing::debug!(lock = %keys.lock, "lock-delay in force; retrying");
                        tokio::time::sleep(delay_wait).await;
                        delay_wait = (delay_wait * 2).min(Duration::from_secs(1));
                    } else if at != 0 {
                        retries += 1;
                        if retries > MAX_ACQUIRE_RETRIES {
                            return Err(failed("taking the lock", &errs));
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    // `.lock` changed since we read it (or we slept): re-read.
                    view = transient.retry(read).await?;
                }
            }
        }
    }

    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()> {
        let keys = Keys::new(&self.s.backend.config, &req.name);
        // A write of this attempt may still land after the release.
        self.fence(&keys, req).await?;
        if matches!(req.kind, LockKind::Semaphore { .. }) {
            self.unwatch_key(&keys.sem.contender(&self.s.id));
            return self.remove_sem(&keys).await;
        }
        if matches!(req.kind, LockKind::Read | LockKind::Write) {
            self.unwatch_key(&held.entry);
            let ops = vec![
                op::delete_cas(&held.entry, held.token),
                op::delete(&rw_revoke(&held.entry)),
            ];
            return match self.write(&keys, ops, "releasing").await? {
                Txn::Done(_) => Ok(()),
                Txn::Failed(_) => self.remove_rw(&keys, &held.entry).await,
            };
        }
        self.unwatch(&keys);
        let fast = self
            .s
            .fast_held
            .lock()
            .expect("poisoned")
            .remove(&held.token);
        // `.lock` only at our token: never a newer holder's, never a newer
        // lock of this session (etcd #22082). A revoke marker names our
        // token (it is written under a check of `.lock`) or an earlier
        // holder's, left as below: ours to delete either way.
        let mut ops = vec![op::delete_cas(&keys.lock, held.token)];
        // A fast holder deletes the revoke marker only if it saw one: the
        // monitor reads from HELD_WATCH_DELAY after the grant, so a marker
        // written in a short hold's last moments may stay behind, locked
        // by our session and naming our token. No later holder takes it
        // for its own (tokens differ); the next one deletes it with its
        // release, a revoke request replaces it, and it goes with our
        // session.
        if !fast || req.signals.is_revoke_requested() {
            ops.push(op::delete(&keys.revoke));
        }
        if !fast {
            // A queued holder: its queue key, and whether anyone of ours
            // waits (then our next acquire queues at once instead of
            // trying the fast path). A fast holder had nobody ahead, has no
            // queue key, and learns of waiters from its next fast try.
            let qkey = keys.queue(&self.s.id);
            ops.extend([op::delete(&qkey), op::get_tree(&keys.tree)]);
        }
        let released = self.write(&keys, ops, "releasing").await;
        let one_txn = fast && matches!(released, Ok(Txn::Done(_)));
        self.s.lone_grants.released(&keys.lock, held.token, one_txn);
        match released? {
            Txn::Done(results) => {
                if !fast {
                    let v = View::from_entries(&keys, results);
                    self.note_contention(&keys, !(v.queue.is_empty() && v.rw.is_empty()));
                }
                Ok(())
            }
            Txn::Failed(errs) => {
                // `.lock` is not at our token: broken (gone, or another
                // holder's now) or rewritten behind our back while still
                // locked by this session. Remove what this session has.
                tracing::debug!(lock = %keys.lock, ?errs, "the lock was not at our token");
                self.remove_own(&keys).await
            }
        }
    }

    async fn abandon(&self, req: &AcquireRequest) -> Result<()> {
        let keys = Keys::new(&self.s.backend.config, &req.name);
        // A write of this attempt may still land after the removal.
        self.fence(&keys, req).await?;
        if matches!(req.kind, LockKind::Semaphore { .. }) {
            self.unwatch_key(&keys.sem.contender(&self.s.id));
            return self.remove_sem(&keys).await;
        }
        if matches!(req.kind, LockKind::Read | LockKind::Write) {
            let entry = keys.rw_entry(&self.s.id, &req.contender);
            self.unwatch_key(&entry);
            return self.remove_rw(&keys, &entry).await;
        }
        self.unwatch(&keys);
        self.remove_own(&keys).await
    }

    async fn close(&self) -> Result<()> {
        self.s.stop.cancel();
        self.s
            .backend
            .api
            .session_destroy(&self.s.id)
            .await
            .map_err(|e| map(e, "destroying the session"))
    }
}

impl ConsulSession {
    /// Remembers whether the mutex of `keys` had other contenders of ours
    /// (its next acquire then skips the fast path).
    fn note_contention(&self, keys: &Keys, contended: bool) {
        let mut c = self.s.contended.lock().expect("poisoned");
        if !contended {
            c.remove(&keys.lock);
        } else if !c.contains(&keys.lock) {
            if c.len() >= CONTENDED_MEMORY {
                c.clear();
            }
            c.insert(keys.lock.clone());
        }
    }

    /// The one-txn acquire of a free mutex: `check-not-exists` of `.lock`,
    /// `lock` of `.lock`, `get-tree` (none after a quiet cycle: see
    /// `Shared::lone_grants`).
    /// `None`: not taken (rolled back: not free; nothing written), or an
    /// answer lost and our `.lock` not found on reading back. `Some`: our
    /// `.lock` at our token, not broken, and the lock as it was at that
    /// grant (`at_grant`) or as a read after it shows our `.lock` still
    /// ours at that token (entries made after our grant, which are behind
    /// us, left out). No queue key of ours: the fast holder has none (a
    /// queue key is only for waiting, and the write costs a tenth of the
    /// cycle).
    ///
    /// # Cancel safety
    /// The write runs to its end if dropped ([`ConsulSession::write`]);
    /// the `abandon` that follows removes a `.lock` it took.
    async fn try_fast(
        &self,
        req: &AcquireRequest,
        keys: &Keys,
        record: Record,
        transient: &mut Transient<'_>,
    ) -> Result<Option<FastTry>> {
        let last = self.s.lone_grants.take(&keys.lock);
        let skip_read = last.is_some_and(|l| l.quiet);
        let contender = record.contender.clone();
        let mut ops = vec![
            op::check_not_exists(&keys.lock),
            op::lock(&keys.lock, &self.s.id, LOCK_FLAGS, &record.encode()),
        ];
        if !skip_read {
            ops.push(op::get_tree(&keys.tree));
        }
        // Last (it reads nothing): not once we are in line. A fast txn
        // whose answer was lost may land late, after this acquire queued;
        // a `.lock` of ours taken then, while a contender ahead of us waits
        // for it and we wait for that contender, would deadlock.
        ops.push(op::check_not_exists(&keys.queue(&self.s.id)));
        let read = || read_view(&self.s.backend.api, keys);
        // Our grant at `token`, judged on a read taken after it: only if
        // that read still shows `.lock` ours at that token and not broken
        // (else an operator broke it and someone else may hold it now:
        // its `.lock`, its index, are not ours). Entries made after our
        // grant are behind us.
        let after = |mut v: View, token: u64| {
            let ours = v.lock.as_ref().is_some_and(|l| {
                l.holder() == Some(self.s.id.as_str())
                    && l.modify_index == token
                    && l.flags == LOCK_FLAGS
                    && l.record()
                        .is_some_and(|r| !r.broken && r.contender == contender)
            });
            if !ours {
                tracing::debug!(lock = %keys.lock, token, "our fast grant was taken before we reported it");
                return None;
            }
            v.queue.retain(|e| e.create_index < token);
            v.rw.retain(|e| e.create_index < token);
            Some(FastTry {
                view: v,
                token,
                at_grant: false,
                last,
            })
        };
        let results = match self
            .write_attempt(keys, req, ops, "taking a free lock")
            .await
        {
            Ok(Txn::Done(results)) => results,
            Ok(Txn::Failed(_)) => return Ok(None),
            // Unknown outcome: read back. Our `.lock` (found by its
            // contender id) is a grant like any other; the queued path
            // also recognizes it later, at any place in the queue.
            Err(e) if e.kind() == ErrorKind::Connection && req.wait => {
                transient.absorb(e).await?;
                let v = transient.retry(read).await?;
                let Some(token) = v.lock.as_ref().map(|l| l.modify_index) else {
                    return Ok(None);
                };
                return Ok(after(v, token));
            }
            Err(e) => return Err(e),
        };
        let token = results
            .iter()
            .find(|e| e.key == keys.lock)
            .map(|e| e.modify_index)
            .ok_or_else(|| Error::new(ErrorKind::Internal, "Consul txn returned no .lock entry"))?;
        if !skip_read {
            let view = View::from_entries(keys, read_after_lock(results));
            return Ok(Some(FastTry {
                view,
                token,
                at_grant: true,
                last,
            }));
        }
        if last.is_some_and(|l| l.alone_at(token)) {
            let view = View::from_entries(keys, results);
            return Ok(Some(FastTry {
                view,
                token,
                at_grant: true,
                last,
            }));
        }
        // Something else was written meanwhile: read the lock.
        let v = transient.retry(read).await?;
        Ok(after(v, token))
    }

    /// Gives our `.lock` back (at our `token` only: never another holder's)
    /// because contenders of ours were in line before our grant, and (with
    /// `join`, the record of a queue key) joins the queue in the same txn.
    /// `Some(view)`: given back; the lock as the same txn (or, after a lost
    /// answer, a read) shows it. `None`: `.lock` was not ours at `token`
    /// any more (an operator's break, a lost session): nothing to give
    /// back, nothing written, and the caller goes on as if the grant never
    /// happened.
    ///
    /// # Cancel safety
    /// Each write runs to its end if dropped; the `abandon` that follows
    /// removes our `.lock` and queue key.
    async fn give_back(
        &self,
        req: &AcquireRequest,
        keys: &Keys,
        token: u64,
        join: Option<Record>,
        transient: &mut Transient<'_>,
    ) -> Result<Option<View>> {
        let s = &self.s;
        let qkey = keys.queue(&s.id);
        loop {
            // `check-index` first: `delete-cas` of a missing key succeeds.
            let mut ops = vec![
                op::check_index(&keys.lock, token),
                op::delete_cas(&keys.lock, token),
            ];
            if let Some(r) = &join {
                ops.push(op::lock(&qkey, &s.id, QUEUE_FLAGS, &r.encode()));
            }
            ops.push(op::get_tree(&keys.tree));
            let sent = if join.is_some() {
                self.write_attempt(keys, req, ops, "giving the lock back")
                    .await
            } else {
                self.write(keys, ops, "giving the lock back").await
            };
            match sent {
                Ok(Txn::Done(results)) => {
                    // After a `lock` op, its own entry comes before the tree.
                    let results = if join.is_some() {
                        read_after_lock(results)
                    } else {
                        results
                    };
                    return Ok(Some(View::from_entries(keys, results)));
                }
                Ok(Txn::Failed(errs))
                    if errs.iter().any(|e| e.what.contains("invalid session")) =>
                {
                    return Err(session_lost("the Consul session is gone"));
                }
                Ok(Txn::Failed(errs)) => {
                    // `.lock` is not at our token: broken or gone with our
                    // session. Not ours to give back; nothing was written.
                    tracing::debug!(lock = %keys.lock, ?errs, "our grant was taken before we gave it back");
                    return Ok(None);
                }
                Err(e) => {
                    transient.absorb(e).await?;
                    let v = transient.retry(|| read_view(&s.backend.api, keys)).await?;
                    if v.lock.as_ref().is_none_or(|l| l.modify_index != token) {
                        // Given back (or taken from us): go on from here.
                        return Ok(Some(v));
                    }
                    // Not applied: try again.
                }
            }
        }
    }

    /// Reads `P/` (blocking past `index` if it is not 0).
    async fn read_sem(&self, keys: &Keys, index: u64) -> Result<SemView> {
        let (idx, entries) = self
            .s
            .backend
            .api
            .kv_list(
                &keys.sem.prefix,
                Block {
                    index,
                    wait: LONG_POLL,
                    consistent: index == 0,
                },
            )
            .await
            .map_err(|e| map(e, "reading a semaphore"))?;
        Ok(SemView::from_entries(&keys.sem, idx, entries))
    }

    /// Waits until one of `ahead` is gone.
    async fn wait_any_gone(&self, ahead: Vec<KvEntry>) -> Result<()> {
        let waits: Vec<_> = ahead.iter().map(|e| Box::pin(self.wait_gone(e))).collect();
        futures::future::select_all(waits).await.0
    }

    /// Removes our semaphore contender key, our name from `.lock`'s
    /// holders (pruning dead ones; `.lock` goes when nobody holds), and
    /// any revoke marker for us, in one txn per attempt.
    async fn remove_sem(&self, keys: &Keys) -> Result<()> {
        let sid = &self.s.id;
        let contender = keys.sem.contender(sid);
        for _ in 0..MAX_ACQUIRE_RETRIES {
            let v = self.read_sem(keys, 0).await?;
            let mut ops = Vec::new();
            if let (Some(l), Some(st)) = (&v.lock, &v.state) {
                if l.flags == SEMAPHORE_FLAGS {
                    let rest = v.without(sid, sid);
                    if st.holders.contains_key(sid.as_str())
                        || (rest.is_empty() && !st.holders.is_empty())
                    {
                        if rest.is_empty() {
                            ops.push(op::delete_cas(&keys.sem.lock, l.modify_index));
                        } else {
                            let new = SemLock {
                                limit: st.limit,
                                holders: rest,
                            };
                            ops.push(op::cas(
                                &keys.sem.lock,
                                l.modify_index,
                                SEMAPHORE_FLAGS,
                                &new.encode(),
                            ));
                        }
                    }
                }
            }
            ops.push(op::delete(&contender));
            ops.push(op::delete(&keys.sem.revoke(sid)));
            match self.write(keys, ops, "leaving a semaphore").await? {
                Txn::Done(_) => return Ok(()),
                Txn::Failed(errs) => {
                    tracing::debug!(?errs, "the semaphore changed while leaving it; re-reading");
                }
            }
        }
        // Retryable: the client layer tries again after a pause, until our
        // name is out of `.lock` or the session is gone; a final error
        // would free the local slot with our name still a holder.
        Err(Error::new(
            ErrorKind::Timeout,
            format!("semaphore {} kept changing while leaving it", keys.sem.lock),
        ))
    }

    /// A permit of a `consul lock -n N` semaphore (see `semaphore.rs`).
    /// Our contenders queue by CreateIndex: one with `permits` or more of
    /// ours ahead waits for one of the `permits` nearest to go; one
    /// nearer the head adds itself to `.lock`'s holders by CAS when the
    /// live holders plus our waiters ahead of it leave a free permit,
    /// else it blocks on `P/` (as `consul lock -n` waiters do). The token
    /// is the `.lock` index our CAS wrote.
    async fn acquire_sem(&self, req: &AcquireRequest, permits: u32) -> Result<Acquired> {
        let s = &self.s;
        if !s.liveness.is_alive() {
            return Err(session_lost("the Consul session is lost"));
        }
        let keys = Keys::new(&s.backend.config, &req.name);
        let sid = s.id.as_str();
        let contender = keys.sem.contender(sid);
        let record = Record {
            quorumlock: 1,
            contender: Some(req.contender.to_string()),
            since_ms: Some(now_ms()),
            permits: Some(permits),
            ..Record::default()
        };
        let mut transient = Transient::new(req.wait, &s.liveness);
        let read = || self.read_sem(&keys, 0);
        let mut view = loop {
            let ops = vec![
                op::lock(&contender, sid, SEMAPHORE_FLAGS, &record.encode()),
                op::get_tree(&keys.sem.prefix),
            ];
            match self
                .write_attempt(&keys, req, ops, "joining a semaphore")
                .await
            {
                Ok(Txn::Done(results)) => {
                    break SemView::from_entries(&keys.sem, 0, read_after_lock(results));
                }
                // Our contender key is named by our session (see
                // `session_gone`).
                Ok(Txn::Failed(errs)) if errs.iter().any(|e| session_gone(&e.what)) => {
                    return Err(session_lost("the Consul session is gone"));
                }
                Ok(Txn::Failed(errs)) => return Err(failed("joining a semaphore", &errs)),
                Err(e) => {
                    transient.absorb(e).await?;
                    let v = transient.retry(read).await?;
                    if v.contenders.iter().any(|e| e.key == contender) {
                        break v;
                    }
                }
            }
        };
        let mut retries = 0;
        loop {
            let conflict = match (&view.lock, view.limit()) {
                (Some(l), _) if l.flags != SEMAPHORE_FLAGS => Some(format!(
                    "{} has flags {:#x}: a mutex owns it, not a semaphore",
                    keys.sem.lock, l.flags
                )),
                (_, Some(n)) if n != permits => Some(format!(
                    "semaphore {} has {n} permits, not {permits}",
                    keys.sem.lock
                )),
                _ if view.lock_entries > 0 => Some(format!(
                    "{} is used as a mutex or read-write lock",
                    keys.sem.prefix
                )),
                _ => None,
            };
            if let Some(msg) = conflict {
                self.remove_sem(&keys).await?;
                return Err(Error::new(ErrorKind::Conflict, msg));
            }
            let ours = view.ours();
            let Some(pos) = ours.iter().position(|e| e.key == contender) else {
                return Err(session_lost(
                    "our contender key is gone (session expired or entry deleted)",
                ));
            };
            let my_index = ours[pos].modify_index;
            if let Some(l) = view
                .lock
                .clone()
                .filter(|_| view.live_holders.contains(sid))
            {
                // Our CAS went through but its answer was lost: its index
                // is unknown (another holder's CAS may have moved `.lock`
                // since, and its index is that holder's token). Write
                // `.lock` again for a token of our own, larger than every
                // earlier grant's: the same JSON with a trailing newline
                // added or removed (Consul skips a write that changes
                // nothing, index included; JSON readers, Go's too, ignore
                // it).
                let ops = vec![
                    op::check_session(&contender, sid),
                    op::cas(
                        &keys.sem.lock,
                        l.modify_index,
                        SEMAPHORE_FLAGS,
                        &toggle_trailing_newline(l.value.as_deref().unwrap_or_default()),
                    ),
                    op::get(&keys.sem.lock),
                ];
                match self.write_attempt(&keys, req, ops, "taking a permit").await {
                    Ok(Txn::Done(results)) => {
                        if let Some(t) = results.iter().rev().find(|e| e.key == keys.sem.lock) {
                            return Ok(self.granted_sem(&keys, t.modify_index, my_index, req));
                        }
                    }
                    Ok(Txn::Failed(errs)) => {
                        tracing::debug!(?errs, "the semaphore changed; re-reading");
                    }
                    Err(e) => transient.absorb(e).await?,
                }
                view = transient.retry(read).await?;
                continue;
            }
            let n = permits as usize;
            if pos >= n {
                if !req.wait {
                    self.remove_sem(&keys).await?;
                    return Err(would_block(&keys));
                }
                let ahead: Vec<KvEntry> = ours[pos - n..pos].iter().map(|e| (*e).clone()).collect();
                transient
                    .retry(|| self.wait_any_gone(ahead.clone()))
                    .await?;
                view = transient.retry(read).await?;
                continue;
            }
            let waiting_ahead = ours[..pos]
                .iter()
                .filter(|e| !e.holder().is_some_and(|h| view.live_holders.contains(h)))
                .count();
            if view.live_holders.len() + waiting_ahead >= n {
                if !req.wait {
                    self.remove_sem(&keys).await?;
                    return Err(would_block(&keys));
                }
                let index = view.index.max(1);
                view = transient.retry(|| self.read_sem(&keys, index)).await?;
                continue;
            }
            let mut holders: std::collections::BTreeMap<String, bool> = view
                .live_holders
                .iter()
                .map(|h| (h.clone(), true))
                .collect();
            holders.insert(sid.to_string(), true);
            let new = SemLock {
                limit: permits,
                holders,
            };
            let at = view.lock.as_ref().map_or(0, |l| l.modify_index);
            let ops = vec![
                op::check_session(&contender, sid),
                op::cas(&keys.sem.lock, at, SEMAPHORE_FLAGS, &new.encode()),
                op::get(&keys.sem.lock),
            ];
            match self.write_attempt(&keys, req, ops, "taking a permit").await {
                Ok(Txn::Done(results)) => {
                    let token = results
                        .iter()
                        .rev()
                        .find(|e| e.key == keys.sem.lock)
                        .map(|e| e.modify_index)
                        .ok_or_else(|| {
                            Error::new(ErrorKind::Internal, "Consul txn returned no .lock entry")
                        })?;
                    return Ok(self.granted_sem(&keys, token, my_index, req));
                }
                Ok(Txn::Failed(errs)) => {
                    if errs
                        .iter()
                        .any(|e| e.op_index == 0 || e.what.contains("invalid session"))
                    {
                        return Err(session_lost(
                            "our contender key or session is gone (session expired?)",
                        ));
                    }
                    retries += 1;
                    if retries > 1000 {
                        return Err(failed("taking a permit", &errs));
                    }
                }
                Err(e) => transient.absorb(e).await?,
            }
            view = transient.retry(read).await?;
        }
    }

    fn granted_sem(
        &self,
        keys: &Keys,
        token: u64,
        contender_index: u64,
        req: &AcquireRequest,
    ) -> Acquired {
        let contender = keys.sem.contender(&self.s.id);
        self.watch_entry(
            &contender,
            &keys.sem.revoke(&self.s.id),
            token,
            &req.signals,
            Some(SemWatched {
                lock_key: keys.sem.lock.clone(),
                contender_index,
            }),
        );
        Acquired {
            token,
            entry: contender,
        }
    }

    /// Removes a read-write entry of this session and its revoke marker.
    async fn remove_rw(&self, keys: &Keys, entry: &str) -> Result<()> {
        let ops = vec![
            op::check_session(entry, &self.s.id),
            op::delete(entry),
            op::delete(&rw_revoke(entry)),
        ];
        // Rolled back: the entry is not this session's (gone already).
        self.write(keys, ops, "removing our entry").await?;
        Ok(())
    }

    /// Read or write side of a read-write lock: one entry per attempt,
    /// `<prefix>/.rw/<session>-<contender>`, in the line that mutexes of
    /// the same name share (ordered by CreateIndex). A writer waits for its
    /// predecessor, a reader for the nearest writer or mutex ahead.
    ///
    /// The grant is decided in the txn that gives the token: the join
    /// (`lock` of the entry + `get-tree`) when it finds us holding by our
    /// place; after any wait, a `cas` of our entry at the index we read
    /// (so never an entry an operator rewrote as broken, or deleted) +
    /// `get-tree`. The token is the index of that write, like a mutex's
    /// `.lock` write at its grant: tokens of every kind on one name grow
    /// in grant order (a mutex granted while we waited got a smaller one).
    ///
    /// # Cancel safety
    /// Every write runs to its end if dropped; the `abandon` that follows
    /// removes our entry.
    async fn acquire_rw(&self, req: &AcquireRequest) -> Result<Acquired> {
        let s = &self.s;
        if !s.liveness.is_alive() {
            return Err(session_lost("the Consul session is lost"));
        }
        let keys = Keys::new(&s.backend.config, &req.name);
        let entry = keys.rw_entry(&s.id, &req.contender);
        let revoke = rw_revoke(&entry);
        let flags = if req.kind == LockKind::Read {
            READ_FLAGS
        } else {
            WRITE_FLAGS
        };
        let record = Record {
            quorumlock: 1,
            contender: Some(req.contender.to_string()),
            since_ms: Some(now_ms()),
            ..Record::default()
        };
        let mut transient = Transient::new(req.wait, &s.liveness);
        let read = || read_view(&s.backend.api, &keys);
        // Whether `view` was read in the txn that wrote our entry at its
        // current index (then a grant by place in it is decided there).
        let mut decided_in_write;
        let mut view = loop {
            let ops = vec![
                op::lock(&entry, &s.id, flags, &record.encode()),
                op::get_tree(&keys.tree),
            ];
            match self
                .write_attempt(&keys, req, ops, "joining the queue")
                .await
            {
                Ok(Txn::Done(results)) => {
                    decided_in_write = true;
                    break View::from_entries(&keys, read_after_lock(results));
                }
                // Our entry's key is named by our session: a lock-delay on
                // it means our own session was invalidated (Consul checks
                // the delay before the session, so it says that instead).
                Ok(Txn::Failed(errs)) if errs.iter().any(|e| session_gone(&e.what)) => {
                    return Err(session_lost("the Consul session is gone"));
                }
                Ok(Txn::Failed(errs)) => return Err(failed("joining the queue", &errs)),
                Err(e) => {
                    transient.absorb(e).await?;
                    let v = transient.retry(read).await?;
                    if v.rw.iter().any(|e| e.key == entry) {
                        decided_in_write = false;
                        break v;
                    }
                }
            }
        };
        let leave = || async {
            self.remove_rw(&keys, &entry).await?;
            Err::<Acquired, Error>(would_block(&keys))
        };
        let mut retries = 0;
        loop {
            if let Some(l) = &view.lock {
                if l.flags != LOCK_FLAGS {
                    self.remove_rw(&keys, &entry).await?;
                    return Err(Error::new(
                        ErrorKind::Conflict,
                        format!(
                            "{} has flags {:#x}, not the lock flags {LOCK_FLAGS:#x}: another recipe (a consul lock -n semaphore?) owns it",
                            keys.lock, l.flags
                        ),
                    ));
                }
            }
            let line = view.line(&keys);
            let Some(pos) = line
                .iter()
                .position(|(_, e)| e.key == entry && e.holder() == Some(s.id.as_str()))
            else {
                return Err(session_lost(
                    "our entry is gone (session expired or entry deleted)",
                ));
            };
            let ours = line[pos].1.clone();
            if ours.record().is_some_and(|r| r.broken) {
                // An operator broke the holders while our grant was on its
                // way: it is not ours to hold. The client layer removes the
                // entry (ending the break) and asks again.
                return Err(session_lost(
                    "our entry was broken by an operator before its grant",
                ));
            }
            let blocker = match req.kind {
                LockKind::Read => line[..pos]
                    .iter()
                    .rev()
                    .find(|(k, _)| *k != LockKind::Read)
                    .map(|(_, e)| e.clone()),
                _ => pos.checked_sub(1).map(|p| line[p].1.clone()),
            };
            if let Some(b) = blocker {
                if !req.wait {
                    return leave().await;
                }
                transient.retry(|| self.wait_gone(&b)).await?;
                view = transient.retry(read).await?;
                decided_in_write = false;
                continue;
            }
            debug_assert!(line_holds(&line, pos));
            // Our own mutex holders are in the line ahead of us; a `.lock`
            // held now is a `consul lock` run (or a session whose end is
            // not processed yet): wait for it.
            if let Some(l) = view.lock.clone().filter(|l| l.holder().is_some()) {
                if !req.wait {
                    return leave().await;
                }
                transient.retry(|| self.wait_lock(&keys, &l)).await?;
                view = transient.retry(read).await?;
                decided_in_write = false;
                continue;
            }
            if decided_in_write {
                let token = ours.modify_index;
                self.watch_key(&entry, &revoke, token, &req.signals);
                return Ok(Acquired { token, entry });
            }
            // Granted by our place in a read: write our entry again (at the
            // index read, so not if it was broken or deleted since) and
            // read the lock in the same txn, which decides.
            // The value changes (it names the index it replaces): Consul
            // skips a write that changes nothing, index included (seen on
            // 1.8.7 for a key without a session; a locked key's `cas` still
            // moved its index there, but only because the op names no
            // session: not something to rely on).
            let stamp = Record {
                token: Some(ours.modify_index),
                ..record.clone()
            };
            let ops = vec![
                op::cas(&entry, ours.modify_index, flags, &stamp.encode()),
                op::get_tree(&keys.tree),
            ];
            match self.write_attempt(&keys, req, ops, "taking the lock").await {
                Ok(Txn::Done(results)) => {
                    view = View::from_entries(&keys, read_after_lock(results));
                    decided_in_write = true;
                }
                Ok(Txn::Failed(errs)) => {
                    // Our entry changed (broken, or gone with the session):
                    // the re-read tells.
                    retries += 1;
                    if retries > MAX_ACQUIRE_RETRIES {
                        return Err(failed("taking the lock", &errs));
                    }
                    view = transient.retry(read).await?;
                }
                Err(e) => {
                    transient.absorb(e).await?;
                    view = transient.retry(read).await?;
                }
            }
        }
    }

    /// Removes our queue key, and `.lock` (with any revoke marker) if this
    /// session holds it. The client layer has at most one request per
    /// (session, name) and keeps it until this returns, so a `.lock` that
    /// this session holds belongs to the request being removed.
    async fn remove_own(&self, keys: &Keys) -> Result<()> {
        let qkey = keys.queue(&self.s.id);
        let ops = vec![
            op::check_session(&keys.lock, &self.s.id),
            op::delete(&keys.lock),
            op::delete(&qkey),
            op::delete(&keys.revoke),
        ];
        match self.write(keys, ops, "removing our entry").await? {
            Txn::Done(_) => Ok(()),
            Txn::Failed(_) => self.leave_queue(keys).await,
        }
    }
}

/// The fences of `fences` (oldest first) to delete with a new one, `key`:
/// those older than [`FENCE_KEEP`] and those past the newest [`FENCE_MAX`],
/// at most [`FENCE_DELETES`], never `key` itself.
fn expired_fences(fences: &VecDeque<(String, Instant)>, key: &str, now: Instant) -> Vec<String> {
    let over = fences.len().saturating_sub(FENCE_MAX);
    fences
        .iter()
        .enumerate()
        .filter(|(i, (k, at))| {
            (*i < over || now.saturating_duration_since(*at) > FENCE_KEEP) && k != key
        })
        .take(FENCE_DELETES)
        .map(|(_, (k, _))| k.clone())
        .collect()
}

/// A base64 value with a trailing newline added (or removed if it has
/// one): a different value that JSON readers take for the same.
fn toggle_trailing_newline(b64: &str) -> String {
    use base64::Engine as _;
    let engine = base64::engine::general_purpose::STANDARD;
    let mut raw = engine.decode(b64).unwrap_or_default();
    if raw.last() == Some(&b'\n') {
        raw.pop();
    } else {
        raw.push(b'\n');
    }
    engine.encode(raw)
}

/// What a `lock` + `get-tree` txn read: its results without the first, which
/// is the `lock` op's own entry (Consul returns a written entry, value
/// blanked, before the tree).
fn read_after_lock(mut results: Vec<KvEntry>) -> Vec<KvEntry> {
    if !results.is_empty() {
        results.remove(0);
    }
    results
}

impl Drop for ConsulSession {
    fn drop(&mut self) {
        self.s.stop.cancel();
    }
}

/// The one keepalive task: renews every TTL/2 (counted from the send time
/// of the last successful renew, so slow answers do not stretch the
/// period), confirms each success with its send time, declares the
/// session lost on a 404, retries transient failures quickly (the
/// client's local deadline fires if they last).
async fn keepalive(s: Arc<Shared>) {
    let ttl = s.backend.config.ttl;
    let longest = (ttl / 4).max(Duration::from_secs(2));
    let mut next = Instant::now() + ttl / 2;
    loop {
        tokio::select! {
            _ = s.stop.cancelled() => return,
            reason = s.liveness.lost() => {
                if reason == LossReason::DeadlinePassed {
                    destroy_abandoned(&s).await;
                }
                return;
            }
            _ = tokio::time::sleep_until(next) => {}
        }
        let sent = Instant::now();
        // Time left before the local deadline: one renew that hangs to its
        // timeout must leave room for another try before it (with TTL
        // 10 s, a 2.5 s timeout + 0.5 s pause after the renew at TTL/2 came
        // exactly at the deadline: a spurious loss). A quarter of it is
        // kept for that: a slow answer (a high latency) still has most of
        // the time.
        let left = s
            .liveness
            .deadline()
            .map(|d| d.saturating_duration_since(sent));
        let timeout = left.map_or(longest, |l| {
            longest.min(l * 3 / 4).max(Duration::from_millis(250))
        });
        match s.backend.api.session_renew(&s.id, timeout).await {
            Ok(true) => {
                s.liveness.confirm(sent, ttl);
                next = sent + ttl / 2;
            }
            Ok(false) => {
                tracing::warn!(session = %s.id, "Consul says the session is gone");
                s.liveness.lose(LossReason::SessionExpired);
                return;
            }
            Err(e) => {
                tracing::debug!(session = %s.id, error = %e, "renewing the session failed; retrying");
                let now = Instant::now();
                let left = s
                    .liveness
                    .deadline()
                    .map_or(Duration::MAX, |d| d.saturating_duration_since(now));
                let pause = Duration::from_millis(500)
                    .min(left / 4)
                    .max(Duration::from_millis(50));
                next = now + pause;
            }
        }
    }
}

/// A session given up locally (no renew confirmed before the deadline)
/// may still live on the servers, and hold its locks there until its TTL
/// runs out, or longer: after every server of a cluster was restarted,
/// Consul 1.8.7 kept such sessions for good in our tests. We gave it up,
/// so destroying it is safe: retry until the agent answers (at most
/// [`ABANDONED_DESTROY_PATIENCE`]) or the session is closed.
async fn destroy_abandoned(s: &Shared) {
    let start = Instant::now();
    let mut pause = Duration::from_millis(500);
    loop {
        match s.backend.api.session_destroy(&s.id).await {
            Ok(()) => {
                tracing::debug!(session = %s.id, "destroyed the session given up locally");
                return;
            }
            Err(e) if start.elapsed() < ABANDONED_DESTROY_PATIENCE => {
                tracing::debug!(session = %s.id, error = %e, "destroying a lost session failed; retrying");
            }
            Err(e) => {
                tracing::warn!(session = %s.id, error = %e, "could not destroy a lost session; it ends by its TTL");
                return;
            }
        }
        tokio::select! {
            _ = s.stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// Watches every held lock of the session with ONE blocking query
/// (`?recurse&consistent`) over the longest common prefix of their keys
/// (the lock's own `.lock` for one held lock, at most the namespace), and
/// dispatches what it sees: `.lock` gone or not ours at our token -> loss;
/// a revoke marker for our token -> revoke request.
///
/// An index from a read of a wider prefix is safe to block on with a
/// narrower one: the wider read saw every change up to it.
async fn monitor(s: Arc<Shared>) {
    let mut index: u64 = 0;
    let mut failures: u32 = 0;
    let mut failing_since = Instant::now();
    let patience = s.backend.config.ttl / 2;
    loop {
        // Only fresh grants to watch: wait until the oldest is
        // HELD_WATCH_DELAY old (it may be released before: a short hold
        // costs no monitor request; a break in between is seen late, far
        // below the lock-delay that guards it).
        let hold_off = {
            let mut w = s.watch.lock().expect("poisoned");
            w.entries.retain(|_, e| !e.signals.is_finished());
            if w.entries.values().all(|e| !e.checked) {
                w.entries.values().map(|e| e.since + HELD_WATCH_DELAY).min()
            } else {
                None
            }
        };
        if let Some(t) = hold_off.filter(|t| *t > Instant::now()) {
            tokio::select! {
                _ = s.stop.cancelled() => return,
                _ = s.liveness.lost() => return,
                _ = tokio::time::sleep_until(t) => {}
            }
            continue;
        }
        let query = {
            let mut w = s.watch.lock().expect("poisoned");
            w.entries.retain(|_, e| !e.signals.is_finished());
            let q = if w.entries.is_empty() {
                None
            } else {
                let covered: Vec<String> = w
                    .entries
                    .iter()
                    .flat_map(|(k, e)| {
                        std::iter::once(k.clone()).chain(e.sem.as_ref().map(|s| s.lock_key.clone()))
                    })
                    .collect();
                let prefix = common_prefix(covered.iter());
                let unchecked = w
                    .entries
                    .values()
                    .filter(|e| !e.checked)
                    .map(|e| e.token)
                    .min();
                let any_checked = w.entries.values().any(|e| e.checked);
                let q = match (index, unchecked) {
                    // Nothing judged yet: changes before the oldest
                    // grant do not concern us; block from there.
                    (_, Some(t)) if !any_checked => t,
                    (0, Some(t)) => t,
                    (i, Some(t)) => i.min(t),
                    (i, None) => i,
                };
                Some((q, prefix))
            };
            w.inflight = q.clone();
            q
        };
        let r = tokio::select! {
            biased;
            _ = s.stop.cancelled() => return,
            _ = s.liveness.lost() => return,
            _ = s.watch_changed.notified() => continue,
            r = async {
                match &query {
                    Some((q, prefix)) => s.backend.api.kv_list(prefix, Block { index: *q, wait: LONG_POLL, consistent: true }).await,
                    None => std::future::pending().await,
                }
            } => r,
        };
        let prefix = query.map(|(_, p)| p).unwrap_or_default();
        s.watch.lock().expect("poisoned").inflight = None;
        let gap = match r {
            Ok((idx, entries)) => {
                failures = 0;
                index = idx;
                let watched = evaluate(&s, &prefix, idx, &entries).await;
                MONITOR_MIN_GAP + Duration::from_micros(100 * watched as u64)
            }
            Err(e) => {
                if failures == 0 {
                    failing_since = Instant::now();
                }
                failures += 1;
                tracing::debug!(session = %s.id, error = %e, failures, "monitor read failed");
                if failures >= MONITOR_MAX_FAILURES && failing_since.elapsed() >= patience {
                    tracing::warn!(session = %s.id, error = %e,
                        "cannot watch the held locks; declaring them lost");
                    let lost: Vec<(String, u64)> = {
                        let mut w = s.watch.lock().expect("poisoned");
                        w.entries
                            .drain()
                            .map(|(key, e)| {
                                e.signals.lose(LossReason::DeadlinePassed);
                                let at = e.sem.as_ref().map_or(e.token, |s| s.contender_index);
                                (key, at)
                            })
                            .collect()
                    };
                    // The session may well survive (renewals are separate):
                    // free the locks we just declared lost, or they would
                    // stay held until the guards are released.
                    tokio::spawn(remove_given_up(s.clone(), lost));
                    failures = 0;
                    index = 0;
                }
                Duration::from_millis(250 << failures.min(3))
            }
        };
        tokio::select! {
            _ = s.stop.cancelled() => return,
            _ = tokio::time::sleep(gap) => {}
        }
    }
}

/// Removes held locks that the monitor gave up on, as a release would:
/// `.lock` only at the token we held (so never a newer lock of this
/// session), with our queue key and any revoke marker, in one txn; retried
/// until it is done, the lock changed, or the session ends.
async fn remove_given_up(s: Arc<Shared>, lost: Vec<(String, u64)>) {
    for (lock_key, token) in lost {
        let ops = match lock_key.strip_suffix("/.lock") {
            None if !lock_key.contains("/.rw/") => {
                // A semaphore contender key `P/<session>`: its holder
                // entry in `.lock` is pruned once the key is gone.
                let (base, sid) = lock_key.rsplit_once('/').unwrap_or(("", &lock_key));
                vec![
                    op::check_index(&lock_key, token),
                    op::delete_cas(&lock_key, token),
                    op::delete(&format!("{base}/.revoke/{sid}")),
                ]
            }
            // `check-index` first: `delete-cas` of a missing key succeeds,
            // and the queue key may be a newer acquire's of this session.
            Some(base) => vec![
                op::check_index(&lock_key, token),
                op::delete_cas(&lock_key, token),
                op::delete(&format!("{base}/.queue/{}", s.id)),
                op::delete(&format!("{base}/.lock.revoke")),
            ],
            None => vec![
                op::check_index(&lock_key, token),
                op::delete_cas(&lock_key, token),
                op::delete(&rw_revoke(&lock_key)),
            ],
        };
        let mut pause = Duration::from_millis(500);
        loop {
            match s.backend.api.txn(ops.clone()).await {
                Ok(_) => break, // done, or `.lock` is no longer ours at `token`
                Err(e) => {
                    tracing::debug!(lock = %lock_key, error = %e, "removing a given-up lock failed; retrying");
                }
            }
            tokio::select! {
                _ = s.stop.cancelled() => return,
                _ = s.liveness.lost() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }
}

/// Judges every watched lock under `prefix` against a read of it at index
/// `idx`; returns how many locks are watched.
async fn evaluate(s: &Shared, prefix: &str, idx: u64, entries: &[KvEntry]) -> usize {
    let by_key: HashMap<&str, &KvEntry> = entries.iter().map(|e| (e.key.as_str(), e)).collect();
    let mut lost = Vec::new();
    let watched = {
        let mut w = s.watch.lock().expect("poisoned");
        for (key, e) in w.entries.iter_mut() {
            if e.token > idx
                || !key.starts_with(prefix)
                || e.sem
                    .as_ref()
                    .is_some_and(|s| !s.lock_key.starts_with(prefix))
            {
                continue; // granted after this read, or not covered by it
            }
            e.checked = true;
            let ours = match &e.sem {
                None => by_key.get(key.as_str()).is_some_and(|l| {
                    l.holder() == Some(s.id.as_str()) && l.modify_index == e.token
                }),
                Some(sw) => {
                    by_key.get(key.as_str()).is_some_and(|c| {
                        c.holder() == Some(s.id.as_str()) && c.modify_index == sw.contender_index
                    }) && by_key.get(sw.lock_key.as_str()).is_some_and(|l| {
                        l.flags == SEMAPHORE_FLAGS
                            && SemLock::decode(l)
                                .is_some_and(|st| st.holders.contains_key(s.id.as_str()))
                    })
                }
            };
            if !ours {
                lost.push((key.clone(), e.token));
                continue;
            }
            if let Some(r) = by_key.get(e.revoke_key.as_str()) {
                let want = e.sem.as_ref().map_or(e.token, |s| s.contender_index);
                if r.holder() == Some(s.id.as_str())
                    && r.record().and_then(|r| r.token) == Some(want)
                    && !e.signals.is_revoke_requested()
                {
                    tracing::debug!(lock = %key, "revoke requested");
                    e.signals.request_revoke();
                }
            }
        }
        w.entries.len()
    };
    if lost.is_empty() {
        return watched;
    }
    // Gone because the session is gone, or deleted behind our back?
    let reason = match s.backend.api.session_exists(&s.id).await {
        Ok(false) => {
            s.liveness.lose(LossReason::SessionExpired);
            LossReason::SessionExpired
        }
        _ => LossReason::EntryDeleted,
    };
    let mut w = s.watch.lock().expect("poisoned");
    for (key, token) in lost {
        if w.entries.get(&key).is_some_and(|e| e.token == token) {
            let e = w.entries.remove(&key).expect("checked above");
            tracing::info!(lock = %key, token, %reason, "held lock lost");
            e.signals.lose(reason);
        }
    }
    w.entries.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_are_deleted_when_old_or_too_many() {
        let now = Instant::now() + FENCE_KEEP * 2;
        let old = now - FENCE_KEEP - Duration::from_secs(1);
        let fresh = now - Duration::from_secs(1);
        let f: VecDeque<(String, Instant)> = [("a", old), ("b", fresh), ("c", old), ("d", fresh)]
            .into_iter()
            .map(|(k, t)| (k.to_string(), t))
            .collect();
        assert_eq!(expired_fences(&f, "x", now), ["a", "c"]);
        // The one being written again is kept.
        assert_eq!(expired_fences(&f, "c", now), ["a"]);
        // Past FENCE_MAX, the oldest go, at most FENCE_DELETES at once.
        let many: VecDeque<(String, Instant)> = (0..FENCE_MAX + 3)
            .map(|i| (format!("f{i}"), fresh))
            .collect();
        assert_eq!(expired_fences(&many, "x", now), ["f0", "f1", "f2"]);
        let aged: VecDeque<(String, Instant)> = (0..100).map(|i| (format!("f{i}"), old)).collect();
        assert_eq!(expired_fences(&aged, "x", now).len(), FENCE_DELETES);
    }

    #[test]
    fn common_prefix_of_lock_keys() {
        let k = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(common_prefix(k(&[]).iter()), "");
        assert_eq!(common_prefix(k(&["ns/a/.lock"]).iter()), "ns/a/.lock");
        assert_eq!(
            common_prefix(k(&["ns/bulk/l1/.lock", "ns/bulk/l10/.lock", "ns/bulk/l2/.lock"]).iter()),
            "ns/bulk/l"
        );
        assert_eq!(common_prefix(k(&["a/.lock", "b/.lock"]).iter()), "");
    }
}
