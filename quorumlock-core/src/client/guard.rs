//! The proof of a hold: [`LockGuard`], its release, and nested holds.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{AcquireRequest, Acquired, Backend};
use crate::signal::{LossReason, SessionLiveness};
use crate::telemetry;
use crate::LockKind;
use crate::{Error, ErrorKind, LockName, Result};

use super::shared::*;

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
#[must_use = "the lock is released when the guard is dropped: keep it (let _guard = ...) while you need the lock"]
pub struct LockGuard {
    held: Option<Held>,
    depth: usize,
}

impl LockGuard {
    /// The guard of a grant the store just confirmed.
    pub(super) fn granted(
        client: Arc<ClientInner>,
        session: Arc<SessionSlot>,
        req: AcquireRequest,
        acquired: Acquired,
        ticket: LocalTicket,
    ) -> Self {
        LockGuard {
            held: Some(Held {
                client,
                session,
                token: acquired.token,
                req,
                acquired,
                ticket: Arc::new(std::sync::Mutex::new(Some(ticket))),
                since: Instant::now(),
                hold_until: None,
                removal: Default::default(),
                read_hold: None,
            }),
            depth: 1,
        }
    }

    /// This guard, ending its hold `limit` after its grant
    /// ([`crate::Lock::hold_at_most`]): a task reports the loss at the
    /// limit and then removes the entry, unless the guard was let go or
    /// lost first.
    pub(super) fn limited(self, limit: Option<std::time::Duration>) -> Self {
        let Some(limit) = limit else {
            return self;
        };
        let at = self.held().since + limit;
        self.limited_until(at)
    }

    /// This guard, ending its hold at `at` (as [`Self::limited`]).
    fn limited_until(mut self, at: Instant) -> Self {
        let h = self.held.as_mut().expect("a fresh guard");
        h.hold_until = Some(at);
        let h = self.held();
        let client = h.client.clone();
        let session = h.session.clone();
        let req = h.req.clone();
        let acquired = h.acquired.clone();
        let removal = h.removal.clone();
        let ticket = h.ticket.clone();
        // As between a session's local deadline and its expiry: the time
        // a holder that stops on `lost()` has before the next one starts.
        let margin = SessionLiveness::margin(client.backend.capabilities().session_ttl);
        h.client.runtime.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep_until(at) => {}
                _ = req.signals.finished() => return,
                _ = session.liveness.lost() => return,
            }
            // An entry lost already is removed all the same (a no-op if
            // it is gone): an upgrade's loss may be its read hold's, its
            // own entry still there.
            if req.signals.is_finished() || !session.liveness.is_alive() {
                return;
            }
            // The loss first: from here on the guard says lost and its
            // fenced writes are refused; the entry goes a margin later.
            req.signals.lose(LossReason::HoldLimitReached);
            req.signals.finish();
            tracing::debug!(lock = %req.name, token = acquired.token, "hold limit reached; removing the entry");
            let lock = req.name.clone();
            spawn_cleanup(&client, &lock, async move {
                tokio::select! {
                    _ = tokio::time::sleep(margin) => {}
                    _ = session.liveness.lost() => {}
                }
                // An error was logged, and the session ended so that the
                // store drops the entry.
                let _ = remove_once(&session, &req, &acquired, &removal).await;
                drop(ticket.lock().expect("ticket poisoned").take());
            });
        });
        self
    }
}

/// The outcome of a removal: `None` when it was confirmed, else the
/// kind and text of its error.
type Removed = Option<(ErrorKind, String)>;

/// Removes a held entry unless that was done already (by the hold limit's
/// task, or a release): the one removal of both, whose outcome both get.
async fn remove_once(
    session: &SessionSlot,
    req: &AcquireRequest,
    acquired: &Acquired,
    removal: &tokio::sync::Mutex<Option<Removed>>,
) -> Result<()> {
    let mut done = removal.lock().await;
    if let Some(outcome) = done.as_ref() {
        return match outcome {
            None => Ok(()),
            Some((kind, message)) => Err(Error::new(*kind, message.clone())),
        };
    }
    let r = remove_entry(session, req, Some(acquired))
        .instrument(tracing::debug_span!("release", lock = %req.name, token = acquired.token))
        .await;
    // The second asker gets the kind and the whole text (sources
    // included); the first, the error itself.
    *done = Some(r.as_ref().err().map(|e| (e.kind(), e.to_string())));
    r
}

