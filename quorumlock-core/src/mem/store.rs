//! The shared in-process state of one `mem://` store.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::queue::{self, Contender, LockKind};
use crate::signal::{EntrySignals, LossReason, SessionLiveness};

/// Stores by name, shared by every client of this process that names them.
pub(super) fn store(name: &str) -> Arc<MemStore> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Weak<MemStore>>>> = OnceLock::new();
    let mut reg = REGISTRY
        .get_or_init(Default::default)
        .lock()
        .expect("registry poisoned");
    if let Some(s) = reg.get(name).and_then(Weak::upgrade) {
        return s;
    }
    reg.retain(|_, w| w.strong_count() > 0);
    let s = Arc::new(MemStore::default());
    reg.insert(name.to_string(), Arc::downgrade(&s));
    s
}

#[derive(Debug, Default)]
pub(super) struct MemStore {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
pub(super) struct State {
    last_index: u64,
    last_session: u64,
    sessions: HashMap<u64, SessionRec>,
    /// Queue per full key (namespace + name), ordered by index.
    queues: BTreeMap<String, Vec<Entry>>,
    /// The store's own key space, for fenced writes.
    kv: BTreeMap<String, Vec<u8>>,
    /// Change counters of the queues someone follows
    /// ([`crate::backend::Backend::changes`]), by key.
    followed: HashMap<String, tokio::sync::watch::Sender<u64>>,
}

#[derive(Debug)]
struct SessionRec {
    ttl: Duration,
    expires: Instant,
    liveness: Weak<SessionLiveness>,
}

#[derive(Debug)]
pub(super) struct Entry {
    index: u64,
    session: u64,
    contender: uuid::Uuid,
    kind: LockKind,
    /// The contender whose upgradeable entry this upgrade entry upgrades.
    upgrades: Option<uuid::Uuid>,
    signals: EntrySignals,
    wake: Arc<Notify>,
    created: SystemTime,
    value: Vec<u8>,
}

/// Where an entry stands in its queue.
pub(super) enum Standing {
    /// Gone (released, broken, or its session expired).
    Gone,
    /// First in the queue: holds the lock.
    Holds,
    /// An upgrade to refuse ([`crate::queue::upgrade_refused`]).
    Refused,
    /// Behind others; the entry ahead belongs to a session that expires
    /// at the given instant unless renewed.
    Waits { ahead_expires: Instant },
}

impl MemStore {
    /// Locks the state, first expiring sessions whose TTL ran out.
    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, State> {
        let mut st = self.state.lock().expect("mem store poisoned");
        st.expire_due(Instant::now());
        st
    }
}

impl State {
    pub(super) fn open_session(&mut self, ttl: Duration, liveness: &Arc<SessionLiveness>) -> u64 {
        self.last_session += 1;
        self.sessions.insert(
            self.last_session,
            SessionRec {
                ttl,
                expires: Instant::now() + ttl,
                liveness: Arc::downgrade(liveness),
            },
        );
        self.last_session
    }

    /// Renews a session; false if it no longer exists.
    pub(super) fn renew(&mut self, id: u64) -> bool {
        match self.sessions.get_mut(&id) {
            Some(s) => {
                s.expires = Instant::now() + s.ttl;
                true
            }
            None => false,
        }
    }

    pub(super) fn session_exists(&self, id: u64) -> bool {
        self.sessions.contains_key(&id)
    }

    /// Ends a session: its entries go, their holders and the session's
    /// client learn of it at once.
    pub(super) fn end_session(&mut self, id: u64, reason: LossReason) -> bool {
        let Some(rec) = self.sessions.remove(&id) else {
            return false;
        };
        if let Some(l) = rec.liveness.upgrade() {
            l.lose(reason);
        }
        let keys: Vec<String> = self.queues.keys().cloned().collect();
        for key in keys {
            self.remove_where(&key, |e| e.session == id, Some(reason));
        }
        true
    }

    fn expire_due(&mut self, now: Instant) {
        let due: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.expires <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            tracing::debug!(session = id, "mem session expired");
            self.end_session(id, LossReason::SessionExpired);
        }
    }

