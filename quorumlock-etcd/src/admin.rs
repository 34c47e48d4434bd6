//! The operator's operations on [`EtcdCore`]: inspect, follow a lock's
//! changes, list, break a lock, request a revoke, kill a session (revoke
//! its lease), leftovers.

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
};
use futures::StreamExt;
#[cfg(doc)]
use quorumlock_core::backend::Backend;
use quorumlock_core::backend::ChangeFeed;
use quorumlock_core::{Contender, Error, ErrorKind, LockKind, LockName, LockState, Result};

use crate::core::{first_created, EtcdCore};
use crate::layout;
use crate::watch::WatchEvent;

/// The session id of a key: its lease in hex, or the key's last segment for
/// keys without a lease.
fn session_of(kv: &KeyValue) -> String {
    if kv.lease() != 0 {
        return format!("{:x}", kv.lease());
    }
    let key = String::from_utf8_lossy(kv.key());
    key.rsplit('/').next().unwrap_or_default().to_string()
}

fn contender(kv: &KeyValue) -> Contender {
    let (kind, since, value) = layout::parse(kv.value());
    Contender {
        session: session_of(kv),
        token: kv.create_revision() as u64,
        entry: String::from_utf8_lossy(kv.key()).into_owned(),
        kind,
        since,
        value,
    }
}

/// Compares that every one of `kvs` is still the entry we read.
fn unchanged(kvs: &[KeyValue]) -> Vec<Compare> {
    kvs.iter()
        .map(|kv| Compare::create_revision(kv.key(), CompareOp::Equal, kv.create_revision()))
        .collect()
}

impl EtcdCore {
    /// Contenders of a lock in queue (create revision) order.
    async fn contenders(&self, name: &LockName) -> Result<Vec<KeyValue>> {
        let pfx_slash = format!("{}/", self.lock_prefix(name));
        let resp = self
            .get("range contenders", pfx_slash.clone(), first_created())
            .await?;
        Ok(resp
            .kvs()
            .iter()
            .filter(|kv| layout::is_contender(&pfx_slash, kv.key()))
            .cloned()
            .collect())
    }

    /// The current holders and the waiters of a lock (by the queue rule,
    /// [`quorumlock_core::backend::holds`]), each in queue order.
    async fn holders(&self, name: &LockName) -> Result<(Vec<KeyValue>, Vec<KeyValue>)> {
        let all = self.contenders(name).await?;
        let kinds: Vec<LockKind> = all.iter().map(layout::kind_of).collect();
        let held: Vec<bool> = (0..all.len()).map(|i| holds(&all, &kinds, i)).collect();
        let (holders, waiters): (Vec<_>, Vec<_>) =
            all.into_iter().enumerate().partition(|(i, _)| held[*i]);
        Ok((
            holders.into_iter().map(|(_, kv)| kv).collect(),
            waiters.into_iter().map(|(_, kv)| kv).collect(),
        ))
    }

    /// [`Backend::inspect`]: one range read of the lock's entries.
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<LockState> {
        let (holders, waiters) = self.holders(name).await?;
        Ok(LockState {
            name: name.clone(),
            holders: holders.iter().map(contender).collect(),
            waiters: waiters.iter().map(contender).collect(),
        })
    }

    /// [`Backend::changes`]: a watch on the lock's prefix, on the
    /// backend's one watch stream. An item when etcd has created the watch
    /// (again after a new stream: what changed while it was down is read,
    /// not replayed), and one per response's events.
    pub(crate) fn changes(&self, name: &LockName) -> ChangeFeed {
        let watch = self
            .hub
            .watch_prefix(format!("{}/", self.lock_prefix(name)));
        let name = name.clone();
        futures::stream::unfold(Some(watch), move |watch| {
            let name = name.clone();
            async move {
                let mut watch = watch?;
                let mut event = watch.next().await;
                // Events that came already: one item (the read after it
                // sees them all), unless the watch ended.
                while !matches!(event, WatchEvent::Lost | WatchEvent::Refused) {
                    match watch.ready() {
                        Some(more) => event = more,
                        None => break,
                    }
                }
                match event {
                    WatchEvent::Created(_) | WatchEvent::Put(_) | WatchEvent::Delete => {
                        Some((Ok(()), Some(watch)))
                    }
                    WatchEvent::Lost | WatchEvent::Refused => Some((
                        Err(Error::new(
                            ErrorKind::Unavailable,
                            format!("etcd ended or refused the watch on {name}'s changes"),
                        )),
                        None,
                    )),
                }
            }
        })
        .boxed()
    }

