//! The client layer: everything about locking that is the same on every
//! store. Backends only speak their protocol (see [`crate::backend`]).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::{oneshot, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tracing::Instrument;

use crate::availability::{name_holders, ClientOptions, Unreachable};
use crate::backend::{AcquireRequest, Acquired, Backend, StoreSession};
use crate::signal::{LossReason, SessionLiveness};
use crate::telemetry;
use crate::{Error, ErrorKind, LockName, Result};
use crate::{LockKind, LockState};

/// A handle to one store, cheap to clone; all clones share one session.
///
/// The session is opened on the first acquire, kept alive by the backend's
/// one background task, and replaced transparently by the next acquire
/// after it is lost. Every guard of a lost session reports the loss.
///
/// Within one client, each lock name has a local FIFO queue: at most one
/// owner of this client contends for a name on the store at a time, and
/// the next local owner enters the store only after the previous one's
/// entry is gone. Different owners in one process therefore exclude each
/// other exactly as different processes do.
#[derive(Clone)]
pub struct LockClient {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    backend: Arc<dyn Backend>,
    options: ClientOptions,
    session: tokio::sync::Mutex<Option<Arc<SessionSlot>>>,
    local: StdMutex<HashMap<LockName, Arc<Semaphore>>>,
    cleanup: Cleanup,
    runtime: tokio::runtime::Handle,
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
async fn supervise(
    store: Arc<dyn StoreSession>,
    liveness: Arc<SessionLiveness>,
    closed: tokio_util::sync::CancellationToken,
) {
    liveness.clone().watchdog().await;
    if let Err(e) = store.close().await {
        tracing::debug!(error = %e, session = %store.id(), "ending a lost session failed; the store expires it by TTL");
    }
    closed.cancel();
}

/// The current store session and its liveness.
struct SessionSlot {
    store: Arc<dyn StoreSession>,
    liveness: Arc<SessionLiveness>,
    /// Cancelled by the supervisor once the session is ended on the store.
    closed: tokio_util::sync::CancellationToken,
}

/// Background release/abandon jobs and a way to wait for them.
#[derive(Default)]
struct Cleanup {
    pending: AtomicUsize,
    idle: Notify,
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("store", &self.inner.backend.describe())
            .finish()
    }
}

