//! Lock names: any non-empty UTF-8 text up to [`MAX_NAME_LEN`] bytes, and
//! the one rule that turns a name into the store key every backend uses.

use std::borrow::Cow;
use std::fmt;

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::{Error, ErrorKind, Result};

/// Longest lock name, in bytes (of the name, not of its escaped key: an
/// escaped key is at most about three times as long, which every store
/// holds).
pub const MAX_NAME_LEN: usize = 200;
/// Longest segment that is kept as-is in the store key; a longer one is
/// escaped (see [`LockName`]).
pub const MAX_SEGMENT_LEN: usize = 64;

/// Substrings that the Curator layout uses to recognise contender nodes
/// among a lock node's children (`lock-` of mutexes and leader selectors,
/// `latch-` of leader latches, `lease-` of semaphores, the read-write
/// lock's `__READ__`/`__WRIT__`); a nested segment that contains one is
/// escaped.
const RESERVED_IN_NESTED: [&str; 5] = ["lock-", "latch-", "lease-", "__READ__", "__WRIT__"];

/// Children that a store layout puts under a lock's own node: ZooKeeper's
/// semaphore keeps its internal mutex in `locks` and its leases in
/// `leases` (Curator's `InterProcessSemaphoreV2`). A nested segment of
/// that name is escaped, so `p/leases` is a lock of its own and never
/// that node. (Consul's own children, `.lock`, `.queue`, `.rw`,
/// `.revoke`, start with `.`; etcd puts only contender keys under a
/// lock's prefix, and names nested ones by a further `/`.)
pub const RESERVED_NESTED_SEGMENTS: [&str; 2] = ["leases", "locks"];

/// The first character of an escaped segment. It is outside the native
/// characters (so no native segment starts with it), it is no recipe's
/// marker, and it sorts after every digit and letter: Curator sorts a lock
/// node's children by their text, and a nested lock's node must sort after
/// every sequence number (`0000000001`) or Curator would wait for it.
const ESCAPE_MARK: char = '~';

/// What an escaped segment keeps as-is: ASCII letters, digits, `.` and
/// `:`. Everything else, `-`, `_`, `%` and `~` included, becomes `%XX`:
/// without `-` and `_` no escaped segment can contain `lock-`, `lease-`,
/// `__READ__`, `__WRIT__` or start like a recipe's `_c_` node.
const ESCAPED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'.').remove(b':');

/// A lock name: any non-empty UTF-8 text of at most [`MAX_NAME_LEN`]
/// bytes. Only the empty name and longer names are refused
/// ([`ErrorKind::InvalidName`], before anything reaches a store).
///
/// # Store keys
///
/// A name is split at `/` into segments; `a/b` is the lock `b` nested
/// under `a` (on ZooKeeper its node is a child of `a`'s node, elsewhere
/// its keys start with `a`'s key and a `/`), so [`crate::LockClient::list`]
/// of `a` finds it. Each segment is either *native* and kept as-is, or
/// escaped; the key is the segments joined by `/` again. A segment is
/// native when:
///
/// 1. it is 1 to [`MAX_SEGMENT_LEN`] bytes of ASCII letters, digits, `-`,
///    `_`, `.` and `:` (every store and shell takes these unquoted), and is
///    not `.` or `..`;
/// 2. it does not start with `.` or `_` (`.lock`, `.queue`, `.revoke`,
///    `_c_` nodes are the recipes' own);
/// 3. if it is not the first segment: it starts with a letter and neither
///    contains `lock-`, `latch-`, `lease-`, `__READ__` or `__WRIT__` nor is
///    `leases` or `locks` ([`RESERVED_NESTED_SEGMENTS`]). On ZooKeeper a
///    nested lock's node is a child of its parent lock's node, where
///    Curator treats every child as a contender sorted by the text after
///    `lock-` (a letter sorts after every sequence number), and the
///    semaphore keeps its `leases` and `locks` there.
///
/// Any other segment (an empty one, as in `a//b`, included) is written as
/// `~` followed by its UTF-8 bytes percent-encoded, keeping only ASCII
/// letters, digits, `.` and `:`: `user@example.com` is
/// `~user%40example.com`, `orders/42` is `orders/~42`,
/// `jobs/lock-rotation` is `jobs/~lock%2Drotation`, `.hidden` is
/// `~.hidden`, `a//b` is `a/~/b`. The rule is the same on every store
/// ([`LockName::key`]) and is undone by [`LockName::from_key`].
///
/// Why this never collides: a native segment never contains `~`, and an
/// escaped one always starts with it, so a key tells which segments are
/// escaped; percent-encoding is one-to-one; and an escaped segment holds
/// only letters, digits, `.`, `:`, `%` and `~`, so it is never one of a
/// layout's reserved children (`.lock`, `leases`, `_c_...-lock-...`).
/// Names whose segments are all native keep the keys they always had, so
/// `etcdctl lock`, Curator and `consul lock` on such a name meet ours.
///
/// The namespace (the URL path) is not part of the name, and keeps the
/// native rules: it is never escaped.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(String);