struct Held {
    client: Arc<ClientInner>,
    session: Arc<SessionSlot>,
    req: AcquireRequest,
    acquired: Acquired,
    /// The fencing token handed out: the entry's, or for an upgrade the
    /// upgradeable hold's (the upgrade stands at its place in the queue,
    /// so writers granted after it have larger tokens).
    token: u64,
    /// The local queue slot, freed once the entry is removed: by the
    /// release, or by the hold limit's task (a guard kept past its limit
    /// does not block the client's next owner).
    ticket: Arc<std::sync::Mutex<Option<LocalTicket>>>,
    /// When the grant was handed out, for the hold-time metric and the
    /// hold limit.
    since: Instant,
    /// The end of the hold's limit ([`crate::Lock::hold_at_most`]).
    hold_until: Option<Instant>,
    /// The removal of the entry (by a release or the hold limit), once
    /// done: its outcome, for whichever of both asks second.
    removal: Arc<tokio::sync::Mutex<Option<Removed>>>,
    /// For an upgrade's write hold, the entry of the read hold it stands
    /// on: its fenced writes check both.
    read_hold: Option<Box<crate::backend::HeldEntry>>,
}

impl Held {
    /// Why the lock was lost, if it was: the entry's or the session's, or
    /// the hold limit's (from its instant on, before its task has run).
    fn loss(&self) -> Option<LossReason> {
        self.req
            .signals
            .loss()
            .or_else(|| self.session.liveness.loss())
            .or_else(|| {
                self.hold_until
                    .filter(|t| Instant::now() >= *t)
                    .map(|_| LossReason::HoldLimitReached)
            })
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self.held();
        f.debug_struct("LockGuard")
            .field("name", &held.req.name)
            .field("token", &held.token)
            .field("held", &self.is_held())
            .field("depth", &self.depth)
            .finish()
    }
}

impl LockGuard {
    fn held(&self) -> &Held {
        self.held.as_ref().expect("guard used after release")
    }

    /// The store and our entry, for a fenced write; `LockLost` once the
    /// hold limit was reached (the entry may not be gone yet).
    pub(crate) fn fence(&self) -> Result<(Arc<dyn Backend>, Vec<crate::backend::HeldEntry>)> {
        let h = self.held();
        if h.hold_until.is_some_and(|t| Instant::now() >= t) {
            return Err(Error::new(
                ErrorKind::LockLost,
                format!("{}: {}", h.req.name, LossReason::HoldLimitReached),
            ));
        }
        Ok((h.client.backend.clone(), self.held_entries()))
    }

    /// The entries this hold stands on, as the store knows them (name,
    /// kind and the store's own token of each), for a backend's checks of
    /// its own (such as `quorumlock_postgres::check_held`): our entry, and
    /// for an upgrade's write hold also its read hold's (the write holds
    /// only while both are there). The token of our entry is
    /// [`token`](Self::token) except for an upgrade, whose `token()` is
    /// its upgradeable hold's.
    pub fn held_entries(&self) -> Vec<crate::backend::HeldEntry> {
        std::iter::once(self.own_entry())
            .chain(self.held().read_hold.as_deref().cloned())
            .collect()
    }

    /// Our own entry as the store knows it.
    fn own_entry(&self) -> crate::backend::HeldEntry {
        let h = self.held();
        crate::backend::HeldEntry {
            name: h.req.name.clone(),
            kind: h.req.kind,
            entry: h.acquired.entry.clone(),
            token: h.acquired.token,
            session: h.session.store.id(),
        }
    }

    /// Rewrites our entry's value, only while the entry is ours (an
    /// election leader's `proclaim`).
    pub(crate) async fn set_value(&mut self, value: Vec<u8>) -> Result<()> {
        let h = self.held.as_mut().expect("guard used after release");
        if let Some(reason) = h.loss() {
            return Err(Error::new(
                ErrorKind::LockLost,
                format!("{} was lost: {reason}", h.req.name),
            ));
        }
        h.session
            .store
            .set_value(&h.req, &h.acquired, &value)
            .await?;
        h.req.value = value;
        Ok(())
    }