impl LockClient {
    /// A client over `backend` with the default [`ClientOptions`]. Must be
    /// called inside a tokio runtime.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self::with_options(backend, ClientOptions::default())
    }

    /// A client over `backend` with `options`. Must be called inside a
    /// tokio runtime.
    pub fn with_options(backend: Arc<dyn Backend>, options: ClientOptions) -> Self {
        LockClient {
            inner: Arc::new(ClientInner {
                backend,
                options,
                session: tokio::sync::Mutex::new(None),
                local: StdMutex::new(HashMap::new()),
                cleanup: Cleanup::default(),
                runtime: tokio::runtime::Handle::current(),
            }),
        }
    }

    /// A handle to the lock `name`; the name is checked here, before
    /// anything touches the store.
    pub fn lock(&self, name: impl AsRef<str>) -> Result<Lock> {
        Ok(Lock {
            client: self.clone(),
            name: LockName::new(name.as_ref())?,
        })
    }

    /// A handle to the read-write lock `name`: readers hold together, a
    /// writer holds alone, and arrival order is kept across both, so a
    /// stream of readers cannot starve a waiting writer.
    pub fn rwlock(&self, name: impl AsRef<str>) -> Result<crate::RwLock> {
        Ok(crate::RwLock::new(
            self.clone(),
            LockName::new(name.as_ref())?,
        ))
    }

    /// A handle to the counting semaphore `name` with `permits` holders at
    /// most. Every user of one semaphore must agree on `permits`; a
    /// different count is [`ErrorKind::Conflict`] at acquire. One client
    /// holds at most one permit of a semaphore at a time (its owners queue
    /// locally), as `consul lock -n` counts one holder per session.
    pub fn semaphore(&self, name: impl AsRef<str>, permits: u32) -> Result<crate::Semaphore> {
        let name = LockName::new(name.as_ref())?;
        if permits == 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("semaphore {name} needs at least one permit"),
            ));
        }
        Ok(crate::Semaphore::new(self.clone(), name, permits))
    }

    /// The backend, for admin operations and tests.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// Holders and waiters of `name`.
    ///
    /// # Cancel safety
    /// Read-only; safe to drop.
    pub async fn inspect(&self, name: impl AsRef<str>) -> Result<LockState> {
        let name = LockName::new(name.as_ref())?;
        self.inner.backend.inspect(&name).await
    }

    /// Every lock under `prefix` that someone holds or waits for, sorted by
    /// name, each as [`inspect`](Self::inspect) reports it: `prefix` itself
    /// and the names nested under it (whole segments: `deploy` covers
    /// `deploy/prod`, not `deployment`). An empty `prefix` lists the whole
    /// namespace; a trailing `/` is ignored. Free locks are left out.
    ///
    /// It reads the prefix's whole subtree on the store (there is no index
    /// of names), so it is for operators and diagnostics, not hot paths.
    ///
    /// # Cancel Safety
    /// Read-only; safe to drop.
    pub async fn list(&self, prefix: impl AsRef<str>) -> Result<Vec<LockState>> {
        let p = prefix.as_ref();
        let p = p.strip_suffix('/').unwrap_or(p);
        let prefix = match p {
            "" => None,
            p => Some(LockName::new(p)?),
        };
        self.inner.backend.list(prefix.as_ref()).await
    }

    /// Asks the holder of `name` to let go (cooperative revoke); its
    /// guard's [`LockGuard::revoke_requested`] fires. Returns whether the
    /// lock was held.
    ///
    /// # Cancel safety
    /// One store write; dropping it may or may not have marked the holder.
    pub async fn request_revoke(&self, name: impl AsRef<str>) -> Result<bool> {
        let name = LockName::new(name.as_ref())?;
        self.inner.backend.request_revoke(&name).await
    }

    /// Forcibly breaks `name`: the holder's entry is deleted and its guard
    /// reports [`LossReason::EntryDeleted`]. Returns whether it was held.
    ///
    /// # Cancel safety
    /// Dropping it may or may not have broken the lock.
    pub async fn break_lock(&self, name: impl AsRef<str>) -> Result<bool> {
        let name = LockName::new(name.as_ref())?;
        self.inner.backend.break_lock(&name).await
    }

    /// The id of the current store session, if one is open and alive.
    pub async fn session_id(&self) -> Option<String> {
        let cur = self.inner.session.lock().await;
        cur.as_ref()
            .filter(|s| s.liveness.is_alive())
            .map(|s| s.store.id())
    }

    /// Waits until every background release and abandon has finished.
    ///
    /// # Cancel safety
    /// Only waits; safe to drop.
    pub async fn wait_idle(&self) {
        let cleanup = &self.inner.cleanup;
        loop {
            let notified = cleanup.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if cleanup.pending.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Waits for background cleanup, then ends the session on the store.
    /// Guards still held report [`LossReason::ClientClosed`]; a later
    /// acquire opens a new session.
    ///
    /// # Cancel safety
    /// Dropping it may leave the session open; it then expires by its TTL.
    pub async fn close(&self) {
        self.wait_idle().await;
        let old = self.inner.session.lock().await.take();
        if let Some(slot) = old {
            slot.liveness.lose(LossReason::ClientClosed);
            slot.closed.cancelled().await;
        }
    }

    /// The current session, opened if there is none or it was lost.
    async fn session(&self) -> Result<Arc<SessionSlot>> {
        let mut cur = self.inner.session.lock().await;
        if let Some(slot) = cur.as_ref() {
            if slot.liveness.is_alive() {
                return Ok(slot.clone());
            }
            // Lost already (its supervisor ends it on the store).
            let old = cur.take().expect("checked above");
            old.liveness.lose(LossReason::SessionExpired);
        }
        let liveness = Arc::new(SessionLiveness::new());
        let store = self
            .inner
            .backend
            .open_session(liveness.clone())
            .instrument(tracing::debug_span!("open_session"))
            .await?;
        if !liveness.is_alive() {
            // Granted, but the answer came after the deadline it implies
            // (a slow or partitioned link): as good as expired. Retryable.
            let _ = store.close().await;
            return Err(Error::new(
                ErrorKind::SessionLost,
                "the store confirmed the new session too late to use it",
            ));
        }
        tracing::debug!(session = %store.id(), "session opened");
        let closed = tokio_util::sync::CancellationToken::new();
        self.inner
            .runtime
            .spawn(supervise(store.clone(), liveness.clone(), closed.clone()));
        let slot = Arc::new(SessionSlot {
            store,
            liveness,
            closed,
        });
        *cur = Some(slot.clone());
        Ok(slot)
    }

    /// A place in the local FIFO queue of `name` (one permit: one store
    /// contender per client), for the kinds whose store layout keys entries
    /// by session: mutexes (etcd's and Consul's native layouts) and
    /// semaphores (`consul lock -n` counts one holder per session).
    /// Readers and writers of a read-write lock have one entry each and are
    /// ordered by the store alone, so none of them can overtake a waiter
    /// of another client.
    async fn local_ticket(
        &self,
        name: &LockName,
        kind: LockKind,
        mode: Mode,
    ) -> Result<LocalTicket> {
        if matches!(kind, LockKind::Read | LockKind::Write) {
            return Ok(LocalTicket {
                client: self.inner.clone(),
                name: name.clone(),
                permit: None,
            });
        }
        let queue = {
            let mut map = self.inner.local.lock().expect("local queue map poisoned");
            map.entry(name.clone())
                .or_insert_with(|| Arc::new(Semaphore::new(1)))
                .clone()
        };
        let permit = match mode {
            Mode::Try => queue.try_acquire_owned().map_err(|_| would_block(name))?,
            Mode::Wait => queue.acquire_owned().await.expect("never closed"),
            Mode::Until(d) => tokio::time::timeout_at(d, queue.acquire_owned())
                .await
                .map_err(|_| timed_out(name))?
                .expect("never closed"),
        };
        Ok(LocalTicket {
            client: self.inner.clone(),
            name: name.clone(),
            permit: Some(permit),
        })
    }

    pub(crate) async fn acquire(
        &self,
        name: &LockName,
        kind: LockKind,
        mode: Mode,
    ) -> Result<LockGuard> {
        let start = Instant::now();
        let r = match (self.acquire_once(name, kind, mode).await, mode) {
            (Err(e), Mode::Until(d)) if e.kind() == ErrorKind::Timeout => {
                let backend = self.inner.backend.as_ref();
                Err(name_holders(backend, name, e, d.max(Instant::now()) + ABANDON_GRACE).await)
            }
            (r, _) => r,
        };
        let outcome = r.as_ref().map(|_| ()).map_err(Error::kind);
        telemetry::acquire_ended(kind, outcome, start.elapsed());
        r
    }

    async fn acquire_once(&self, name: &LockName, kind: LockKind, mode: Mode) -> Result<LockGuard> {
        let span = tracing::debug_span!("acquire", lock = %name, ?kind, ?mode);
        async move {
            let deadline = match mode {
                Mode::Until(d) => Some(d),
                _ => None,
            };
            let mut ticket = self.local_ticket(name, kind, mode).await?;
            let mut backoff = Backoff::default();
            let mut unreachable = Unreachable::new(&self.inner.options);
            let store = || self.inner.backend.describe();
            // Which limit ended a wait: the caller's deadline or ours.
            let gave_up = |u: &Unreachable| {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    timed_out(name)
                } else {
                    u.error(name, &store())
                }
            };
            let mut current: Option<Arc<SessionSlot>> = None;
            loop {
                let started = Instant::now();
                let session = match until(earliest(deadline, unreachable.open_by()), self.session()).await {
                    None => {
                        let e = Error::new(ErrorKind::Connection, "no answer while opening a session");
                        unreachable.failed(&store(), &e, started);
                        return Err(gave_up(&unreachable));
                    }
                    Some(Ok(s)) => s,
                    // The store is unreachable for now: a waiting acquire
                    // keeps trying, until its deadline or until the store
                    // has been unreachable for `unavailable_after`.
                    Some(Err(e)) if e.is_retryable() && mode != Mode::Try => {
                        unreachable.failed(&store(), &e, started);
                        let until_at = earliest(deadline, unreachable.give_up_at());
                        if until(until_at, backoff.wait()).await.is_none() {
                            return Err(gave_up(&unreachable));
                        }
                        continue;
                    }
                    Some(Err(e)) => return Err(e),
                };
                if !current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &session)) {
                    unreachable.recovered();
                    current = Some(session.clone());
                }
                let req = AcquireRequest::new(name.clone(), kind, mode != Mode::Try);
                let pending = PendingAcquire {
                    client: self.inner.clone(),
                    session: session.clone(),
                    req: Some(req.clone()),
                    ticket: Some(ticket),
                };
                let attempt = async {
                    tokio::select! {
                        r = session.store.acquire(&req) => r,
                        reason = session.liveness.lost() => Err(Error::new(
                            ErrorKind::SessionLost,
                            format!("session lost while acquiring: {reason}"),
                        )),
                    }
                };
                let outcome = until(deadline, attempt).await;
                if let Some(r) = &outcome {
                    telemetry::store_call("acquire", r.as_ref().err().map(Error::kind));
                }
                match outcome {
                    Some(Ok(acquired)) if session.liveness.is_alive() => {
                        let ticket = pending.disarm();
                        tracing::debug!(token = acquired.token, entry = %acquired.entry, "acquired");
                        return Ok(LockGuard {
                            held: Some(Held {
                                client: self.inner.clone(),
                                session,
                                req,
                                acquired,
                                ticket,
                                since: Instant::now(),
                            }),
                            depth: 1,
                        });
                    }
                    Some(Ok(_)) => {
                        // Granted, but the session died meanwhile: never
                        // grant on a session that may have expired.
                        let Some(t) = pending.abandon(deadline).await else {
                            return Err(timed_out(name));
                        };
                        ticket = t;
                        if mode == Mode::Try {
                            return Err(Error::new(ErrorKind::SessionLost, "session lost while acquiring"));
                        }
                    }
                    Some(Err(e)) if e.kind() == ErrorKind::WouldBlock => {
                        // The backend removed its entry already.
                        drop(pending.disarm());
                        return Err(e);
                    }
                    Some(Err(e)) if e.is_retryable() && mode != Mode::Try => {
                        if e.kind() == ErrorKind::Connection {
                            unreachable.failed(&store(), &e, Instant::now());
                        } else {
                            tracing::debug!(error = %e, "acquire attempt failed, retrying");
                        }
                        let Some(t) = pending.abandon(deadline).await else {
                            return Err(timed_out(name));
                        };
                        ticket = t;
                        let until_at = earliest(deadline, unreachable.give_up_at());
                        if until(until_at, backoff.wait()).await.is_none() {
                            return Err(gave_up(&unreachable));
                        }
                    }
                    Some(Err(e)) => {
                        // A final error (conflict, credentials, ...): leave
                        // the store clean before saying so.
                        // Bounded also without a deadline (a try, or a
                        // conflict on a waiting acquire): the rest goes on
                        // in the background.
                        let now = Instant::now();
                        let bound = deadline.map_or(now, |d| d.max(now)) + ABANDON_GRACE;
                        pending.abandon(Some(bound)).await;
                        return Err(e);
                    }
                    None => {
                        pending.abandon(Some(Instant::now() + ABANDON_GRACE)).await;
                        return Err(timed_out(name));
                    }
                }
            }
        }
        .instrument(span)
        .await
    }
}

