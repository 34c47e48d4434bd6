//! The keys of our layout and how to read them: the names of a lock's
//! keys (`.lock`, `.lock.revoke`, `.queue/`, `.rw/`, the namespace's
//! `.fence/`), their `Flags`, the view of one lock's keys with its line
//! of contenders, and the `consul lock -n N` / Go `api.Semaphore` layout
//! of a semaphore on prefix `P` (= `<ns>/<name>`):
//!
//! - `P/<session>`: one contender key per session, locked by it, flags
//!   [`SEMAPHORE_FLAGS`];
//! - `P/.lock`: not locked, flags [`SEMAPHORE_FLAGS`], value
//!   `{"Limit":N,"Holders":{"<session>":true,..}}`, changed only by
//!   check-and-set on its `ModifyIndex`. A holder whose session holds no
//!   key under `P` any more is dead and is pruned by the next writer.
//!
//! Our own revoke markers of a semaphore sit at `P/.revoke/<session>`.
//!
//! Reads nothing and writes nothing: pure functions of keys and entries.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use base64::Engine;
use quorumlock_core::backend::{holds_linked, AcquireRequest};
use quorumlock_core::{LockKind, LockName};
use serde::{Deserialize, Serialize};

use crate::api::KvEntry;
use crate::config::ConsulConfig;

/// The `Flags` value of `api.Lock` / `consul lock` on `<prefix>/.lock`.
/// A `.lock` key with other flags belongs to another recipe (for example
/// a `consul lock -n N` semaphore): acquiring reports a conflict.
pub const LOCK_FLAGS: u64 = 0x2ddc_cbc0_58a5_0c18;

/// The `Flags` of our queue (contender) keys, `<prefix>/.queue/<session>`.
pub const QUEUE_FLAGS: u64 = 0x716c_6f63_6b71_7565; // "qlockque"

/// The `Flags` of revoke markers, `<prefix>/.lock.revoke`.
pub const REVOKE_FLAGS: u64 = 0x716c_6f63_6b72_766b; // "qlockrvk"

/// The `Flags` of a read-write lock's read entries, `<prefix>/.rw/<session>-<contender>`.
pub const READ_FLAGS: u64 = 0x716c_6f63_6b72_6561; // "qlockrea"

/// The `Flags` of a read-write lock's write entries, `<prefix>/.rw/<session>-<contender>`.
pub const WRITE_FLAGS: u64 = 0x716c_6f63_6b77_7269; // "qlockwri"

/// The `Flags` of a read-write lock's upgradeable read entries,
/// `<prefix>/.rw/<session>-<contender>`.
pub const UPGRADEABLE_FLAGS: u64 = 0x716c_6f63_6b75_7072; // "qlockupr"

/// The `Flags` of an upgrade, `<prefix>/.rw/<session>-<upgraded
/// contender>.up-<contender>`: its key starts with the key of the
/// upgradeable entry it upgrades.
pub const UPGRADE_FLAGS: u64 = 0x716c_6f63_6b75_7077; // "qlockupw"

/// The `Flags` of an acquire attempt's fence, `<ns>/.fence/<session>/<contender>`:
/// written when a write of the attempt may still land after its removal;
/// every such write requires it to be absent.
pub const FENCE_FLAGS: u64 = 0x716c_6f63_6b66_6e63; // "qlockfnc"

/// `api.SemaphoreFlagValue`: the flags of a semaphore's `.lock` and
/// contender keys. A `.lock` with these flags is not a mutex.
pub const SEMAPHORE_FLAGS: u64 = 0xe0f6_9a2b_aa41_4de0;

/// The keys of one lock.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    /// `<ns>/<name>/.lock`: the key `consul lock` uses.
    pub lock: String,
    /// `<ns>/<name>/.lock.revoke`: our cooperative revoke marker (under the
    /// `.lock` prefix, so one blocking query on that prefix sees both).
    pub revoke: String,
    /// `<ns>/<name>/.queue/`: prefix of our contender keys.
    pub queue_prefix: String,
    /// `<ns>/<name>/.rw/`: prefix of read-write lock entries.
    pub rw_prefix: String,
    /// The `consul lock -n` semaphore keys on the same prefix.
    pub sem: SemKeys,
    /// `<ns>/<name>/.`: prefix of every key of this lock (and no nested
    /// lock's, since no segment of a lock's key starts with `.`).
    pub tree: String,
}

