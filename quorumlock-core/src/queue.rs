//! The rules of one lock's queue, the same on every store: which entry
//! holds and which kinds clash. Backends lay the queue out on their store;
//! they decide with these functions, never with their own copies.

use std::time::SystemTime;

use crate::LockName;

/// The kind of entry a contender puts on the store.
///
/// Entries of one name form one queue in arrival order. An entry holds
/// when:
/// - `Exclusive` or `Write`: it is first;
/// - `Read`: no `Exclusive` or `Write` entry is ahead of it;
/// - `Semaphore { permits }`: fewer than `permits` entries are ahead of it.
///
/// A waiter watches only what it waits for (herd-free): a writer its
/// predecessor, a reader the nearest writer ahead, a semaphore waiter the
/// `permits` nearest entries ahead (watching only the entry `permits`
/// places ahead misses the release of a nearer one), so a release wakes at
/// most `permits` waiters, never all of them.
///
/// A request whose kind clashes with the head of the queue (a semaphore
/// with another `permits`, a semaphore among lock entries) fails with
/// [`crate::ErrorKind::Conflict`] without waiting and without leaving an
/// entry. Foreign recipes may still add a clashing entry later; an entry
/// is then never granted beside an incompatible entry ahead of it.
/// `Read`/`Write` entries are one per owner (several per session), so their
/// layout must not be keyed by session alone; `Exclusive` and `Semaphore`
/// entries are at most one per session and name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// A mutex: one holder.
    Exclusive,
    /// The read side of a read-write lock.
    Read,
    /// The write side of a read-write lock.
    Write,
    /// A counting semaphore with this many permits.
    Semaphore {
        /// Holders allowed at once.
        permits: u32,
    },
    /// A candidate of a leader election ([`crate::Election`]): queues and
    /// holds as a mutex does (the first entry leads), in the layout of the
    /// store's own election recipe (etcd's `concurrency.Election`,
    /// Curator's `LeaderLatch`), with the candidate's value as the entry's
    /// whole value.
    Election,
}

impl LockKind {
    /// Whether a request of kind `self` may not queue behind an entry of
    /// kind `existing` on one name: mutexes and read-write locks share the
    /// exclusive/write rule, semaphores only mix with semaphores of the
    /// same permit count. Such a request fails with
    /// [`crate::ErrorKind::Conflict`].
    pub fn conflicts_with(self, existing: LockKind) -> bool {
        match (existing, self) {
            (LockKind::Semaphore { permits: a }, LockKind::Semaphore { permits: b }) => a != b,
            (LockKind::Semaphore { .. }, _) | (_, LockKind::Semaphore { .. }) => true,
            _ => false,
        }
    }
}

/// What entry `i` of a queue (the kinds of its entries in arrival order)
/// waits for: `None` when it holds, else the index of the one entry ahead
/// whose removal it waits for (the entry a backend watches). This is the
/// queue rule of every store, written once:
/// - a mutex or writer holds when first, else waits for the entry just
///   ahead;
/// - a reader holds when no mutex or writer is ahead, else waits for the
///   nearest mutex or writer ahead;
/// - a permit of a semaphore of `permits` holds when fewer than `permits`
///   entries are ahead, else waits for the entry `permits` places ahead
///   (when it goes, this one is inside the window).
///
/// Only kinds that share a queue meet here ([`LockKind::conflicts_with`]
/// keeps a semaphore's queue to one count); a latch is a mutex.
///
/// # Panics
/// If `i` is out of bounds.
pub fn waits_for(kinds: &[LockKind], i: usize) -> Option<usize> {
    match kinds[i] {
        LockKind::Read => (0..i).rev().find(|&j| kinds[j] != LockKind::Read),
        LockKind::Semaphore { permits } => i.checked_sub(permits.max(1) as usize),
        _ => i.checked_sub(1),
    }
}

/// Whether entry `i` of a queue holds: [`waits_for`] finds nothing it
/// waits for.
///
/// # Panics
/// If `i` is out of bounds.
pub fn holds(kinds: &[LockKind], i: usize) -> bool {
    waits_for(kinds, i).is_none()
}

/// Whether entry `i` holds when the entries of one request hold together
/// (the permits of [`crate::Semaphore::acquire_many`], side by side in the
/// queue): by [`holds`] at the last entry of the run of entries from `i`
/// on that `same_request(i, j)` says belong to `i`'s request. Every store
/// decides a group's grant, and shows its entries in `inspect`, by this.
///
/// # Panics
/// If `i` is out of bounds.
pub fn holds_together(
    kinds: &[LockKind],
    i: usize,
    same_request: impl Fn(usize, usize) -> bool,
) -> bool {
    let last = (i..kinds.len())
        .take_while(|&j| same_request(i, j))
        .last()
        .unwrap_or(i);
    holds(kinds, last)
}

