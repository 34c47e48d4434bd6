//! What the client and its guards share: the client's state, its session
//! slot, the local queue ticket, a pending acquire, and the removal of a
//! store entry.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::{oneshot, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::availability::{ClientOptions, Unreachable};
use crate::backend::{AcquireRequest, Acquired, Backend, Backoff, StoreSession};
use crate::signal::{LossReason, SessionLiveness};
use crate::telemetry;
use crate::{Error, ErrorKind, LockName, Result};

pub(super) struct ClientInner {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) options: ClientOptions,
    pub(super) session: tokio::sync::Mutex<Option<Arc<SessionSlot>>>,
    /// The local queues, by name and permits (0 for a mutex).
    pub(super) local: StdMutex<HashMap<(LockName, u32), Arc<Semaphore>>>,
    pub(super) cleanup: Cleanup,
    pub(super) runtime: tokio::runtime::Handle,
}

/// The last handle (client, guard or background job) is gone: end the
/// session so that its keepalive stops and the store frees it now rather
/// than after the TTL.
impl Drop for ClientInner {
    fn drop(&mut self) {
        if let Some(slot) = self.session.get_mut().take() {
            // The session's supervisor ends it on the store.
            slot.liveness.lose(LossReason::ClientClosed);
        }
    }
}

/// The one client-side task per session: turns a passed local deadline
/// into a loss, and once the session is lost for any reason ends it on the
/// store, so that no keepalive outlives a session we gave up on (its
/// entries would otherwise stay until the server expired it).
pub(super) async fn supervise(
    store: Arc<dyn StoreSession>,
    liveness: Arc<SessionLiveness>,
    closed: tokio_util::sync::CancellationToken,
) {
    // Whatever ends this task (the runtime stopping, a panic in `close`)
    // ends the waits on `closed` too.
    let _closed = closed.clone().drop_guard();
    liveness.clone().watchdog().await;
    if let Err(e) = store.close().await {
        tracing::debug!(error = %e, session = %store.id(), "ending a lost session failed; the store expires it by TTL");
    }
    closed.cancel();
}

/// The current store session and its liveness.
pub(super) struct SessionSlot {
    pub(super) store: Arc<dyn StoreSession>,
    pub(super) liveness: Arc<SessionLiveness>,
    /// Cancelled by the supervisor once the session is ended on the store.
    pub(super) closed: tokio_util::sync::CancellationToken,
}

/// Background release/abandon jobs and a way to wait for them.
#[derive(Default)]
pub(super) struct Cleanup {
    pub(super) pending: AtomicUsize,
    pub(super) idle: Notify,
}

/// Runs a release or abandon of `lock` in the background. If the job is
/// dropped before it ran to the end (the runtime shut down first, as when
/// a guard is dropped while `main` returns), a warning says so: the entry
/// stays on the store until the session's TTL ends it.
pub(super) fn spawn_cleanup(
    inner: &Arc<ClientInner>,
    lock: &LockName,
    job: impl Future<Output = ()> + Send + 'static,
) {
    inner.cleanup.pending.fetch_add(1, Ordering::AcqRel);
    // Moved into the job: dropped when the job ends, run to the end or
    // not, and counts it done then.
    let unfinished = Unfinished {
        lock: Some(lock.clone()),
        client: inner.clone(),
    };
    inner.runtime.spawn(async move {
        job.await;
        unfinished.done();
    });
}

/// Counts a cleanup job done when dropped, and warns if the job had not
/// run to the end ([`Unfinished::done`] not called).
struct Unfinished {
    lock: Option<LockName>,
    client: Arc<ClientInner>,
}

impl Unfinished {
    fn done(mut self) {
        self.lock = None;
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            tracing::warn!(
                %lock,
                "the runtime stopped before the removal of this lock's entry ran: it stays on the store until its session's TTL; release guards and close the client (LockClient::close) before the runtime ends"
            );
        }
        if self.client.cleanup.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.client.cleanup.idle.notify_waiters();
        }
    }
}

pub(super) fn would_block(name: &LockName) -> Error {
    Error::new(ErrorKind::WouldBlock, format!("lock {name} is held"))
}