fn spawn_cleanup(inner: &Arc<ClientInner>, job: impl Future<Output = ()> + Send + 'static) {
    inner.cleanup.pending.fetch_add(1, Ordering::AcqRel);
    let inner2 = inner.clone();
    inner.runtime.spawn(async move {
        job.await;
        if inner2.cleanup.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            inner2.cleanup.idle.notify_waiters();
        }
    });
}

fn would_block(name: &LockName) -> Error {
    Error::new(ErrorKind::WouldBlock, format!("lock {name} is held"))
}

fn timed_out(name: &LockName) -> Error {
    Error::new(
        ErrorKind::Timeout,
        format!("lock {name} was not acquired in time"),
    )
}

/// The earlier of two optional instants.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Runs `f` until `deadline`; `None` if the deadline came first.
async fn until<F: Future>(deadline: Option<Instant>, f: F) -> Option<F::Output> {
    match deadline {
        None => Some(f.await),
        Some(d) => tokio::time::timeout_at(d, f).await.ok(),
    }
}

/// Removes a store entry, retrying transient failures until it is gone or
/// the session is dead (then the store removes it with the session).
///
/// Each attempt races the session's loss: a request stuck on a dead link
/// (the store's client library may queue it until it gives up) ends when
/// the session's local deadline passes, so a removal never outlives the
/// session it belongs to.
async fn remove_entry(session: &SessionSlot, req: &AcquireRequest, held: Option<&Acquired>) {
    let mut backoff = Backoff::default();
    loop {
        if !session.liveness.is_alive() {
            return;
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
            r = attempt => r,
            _ = session.liveness.lost() => return,
        };
        let op = if held.is_some() { "release" } else { "abandon" };
        telemetry::store_call(op, r.as_ref().err().map(Error::kind));
        match r {
            Ok(()) => return,
            Err(e) if e.is_retryable() => {
                tracing::debug!(error = %e, lock = %req.name, "removing entry failed, retrying");
                tokio::select! {
                    () = backoff.wait() => {}
                    _ = session.liveness.lost() => return,
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, lock = %req.name, "removing entry failed");
                return;
            }
        }
    }
}