    /// The fencing token: pass it to the resource you protect and let it
    /// reject writes carrying a lower token than it has seen.
    pub fn token(&self) -> u64 {
        self.held().token
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
        h.session.liveness.is_alive() && h.loss().is_none()
    }

    /// The local deadline: the lock is assumed lost at this instant unless
    /// a keepalive confirms the session before it (`None`: never confirmed).
    /// Once the session was declared lost earlier, the instant of that
    /// declaration. A hold with a limit ([`crate::Lock::hold_at_most`])
    /// ends at the limit's instant at the latest.
    pub fn deadline(&self) -> Option<Instant> {
        let h = self.held();
        match (h.session.liveness.deadline(), h.hold_until) {
            (Some(d), Some(t)) => Some(d.min(t)),
            (d, t) => d.or(t),
        }
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
        let hold_until = h.hold_until;
        async move {
            // A hold released before its limit is not lost at the limit.
            let limit = async {
                match hold_until {
                    Some(t) => {
                        tokio::time::sleep_until(t).await;
                        if signals.is_finished() && signals.loss().is_none() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = liveness.lost() => r,
                r = signals.lost() => r,
                () = limit => LossReason::HoldLimitReached,
            }
        }
    }

    /// Whether someone asked us to let go ([`crate::LockClient::request_revoke`]).
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
        if self.kind() == LockKind::Upgradeable {
            return Err(Error::new(
                ErrorKind::UpgradeRefused,
                format!(
                    "{} is held upgradeable for reading; upgrade() it to write",
                    self.name()
                ),
            ));
        }
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

    /// Upgrades an upgradeable read hold
    /// ([`RwLock::upgradeable_read`](crate::RwLock::upgradeable_read)) to
    /// a write hold, without giving up the read hold or its place: waits
    /// until the readers granted before the upgrade have gone; readers
    /// that ask after the upgrade, and writers that asked after the read
    /// hold, wait. The write hold has the read hold's token (its place:
    /// a writer granted after it has a larger one) and ends when the returned
    /// [`Upgraded`] is dropped or [`downgraded`](Upgraded::downgrade):
    /// this guard then holds for reading again. Only one upgradeable
    /// reader holds at a time, so two upgrades never wait for each other.
    ///
    /// [`ErrorKind::UpgradeRefused`] for any other hold, and while a
    /// reader waits behind a writer that waits for this hold (granted,
    /// the upgrade would let that reader in beside the write once the
    /// writer gave up; waited for, it would wait for ever:
    /// [`crate::queue::upgrade_refused`]); [`ErrorKind::LockLost`] if the
    /// read hold is lost before or while the upgrade waits. A hold limit
    /// of this guard also ends the write hold, at the same instant. The
    /// write hold's fenced writes check this hold's entry too.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the read hold as it was and nothing of
    /// the upgrade on the store once the background cleanup has run.
    pub async fn upgrade(&mut self) -> Result<Upgraded<'_>> {
        self.upgrade_in(Mode::Wait).await
    }

    /// Upgrades only if no other reader holds: else
    /// [`ErrorKind::WouldBlock`] (or `UpgradeRefused`, as
    /// [`upgrade`](Self::upgrade)), and the read hold stays as it was.
    ///
    /// # Cancel safety
    /// As [`upgrade`](Self::upgrade).
    pub async fn try_upgrade(&mut self) -> Result<Upgraded<'_>> {
        self.upgrade_in(Mode::Try).await
    }