impl LockName {
    /// Checks `name`: non-empty, at most [`MAX_NAME_LEN`] bytes.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        if name.is_empty() {
            return Err(invalid(&name, "it is empty"));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(invalid(
                &name,
                &format!(
                    "it is {} bytes long, the limit is {MAX_NAME_LEN}",
                    name.len()
                ),
            ));
        }
        Ok(LockName(name))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The segments of the name (split at `/`; empty ones included).
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// Whether every segment is native: the store key is the name itself.
    pub fn is_native(&self) -> bool {
        self.segments()
            .enumerate()
            .all(|(i, s)| native_segment(s, i > 0, true).is_ok())
    }

    /// The store key of the name (below the namespace), by the rule in the
    /// type's docs: the name itself if every segment is native.
    pub fn key(&self) -> Cow<'_, str> {
        if self.is_native() {
            return Cow::Borrowed(&self.0);
        }
        let segs: Vec<Cow<'_, str>> = self
            .segments()
            .enumerate()
            .map(|(i, s)| match native_segment(s, i > 0, true) {
                Ok(()) => Cow::Borrowed(s),
                Err(_) => Cow::Owned(format!("{ESCAPE_MARK}{}", utf8_percent_encode(s, ESCAPED))),
            })
            .collect();
        Cow::Owned(segs.join("/"))
    }

    /// The name whose [`key`](LockName::key) is `key`, if any: the
    /// inverse, for listing a store. `None` for text that no name is
    /// written as (another tool's key, a layout's own child, a
    /// non-canonical escape).
    pub fn from_key(key: &str) -> Option<LockName> {
        let mut segs = Vec::new();
        for (i, s) in key.split('/').enumerate() {
            match s.strip_prefix(ESCAPE_MARK) {
                Some(esc) => segs.push(percent_decode_str(esc).decode_utf8().ok()?),
                None => {
                    native_segment(s, i > 0, true).ok()?;
                    segs.push(Cow::Borrowed(s));
                }
            }
        }
        let name = LockName::new(segs.join("/")).ok()?;
        (name.key() == key).then_some(name)
    }
}

fn invalid(name: &str, rule: &str) -> Error {
    // A name of megabytes must not make an error of megabytes: its
    // first 64 characters say which name it was.
    let shown = match name.char_indices().nth(64) {
        None => format!("{:?}", name.escape_debug().to_string()),
        Some((at, _)) => format!(
            "{:?}... ({} bytes)",
            name[..at].escape_debug().to_string(),
            name.len()
        ),
    };
    Error::new(
        ErrorKind::InvalidName,
        format!("lock name {shown} is invalid: {rule}"),
    )
}

/// Checks a namespace (the URL path) by the native rules: every segment
/// native, except that `leases` and `locks` are allowed (the namespace is
/// the directory that lock nodes live in, never a child of a lock's node,
/// so `app/locks` is a fine namespace).
pub(crate) fn validate_namespace(path: &str) -> Result<()> {
    let name = LockName::new(path)?;
    for (i, seg) in name.segments().enumerate() {
        native_segment(seg, i > 0, false).map_err(|rule| invalid(path, &rule))?;
    }
    Ok(())
}