/// How long a timed-out or failed acquire waits for the store to confirm
/// that its entry is gone before returning; past it the removal goes on in
/// the background ([`LockClient::wait_idle`] waits for it).
const ABANDON_GRACE: Duration = Duration::from_millis(100);

/// How long an acquire may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Try,
    Wait,
    Until(Instant),
}

/// Exponential backoff from 50 ms to 2 s, with jitter (so that clients
/// that lost the store together do not retry in step), without end.
struct Backoff(backon::ExponentialBackoff);

const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

impl Default for Backoff {
    fn default() -> Self {
        use backon::BackoffBuilder;
        Backoff(
            backon::ExponentialBuilder::default()
                .with_min_delay(BACKOFF_MIN)
                .with_max_delay(BACKOFF_MAX)
                .with_jitter()
                .without_max_times()
                .build(),
        )
    }
}

impl Backoff {
    async fn wait(&mut self) {
        tokio::time::sleep(self.0.next().unwrap_or(BACKOFF_MAX)).await;
    }
}

/// The local queue slot of one owner; dropping it lets the next local
/// owner contend, and forgets the queue once nobody uses it.
struct LocalTicket {
    client: Arc<ClientInner>,
    name: LockName,
    permit: Option<OwnedSemaphorePermit>,
}

impl Drop for LocalTicket {
    fn drop(&mut self) {
        if self.permit.take().is_none() {
            return;
        }
        let mut map = self.client.local.lock().expect("local queue map poisoned");
        if map
            .get(&self.name)
            .is_some_and(|q| Arc::strong_count(q) == 1)
        {
            map.remove(&self.name);
        }
    }
}