pub(super) fn timed_out(name: &LockName) -> Error {
    Error::new(
        ErrorKind::Timeout,
        format!("lock {name} was not acquired in time"),
    )
}

/// The earlier of two optional instants.
pub(super) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Runs `f` until `deadline`; `None` if the deadline came first.
pub(super) async fn until<F: Future>(deadline: Option<Instant>, f: F) -> Option<F::Output> {
    match deadline {
        None => Some(f.await),
        Some(d) => tokio::time::timeout_at(d, f).await.ok(),
    }
}

/// How many times a removal that the store refuses with an error that is
/// not retryable is tried (a second `NOSCRIPT`, a permission changed back)
/// before the session is ended instead.
pub(super) const REFUSED_REMOVAL_TRIES: u32 = 3;

/// Removes a store entry, retrying transient failures until it is gone or
/// the session is dead (then the store removes it with the session).
///
/// Each attempt races the session's loss: a request stuck on a dead link
/// (the store's client library may queue it until it gives up) ends when
/// the session's local deadline passes, so a removal never outlives the
/// session it belongs to.
///
/// A removal the store keeps refusing ([`REFUSED_REMOVAL_TRIES`] errors
/// that are not retryable) would leave the entry on the store with a live
/// session renewing it: a lock nobody can take, or a waiter's leftover
/// entry granted later to nobody. The session is ended instead (every
/// lock it holds reports [`LossReason::SessionEnded`]), the one way left
/// to make the store drop the entry, and the error is returned: the
/// removal was not confirmed.
///
/// A release returns `Ok` only once the store removed our entry as
/// granted. It returns [`ErrorKind::LockLost`] when the store no longer
/// has the entry ([`StoreSession::release`](crate::backend::StoreSession::release)
/// says so: broken by an operator, purged, expired), even after an
/// earlier try whose answer was lost (that try may have removed it, or
/// the lock was lost before: not confirmed either way), and when the
/// session is lost before the store answered (the store drops the entry
/// with the session, perhaps before the release reached it). An abandon
/// is done in both cases.
///
/// # Cancel safety
/// Dropping it stops the removal where it is; callers run it in the
/// background when it must finish ([`spawn_cleanup`]).
pub(super) async fn remove_entry(
    session: &SessionSlot,
    req: &AcquireRequest,
    held: Option<&Acquired>,
) -> Result<()> {
    let op = if held.is_some() { "release" } else { "abandon" };
    let mut backoff = backoff();
    let mut refused = 0;
    // An earlier try may have been applied, its answer lost.
    let mut maybe_applied = false;
    // The session is gone: the store drops the entry with it. An abandon
    // is done; a release was not confirmed (the store may have dropped
    // the entry before the release reached it).
    let session_gone = || match held {
        None => Ok(()),
        Some(_) => Err(Error::new(
            ErrorKind::LockLost,
            format!(
                "the session was lost before the store confirmed the release of {}",
                req.name
            ),
        )),
    };
    loop {
        if !session.liveness.is_alive() {
            return session_gone();
        }
        let attempt = async {
            // A write of the attempt still in flight could land after
            // the removal and leave its entry behind.
            req.writes.settled().await;
            match held {
                Some(h) => session.store.release(req, h).await,
                None => session.store.abandon(req).await,
            }
        };
        let r = tokio::select! {
            // An answer that came with the loss still counts.
            biased;
            r = attempt => r,
            _ = session.liveness.lost() => return session_gone(),
        };
        telemetry::store_call(op, r.as_ref().err().map(Error::kind));
        let e = match r {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if e.kind() == ErrorKind::LockLost {
            return match (held, maybe_applied) {
                (None, _) => Ok(()),
                (Some(_), false) => Err(e),
                (Some(_), true) => Err(Error::new(
                    ErrorKind::LockLost,
                    format!(
                        "the release of {} was not confirmed: its entry was gone when tried again after a try whose answer was lost (removed by that try, or lost before)",
                        req.name
                    ),
                )
                .with_source(e)),
            };
        }
        maybe_applied |= matches!(e.kind(), ErrorKind::Timeout | ErrorKind::Connection);
        if !e.is_retryable() {
            refused += 1;
            if refused >= REFUSED_REMOVAL_TRIES {
                tracing::warn!(error = %e, lock = %req.name, "the store refused to remove our entry; ending the session so that it drops the entry");
                let deadline = session.liveness.deadline();
                session.liveness.lose(LossReason::SessionEnded);
                // The supervisor ends the session on the store (or it
                // expires there by its TTL, no longer renewed): waited
                // for no longer than the session's local deadline.
                until(deadline, session.closed.cancelled()).await;
                return Err(Error::new(
                    e.kind(),
                    format!(
                        "the {op} of {} was not confirmed: the store refused it {refused} times; the session was ended so that the store drops the entry",
                        req.name
                    ),
                )
                .with_source(e));
            }
        }
        tracing::debug!(error = %e, lock = %req.name, "removing entry failed, retrying");
        tokio::select! {
            () = backoff.wait() => {}
            _ = session.liveness.lost() => return session_gone(),
        }
    }
}

/// How long past its deadline (or, without one, past its failure) an
/// acquire waits for the store to confirm that its entry is gone before
/// returning; past it the removal goes on in the background
/// ([`LockClient::wait_idle`] waits for it).
pub(crate) const ABANDON_GRACE: Duration = Duration::from_millis(100);

/// The latest a timed-out or failed acquire waits for its abandon: the
/// grace counts from the deadline (a late wake-up must not add it again),
/// from now without one.
pub(crate) fn abandon_bound(deadline: Option<Instant>) -> Instant {
    let from = deadline.unwrap_or_else(Instant::now);
    from.checked_add(ABANDON_GRACE).unwrap_or(from)
}

/// How long an acquire may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Try,
    Wait,
    Until(Instant),
}

