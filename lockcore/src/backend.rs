//! The backend contract: what a store crate implements.
//!
//! The client layer ([`crate::LockClient`]) owns everything that is the
//! same on every store: the per-name local queue (one store contender per
//! client and name), reentrancy, timeouts, cancel safety (abandon on drop),
//! the background release queue, session replacement, and the local
//! deadline. A backend only speaks its store's protocol.
//!
//! How the three stores map onto it:
//!
//! | step | ZooKeeper | etcd | Consul |
//! |---|---|---|---|
//! | [`Backend::open_session`] | connect (one ZK session) | `LeaseGrant` + keepalive stream | `session/create` + renew loop |
//! | [`StoreSession::acquire`] | create2 `_c_<id>-lock-`, list, watch predecessor | put `<pfx>/<lease>` in a txn, watch older key | contender key, block on predecessor, txn `lock` on `.lock` |
//! | [`StoreSession::release`] | delete our node | delete our key (guarded by create revision) | txn `unlock` + delete contender |
//! | [`StoreSession::abandon`] | find node by GUID, delete | delete `<pfx>/<lease>` | delete contender, release if held |
//! | loss of an entry | watch on own node | watch on own key | blocking query on `.lock` |
//! | token | `czxid` | `create_revision` | `ModifyIndex` of the lock write |

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

pub use crate::inflight::{finish_on_drop, InFlightWrites};
use crate::signal::{EntrySignals, SessionLiveness};
use crate::{LockName, Result};

/// How long after a grant a backend may wait before it starts watching the
/// held entry (see the [`StoreSession`] contract). Most locks are held for
/// less: their cycle then costs the store's two writes and nothing more.
/// A forced break or revoke request in the first moments of a hold is
/// reported up to this much later; session expiry is not affected (the
/// local deadline does not depend on watches).
pub const HELD_WATCH_DELAY: Duration = Duration::from_millis(20);

/// Items that come due a fixed delay after they were pushed: one timer
/// (the front's due time) serves them all, since they come due in push
/// order. A backend's watch task keeps its not-yet-watched held entries
/// in one.
#[derive(Debug)]
pub struct DelayQueue<T> {
    delay: Duration,
    items: std::collections::VecDeque<(tokio::time::Instant, T)>,
}

impl<T> DelayQueue<T> {
    /// An empty queue whose items come due `delay` after their push.
    pub fn new(delay: Duration) -> Self {
        DelayQueue {
            delay,
            items: std::collections::VecDeque::new(),
        }
    }

    /// Adds `item`, due `delay` from now.
    pub fn push(&mut self, item: T) {
        let due = tokio::time::Instant::now() + self.delay;
        self.items.push_back((due, item));
    }

    /// When the next item comes due; `None` if the queue is empty.
    pub fn next_due(&self) -> Option<tokio::time::Instant> {
        self.items.front().map(|(due, _)| *due)
    }

    /// Takes the next item if it is due by now.
    pub fn pop_due(&mut self) -> Option<T> {
        let now = tokio::time::Instant::now();
        match self.items.front() {
            Some((due, _)) if *due <= now => self.items.pop_front().map(|(_, item)| item),
            _ => None,
        }
    }

    /// Whether no item waits.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

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

/// What a backend supports; the conformance suite runs only the cases a
/// backend declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// [`Backend::kill_session`] works on sessions of other clients (on
    /// ZooKeeper, only on sessions opened in the same process: the server
    /// closes a session only for a client that knows its password).
    pub kill_session: bool,
    /// Read-write locks.
    pub rwlock: bool,
    /// Counting semaphores.
    pub semaphore: bool,
    /// The session TTL in force (the loss signal fires within about this).
    pub session_ttl: Duration,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            kill_session: true,
            rwlock: false,
            semaphore: false,
            session_ttl: Duration::from_secs(10),
        }
    }
}

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
}

