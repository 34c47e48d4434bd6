//! The key layout (the README's "Layout" section) and the text forms the
//! scripts and the Rust side share.
//!
//! With `P` the namespace prefix (`<ns>/`, or empty) and `L = P<name>`:
//!
//! | key | type | what |
//! |---|---|---|
//! | `P.session/<sid>` | string, PX ttl | the session (lease) |
//! | `P.session/<sid>/.mail` | list | the session's mailbox: grants, losses, revokes |
//! | `P.session/<sid>/.locks` | set, a TTL past the session | the session's entries, by [`entry_name`] (the session's end settles their queues, also once the session key expired) |
//! | `P.session/<sid>/.stray` | hash | entries of the session its client no longer owns -> the renewal that found them (removed by the next) |
//! | `P.session/<sid>/.fenced` | zset | contenders of attempts abandoned with a write of unknown outcome: a late copy of their enqueue writes nothing |
//! | `L/.q` | zset | the queue: contender id by arrival number (a request for k permits at once: `<id>.<j>.<k>` for its first k-1 entries, side by side, then `<id>`) |
//! | `L/.e` | hash | contender id -> `kind permits sid created_ms token P` |
//!
//! An entry's session is `P.session/<sid>` with the `P` the entry names
//! (that of the client that wrote it), not the reader's: lock `x` of
//! namespace `app` is lock `app/x` one namespace up.
//! | `L/.v` | hash | contender id -> the holder's value (absent when empty) |
//! | `L/.n` | string | the per-name counter: arrival numbers and tokens |
//!
//! No segment of a lock's key starts with `.` (quorumlock_core's `LockName::key`), so none
//! of these keys is another lock's key.

use quorumlock_core::{Error, ErrorKind, LockKind, LockName, Result};

/// `L`: the prefix of every key of one lock (the name's store key,
/// escaped where quorumlock_core's rule says).
pub(crate) fn lock_key(prefix: &str, name: &LockName) -> String {
    format!("{prefix}{}", name.key())
}

/// The session key of `sid`.
pub(crate) fn session_key(prefix: &str, sid: &str) -> String {
    format!("{prefix}.session/{sid}")
}

/// The store's name of an entry ([`quorumlock_core::Acquired::entry`]).
pub(crate) fn entry_name(lock_key: &str, contender: &str) -> String {
    format!("{lock_key}/.q/{contender}")
}

/// The id of `req`'s entry (the last, for several permits): its
/// contender, and for an upgrade `g` and the contender of the upgradeable
/// entry it upgrades (the scripts' `upgraded`).
pub(crate) fn request_id(req: &quorumlock_core::backend::AcquireRequest) -> String {
    match (req.kind, req.upgrades) {
        (LockKind::Upgrade, Some(of)) => {
            format!("{}g{}", req.contender.simple(), of.simple())
        }
        _ => req.contender.simple().to_string(),
    }
}

/// The lock key and contender id of an [`entry_name`].
pub(crate) fn parse_entry_name(entry: &str) -> Option<(&str, &str)> {
    entry.rsplit_once("/.q/")
}

/// The contender of entry `id`: its request's, for one of the entries of a
/// request for several permits (`<contender>.<j>.<k>`).
pub(crate) fn contender_of(id: &str) -> &str {
    id.split('.').next().unwrap_or(id)
}

/// Whether `entry` (an `L/.e` value, `kind permits sid created token P`)
/// is session `sid`'s of prefix `prefix`, granted with `token` (the
/// scripts' `parse`).
pub(crate) fn entry_is(entry: &str, sid: &str, prefix: &str, token: u64) -> bool {
    let mut f = entry.splitn(6, ' ');
    let (Some(kind), Some(permits), Some(s), Some(created), Some(t), Some(p)) =
        (f.next(), f.next(), f.next(), f.next(), f.next(), f.next())
    else {
        return false;
    };
    let digits = |x: &str| !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit());
    kind.len() == 1
        && kind.bytes().all(|b| b.is_ascii_alphabetic())
        && digits(permits)
        && digits(created)
        && s == sid
        && p == prefix
        && digits(t)
        && t.parse::<u64>() == Ok(token)
}

