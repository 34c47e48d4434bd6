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
/// - `Read`: no `Exclusive`, `Write` or `Upgrade` entry is ahead of it;
/// - `Upgradeable`: no entry but readers is ahead of it;
/// - `Upgrade`: no entry ahead of it holds but the upgradeable entry it
///   upgrades;
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
    /// The upgradeable read side of a read-write lock
    /// ([`crate::RwLock::upgradeable_read`]): it shares with readers and
    /// excludes writers and other upgradeable readers, so its holder can
    /// upgrade without deadlock.
    Upgradeable,
    /// The write of an upgrade ([`crate::LockGuard::upgrade`]): the entry
    /// an upgradeable holder appends to the queue, beside its upgradeable
    /// entry. It holds once nothing ahead of it holds but that entry, so
    /// readers granted before it drain, readers after it wait, and writers
    /// that queued behind the upgradeable entry still wait for it (the
    /// upgrade keeps its place).
    Upgrade,
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
/// - a reader holds when no mutex, writer or upgrade is ahead, else waits
///   for the nearest one;
/// - an upgradeable reader holds when only readers are ahead, else waits
///   for the nearest other entry;
/// - an upgrade holds when no entry ahead holds but the upgradeable entry
///   it upgrades, else waits for the nearest other holder ahead; without
///   a link ([`waits_for_linked`]) it waits for every holder; while a
///   reader waits between the two, it does not hold ([`upgrade_refused`]);
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
    waits_for_linked(kinds, i, |_, _| false)
}

/// [`waits_for`], where `upgrades(i, j)` says whether entry `i` (an
/// [`LockKind::Upgrade`]) upgrades entry `j` (its holder's
/// [`LockKind::Upgradeable`] entry): the one holder ahead an upgrade does
/// not wait for. A store that cannot tell says `false`: the upgrade then
/// waits for its own entry, which is safe and never grants.
///
/// An upgrade never waits for an entry that waits (only for holders):
/// those wait, directly or not, for its own upgradeable entry, so waiting
/// for them would be a deadlock.
///
/// # Panics
/// If `i` is out of bounds.
pub fn waits_for_linked(
    kinds: &[LockKind],
    i: usize,
    upgrades: impl Fn(usize, usize) -> bool + Copy,
) -> Option<usize> {
    use LockKind::{Read, Upgrade, Upgradeable};
    match kinds[i] {
        Read => (0..i)
            .rev()
            .find(|&j| !matches!(kinds[j], Read | Upgradeable)),
        Upgradeable => (0..i).rev().find(|&j| kinds[j] != Read),
        Upgrade => (0..i)
            .rev()
            .find(|&j| !upgrades(i, j) && waits_for_linked(kinds, j, upgrades).is_none())
            .or_else(|| waiting_reader(kinds, i, upgrades)),
        LockKind::Semaphore { permits } => i.checked_sub(permits.max(1) as usize),
        _ => i.checked_sub(1),
    }
}

/// The first reader that waits between the upgrade at `i` and the
/// upgradeable entry it upgrades (behind a writer that waits for that
/// entry).
fn waiting_reader(
    kinds: &[LockKind],
    i: usize,
    upgrades: impl Fn(usize, usize) -> bool + Copy,
) -> Option<usize> {
    let u = (0..i).find(|&j| upgrades(i, j))?;
    (u + 1..i)
        .find(|&j| kinds[j] == LockKind::Read && waits_for_linked(kinds, j, upgrades).is_some())
}