/// An acquire attempt in flight. Dropped before it is disarmed (the
/// acquire future was cancelled, or failed), it abandons the attempt in the
/// background and frees the local slot only afterwards.
struct PendingAcquire {
    client: Arc<ClientInner>,
    session: Arc<SessionSlot>,
    req: Option<AcquireRequest>,
    ticket: Option<LocalTicket>,
}

impl PendingAcquire {
    fn disarm(mut self) -> LocalTicket {
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
    async fn abandon(mut self, bound: Option<Instant>) -> Option<LocalTicket> {
        let done = self.spawn_abandon()?;
        until(bound, done).await.and_then(|r| r.ok())
    }

    /// Starts the background removal; the receiver gets the local ticket
    /// once our entry is gone. `None` if there was nothing to abandon.
    fn spawn_abandon(&mut self) -> Option<oneshot::Receiver<LocalTicket>> {
        let req = self.req.take()?;
        let ticket = self.ticket.take();
        let session = self.session.clone();
        let (tx, rx) = oneshot::channel();
        spawn_cleanup(&self.client, async move {
            req.signals.finish();
            remove_entry(&session, &req, None).await;
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

/// A named lock on a client: acquire it, try it, or wait with a timeout.
#[derive(Clone, Debug)]
pub struct Lock {
    client: LockClient,
    name: LockName,
}

impl Lock {
    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// Waits until the lock is held. Waiters are served in arrival order.
    ///
    /// # Cancel safety
    /// Dropping the future at any await point leaves nothing on the store
    /// once the background cleanup has run ([`LockClient::wait_idle`]).
    pub async fn acquire(&self) -> Result<LockGuard> {
        self.client
            .acquire(&self.name, LockKind::Exclusive, Mode::Wait)
            .await
    }

    /// Takes the lock only if it is free now; else
    /// [`ErrorKind::WouldBlock`].
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<LockGuard> {
        self.client
            .acquire(&self.name, LockKind::Exclusive, Mode::Try)
            .await
    }

    /// Waits at most `timeout`; then [`ErrorKind::Timeout`]. Returns
    /// within `timeout` + 100 ms whatever the link does: our waiting entry
    /// is removed by then, or, if the store does not confirm it in time,
    /// its removal goes on in the background ([`LockClient::wait_idle`])
    /// and the next owner of this client waits for it.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        let deadline = Instant::now() + timeout;
        self.client
            .acquire(&self.name, LockKind::Exclusive, Mode::Until(deadline))
            .await
    }

    /// Holders and waiters of this lock.
    ///
    /// # Cancel safety
    /// Read-only; safe to drop.
    pub async fn inspect(&self) -> Result<LockState> {
        self.client.inner.backend.inspect(&self.name).await
    }
}

/// Proof that a lock is held, with its fencing token.
///
/// Dropping the guard queues the release in the background (the next
/// local owner waits until the store entry is gone);
/// [`release`](Self::release) does it now and confirms.
///
/// # Reentrancy
/// Ownership is the guard itself: [`reenter`](Self::reenter) borrows the
/// guard mutably and returns a nested hold with the same token (count + 1).
/// Calling `lock.acquire()` again is always a *new* owner and waits. We
/// chose this over thread- or task-scoped owners because async code moves
/// tasks between threads and runs many futures in one task (`join!`,
/// `select!`): a task id would silently let two concurrent futures share a
/// lock. A `&mut` borrow makes such sharing a compile error.
pub struct LockGuard {
    held: Option<Held>,
    depth: usize,
}

struct Held {
    client: Arc<ClientInner>,
    session: Arc<SessionSlot>,
    req: AcquireRequest,
    acquired: Acquired,
    ticket: LocalTicket,
    /// When the grant was handed out, for the hold-time metric.
    since: Instant,
}

impl Held {
    /// Why the lock was lost, if it was: the entry's or the session's.
    fn loss(&self) -> Option<LossReason> {
        self.req
            .signals
            .loss()
            .or_else(|| self.session.liveness.loss())
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self.held();
        f.debug_struct("LockGuard")
            .field("name", &held.req.name)
            .field("token", &held.acquired.token)
            .field("held", &self.is_held())
            .field("depth", &self.depth)
            .finish()
    }
}

impl LockGuard {
    fn held(&self) -> &Held {
        self.held.as_ref().expect("guard used after release")
    }

    /// The store and our entry, for a fenced write.
    pub(crate) fn fence(&self) -> (Arc<dyn Backend>, crate::backend::HeldEntry) {
        let h = self.held();
        let entry = crate::backend::HeldEntry {
            name: h.req.name.clone(),
            kind: h.req.kind,
            entry: h.acquired.entry.clone(),
            token: h.acquired.token,
            session: h.session.store.id(),
        };
        (h.client.backend.clone(), entry)
    }

    /// The fencing token: pass it to the resource you protect and let it
    /// reject writes carrying a lower token than it has seen.
    pub fn token(&self) -> u64 {
        self.held().acquired.token
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.held().req.name
    }

    /// The store's name of our entry (node path or key).
    pub fn entry(&self) -> &str {
        &self.held().acquired.entry
    }

    /// The store session that holds the lock.
    pub fn session_id(&self) -> String {
        self.held().session.store.id()
    }

    /// Whether the lock can still be assumed held: no loss reported and
    /// the session's local deadline not passed. No I/O.
    pub fn is_held(&self) -> bool {
        let h = self.held();
        h.session.liveness.is_alive() && h.req.signals.loss().is_none()
    }

    /// The local deadline: the lock is assumed lost at this instant unless
    /// a keepalive confirms the session before it (`None`: never confirmed).
    pub fn deadline(&self) -> Option<Instant> {
        self.held().session.liveness.deadline()
    }

    /// Why the lock was lost, if it was.
    pub fn loss(&self) -> Option<LossReason> {
        let h = self.held();
        h.loss()
    }

    /// A future that resolves when the lock can no longer be assumed held
    /// (session expired, local deadline passed, entry deleted, client
    /// closed). It fires before another client can acquire the lock, given
    /// clocks that run at the same rate. Independent of the guard's
    /// lifetime, so it can be moved into a `select!` or another task.
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        let h = self.held();
        let liveness = h.session.liveness.clone();
        let signals = h.req.signals.clone();
        async move {
            tokio::select! {
                r = liveness.lost() => r,
                r = signals.lost() => r,
            }
        }
    }

    /// Whether someone asked us to let go ([`LockClient::request_revoke`]).
    pub fn is_revoke_requested(&self) -> bool {
        self.held().req.signals.is_revoke_requested()
    }

    /// Resolves when someone asks us to let go. The lock stays held until
    /// we release it.
    pub fn revoke_requested(&self) -> impl Future<Output = ()> + Send + 'static {
        let signals = self.held().req.signals.clone();
        async move { signals.revoke_requested().await }
    }

    /// Re-enters the lock as the same owner: the nested hold has the same
    /// token and ends when dropped; the store entry stays until this guard
    /// is released.
    pub fn reenter(&mut self) -> Reentry<'_> {
        self.depth += 1;
        Reentry { guard: self }
    }

    /// Re-enters for reading: always allowed (a writer may read; that is
    /// how a write holder downgrades).
    pub fn reenter_read(&mut self) -> Reentry<'_> {
        self.reenter()
    }