    /// Appends the entries of `req` (`req.count` of them: the permits of
    /// one request, side by side), or says why not: the session is gone
    /// (`SessionLost`), or the queue holds entries of an incompatible kind
    /// (`Conflict`: a semaphore with another permit count, or a semaphore
    /// mixed with locks).
    pub(super) fn enqueue(
        &mut self,
        key: &str,
        session: u64,
        req: &crate::backend::AcquireRequest,
    ) -> crate::Result<(u64, Arc<Notify>)> {
        let kind = req.kind;
        if !self.sessions.contains_key(&session) {
            return Err(crate::Error::new(
                crate::ErrorKind::SessionLost,
                "mem session expired",
            ));
        }
        if let Some(other) = self.queues.get(key).and_then(|q| q.first()) {
            if kind.conflicts_with(other.kind) {
                return Err(crate::Error::new(
                    crate::ErrorKind::Conflict,
                    format!("{key} is in use as {:?}, not {kind:?}", other.kind),
                ));
            }
        }
        let wake = Arc::new(Notify::new());
        let q = self.queues.entry(key.to_string()).or_default();
        for _ in 0..req.count.max(1) {
            self.last_index += 1;
            q.push(Entry {
                index: self.last_index,
                session,
                contender: req.contender,
                kind,
                upgrades: req.upgrades,
                signals: req.signals.clone(),
                wake: wake.clone(),
                created: SystemTime::now(),
                value: req.value.clone(),
            });
        }
        self.changed(key);
        Ok((self.last_index, wake))
    }

    pub(super) fn standing(&self, key: &str, index: u64) -> Standing {
        let Some(q) = self.queues.get(key) else {
            return Standing::Gone;
        };
        match q.iter().position(|e| e.index == index) {
            None => Standing::Gone,
            Some(i) if refused(q, i) => Standing::Refused,
            Some(i) if holds(q, i) => Standing::Holds,
            Some(i) => {
                let ahead_expires = q[..i]
                    .iter()
                    .filter_map(|e| self.sessions.get(&e.session).map(|s| s.expires))
                    .min()
                    .unwrap_or_else(Instant::now);
                Standing::Waits { ahead_expires }
            }
        }
    }

    /// Removes the entries of `key` matching `pred`. If the head went, the
    /// new head alone is woken (herd-free). Removed entries are told
    /// `lost` when a reason is given (break, expiry), not on release.
    pub(super) fn remove_where(
        &mut self,
        key: &str,
        pred: impl Fn(&Entry) -> bool,
        lost: Option<LossReason>,
    ) -> usize {
        let Some(q) = self.queues.get_mut(key) else {
            return 0;
        };
        let holders_before = holder_indexes(q);
        let mut removed = 0;
        q.retain(|e| {
            if pred(e) {
                if let Some(r) = lost {
                    e.signals.lose(r);
                }
                removed += 1;
                false
            } else {
                true
            }
        });
        if removed > 0 {
            self.changed(key);
        }
        let Some(q) = self.queues.get_mut(key) else {
            return removed;
        };
        if q.is_empty() {
            self.queues.remove(key);
            return removed;
        }
        // Herd-free: wake only the entries that hold now and did not
        // before, and upgrades to refuse.
        for (i, e) in q.iter().enumerate() {
            if (holds(q, i) && !holders_before.contains(&e.index)) || refused(q, i) {
                e.wake.notify_one();
            }
        }
        removed
    }

    pub(super) fn remove_index(&mut self, key: &str, index: u64) -> usize {
        self.remove_where(key, |e| e.index == index, None)
    }

    pub(super) fn remove_contender(&mut self, key: &str, contender: uuid::Uuid) -> usize {
        self.remove_where(key, |e| e.contender == contender, None)
    }

    /// Sets the value of the entry `index` of `key`; false if it is gone.
    pub(super) fn set_value(&mut self, key: &str, index: u64, value: &[u8]) -> bool {
        let entry = self
            .queues
            .get_mut(key)
            .and_then(|q| q.iter_mut().find(|e| e.index == index));
        match entry {
            Some(e) => {
                e.value = value.to_vec();
                self.changed(key);
                true
            }
            None => false,
        }
    }

    /// Follows the queue of `key`: the receiver sees a new count at each
    /// change from now on.
    pub(super) fn follow(&mut self, key: &str) -> tokio::sync::watch::Receiver<u64> {
        self.followed
            .entry(key.to_string())
            .or_insert_with(|| tokio::sync::watch::channel(0).0)
            .subscribe()
    }

    /// When the first session owning an entry of `key` expires unless
    /// renewed: the store expires sessions when it is next touched, so a
    /// follower touches it then.
    pub(super) fn next_expiry(&self, key: &str) -> Option<Instant> {
        self.queues
            .get(key)?
            .iter()
            .filter_map(|e| self.sessions.get(&e.session).map(|s| s.expires))
            .min()
    }

    /// Tells the followers of `key` that its queue changed.
    fn changed(&mut self, key: &str) {
        if let Some(tx) = self.followed.get(key) {
            if tx.receiver_count() == 0 {
                self.followed.remove(key);
            } else {
                tx.send_modify(|n| *n += 1);
            }
        }
    }

    /// Whether the entry `index` of the lock `key` is still in its queue.
    pub(super) fn entry_exists(&self, key: &str, index: u64) -> bool {
        self.queues
            .get(key)
            .is_some_and(|q| q.iter().any(|e| e.index == index))
    }

