//! Writes the store itself fences: applied only while the writer's lock
//! entry still exists, in the same store transaction.
//!
//! A fencing token protects a resource only if the resource checks it.
//! For keys of the lock's own store, the store can check: etcd compares
//! our key's create revision, ZooKeeper checks our node in a `multi`,
//! Consul checks our session and index on `.lock` in a txn. A holder that
//! was paused past its session (GC, swap, a stopped VM) and wakes up still
//! "holding" then gets [`ErrorKind::LockLost`](crate::ErrorKind::LockLost) and writes nothing. This
//! protects writes to the same store only; any other resource needs the
//! token.

use crate::backend::KeyWrite;
use crate::{LockClient, LockGuard, MultiGuard, Result};

impl LockGuard {
    /// Sets the store key `key` to `value` only while this guard's entry
    /// is still on the store, in one store transaction; else
    /// [`ErrorKind::LockLost`](crate::ErrorKind::LockLost) and nothing written. `key` is a key of the
    /// store's own key space outside quorumlock's namespace (module docs:
    /// [`KeyWrite`]), with or without a leading `/` on every store
    /// (ZooKeeper adds the `/` a key lacks, Consul drops it, etcd, Redis
    /// and mem use the key as written: [`KeyForm`](crate::backend::KeyForm));
    /// a bad key is [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument). Mutex
    /// guards, write guards of a read-write lock and an election leader's
    /// guard only (a reader or a permit is `InvalidArgument`).
    ///
    /// ```no_run
    /// # async fn f(client: quorumlock_core::LockClient) -> quorumlock_core::Result<()> {
    /// let guard = client.lock("config-writer")?.acquire().await?;
    /// guard.fenced_put("app/config", b"v2".to_vec()).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// One store request; if dropped after it was sent, the write may or
    /// may not have been applied (it was fenced either way).
    pub async fn fenced_put(
        &self,
        key: impl Into<String>,
        value: impl Into<Vec<u8>>,
    ) -> Result<()> {
        let (backend, entries) = self.fence()?;
        let write = KeyWrite::Put {
            key: key.into(),
            value: value.into(),
        };
        backend.fenced_write(&entries, &write).await
    }

    /// Deletes the store key `key` only while this guard's entry is still
    /// on the store; as [`fenced_put`](Self::fenced_put).
    ///
    /// # Cancel safety
    /// As [`fenced_put`](Self::fenced_put).
    pub async fn fenced_delete(&self, key: impl Into<String>) -> Result<()> {
        let (backend, entries) = self.fence()?;
        let write = KeyWrite::Delete { key: key.into() };
        backend.fenced_write(&entries, &write).await
    }
}

impl MultiGuard {
    /// Sets `key` to `value` only while every lock of the set is still
    /// held on the store (one transaction checks them all); as
    /// [`LockGuard::fenced_put`]. The set needs a mutex or a write side
    /// among its members and no semaphore permit; its read sides are
    /// checked as the others.
    ///
    /// # Cancel safety
    /// As [`LockGuard::fenced_put`].
    pub async fn fenced_put(
        &self,
        key: impl Into<String>,
        value: impl Into<Vec<u8>>,
    ) -> Result<()> {
        let write = KeyWrite::Put {
            key: key.into(),
            value: value.into(),
        };
        self.fenced(&write).await
    }

    /// Deletes `key` only while every lock of the set is still held; as
    /// [`LockGuard::fenced_delete`].
    ///
    /// # Cancel safety
    /// As [`LockGuard::fenced_put`].
    pub async fn fenced_delete(&self, key: impl Into<String>) -> Result<()> {
        self.fenced(&KeyWrite::Delete { key: key.into() }).await
    }

    async fn fenced(&self, write: &KeyWrite) -> Result<()> {
        let mut backend = None;
        let mut entries = Vec::new();
        for g in self.guards() {
            let (b, e) = g.fence()?;
            backend.get_or_insert(b);
            entries.extend(e);
        }
        let backend = backend.expect("a multi-lock has at least one name");
        backend.fenced_write(&entries, write).await
    }
}

impl LockClient {
    /// Reads a key of the store's own key space (what fenced writes
    /// write); `None` if absent. The key follows the rule of
    /// [`LockGuard::fenced_put`]: with or without a leading `/`.
    ///
    /// # Cancel safety
    /// Read-only; safe to drop.
    pub async fn read_key(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.backend().read_key(key).await
    }
}
