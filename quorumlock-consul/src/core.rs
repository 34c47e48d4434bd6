//! What every part of a session shares: the backend-wide state
//! ([`ConsulCore`]: the HTTP client, the configuration, the sessions
//! opened), one session's state ([`SessionState`]: its id and liveness,
//! the per-lock write mutexes, the held entries the monitor watches, the
//! fences), the write paths that every acquire and removal goes through
//! ([`SessionState::write`], [`SessionState::write_attempt`],
//! [`SessionState::fence`]), the blocking waits, and the error helpers.
//!
//! Imports only the layout and the HTTP client: the acquire recipes
//! (`mutex`, `rw`, `semaphore`), the monitor and the renew task build on it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quorumlock_core::backend::{
    finish_on_drop, AcquireRequest, Backoff, ContendedLocks, EntrySignals, InFlightWrites,
    QuietGrants, SessionLiveness,
};
use quorumlock_core::{Error, ErrorKind, Result};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::{op, Api, Block, KvEntry, Record, Txn, TxnError};
use crate::config::ConsulConfig;
use crate::error::{map, ApiError};
use crate::layout::{fence_key, Keys, View, FENCE_FLAGS};

/// Longest wait of one blocking query (Consul caps it at 10 minutes).
pub(crate) const LONG_POLL: Duration = Duration::from_secs(300);
/// How many contended mutex names a session remembers (see
/// `SessionState::contended`); past that it forgets them all.
pub(crate) const CONTENDED_MEMORY: usize = 1024;
/// Unexpected txn failures tolerated in one acquire before giving up.
pub(crate) const MAX_ACQUIRE_RETRIES: u32 = 20;
/// The first and the longest pause of a waiting acquire's retries of a
/// transient failure (jittered: see [`Backoff`]).
const TRANSIENT_BACKOFF: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(2));
/// How long a session keeps an attempt's fence (see
/// [`SessionState::fence`]): far longer than any request of ours is in
/// flight (10 s timeout); a copy delivered later than this is not fenced.
const FENCE_KEEP: Duration = Duration::from_secs(15 * 60);
/// At most this many fences per session: past it the oldest go first.
const FENCE_MAX: usize = 1024;
/// At most this many old fences are deleted with a new one (a Consul txn
/// takes at most 64 ops).
const FENCE_DELETES: usize = 32;

/// The backend-wide state: the backend holds an `Arc` of it, and every
/// session (and its tasks) reaches the client and configuration through
/// it.
pub(crate) struct ConsulCore {
    pub config: ConsulConfig,
    pub api: Api,
    /// Sessions this instance created, for `leftovers()`.
    pub opened: Mutex<Vec<String>>,
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Reads every key of one lock in one request (a read-only txn with
/// `get-tree`, because a `<name>/.` prefix cannot go into a URL path),
/// never served stale (`?consistent`: the leader checks with a quorum
/// that it still leads). Such reads decide grants (a fast grant whose
/// answer was lost, read back; a repeat fast grant read after others
/// wrote; our own `.lock` found after a take's lost answer), removals
/// (which delete what the read shows of ours) and breaks: a leader cut
/// off from its cluster, deposed meanwhile, would answer a default-mode
/// read from its old state (issue 37, bug 7). Costs no extra request.
pub(crate) async fn read_view(api: &Api, keys: &Keys) -> Result<View> {
    view_of(
        keys,
        api.txn_consistent(vec![op::get_tree(&keys.tree)]).await,
    )
}

fn view_of(keys: &Keys, read: std::result::Result<Txn, ApiError>) -> Result<View> {
    match read.map_err(|e| map(e, "reading a lock"))? {
        Txn::Done(entries) => Ok(View::from_entries(keys, entries)),
        Txn::Failed(errs) => Err(Error::new(
            ErrorKind::Store,
            format!("Consul: reading {} failed: {errs:?}", keys.tree),
        )),
    }
}

/// The state of one Consul session, shared by its `ConsulSession`, its
/// renew task and its monitor.
pub(crate) struct SessionState {
    pub core: Arc<ConsulCore>,
    pub id: String,
    pub liveness: Arc<SessionLiveness>,
    pub stop: CancellationToken,
    pub watch: Mutex<Watch>,
    pub watch_changed: Notify,
    /// Per-lock write serialization: a write of an acquire runs to its end
    /// even if the acquire is dropped, and `abandon` queues behind it.
    ops: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Mutexes (by `.lock` key) that were taken, or had other contenders
    /// of ours in line, at this session's last try or queued grant: their
    /// next acquire skips the one-txn fast path (it would fail, or take
    /// `.lock` only to give it back).
    pub contended: ContendedLocks,
    /// Tokens of mutexes held through the fast path: they have no queue
    /// key, so their release is `.lock` and its revoke marker only.
    pub fast_held: Mutex<HashSet<u64>>,
    /// Per mutex (`.lock` key), our last fast grant (by index) whose txn
    /// read nobody else in line: after a quiet cycle the next fast acquire
    /// leaves out its `get-tree`, like the floor's single `lock` (see
    /// [`QuietGrants`]; every Consul write is one raft entry, and a
    /// written key shows its index as `ModifyIndex`). At most
    /// [`CONTENDED_MEMORY`] mutexes.
    pub lone_grants: QuietGrants,
    /// Our fences (see [`SessionState::fence`]), oldest first, with the
    /// time each was written: deleted after [`FENCE_KEEP`] or past
    /// [`FENCE_MAX`], else they go with the session.
    fences: Mutex<VecDeque<(String, Instant)>>,
}

/// Held locks that the monitor watches, and the index and key prefix of
/// its read in flight (`None`: no read in flight).
#[derive(Default)]
pub(crate) struct Watch {
    pub entries: HashMap<String, Watched>,
    pub inflight: Option<(u64, String)>,
}

/// A held entry that the monitor watches.
pub(crate) struct Watched {
    pub token: u64,
    /// The entry's `ModifyIndex` as last known: `token`, or the index of
    /// our last proclaim (the monitor also learns one whose answer was
    /// lost).
    pub at: u64,
    pub revoke_key: String,
    pub signals: EntrySignals,
    /// For a semaphore permit (the map key is our contender key).
    pub sem: Option<SemWatched>,
    /// When it was handed to the monitor.
    pub since: Instant,
    /// Compared with a namespace read at or after `token` at least once.
    pub checked: bool,
}

/// A held semaphore permit: our contender key must stay ours at
/// `contender_index`, and `.lock`'s holders must name our session.
pub(crate) struct SemWatched {
    pub lock_key: String,
    pub contender_index: u64,
}

/// How an acquire treats transient failures (`ErrorKind::Connection`):
/// a waiting acquire retries them with backoff ([`TRANSIENT_BACKOFF`])
/// while its session is alive (the client layer cancels it when the
/// session is lost); a try-acquire returns them.
pub(crate) struct Transient<'a> {
    wait: bool,
    liveness: &'a SessionLiveness,
    backoff: Backoff,
}

impl<'a> Transient<'a> {
    pub fn new(wait: bool, liveness: &'a SessionLiveness) -> Self {
        let (min, max) = TRANSIENT_BACKOFF;
        Transient {
            wait,
            liveness,
            backoff: Backoff::new(min, max),
        }
    }

