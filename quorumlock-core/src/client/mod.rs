//! The client layer: everything about locking that is the same on every
//! store. Backends only speak their protocol (see [`crate::backend`]).
//! `mod.rs`: the client and its acquire; `guard.rs`: holds; `shared.rs`:
//! what both use.

mod guard;
mod shared;

pub use guard::{LockGuard, Reentry, Upgraded};
pub(crate) use shared::Mode;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::Instrument;

use crate::availability::{name_holders, ClientOptions};
use crate::backend::{AcquireRequest, Backend};
use crate::signal::{LossReason, SessionLiveness};
use crate::telemetry;
use crate::{Error, ErrorKind, LockName, Result};
use crate::{LockKind, LockState};

pub(crate) use shared::abandon_bound;
use shared::*;

/// A handle to one store, cheap to clone; all clones share one session.
///
/// The session is opened on the first acquire, kept alive by the backend's
/// one background task, and replaced transparently by the next acquire
/// after it is lost. Every guard of a lost session reports the loss.
///
/// Within one client, each lock name has a local FIFO queue: at most one
/// owner of this client contends for a mutex on the store at a time (at
/// most `N` for a semaphore of `N` permits), and the next local owner
/// enters the store only after a previous one's entry is gone. Different
/// owners in one process therefore exclude each other exactly as
/// different processes do.
#[derive(Clone)]
pub struct LockClient {
    inner: Arc<ClientInner>,
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
            value: None,
            hold_limit: None,
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
    /// different count is [`ErrorKind::Conflict`] at acquire. Several
    /// owners of one client hold several permits at once (up to
    /// `permits`; further owners queue locally).
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
        let mut out = self.inner.backend.list(prefix.as_ref()).await?;
        // Stores list in key order; an escaped name's key sorts apart
        // from its name.
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
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

    /// A place in the local FIFO queue of `name`, for the kinds whose
    /// store contenders per client are bounded: a mutex has one (etcd's
    /// and Consul's native layouts key it by session), a semaphore of `N`
    /// permits at most `N` (each its own store entry, so `N` owners of one
    /// client can hold at once; more would only wait on the store).
    /// Readers and writers of a read-write lock have one entry each and are
    /// ordered by the store alone, so none of them can overtake a waiter
    /// of another client.
    async fn local_ticket(
        &self,
        name: &LockName,
        kind: LockKind,
        mode: Mode,
        count: u32,
    ) -> Result<LocalTicket> {
        if matches!(
            kind,
            LockKind::Read | LockKind::Write | LockKind::Upgradeable | LockKind::Upgrade
        ) {
            return Ok(LocalTicket {
                client: self.inner.clone(),
                key: (name.clone(), 0),
                permit: None,
            });
        }
        let (permits, slots) = match kind {
            LockKind::Semaphore { permits } => (permits, permits as usize),
            _ => (0, 1),
        };
        let key = (name.clone(), permits);
        let queue = {
            let mut map = self.inner.local.lock().expect("local queue map poisoned");
            map.entry(key.clone())
                .or_insert_with(|| Arc::new(Semaphore::new(slots)))
                .clone()
        };
        let permit = match mode {
            Mode::Try => queue
                .try_acquire_many_owned(count)
                .map_err(|_| would_block(name))?,
            Mode::Wait => queue.acquire_many_owned(count).await.expect("never closed"),
            Mode::Until(d) => tokio::time::timeout_at(d, queue.acquire_many_owned(count))
                .await
                .map_err(|_| timed_out(name))?
                .expect("never closed"),
        };
        Ok(LocalTicket {
            client: self.inner.clone(),
            key,
            permit: Some(permit),
        })
    }

    pub(crate) async fn acquire(
        &self,
        name: &LockName,
        kind: LockKind,
        mode: Mode,
        value: Option<&[u8]>,
    ) -> Result<LockGuard> {
        self.acquire_limited(name, kind, mode, value, None, 1).await
    }

