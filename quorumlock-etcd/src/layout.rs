//! Key names and values of the entries, and the store's view of a lock's
//! queue for the rule every store shares
//! ([`quorumlock_core::backend::waits_for`]).
//!
//! Every entry of a lock is a direct child of `<pfx>/` (so Go's
//! `concurrency.Mutex` and `etcdctl lock`, which scan all of `<pfx>/`,
//! count every one of them as a contender ahead of them):
//!
//! | kind | key | value |
//! |---|---|---|
//! | mutex | `<pfx>/<lease hex>` (Go's key) | `ql:x:<unix ms>:<holder value>` |
//! | write | `<pfx>/<lease hex>-w-<uuid>` | `ql:w:<unix ms>:<holder value>` |
//! | read | `<pfx>/.r-<lease hex>-<uuid>` | `ql:r:<unix ms>:<holder value>` |
//! | semaphore | `<pfx>/<lease hex>-s-<uuid>` | `ql:s<permits>:<unix ms>:<holder value>` |
//! | upgradeable read | `<pfx>/.u-<lease hex>-<uuid>` | `ql:u:<unix ms>:<holder value>` |
//! | its upgrade | `<pfx>/<lease hex>-g-<upgradeable's uuid>-<uuid>` | `ql:g:<unix ms>:<holder value>` |
//! | semaphore, k permits at once | the above, and `<it>.<j>` for j in 1..k, in one txn | as above |
//!
//! Go's `Mutex` (`etcdctl lock`) writes an empty value; any value that does
//! not start with `ql:` is a mutex entry whose whole value is the holder's.
//! An election candidate (`LockKind::Election`) is Go's `Election` entry:
//! the mutex's key, with the proposal as its whole value, so ours and
//! `etcdctl elect` candidates queue as one. A proposal that itself starts
//! with `ql:` is stored escaped, as `ql:e:<proposal>`, and read back as the
//! proposal (see [`election_value`]): any bytes are a proposal.
//!
//! Readers start with `.`, which sorts before every hex digit and every
//! letter, so "the writers" (everything that is not a reader) are the key
//! range `[<pfx>/0, <pfx>0)`: a reader finds its nearest older writer
//! with one `limit 1` range read. Upgradeable readers (`.u-`, which a
//! reader does not wait for) sort after the readers (`.r-`), so an
//! upgradeable reader finds the nearest older entry that is not a reader
//! in `[<pfx>/.u, <pfx>0)`, also with one read. An upgrade is in the
//! writers' range (readers wait for it) and names the upgradeable entry
//! it upgrades, which has the same lease. Segments of lock keys never start with `.` (escaped ones start with `~`),
//! so no nested lock name falls among the readers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget};
use quorumlock_core::backend::{upgrade_refused, waits_for, waits_for_linked, AcquireRequest};
use quorumlock_core::LockKind;

/// The prefix of every value this library gives a meaning to.
const RESERVED: &[u8] = b"ql:";

/// What an election proposal that starts with [`RESERVED`] is stored
/// behind.
const ESCAPED: &[u8] = b"ql:e:";

/// The stored value of an election candidate whose proposal is `proposal`:
/// `concurrency.Election`'s value, the proposal alone (which `etcdctl elect
/// -l` prints), unless it starts with `ql:` and would be read as one of our
/// values: then `ql:e:<proposal>`. [`parse`] undoes it.
pub(crate) fn election_value(proposal: &[u8]) -> Vec<u8> {
    if proposal.starts_with(RESERVED) {
        [ESCAPED, proposal].concat()
    } else {
        proposal.to_vec()
    }
}

/// The value we write into a new entry: its kind, creation time and the
/// holder's value.
pub(crate) fn value(kind: LockKind, now: SystemTime, holder: &[u8]) -> Vec<u8> {
    if kind == LockKind::Election {
        return election_value(holder);
    }
    let ms = now
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let k = match kind {
        LockKind::Read => "r".to_string(),
        LockKind::Write => "w".to_string(),
        LockKind::Upgradeable => "u".to_string(),
        LockKind::Upgrade => "g".to_string(),
        LockKind::Semaphore { permits } => format!("s{permits}"),
        _ => "x".to_string(),
    };
    let mut v = format!("ql:{k}:{ms}:").into_bytes();
    v.extend_from_slice(holder);
    v
}