/// One contender as seen on the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contender {
    /// The session that owns the entry.
    pub session: String,
    /// For holders, the fencing token; for waiters, the queue position key
    /// (create revision, czxid, index).
    pub token: u64,
    /// The store's name of the entry.
    pub entry: String,
    /// What the contender asked for.
    pub kind: LockKind,
    /// When the entry was created, where the store records it.
    pub since: Option<SystemTime>,
    /// The holder's value (who it is: by default `<hostname>:<pid>`; see
    /// [`crate::ClientOptions::value`]), as the store keeps it: for native
    /// holders what their tool wrote (Curator's node data, the etcd key's
    /// value, Consul's key value); empty when none was written.
    pub value: Vec<u8>,
}

impl Contender {
    /// [`Contender::value`] as text (invalid UTF-8 replaced), for display.
    pub fn value_text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.value)
    }
}

/// Holders and waiters of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockState {
    /// The lock.
    pub name: LockName,
    /// Current holders (one for a mutex).
    pub holders: Vec<Contender>,
    /// Waiters, in queue order.
    pub waiters: Vec<Contender>,
}

impl LockState {
    /// A lock nobody holds or waits for.
    pub fn free(name: LockName) -> Self {
        LockState {
            name,
            holders: Vec::new(),
            waiters: Vec::new(),
        }
    }

    /// Whether nobody holds or waits.
    pub fn is_free(&self) -> bool {
        self.holders.is_empty() && self.waiters.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEM2: LockKind = LockKind::Semaphore { permits: 2 };
    const SEM3: LockKind = LockKind::Semaphore { permits: 3 };

    #[test]
    fn waits_for_the_entry_whose_removal_can_let_it_hold() {
        use LockKind::*;
        let q = [Read, Exclusive, Read, Read, Write, Read];
        let w: Vec<Option<usize>> = (0..q.len()).map(|i| waits_for(&q, i)).collect();
        assert_eq!(w, [None, Some(0), Some(1), Some(1), Some(3), Some(4)]);
        let q = [SEM2, SEM2, SEM2, SEM2, SEM2];
        let w: Vec<Option<usize>> = (0..q.len()).map(|i| waits_for(&q, i)).collect();
        assert_eq!(w, [None, None, Some(0), Some(1), Some(2)]);
        let q = [Read, Read, Write];
        assert_eq!(waits_for(&q, 2), Some(1));
        // A semaphore of 0 permits (refused by validation) is a mutex here.
        let zero = Semaphore { permits: 0 };
        assert_eq!(waits_for(&[zero, zero], 1), Some(0));
    }

    #[test]
    fn semaphores_mix_only_with_the_same_count() {
        use LockKind::*;
        for (a, b) in [
            (Exclusive, Read),
            (Read, Write),
            (Write, Exclusive),
            (SEM2, SEM2),
        ] {
            assert!(!a.conflicts_with(b) && !b.conflicts_with(a), "{a:?} {b:?}");
        }
        for (a, b) in [(SEM2, SEM3), (SEM2, Exclusive), (Read, SEM3), (Write, SEM2)] {
            assert!(a.conflicts_with(b) && b.conflicts_with(a), "{a:?} {b:?}");
        }
    }

    #[test]
    fn a_requests_entries_hold_together() {
        // Permits of 3: one single, then a request for 3 (entries 1-3).
        const SEM3: LockKind = LockKind::Semaphore { permits: 3 };
        let q = [SEM3; 4];
        let request = [0, 1, 1, 1];
        let same = |i: usize, j: usize| request[i] == request[j];
        let held: Vec<bool> = (0..4).map(|i| holds_together(&q, i, same)).collect();
        assert_eq!(held, [true, false, false, false]);
        let held: Vec<bool> = (1..4)
            .map(|i| holds_together(&q[1..], i - 1, |a, b| request[a + 1] == request[b + 1]))
            .collect();
        assert_eq!(held, [true, true, true], "the single one gone");
    }

    #[test]
    fn which_entries_hold() {
        use LockKind::*;
        let q = [Read, Read, Write, Read, Exclusive];
        let held: Vec<bool> = (0..q.len()).map(|i| holds(&q, i)).collect();
        assert_eq!(held, [true, true, false, false, false]);
        let q = [Write, Read];
        assert!(holds(&q, 0) && !holds(&q, 1));
        let q = [SEM2, SEM2, SEM2];
        let held: Vec<bool> = (0..q.len()).map(|i| holds(&q, i)).collect();
        assert_eq!(held, [true, true, false]);
    }
}