    /// [`acquire`](Self::acquire) of a hold that ends after `hold_limit`
    /// ([`Lock::hold_at_most`]), of `count` permits of a semaphore
    /// ([`crate::Semaphore::acquire_many`]; 1 for every other kind).
    pub(crate) async fn acquire_limited(
        &self,
        name: &LockName,
        kind: LockKind,
        mode: Mode,
        value: Option<&[u8]>,
        hold_limit: Option<Duration>,
        count: u32,
    ) -> Result<LockGuard> {
        if count != 1 {
            self.check_count(name, kind, count)?;
        }
        if let Some(limit) = hold_limit {
            let fits = limit
                .checked_mul(2)
                .and_then(|l| Instant::now().checked_add(l))
                .is_some();
            if limit.is_zero() || !fits {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("hold limit {limit:?} of {name}: zero, or too long for the clock"),
                ));
            }
        }
        let start = Instant::now();
        let value = value.unwrap_or(&self.inner.options.value);
        let r = match (
            self.acquire_once(name, kind, mode, value, count, None)
                .await
                .map(|g| g.limited(hold_limit)),
            mode,
        ) {
            // Only within the grace the contract allows past the deadline
            // (the abandon may have used it up: then the plain timeout).
            (Err(e), Mode::Until(d)) if e.kind() == ErrorKind::Timeout => {
                let backend = self.inner.backend.as_ref();
                Err(name_holders(backend, name, e, d + ABANDON_GRACE).await)
            }
            (r, _) => r,
        };
        let outcome = r.as_ref().map(|_| ()).map_err(Error::kind);
        telemetry::acquire_ended(kind, outcome, start.elapsed());
        r
    }

    /// The session for the next attempt of an acquire, opened if need be.
    /// `Ok(None)`: it could not be opened yet and the backoff was waited;
    /// try again. Gives up at the caller's deadline (`Timeout`), or once
    /// the store has been unreachable for `unavailable_after`
    /// (`Unavailable`).
    async fn session_for_attempt(
        &self,
        mode: Mode,
        deadline: Option<Instant>,
        retry: &mut Retry,
    ) -> Result<Option<Arc<SessionSlot>>> {
        let started = Instant::now();
        let open_by = earliest(deadline, retry.unreachable.open_by());
        let session = match until(open_by, self.session()).await {
            None => {
                let e = Error::new(ErrorKind::Connection, "no answer while opening a session");
                retry.failed(&e, started);
                return Err(retry.gave_up(deadline));
            }
            Some(Ok(s)) => s,
            // The store is unreachable for now: a waiting acquire keeps
            // trying, until its deadline or until the store has been
            // unreachable for `unavailable_after`.
            Some(Err(e)) if e.is_retryable() && mode != Mode::Try => {
                retry.failed(&e, started);
                if !retry.back_off(deadline).await {
                    return Err(retry.gave_up(deadline));
                }
                return Ok(None);
            }
            Some(Err(e)) => return Err(e),
        };
        retry.opened(&session);
        Ok(Some(session))
    }

    /// The write entry of an upgrade ([`LockGuard::upgrade`]), on the
    /// session of the upgradeable hold, linked to it.
    async fn upgrade(
        &self,
        name: &LockName,
        mode: Mode,
        value: &[u8],
        upgrading: &Upgrading,
    ) -> Result<LockGuard> {
        let start = Instant::now();
        let r = self
            .acquire_once(name, LockKind::Upgrade, mode, value, 1, Some(upgrading))
            .await;
        let outcome = r.as_ref().map(|_| ()).map_err(Error::kind);
        telemetry::acquire_ended(LockKind::Upgrade, outcome, start.elapsed());
        r
    }

    /// Why `count` permits of `kind` cannot be asked for at once, if so.
    fn check_count(&self, name: &LockName, kind: LockKind, count: u32) -> Result<()> {
        let refuse = |why: String| Err(Error::new(ErrorKind::InvalidArgument, why));
        let LockKind::Semaphore { permits } = kind else {
            return refuse(format!("{name}: only a semaphore takes several permits"));
        };
        if count == 0 || count > permits {
            return refuse(format!(
                "{name}: {count} permits at once of a semaphore of {permits} can never be granted"
            ));
        }
        if !self.inner.backend.capabilities().acquire_many {
            return refuse(format!(
                "{name}: the store {} does not take several permits at once",
                self.inner.backend.describe()
            ));
        }
        Ok(())
    }

    async fn acquire_once(
        &self,
        name: &LockName,
        kind: LockKind,
        mode: Mode,
        value: &[u8],
        count: u32,
        upgrading: Option<&Upgrading>,
    ) -> Result<LockGuard> {
        let span = tracing::debug_span!("acquire", lock = %name, ?kind, ?mode);
        async move {
            let deadline = match mode {
                Mode::Until(d) => Some(d),
                _ => None,
            };
            let mut ticket = self.local_ticket(name, kind, mode, count).await?;
            let mut retry = Retry::new(name, &self.inner.options, self.inner.backend.clone());
            loop {
                let session = match upgrading {
                    // An upgrade's entry goes on its holder's session, or
                    // nowhere.
                    Some(u) if u.session.liveness.is_alive() && u.parent.loss().is_none() => {
                        u.session.clone()
                    }
                    Some(_) => return Err(upgrade_lost(name)),
                    None => match self.session_for_attempt(mode, deadline, &mut retry).await? {
                        Some(s) => s,
                        None => continue,
                    },
                };
                let mut req = AcquireRequest::new(name.clone(), kind, mode != Mode::Try)
                    .with_value(value)
                    .with_count(count);
                req.upgrades = upgrading.map(|u| u.of);
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
                        _ = parent_lost(upgrading) => Err(upgrade_lost(name)),
                    }
                };
                let outcome = until(deadline, attempt).await;
                if let Some(r) = &outcome {
                    telemetry::store_call("acquire", r.as_ref().err().map(Error::kind));
                }
                // A grant whose answer reached us after the deadline
                // (the store granted in time, the answer came late) is
                // given back: a guard is never handed out past its
                // deadline.
                let late = deadline.is_some_and(|d| Instant::now() > d);
                match outcome {
                    Some(Ok(_)) if late => {
                        tracing::debug!("granted after the deadline; giving it back");
                        pending.abandon(Some(abandon_bound(deadline))).await;
                        return Err(timed_out(name));
                    }
                    Some(Ok(_)) if upgrading.is_some_and(|u| u.parent.loss().is_some()) => {
                        pending.abandon(Some(abandon_bound(deadline))).await;
                        return Err(upgrade_lost(name));
                    }
                    Some(Ok(acquired)) if session.liveness.is_alive() => {
                        let ticket = pending.disarm();
                        tracing::debug!(token = acquired.token, entry = %acquired.entry, "acquired");
                        return Ok(LockGuard::granted(
                            self.inner.clone(),
                            session,
                            req,
                            acquired,
                            ticket,
                        ));
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
                            retry.failed(&e, Instant::now());
                        } else {
                            tracing::debug!(error = %e, "acquire attempt failed, retrying");
                        }
                        let Some(t) = pending.abandon(deadline).await else {
                            return Err(timed_out(name));
                        };
                        ticket = t;
                        if !retry.back_off(deadline).await {
                            return Err(retry.gave_up(deadline));
                        }
                    }
                    Some(Err(e)) => {
                        // A final error (conflict, credentials, ...): leave
                        // the store clean before saying so.
                        // Bounded also without a deadline (a try, or a
                        // conflict on a waiting acquire): the rest goes on
                        // in the background.
                        pending.abandon(Some(abandon_bound(deadline))).await;
                        return Err(e);
                    }
                    None => {
                        pending.abandon(Some(abandon_bound(deadline))).await;
                        return Err(timed_out(name));
                    }
                }
            }
        }
        .instrument(span)
        .await
    }
}