/// Whether the upgrade at `i` is to be refused
/// ([`crate::ErrorKind::UpgradeRefused`], its entry removed) instead of
/// granted or left waiting: the upgradeable entry it upgrades is not in
/// the queue (broken, or its session gone, before its holder learnt it);
/// or no holder but that entry is ahead of it, and a reader waits
/// between the two.
/// That reader waits for a writer that waits for the upgradeable entry:
/// granted, the upgrade would let the reader in beside the write as soon
/// as that writer gave up (a reader waits neither for an upgradeable
/// entry nor for an upgrade behind it); waited for, it would wait for
/// ever. Once the writer gives up, the reader holds, and an upgrade waits
/// for it as for any holder. Entries are never added between the two, so
/// an upgrade that holds stays clear of this.
///
/// # Panics
/// If `i` is out of bounds.
pub fn upgrade_refused(
    kinds: &[LockKind],
    i: usize,
    upgrades: impl Fn(usize, usize) -> bool + Copy,
) -> bool {
    kinds[i] == LockKind::Upgrade
        && (!(0..i).any(|j| upgrades(i, j))
            || waits_for_linked(kinds, i, upgrades).is_some_and(|j| {
                kinds[j] == LockKind::Read && waits_for_linked(kinds, j, upgrades).is_some()
            }))
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
    holds_linked(kinds, i, same_request, |_, _| false)
}

