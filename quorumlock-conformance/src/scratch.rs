//! Keys of the store's own key space that cases and fault scenarios
//! write through fenced and unfenced writes, and their cleanup.

use quorumlock_core::backend::{Backend, KeyWrite};
use quorumlock_core::LockClient;

/// A key of the store's own key space, outside the lock namespace, unique
/// to `namespace`: a ZooKeeper path, or a plain key elsewhere.
pub fn scratch_key(backend: &dyn Backend, namespace: &str, leaf: &str) -> String {
    if backend.describe().starts_with("zk") {
        format!("/quorumlock-fenced/{namespace}/{leaf}")
    } else {
        format!("quorumlock-fenced/{namespace}/{leaf}")
    }
}

/// The node a ZooKeeper scratch key lives under, which must go with it
/// (keys of the other stores have no parent to remove).
pub fn scratch_parent(key: &str) -> Option<&str> {
    key.rsplit_once('/')
        .filter(|_| key.starts_with('/'))
        .map(|(parent, _)| parent)
}

/// Deletes `key` (unfenced) and, on ZooKeeper, its now empty parent.
pub async fn remove_scratch(c: &LockClient, key: &str) {
    let delete = |key: &str| KeyWrite::Delete { key: key.into() };
    c.backend().write_key(&delete(key)).await.expect("cleanup");
    if let Some(parent) = scratch_parent(key) {
        c.backend()
            .write_key(&delete(parent))
            .await
            .expect("cleanup");
    }
}
