//! The `consul lock -n N` / Go `api.Semaphore` layout of a semaphore on
//! prefix `P` (= `<ns>/<name>`):
//!
//! - `P/<session>`: one contender key per session, locked by it, flags
//!   [`SEMAPHORE_FLAGS`];
//! - `P/.lock`: not locked, flags [`SEMAPHORE_FLAGS`], value
//!   `{"Limit":N,"Holders":{"<session>":true,..}}`, changed only by
//!   check-and-set on its `ModifyIndex`. A holder whose session holds no
//!   key under `P` any more is dead and is pruned by the next writer.
//!
//! Our own revoke markers sit at `P/.revoke/<session>`.

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::api::KvEntry;

/// `api.SemaphoreFlagValue`: the flags of a semaphore's `.lock` and
/// contender keys. A `.lock` with these flags is not a mutex.
pub const SEMAPHORE_FLAGS: u64 = 0xe0f6_9a2b_aa41_4de0;

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

    #[test]
    fn go_json_round_trip() {
        let raw = r#"{"Limit":3,"Holders":{"abc":true}}"#;
        let l: SemLock = serde_json::from_str(raw).unwrap();
        assert_eq!(l.limit, 3);
        assert!(l.holders.contains_key("abc"));
        assert_eq!(serde_json::to_string(&l).unwrap(), raw);
    }
}
