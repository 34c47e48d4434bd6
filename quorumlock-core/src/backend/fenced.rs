//! The contract of a fenced write: what is written ([`KeyWrite`]), which
//! held entries it depends on ([`HeldEntry`]), and the checks and error
//! every backend shares. The user API is in the crate's `fenced.rs`.

use std::borrow::Cow;

use crate::{Error, ErrorKind, LockKind, LockName, Result};

/// Longest key a fenced write accepts (bytes); every store takes this.
pub const MAX_KEY_LEN: usize = 512;

/// A write to the store's own key space, outside quorumlock's namespace:
/// an etcd key, a ZooKeeper path (`/app/config`), a Consul KV key. The
/// key may be written with or without a leading `/` on every store; each
/// backend maps it to its store's form ([`KeyForm`]).
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

    /// This write with its key in the store's `form` ([`KeyForm::key`]):
    /// borrowed when the key is already so.
    pub fn in_form(&self, form: KeyForm) -> Cow<'_, KeyWrite> {
        let key = form.key(self.key());
        if key == self.key() {
            return Cow::Borrowed(self);
        }
        let key = key.into_owned();
        Cow::Owned(match self {
            KeyWrite::Put { value, .. } => KeyWrite::Put {
                key,
                value: value.clone(),
            },
            KeyWrite::Delete { .. } => KeyWrite::Delete { key },
        })
    }

    /// Checks what every store requires of a key, and that it cannot be
    /// lock bookkeeping (a write there could forge or destroy lock
    /// entries): refused with [`ErrorKind::InvalidArgument`] are a key
    /// inside quorumlock's own `namespace_prefix`; any key at all when
    /// the namespace is empty (the locks then live at the store's root,
    /// and any key may be some lock's entry: give the client a namespace,
    /// the URL's path, to make fenced writes); and a key with a segment
    /// starting with `.` (every layout's own children, `.lock`, `.n`,
    /// `.q`, `.session`, `.fence`, start so, also under another client's
    /// namespace). The same rule on every store.
    pub fn validate(&self, namespace_prefix: &str) -> Result<()> {
        let key = self.key();
        let bad = |why: &str| {
            Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("fenced write to {:?}: {why}", Truncated(key)),
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
        if key.split('/').any(|segment| segment.starts_with('.')) {
            return bad("a segment starts with '.', which lock bookkeeping uses");
        }
        // ZooKeeper's root is `/`: an empty namespace too.
        let namespace = namespace_prefix.trim_matches('/');
        if namespace.is_empty() {
            return bad("the client has no namespace, so any key may be a lock's own (put the locks in a namespace: the URL's path)");
        }
        let inside = key
            .trim_start_matches('/')
            .strip_prefix(namespace)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        if inside {
            return bad("the key is inside quorumlock's namespace");
        }
        Ok(())
    }
}

/// How a store spells the keys of its own key space. The rule for users
/// is one on every store: a key of a fenced write, of
/// [`Backend::read_key`](crate::backend::Backend::read_key) and of
/// [`Backend::write_key`](crate::backend::Backend::write_key) may be
/// written with or without a leading `/`; the backend maps it with
/// [`KeyForm::key`] (or [`KeyWrite::in_form`]) after
/// [`KeyWrite::validate`] and before its own key checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyForm {
    /// The key as written: `/app/config` and `app/config` are two keys
    /// (etcd, Redis, mem).
    AsWritten,
    /// A `/` added where the key lacks one: paths are absolute
    /// (ZooKeeper: `app/config` is `/app/config`).
    Absolute,
    /// One leading `/` dropped: keys have none (Consul: `/app/config` is
    /// `app/config`).
    Relative,
}

impl KeyForm {
    /// `key` in this form.
    pub fn key(self, key: &str) -> Cow<'_, str> {
        match self {
            KeyForm::Absolute if !key.starts_with('/') => Cow::Owned(format!("/{key}")),
            KeyForm::Relative => Cow::Borrowed(key.strip_prefix('/').unwrap_or(key)),
            _ => Cow::Borrowed(key),
        }
    }
}

/// A key in an error message: its first 64 characters.
struct Truncated<'a>(&'a str);

impl std::fmt::Debug for Truncated<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.char_indices().nth(64) {
            None => std::fmt::Debug::fmt(self.0, f),
            Some((at, _)) => write!(f, "{:?}...", &self.0[..at]),
        }
    }
}

/// A held entry a fenced write depends on: the write applies only if the
/// store still has it, unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldEntry {
    /// The lock.
    pub name: LockName,
    /// Its kind (fenced writes take [`LockKind::Exclusive`] holds and an
    /// election's leader, [`LockKind::Election`]).
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