/// A session id: 32 lowercase hex digits (a UUID without dashes).
pub(crate) fn check_session_id(sid: &str) -> Result<()> {
    if sid.len() == 32 && sid.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("{sid:?} is not a Redis session id (32 lowercase hex digits)"),
        ))
    }
}

/// The one-letter kind and the permit count the scripts store.
pub(crate) fn kind_code(kind: LockKind) -> (&'static str, u32) {
    match kind {
        LockKind::Read => ("r", 0),
        LockKind::Write => ("w", 0),
        LockKind::Upgradeable => ("u", 0),
        LockKind::Upgrade => ("g", 0),
        LockKind::Semaphore { permits } => ("s", permits),
        _ => ("x", 0),
    }
}

/// The inverse of [`kind_code`].
pub(crate) fn kind_of(code: &str, permits: u32) -> LockKind {
    match code {
        "r" => LockKind::Read,
        "w" => LockKind::Write,
        "u" => LockKind::Upgradeable,
        "g" => LockKind::Upgrade,
        "s" => LockKind::Semaphore { permits },
        _ => LockKind::Exclusive,
    }
}

/// A glob pattern matching every key that starts with `prefix`.
pub(crate) fn glob_prefix(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('*');
    out
}

/// Whether a key under the namespace is store bookkeeping rather than an
/// entry: the per-name counters (kept so tokens never go back), and
/// session keys and what lives with them (reported per session).
pub(crate) fn is_bookkeeping(prefix: &str, key: &str) -> bool {
    let rest = key.strip_prefix(prefix).unwrap_or(key);
    rest.starts_with(".session/") || key.ends_with("/.n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_round_trip_and_ids_are_checked() {
        let e = entry_name("ns/a/b", "0123");
        assert_eq!(e, "ns/a/b/.q/0123");
        assert_eq!(parse_entry_name(&e), Some(("ns/a/b", "0123")));
        assert!(check_session_id(&uuid::Uuid::new_v4().simple().to_string()).is_ok());
        for bad in ["", "xyz", "0123456789ABCDEF0123456789abcdef"] {
            let e = check_session_id(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}");
        }
    }

    #[test]
    fn entries_are_read_as_the_scripts_read_them() {
        let sid = "0123456789abcdef0123456789abcdef";
        let e = format!("x 0 {sid} 1700000000000 42 ns/");
        assert!(entry_is(&e, sid, "ns/", 42));
        assert!(!entry_is(&e, sid, "ns/", 43), "another grant");
        assert!(!entry_is(&e, sid, "", 42), "another namespace's");
        assert!(
            !entry_is(&e, &sid.replace('0', "1"), "ns/", 42),
            "another session's"
        );
        // A prefix may hold spaces: the rest of the value.
        let spaced = format!("s 3 {sid} 1 7 a b/");
        assert!(entry_is(&spaced, sid, "a b/", 7));
        for bad in [
            "",
            "x 0",
            &format!("xx 0 {sid} 1 42 ns/"),
            &format!("x 0 {sid} 1 -42 ns/"),
        ] {
            assert!(!entry_is(bad, sid, "ns/", 42), "{bad:?}");
        }
        assert_eq!(contender_of("abc"), "abc");
        assert_eq!(contender_of("abc.1.3"), "abc");
        assert_eq!(contender_of("abcgdef"), "abcgdef");
    }

    #[test]
    fn kinds_round_trip_and_globs_escape() {
        for k in [
            LockKind::Exclusive,
            LockKind::Read,
            LockKind::Write,
            LockKind::Semaphore { permits: 3 },
        ] {
            let (c, p) = kind_code(k);
            assert_eq!(kind_of(c, p), k);
        }
        assert_eq!(glob_prefix("a*b/"), "a\\*b/*");
        assert!(is_bookkeeping("ns/", "ns/.session/ab"));
        assert!(is_bookkeeping("ns/", "ns/lock/.n"));
        assert!(!is_bookkeeping("ns/", "ns/lock/.q"));
    }
}