    pub(super) fn kv_get(&self, key: &str) -> Option<Vec<u8>> {
        self.kv.get(key).cloned()
    }

    pub(super) fn kv_write(&mut self, write: &crate::backend::KeyWrite) {
        match write {
            crate::backend::KeyWrite::Put { key, value } => {
                self.kv.insert(key.clone(), value.clone());
            }
            crate::backend::KeyWrite::Delete { key } => {
                self.kv.remove(key);
            }
        }
    }

    /// Breaks the lock: the holders' entries go and their guards are told.
    pub(super) fn break_holders(&mut self, key: &str) -> bool {
        let holders = self
            .queues
            .get(key)
            .map(|q| holder_indexes(q))
            .unwrap_or_default();
        self.remove_where(
            key,
            |e| holders.contains(&e.index),
            Some(LossReason::EntryDeleted),
        ) > 0
    }

    pub(super) fn revoke_holders(&mut self, key: &str) -> bool {
        let Some(q) = self.queues.get(key) else {
            return false;
        };
        let mut any = false;
        for (i, e) in q.iter().enumerate() {
            if holds(q, i) {
                e.signals.request_revoke();
                any = true;
            }
        }
        any
    }

    /// Holders and waiters of `key`, each in queue order.
    pub(super) fn contenders(&self, key: &str) -> (Vec<Contender>, Vec<Contender>) {
        let (mut holders, mut waiters) = (Vec::new(), Vec::new());
        let Some(q) = self.queues.get(key) else {
            return (holders, waiters);
        };
        for (i, e) in q.iter().enumerate() {
            let c = Contender {
                session: session_id(e.session),
                token: e.index,
                entry: entry_name(key, e.index),
                kind: e.kind,
                since: Some(e.created),
                value: e.value.clone(),
            };
            if holds(q, i) {
                holders.push(c);
            } else {
                waiters.push(c);
            }
        }
        (holders, waiters)
    }

    /// Keys of the non-empty queues under `under` (the namespace prefix,
    /// `""` or `ns/`) that are `key` or nested under it (`key/...`), or all
    /// of them for `None`; in key order.
    pub(super) fn keys_under(&self, under: &str, key: Option<&str>) -> Vec<String> {
        self.queues
            .iter()
            .filter(|(k, q)| {
                !q.is_empty()
                    && k.starts_with(under)
                    && key.is_none_or(|key| {
                        k.as_str() == key || k.strip_prefix(key).is_some_and(|r| r.starts_with('/'))
                    })
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Entries under `prefix`, as entry names.
    pub(super) fn entries_under(&self, prefix: &str) -> Vec<String> {
        self.queues
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .flat_map(|(k, q)| q.iter().map(move |e| entry_name(k, e.index)))
            .collect()
    }
}

/// Whether entry `i` of a queue holds, by [`crate::queue::holds`]; the
/// entries of one contender (the permits of one request, side by side)
/// hold together, when the last of them does; an upgrade holds beside
/// the entry it upgrades.
fn holds(q: &[Entry], i: usize) -> bool {
    let kinds: Vec<LockKind> = q.iter().map(|e| e.kind).collect();
    queue::holds_linked(
        &kinds,
        i,
        |a, b| q[a].contender == q[b].contender,
        |a, b| q[a].upgrades == Some(q[b].contender),
    )
}

/// Whether entry `i` is an upgrade to refuse.
fn refused(q: &[Entry], i: usize) -> bool {
    // Cheap first: called for every entry on every queue change.
    if q[i].kind != LockKind::Upgrade {
        return false;
    }
    let kinds: Vec<LockKind> = q.iter().map(|e| e.kind).collect();
    queue::upgrade_refused(&kinds, i, |a, b| q[a].upgrades == Some(q[b].contender))
}

fn holder_indexes(q: &[Entry]) -> Vec<u64> {
    (0..q.len())
        .filter(|&i| holds(q, i))
        .map(|i| q[i].index)
        .collect()
}

/// The text id of a mem session.
pub(super) fn session_id(id: u64) -> String {
    format!("mem-{id:x}")
}

/// Parses [`session_id`]'s text back.
pub(super) fn parse_session_id(s: &str) -> Option<u64> {
    u64::from_str_radix(s.strip_prefix("mem-")?, 16).ok()
}

pub(super) fn entry_name(key: &str, index: u64) -> String {
    format!("{key}#{index}")
}

/// The lock key and index of an [`entry_name`].
pub(super) fn parse_entry_name(entry: &str) -> Option<(&str, u64)> {
    let (key, index) = entry.rsplit_once('#')?;
    Some((key, index.parse().ok()?))
}