/// Kind, creation time and holder value of an entry from its value.
/// Anything we did not write (Go's empty value, `etcdctl elect`'s
/// proposal) is a mutex entry of unknown age whose value is all of it; so
/// is an escaped election proposal ([`election_value`]), whose value is
/// the proposal.
pub(crate) fn parse(value: &[u8]) -> (LockKind, Option<SystemTime>, Vec<u8>) {
    let fallback = (LockKind::Exclusive, None, value.to_vec());
    let Some(rest) = value.strip_prefix(RESERVED) else {
        return fallback;
    };
    if let Some(proposal) = value
        .strip_prefix(ESCAPED)
        .filter(|p| p.starts_with(RESERVED))
    {
        return (LockKind::Exclusive, None, proposal.to_vec());
    }
    let mut parts = rest.splitn(3, |b| *b == b':');
    let (Some(k), Some(ms)) = (parts.next(), parts.next()) else {
        return fallback;
    };
    let holder = parts.next().unwrap_or_default().to_vec();
    let (Ok(k), Ok(ms)) = (std::str::from_utf8(k), std::str::from_utf8(ms)) else {
        return fallback;
    };
    let kind = match k {
        "x" => LockKind::Exclusive,
        "r" => LockKind::Read,
        "w" => LockKind::Write,
        "u" => LockKind::Upgradeable,
        "g" => LockKind::Upgrade,
        s => match s.strip_prefix('s').and_then(|n| n.parse::<u32>().ok()) {
            Some(permits) if permits > 0 => LockKind::Semaphore { permits },
            _ => return fallback,
        },
    };
    let since = ms
        .parse::<u64>()
        .ok()
        .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
    (kind, since, holder)
}

/// The kind of a stored entry.
pub(crate) fn kind_of(kv: &KeyValue) -> LockKind {
    parse(kv.value()).0
}

/// Our key for an attempt of `kind` by lease `lease` (`contender` is the
/// attempt's uuid; read, write and semaphore entries are one per owner,
/// several of one lease at once, so they carry it).
pub(crate) fn key(pfx: &str, kind: LockKind, lease: i64, contender: &uuid::Uuid) -> String {
    match kind {
        LockKind::Read => format!("{pfx}/.r-{lease:x}-{}", contender.simple()),
        LockKind::Upgradeable => format!("{pfx}/.u-{lease:x}-{}", contender.simple()),
        LockKind::Write => format!("{pfx}/{lease:x}-w-{}", contender.simple()),
        LockKind::Semaphore { .. } => format!("{pfx}/{lease:x}-s-{}", contender.simple()),
        _ => format!("{pfx}/{lease:x}"),
    }
}

/// The key of `req`'s entry by lease `lease`: [`key`], or for an upgrade
/// [`upgrade_key`].
pub(crate) fn request_key(pfx: &str, req: &AcquireRequest, lease: i64) -> String {
    match (req.kind, req.upgrades) {
        (LockKind::Upgrade, Some(of)) => upgrade_key(pfx, lease, &of, &req.contender),
        (kind, _) => key(pfx, kind, lease, &req.contender),
    }
}

/// The key of an upgrade by lease `lease` (`contender` is the attempt's
/// uuid) of the upgradeable entry of contender `upgrades`.
pub(crate) fn upgrade_key(
    pfx: &str,
    lease: i64,
    upgrades: &uuid::Uuid,
    contender: &uuid::Uuid,
) -> String {
    format!(
        "{pfx}/{lease:x}-g-{}-{}",
        upgrades.simple(),
        contender.simple()
    )
}

/// The last segment of the upgradeable entry an upgrade's key names
/// ([`upgrade_key`]): `.u-<lease>-<its uuid>`.
fn upgraded_entry(key: &[u8]) -> Option<Vec<u8>> {
    let last = key.rsplit(|b| *b == b'/').next()?;
    let last = std::str::from_utf8(last).ok()?;
    let (lease, rest) = last.split_once("-g-")?;
    let (of, _) = rest.split_once('-')?;
    Some(format!(".u-{lease}-{of}").into_bytes())
}

/// Whether the entry keyed `a` upgrades the entry keyed `b` (both direct
/// children of one lock), for `quorumlock_core::backend::waits_for_linked`.
pub(crate) fn upgrades(a: &[u8], b: &[u8]) -> bool {
    let last = |k: &[u8]| k.rsplit(|c| *c == b'/').next().map(<[u8]>::to_vec);
    upgraded_entry(a).is_some_and(|u| last(b) == Some(u))
}

/// The other keys of a request for `count` permits at once whose key is
/// `key`: `<key>.<j>` for j in 1..count, written in the same txn (so with
/// the same create revision: one request's keys are the entries of one
/// revision, which hold together).
pub(crate) fn sibling_keys(key: &str, count: u32) -> Vec<String> {
    (1..count).map(|j| format!("{key}.{j}")).collect()
}