/// Whether `seg` is native ([`LockName`]'s rules 1 to 3); `Err` says why
/// not. `nested`: not the first segment. `reserve_layout_children`: apply
/// [`RESERVED_NESTED_SEGMENTS`].
fn native_segment(
    seg: &str,
    nested: bool,
    reserve_layout_children: bool,
) -> std::result::Result<(), String> {
    if seg.is_empty() {
        return Err("it has an empty segment (a leading, trailing or doubled '/')".into());
    }
    if seg == "." || seg == ".." {
        return Err("'.' and '..' segments are not allowed".into());
    }
    if seg.len() > MAX_SEGMENT_LEN {
        return Err(format!(
            "segment {seg:?} is longer than {MAX_SEGMENT_LEN} bytes"
        ));
    }
    if let Some(c) = seg
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
    {
        return Err(format!(
            "character {c:?} is not allowed (use ASCII letters, digits, '-', '_', '.', ':')"
        ));
    }
    if seg.starts_with('.') || seg.starts_with('_') {
        return Err(format!(
            "segment {seg:?} starts with '.' or '_', which the lock recipes reserve"
        ));
    }
    if nested {
        if !seg.starts_with(|c: char| c.is_ascii_alphabetic()) {
            return Err(format!("nested segment {seg:?} must start with a letter"));
        }
        if reserve_layout_children && RESERVED_NESTED_SEGMENTS.contains(&seg) {
            return Err(format!(
                "nested segment {seg:?} is reserved: a lock's semaphore keeps its own children under that name"
            ));
        }
        if let Some(r) = RESERVED_IN_NESTED.iter().find(|r| seg.contains(*r)) {
            return Err(format!(
                "nested segment {seg:?} contains {r:?}, which marks contender nodes"
            ));
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

    /// Names that were valid before escaping existed: their keys are the
    /// names themselves, as they always were.
    #[test]
    fn native_names_keep_their_keys() {
        for n in [
            "jobs",
            "jobs/nightly",
            "a:b.c-d_e",
            "db/shard-7/primary",
            "9lives",
            "leases",
            "locks/x",
            "x/leases2",
            "x/Locks",
            "x/lock",
        ] {
            let name = LockName::new(n).unwrap();
            assert!(name.is_native(), "{n}");
            assert_eq!(name.key(), n);
            assert_eq!(LockName::from_key(n), Some(name));
        }
    }

    #[test]
    fn other_names_are_escaped_and_round_trip() {
        let cases = [
            ("orders/42", "orders/~42"),
            ("orders/3f2a9c", "orders/~3f2a9c"),
            ("user@example.com", "~user%40example.com"),
            ("jobs/lock-rotation", "jobs/~lock%2Drotation"),
            ("my lock", "~my%20lock"),
            ("caf\u{e9}/\u{1f512}", "~caf%C3%A9/~%F0%9F%94%92"),
            (".hidden", "~.hidden"),
            ("a//b", "a/~/b"),
            ("/a", "~/a"),
            ("a/", "a/~"),
            ("a/../b", "a/~../b"),
            ("x/leases", "x/~leases"),
            ("x/__READ__", "x/~%5F%5FREAD%5F%5F"),
            ("_c_x", "~%5Fc%5Fx"),
            ("~", "~%7E"),
            ("50%", "~50%25"),
            ("ctl\u{7}", "~ctl%07"),
        ];
        for (n, k) in cases {
            let name = LockName::new(n).unwrap();
            assert!(!name.is_native(), "{n}");
            assert_eq!(name.key(), k, "{n}");
            assert_eq!(LockName::from_key(k).as_ref(), Some(&name), "{k}");
        }
        let long_seg = "a".repeat(MAX_SEGMENT_LEN + 1);
        let name = LockName::new(long_seg.as_str()).unwrap();
        assert_eq!(name.key(), format!("~{long_seg}"));
    }

    /// No escaped key is a native name's key, nor a layout's child: it
    /// holds a `~` and never a recipe marker.
    #[test]
    fn escaped_keys_never_collide() {
        for n in [
            "a/lock-",
            "a/lock-1",
            "a/b-lease-2",
            "jobs/latch-0",
            "e/_c_1-latch-0000000001",
            "x/locks",
            "x/_c_1-lock-0000000001",
        ] {
            let k = LockName::new(n).unwrap().key().into_owned();
            assert!(k.contains('~'), "{n}: {k}");
            for seg in k.split('/').filter(|s| s.starts_with('~')) {
                assert!(
                    !RESERVED_IN_NESTED.iter().any(|r| seg.contains(r)),
                    "{n}: {k}"
                );
                assert!(!RESERVED_NESTED_SEGMENTS.contains(&seg), "{n}: {k}");
            }
        }
        // Keys no name is written as.
        for k in [
            "a/9b", ".lock", "a/.lock", "~abc", "a/~b", "~%zz", "~%FF", "", "a//b",
        ] {
            assert_eq!(LockName::from_key(k), None, "{k}");
        }
    }

    #[test]
    fn a_huge_name_makes_a_short_error() {
        let e = LockName::new("n".repeat(10 << 20)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidName);
        assert!(e.to_string().len() < 300, "{}", e.to_string().len());
        assert!(e.to_string().contains("10485760 bytes"), "{e}");
    }

    #[test]
    fn only_empty_and_overlong_names_are_refused() {
        let e = LockName::new("").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidName);
        assert!(e.to_string().contains("empty"), "{e}");
        let long = "a".repeat(MAX_NAME_LEN + 1);
        let e = LockName::new(long).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidName);
        assert!(e.to_string().contains("limit"), "{e}");
        LockName::new("\u{e9}".repeat(MAX_NAME_LEN / 2)).unwrap();
    }

    #[test]
    fn namespaces_keep_the_native_rules() {
        validate_namespace("app/locks").unwrap();
        validate_namespace("x/leases/y").unwrap();
        for (bad, why) in [
            ("app/.x", "reserve"),
            ("a//b", "empty segment"),
            ("a b", "' '"),
            ("a/9b", "start with a letter"),
            ("a/my-lock-1", "contender"),
            ("\u{e9}", "not allowed"),
        ] {
            let e = validate_namespace(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidName, "{bad}");
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
    }
}