impl Keys {
    pub fn new(config: &ConsulConfig, name: &LockName) -> Keys {
        let base = config.lock_prefix(name);
        Keys {
            lock: format!("{base}/.lock"),
            revoke: format!("{base}/.lock.revoke"),
            queue_prefix: format!("{base}/.queue/"),
            rw_prefix: format!("{base}/.rw/"),
            sem: SemKeys::new(&base),
            tree: format!("{base}/."),
        }
    }

    /// The queue key of `session`.
    pub fn queue(&self, session: &str) -> String {
        format!("{}{session}", self.queue_prefix)
    }

    /// The read-write entry of one acquire attempt.
    pub fn rw_entry(&self, session: &str, contender: &impl fmt::Display) -> String {
        format!("{}{session}-{contender}", self.rw_prefix)
    }

    /// The entry of `req` by `session`: [`Keys::rw_entry`], or for an
    /// upgrade the upgradeable entry's key with `.up-<contender>`.
    pub fn request_entry(&self, session: &str, req: &AcquireRequest) -> String {
        match (req.kind, req.upgrades) {
            (LockKind::Upgrade, Some(of)) => format!(
                "{}{UPGRADE_INFIX}{}",
                self.rw_entry(session, &of),
                req.contender
            ),
            _ => self.rw_entry(session, &req.contender),
        }
    }
}

/// The revoke marker of a read-write entry.
/// Whether a `.lock` grant at `token`, taken by the session whose queue
/// key is `own`, had contenders ahead of it in `line`: entries older than
/// the grant (or than that queue key, if the taker has one), other than
/// that key. Its taker gives such a grant back and never reports it
/// (`mutex::Attempt::own_grant`), so it is not held (`inspect`).
pub(crate) fn others_ahead(line: &[(LockKind, KvEntry)], own: &str, token: u64) -> bool {
    let since = line
        .iter()
        .find(|(_, e)| e.key == own)
        .map_or(token, |(_, e)| token.min(e.create_index));
    line.iter()
        .any(|(_, e)| e.key != own && e.create_index < since)
}

pub(crate) fn rw_revoke(entry: &str) -> String {
    format!("{entry}.revoke")
}

/// What separates an upgrade's key from the key of the upgradeable
/// entry it upgrades.
const UPGRADE_INFIX: &str = ".up-";

/// The key of the upgradeable entry that the upgrade keyed `key` upgrades.
pub(crate) fn upgraded_entry(key: &str) -> Option<&str> {
    key.rsplit_once(UPGRADE_INFIX).map(|(u, _)| u)
}

/// The kind of a queue entry of our layout, by its key and flags.
pub(crate) fn entry_kind(keys: &Keys, e: &KvEntry) -> LockKind {
    if !e.key.starts_with(&keys.rw_prefix) {
        return LockKind::Exclusive;
    }
    match e.flags {
        READ_FLAGS => LockKind::Read,
        UPGRADEABLE_FLAGS => LockKind::Upgradeable,
        UPGRADE_FLAGS if upgraded_entry(&e.key).is_some() => LockKind::Upgrade,
        _ => LockKind::Write,
    }
}

/// The flags of a read-write entry of `kind`.
pub(crate) fn rw_flags(kind: LockKind) -> u64 {
    match kind {
        LockKind::Read => READ_FLAGS,
        LockKind::Upgradeable => UPGRADEABLE_FLAGS,
        LockKind::Upgrade => UPGRADE_FLAGS,
        _ => WRITE_FLAGS,
    }
}

/// Whether entry `i` of `line` upgrades entry `j`, for
/// `quorumlock_core::backend::waits_for_linked`.
pub(crate) fn upgrades(line: &[(LockKind, KvEntry)], i: usize, j: usize) -> bool {
    line[i].0 == LockKind::Upgrade && upgraded_entry(&line[i].1.key) == Some(line[j].1.key.as_str())
}