    /// Returns `e` unless it is transient and we may wait; then sleeps.
    pub async fn absorb(&mut self, e: Error) -> Result<()> {
        if !(self.wait && e.kind() == ErrorKind::Connection && self.liveness.is_alive()) {
            return Err(e);
        }
        tracing::debug!(error = %e, "transient failure while waiting for a lock; retrying");
        self.backoff.wait().await;
        Ok(())
    }

    /// Runs `f` until it succeeds or fails for good.
    pub async fn retry<T, F, Fut>(&mut self, mut f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        loop {
            match f().await {
                Err(e) => self.absorb(e).await?,
                ok => {
                    self.backoff.reset();
                    return ok;
                }
            }
        }
    }
}

/// The index for the next blocking query after one at `index` answered
/// `idx`: always the answer's (so a query never spins on an old index), or
/// a fresh start if the index went backwards (Consul's advice: a restored
/// snapshot, a new leader with an older table).
pub(crate) fn next_index(index: u64, idx: u64) -> u64 {
    if idx < index {
        1
    } else {
        idx.max(1)
    }
}

pub(crate) fn session_lost(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::SessionLost, msg.into())
}

pub(crate) fn would_block(keys: &Keys) -> Error {
    Error::new(ErrorKind::WouldBlock, format!("lock {} is held", keys.lock))
}

