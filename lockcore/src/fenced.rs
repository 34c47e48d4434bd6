//! Writes the store itself fences: applied only while the writer's lock
//! entry still exists, in the same store transaction.
//!
//! A fencing token protects a resource only if the resource checks it.
//! For keys of the lock's own store, the store can check: etcd compares
//! our key's create revision, ZooKeeper checks our node in a `multi`,
//! Consul checks our session and index on `.lock` in a txn. A holder that
//! was paused past its session (GC, swap, a stopped VM) and wakes up still
//! "holding" then gets [`ErrorKind::LockLost`] and writes nothing. This
//! protects writes to the same store only; any other resource needs the
//! token.

use crate::{Error, ErrorKind, LockClient, LockGuard, LockKind, LockName, MultiGuard, Result};

/// Longest key a fenced write accepts (bytes); every store takes this.
pub const MAX_KEY_LEN: usize = 512;

/// A write to the store's own key space, outside quorumlock's namespace:
/// an etcd key, a ZooKeeper path (`/app/config`), a Consul KV key.
#[derive(Clone, PartialEq, Eq)]
pub enum KeyWrite {
    /// Set `key` to `value` (created if absent).
    Put {
        /// The store key.
        key: String,
        /// The new value.
        value: Vec<u8>,
    },
    /// Delete `key` (nothing if absent).
    Delete {
        /// The store key.
        key: String,
    },
}

impl std::fmt::Debug for KeyWrite {
    // Values may be secrets: only their length is shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyWrite::Put { key, value } => f
                .debug_struct("Put")
                .field("key", key)
                .field("value_len", &value.len())
                .finish(),
            KeyWrite::Delete { key } => f.debug_struct("Delete").field("key", key).finish(),
        }
    }
}

impl KeyWrite {
    /// The key written.
    pub fn key(&self) -> &str {
        match self {
            KeyWrite::Put { key, .. } | KeyWrite::Delete { key } => key,
        }
    }

    /// Checks what every store requires of a key, and that it is not
    /// inside quorumlock's own `namespace_prefix` (a write there could
    /// forge or destroy lock entries). [`ErrorKind::InvalidArgument`].
    pub fn validate(&self, namespace_prefix: &str) -> Result<()> {
        let key = self.key();
        let bad = |why: &str| {
            Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("fenced write to {key:?}: {why}"),
            ))
        };
        if key.is_empty() {
            return bad("the key is empty");
        }
        if key.len() > MAX_KEY_LEN {
            return bad("the key is longer than 512 bytes");
        }
        if key.chars().any(char::is_control) {
            return bad("the key has a control character");
        }
        let namespace = namespace_prefix.trim_end_matches('/');
        let inside = !namespace.is_empty()
            && key
                .strip_prefix(namespace)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        if inside {
            return bad("the key is inside quorumlock's namespace");
        }
        Ok(())
    }
}

/// A held entry a fenced write depends on: the write applies only if the
/// store still has it, unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldEntry {
    /// The lock.
    pub name: LockName,
    /// Its kind (fenced writes take [`LockKind::Exclusive`] holds).
    pub kind: LockKind,
    /// The store's name of our entry ([`crate::backend::Acquired::entry`]).
    pub entry: String,
    /// Its fencing token.
    pub token: u64,
    /// The store session that holds it ([`crate::backend::StoreSession::id`]).
    pub session: String,
}

/// The error of a fenced write the store refused.
pub fn refused(write: &KeyWrite, held: &[HeldEntry]) -> Error {
    let names: Vec<&str> = held.iter().map(|h| h.name.as_str()).collect();
    let whose = match names.as_slice() {
        [one] => format!("the entry of {one} is gone"),
        many => format!("an entry of {} is gone", many.join(", ")),
    };
    Error::new(
        ErrorKind::LockLost,
        format!(
            "fenced write to {:?} refused by the store: {whose}",
            write.key()
        ),
    )
}

/// Fenced writes are for exclusive holds (a mutex, or a set of them):
/// only there does "our entry still exists" mean "nobody else holds it".
pub fn check_kinds(held: &[HeldEntry]) -> Result<()> {
    match held.iter().find(|h| h.kind != LockKind::Exclusive) {
        None => Ok(()),
        Some(h) => Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "fenced writes need a mutex hold; {} is held as {:?}",
                h.name, h.kind
            ),
        )),
    }
}

impl LockGuard {
    /// Sets the store key `key` to `value` only while this guard's entry
    /// is still on the store, in one store transaction; else
    /// [`ErrorKind::LockLost`] and nothing written. `key` is a key of the
    /// store's own key space outside quorumlock's namespace (module docs:
    /// [`KeyWrite`]); a bad key is [`ErrorKind::InvalidArgument`]. Mutex
    /// guards only.
    ///
    /// ```no_run
    /// # async fn f(client: lockcore::LockClient) -> lockcore::Result<()> {
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
        let (backend, entry) = self.fence();
        let write = KeyWrite::Put {
            key: key.into(),
            value: value.into(),
        };
        backend.fenced_write(&[entry], &write).await
    }

    /// Deletes the store key `key` only while this guard's entry is still
    /// on the store; as [`fenced_put`](Self::fenced_put).
    ///
    /// # Cancel safety
    /// As [`fenced_put`](Self::fenced_put).
    pub async fn fenced_delete(&self, key: impl Into<String>) -> Result<()> {
        let (backend, entry) = self.fence();
        let write = KeyWrite::Delete { key: key.into() };
        backend.fenced_write(&[entry], &write).await
    }
}

impl MultiGuard {
    /// Sets `key` to `value` only while every lock of the set is still
    /// held on the store (one transaction checks them all); as
    /// [`LockGuard::fenced_put`].
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
            let (b, e) = g.fence();
            backend.get_or_insert(b);
            entries.push(e);
        }
        let backend = backend.expect("a multi-lock has at least one name");
        backend.fenced_write(&entries, write).await
    }
}

impl LockClient {
    /// Reads a key of the store's own key space (what fenced writes
    /// write); `None` if absent.
    ///
    /// # Cancel safety
    /// Read-only; safe to drop.
    pub async fn read_key(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.backend().read_key(key).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str) -> KeyWrite {
        KeyWrite::Put {
            key: key.into(),
            value: b"v".to_vec(),
        }
    }

    #[test]
    fn keys_are_checked_and_the_namespace_is_off_limits() {
        assert!(put("app/config").validate("locks/").is_ok());
        assert!(put("locksmith").validate("locks/").is_ok());
        for bad in ["", "locks", "locks/x", "a\nb"] {
            let e = put(bad).validate("locks/").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad:?}");
        }
        assert!(put(&"k".repeat(MAX_KEY_LEN + 1)).validate("ns").is_err());
    }

    #[test]
    fn debug_hides_values() {
        let w = KeyWrite::Put {
            key: "k".into(),
            value: b"hunter2".to_vec(),
        };
        assert!(!format!("{w:?}").contains("hunter2"));
    }
}