/// What the store holds for one lock.
#[derive(Debug, Clone, Default)]
pub(crate) struct View {
    /// `.lock`, if it exists.
    pub lock: Option<KvEntry>,
    /// `.lock.revoke`, if it exists.
    pub revoke: Option<KvEntry>,
    /// Our queue keys that a live session holds, by CreateIndex.
    pub queue: Vec<KvEntry>,
    /// Read-write entries that a live session holds, by CreateIndex.
    pub rw: Vec<KvEntry>,
    /// Revoke markers of read-write entries.
    pub rw_revokes: Vec<KvEntry>,
}

impl View {
    pub fn from_entries(keys: &Keys, entries: Vec<KvEntry>) -> View {
        let mut v = View::default();
        for e in entries {
            if e.key == keys.lock {
                v.lock = Some(e);
            } else if e.key == keys.revoke {
                v.revoke = Some(e);
            } else if e.key.starts_with(&keys.queue_prefix) && e.holder().is_some() {
                v.queue.push(e);
            } else if e.key.starts_with(&keys.rw_prefix) && e.key.ends_with(".revoke") {
                v.rw_revokes.push(e);
            } else if e.key.starts_with(&keys.rw_prefix) && e.holder().is_some() {
                v.rw.push(e);
            }
        }
        v.queue.sort_by_key(|e| e.create_index);
        v.rw.sort_by_key(|e| e.create_index);
        v
    }

    /// Mutex queue keys and read-write entries in one line, by
    /// CreateIndex: mutexes and read-write locks of one name share it.
    pub fn line(&self, keys: &Keys) -> Vec<(LockKind, KvEntry)> {
        let mut l: Vec<(LockKind, KvEntry)> = self
            .queue
            .iter()
            .chain(self.rw.iter())
            .map(|e| (entry_kind(keys, e), e.clone()))
            .collect();
        l.sort_by_key(|(_, e)| e.create_index);
        l
    }

    /// The read-write entries that hold (by their place in the line:
    /// [`holds`]).
    pub fn rw_holders(&self, keys: &Keys) -> Vec<(LockKind, KvEntry)> {
        let line = self.line(keys);
        let kinds = line_kinds(&line);
        (0..line.len())
            .filter(|&i| {
                holds_linked(&kinds, i, |a, b| a == b, |a, b| upgrades(&line, a, b))
                    && line[i].0 != LockKind::Exclusive
            })
            .map(|i| line[i].clone())
            .collect()
    }

    /// The session holding `.lock`, if any.
    pub fn holder(&self) -> Option<&str> {
        self.lock.as_ref().and_then(KvEntry::holder)
    }
}

/// The kinds of a line's entries, in its order: what the queue rule
/// (`quorumlock_core::backend::waits_for` and `holds`) decides on; the
/// index it answers is the entry's index in the line.
pub(crate) fn line_kinds(line: &[(LockKind, KvEntry)]) -> Vec<LockKind> {
    line.iter().map(|(k, _)| *k).collect()
}

/// The fence of one acquire attempt: `<ns>/.fence/<session>/<contender>`,
/// outside every lock's keys (no segment of a lock's key starts with `.`), so
/// neither our readers nor `consul lock` (`-n`) ever see it.
pub(crate) fn fence_key(
    namespace_prefix: &str,
    session: &str,
    contender: &impl fmt::Display,
) -> String {
    format!("{namespace_prefix}.fence/{session}/{contender}")
}

/// The keys of a semaphore on prefix `P`.
#[derive(Debug, Clone)]
pub(crate) struct SemKeys {
    /// `P/`: what one listing covers.
    pub prefix: String,
    /// `P/.lock`.
    pub lock: String,
}

impl SemKeys {
    pub fn new(base: &str) -> SemKeys {
        SemKeys {
            prefix: format!("{base}/"),
            lock: format!("{base}/.lock"),
        }
    }

    /// The contender key of `session`.
    pub fn contender(&self, session: &str) -> String {
        format!("{}{session}", self.prefix)
    }