/// One attempt to acquire, as the client layer hands it to a backend.
///
/// `contender` is fresh for every attempt and is written into the entry
/// where the layout allows (ZooKeeper's `_c_<uuid>`), so that an entry
/// whose create reply was lost can be found again and never duplicated.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    /// The validated lock name (without the namespace).
    pub name: LockName,
    /// Mutex, read, write or semaphore.
    pub kind: LockKind,
    /// A fresh UUID for this attempt.
    pub contender: uuid::Uuid,
    /// `false` for try-acquire: if the lock is not free at once, remove our
    /// entry and return [`crate::ErrorKind::WouldBlock`].
    pub wait: bool,
    /// Where the backend reports loss of the entry and revoke requests.
    pub signals: EntrySignals,
    /// The attempt's writes in flight: the backend runs every write that
    /// creates the attempt's entry through it, and the client layer waits
    /// for them before it abandons the attempt.
    pub writes: InFlightWrites,
}

impl AcquireRequest {
    /// A new attempt with a fresh contender id and fresh signals.
    pub fn new(name: LockName, kind: LockKind, wait: bool) -> Self {
        AcquireRequest {
            name,
            kind,
            contender: uuid::Uuid::new_v4(),
            wait,
            signals: EntrySignals::new(),
            writes: InFlightWrites::default(),
        }
    }
}

/// A granted entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    /// The fencing token: strictly increasing across successive holders
    /// of the same lock on the same cluster.
    pub token: u64,
    /// The store's name for our entry (node path, key), for release and
    /// for diagnostics.
    pub entry: String,
}

/// A store: admin operations, and the factory of sessions.
///
/// # Contract
/// - Object safe; used as `Arc<dyn Backend>`. One instance serves one
///   [`crate::LockClient`] and its namespace (the URL path).
/// - Nothing is written to the store for invalid input: names are already
///   validated, configuration is validated in `from_url`.
/// - [`Backend::requests_sent`] counts every request sent to the store by
///   this instance (keepalives and watches included), for herd and cost
///   tests.
///
/// # Cancel safety
/// Every async method may be dropped at any await point; a dropped
/// `open_session` may leave a session on the store that then expires by
/// its TTL, nothing else.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// What this backend supports.
    fn capabilities(&self) -> Capabilities;

    /// The store's URL with secrets redacted, for logs and `Display`.
    fn describe(&self) -> String;

    /// Opens one store session and starts the one background task that
    /// keeps it alive.
    ///
    /// # Contract
    /// - Before returning `Ok`, call `liveness.confirm(sent_at, ttl)` with
    ///   the send time of the request that created the session.
    /// - While alive, confirm every successful keepalive with the send time
    ///   of that keepalive; when the store says the session is gone, call
    ///   `liveness.lose(LossReason::SessionExpired)`.
    /// - Stop the keepalive when [`StoreSession::close`] is called or the
    ///   session is lost.
    async fn open_session(&self, liveness: Arc<SessionLiveness>) -> Result<Arc<dyn StoreSession>>;

    /// Holders and waiters of `name`, holders first, waiters in queue order.
    async fn inspect(&self, name: &LockName) -> Result<LockState>;

    /// Forced break: deletes the holders' entries (every reader of a
    /// read-write lock, every permit of a semaphore). The holders' guards
    /// report [`crate::LossReason::EntryDeleted`]. Returns whether anything
    /// was held.
    async fn break_lock(&self, name: &LockName) -> Result<bool>;

    /// Every lock under `prefix` that someone holds or waits for, as
    /// [`Backend::inspect`] reports it, sorted by name: `prefix` itself and
    /// the names nested under it (`prefix/...`, whole segments only: `a`
    /// does not cover `ab`), or every lock of the namespace for `None`.
    /// Free locks are left out, so an empty parent node or key that a
    /// store keeps is never reported as a lock.
    ///
    /// Admin and diagnostics only (`quorumlock list`): a store has no index
    /// of lock names, so this reads the prefix's whole subtree. The
    /// default is for wrappers that do not forward it: it fails with
    /// [`crate::ErrorKind::Store`].
    async fn list(&self, prefix: Option<&LockName>) -> Result<Vec<LockState>> {
        let _ = prefix;
        Err(crate::Error::new(
            crate::ErrorKind::Store,
            format!("{}: this backend cannot list locks", self.describe()),
        ))
    }

    /// Cooperative revoke: marks the current holders so that their guards'
    /// `revoke_requested()` fires. Returns whether anything was held.
    async fn request_revoke(&self, name: &LockName) -> Result<bool>;

    /// Ends a session on the store, as an operator or a server would;
    /// every lock of it is lost. `session` is [`StoreSession::id`].
    /// Idempotent: a session that is already gone is `Ok`; an id that is
    /// not of this store's form is [`crate::ErrorKind::InvalidArgument`].
    async fn kill_session(&self, session: &str) -> Result<()>;

    /// What of ours is still on the store: entries (contenders, holders,
    /// revoke markers) under the namespace, and sessions opened by this
    /// instance that the store still has. Empty parents and containers
    /// that the store reaps by itself are not reported.
    async fn leftovers(&self) -> Result<Vec<String>>;

    /// Requests sent to the store by this instance so far.
    fn requests_sent(&self) -> u64;
}

