//! What a backend remembers of its last grant of a lock, so that a
//! repeat acquire can leave out a read.

/// Per lock, what a backend learned at a grant that lets the next acquire
/// of the same lock skip a read (ZooKeeper: our node was the only child;
/// etcd and Consul: [`QuietGrants`]). It is kept from the grant to its
/// release and handed to the next acquire only if that grant was released
/// cleanly by us; anything else forgets it. Bounded: past `capacity`
/// locks, one is forgotten.
#[derive(Debug)]
pub struct GrantMemory<P> {
    capacity: usize,
    grants: std::sync::Mutex<std::collections::HashMap<String, Remembered<P>>>,
}

#[derive(Debug)]
struct Remembered<P> {
    /// Which grant (a store's sequence number or index).
    grant: u64,
    proof: P,
    released: bool,
}

impl<P> GrantMemory<P> {
    /// An empty memory of at most `capacity` locks.
    pub fn new(capacity: usize) -> Self {
        GrantMemory {
            capacity,
            grants: Default::default(),
        }
    }

    /// Remembers `proof` for `grant` of the lock `key`, held now.
    pub fn keep(&self, key: &str, grant: u64, proof: P) {
        let mut grants = self.grants.lock().expect("poisoned");
        if grants.len() >= self.capacity && !grants.contains_key(key) {
            let evicted = grants.keys().next().cloned();
            if let Some(k) = evicted {
                grants.remove(&k);
            }
        }
        grants.insert(
            key.to_string(),
            Remembered {
                grant,
                proof,
                released: false,
            },
        );
    }

    /// After the release of `grant` of `key`: kept for the next acquire if
    /// `cleanly` (our own release went through), else forgotten.
    pub fn released(&self, key: &str, grant: u64, cleanly: bool) {
        let mut grants = self.grants.lock().expect("poisoned");
        match grants.get_mut(key) {
            Some(r) if r.grant == grant && cleanly => r.released = true,
            Some(r) if r.grant == grant => {
                grants.remove(key);
            }
            _ => {}
        }
    }

    /// The last grant of `key` and its proof, if it was released cleanly:
    /// taken, so one acquire uses it. A grant still held stays.
    pub fn take_released(&self, key: &str) -> Option<(u64, P)> {
        let mut grants = self.grants.lock().expect("poisoned");
        match grants.get(key) {
            Some(r) if r.released => grants.remove(key).map(|r| (r.grant, r.proof)),
            _ => None,
        }
    }
}

/// Per lock, our last grant that found nobody else in line, for a store
/// whose every write takes the next number of one cluster-wide counter
/// (etcd's revision, Consul's raft index): what lets a repeat acquire
/// leave out its read, so that its cycle costs what the floor costs.
///
/// If our grant at `g` found nobody else in line, our release was one
/// write, and our next entry is written at `g + 2`, the one write in
/// between was our release: nothing else was written anywhere, so still
/// nobody else is in line ([`LastGrant::alone_at`]). Any other number (a
/// write anywhere in the cluster) makes the acquire read the lock after
/// all, one request more; so the read is left out only after a cycle that
/// found the cluster that quiet ([`LastGrant::quiet`]), and on a busy
/// cluster the read stays in the acquire instead of following it.
#[derive(Debug)]
pub struct QuietGrants {
    grants: GrantMemory<bool>,
}

/// A grant remembered by [`QuietGrants`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastGrant {
    /// The counter value of our entry at the grant.
    pub grant: u64,
    /// Whether that grant came two writes after the one before it (its
    /// cycle's release and the grant were the only writes): the next
    /// acquire then leaves out its read.
    pub quiet: bool,
}

impl LastGrant {
    /// Whether our new entry, written at `at`, is alone in line: the only
    /// write since our grant was our release.
    pub fn alone_at(&self, at: u64) -> bool {
        self.grant.checked_add(2) == Some(at)
    }
}

impl QuietGrants {
    /// An empty memory of at most `capacity` locks.
    pub fn new(capacity: usize) -> Self {
        QuietGrants {
            grants: GrantMemory::new(capacity),
        }
    }

    /// The last grant of `key`, if it was released by one write of ours:
    /// taken, so one acquire uses it.
    pub fn take(&self, key: &str) -> Option<LastGrant> {
        let (grant, quiet) = self.grants.take_released(key)?;
        Some(LastGrant { grant, quiet })
    }

    /// Remembers our grant at `grant` of `key`, which found nobody else in
    /// line; `last`: what this acquire took with [`QuietGrants::take`].
    pub fn keep(&self, key: &str, last: Option<LastGrant>, grant: u64) {
        let quiet = last.is_some_and(|l| l.alone_at(grant));
        self.grants.keep(key, grant, quiet);
    }