/// Start and end of the writers' key range of a lock (everything but the
/// readers).
pub(crate) fn writer_range(pfx: &str) -> (String, String) {
    (format!("{pfx}/0"), format!("{pfx}0"))
}

/// `key` is a contender of the lock whose keys start with `pfx_slash`: a
/// direct child (`<pfx>/<lease hex>`). Keys of nested lock names
/// (`<pfx>/<child>/<lease hex>`) share the prefix but are not contenders.
pub(crate) fn is_contender(pfx_slash: &str, key: &[u8]) -> bool {
    key.strip_prefix(pfx_slash.as_bytes())
        .is_some_and(|rest| !rest.is_empty() && !rest.contains(&b'/'))
}

/// The kind of a contender in the line: [`kind_of`], except that an entry
/// in the writers' range (see [`writer_range`]) is never a reader, whatever
/// its value says (a foreign value that reads like ours, such as an
/// `etcdctl elect` proposal `ql:r:...` on Go's key): a reader's read of
/// [`ahead_query`] finds only the writers, every one of which it waits for.
pub(crate) fn line_kind(key: &[u8], value: &[u8]) -> LockKind {
    let kind = parse(value).0;
    let last = key.rsplit(|b| *b == b'/').next().unwrap_or_default();
    match kind {
        LockKind::Read | LockKind::Upgradeable if last.first().is_some_and(|b| *b >= b'0') => {
            LockKind::Exclusive
        }
        k => k,
    }
}

/// How many entries ahead an entry of `kind` must read to decide by
/// [`waits_for`]: the rule looks no further back than the nearest entry
/// (for a reader, the nearest writer, which the writers' range gives
/// first) or, for a permit, than `permits` places.
pub(crate) fn ahead_limit(kind: LockKind) -> usize {
    match kind {
        LockKind::Semaphore { permits } => permits as usize,
        // The nearest holder ahead, wherever it is: the whole line.
        LockKind::Upgrade => usize::MAX,
        _ => 1,
    }
}

/// What an entry of `kind` waits for, decided by [`waits_for`] on the
/// line the read of [`ahead_query`] shows: `ahead` are the [`line_kind`]s
/// of the entries ahead of it, newest first (at most [`ahead_limit`]), and
/// none of them conflicts with `kind`. `None` when it holds; else how many
/// of the nearest of them it watches: from the entry it waits for to the
/// nearest (for a permit, the release of a nearer one lets it in too; for
/// everyone else that is the one entry).
pub(crate) fn waited(kind: LockKind, ahead: &[LockKind]) -> Option<usize> {
    // Oldest first, then our entry.
    let line: Vec<LockKind> = ahead.iter().rev().copied().chain([kind]).collect();
    let me = ahead.len();
    waits_for(&line, me).map(|j| me - j)
}

/// [`waited`] for an upgrade keyed `mine`: `ahead` is the whole line
/// ahead of it (keys and [`line_kind`]s, newest first), whose keys link
/// upgrades to the entries they upgrade. `Some(n)`: it waits for the
/// `n`th nearest entry (a holder; only that one is to be watched).
/// `Err(())` when the upgrade is to be refused
/// (`quorumlock_core::backend::upgrade_refused`).
pub(crate) fn waited_upgrade(
    mine: &[u8],
    ahead: &[(&[u8], LockKind)],
) -> Result<Option<usize>, ()> {
    let line: Vec<(&[u8], LockKind)> = ahead
        .iter()
        .rev()
        .copied()
        .chain([(mine, LockKind::Upgrade)])
        .collect();
    let kinds: Vec<LockKind> = line.iter().map(|(_, k)| *k).collect();
    let me = ahead.len();
    let link = |i: usize, j: usize| upgrades(line[i].0, line[j].0);
    if upgrade_refused(&kinds, me, link) {
        return Err(());
    }
    Ok(waits_for_linked(&kinds, me, link).map(|j| me - j))
}

