//! Signals between a backend and the client layer: session liveness with a
//! local deadline, and per-entry loss and revoke requests.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Why a held lock can no longer be assumed held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// The store ended the session (expired, revoked, destroyed).
    SessionExpired,
    /// No keepalive was confirmed in time: the local deadline passed, so
    /// the store may already have expired the session.
    DeadlinePassed,
    /// The lock entry was deleted behind our back (forced break).
    EntryDeleted,
    /// The client was closed while the lock was held.
    ClientClosed,
    /// The store refused to remove one of the session's entries (a
    /// release or an abandon) and kept refusing: the client ended the
    /// session, the one way left to make the store drop that entry, and
    /// with it every lock the session held.
    SessionEnded,
    /// The hold reached the limit it was taken with
    /// ([`crate::Lock::hold_at_most`]): the client removes the entry.
    HoldLimitReached,
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LossReason::SessionExpired => "session expired",
            LossReason::DeadlinePassed => "keepalive deadline passed",
            LossReason::EntryDeleted => "lock entry deleted",
            LossReason::ClientClosed => "client closed",
            LossReason::SessionEnded => {
                "session ended: the store refused to remove one of its entries"
            }
            LossReason::HoldLimitReached => "hold limit reached",
        })
    }
}

/// A flag that is set once, with a reason, and can be awaited.
#[derive(Debug, Default)]
struct Latch {
    token: CancellationToken,
    reason: OnceLock<LossReason>,
}

impl Latch {
    fn set(&self, reason: LossReason) {
        let _ = self.reason.set(reason);
        self.token.cancel();
    }
    fn get(&self) -> Option<LossReason> {
        if self.token.is_cancelled() {
            self.reason.get().copied()
        } else {
            None
        }
    }
}

/// Liveness of one store session, shared by the backend (which confirms
/// keepalives) and the client layer (which enforces the local deadline).
///
/// The deadline is `send time of the last confirmed keepalive + TTL -
/// margin`: the store cannot have expired the session before the TTL has
/// run from the moment the confirmed request left us, so a holder that
/// stops at the deadline stops before anyone else can acquire.
#[derive(Debug)]
pub struct SessionLiveness {
    epoch: Instant,
    /// Nanoseconds after `epoch`; 0 means "never confirmed".
    deadline_ns: AtomicU64,
    lost: Latch,
}

impl Default for SessionLiveness {
    fn default() -> Self {
        Self::new()
    }
}

impl SessionLiveness {
    /// A session that is not yet confirmed (and so not alive).
    pub fn new() -> Self {
        SessionLiveness {
            epoch: Instant::now(),
            deadline_ns: AtomicU64::new(0),
            lost: Latch::default(),
        }
    }

    /// The safety margin subtracted from a TTL: a fifth of it, so that
    /// clock-rate drift and scheduling delays stay on the safe side.
    pub fn margin(ttl: Duration) -> Duration {
        ttl / 5
    }

    /// Records that a keepalive (or the session grant) sent at `sent_at`
    /// was confirmed by the store, with `ttl` granted.
    /// The deadline only moves forward, and never after a loss.
    pub fn confirm(&self, sent_at: Instant, ttl: Duration) {
        crate::telemetry::keepalive(sent_at.elapsed());
        if self.lost.get().is_some() {
            return;
        }
        let deadline = sent_at + ttl - Self::margin(ttl);
        let ns = deadline.saturating_duration_since(self.epoch).as_nanos() as u64;
        self.deadline_ns.fetch_max(ns.max(1), Ordering::AcqRel);
    }

    /// The current local deadline (`None` before the first confirmation):
    /// the instant the session is assumed lost from. A session declared
    /// lost before it ([`lose`](Self::lose)) has the instant of that
    /// declaration as its deadline: what `is_alive()` said from then on,
    /// however late a task waiting on [`lost`](Self::lost) ran.
    pub fn deadline(&self) -> Option<Instant> {
        match self.deadline_ns.load(Ordering::Acquire) {
            0 => None,
            ns => Some(self.epoch + Duration::from_nanos(ns)),
        }
    }

    /// Declares the session lost. The first reason wins; the deadline
    /// comes back to now if it was later.
    pub fn lose(&self, reason: LossReason) {
        if self.lost.get().is_none() {
            tracing::debug!(%reason, "session lost");
        }
        let now = Instant::now()
            .saturating_duration_since(self.epoch)
            .as_nanos() as u64;
        self.deadline_ns.fetch_min(now.max(1), Ordering::AcqRel);
        // Never confirmed (0) stays "never": `fetch_min` left it at 0.
        self.lost.set(reason);
    }