/// A named lock on a client: acquire it, try it, or wait with a timeout.
#[derive(Clone, Debug)]
pub struct Lock {
    client: LockClient,
    name: LockName,
    value: Option<Vec<u8>>,
    hold_limit: Option<Duration>,
}

impl Lock {
    /// This handle's entries carry `value` (who holds, for `inspect` and
    /// `status`) instead of the client's [`ClientOptions::value`].
    pub fn with_value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.value = Some(value.into());
        self
    }

    /// Every hold taken through this handle ends after `limit` at the
    /// latest, counted from its grant: a holder that hangs (a deadlocked
    /// task, a lost callback) while its process keeps the session alive
    /// cannot keep the lock for ever (Redisson's `leaseTime`, ShedLock's
    /// `lockAtMostFor`).
    ///
    /// At the limit the guard reports the loss first
    /// ([`LossReason::HoldLimitReached`](crate::LossReason::HoldLimitReached)
    /// from [`LockGuard::lost`], `is_held()` false, fenced writes refused),
    /// and then removes its entry; the next holder's token is larger. The
    /// limit is kept by this library, not by the store's clock (etcd and
    /// ZooKeeper have none an entry could use): the store frees the lock
    /// one removal after the limit, or, if the store refuses the removal
    /// or cannot be reached, when the session's TTL runs out (the session
    /// is then ended, as for any release the store refuses). A process
    /// that stops altogether stops its keepalives too, so the store frees
    /// the lock within the TTL then as well. A limit of zero, or one too
    /// long for the clock, is [`ErrorKind::InvalidArgument`] at acquire,
    /// nothing written.
    pub fn hold_at_most(mut self, limit: Duration) -> Self {
        self.hold_limit = Some(limit);
        self
    }

    /// The value this handle's entries carry.
    pub fn value(&self) -> &[u8] {
        self.value
            .as_deref()
            .unwrap_or(&self.client.inner.options.value)
    }

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
            .acquire_limited(
                &self.name,
                LockKind::Exclusive,
                Mode::Wait,
                self.value.as_deref(),
                self.hold_limit,
                1,
            )
            .await
    }

    /// Takes the lock only if it is free now; else
    /// [`ErrorKind::WouldBlock`].
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<LockGuard> {
        self.client
            .acquire_limited(
                &self.name,
                LockKind::Exclusive,
                Mode::Try,
                self.value.as_deref(),
                self.hold_limit,
                1,
            )
            .await
    }

    /// Waits at most `timeout`; then [`ErrorKind::Timeout`]. Returns
    /// within `timeout` + 100 ms whatever the link does: our waiting entry
    /// is removed by then, or, if the store does not confirm it in time,
    /// its removal goes on in the background ([`LockClient::wait_idle`])
    /// and the next owner of this client waits for it.
    ///
    /// A grant whose answer arrives after the deadline (the store granted
    /// in time, the answer came late) is given back like a waiting entry
    /// and the call returns `Timeout`: a guard is never handed out past its
    /// deadline. (A timeout too long to add to the clock waits without
    /// end.)
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        self.client
            .acquire_limited(
                &self.name,
                LockKind::Exclusive,
                Mode::within(timeout),
                self.value.as_deref(),
                self.hold_limit,
                1,
            )
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
