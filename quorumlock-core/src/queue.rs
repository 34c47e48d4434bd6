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

/// Whether entry `i` of a queue (the kinds of its entries in arrival
/// order) holds: a mutex or writer when first, a reader when no mutex or
/// writer is ahead, a semaphore permit when fewer than `permits` entries
/// are ahead.
///
/// # Panics
/// If `i` is out of bounds.
pub fn holds(kinds: &[LockKind], i: usize) -> bool {
    match kinds[i] {
        LockKind::Read => kinds[..i].iter().all(|k| *k == LockKind::Read),
        LockKind::Semaphore { permits } => i < permits as usize,
        _ => i == 0,
    }
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