/// Whether a rolled-back lock of a key named by our session says that the
/// session is gone: "invalid session", or a lock-delay, which Consul
/// checks first and puts only on keys of an invalidated session.
pub(crate) fn session_gone(what: &str) -> bool {
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

pub(crate) fn failed(what: &str, errs: &[TxnError]) -> Error {
    Error::new(
        ErrorKind::Store,
        format!("Consul: {what} was rolled back: {errs:?}"),
    )
}

/// What a `lock` + `get-tree` txn read: its results without the first, which
/// is the `lock` op's own entry (Consul returns a written entry, value
/// blanked, before the tree).
pub(crate) fn read_after_lock(mut results: Vec<KvEntry>) -> Vec<KvEntry> {
    if !results.is_empty() {
        results.remove(0);
    }
    results
}

impl SessionState {
    /// The state of the new session `id`; nothing watched, written or
    /// remembered yet.
    pub fn new(core: Arc<ConsulCore>, id: String, liveness: Arc<SessionLiveness>) -> SessionState {
        SessionState {
            core,
            id,
            liveness,
            stop: CancellationToken::new(),
            watch: Mutex::new(Watch::default()),
            watch_changed: Notify::new(),
            ops: Mutex::new(HashMap::new()),
            contended: ContendedLocks::new(CONTENDED_MEMORY),
            fast_held: Mutex::new(Default::default()),
            lone_grants: QuietGrants::new(CONTENDED_MEMORY),
            fences: Mutex::new(VecDeque::new()),
        }
    }

    /// Runs a write txn for one lock under the lock's write mutex, to its
    /// end even if the caller is dropped ([`finish_on_drop`]), so a write
    /// is never left half-known: a later `abandon` of the same lock runs
    /// after it.
    pub async fn write(
        self: &Arc<Self>,
        keys: &Keys,
        ops: Vec<op::Op>,
        what: &'static str,
    ) -> Result<Txn> {
        self.write_as(keys, ops, what, None).await
    }

    /// A write of attempt `req` that may create or take one of its keys:
    /// [`write`](Self::write), refused by the agent once the attempt is
    /// fenced off (a `check-not-exists` of its fence, last so that the op
    /// indexes of `ops` stay as they are; it reads nothing), and counted in
    /// `req.writes`, which records an end without the agent's answer (the
    /// txn may still be applied later: see [`SessionState::fence`]).
    pub async fn write_attempt(
        self: &Arc<Self>,
        keys: &Keys,
        req: &AcquireRequest,
        mut ops: Vec<op::Op>,
        what: &'static str,
    ) -> Result<Txn> {
        ops.push(op::check_not_exists(&self.fence_key(req)));
        self.write_as(keys, ops, what, Some(&req.writes)).await
    }

    async fn write_as(
        self: &Arc<Self>,
        keys: &Keys,
        ops: Vec<op::Op>,
        what: &'static str,
        writes: Option<&InFlightWrites>,
    ) -> Result<Txn> {
        let m = {
            let mut map = self.ops.lock().expect("poisoned");
            map.entry(keys.tree.clone()).or_default().clone()
        };
        let guard = m.lock_owned().await;
        // No await between taking the mutex and handing the write over: a
        // drop of the caller either sent nothing or leaves the write running.
        let s = self.clone();
        let tree = keys.tree.clone();
        let txn = async move {
            let r = s.core.api.txn(ops).await;
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

    /// The fence of attempt `req` (see [`fence_key`]).
    fn fence_key(&self, req: &AcquireRequest) -> String {
        fence_key(
            &self.core.config.namespace_prefix(),
            &self.id,
            &req.contender.simple(),
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
    pub async fn fence(self: &Arc<Self>, keys: &Keys, req: &AcquireRequest) -> Result<()> {
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
        let mut ops = vec![op::lock(&key, &self.id, FENCE_FLAGS, &record.encode())];
        let expired = expired_fences(&self.fences.lock().expect("poisoned"), &key, Instant::now());
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
                let mut f = self.fences.lock().expect("poisoned");
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

    /// Waits until `pred` (the entry ahead of ours) is gone: a blocking
    /// query on that exact key (not a prefix: a revoke marker next to it
    /// must not wake us), always from the index the last answer gave.
    ///
    /// # Cancel safety
    /// Only reads; safe to drop.
    pub async fn wait_gone(&self, pred: &KvEntry) -> Result<()> {
        let mut index = pred.modify_index.max(1);
        loop {
            let (idx, entry) = self
                .core
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
    pub async fn wait_lock(&self, keys: &Keys, held: &KvEntry) -> Result<Option<KvEntry>> {
        let mut index = held.modify_index.max(1);
        loop {
            let (idx, entry) = self
                .core
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
    pub fn watch(&self, keys: &Keys, token: u64, signals: &EntrySignals) {
        self.watch_key(&keys.lock, &keys.revoke, token, signals)
    }

    /// Hands a granted entry `key` (locked by this session, at
    /// `ModifyIndex == token` while we hold it) to the monitor.
    pub fn watch_key(&self, key: &str, revoke_key: &str, token: u64, signals: &EntrySignals) {
        self.watch_entry(key, revoke_key, token, signals, None)
    }

    pub fn watch_entry(
        &self,
        key: &str,
        revoke_key: &str,
        token: u64,
        signals: &EntrySignals,
        sem: Option<SemWatched>,
    ) {
        let covers = sem.as_ref().map(|s| s.lock_key.clone());
        let mut w = self.watch.lock().expect("poisoned");
        w.entries.insert(
            key.to_string(),
            Watched {
                token,
                at: token,
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
            self.watch_changed.notify_one();
        }
    }

    /// The last known `ModifyIndex` of the held `key` granted at `token`
    /// (`token` unless a proclaim rewrote it).
    pub fn index_of(&self, key: &str, token: u64) -> u64 {
        let w = self.watch.lock().expect("poisoned");
        w.entries
            .get(key)
            .filter(|e| e.token == token)
            .map_or(token, |e| e.at)
    }

    /// Notes that the held `key` granted at `token` is now at `index`
    /// (our proclaim, seen by its answer or by a read).
    pub fn note_index(&self, key: &str, token: u64, index: u64) {
        let mut w = self.watch.lock().expect("poisoned");
        if let Some(e) = w.entries.get_mut(key).filter(|e| e.token == token) {
            e.at = e.at.max(index);
        }
    }

    pub fn unwatch(&self, keys: &Keys) {
        self.unwatch_key(&keys.lock)
    }

    pub fn unwatch_key(&self, key: &str) {
        self.watch.lock().expect("poisoned").entries.remove(key);
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
}