    /// Upgrades, waiting at most `timeout`: else [`ErrorKind::Timeout`],
    /// and the read hold stays as it was.
    ///
    /// # Cancel safety
    /// As [`upgrade`](Self::upgrade).
    pub async fn upgrade_timeout(&mut self, timeout: std::time::Duration) -> Result<Upgraded<'_>> {
        self.upgrade_in(Mode::within(timeout)).await
    }

    async fn upgrade_in(&mut self, mode: Mode) -> Result<Upgraded<'_>> {
        let h = self.held();
        if h.req.kind != LockKind::Upgradeable {
            return Err(Error::new(
                ErrorKind::UpgradeRefused,
                format!(
                    "{} is held as {:?}; only an upgradeable read hold upgrades",
                    h.req.name, h.req.kind
                ),
            ));
        }
        if let Some(reason) = h.loss() {
            return Err(Error::new(
                ErrorKind::LockLost,
                format!("{} was lost: {reason}", h.req.name),
            ));
        }
        let upgrading = Upgrading {
            session: h.session.clone(),
            of: h.req.contender,
            parent: h.req.signals.clone(),
        };
        let client = super::LockClient {
            inner: h.client.clone(),
        };
        let write = client
            .upgrade(&h.req.name, mode, &h.req.value, &upgrading)
            .await?;
        let mut write = match h.hold_until {
            Some(at) => write.limited_until(at),
            None => write,
        };
        let w = write.held.as_mut().expect("a fresh guard");
        w.token = h.token;
        w.read_hold = Some(Box::new(self.own_entry()));
        // The write hold stands on the read hold: its loss (an operator's
        // delete of that entry alone) is the write hold's too.
        let (parent, child) = (h.req.signals.clone(), write.held().req.signals.clone());
        h.client.runtime.spawn(async move {
            tokio::select! {
                reason = parent.lost() => child.lose(reason),
                _ = child.finished() => {}
            }
        });
        Ok(Upgraded { write, _read: self })
    }

    /// What is held: a mutex, the read or write side of a read-write lock,
    /// or a semaphore permit.
    pub fn kind(&self) -> LockKind {
        self.held().req.kind
    }

    /// How many semaphore permits this guard holds: 1, or the count of
    /// [`Semaphore::acquire_many`](crate::Semaphore::acquire_many).
    pub fn count(&self) -> u32 {
        self.held().req.count
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
    /// release, or if the store could not confirm that it was still held
    /// when released: our entry was gone (an operator's break or delete,
    /// an expiry not heard of yet; also when a first try's answer was
    /// lost, which may have removed it), or the session was lost before
    /// the store answered. The work done under it may not have been
    /// protected to its end. Returns the
    /// store's error if the store kept refusing the removal: the client
    /// then ended the session (so that the store drops the entry; the
    /// session's other locks report [`LossReason::SessionEnded`]). `Ok`
    /// never leaves our entry on the store with a live session.
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
        let removed = remove_once(&h.session, &h.req, &h.acquired, &h.removal).await;
        let held = finish.defuse();
        drop(held.ticket.lock().expect("ticket poisoned").take());
        match lost {
            None => removed,
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
    let lock = held.req.name.clone();
    spawn_cleanup(&client, &lock, async move {
        // An error was logged, and the session ended so that the store
        // drops the entry.
        let _ = remove_once(&held.session, &held.req, &held.acquired, &held.removal).await;
        drop(held.ticket.lock().expect("ticket poisoned").take());
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
#[must_use = "the nested hold ends when it is dropped"]
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

/// The write hold of an upgraded read hold; see [`LockGuard::upgrade`].
/// Derefs to the write entry's guard: its token, loss signal and fenced
/// writes. Dropping it queues the downgrade; [`downgrade`](Self::downgrade)
/// does it now and confirms.
#[must_use = "the write hold ends (downgrades) when it is dropped"]
pub struct Upgraded<'a> {
    write: LockGuard,
    /// The upgradeable hold, which outlives its upgrade.
    _read: &'a mut LockGuard,
}

impl Upgraded<'_> {
    /// Ends the write hold now and confirms that its entry is gone; the
    /// read hold stays. Errors as [`LockGuard::release`].
    ///
    /// # Cancel safety
    /// If dropped, the downgrade continues in the background.
    pub async fn downgrade(self) -> Result<()> {
        self.write.release().await
    }
}

impl std::ops::Deref for Upgraded<'_> {
    type Target = LockGuard;
    fn deref(&self) -> &LockGuard {
        &self.write
    }
}

impl fmt::Debug for Upgraded<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Upgraded").field(&self.write).finish()
    }
}