    /// Our revoke marker for the holder `session`.
    pub fn revoke(&self, session: &str) -> String {
        format!("{}.revoke/{session}", self.prefix)
    }
}

/// The JSON of `P/.lock`, as Go's `semaphoreLock`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct SemLock {
    pub limit: u32,
    #[serde(default)]
    pub holders: BTreeMap<String, bool>,
}

impl SemLock {
    pub fn decode(e: &KvEntry) -> Option<SemLock> {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(e.value.as_deref()?)
            .ok()?;
        serde_json::from_slice(&raw).ok()
    }

    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).expect("a semaphore lock always serializes");
        base64::engine::general_purpose::STANDARD.encode(json)
    }
}

/// What one listing of `P/` says about the semaphore.
#[derive(Debug, Clone, Default)]
pub(crate) struct SemView {
    /// Blocking index for the next read of `P/`.
    pub index: u64,
    /// `P/.lock`, if it exists.
    pub lock: Option<KvEntry>,
    /// Its decoded value (`None`: absent, or not a semaphore's JSON).
    pub state: Option<SemLock>,
    /// Holders whose session still holds a key under `P/` (Go's rule).
    pub live_holders: BTreeSet<String>,
    /// Contender keys (`P/<session>`, semaphore flags, held), by CreateIndex,
    /// ours and foreign.
    pub contenders: Vec<KvEntry>,
    /// Held mutex or read-write entries of our layout under `P/.`.
    pub lock_entries: usize,
    /// Our revoke markers, by the holder session they are for.
    pub revokes: BTreeMap<String, KvEntry>,
    /// Sessions holding some key under `P/`.
    pub alive: BTreeSet<String>,
}

impl SemView {
    pub fn from_entries(keys: &SemKeys, index: u64, entries: Vec<KvEntry>) -> SemView {
        let mut v = SemView {
            index,
            ..SemView::default()
        };
        for e in entries {
            v.index = v.index.max(e.modify_index);
            if let Some(h) = e.holder() {
                v.alive.insert(h.to_string());
            }
            let Some(rest) = e.key.strip_prefix(&keys.prefix) else {
                continue;
            };
            if e.key == keys.lock {
                v.state = SemLock::decode(&e);
                v.lock = Some(e);
            } else if let Some(s) = rest.strip_prefix(".revoke/") {
                v.revokes.insert(s.to_string(), e);
            } else if rest.starts_with(".queue/") || rest.starts_with(".rw/") {
                if e.holder().is_some() {
                    v.lock_entries += 1;
                }
            } else if !rest.contains('/')
                && !rest.starts_with('.')
                && e.flags == SEMAPHORE_FLAGS
                && e.holder() == Some(rest)
            {
                v.contenders.push(e);
            }
        }
        v.contenders.sort_by_key(|e| e.create_index);
        if let Some(st) = &v.state {
            v.live_holders = st
                .holders
                .keys()
                .filter(|h| v.alive.contains(*h))
                .cloned()
                .collect();
        }
        v
    }

    /// Our own contenders (their value is our record), by CreateIndex:
    /// the FIFO queue among our clients.
    pub fn ours(&self) -> Vec<&KvEntry> {
        self.contenders
            .iter()
            .filter(|e| e.record().is_some())
            .collect()
    }

    /// The limit in force: `.lock`'s, else that of the first of our
    /// contenders that says.
    pub fn limit(&self) -> Option<u32> {
        self.state.as_ref().map(|s| s.limit).or_else(|| {
            self.ours()
                .iter()
                .find_map(|e| e.record().and_then(|r| r.permits))
        })
    }