    /// Re-enters for writing. A read holder is refused with
    /// [`ErrorKind::UpgradeRefused`] instead of deadlocking: two readers
    /// upgrading would wait for each other forever.
    pub fn reenter_write(&mut self) -> Result<Reentry<'_>> {
        if self.kind() == LockKind::Read {
            return Err(Error::new(
                ErrorKind::UpgradeRefused,
                format!(
                    "{} is held for reading; release it and acquire for writing",
                    self.name()
                ),
            ));
        }
        Ok(self.reenter())
    }

    /// What is held: a mutex, the read or write side of a read-write lock,
    /// or a semaphore permit.
    pub fn kind(&self) -> LockKind {
        self.held().req.kind
    }

    /// How many holds this owner has (1 + live reentries).
    pub fn hold_count(&self) -> usize {
        self.depth
    }

    /// Releases the lock now and confirms that our entry is gone (or that
    /// the session that held it is dead, which removes it). On a dead link
    /// it returns by the session's local deadline, within the TTL.
    ///
    /// Returns [`ErrorKind::LockLost`] if the lock had been lost before the
    /// release: the work done under it was not protected.
    ///
    /// # Cancel safety
    /// If dropped, the release continues in the background.
    pub async fn release(mut self) -> Result<()> {
        let held = self.held.take().expect("guard used after release");
        let lost = held.loss();
        telemetry::hold_ended(held.req.kind, held.since.elapsed(), lost);
        // Watchers stop first: our own delete is not a loss.
        held.req.signals.finish();
        let finish = ReleaseOnDrop(Some(held));
        let h = finish.0.as_ref().expect("set above");
        remove_entry(&h.session, &h.req, Some(&h.acquired))
            .instrument(
                tracing::debug_span!("release", lock = %h.req.name, token = h.acquired.token),
            )
            .await;
        let held = finish.defuse();
        drop(held.ticket);
        match lost {
            None => Ok(()),
            Some(reason) => Err(Error::new(
                ErrorKind::LockLost,
                format!("lock {} was lost before release: {reason}", held.req.name),
            )),
        }
    }
}