/// The range read of what an entry of `kind` waits for: for a reader the
/// writers' key range, for everyone else all of `<pfx>/`; newest first,
/// [`ahead_limit`] of them.
pub(crate) fn ahead_query(pfx: &str, kind: LockKind, before: Option<i64>) -> (String, GetOptions) {
    let mut opts = GetOptions::new().with_sort(SortTarget::Create, SortOrder::Descend);
    let key = if kind == LockKind::Read {
        let (lo, hi) = writer_range(pfx);
        opts = opts.with_range(hi);
        lo
    } else if kind == LockKind::Upgradeable {
        let (_, hi) = writer_range(pfx);
        opts = opts.with_range(hi);
        format!("{pfx}/.u")
    } else {
        opts = opts.with_prefix();
        format!("{pfx}/")
    };
    // In the enqueue txn our own key is among the answer: one more.
    if let Ok(n) = i64::try_from(ahead_limit(kind)) {
        opts = opts.with_limit(n + i64::from(before.is_none()));
    }
    if let Some(rev) = before {
        opts = opts.with_max_create_revision(rev - 1);
    }
    (key, opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        let t = UNIX_EPOCH + Duration::from_millis(1_763_730_000_123);
        for k in [
            LockKind::Exclusive,
            LockKind::Read,
            LockKind::Write,
            LockKind::Semaphore { permits: 7 },
        ] {
            assert_eq!(parse(&value(k, t, b"h:1")), (k, Some(t), b"h:1".to_vec()));
            assert_eq!(
                parse(&value(k, t, b"a:b\n")),
                (k, Some(t), b"a:b\n".to_vec())
            );
        }
        // Values written before holder values existed.
        assert_eq!(
            parse(b"ql:x:5"),
            (
                LockKind::Exclusive,
                Some(UNIX_EPOCH + Duration::from_millis(5)),
                vec![]
            )
        );
    }

    #[test]
    fn foreign_values_are_mutexes_of_unknown_age() {
        for v in [&b""[..], b"hello", b"ql:", b"ql:q:1", b"ql:s0:1", b"\xff"] {
            assert_eq!(parse(v), (LockKind::Exclusive, None, v.to_vec()), "{v:?}");
        }
        assert_eq!(parse(b"ql:w:x"), (LockKind::Write, None, vec![]));
    }

    #[test]
    fn election_values_are_the_proposal_and_any_bytes_round_trip() {
        let t = UNIX_EPOCH + Duration::from_millis(1_763_730_000_123);
        // Ordinary proposals are stored as they are (`etcdctl elect`).
        for p in [
            &b""[..],
            b"node-a",
            b"q",
            b"ql",
            b"QL:x:1:h",
            b" ql:",
            b"\xff",
        ] {
            assert_eq!(value(LockKind::Election, t, p), p.to_vec(), "{p:?}");
            assert_eq!(parse(p), (LockKind::Exclusive, None, p.to_vec()), "{p:?}");
        }
        // Proposals that look like our values (every kind's, the escape's)
        // are escaped and read back as they were.
        for p in [
            &b"ql:"[..],
            b"ql:anything",
            b"ql:x:5",
            b"ql:x:1:h",
            b"ql:r:1:",
            b"ql:w:1:h",
            b"ql:s2:1:h",
            b"ql:e:",
            b"ql:e:x",
            b"ql:e:ql:x:1:h",
            b"ql:\xff",
        ] {
            let stored = value(LockKind::Election, t, p);
            assert_eq!(stored, [&b"ql:e:"[..], p].concat(), "{p:?}");
            assert_eq!(
                parse(&stored),
                (LockKind::Exclusive, None, p.to_vec()),
                "{p:?}"
            );
        }
        // Foreign values that only start like the escape are not ours:
        // read as they are.
        for v in [&b"ql:e:"[..], b"ql:e:x", b"ql:e:ql"] {
            assert_eq!(parse(v), (LockKind::Exclusive, None, v.to_vec()), "{v:?}");
        }
    }

    #[test]
    fn readers_sort_before_writers() {
        let u = uuid::Uuid::nil();
        let (lo, hi) = writer_range("ns/a");
        let r = key("ns/a", LockKind::Read, 0x694d, &u);
        assert!(r.as_str() < lo.as_str());
        for k in [
            LockKind::Exclusive,
            LockKind::Write,
            LockKind::Semaphore { permits: 2 },
        ] {
            let w = key("ns/a", k, 0x694d, &u);
            assert!(lo.as_str() <= w.as_str() && w.as_str() < hi.as_str(), "{w}");
        }
        assert_eq!(key("ns/a", LockKind::Exclusive, 0x694d, &u), "ns/a/694d");
    }

    #[test]
    fn the_shared_rule_decides_on_the_line_the_read_shows() {
        use LockKind::*;
        let sem2 = Semaphore { permits: 2 };
        // Nothing ahead: every kind holds.
        for k in [Exclusive, Election, Read, Write, sem2] {
            assert_eq!(waited(k, &[]), None, "{k:?}");
        }
        // A mutex, writer or candidate waits for the nearest entry, a
        // reader for the nearest writer (all its read finds).
        for k in [Exclusive, Election, Write, Read] {
            assert_eq!(waited(k, &[Write]), Some(1), "{k:?}");
            assert_eq!(waited(k, &[Exclusive]), Some(1), "{k:?}");
        }
        assert_eq!(waited(Write, &[Read]), Some(1));
        // A permit holds with fewer than `permits` ahead, else watches
        // them all.
        assert_eq!(waited(sem2, &[sem2]), None);
        assert_eq!(waited(sem2, &[sem2, sem2]), Some(2));
        assert_eq!(ahead_limit(sem2), 2);
        assert_eq!(ahead_limit(Read), 1);
        // The reader's view: a writer's key is a writer whatever its
        // value says; a reader's key is a reader.
        let t = UNIX_EPOCH;
        let r = value(Read, t, b"");
        assert_eq!(line_kind(b"ns/a/694d", &r), Exclusive);
        assert_eq!(line_kind(b"ns/a/694d-w-00", &r), Exclusive);
        assert_eq!(line_kind(b"ns/a/.r-694d-00", &r), Read);
        assert_eq!(line_kind(b"ns/a/694d", b""), Exclusive);
        assert_eq!(line_kind(b"ns/a/694d-s-00", &value(sem2, t, b"")), sem2);
        assert_eq!(waited(Read, &[line_kind(b"ns/a/694d", &r)]), Some(1));
    }

    #[test]
    fn upgradeable_readers_sort_between_readers_and_writers() {
        let (u, c) = (uuid::Uuid::from_u128(1), uuid::Uuid::from_u128(2));
        let (lo, hi) = writer_range("ns/a");
        let reader = key("ns/a", LockKind::Read, 0x694d, &c);
        let upgradeable = key("ns/a", LockKind::Upgradeable, 0x694d, &u);
        let upgrade = upgrade_key("ns/a", 0x694d, &u, &c);
        // A reader's read of the writers' range misses the upgradeable
        // entry and finds the upgrade; an upgradeable reader's read
        // finds both, never a reader.
        assert!(upgradeable.as_str() < lo.as_str());
        assert!(lo.as_str() <= upgrade.as_str() && upgrade.as_str() < hi.as_str());
        let (from, _) = ahead_query("ns/a", LockKind::Upgradeable, None);
        assert!(reader < from && from.as_str() <= upgradeable.as_str());
        assert!(upgrades(upgrade.as_bytes(), upgradeable.as_bytes()));
        assert!(!upgrades(upgradeable.as_bytes(), upgrade.as_bytes()));
        let other = key("ns/a", LockKind::Upgradeable, 0x694d, &c);
        assert!(!upgrades(upgrade.as_bytes(), other.as_bytes()));
        let t = UNIX_EPOCH;
        let v = value(LockKind::Upgradeable, t, b"h");
        assert_eq!(parse(&v).0, LockKind::Upgradeable);
        assert_eq!(line_kind(upgradeable.as_bytes(), &v), LockKind::Upgradeable);
        assert_eq!(line_kind(b"ns/a/694d", &v), LockKind::Exclusive);
        assert_eq!(
            parse(&value(LockKind::Upgrade, t, b"")).0,
            LockKind::Upgrade
        );
        // The upgrade waits for the reader granted beside its entry, not
        // for the entry; then holds.
        let r = reader.as_bytes();
        let ahead = [
            (r, LockKind::Read),
            (upgradeable.as_bytes(), LockKind::Upgradeable),
        ];
        assert_eq!(waited_upgrade(upgrade.as_bytes(), &ahead), Ok(Some(1)));
        assert_eq!(waited_upgrade(upgrade.as_bytes(), &ahead[1..]), Ok(None));
        // A reader waits behind a writer that waits for the upgradeable
        // entry: refused.
        let w = key("ns/a", LockKind::Write, 0x694e, &c);
        let behind = [
            (r, LockKind::Read),
            (w.as_bytes(), LockKind::Write),
            (upgradeable.as_bytes(), LockKind::Upgradeable),
        ];
        assert_eq!(waited_upgrade(upgrade.as_bytes(), &behind), Err(()));
        assert_eq!(ahead_limit(LockKind::Upgrade), usize::MAX);
    }

    #[test]
    fn contenders_are_direct_children() {
        assert!(is_contender("ns/a/", b"ns/a/694d7c3a2f1b4e05"));
        assert!(!is_contender("ns/a/", b"ns/a/"));
        assert!(!is_contender("ns/a/", b"ns/a/beef/694d"));
        assert!(!is_contender("ns/a/", b"ns/ab/694d"));
    }
}