impl Mode {
    /// Waits at most `timeout` from now; a timeout too long for the clock
    /// to add (`Duration::MAX`) waits without end instead of panicking.
    pub(crate) fn within(timeout: Duration) -> Mode {
        Instant::now()
            .checked_add(timeout)
            .map_or(Mode::Wait, Mode::Until)
    }
}

pub(super) const BACKOFF_MIN: Duration = Duration::from_millis(50);
pub(super) const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// The client's retry backoff: 50 ms to 2 s, with jitter.
pub(super) fn backoff() -> Backoff {
    Backoff::new(BACKOFF_MIN, BACKOFF_MAX)
}

/// The local queue slot of one owner; dropping it lets the next local
/// owner contend, and forgets the queue once nobody uses it.
pub(super) struct LocalTicket {
    pub(super) client: Arc<ClientInner>,
    /// The queue's key in [`ClientInner::local`].
    pub(super) key: (LockName, u32),
    pub(super) permit: Option<OwnedSemaphorePermit>,
}

impl Drop for LocalTicket {
    fn drop(&mut self) {
        if self.permit.take().is_none() {
            return;
        }
        let mut map = self.client.local.lock().expect("local queue map poisoned");
        if map
            .get(&self.key)
            .is_some_and(|q| Arc::strong_count(q) == 1)
        {
            map.remove(&self.key);
        }
    }
}

/// An acquire attempt in flight. Dropped before it is disarmed (the
/// acquire future was cancelled, or failed), it abandons the attempt in the
/// background and frees the local slot only afterwards.
pub(super) struct PendingAcquire {
    pub(super) client: Arc<ClientInner>,
    pub(super) session: Arc<SessionSlot>,
    pub(super) req: Option<AcquireRequest>,
    pub(super) ticket: Option<LocalTicket>,
}

impl PendingAcquire {
    pub(super) fn disarm(mut self) -> LocalTicket {
        self.req = None;
        self.ticket.take().expect("ticket taken once")
    }