/// Finishes a release in the background if `release()` is dropped midway.
struct ReleaseOnDrop(Option<Held>);

impl ReleaseOnDrop {
    fn defuse(mut self) -> Held {
        self.0.take().expect("defused once")
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if let Some(held) = self.0.take() {
            queue_release(held);
        }
    }
}

fn queue_release(held: Held) {
    telemetry::hold_ended(held.req.kind, held.since.elapsed(), held.loss());
    let client = held.client.clone();
    held.req.signals.finish();
    spawn_cleanup(&client, async move {
        remove_entry(&held.session, &held.req, Some(&held.acquired))
            .instrument(
                tracing::debug_span!("release", lock = %held.req.name, token = held.acquired.token),
            )
            .await;
        drop(held.ticket);
    });
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            queue_release(held);
        }
    }
}

/// A nested hold of a lock by its owner; see [`LockGuard::reenter`].
/// Derefs to the guard for the token, loss and revoke signals.
pub struct Reentry<'a> {
    guard: &'a mut LockGuard,
}

impl std::ops::Deref for Reentry<'_> {
    type Target = LockGuard;
    fn deref(&self) -> &LockGuard {
        self.guard
    }
}

impl std::ops::DerefMut for Reentry<'_> {
    fn deref_mut(&mut self) -> &mut LockGuard {
        self.guard
    }
}

impl Drop for Reentry<'_> {
    fn drop(&mut self) {
        self.guard.depth -= 1;
    }
}

impl fmt::Debug for Reentry<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Reentry").field(&*self.guard).finish()
    }
}