    /// Why the session was lost, if it was. A passed deadline is latched
    /// here, not only when the watchdog wakes: a keepalive answer arriving
    /// late (its request sent before the deadline) must not revive a
    /// session that callers were already told is dead, and may have acted
    /// on (an entry left for the store to remove with the session).
    pub fn loss(&self) -> Option<LossReason> {
        if let Some(r) = self.lost.get() {
            return Some(r);
        }
        match self.deadline() {
            Some(d) if Instant::now() < d => None,
            Some(_) => {
                self.lose(LossReason::DeadlinePassed);
                Some(LossReason::DeadlinePassed)
            }
            // Not confirmed yet: not alive, but not lost either (the
            // session is still being opened).
            None => Some(LossReason::DeadlinePassed),
        }
    }

    /// Whether the session can still be assumed alive: not lost, and the
    /// local deadline not passed. Cheap: an atomic load and a clock read.
    pub fn is_alive(&self) -> bool {
        self.loss().is_none()
    }

    /// Resolves when [`lose`](Self::lose) is called. The deadline is turned
    /// into a `lose` by the client's watchdog.
    pub async fn lost(&self) -> LossReason {
        self.lost.token.cancelled().await;
        self.lost.get().unwrap_or(LossReason::SessionExpired)
    }

    /// Runs until the session is lost, turning a passed deadline into a
    /// loss. The client layer spawns one per session.
    pub async fn watchdog(self: Arc<Self>) {
        loop {
            let Some(deadline) = self.deadline() else {
                self.lose(LossReason::DeadlinePassed);
                return;
            };
            tokio::select! {
                _ = self.lost.token.cancelled() => return,
                _ = tokio::time::sleep_until(deadline) => {
                    if self.deadline().is_some_and(|d| Instant::now() >= d) {
                        tracing::warn!("no keepalive confirmed before the local deadline");
                        self.lose(LossReason::DeadlinePassed);
                        return;
                    }
                }
            }
        }
    }
}

/// Per-entry signals: the backend reports that the entry was deleted or
/// that a revoke was requested; the client layer tells the backend when
/// the entry is finished with (released or abandoned) so that watchers
/// of it can stop.
#[derive(Debug, Clone, Default)]
pub struct EntrySignals {
    inner: Arc<EntrySignalsInner>,
}

/// Three flags and one `Notify` for all of them: every held lock keeps one
/// of these, so it is kept small (a few dozen bytes, where three
/// cancellation tokens took several hundred).
#[derive(Debug, Default)]
struct EntrySignalsInner {
    /// 0: not lost; else the [`loss_code`] of the first reason.
    lost: AtomicU8,
    revoke: AtomicBool,
    finished: AtomicBool,
    /// Notified (all waiters) after any flag is set.
    changed: Notify,
}

fn loss_code(r: LossReason) -> u8 {
    match r {
        LossReason::SessionExpired => 1,
        LossReason::DeadlinePassed => 2,
        LossReason::EntryDeleted => 3,
        LossReason::ClientClosed => 4,
        LossReason::SessionEnded => 5,
        LossReason::HoldLimitReached => 6,
    }
}

fn loss_of(code: u8) -> Option<LossReason> {
    Some(match code {
        1 => LossReason::SessionExpired,
        2 => LossReason::DeadlinePassed,
        3 => LossReason::EntryDeleted,
        4 => LossReason::ClientClosed,
        5 => LossReason::SessionEnded,
        6 => LossReason::HoldLimitReached,
        _ => return None,
    })
}

impl EntrySignalsInner {
    /// Resolves once `ready` holds. The waiter is registered before the
    /// check, so a flag set in between is never missed.
    async fn until(&self, ready: impl Fn(&Self) -> bool) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if ready(self) {
                return;
            }
            notified.await;
        }
    }

    fn set(&self, flag: &AtomicBool) {
        if !flag.swap(true, Ordering::AcqRel) {
            self.changed.notify_waiters();
        }
    }
}

impl EntrySignals {
    /// Fresh signals, nothing set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Backend: the entry is gone or no longer ours.
    pub fn lose(&self, reason: LossReason) {
        let i = &self.inner;
        if i.lost
            .compare_exchange(0, loss_code(reason), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            i.changed.notify_waiters();
        }
    }

    /// Why the entry was lost, if it was.
    pub fn loss(&self) -> Option<LossReason> {
        loss_of(self.inner.lost.load(Ordering::Acquire))
    }

    /// Resolves when the entry is lost.
    pub async fn lost(&self) -> LossReason {
        self.inner
            .until(|i| i.lost.load(Ordering::Acquire) != 0)
            .await;
        self.loss().unwrap_or(LossReason::EntryDeleted)
    }

    /// Backend: someone asked the holder to let go.
    pub fn request_revoke(&self) {
        self.inner.set(&self.inner.revoke);
    }

    /// Whether a revoke was requested.
    pub fn is_revoke_requested(&self) -> bool {
        self.inner.revoke.load(Ordering::Acquire)
    }

    /// Resolves when a revoke is requested.
    pub async fn revoke_requested(&self) {
        self.inner.until(|i| i.revoke.load(Ordering::Acquire)).await
    }

