//! Lock names: one set of rules that every store can hold as-is.

use std::fmt;

use crate::{Error, ErrorKind, Result};

/// Longest lock name, in bytes.
pub const MAX_NAME_LEN: usize = 200;
/// Longest segment of a lock name, in bytes.
pub const MAX_SEGMENT_LEN: usize = 64;

/// Substrings that the Curator layout uses to recognise contender nodes
/// among a lock node's children; a nested lock name must not look like one.
const RESERVED_IN_NESTED: [&str; 4] = ["lock-", "lease-", "__READ__", "__WRIT__"];

/// Children that a store layout puts under a lock's own node: ZooKeeper's
/// semaphore keeps its internal mutex in `locks` and its leases in
/// `leases` (Curator's `InterProcessSemaphoreV2`). A nested lock of that
/// name would be that very node, so `p/leases` and `p/locks` are refused.
/// (Consul's own children, `.lock`, `.queue`, `.rw`, `.revoke`, start with
/// `.`; etcd puts only contender keys under a lock's prefix, and names
/// nested ones by a further `/`.)
pub const RESERVED_NESTED_SEGMENTS: [&str; 2] = ["leases", "locks"];

/// A validated lock name.
///
/// A name is one or more segments joined by `/`. The rules, each checked
/// before anything is written to a store:
///
/// 1. 1 to 200 bytes in all, each segment 1 to 64 bytes;
/// 2. no leading, trailing or doubled `/` (no empty segment);
/// 3. segments use only ASCII letters, digits, `-`, `_`, `.` and `:`
///    (no spaces, no control characters: every store and shell takes these
///    unquoted);
/// 4. a segment must not start with `.` or `_` (`.lock`, `.revoke` and
///    `_c_` entries are the recipes' own, and `.`/`..` would walk paths);
/// 5. segments after the first must start with a letter and must not
///    contain `lock-`, `lease-`, `__READ__` or `__WRIT__`: on ZooKeeper a
///    nested lock is a child of its parent lock's node, and Curator treats
///    every child there as a contender sorted by the text after `lock-`;
/// 6. segments after the first must not be `leases` or `locks`
///    ([`RESERVED_NESTED_SEGMENTS`]): on ZooKeeper those children of a
///    lock's node hold its semaphore.
///
/// The namespace (the URL path) is not part of the name.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(String);

impl LockName {
    /// Validates `name` against the rules above.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        validate(&name)?;
        Ok(LockName(name))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The segments of the name.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }
}

fn invalid(name: &str, rule: &str) -> Error {
    Error::new(
        ErrorKind::InvalidName,
        format!(
            "lock name {:?} is invalid: {rule}",
            name.escape_debug().to_string()
        ),
    )
}

fn validate(name: &str) -> Result<()> {
    validate_with(name, true)
}

/// Checks a namespace (the URL path) by the rules of a name, except rule 6:
/// the namespace is the directory that lock nodes live in, never a child
/// of a lock's node, so `app/locks` is a fine namespace.
pub(crate) fn validate_namespace(path: &str) -> Result<()> {
    validate_with(path, false)
}