    /// Hands the removal of our entry to the background (before any
    /// await, so that dropping the caller while it waits loses nothing),
    /// then waits for it until `bound`. Returns the local ticket if the
    /// removal finished in time; otherwise the background job keeps the
    /// ticket until the entry is gone, so no later attempt of this client
    /// on the name overtakes the removal.
    ///
    /// # Cancel safety
    /// Dropping it only stops the wait; the removal goes on.
    pub(super) async fn abandon(mut self, bound: Option<Instant>) -> Option<LocalTicket> {
        let done = self.spawn_abandon()?;
        until(bound, done).await.and_then(|r| r.ok())
    }

    /// Starts the background removal; the receiver gets the local ticket
    /// once our entry is gone. `None` if there was nothing to abandon.
    pub(super) fn spawn_abandon(&mut self) -> Option<oneshot::Receiver<LocalTicket>> {
        let req = self.req.take()?;
        let ticket = self.ticket.take();
        let session = self.session.clone();
        let (tx, rx) = oneshot::channel();
        let lock = req.name.clone();
        spawn_cleanup(&self.client, &lock, async move {
            req.signals.finish();
            // An error was logged, and the session ended so that the
            // store drops the entry: the slot is free either way.
            let _ = remove_entry(&session, &req, None).await;
            if let Some(t) = ticket {
                // Nobody waiting any more: the slot is freed here.
                let _ = tx.send(t);
            }
        });
        Some(rx)
    }
}

impl Drop for PendingAcquire {
    fn drop(&mut self) {
        if let Some(req) = &self.req {
            tracing::debug!(lock = %req.name, "acquire cancelled; abandoning in the background");
        }
        self.spawn_abandon();
    }
}

/// The retry state of one acquire: its backoff, its trouble reaching the
/// store, and the session its last attempt used.
pub(super) struct Retry {
    name: LockName,
    /// Named (`describe`) only in a warning or an error, not per acquire.
    backend: Arc<dyn Backend>,
    backoff: Backoff,
    pub(super) unreachable: Unreachable,
    current: Option<Arc<SessionSlot>>,
}

impl Retry {
    pub(super) fn new(name: &LockName, options: &ClientOptions, backend: Arc<dyn Backend>) -> Self {
        Retry {
            name: name.clone(),
            backend,
            backoff: backoff(),
            unreachable: Unreachable::new(options),
            current: None,
        }
    }

    /// A session could not be opened, or an attempt failed on the link;
    /// the trouble started no later than `started`.
    pub(super) fn failed(&mut self, e: &Error, started: Instant) {
        self.unreachable
            .failed(&self.backend.describe(), e, started);
    }

    /// Waits the next backoff step; false if the deadline or the
    /// unavailability limit came first.
    pub(super) async fn back_off(&mut self, deadline: Option<Instant>) -> bool {
        let until_at = earliest(deadline, self.unreachable.give_up_at());
        until(until_at, self.backoff.wait()).await.is_some()
    }

    /// The error of a wait that ended: the caller's deadline or ours.
    pub(super) fn gave_up(&self, deadline: Option<Instant>) -> Error {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            timed_out(&self.name)
        } else {
            self.unreachable.error(&self.name, &self.backend.describe())
        }
    }

    /// An attempt uses `session`; a new one means the store answered.
    pub(super) fn opened(&mut self, session: &Arc<SessionSlot>) {
        if !self
            .current
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, session))
        {
            self.unreachable.recovered();
            self.current = Some(session.clone());
        }
    }
}

/// An upgrade in progress ([`super::LockGuard::upgrade`]): the session
/// and contender id of the upgradeable hold, and its signals (its loss
/// ends the upgrade).
pub(super) struct Upgrading {
    pub(super) session: Arc<SessionSlot>,
    pub(super) of: uuid::Uuid,
    pub(super) parent: crate::backend::EntrySignals,
}

/// Resolves when the upgradeable hold of `upgrading` is lost; never
/// without one.
pub(super) async fn parent_lost(upgrading: Option<&Upgrading>) {
    match upgrading {
        Some(u) => {
            u.parent.lost().await;
        }
        None => std::future::pending().await,
    }
}

pub(super) fn upgrade_lost(name: &LockName) -> Error {
    Error::new(
        ErrorKind::LockLost,
        format!("{name}: the upgradeable read hold was lost; nothing to upgrade"),
    )
}