    /// Client layer: the entry was released or abandoned.
    pub fn finish(&self) {
        self.inner.set(&self.inner.finished);
    }

    /// Whether [`finish`](Self::finish) was called.
    pub fn is_finished(&self) -> bool {
        self.inner.finished.load(Ordering::Acquire)
    }

    /// Resolves when the entry is finished with: watchers select on it.
    pub async fn finished(&self) {
        self.inner
            .until(|i| i.finished.load(Ordering::Acquire))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn deadline_is_send_time_plus_ttl_minus_margin() {
        let l = Arc::new(SessionLiveness::new());
        assert!(!l.is_alive(), "not alive before the first confirmation");
        let sent = Instant::now();
        l.confirm(sent, Duration::from_secs(10));
        assert_eq!(l.deadline(), Some(sent + Duration::from_secs(8)));
        assert!(l.is_alive());
        // An older confirmation never moves the deadline back.
        l.confirm(sent - Duration::from_secs(5), Duration::from_secs(10));
        assert_eq!(l.deadline(), Some(sent + Duration::from_secs(8)));
        let dog = tokio::spawn(l.clone().watchdog());
        tokio::time::sleep(Duration::from_millis(7_900)).await;
        assert!(l.is_alive());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!l.is_alive());
        assert_eq!(l.lost().await, LossReason::DeadlinePassed);
        dog.await.unwrap();
    }

    /// A session declared lost before its deadline is assumed lost from
    /// that instant: its deadline says so, and no later keepalive moves it.
    #[tokio::test(start_paused = true)]
    async fn a_loss_brings_the_deadline_to_its_instant() {
        let l = SessionLiveness::new();
        let ttl = Duration::from_secs(10);
        l.confirm(Instant::now(), ttl);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let at = Instant::now();
        l.lose(LossReason::SessionEnded);
        assert_eq!(l.deadline(), Some(at));
        l.confirm(Instant::now(), ttl);
        assert_eq!(l.deadline(), Some(at));
        assert_eq!(l.loss(), Some(LossReason::SessionEnded));
        let never = SessionLiveness::new();
        never.lose(LossReason::ClientClosed);
        assert_eq!(never.deadline(), None);
    }

    /// The watchdog may run late (a loaded runtime): a caller that saw the
    /// deadline pass has been told the session is dead, and a keepalive
    /// answer arriving afterwards must not make it alive again.
    #[tokio::test(start_paused = true)]
    async fn a_passed_deadline_stays_passed_without_the_watchdog() {
        let l = Arc::new(SessionLiveness::new());
        let ttl = Duration::from_secs(10);
        let sent = Instant::now();
        l.confirm(sent, ttl);
        tokio::time::sleep(Duration::from_millis(8_100)).await;
        assert_eq!(l.loss(), Some(LossReason::DeadlinePassed));
        // A keepalive sent before the deadline, answered after it.
        l.confirm(sent + Duration::from_millis(7_000), ttl);
        assert!(
            !l.is_alive(),
            "a late keepalive answer revived a dead session"
        );
        assert_eq!(l.loss(), Some(LossReason::DeadlinePassed));
        // Latched: the supervisor (waiting on `lost`) ends the session.
        assert_eq!(l.lost().await, LossReason::DeadlinePassed);
    }

    #[tokio::test]
    async fn entry_signals_first_reason_wins() {
        let s = EntrySignals::new();
        assert_eq!(s.loss(), None);
        s.lose(LossReason::EntryDeleted);
        s.lose(LossReason::SessionExpired);
        assert_eq!(s.lost().await, LossReason::EntryDeleted);
        assert!(!s.is_revoke_requested());
        s.request_revoke();
        s.revoke_requested().await;
    }

    #[tokio::test]
    async fn entry_signals_wake_waiters_and_keep_the_first_loss() {
        let s = EntrySignals::new();
        assert_eq!(s.loss(), None);
        assert!(!s.is_revoke_requested() && !s.is_finished());
        let (a, b, c) = (s.clone(), s.clone(), s.clone());
        let lost = tokio::spawn(async move { a.lost().await });
        let revoked = tokio::spawn(async move { b.revoke_requested().await });
        let finished = tokio::spawn(async move { c.finished().await });
        tokio::task::yield_now().await;
        s.request_revoke();
        revoked.await.unwrap();
        assert!(!lost.is_finished() && !finished.is_finished());
        s.lose(LossReason::EntryDeleted);
        s.lose(LossReason::ClientClosed);
        assert_eq!(
            lost.await.unwrap(),
            LossReason::EntryDeleted,
            "the first reason wins"
        );
        assert_eq!(s.loss(), Some(LossReason::EntryDeleted));
        s.finish();
        finished.await.unwrap();
        // Already set: resolves at once.
        assert_eq!(s.lost().await, LossReason::EntryDeleted);
        s.finished().await;
    }
}
