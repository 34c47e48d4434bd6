//! Mutexes on the key of `consul lock` / Go `api.Lock`: the one-txn fast
//! path of a free lock, our FIFO queue of contenders (`.queue/<session>`),
//! the grant, the give-back of a grant that would jump the line, and the
//! release and removal of a mutex.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quorumlock_core::backend::{
    removed_if_found, waits_for, AcquireRequest, Acquired, Backoff, LastGrant,
};
use quorumlock_core::{Error, ErrorKind, LockKind, Result};

use crate::api::{op, KvEntry, Record, Txn};
use crate::core::{
    failed, now_ms, read_after_lock, read_view, session_gone, session_lost, would_block,
    SessionState, Transient, MAX_ACQUIRE_RETRIES,
};
use crate::layout::{line_kinds, others_ahead, Keys, View, LOCK_FLAGS, QUEUE_FLAGS};

/// What [`ConsulSession::try_fast`] found when it took the lock.
struct FastTry {
    view: View,
    /// Our `.lock`'s index.
    token: u64,
    /// The view is the lock at the grant (not a read after it): a grant
    /// that finds nobody in line is remembered in `SessionState::lone_grants`.
    at_grant: bool,
    /// What the acquire took from `lone_grants`.
    last: Option<LastGrant>,
}

/// A mutex (see the crate documentation, "Acquire"): the fast path when
/// the lock is free (step 0), else our queue (steps 1 to 4).
///
/// # Cancel safety
/// Every write runs to its end if dropped; the `abandon` that follows
/// removes what it wrote.
pub(crate) async fn acquire(s: &Arc<SessionState>, req: &AcquireRequest) -> Result<Acquired> {
    if !s.liveness.is_alive() {
        return Err(session_lost("the Consul session is lost"));
    }
    let a = Attempt::new(s, req);
    // A waiting acquire rides out transient trouble (a reset, a leader
    // election) without losing its place in the queue: reads are
    // retried, and a write whose answer was lost is checked by reading
    // back. A try-acquire fails fast instead.
    let mut transient = Transient::new(req.wait, &s.liveness);
    let joined = match a.fast_path(&mut transient).await? {
        Fast::Granted(held) => return Ok(held),
        Fast::Queue(joined) => joined,
    };
    let view = match joined {
        Some(v) => v,
        None => a.join_queue(&mut transient).await?,
    };
    a.wait_and_take(view, &mut transient).await
}

/// One mutex acquire attempt: what each of its steps needs.
struct Attempt<'a> {
    s: &'a Arc<SessionState>,
    req: &'a AcquireRequest,
    keys: Keys,
    /// Our queue key.
    qkey: String,
    /// The attempt's contender id, as our records carry it.
    contender: String,
    /// It waited for a holder outside our line ([`Self::wait_holder`]).
    held_up: AtomicBool,
}

/// How the fast path ended.
// Returned once per step and moved straight on: boxing the view would
// only add an allocation.
#[allow(clippy::large_enum_variant)]
enum Fast {
    /// Taken, with nobody of ours in line: held.
    Granted(Acquired),
    /// Not taken, or given back: queue. `Some`: already joined (the
    /// give-back txn did), the lock as that txn read it.
    Queue(Option<View>),
}

/// What the queued path does after one step.
// Returned once per step and moved straight on: boxing the view would
// only add an allocation.
#[allow(clippy::large_enum_variant)]
enum Next {
    /// Held.
    Granted(Acquired),
    /// Look at the lock again, as it is in this view.
    Look(View),
}

/// Consecutive failures of the grant txn (step 4): unexpected ones are
/// counted, a lock-delay is waited out with a growing pause.
struct Failures {
    retries: u32,
    /// The pause before the next look at a `.lock` under a lock-delay.
    delay_wait: Backoff,
    /// The pause before the next look after an unexpected failure.
    retry_wait: Backoff,
}

/// The first and the longest pause while a lock-delay is in force
/// (Consul does not say when it ends, and nothing wakes us then).
const LOCK_DELAY_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(50), Duration::from_secs(1));
/// The pause before a look after an unexpected failure of the grant txn,
/// and between two reads that still show our queue key older than a
/// rewrite of ours: short and not growing (jittered).
const RETRY_PAUSE: Duration = Duration::from_millis(10);