/// Fenced writes need an exclusive hold among the entries they check (a
/// mutex, the write side of a read-write lock, an election's leadership):
/// only there does "our entry still exists" mean "nobody else may write".
/// A set may add read sides: in a queue whose entries are granted in
/// order, an entry that still exists is still held as it was granted, so
/// the write also proves that no writer holds those. Semaphore permits are
/// refused: Consul's native layout records a permit in its `.lock`'s
/// holder list, not in an entry a transaction could check. No holds at
/// all is a plain write (the backends' `write_key` on the fenced path).
pub fn check_kinds(held: &[HeldEntry]) -> Result<()> {
    let refuse = |why: String| Err(Error::new(ErrorKind::InvalidArgument, why));
    if let Some(h) = held
        .iter()
        .find(|h| matches!(h.kind, LockKind::Semaphore { .. }))
    {
        return refuse(format!(
            "fenced writes cannot check a semaphore permit; {} is held as {:?}",
            h.name, h.kind
        ));
    }
    let exclusive = |k: LockKind| {
        matches!(
            k,
            LockKind::Exclusive | LockKind::Write | LockKind::Upgrade | LockKind::Election
        )
    };
    if !held.is_empty() && !held.iter().any(|h| exclusive(h.kind)) {
        let names: Vec<&str> = held.iter().map(|h| h.name.as_str()).collect();
        return refuse(format!(
            "fenced writes need a mutex, a write side (an upgrade too) or an \
             election's leadership among the holds they check; {} held to read only",
            names.join(", ")
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(kinds: &[LockKind]) -> Vec<HeldEntry> {
        kinds
            .iter()
            .enumerate()
            .map(|(i, k)| HeldEntry {
                name: LockName::new(format!("l{i}")).unwrap(),
                kind: *k,
                entry: format!("e{i}"),
                token: i as u64,
                session: "s".into(),
            })
            .collect()
    }

    #[test]
    fn fenced_writes_need_an_exclusive_hold_and_no_permit() {
        use LockKind::*;
        let sem = Semaphore { permits: 2 };
        for ok in [
            &[Exclusive][..],
            &[Write],
            &[Election],
            &[Exclusive, Read],
            &[Read, Write, Read],
            &[],
        ] {
            assert!(check_kinds(&held(ok)).is_ok(), "{ok:?}");
        }
        for bad in [&[Read][..], &[Read, Read], &[sem], &[Exclusive, sem]] {
            let e = check_kinds(&held(bad)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad:?}");
        }
    }

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
        assert!(put("/app/config").validate("/locks").is_ok());
        for bad in [
            "",
            "locks",
            "locks/x",
            "a\nb",
            "app/.n",
            ".session/x",
            "other/x/.lock",
        ] {
            let e = put(bad).validate("locks/").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad:?}");
        }
        for bad in ["/locks/x/lock-0000000001", "/locks"] {
            assert!(put(bad).validate("/locks").is_err(), "{bad:?}");
        }
        assert!(put(&"k".repeat(MAX_KEY_LEN + 1)).validate("ns").is_err());
    }

    #[test]
    fn without_a_namespace_every_key_is_off_limits() {
        for ns in ["", "/"] {
            for key in ["app/config", "x", "/x/lock-0000000001"] {
                let e = put(key).validate(ns).unwrap_err();
                assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{key:?} in {ns:?}");
                assert!(e.message().contains("namespace"), "{e}");
            }
        }
    }

    #[test]
    fn keys_map_to_the_store_form() {
        for (key, written, absolute, relative) in [
            ("app/config", "app/config", "/app/config", "app/config"),
            ("/app/config", "/app/config", "/app/config", "app/config"),
            // One `/` only: the store's own rules judge what is left.
            ("//x", "//x", "//x", "/x"),
        ] {
            assert_eq!(KeyForm::AsWritten.key(key), written);
            assert_eq!(KeyForm::Absolute.key(key), absolute);
            assert_eq!(KeyForm::Relative.key(key), relative);
        }
        let w = put("app/config");
        assert!(matches!(w.in_form(KeyForm::Relative), Cow::Borrowed(_)));
        assert_eq!(*w.in_form(KeyForm::Absolute), put("/app/config"));
        let d = KeyWrite::Delete { key: "/k".into() };
        assert_eq!(
            *d.in_form(KeyForm::Relative),
            KeyWrite::Delete { key: "k".into() }
        );
    }

    #[test]
    fn a_long_key_is_not_repeated_whole_in_the_error() {
        let e = put(&"k".repeat(10_000)).validate("ns").unwrap_err();
        assert!(e.message().len() < 200, "{}", e.message().len());
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
