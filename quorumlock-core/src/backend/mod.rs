//! The backend contract: what a store crate implements.
//!
//! **Unstable.** This module is the service-provider interface between the
//! client layer and the store crates, not the API for using locks (that is
//! [`crate::LockClient`] and what it returns). It changes whenever a store
//! needs it to, in any release, without a deprecation period; only the
//! backends of this workspace are kept in step. Depend on it (to write a
//! store of your own, or to wrap one for tests) with an exact version
//! requirement (`=0.1.0`).
//!
//! The client layer ([`crate::LockClient`]) owns everything that is the
//! same on every store: the per-name local queue (one store contender per
//! client and name), reentrancy, timeouts, cancel safety (abandon on drop),
//! the background release queue, session replacement, and the local
//! deadline. A backend only speaks its store's protocol.
//!
//! How the stores map onto it (Redis: see `quorumlock-redis`'s README):
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
use std::time::Duration;

use async_trait::async_trait;

mod changes;
pub mod connect;
mod delay;
mod fenced;
mod grants;
mod namespace;
mod retry;
pub mod schemes;

pub use crate::inflight::{finish_on_drop, InFlightWrites};
pub use crate::queue::{
    holds, holds_linked, holds_together, upgrade_refused, waits_for, waits_for_linked,
};
pub use crate::signal::{EntrySignals, SessionLiveness};
pub use changes::{notified_feed, Notice, SessionExpiries, FEED_HEARTBEAT};
pub use delay::{DelayQueue, HELD_WATCH_DELAY};
pub use fenced::{check_kinds, refused, HeldEntry, KeyForm, KeyWrite, MAX_KEY_LEN};
pub use grants::{ContendedLocks, GrantMemory, LastGrant, QuietGrants};
pub use namespace::Namespace;
pub use retry::Backoff;

/// The error of an upgrade the queue rule refuses
/// ([`crate::queue::upgrade_refused`]), after its entry was removed.
pub fn refused_upgrade(name: &LockName) -> crate::Error {
    crate::Error::new(
        crate::ErrorKind::UpgradeRefused,
        format!(
            "{name}: the upgradeable read hold is gone from the store, or a reader waits \
             behind a writer that waits for it (upgrading now could let that reader in \
             beside the write): try again once the writer has gone, or release and queue \
             for writing"
        ),
    )
}

use crate::{LockKind, LockName, LockState, Result};

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
    /// [`StoreSession::set_value`] works: an election leader can
    /// `proclaim` a new value.
    pub proclaim: bool,
    /// [`Backend::changes`] follows the store's own change notification
    /// (else watchers poll).
    pub changes: bool,
    /// A semaphore request may take several permits at once
    /// ([`AcquireRequest::count`] above 1).
    pub acquire_many: bool,
    /// Upgradeable read holds ([`LockKind::Upgradeable`]) and their
    /// upgrades ([`LockKind::Upgrade`], linked by
    /// [`AcquireRequest::upgrades`]).
    pub upgradeable_read: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            kill_session: true,
            rwlock: false,
            semaphore: false,
            session_ttl: Duration::from_secs(10),
            proclaim: false,
            changes: false,
            acquire_many: false,
            upgradeable_read: false,
        }
    }
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
    /// The holder's value, written into the entry the store's native way
    /// (the etcd key's value, the ZooKeeper node's data, a field of the
    /// Consul key's value) and reported back by `inspect` as
    /// [`crate::Contender::value`].
    pub value: Vec<u8>,
    /// How many permits of a semaphore this attempt takes, at least 1;
    /// above 1 only for a backend with [`Capabilities::acquire_many`].
    /// The backend then places `count` entries of this contender in one
    /// atomic step, next to each other in the queue, and grants when the
    /// last of them holds (so all of them do): never part of them, and in
    /// arrival order with every other request. [`Acquired`] names the
    /// last entry; `release` and `abandon` remove all of them.
    pub count: u32,
    /// For an [`LockKind::Upgrade`]: the contender id of the upgradeable
    /// hold it upgrades, on the same session. The backend writes it into
    /// the entry, so that the queue rule
    /// ([`waits_for_linked`]) lets the
    /// upgrade hold beside that entry alone.
    pub upgrades: Option<uuid::Uuid>,
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
            value: Vec::new(),
            count: 1,
            upgrades: None,
        }
    }

    /// The same request taking `count` permits at once.
    pub fn with_count(mut self, count: u32) -> Self {
        self.count = count;
        self
    }

    /// The same request with the holder's value `value`.
    pub fn with_value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.value = value.into();
        self
    }
}