impl<'a> Attempt<'a> {
    fn new(s: &'a Arc<SessionState>, req: &'a AcquireRequest) -> Attempt<'a> {
        let keys = Keys::new(&s.core.config, &req.name);
        Attempt {
            s,
            req,
            qkey: keys.queue(&s.id),
            keys,
            contender: req.contender.to_string(),
            held_up: AtomicBool::new(false),
        }
    }

    /// The value of each key this attempt writes (its `since_ms` is the
    /// time of that write).
    fn record(&self) -> Record {
        Record {
            quorumlock: 1,
            contender: Some(self.contender.clone()),
            since_ms: Some(now_ms()),
            ..Record::default()
        }
        .with_value(&self.req.value)
    }

    /// A `.lock` that this acquire wrote (its contender id, our session,
    /// not rewritten by a break): ours, whatever the answer said.
    fn mine(&self, l: &KvEntry) -> bool {
        l.holder() == Some(self.s.id.as_str())
            && l.flags == LOCK_FLAGS
            && l.record()
                .is_some_and(|r| !r.broken && r.contender.as_deref() == Some(&self.contender))
    }

    /// Whether `e` is our queue key, held by our session.
    fn is_our_entry(&self, e: &KvEntry) -> bool {
        e.key == self.qkey && e.holder() == Some(self.s.id.as_str())
    }

    /// Reads every key of the lock.
    async fn read(&self) -> Result<View> {
        read_view(&self.s.core.api, &self.keys).await
    }

    /// Reports the grant at `token`, handing `.lock` to the monitor.
    fn granted(&self, token: u64) -> Acquired {
        self.s.watch(&self.keys, token, &self.req.signals);
        Acquired {
            token,
            entry: self.keys.lock.clone(),
        }
    }

    /// Try-acquire only: leaves the queue (our queue key as last read,
    /// `ours`) and says the lock is held.
    async fn leave<T>(&self, ours: Option<&KvEntry>) -> Result<T> {
        leave_queue(self.s, &self.keys, ours).await?;
        Err(would_block(&self.keys))
    }

    /// A queued grant remembers whether the lock was contended: others
    /// in `line`, as last read before the grant (the take txn's own read,
    /// or the view it rests on), or a holder outside our line that this
    /// attempt waited for (while it waited, others may have joined behind
    /// it unseen). While it was, this session's next acquire of the lock
    /// queues at once instead of trying the fast path. Noted here, not by
    /// the release: a release that read the line for this would read all
    /// of it (Consul cannot read one neighbour), a cost that grows with
    /// the waiters at every handoff. A hint only: either path is correct;
    /// a contender that joins during the hold is seen by the next fast try.
    fn note_line<'e>(&self, line: impl IntoIterator<Item = &'e KvEntry>) {
        let others = line.into_iter().any(|e| !self.is_our_entry(e));
        let held_up = self.held_up.load(Ordering::Relaxed);
        self.s.contended.note(&self.keys.lock, others || held_up);
    }

    /// Our queue key in `view`.
    fn our_entry<'v>(&self, view: &'v View) -> Option<&'v KvEntry> {
        view.queue.iter().find(|e| self.is_our_entry(e))
    }

    /// Step 0, the fast path, one request when the lock is free: take
    /// `.lock` in one txn, guarded by `.lock` not existing, and read the
    /// whole lock. No queue key: a waiter that comes while we hold treats
    /// us as it treats a `consul lock` holder (it waits on `.lock`). If a
    /// contender of ours was already queued (it is between the previous
    /// holder's release and its own grant), we never report the grant:
    /// one txn gives `.lock` back and joins the queue behind it, so FIFO
    /// holds. Any failure (`.lock` held, a lock-delay, another recipe's
    /// `.lock`) leaves nothing written and falls through to the queued
    /// path. Skipped for a mutex that was contended at this session's
    /// last try or queued grant ([`Self::note_line`]).
    async fn fast_path(&self, transient: &mut Transient<'_>) -> Result<Fast> {
        let (s, keys) = (self.s, &self.keys);
        let contended = s.contended.contains(&keys.lock);
        let tried = if contended {
            None
        } else {
            try_fast(s, self.req, keys, self.record(), transient).await?
        };
        let Some(FastTry {
            view: v,
            token,
            at_grant,
            last,
        }) = tried
        else {
            if !contended {
                s.contended.note(&keys.lock, true); // `.lock` is taken
            }
            return Ok(Fast::Queue(None));
        };
        if v.line(keys).is_empty() {
            // A marker of an earlier holder (see `release`) goes
            // with our release, as a queued holder's does.
            if v.revoke.is_none() {
                s.fast_held.lock().expect("poisoned").insert(token);
                if at_grant {
                    s.lone_grants.keep(&keys.lock, last, token);
                }
            }
            return Ok(Fast::Granted(self.granted(token)));
        }
        s.contended.note(&keys.lock, true);
        // Given back and joined: go on from the lock as that txn read
        // it. Else (our grant was taken from us first, or the join's
        // answer was lost and it did not go through) join below.
        let joined = give_back(s, self.req, keys, token, Some(self.record()), transient)
            .await?
            .filter(|v| v.queue.iter().any(|e| self.is_our_entry(e)));
        Ok(Fast::Queue(joined))
    }

    /// Step 1: join our queue and read the whole lock in one request. A
    /// join whose answer was lost is read back: our queue key there means
    /// it went through.
    async fn join_queue(&self, transient: &mut Transient<'_>) -> Result<View> {
        let (s, keys) = (self.s, &self.keys);
        loop {
            let ops = vec![
                op::lock(&self.qkey, &s.id, QUEUE_FLAGS, &self.record().encode()),
                op::get_tree(&keys.tree),
            ];
            match s
                .write_attempt(keys, self.req, ops, "joining the queue")
                .await
            {
                Ok(Txn::Done(results)) => {
                    return Ok(View::from_entries(keys, read_after_lock(results)));
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
                    let v = transient.retry(|| self.read()).await?;
                    if v.queue.iter().any(|e| self.is_our_entry(e)) {
                        return Ok(v); // the join went through; its answer was lost
                    }
                }
            }
        }
    }

    /// Steps 2 to 4, from `view` until the lock is ours: each look at the
    /// lock ends in a grant, a wait, or a new look.
    async fn wait_and_take(
        &self,
        mut view: View,
        transient: &mut Transient<'_>,
    ) -> Result<Acquired> {
        let mut failures = Failures {
            retries: 0,
            delay_wait: Backoff::new(LOCK_DELAY_BACKOFF.0, LOCK_DELAY_BACKOFF.1),
            retry_wait: Backoff::new(RETRY_PAUSE, RETRY_PAUSE),
        };
        loop {
            // Mutexes and read-write locks of one name share one line.
            let line = view.line(&self.keys);
            let pos = line.iter().position(|(_, e)| self.is_our_entry(e));
            let next = if let Some(l) = view.lock.clone().filter(|l| self.mine(l)) {
                self.own_grant(&line, &l, transient).await?
            } else {
                let Some(pos) = pos else {
                    return Err(session_lost(
                        "our queue entry is gone (session expired or entry deleted)",
                    ));
                };
                // The entry we wait for: a mutex waits for the one just
                // ahead of it (`waits_for`); none when we are first.
                if let Some(j) = waits_for(&line_kinds(&line), pos) {
                    let (pred, ours) = (&line[j].1, &line[pos].1);
                    self.wait_ahead(pred, ours, &mut failures, transient)
                        .await?
                } else if self.wait_holder(&mut view, transient).await? {
                    Next::Look(view)
                } else {
                    self.take(Seen::Read(&view), &mut failures, transient)
                        .await?
                }
            };
            match next {
                Next::Granted(held) => return Ok(held),
                Next::Look(v) => view = v,
            }
        }
    }

    /// Our own `.lock` (a grant whose answer was lost, in step 4 or on the
    /// fast path), wherever our queue key stands: held by us unless
    /// contenders of ours were in line before that grant
    /// ([`others_ahead`]), then given back (at our token only).
    async fn own_grant(
        &self,
        line: &[(LockKind, KvEntry)],
        l: &KvEntry,
        transient: &mut Transient<'_>,
    ) -> Result<Next> {
        let token = l.modify_index;
        if !others_ahead(line, &self.qkey, token) {
            self.note_line(line.iter().map(|(_, e)| e));
            return Ok(Next::Granted(self.granted(token)));
        }
        if let Some(v) = give_back(self.s, self.req, &self.keys, token, None, transient).await? {
            return Ok(Next::Look(v));
        }
        Ok(Next::Look(transient.retry(|| self.read()).await?))
    }

    /// Step 2: not first among our contenders: wait for `pred`, the one
    /// just ahead, to leave (herd-free: nobody else watches it), then try
    /// step 4 at once with the line read in its txn: it has usually held
    /// and let go, so we are first and `.lock` is free. `ours`: our queue
    /// key as last read.
    async fn wait_ahead(
        &self,
        pred: &KvEntry,
        ours: &KvEntry,
        failures: &mut Failures,
        transient: &mut Transient<'_>,
    ) -> Result<Next> {
        if !self.req.wait {
            return self.leave(Some(ours)).await;
        }
        let pred = pred.clone();
        transient.retry(|| self.s.wait_gone(&pred)).await?;
        self.take(Seen::InTxn(ours), failures, transient).await
    }

    /// Step 3: first in our queue, only we look at `.lock`. Another
    /// recipe's `.lock` is a conflict. `true`: `.lock` was held by another
    /// session, or by ours but broken by an operator (it goes at the end
    /// of the break's grace), and we waited until it changed (`view.lock`
    /// is it now). `false`: free for step 4.
    async fn wait_holder(&self, view: &mut View, transient: &mut Transient<'_>) -> Result<bool> {
        let keys = &self.keys;
        let Some(l) = &view.lock else {
            return Ok(false);
        };
        if l.flags != LOCK_FLAGS {
            return Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "{} has flags {:#x}, not the lock flags {LOCK_FLAGS:#x}: another recipe (a consul lock -n semaphore?) owns it",
                    keys.lock, l.flags
                ),
            ));
        }
        let broken = l.is_broken();
        if !l.holder().is_some_and(|h| h != self.s.id || broken) {
            return Ok(false);
        }
        if !self.req.wait {
            let ours = self.our_entry(view).cloned();
            return self.leave(ours.as_ref()).await;
        }
        let held = l.clone();
        self.held_up.store(true, Ordering::Relaxed);
        view.lock = transient.retry(|| self.s.wait_lock(keys, &held)).await?;
        Ok(true)
    }

    /// Step 4: take `.lock` with one txn: `check-index` (or
    /// `check-not-exists`) of the `.lock` in `view`, `check-session` of our
    /// queue key (so a contender whose session died while queued is never
    /// granted), `lock` of `.lock`, and `get` of `.lock` for the token.
    /// [`Seen::InTxn`] (step 2's contender ahead just left), the txn
    /// checks that `.lock` does not exist and that our queue key is at the
    /// index last read, and reads the line just before its `lock`: granted
    /// if nobody was ahead of us in that read, else given back at once (as
    /// a grant whose answer was lost), never reported. Anything but a
    /// grant re-reads the lock (after a pause for a lock-delay or an
    /// unexpected failure); an unknown outcome too (the next look
    /// recognizes our own grant by its contender id).
    async fn take(
        &self,
        seen: Seen<'_>,
        failures: &mut Failures,
        transient: &mut Transient<'_>,
    ) -> Result<Next> {
        let (s, keys) = (self.s, &self.keys);
        let view = match seen {
            Seen::Read(v) => Some(v),
            Seen::InTxn(_) => None,
        };
        let mut ops = vec![
            match view.and_then(|v| v.lock.as_ref()) {
                Some(l) => op::check_index(&keys.lock, l.modify_index),
                None => op::check_not_exists(&keys.lock),
            },
            op::check_session(&self.qkey, &s.id),
        ];
        if let Seen::InTxn(ours) = seen {
            ops.extend([
                op::check_index(&self.qkey, ours.modify_index),
                op::get_tree(&keys.tree),
            ]);
        }
        ops.push(op::lock(
            &keys.lock,
            &s.id,
            LOCK_FLAGS,
            &self.record().encode(),
        ));
        if view.is_some() {
            ops.push(op::get(&keys.lock));
        }
        let errs = match s
            .write_attempt(keys, self.req, ops, "taking the lock")
            .await
        {
            Ok(Txn::Done(mut results)) => {
                let lock = results
                    .iter()
                    .rposition(|e| e.key == keys.lock)
                    .map(|i| results.remove(i))
                    .ok_or_else(|| {
                        Error::new(ErrorKind::Internal, "Consul txn returned no .lock entry")
                    })?;
                if let Some(v) = view {
                    self.note_line(v.queue.iter().chain(&v.rw));
                    return Ok(Next::Granted(self.granted(lock.modify_index)));
                }
                // `check-session` and `check-index` answer with our entry
                // before the tree.
                let v = View::from_entries(keys, results.split_off(2.min(results.len())));
                return self.own_grant(&v.line(keys), &lock, transient).await;
            }
            Ok(Txn::Failed(errs)) => errs,
            Err(e) => {
                transient.absorb(e).await?;
                if let Seen::InTxn(ours) = seen {
                    let at = self.settle(ours, transient).await?;
                    return Ok(Next::Look(self.read_since(at, transient).await?));
                }
                return Ok(Next::Look(transient.retry(|| self.read()).await?));
            }
        };
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
            if !self.req.wait {
                // Our queue key as the failed txn left it.
                let ours = match seen {
                    Seen::Read(v) => self.our_entry(v),
                    Seen::InTxn(ours) => Some(ours),
                };
                return self.leave(ours).await;
            }
            tracing::debug!(lock = %keys.lock, "lock-delay in force; retrying");
            failures.delay_wait.wait().await;
        } else if at != 0 {
            failures.retries += 1;
            if failures.retries > MAX_ACQUIRE_RETRIES {
                return Err(failed("taking the lock", &errs));
            }
            failures.retry_wait.wait().await;
        }
        // `.lock` changed since we read it (or we slept): re-read.
        Ok(Next::Look(transient.retry(|| self.read()).await?))
    }

    /// After a step-2 take whose outcome is unknown: it may still land,
    /// late, while we wait behind someone (watching their key, not
    /// `.lock`): a `.lock` of ours then that nobody else can take and we
    /// do not see. So move our queue key's index off the one that take
    /// checks (rewrite it: Consul moves the index only if the value
    /// changes, so with the time of now) and come back only when that is
    /// certain; a take that landed before shows up in the next look as
    /// our own `.lock` (given back if anyone is ahead).
    /// Returns our queue key's index after the rewrite.
    async fn settle(&self, ours: &KvEntry, transient: &mut Transient<'_>) -> Result<u64> {
        let (s, keys) = (self.s, &self.keys);
        let gone = || session_lost("our queue entry or session is gone (session expired?)");
        loop {
            let ops = vec![
                op::check_session(&self.qkey, &s.id),
                op::lock(&self.qkey, &s.id, QUEUE_FLAGS, &self.record().encode()),
            ];
            let now = match s
                .write_attempt(keys, self.req, ops, "settling a take")
                .await
            {
                Ok(Txn::Done(r)) => r.last().map(|e| e.modify_index),
                Ok(Txn::Failed(_)) => return Err(gone()),
                Err(e) => {
                    transient.absorb(e).await?;
                    let v = transient.retry(|| self.read()).await?;
                    let Some(e) = v.queue.iter().find(|e| self.is_our_entry(e)) else {
                        return Err(gone());
                    };
                    Some(e.modify_index)
                }
            };
            // Past the index the lost take checks (an index only grows; a
            // stale read may show an older one, never a newer one).
            if let Some(i) = now.filter(|&i| i > ours.modify_index) {
                return Ok(i);
            }
            // Unchanged (within the same millisecond): again once the
            // clock has moved on (the record's `since_ms` then differs).
            // A wait for the clock, not a retry pause: no backoff.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// A read of the lock that shows our queue key at `at` or later (or
    /// gone): a read served stale, from before a take of ours that landed
    /// late, would hide our `.lock`, and we would wait behind someone who
    /// waits for it.
    async fn read_since(&self, at: u64, transient: &mut Transient<'_>) -> Result<View> {
        let mut pause = Backoff::new(RETRY_PAUSE, RETRY_PAUSE);
        loop {
            let v = transient.retry(|| self.read()).await?;
            let ours = v.queue.iter().find(|e| self.is_our_entry(e));
            if ours.is_none_or(|e| e.modify_index >= at) {
                return Ok(v);
            }
            pause.wait().await;
        }
    }
}

/// What step 4's txn rests on.
#[derive(Clone, Copy)]
enum Seen<'v> {
    /// The lock as read before it: the txn checks that `.lock` is as seen.
    Read(&'v View),
    /// Nothing read since our queue key (as given) was: the txn reads the
    /// line itself.
    InTxn(&'v KvEntry),
}

/// Releases a held mutex (after its fence, if any): one txn, `.lock` at
/// our token only, and what goes with it only while `.lock` is still at
/// our token; if it is not any more, [`remove_read`].
pub(crate) async fn release(
    s: &Arc<SessionState>,
    req: &AcquireRequest,
    keys: &Keys,
    held: &Acquired,
) -> Result<()> {
    // Our `.lock`'s index now: the token, or our last proclaim's.
    let at = s.index_of(&keys.lock, held.token);
    s.unwatch(keys);
    let fast = s.fast_held.lock().expect("poisoned").remove(&held.token);
    // `.lock` only at our token: never a newer holder's, never a newer
    // lock of this session (etcd #22082). A revoke marker names our
    // token (it is written under a check of `.lock`) or an earlier
    // holder's, left as below: ours to delete either way.
    let mut ops = vec![op::delete_cas(&keys.lock, at)];
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
        // A queued holder: its queue key. A fast holder has none.
        ops.push(op::delete(&keys.queue(&s.id)));
    }
    // Only while `.lock` is still this grant (`delete-cas` of a missing
    // `.lock` succeeds; `check-index` does not): a gone `.lock` is a loss
    // to report, and the queue key and the marker are named by our
    // session, not by this grant. A copy of this txn that lands late (its
    // answer lost, the release sent again and done, and this session
    // queued again) must not delete the newer attempt's queue key.
    ops.insert(0, op::check_index(&keys.lock, at));
    let released = s.write(keys, ops, "releasing").await;
    let one_txn = fast && matches!(released, Ok(Txn::Done(_)));
    s.lone_grants.released(&keys.lock, held.token, one_txn);
    match released? {
        Txn::Done(_) => Ok(()),
        Txn::Failed(errs) => {
            // `.lock` is not at our token: broken (gone, another holder's
            // now, or marked broken), rewritten behind our back while
            // still this grant (a proclaim whose answer was lost), or
            // released by an earlier copy of this txn whose answer was
            // lost (the client layer tells that from a loss). Remove what
            // this session has; the read it goes by tells which.
            tracing::debug!(lock = %keys.lock, ?errs, "the lock was not at our token");
            removed_if_found(req, remove_read(s, keys, Some(held.token)).await?)
        }
    }
}

/// Rewrites the value of our held `.lock` (an election leader's
/// proclaim) in one txn, applied only while `.lock` is still this very
/// grant: `check-session` (ours), `check-index` at its last known index
/// (a break's rewrite, a release, a new grant, even of this session, all
/// move it), then the `lock` verb with our session, which keeps the lock
/// held (a `consul lock` waiter goes on waiting), its `LockIndex` and
/// flags, and moves only `ModifyIndex`. The record names the grant's
/// token, so the token stays what it was and the monitor knows the new
/// index for ours. The txn also carries the attempt's fence: once the
/// guard is released, a late copy of it is refused. A failed check or a
/// lost answer is judged on a read of `.lock`: still this grant at
/// another index (a proclaim of ours whose answer was lost) -> try again
/// from there; else the lock is lost and nothing was written.
pub(crate) async fn set_value(
    s: &Arc<SessionState>,
    req: &AcquireRequest,
    keys: &Keys,
    held: &Acquired,
    value: &[u8],
) -> Result<()> {
    let token = held.token;
    let record = Record {
        quorumlock: 1,
        contender: Some(req.contender.to_string()),
        since_ms: Some(now_ms()),
        token: Some(token),
        ..Record::default()
    }
    .with_value(value);
    let mut at = s.index_of(&keys.lock, token);
    let lost = || {
        Error::new(
            ErrorKind::LockLost,
            format!("{} is no longer held by this session", req.name),
        )
    };
    for _ in 0..MAX_ACQUIRE_RETRIES {
        let ops = vec![
            op::check_session(&keys.lock, &s.id),
            op::check_index(&keys.lock, at),
            op::lock(&keys.lock, &s.id, LOCK_FLAGS, &record.encode()),
            op::get(&keys.lock),
        ];
        let unknown = match s.write_attempt(keys, req, ops, "proclaiming").await {
            Ok(Txn::Done(results)) => {
                let index = results
                    .iter()
                    .rev()
                    .find(|e| e.key == keys.lock)
                    .map(|e| e.modify_index)
                    .ok_or_else(|| {
                        Error::new(ErrorKind::Internal, "Consul txn returned no .lock entry")
                    })?;
                s.note_index(&keys.lock, token, index);
                return Ok(());
            }
            Ok(Txn::Failed(_)) => None,
            Err(e) if e.kind() == ErrorKind::Connection => Some(e),
            Err(e) => return Err(e),
        };
        let l = match read_view(&s.core.api, keys).await {
            Ok(v) => v.lock,
            // Neither answer known: the value may or may not have changed.
            Err(e) => return Err(unknown.unwrap_or(e)),
        };
        let Some(l) = l.filter(|l| l.is_grant(&s.id, token)) else {
            return Err(lost());
        };
        s.note_index(&keys.lock, token, l.modify_index);
        if unknown.is_some() && l.modify_index != at && l.record().is_some_and(|r| r == record) {
            return Ok(()); // applied; only its answer was lost
        }
        at = l.modify_index;
    }
    Err(Error::new(
        ErrorKind::Store,
        format!("{} kept changing while proclaiming", req.name),
    ))
}

/// Leaves the queue (a try-acquire that found the lock held): deletes our
/// queue key at the index of `ours` (as this attempt last read it) only.
/// A copy of this txn that lands late (its answer lost, the attempt
/// removed, and this session queued again) then deletes nothing: the
/// newer attempt's queue key has the same name but another index. If our
/// key moved since that read (or none was given), [`remove_read`].
async fn leave_queue(s: &Arc<SessionState>, keys: &Keys, ours: Option<&KvEntry>) -> Result<()> {
    if let Some(e) = ours {
        let ops = vec![op::delete_cas(&e.key, e.modify_index)];
        match s.write(keys, ops, "leaving the queue").await? {
            Txn::Done(_) => return Ok(()),
            Txn::Failed(errs) => {
                tracing::debug!(lock = %keys.lock, ?errs, "our queue key moved; re-reading");
            }
        }
    }
    remove_read(s, keys, None).await.map(drop)
}

/// The one-txn acquire of a free mutex: `check-not-exists` of `.lock`,
/// `lock` of `.lock`, `get-tree` (none after a quiet cycle: see
/// `SessionState::lone_grants`).
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
    s: &Arc<SessionState>,
    req: &AcquireRequest,
    keys: &Keys,
    record: Record,
    transient: &mut Transient<'_>,
) -> Result<Option<FastTry>> {
    let last = s.lone_grants.take(&keys.lock);
    let skip_read = last.is_some_and(|l| l.quiet);
    let contender = record.contender.clone();
    let mut ops = vec![
        op::check_not_exists(&keys.lock),
        op::lock(&keys.lock, &s.id, LOCK_FLAGS, &record.encode()),
    ];
    if !skip_read {
        ops.push(op::get_tree(&keys.tree));
    }
    // Last (it reads nothing): not once we are in line. A fast txn
    // whose answer was lost may land late, after this acquire queued;
    // a `.lock` of ours taken then, while a contender ahead of us waits
    // for it and we wait for that contender, would deadlock.
    ops.push(op::check_not_exists(&keys.queue(&s.id)));
    let read = || read_view(&s.core.api, keys);
    // Our grant at `token`, judged on a read taken after it: only if
    // that read still shows `.lock` ours at that token and not broken
    // (else an operator broke it and someone else may hold it now:
    // its `.lock`, its index, are not ours). Entries made after our
    // grant are behind us.
    let after = |mut v: View, token: u64| {
        let ours = v.lock.as_ref().is_some_and(|l| {
            l.holder() == Some(s.id.as_str())
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
    let results = match s.write_attempt(keys, req, ops, "taking a free lock").await {
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
    s: &Arc<SessionState>,
    req: &AcquireRequest,
    keys: &Keys,
    token: u64,
    join: Option<Record>,
    transient: &mut Transient<'_>,
) -> Result<Option<View>> {
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
            s.write_attempt(keys, req, ops, "giving the lock back")
                .await
        } else {
            s.write(keys, ops, "giving the lock back").await
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
            Ok(Txn::Failed(errs)) if errs.iter().any(|e| e.what.contains("invalid session")) => {
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
                let v = transient.retry(|| read_view(&s.core.api, keys)).await?;
                if v.lock.as_ref().is_none_or(|l| l.modify_index != token) {
                    // Given back (or taken from us): go on from here.
                    return Ok(Some(v));
                }
                // Not applied: try again.
            }
        }
    }
}

/// Removes what this session has of the mutex: our queue key, and
/// `.lock` (with any revoke marker) if this session holds it, each by
/// `delete-cas` at the index a read (`?consistent`) shows. The client
/// layer has at most one request per (session, name) and keeps it until
/// this returns, so what this session has now belongs to the request
/// being removed (an earlier attempt's late writes are fenced off). Named
/// versions, not names: a copy of the txn that lands late, after this
/// removal was sent again and done and this session acquired again,
/// finds the newer attempt's keys at other indexes and deletes nothing
/// (the keys of a session have the same names from one attempt to the
/// next). If something moved between the read and the txn (a break),
/// read again. Whether that read showed `.lock` still the grant at
/// `grant` (false without one).
async fn remove_read(s: &Arc<SessionState>, keys: &Keys, grant: Option<u64>) -> Result<bool> {
    let qkey = keys.queue(&s.id);
    for _ in 0..MAX_ACQUIRE_RETRIES {
        let v = read_view(&s.core.api, keys).await?;
        let mut ops = Vec::new();
        let ours = v
            .lock
            .as_ref()
            .filter(|l| l.holder() == Some(s.id.as_str()));
        let held = grant.is_some_and(|token| ours.is_some_and(|l| l.is_grant(&s.id, token)));
        if let Some(l) = ours {
            ops.push(op::delete_cas(&keys.lock, l.modify_index));
            if let Some(r) = &v.revoke {
                ops.push(op::delete_cas(&keys.revoke, r.modify_index));
            }
        }
        if let Some(q) = v.queue.iter().find(|e| e.key == qkey) {
            ops.push(op::delete_cas(&qkey, q.modify_index));
        }
        if ops.is_empty() {
            return Ok(held);
        }
        match s.write(keys, ops, "removing our entry").await? {
            Txn::Done(_) => return Ok(held),
            Txn::Failed(errs) => {
                tracing::debug!(lock = %keys.lock, ?errs, "the lock changed while removing our entry; re-reading");
            }
        }
    }
    // Retryable: the client layer tries again after a pause.
    Err(Error::new(
        ErrorKind::Timeout,
        format!("{} kept changing while removing our entry", keys.lock),
    ))
}

/// Abandons a mutex acquire: out of the monitor's hands, then
/// [`remove_read`].
pub(crate) async fn abandon(s: &Arc<SessionState>, keys: &Keys) -> Result<()> {
    s.unwatch(keys);
    remove_read(s, keys, None).await.map(drop)
}