fn validate_with(name: &str, reserve_layout_children: bool) -> Result<()> {
    if name.is_empty() {
        return Err(invalid(name, "it is empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(invalid(
            name,
            &format!(
                "it is {} bytes long, the limit is {MAX_NAME_LEN}",
                name.len()
            ),
        ));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(invalid(
            name,
            &format!("it contains the control character {:?}", c),
        ));
    }
    if name.starts_with('/') || name.ends_with('/') {
        return Err(invalid(name, "it must not start or end with '/'"));
    }
    for (i, seg) in name.split('/').enumerate() {
        if seg.is_empty() {
            return Err(invalid(name, "it has an empty segment ('//')"));
        }
        if seg == "." || seg == ".." {
            return Err(invalid(name, "'.' and '..' segments are not allowed"));
        }
        if seg.len() > MAX_SEGMENT_LEN {
            return Err(invalid(
                name,
                &format!("segment {seg:?} is longer than {MAX_SEGMENT_LEN} bytes"),
            ));
        }
        if let Some(c) = seg
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
        {
            return Err(invalid(
                name,
                &format!(
                    "character {c:?} is not allowed (use ASCII letters, digits, '-', '_', '.', ':')"
                ),
            ));
        }
        if seg.starts_with('.') || seg.starts_with('_') {
            return Err(invalid(
                name,
                &format!("segment {seg:?} starts with '.' or '_', which the lock recipes reserve"),
            ));
        }
        if i > 0 {
            if !seg.starts_with(|c: char| c.is_ascii_alphabetic()) {
                return Err(invalid(
                    name,
                    &format!("nested segment {seg:?} must start with a letter"),
                ));
            }
            if reserve_layout_children && RESERVED_NESTED_SEGMENTS.contains(&seg) {
                return Err(invalid(
                    name,
                    &format!(
                        "nested segment {seg:?} is reserved: a lock's semaphore keeps its own children under that name"
                    ),
                ));
            }
            if let Some(r) = RESERVED_IN_NESTED.iter().find(|r| seg.contains(*r)) {
                return Err(invalid(
                    name,
                    &format!("nested segment {seg:?} contains {r:?}, which marks contender nodes"),
                ));
            }
        }
    }
    Ok(())
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for LockName {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self> {
        LockName::new(s)
    }
}

impl TryFrom<String> for LockName {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        LockName::new(s)
    }
}

impl TryFrom<&String> for LockName {
    type Error = Error;
    fn try_from(s: &String) -> Result<Self> {
        LockName::new(s.as_str())
    }
}

impl TryFrom<&LockName> for LockName {
    type Error = Error;
    fn try_from(s: &LockName) -> Result<Self> {
        Ok(s.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_names() {
        for n in [
            "jobs",
            "jobs/nightly",
            "a:b.c-d_e",
            "db/shard-7/primary",
            "9lives",
            // Only nested segments can be a lock node's own children.
            "leases",
            "locks/x",
            "x/leases2",
            "x/Locks",
            "x/lock",
        ] {
            LockName::new(n).unwrap_or_else(|e| panic!("{n}: {e}"));
        }
    }

    #[test]
    fn rejects_each_rule_with_its_reason() {
        let cases = [
            ("", "empty"),
            ("/a", "start or end"),
            ("a/", "start or end"),
            ("a//b", "empty segment"),
            ("a/../b", "'..'"),
            ("a/./b", "'.'"),
            ("a b", "' '"),
            ("a\nb", "control"),
            ("a\u{0}b", "control"),
            (".lock", "reserve"),
            ("_c_x", "reserve"),
            ("a/9b", "start with a letter"),
            ("a/my-lock-1", "contender"),
            ("a/x__READ__", "contender"),
            ("x/leases", "reserved"),
            ("x/locks", "reserved"),
            ("x/leases/y", "reserved"),
            ("é", "not allowed"),
        ];
        for (n, why) in cases {
            let e = LockName::new(n).expect_err(n);
            assert_eq!(e.kind(), ErrorKind::InvalidName, "{n}");
            assert!(e.to_string().contains(why), "{n}: {e}");
        }
        // A namespace is no lock's child: only rule 6 is lifted.
        validate_namespace("app/locks").unwrap();
        validate_namespace("x/leases/y").unwrap();
        let e = validate_namespace("app/.x").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidName);
        let long = "a".repeat(MAX_NAME_LEN + 1);
        assert!(LockName::new(long)
            .unwrap_err()
            .to_string()
            .contains("limit"));
        let long_seg = "a".repeat(MAX_SEGMENT_LEN + 1);
        assert!(LockName::new(long_seg)
            .unwrap_err()
            .to_string()
            .contains("longer"));
    }
}