    /// [`Backend::list`]: one range read of the namespace (or of a
    /// prefix).
    pub(crate) async fn list(&self, prefix: Option<&LockName>) -> Result<Vec<LockState>> {
        // One range read of the subtree: every entry is a direct child of
        // its lock's prefix, so a key's parent is its lock.
        let ns = self.namespace_prefix();
        let start = match prefix {
            Some(p) => format!("{}/", self.lock_prefix(p)),
            None => ns.clone(),
        };
        let (key, opts) = if start.is_empty() {
            (vec![0], GetOptions::new().with_all_keys())
        } else {
            (start.into_bytes(), GetOptions::new().with_prefix())
        };
        let opts = opts.with_sort(SortTarget::Create, SortOrder::Ascend);
        let resp = self.get("range locks", key, opts).await?;
        let mut locks: std::collections::BTreeMap<LockName, Vec<KeyValue>> = Default::default();
        for kv in resp.kvs() {
            let Ok(key) = std::str::from_utf8(kv.key()) else {
                continue;
            };
            let Some((parent, _)) = key.rsplit_once('/') else {
                continue;
            };
            // Keys that are not under a valid lock name are someone else's.
            let Some(name) = parent
                .strip_prefix(ns.as_str())
                .and_then(LockName::from_key)
            else {
                continue;
            };
            locks.entry(name).or_default().push(kv.clone());
        }
        Ok(locks
            .into_iter()
            .map(|(name, all)| {
                let kinds: Vec<LockKind> = all.iter().map(layout::kind_of).collect();
                let mut state = LockState::free(name);
                for (i, kv) in all.iter().enumerate() {
                    if holds(&all, &kinds, i) {
                        state.holders.push(contender(kv));
                    } else {
                        state.waiters.push(contender(kv));
                    }
                }
                state
            })
            .collect())
    }

    /// [`Backend::break_lock`]: deletes every holder's key.
    pub(crate) async fn break_lock(&self, name: &LockName) -> Result<bool> {
        // Every holder's key goes in one txn, guarded by their create
        // revisions; if the holders changed between our read and the txn,
        // read again.
        for _ in 0..10 {
            let (holders, _) = self.holders(name).await?;
            if holders.is_empty() {
                return Ok(false);
            }
            let txn = Txn::new().when(unchanged(&holders)).and_then(
                holders
                    .iter()
                    .map(|kv| TxnOp::delete(kv.key(), None))
                    .collect::<Vec<_>>(),
            );
            if self.txn("break lock", txn).await?.succeeded() {
                tracing::info!(lock = %name, holders = holders.len(), "lock broken");
                return Ok(true);
            }
        }
        Err(Error::new(
            ErrorKind::Store,
            format!("lock {name} changed holders ten times while breaking it"),
        ))
    }

    /// [`Backend::request_revoke`]: a put on every holder's key.
    pub(crate) async fn request_revoke(&self, name: &LockName) -> Result<bool> {
        // A revoke request is a put on each holder's own key that keeps its
        // value and lease (so its create revision, the token, is kept too):
        // the holder's one watch sees a put on its key. Go clients do not
        // look at values or mod revisions.
        for _ in 0..10 {
            let (holders, _) = self.holders(name).await?;
            if holders.is_empty() {
                return Ok(false);
            }
            let keep = PutOptions::new().with_ignore_value().with_ignore_lease();
            let txn = Txn::new().when(unchanged(&holders)).and_then(
                holders
                    .iter()
                    .map(|kv| TxnOp::put(kv.key(), Vec::<u8>::new(), Some(keep.clone())))
                    .collect::<Vec<_>>(),
            );
            if self.txn("request revoke", txn).await?.succeeded() {
                return Ok(true);
            }
        }
        Err(Error::new(
            ErrorKind::Store,
            format!("lock {name} changed holders ten times while revoking it"),
        ))
    }

    /// [`Backend::kill_session`]: revokes the lease `session` (hex).
    pub(crate) async fn kill_session(&self, session: &str) -> Result<()> {
        let id = u64::from_str_radix(session, 16).map_err(|_| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("{session:?} is not an etcd lease id in hex"),
            )
        })? as i64;
        self.call("lease revoke", || {
            let mut lease = self.client.lease_client();
            async move { lease.revoke(id).await }
        })
        .await?;
        Ok(())
    }

    /// [`Backend::leftovers`]: our keys in the namespace, and the leases
    /// this backend granted that etcd still has.
    pub(crate) async fn leftovers(&self) -> Result<Vec<String>> {
        let prefix = self.namespace_prefix();
        let opts = if prefix.is_empty() {
            GetOptions::new().with_all_keys().with_keys_only()
        } else {
            GetOptions::new().with_prefix().with_keys_only()
        };
        let key = if prefix.is_empty() {
            vec![0]
        } else {
            prefix.into_bytes()
        };
        let resp = self.get("range namespace", key, opts).await?;
        let mut out: Vec<String> = resp
            .kvs()
            .iter()
            .map(|kv| format!("key {}", String::from_utf8_lossy(kv.key())))
            .collect();
        let leases: Vec<i64> = self.opened.lock().expect("poisoned").clone();
        let mut dead = Vec::new();
        for id in leases {
            if self.lease_alive(id).await? {
                out.push(format!("lease {id:x}"));
            } else {
                dead.push(id);
            }
        }
        self.opened
            .lock()
            .expect("poisoned")
            .retain(|id| !dead.contains(id));
        Ok(out)
    }
}

/// Whether entry `i` of a lock's line (`all`, oldest first, and their
/// kinds) holds: by the shared rule, the keys of one request for several
/// permits (one txn, one create revision) holding together.
fn holds(all: &[KeyValue], kinds: &[LockKind], i: usize) -> bool {
    quorumlock_core::backend::holds_linked(
        kinds,
        i,
        |a, b| all[a].create_revision() == all[b].create_revision(),
        |a, b| crate::layout::upgrades(all[a].key(), all[b].key()),
    )
}