    /// `.lock` with `session` removed and dead holders pruned (`alive`
    /// minus `gone` sessions).
    pub fn without(&self, session: &str, gone: &str) -> BTreeMap<String, bool> {
        self.state
            .as_ref()
            .map(|s| {
                s.holders
                    .keys()
                    .filter(|h| *h != session && self.alive.contains(*h) && *h != gone)
                    .map(|h| (h.clone(), true))
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quorumlock_core::backend::waits_for;

    fn entry(key: String, flags: u64, session: &str, create_index: u64) -> KvEntry {
        KvEntry {
            key,
            flags,
            value: None,
            session: Some(session.to_string()),
            create_index,
            modify_index: create_index,
        }
    }

    /// Mutex queue keys and read-write entries of one name, read as one
    /// line by CreateIndex, decided by the shared queue rule: the answer's
    /// index is the entry's place in the line.
    #[test]
    fn the_line_is_decided_by_the_shared_queue_rule() {
        let keys = Keys::new(&ConsulConfig::default(), &LockName::new("a").unwrap());
        let entries = vec![
            entry(keys.rw_entry("s5", &"c5"), READ_FLAGS, "s5", 50),
            entry(keys.rw_entry("s1", &"c1"), READ_FLAGS, "s1", 10),
            entry(keys.queue("s3"), QUEUE_FLAGS, "s3", 30),
            entry(keys.rw_entry("s2", &"c2"), READ_FLAGS, "s2", 20),
            entry(keys.rw_entry("s4", &"c4"), WRITE_FLAGS, "s4", 40),
        ];
        let view = View::from_entries(&keys, entries);
        let line = view.line(&keys);
        let kinds = line_kinds(&line);
        use LockKind::*;
        assert_eq!(kinds, [Read, Read, Exclusive, Write, Read]);
        let waits: Vec<Option<u64>> = (0..line.len())
            .map(|i| waits_for(&kinds, i).map(|j| line[j].1.create_index))
            .collect();
        // Readers ahead of any writer hold; the mutex waits for the reader
        // just ahead, the writer for the mutex, the last reader for the
        // writer (the nearest non-reader ahead).
        assert_eq!(waits, [None, None, Some(20), Some(30), Some(40)]);
        let held: Vec<u64> = view
            .rw_holders(&keys)
            .iter()
            .map(|(_, e)| e.create_index)
            .collect();
        assert_eq!(held, [10, 20]);
    }

    #[test]
    fn go_json_round_trip() {
        let raw = r#"{"Limit":3,"Holders":{"abc":true}}"#;
        let l: SemLock = serde_json::from_str(raw).unwrap();
        assert_eq!(l.limit, 3);
        assert!(l.holders.contains_key("abc"));
        assert_eq!(serde_json::to_string(&l).unwrap(), raw);
    }

    #[test]
    fn an_upgrade_is_named_after_the_entry_it_upgrades() {
        use quorumlock_core::backend::waits_for_linked;
        let keys = Keys::new(&ConsulConfig::default(), &LockName::new("a").unwrap());
        let (u, c) = (uuid::Uuid::from_u128(1), uuid::Uuid::from_u128(2));
        let mut req = AcquireRequest::new(LockName::new("a").unwrap(), LockKind::Upgrade, true);
        req.upgrades = Some(u);
        req.contender = c;
        let up = keys.request_entry("s1", &req);
        assert_eq!(upgraded_entry(&up), Some(keys.rw_entry("s1", &u).as_str()));
        let entries = vec![
            entry(keys.rw_entry("s1", &u), UPGRADEABLE_FLAGS, "s1", 10),
            entry(keys.rw_entry("s2", &"r"), READ_FLAGS, "s2", 20),
            entry(up.clone(), UPGRADE_FLAGS, "s1", 30),
            entry(rw_revoke(&up), REVOKE_FLAGS, "s1", 31),
        ];
        let view = View::from_entries(&keys, entries);
        let line = view.line(&keys);
        use LockKind::*;
        assert_eq!(line_kinds(&line), [Upgradeable, Read, Upgrade]);
        let link = |a, b| upgrades(&line, a, b);
        assert!(link(2, 0) && !link(2, 1) && !link(0, 2));
        assert_eq!(waits_for_linked(&line_kinds(&line), 2, link), Some(1));
        // An upgrade's flags on a key that names no entry: a writer.
        let odd = entry(keys.rw_entry("s3", &"x"), UPGRADE_FLAGS, "s3", 40);
        assert_eq!(entry_kind(&keys, &odd), Write);
    }
}