/// One store session (ZooKeeper session, etcd lease, Consul session).
///
/// # Contract
/// - At most one entry per request at any time. For `Exclusive` and
///   `Semaphore` the client layer sends at most one request per (session,
///   name) at a time, so layouts that key those entries by session (etcd,
///   Consul) are safe; `Read` and `Write` requests of one session may
///   overlap on one name.
/// - `acquire` returns only when our entry holds the lock, after checking
///   that the entry still exists (a waiter whose session expired while
///   queued is never granted). While the entry is held, the backend
///   watches it and calls `req.signals.lose(..)` if it disappears, and
///   `req.signals.request_revoke()` on a cooperative revoke, until
///   `req.signals.finished()` resolves. The watch may start up to
///   [`HELD_WATCH_DELAY`] after the grant, so that a short hold costs no
///   watch request; what happened to the entry in between must then be
///   read from the store (replayed or re-read), never missed: only its
///   report may come that much later.
///   The client layer calls `finish()` *before* it asks the backend to
///   release or abandon the entry, so a watcher never mistakes our own
///   delete for a loss.
/// - An attempt that fails for good (`Conflict`, credentials) should
///   remove its own entry first; the client layer also calls `abandon`
///   before returning any error other than `WouldBlock`.
/// - On `wait == false`, an entry that does not hold at once is removed
///   before returning `WouldBlock`.
/// - Waiting is herd-free: a release wakes the next waiter only.
///
/// # Cancel safety
/// `acquire` may be dropped at any await point, including while a create
/// is in flight. The client layer then calls [`StoreSession::abandon`]
/// with the same request, which must find and remove whatever the attempt
/// wrote. `release` and `abandon` are idempotent and may be retried.
#[async_trait]
pub trait StoreSession: Send + Sync + fmt::Debug + 'static {
    /// The store's id of the session (lease id in hex, ZK session id,
    /// Consul session UUID).
    fn id(&self) -> String;

    /// Enqueues and waits until the request holds the lock.
    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired>;

    /// Removes a held entry. Must not remove anything else (a newer entry
    /// of the same session on the same name, etcd #22082).
    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()>;

    /// Removes whatever an unfinished `acquire` of `req` wrote, if anything.
    async fn abandon(&self, req: &AcquireRequest) -> Result<()>;

    /// Ends the session on the store (best effort) and stops its keepalive.
    /// The client layer calls it once, as soon as the session is lost for
    /// any reason (local deadline, expiry, client closed or dropped), so a
    /// client library's own reconnect logic must not keep it alive.
    async fn close(&self) -> Result<()>;
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

    #[tokio::test(start_paused = true)]
    async fn delay_queue_gives_items_in_order_once_due() {
        let mut q = DelayQueue::new(Duration::from_millis(20));
        assert_eq!(q.next_due(), None);
        q.push(1);
        tokio::time::advance(Duration::from_millis(5)).await;
        q.push(2);
        assert_eq!(q.pop_due(), None, "nothing is due before its delay");
        let first = q.next_due().unwrap();
        tokio::time::sleep_until(first).await;
        assert_eq!(q.pop_due(), Some(1));
        assert_eq!(q.pop_due(), None, "the second is due 5 ms later");
        tokio::time::advance(Duration::from_millis(5)).await;
        assert_eq!(q.pop_due(), Some(2));
        assert!(q.is_empty());
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
