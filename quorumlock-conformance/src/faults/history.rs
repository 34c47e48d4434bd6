//! The history checker: when each holder believed it held the lock, and
//! whether two such beliefs ever overlapped.

use std::sync::{Arc, Mutex};

use quorumlock_core::{LockGuard, LossReason};
use tokio::time::Instant;

use super::register::FencedRegister;

/// How a hold ended, from the holder's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldEnd {
    /// The holder stopped believing because it chose to release.
    Released,
    /// The guard's loss future fired.
    Lost(LossReason),
    /// The lock was taken away by force (session killed, entry deleted):
    /// the holder cannot know before the store tells it, so its belief
    /// is cut at the moment of the fault; only fencing protects the
    /// resource until the loss signal arrives.
    Forced,
}

/// One holder's belief interval: from the moment its acquire returned
/// (acquire confirmed) to the moment it started releasing or its loss was
/// signalled, whichever came first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// Index in the history.
    pub id: usize,
    /// Who held (a label; one label may hold many times).
    pub holder: String,
    /// The fencing token of the hold.
    pub token: u64,
    /// Acquire confirmed.
    pub acquired: Instant,
    /// Belief ended (`None`: still believes).
    pub ended: Option<(Instant, HoldEnd)>,
}

impl Hold {
    fn end_or(&self, now: Instant) -> Instant {
        self.ended.map_or(now, |(t, _)| t)
    }
}

/// Two holds whose belief intervals overlap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// The hold that started first.
    pub first: Hold,
    /// The hold that started while the first still believed.
    pub second: Hold,
}

/// A record of holds, shared by every holder of a scenario.
#[derive(Debug, Default)]
pub struct History {
    holds: Mutex<Vec<Hold>>,
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `holder` got the lock with `token` at `at`; returns the
    /// hold's id for [`end`](Self::end).
    pub fn begin(&self, holder: &str, token: u64, at: Instant) -> usize {
        let mut h = self.holds.lock().expect("history poisoned");
        let id = h.len();
        h.push(Hold {
            id,
            holder: holder.to_string(),
            token,
            acquired: at,
            ended: None,
        });
        id
    }

    /// Records the end of a belief; the earliest end wins.
    pub fn end(&self, id: usize, at: Instant, how: HoldEnd) {
        let mut h = self.holds.lock().expect("history poisoned");
        let hold = &mut h[id];
        match hold.ended {
            Some((t, _)) if t <= at => {}
            _ => hold.ended = Some((at, how)),
        }
    }

    /// Every hold so far.
    pub fn holds(&self) -> Vec<Hold> {
        self.holds.lock().expect("history poisoned").clone()
    }

    /// Starts tracking `guard` as held by `holder` from now: its loss
    /// future is watched in a task that records the loss time.
    /// Call it right after the acquire returns.
    pub fn track(self: &Arc<Self>, holder: &str, guard: &LockGuard) -> Tracked {
        let now = Instant::now();
        let id = self.begin(holder, guard.token(), now);
        let lost = guard.lost();
        let me = self.clone();
        let watcher = tokio::spawn(async move {
            let reason = lost.await;
            me.end(id, Instant::now(), HoldEnd::Lost(reason));
        });
        Tracked {
            id,
            history: self.clone(),
            watcher,
            holder: holder.to_string(),
            token: guard.token(),
            acquired: now,
        }
    }

    /// Pairs of holds by different holders whose belief intervals overlap.
    /// A hold with no end yet counts as believing until now.
    pub fn overlaps(&self) -> Vec<Overlap> {
        let now = Instant::now();
        let mut holds = self.holds();
        holds.sort_by_key(|h| h.acquired);
        let mut out = Vec::new();
        for (i, a) in holds.iter().enumerate() {
            for b in &holds[i + 1..] {
                // b starts at or after a; overlap when b starts before a ends.
                if b.acquired < a.end_or(now) && a.id != b.id {
                    out.push(Overlap {
                        first: a.clone(),
                        second: b.clone(),
                    });
                }
            }
        }
        out
    }

    /// Accepted writes that were stale: an accepted write with token `t`
    /// made after a hold with a higher token had already been confirmed.
    /// The register accepted it only because the newer holder had not
    /// written yet; a resource could then lose the newer holder's work.
    pub fn stale_accepted(&self, register: &FencedRegister) -> usize {
        let holds = self.holds();
        register
            .log()
            .iter()
            .filter(|w| w.accepted)
            .filter(|w| {
                holds
                    .iter()
                    .any(|h| h.token > w.token && h.acquired <= w.at)
            })
            .count()
    }

    /// The hold with `id`.
    pub fn hold(&self, id: usize) -> Hold {
        self.holds.lock().expect("history poisoned")[id].clone()
    }
}

/// A tracked hold; see [`History::track`].
#[derive(Debug)]
pub struct Tracked {
    id: usize,
    history: Arc<History>,
    watcher: tokio::task::JoinHandle<()>,
    holder: String,
    token: u64,
    acquired: Instant,
}

impl Tracked {
    /// The hold's id in the history.
    pub fn id(&self) -> usize {
        self.id
    }