/// [`holds_together`] with the links of upgrades ([`waits_for_linked`]).
///
/// # Panics
/// If `i` is out of bounds.
pub fn holds_linked(
    kinds: &[LockKind],
    i: usize,
    same_request: impl Fn(usize, usize) -> bool,
    upgrades: impl Fn(usize, usize) -> bool + Copy,
) -> bool {
    let last = (i..kinds.len())
        .take_while(|&j| same_request(i, j))
        .last()
        .unwrap_or(i);
    waits_for_linked(kinds, last, upgrades).is_none()
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
    fn an_upgrade_waits_for_holders_only_and_keeps_its_place() {
        use LockKind::*;
        // R U W R R' upgrade: the reader ahead (0) holds, the writer
        // behind the upgradeable entry waits for it, the reader behind the
        // writer too; the upgrade waits for the reader ahead and for the
        // reader granted behind it (3), never for the waiting ones.
        let q = [Read, Upgradeable, Write, Read, Upgrade];
        let link = |i: usize, j: usize| (i, j) == (4, 1);
        let w: Vec<Option<usize>> = (0..q.len())
            .map(|i| waits_for_linked(&q, i, link))
            .collect();
        assert_eq!(w, [None, None, Some(1), Some(2), Some(0)]);
        let q = [Upgradeable, Read, Upgrade, Read];
        let link = |i: usize, j: usize| (i, j) == (2, 0);
        let w: Vec<Option<usize>> = (0..q.len())
            .map(|i| waits_for_linked(&q, i, link))
            .collect();
        assert_eq!(w, [None, None, Some(1), Some(2)], "readers after it wait");
        let q = [Upgradeable, Upgradeable, Upgrade];
        let link = |i: usize, j: usize| (i, j) == (2, 0);
        assert_eq!(
            waits_for_linked(&q, 1, link),
            Some(0),
            "one upgradeable holder"
        );
        assert_eq!(waits_for_linked(&q, 2, link), None, "upgraded");
        // Unlinked (a store that cannot tell), it waits for its own entry.
        assert_eq!(waits_for(&q, 2), Some(0));
        // Its entry gone (broken before its holder learnt it): refused.
        assert!(upgrade_refused(&[Read, Upgrade], 1, |_, _| false));
        assert!(!upgrade_refused(&q, 2, link));
    }

    /// Random histories of one read-write queue with upgrades, in which
    /// any entry may leave at any time (a holder lets go, a waiter gives
    /// up) and an upgrade that [`upgrade_refused`] refuses is removed at
    /// once (its owner is told): the holders never clash, a holder keeps
    /// holding until it leaves (grants are decided once), and an upgrade
    /// that waits waits for a holder other than its own entry (no
    /// deadlock: its owner cannot let go while it waits).
    #[test]
    fn upgrades_never_clash_deadlock_or_take_back_a_grant() {
        use LockKind::*;
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let (mut upgrades, mut refused, mut granted) = (0, 0, 0);
        for _ in 0..3_000 {
            // (id, kind, the id it upgrades)
            let mut q: Vec<(u32, LockKind, Option<u32>)> = Vec::new();
            let mut id = 0;
            let mut held_before: Vec<u32> = Vec::new();
            for _ in 0..50 {
                let kinds = |q: &[(u32, LockKind, Option<u32>)]| -> Vec<LockKind> {
                    q.iter().map(|e| e.1).collect()
                };
                // The owners of refused upgrades take them back.
                while let Some(i) = (0..q.len())
                    .find(|&i| upgrade_refused(&kinds(&q), i, |a, b| q[a].2 == Some(q[b].0)))
                {
                    refused += 1;
                    q.remove(i);
                }
                let k = kinds(&q);
                let link = |i: usize, j: usize| q[i].2 == Some(q[j].0);
                let holders: Vec<usize> = (0..q.len())
                    .filter(|&i| holds_linked(&k, i, |a, b| a == b, link))
                    .collect();
                let ids: Vec<u32> = holders.iter().map(|&i| q[i].0).collect();
                for h in &held_before {
                    if q.iter().any(|e| e.0 == *h) {
                        assert!(ids.contains(h), "{h} held, then not: {q:?}");
                    }
                }
                for &i in &holders {
                    if q[i].1 == Upgrade && !held_before.contains(&q[i].0) {
                        granted += 1;
                    }
                }
                let exclusive = holders
                    .iter()
                    .filter(|&&i| matches!(q[i].1, Exclusive | Write | Upgrade))
                    .count();
                let upgradeable = holders.iter().filter(|&&i| q[i].1 == Upgradeable).count();
                assert!(upgradeable <= 1, "two upgradeable holders: {q:?}");
                if exclusive > 0 {
                    let alone = holders.iter().all(|&i| match q[i].1 {
                        Upgrade => true,
                        Upgradeable => holders.iter().any(|&k| q[k].2 == Some(q[i].0)),
                        _ => holders.len() == 1,
                    });
                    assert!(exclusive == 1 && alone, "clashing holders {ids:?}: {q:?}");
                }
                for (i, e) in q.iter().enumerate() {
                    if e.1 == Upgrade && !holders.contains(&i) {
                        let w = waits_for_linked(&k, i, link);
                        assert!(
                            w.is_some_and(|j| holders.contains(&j) && Some(q[j].0) != e.2),
                            "upgrade {} waits for {w:?}, not another holder: {q:?}",
                            e.0
                        );
                    }
                }
                held_before = ids;
                match next(6) {
                    0..=2 => {
                        id += 1;
                        let kind = [Read, Write, Upgradeable, Exclusive][next(4)];
                        q.push((id, kind, None));
                    }
                    3 => {
                        // A holding upgradeable entry without an upgrade
                        // upgrades.
                        let up = holders.iter().map(|&i| q[i].0).find(|&u| {
                            q.iter().any(|e| e.0 == u && e.1 == Upgradeable)
                                && !q.iter().any(|e| e.2 == Some(u))
                        });
                        if let Some(u) = up {
                            id += 1;
                            upgrades += 1;
                            q.push((id, Upgrade, Some(u)));
                        }
                    }
                    _ if !q.is_empty() => {
                        // Anyone leaves: a holder lets go (an upgraded one
                        // with its upgrade, or its upgrade alone: a
                        // downgrade), a waiter gives up.
                        let gone = q[next(q.len())].0;
                        let upgraded = q.iter().any(|x| x.2 == Some(gone));
                        let downgrade = upgraded && next(2) == 0;
                        q.retain(|e| e.2 != Some(gone) && (downgrade || e.0 != gone));
                    }
                    _ => {}
                }
            }
        }
        // The histories did meet upgrades granted and refused.
        assert!(
            upgrades > 1_000 && refused > 50 && granted > 500,
            "{upgrades} {refused} {granted}"
        );
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