/// A lock's changes as the store notifies them: see [`Backend::changes`].
pub type ChangeFeed = futures::stream::BoxStream<'static, Result<()>>;

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
    /// of lock names, so this reads the prefix's whole subtree.
    async fn list(&self, prefix: Option<&LockName>) -> Result<Vec<LockState>>;

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

    /// Applies `write` in one store transaction that also checks every
    /// entry of `held` is still on the store, unchanged; if one is not,
    /// writes nothing and returns [`crate::ErrorKind::LockLost`]
    /// ([`refused`]).
    ///
    /// # Contract
    /// - `write` is validated first ([`KeyWrite::validate`] with the
    ///   namespace's prefix, then mapped to the store's [`KeyForm`], then
    ///   the store's own key rules): [`crate::ErrorKind::InvalidArgument`]
    ///   and nothing written. A key with and one without a leading `/`
    ///   are both accepted on every store.
    /// - Holds of kinds [`check_kinds`] refuses (a semaphore permit; read
    ///   sides without an exclusive hold beside them) are refused with
    ///   `InvalidArgument`, nothing sent. Every entry of `held` of any
    ///   other kind is checked the same way: still on the store as
    ///   granted.
    /// - Idempotent to retry only if the transaction did not apply; a
    ///   transport error after sending is returned as is.
    async fn fenced_write(&self, held: &[HeldEntry], write: &KeyWrite) -> Result<()>;

    /// Reads a key of the store's own key space (what fenced writes
    /// write); `None` if absent. Same key rules and mapping as
    /// [`Backend::fenced_write`].
    async fn read_key(&self, key: &str) -> Result<Option<Vec<u8>>>;

    /// Writes a key with no fence at all: what a holder without fencing
    /// would do. For tools and for tests that show what a fence prevents.
    /// Same key rules and mapping as [`Backend::fenced_write`].
    async fn write_key(&self, write: &KeyWrite) -> Result<()>;

    /// The changes of `name`'s entries (added, removed, value rewritten),
    /// from the store's own notification; `None` where the store has none
    /// (the default; watchers then poll).
    ///
    /// # Contract
    /// - The first item comes once the watch is in place: a read started
    ///   after an item sees every change made before it, and each later
    ///   change brings another item. Changes close together may bring one
    ///   item; an item may come for no change.
    /// - While nothing changes, no request goes to the store beyond the
    ///   watch itself (a blocking query renewed, a stream kept open).
    /// - A watch that broke and was set up again yields an item (the
    ///   reader re-reads what changed meanwhile); one that cannot go on
    ///   yields `Err` and ends.
    /// - Dropping the stream ends the watch.
    fn changes(&self, name: &LockName) -> Option<ChangeFeed> {
        let _ = name;
        None
    }
}

/// The [`crate::ErrorKind::LockLost`] of a release (or proclaim) that
/// found the held entry of `req` gone from the store.
pub fn entry_gone(req: &AcquireRequest) -> crate::Error {
    crate::Error::new(
        crate::ErrorKind::LockLost,
        format!("{}: our entry is gone", req.name),
    )
}

/// A release's outcome from whether it `found` the held entry of `req`
/// (and removed it): `Ok`, or [`entry_gone`].
pub fn removed_if_found(req: &AcquireRequest, found: bool) -> crate::Result<()> {
    match found {
        true => Ok(()),
        false => Err(entry_gone(req)),
    }
}

/// One store session (ZooKeeper session, etcd lease, Consul session).
///
/// # Contract
/// - At most one entry per request at any time. For `Exclusive` the
///   client layer sends at most one request per (session, name) at a
///   time, so layouts that key mutex entries by session (etcd, Consul) are
///   safe. Up to `permits` `Semaphore` requests of one session, and any
///   number of `Read` and `Write` requests, may overlap on one name: each
///   needs an entry of its own (keyed by `contender`, or on Consul by a
///   session of its own, see that backend).
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
    ///
    /// An entry that is not on the store any more as granted (deleted or
    /// marked broken by an operator, purged, expired) is
    /// [`crate::ErrorKind::LockLost`], after whatever is left of the
    /// attempt was removed: the client layer reports it from
    /// [`LockGuard::release`](crate::LockGuard::release), the lock was
    /// lost before its release.
    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()>;

    /// Removes whatever an unfinished `acquire` of `req` wrote, if anything.
    async fn abandon(&self, req: &AcquireRequest) -> Result<()>;

    /// Rewrites the value of a held entry to `value`, only while that very
    /// entry (`held`) is still on the store: an election leader's
    /// `proclaim`. The entry keeps its place and token. A gone entry is
    /// [`crate::ErrorKind::LockLost`] and writes nothing.
    ///
    /// The default refuses with [`crate::ErrorKind::InvalidArgument`]; a
    /// backend that lays out elections implements it.
    async fn set_value(&self, req: &AcquireRequest, held: &Acquired, value: &[u8]) -> Result<()> {
        let _ = (held, value);
        Err(crate::Error::new(
            crate::ErrorKind::InvalidArgument,
            format!("this store cannot change the value of {}'s entry", req.name),
        ))
    }

    /// Ends the session on the store (best effort) and stops its keepalive.
    /// The client layer calls it once, as soon as the session is lost for
    /// any reason (local deadline, expiry, client closed or dropped), so a
    /// client library's own reconnect logic must not keep it alive.
    async fn close(&self) -> Result<()>;
}