    /// After the release of `grant` of `key`: remembered for the next
    /// acquire only if `one_write` (our release went through as one write).
    pub fn released(&self, key: &str, grant: u64, one_write: bool) {
        self.grants.released(key, grant, one_write);
    }
}

/// The locks whose last acquire by us met other contenders: what lets
/// the next acquire of such a lock go straight to the work a contended
/// acquire needs instead of first trying what only pays off on a free
/// lock (Consul: the one-txn take of a free `.lock`; etcd: the read of
/// what it waits for, in the enqueue txn rather than after it), while an
/// acquire of a lock not met contended (the thousands of distinct locks
/// of a bulk holder) keeps the cheaper request. Bounded: past `capacity`
/// locks, all are forgotten at once.
#[derive(Debug)]
pub struct ContendedLocks {
    capacity: usize,
    locks: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl ContendedLocks {
    /// An empty memory of at most `capacity` locks.
    pub fn new(capacity: usize) -> Self {
        ContendedLocks {
            capacity,
            locks: Default::default(),
        }
    }

    /// Whether our last acquire of `key` met other contenders.
    pub fn contains(&self, key: &str) -> bool {
        self.locks.lock().expect("poisoned").contains(key)
    }

    /// Records whether an acquire of `key` met other contenders.
    pub fn note(&self, key: &str, contended: bool) {
        let mut locks = self.locks.lock().expect("poisoned");
        if !contended {
            locks.remove(key);
        } else if !locks.contains(key) {
            if locks.len() >= self.capacity {
                locks.clear();
            }
            locks.insert(key.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contended_locks_are_remembered_until_met_free_or_too_many() {
        let c = ContendedLocks::new(2);
        assert!(!c.contains("a"));
        c.note("a", true);
        assert!(c.contains("a"));
        c.note("a", false);
        assert!(!c.contains("a"), "met free");
        c.note("a", true);
        c.note("b", true);
        c.note("b", true);
        assert!(
            c.contains("a") && c.contains("b"),
            "b noted twice is one lock"
        );
        c.note("c", true);
        assert!(c.contains("c"));
        assert!(
            !c.contains("a") && !c.contains("b"),
            "past capacity, forgotten"
        );
    }

    #[test]
    fn grant_memory_hands_over_only_cleanly_released_grants() {
        let m = GrantMemory::new(2);
        m.keep("a", 7, "proof");
        assert_eq!(m.take_released("a"), None, "still held");
        m.released("a", 6, true); // another grant: ignored
        assert_eq!(m.take_released("a"), None, "still held");
        m.released("a", 7, true);
        assert_eq!(m.take_released("a"), Some((7, "proof")));
        assert_eq!(m.take_released("a"), None, "taken once");
        m.keep("a", 8, "proof");
        m.released("a", 8, false);
        assert_eq!(m.take_released("a"), None, "not released cleanly");
        for (k, g) in [("a", 1), ("b", 2), ("c", 3)] {
            m.keep(k, g, "proof");
            m.released(k, g, true);
        }
        let kept = ["a", "b", "c"]
            .iter()
            .filter(|k| m.take_released(k).is_some())
            .count();
        assert_eq!(kept, 2, "at most `capacity` locks");
    }

    #[test]
    fn quiet_grants_count_the_writes_between_two_grants() {
        let m = QuietGrants::new(4);
        assert_eq!(m.take("a"), None);
        m.keep("a", None, 10);
        m.released("a", 10, true);
        let last = m.take("a").unwrap();
        assert_eq!(
            last,
            LastGrant {
                grant: 10,
                quiet: false
            }
        );
        assert!(last.alone_at(12), "grant, our release, our entry");
        assert!(!last.alone_at(13), "one more write in between");
        assert!(!last.alone_at(11));
        m.keep("a", Some(last), 12);
        m.released("a", 12, true);
        let quiet = m.take("a").unwrap();
        assert!(quiet.quiet, "the cycle from 10 to 12 was quiet");
        m.keep("a", Some(quiet), 15);
        m.released("a", 15, true);
        assert!(
            !m.take("a").unwrap().quiet,
            "a write came between 12 and 15"
        );
        m.keep("a", None, 20);
        m.released("a", 20, false);
        assert_eq!(m.take("a"), None, "not released by one write");
        assert!(!LastGrant {
            grant: u64::MAX,
            quiet: true
        }
        .alone_at(1));
    }
}