    /// The holder label.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The token held.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// When the acquire was confirmed.
    pub fn acquired(&self) -> Instant {
        self.acquired
    }

    /// When the loss was signalled, if it was.
    pub fn lost_at(&self) -> Option<Instant> {
        match self.history.hold(self.id).ended {
            Some((t, HoldEnd::Lost(_))) => Some(t),
            _ => None,
        }
    }

    /// Cuts the belief at `at`: the lock was taken away by force.
    pub fn forced(&self, at: Instant) {
        self.history.end(self.id, at, HoldEnd::Forced);
    }

    /// The end of belief as recorded so far.
    pub fn ended(&self) -> Option<(Instant, HoldEnd)> {
        self.history.hold(self.id).ended
    }

    /// Records that the holder stops believing now (call it before
    /// releasing) and stops watching the loss future.
    pub fn releasing(self) {
        self.history.end(self.id, Instant::now(), HoldEnd::Released);
        self.watcher.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ms(base: Instant, n: u64) -> Instant {
        base + Duration::from_millis(n)
    }

    #[test]
    fn back_to_back_holds_do_not_overlap() {
        let h = History::new();
        let t = Instant::now();
        let a = h.begin("a", 1, ms(t, 0));
        h.end(a, ms(t, 10), HoldEnd::Released);
        let b = h.begin("b", 2, ms(t, 10)); // starts exactly at a's end
        h.end(b, ms(t, 20), HoldEnd::Lost(LossReason::SessionExpired));
        let c = h.begin("a", 3, ms(t, 25));
        h.end(c, ms(t, 30), HoldEnd::Released);
        assert!(h.overlaps().is_empty(), "{:?}", h.overlaps());
    }

    #[test]
    fn overlap_is_found_whoever_ends_first() {
        let h = History::new();
        let t = Instant::now();
        let a = h.begin("a", 1, ms(t, 0));
        let b = h.begin("b", 2, ms(t, 5));
        h.end(b, ms(t, 8), HoldEnd::Released);
        h.end(a, ms(t, 10), HoldEnd::Lost(LossReason::DeadlinePassed));
        let o = h.overlaps();
        assert_eq!(o.len(), 1);
        assert_eq!(
            (o[0].first.holder.as_str(), o[0].second.holder.as_str()),
            ("a", "b")
        );
        // Recorded out of order: still found.
        let h = History::new();
        let b = h.begin("b", 2, ms(t, 5));
        let a = h.begin("a", 1, ms(t, 0));
        h.end(a, ms(t, 6), HoldEnd::Released);
        h.end(b, ms(t, 9), HoldEnd::Released);
        assert_eq!(h.overlaps().len(), 1);
    }

    #[test]
    fn an_unended_hold_believes_until_now() {
        let h = History::new();
        let t = Instant::now() - Duration::from_secs(1);
        h.begin("a", 1, ms(t, 0)); // loss never signalled
        let b = h.begin("b", 2, ms(t, 500));
        h.end(b, ms(t, 600), HoldEnd::Released);
        assert_eq!(h.overlaps().len(), 1);
    }

    #[test]
    fn loss_signalled_before_the_next_acquire_is_no_overlap_and_earliest_end_wins() {
        let h = History::new();
        let t = Instant::now();
        let a = h.begin("a", 1, ms(t, 0));
        h.end(a, ms(t, 50), HoldEnd::Lost(LossReason::DeadlinePassed));
        // A later release attempt does not extend the belief.
        h.end(a, ms(t, 90), HoldEnd::Released);
        assert_eq!(
            h.hold(a).ended,
            Some((ms(t, 50), HoldEnd::Lost(LossReason::DeadlinePassed)))
        );
        h.begin("b", 2, ms(t, 60));
        assert!(h.overlaps().is_empty());
    }

    #[test]
    fn stale_accepted_checks_writes_against_newer_holds() {
        let t = Instant::now();
        let h = History::new();
        let r = FencedRegister::new();
        let a = h.begin("a", 1, t);
        r.write("a", 1).unwrap();
        h.end(a, Instant::now(), HoldEnd::Lost(LossReason::DeadlinePassed));
        std::thread::sleep(Duration::from_millis(2));
        // b holds token 2 but has not written yet: a's late write slips in.
        h.begin("b", 2, Instant::now());
        std::thread::sleep(Duration::from_millis(2));
        r.write("a", 1).unwrap();
        assert_eq!(h.stale_accepted(&r), 1);
        // Once b wrote, a's next late write is rejected and not counted.
        r.write("b", 2).unwrap();
        assert!(r.write("a", 1).is_err());
        assert_eq!(h.stale_accepted(&r), 1);
        assert_eq!(r.rejected(), 1);

        // A clean history: each writes only while it holds.
        let h = History::new();
        let r = FencedRegister::new();
        let a = h.begin("a", 1, Instant::now());
        r.write("a", 1).unwrap();
        h.end(a, Instant::now(), HoldEnd::Released);
        h.begin("b", 2, Instant::now());
        r.write("b", 2).unwrap();
        assert_eq!(h.stale_accepted(&r), 0);
    }
}
