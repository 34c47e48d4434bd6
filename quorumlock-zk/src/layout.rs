//! Curator's node layout: node names and markers, the order of a queue
//! and the kinds of its entries (what each waits for is
//! `quorumlock_core::backend::waits_for`), the data of revoke, break and
//! semaphore nodes.

use quorumlock_core::backend::AcquireRequest;
use quorumlock_core::LockKind;

/// The data Curator's `Revoker` writes on a holder's node.
pub(crate) const REVOKE_MESSAGE: &[u8] = b"__REVOKE__";
/// The data `break_lock` writes on a holder's node before deleting it, so
/// that our holder (watching its own node) learns of the break one write
/// before any waiter can be granted.
pub(crate) const BREAK_MESSAGE: &[u8] = b"__BREAK__";
/// The text before the sequence number in a contender node's name.
pub(crate) const LOCK_MARKER: &str = "lock-";
/// The text before the sequence number of an election candidate's node
/// (Curator's `LeaderLatch`: `_c_<uuid>-latch-<seq>`).
pub(crate) const LATCH_MARKER: &str = "latch-";
/// The marker of a read contender (Curator's `InterProcessReadWriteLock`).
pub(crate) const READ_MARKER: &str = "__READ__";
/// The marker of a write contender.
pub(crate) const WRITE_MARKER: &str = "__WRIT__";
/// Put before the read marker by an upgradeable reader
/// (`_c_<guid>-up-__READ__<seq>`), and before `<guid>-__WRIT__` by its
/// upgrade (`_c_<guid>-up-<upgraded contender, 32 hex>-__WRIT__<seq>`):
/// Curator's read-write lock, which looks only at the markers, takes them
/// for a reader and a writer, which they exclude as.
pub(crate) const UPGRADE_TAG: &str = "up-";
/// The marker of a semaphore lease (Curator's `InterProcessSemaphoreV2`).
pub(crate) const LEASE_MARKER: &str = "lease-";
/// The child of a semaphore node holding its internal mutex.
pub(crate) const SEM_LOCKS: &str = "locks";
/// The child of a semaphore node holding its leases.
pub(crate) const SEM_LEASES: &str = "leases";

/// What a contender directly under a lock node asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// `-lock-`: a mutex; it waits like a writer.
    Mutex,
    /// `-__READ__`.
    Read,
    /// `-__WRIT__`.
    Write,
    /// `-latch-`: an election candidate (Curator's `LeaderLatch`); it
    /// waits like a mutex.
    Latch,
    /// `-up-__READ__`: an upgradeable reader.
    Upgradeable,
    /// `-up-<hex>-__WRIT__`: the upgrade of an upgradeable reader.
    Upgrade,
}

impl Role {
    pub(crate) fn of(kind: LockKind) -> Role {
        match kind {
            LockKind::Read => Role::Read,
            LockKind::Write => Role::Write,
            LockKind::Election => Role::Latch,
            LockKind::Upgradeable => Role::Upgradeable,
            LockKind::Upgrade => Role::Upgrade,
            _ => Role::Mutex,
        }
    }

    /// The marker that orders the node (Curator's `fixForSorting`).
    pub(crate) fn marker(self) -> &'static str {
        match self {
            Role::Mutex => LOCK_MARKER,
            Role::Read | Role::Upgradeable => READ_MARKER,
            Role::Write | Role::Upgrade => WRITE_MARKER,
            Role::Latch => LATCH_MARKER,
        }
    }

    pub(crate) fn kind(self) -> LockKind {
        match self {
            Role::Mutex => LockKind::Exclusive,
            Role::Read => LockKind::Read,
            Role::Write => LockKind::Write,
            Role::Latch => LockKind::Election,
            Role::Upgradeable => LockKind::Upgradeable,
            Role::Upgrade => LockKind::Upgrade,
        }
    }
}

/// What a contender node of `req` is named with, after its GUID and
/// before the sequence number.
pub(crate) fn create_marker(req: &AcquireRequest) -> String {
    match (req.kind, req.upgrades) {
        (LockKind::Upgradeable, _) => format!("{UPGRADE_TAG}{READ_MARKER}"),
        (LockKind::Upgrade, Some(of)) => format!("{UPGRADE_TAG}{}-{WRITE_MARKER}", of.simple()),
        (kind, _) => Role::of(kind).marker().to_string(),
    }
}

/// The contender (32 hex digits) whose upgradeable entry `child`
/// upgrades, for an upgrade's node.
fn upgraded_contender(child: &str) -> Option<&str> {
    let head = &child[..child.rfind(WRITE_MARKER)?];
    let hex = head
        .strip_suffix('-')?
        .rsplit_once(&format!("-{UPGRADE_TAG}"))?
        .1;
    (hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
}

/// The links of the upgrades in `sorted` (a queue in
/// [`sort_contenders`]'s order) to the upgradeable entries they upgrade,
/// for `quorumlock_core::backend::waits_for_linked`: `links(sorted)(i, j)`
/// says whether entry `i` upgrades entry `j` (same GUID).
pub(crate) fn links(sorted: &[String]) -> impl Fn(usize, usize) -> bool + Copy + '_ {
    move |i, j| {
        let Some(of) = upgraded_contender(&sorted[i]) else {
            return false;
        };
        guid_prefix(&sorted[j]).is_some_and(|g| g[3..g.len() - 1].replace('-', "") == of)
            && classify(&sorted[j]).is_some_and(|(r, _)| r == Role::Upgradeable)
    }
}

/// The role of a contender and the part of its name that orders it: the
/// text after the LAST marker (Curator's `fixForSorting`, which the
/// read-write lock applies for both of its markers). `None` for other
/// children (nested locks, a semaphore's `locks`/`leases`).
///
/// One pass from the end, which stops at the first marker met (a few
/// bytes from the end in a contender's name), rather than a search for
/// each marker over the whole name: a contender classifies every child
/// at each read of its queue. No marker is a prefix of another, so at
/// most one starts at a given byte.
pub(crate) fn classify(child: &str) -> Option<(Role, &str)> {
    const ROLES: [Role; 4] = [Role::Mutex, Role::Read, Role::Write, Role::Latch];
    let bytes = child.as_bytes();
    let (i, role) = (0..bytes.len()).rev().find_map(|i| {
        let rest = &bytes[i..];
        ROLES
            .into_iter()
            .find(|r| rest.starts_with(r.marker().as_bytes()))
            .map(|r| (i, r))
    })?;
    // A marker is ASCII, so `i` is a character boundary.
    let head = &child[..i];
    let role = match role {
        Role::Read if tagged_upgradeable(head) => Role::Upgradeable,
        Role::Write if upgraded_contender(child).is_some() => Role::Upgrade,
        r => r,
    };
    Some((role, &child[i + role.marker().len()..]))
}

/// Whether the text before a read marker ends with `-up-`: an upgradeable
/// reader's.
fn tagged_upgradeable(head: &str) -> bool {
    head.strip_suffix(UPGRADE_TAG)
        .is_some_and(|h| h.ends_with('-'))
}

/// Contender children (mutex, read and write entries: one queue) sorted by
/// their sequence number; other children (nested locks) are left out.
pub(crate) fn sort_contenders(children: Vec<String>) -> Vec<String> {
    sort_by_tail(children, |c| Some(c.len() - classify(c)?.1.len()))
}

/// The children for which `tail_at` finds where their sort key starts,
/// in the (stable) order of those keys. `tail_at` runs once per child,
/// not at each of the sort's comparisons: with `classify` (then four
/// marker searches) at every comparison, the searches were a fifth of the
/// client process's CPU samples with 32 clients contending.
fn sort_by_tail(children: Vec<String>, tail_at: impl Fn(&str) -> Option<usize>) -> Vec<String> {
    let mut keyed: Vec<(usize, String)> = children
        .into_iter()
        .filter_map(|c| Some((tail_at(&c)?, c)))
        .collect();
    keyed.sort_by(|(i, a), (j, b)| a[*i..].cmp(&b[*j..]));
    keyed.into_iter().map(|(_, c)| c).collect()
}

/// The kinds of the entries of a queue ([`sort_contenders`]'s order), for
/// the queue rule `quorumlock_core::backend::waits_for`: a `-lock-` node
/// is a mutex, a `-latch-` node an election candidate (a mutex too), the
/// read-write markers a reader or a writer. Its answer is an index into
/// `sorted`.
pub(crate) fn kinds(sorted: &[String]) -> Vec<LockKind> {
    sorted
        .iter()
        .map(|c| classify(c).map_or(LockKind::Exclusive, |(role, _)| role.kind()))
        .collect()
}

/// Lease (or semaphore lock) children sorted by their sequence number.
pub(crate) fn sort_by_marker(children: Vec<String>, marker: &str) -> Vec<String> {
    sort_by_tail(children, |c| Some(c.rfind(marker)? + marker.len()))
}

/// The data of our semaphore nodes: the holder's value, then
/// `permits=<N>` on a line of its own (just `permits=<N>` without a value).
pub(crate) fn permits_data(permits: u32, value: &[u8]) -> Vec<u8> {
    let mut d = value.to_vec();
    if !d.is_empty() {
        d.push(b'\n');
    }
    d.extend(format!("permits={permits}").into_bytes());
    d
}

/// Whether an operator's break marked this node (it is deleted right
/// after): its holder has been told of the loss, so nobody holds by it.
/// A holder's value never reads as a mark ([`value_data`]).
pub(crate) fn is_broken(data: &[u8]) -> bool {
    data.starts_with(BREAK_MESSAGE)
}

/// Whether a revoke request marked this node. A holder's value never
/// reads as one ([`value_data`]).
pub(crate) fn is_revoke_mark(data: &[u8]) -> bool {
    data.starts_with(REVOKE_MESSAGE)
}

/// A revoke request on an election: the data of the election's node (the
/// parent of the candidates' nodes), `__REVOKE__ <leader's node name>`.
/// Not on the leader's own node: a Curator `LeaderLatch` waiting behind
/// it watches that node with a one-shot data watch that it acts on only
/// for a delete and does not set again, so a data change there (a mark,
/// also one that kept the value) left the latch deaf to the leader's
/// resign, and a mark in place of the data erased the leader's value
/// (issue 39, bug 2). Curator reads the election's node neither for a
/// latch nor for `getLeader`.
pub(crate) fn election_revoke_data(leader_node: &str) -> Vec<u8> {
    let mut d = REVOKE_MESSAGE.to_vec();
    d.push(b' ');
    d.extend_from_slice(leader_node.as_bytes());
    d
}

/// The leader's node name an election's revoke request names, if the
/// election node's `data` is one ([`election_revoke_data`]).
pub(crate) fn election_revoke_target(data: &[u8]) -> Option<&str> {
    let rest = data.strip_prefix(REVOKE_MESSAGE)?.strip_prefix(b" ")?;
    std::str::from_utf8(rest).ok().filter(|n| !n.is_empty())
}

/// Put in front of a holder's value that starts like a mark (`__BREAK__`,
/// `__REVOKE__`) or like this escape itself, in the node's data, and taken
/// off when the value is read back: a value is never taken for a mark (a
/// loss, a revoke request, a node nobody holds by).
pub(crate) const VALUE_ESCAPE: &[u8] = b"__VALUE__";

/// The node data that carries the holder's value `value`: the value
/// itself, escaped if it starts like a mark (see [`VALUE_ESCAPE`]).
pub(crate) fn value_data(value: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if [BREAK_MESSAGE, REVOKE_MESSAGE, VALUE_ESCAPE]
        .iter()
        .any(|m| value.starts_with(m))
    {
        [VALUE_ESCAPE, value].concat().into()
    } else {
        value.into()
    }
}

fn unescape(data: &[u8]) -> &[u8] {
    data.strip_prefix(VALUE_ESCAPE).unwrap_or(data)
}

/// The holder's value in a contender node's data (a mutex, reader, writer
/// or election candidate): all of it (ours and Curator's, whose data is
/// the participant's address or id), except revoke or break markers.
pub(crate) fn node_value(data: &[u8]) -> Vec<u8> {
    if is_revoke_mark(data) || is_broken(data) {
        return Vec::new();
    }
    unescape(data).to_vec()
}

/// The holder's value in a semaphore lease's data: as [`node_value`],
/// without our `permits=` line.
pub(crate) fn lease_value(data: &[u8]) -> Vec<u8> {
    if is_revoke_mark(data) || is_broken(data) {
        return Vec::new();
    }
    if parse_permits(data).is_some() {
        let s = std::str::from_utf8(data).unwrap_or_default();
        let i = s.rfind("permits=").unwrap_or(0);
        let v = s[..i].strip_suffix('\n').unwrap_or(&s[..i]);
        return unescape(v.as_bytes()).to_vec();
    }
    unescape(data).to_vec()
}

/// The permit count in a semaphore node's data (ours write `permits=N`,
/// also after a revoke marker); `None` for Curator's (its host address or
/// user data).
pub(crate) fn parse_permits(data: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(data).ok()?;
    let i = s.rfind("permits=")?;
    s[i + "permits=".len()..].trim().parse().ok()
}

/// The `_c_<uuid>-` prefix of a protected node name, if it has one.
pub(crate) fn guid_prefix(child: &str) -> Option<&str> {
    let rest = child.strip_prefix("_c_")?;
    (rest.len() > 37 && rest.as_bytes()[36] == b'-').then(|| &child[..3 + 37])
}

/// The sequence number at the end of a contender node's name.
pub(crate) fn sequence_of(node: &str) -> Option<u64> {
    let digits = node.len() - node.bytes().rev().take_while(u8::is_ascii_digit).count();
    node[digits..].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use quorumlock_core::backend::waits_for;

    #[test]
    fn sorts_like_curator() {
        let kids = vec![
            "_c_b-lock-0000000003".to_string(),
            "nested".to_string(),
            "_c_a-lock-0000000001".to_string(),
            "_c_c-lock-0000000002".to_string(),
        ];
        assert_eq!(
            sort_contenders(kids),
            vec![
                "_c_a-lock-0000000001",
                "_c_c-lock-0000000002",
                "_c_b-lock-0000000003"
            ]
        );
        assert_eq!(
            classify("_c_x-lock-y-lock-0000000007"),
            Some((Role::Mutex, "0000000007"))
        );
    }

    #[test]
    fn rw_and_mutex_entries_form_one_queue() {
        let kids = vec![
            "_c_b-__WRIT__0000000004".to_string(),
            "_c_a-__READ__0000000001".to_string(),
            "leases".to_string(),
            "_c_c-__READ__0000000002".to_string(),
            "_c_d-lock-0000000003".to_string(),
            "_c_e-__READ__0000000005".to_string(),
        ];
        let sorted = sort_contenders(kids);
        assert_eq!(
            sorted,
            vec![
                "_c_a-__READ__0000000001",
                "_c_c-__READ__0000000002",
                "_c_d-lock-0000000003",
                "_c_b-__WRIT__0000000004",
                "_c_e-__READ__0000000005",
            ]
        );
        // The queue rule over the store's view: both readers ahead of the
        // mutex hold; the mutex waits for its predecessor; the writer for
        // the mutex; the last reader for the nearest writer ahead; a writer
        // first holds.
        let queue = kinds(&sorted);
        assert_eq!(waits_for(&queue, 0), None);
        assert_eq!(waits_for(&queue, 1), None);
        assert_eq!(waits_for(&queue, 2), Some(1));
        assert_eq!(waits_for(&queue, 3), Some(2));
        assert_eq!(waits_for(&queue, 4), Some(3));
        assert_eq!(waits_for(&kinds(&sorted[3..]), 0), None);
        assert_eq!(classify("locks"), None);
        assert_eq!(classify("leases"), None);
        assert_eq!(
            classify("_c_x-__READ__0000000009"),
            Some((Role::Read, "0000000009"))
        );
    }

    #[test]
    fn upgradeable_readers_and_upgrades_read_as_curator_readers_and_writers() {
        let u = "_c_0b6a8b5e-1111-4222-8333-944455566677-up-__READ__0000000003";
        let up = "_c_9f0e0d0c-1111-4222-8333-944455566677-up-0b6a8b5e111142228333944455566677-__WRIT__0000000006";
        let other = "_c_9f0e0d0c-1111-4222-8333-944455566677-up-ffffffff111142228333944455566677-__WRIT__0000000007";
        assert_eq!(classify(u), Some((Role::Upgradeable, "0000000003")));
        assert_eq!(classify(up), Some((Role::Upgrade, "0000000006")));
        // Curator's reader takes the first for a reader, the second for
        // a writer (`contains("__WRIT__")`), and sorts both by sequence.
        assert!(u.contains(READ_MARKER) && !u.contains(WRITE_MARKER));
        assert!(up.contains(WRITE_MARKER));
        let sorted = sort_contenders(vec![
            other.to_string(),
            up.to_string(),
            "_c_x-__READ__0000000004".to_string(),
            u.to_string(),
        ]);
        assert_eq!(sorted[0], u);
        let link = links(&sorted);
        assert!(link(2, 0), "the upgrade links to its upgradeable entry");
        assert!(!link(3, 0) && !link(2, 1) && !link(0, 0));
        let kinds = kinds(&sorted);
        assert_eq!(
            kinds,
            [
                LockKind::Upgradeable,
                LockKind::Read,
                LockKind::Upgrade,
                LockKind::Upgrade
            ]
        );
        use quorumlock_core::backend::waits_for_linked;
        assert_eq!(
            waits_for_linked(&kinds, 2, link),
            Some(1),
            "waits for the reader"
        );
        assert_eq!(waits_for_linked(&kinds[..3], 2, link), Some(1));
        let without_reader = [sorted[0].clone(), sorted[2].clone()];
        let k = super::kinds(&without_reader);
        assert_eq!(waits_for_linked(&k, 1, links(&without_reader)), None);
        // A writer named like an upgrade of no contender is a writer.
        assert_eq!(
            classify("_c_x-up-nothex-__WRIT__0000000001"),
            Some((Role::Write, "0000000001"))
        );
    }

    /// `classify` as it was (a search for each marker, the last wins, the
    /// first role of the list on a tie), the reference of the one-pass
    /// version.
    fn classify_by_search(child: &str) -> Option<(Role, &str)> {
        let mut best: Option<(usize, Role)> = None;
        for role in [Role::Mutex, Role::Read, Role::Write, Role::Latch] {
            if let Some(i) = child.rfind(role.marker()) {
                match best {
                    Some((j, _)) if j >= i => {}
                    _ => best = Some((i, role)),
                }
            }
        }
        best.map(|(i, role)| {
            let head = &child[..i];
            let role = match role {
                Role::Read if head.ends_with(&format!("-{UPGRADE_TAG}")) => Role::Upgradeable,
                Role::Write if upgraded_contender(child).is_some() => Role::Upgrade,
                r => r,
            };
            (role, &child[i + role.marker().len()..])
        })
    }

    /// Every name built from pieces that are markers, parts of markers,
    /// upgrade tags, a contender id, non-ASCII text and sequence numbers,
    /// up to four pieces: the one-pass `classify` answers as the search did.
    #[test]
    fn classify_in_one_pass_answers_as_the_search_did() {
        let pieces = [
            "_c_0b6a8b5e-1111-4222-8333-944455566677-",
            LOCK_MARKER,
            READ_MARKER,
            WRITE_MARKER,
            LATCH_MARKER,
            "up-",
            "-up-",
            "0b6a8b5e111142228333944455566677-",
            "__",
            "lo",
            "ck-",
            "__RE",
            "AD__",
            "é",
            "0000000007",
            "",
        ];
        let mut names = vec![String::new()];
        for _ in 0..4 {
            let longer: Vec<String> = names
                .iter()
                .flat_map(|n| pieces.iter().map(move |p| format!("{n}{p}")))
                .collect();
            names.extend(longer);
            names.sort();
            names.dedup();
        }
        assert!(names.len() > 10_000, "{}", names.len());
        let mut classified = 0;
        for name in &names {
            assert_eq!(classify(name), classify_by_search(name), "{name:?}");
            classified += usize::from(classify(name).is_some());
        }
        assert!(classified > names.len() / 2, "{classified}");
    }

    #[test]
    fn semaphore_helpers() {
        let leases = vec![
            "_c_9e2f5d6a-3b1c-4d2e-8f00-0123456789ab-lease-0000000002".to_string(),
            "_c_0e2f5d6a-3b1c-4d2e-8f00-0123456789ab-lease-0000000001".to_string(),
        ];
        let sorted = sort_by_marker(leases, LEASE_MARKER);
        assert!(sorted[0].ends_with("0000000001"));
        assert_eq!(
            guid_prefix(&sorted[0]),
            Some("_c_0e2f5d6a-3b1c-4d2e-8f00-0123456789ab-")
        );
        assert_eq!(guid_prefix("lease-0000000001"), None);
        assert_eq!(parse_permits(&permits_data(3, b"")), Some(3));
        assert_eq!(parse_permits(&permits_data(3, b"h:1")), Some(3));
        assert_eq!(lease_value(&permits_data(3, b"h:1")), b"h:1");
        assert_eq!(lease_value(&permits_data(3, b"")), b"");
        assert_eq!(lease_value(b"192.168.0.1"), b"192.168.0.1");
        assert_eq!(lease_value(b"__REVOKE__ permits=7"), b"");
        assert_eq!(node_value(b"192.168.0.1"), b"192.168.0.1");
        assert_eq!(node_value(b"permits=3"), b"permits=3");
        assert_eq!(node_value(b"__REVOKE__"), b"");
        assert_eq!(node_value(b"__BREAK__"), b"");
        assert_eq!(parse_permits(b"__REVOKE__ permits=7"), Some(7));
        assert_eq!(parse_permits(b"192.168.0.1"), None);
        assert_eq!(parse_permits(b"__REVOKE__"), None);
    }

    #[test]
    fn election_revoke_marks() {
        let node = "_c_0e2f5d6a-3b1c-4d2e-8f00-0123456789ab-latch-0000000004";
        let d = election_revoke_data(node);
        assert_eq!(election_revoke_target(&d), Some(node));
        assert_eq!(election_revoke_target(b""), None);
        assert_eq!(election_revoke_target(b"__REVOKE__"), None);
        assert_eq!(election_revoke_target(b"__REVOKE__ "), None);
        assert_eq!(election_revoke_target(b"x"), None);
    }

    #[test]
    fn values_never_read_as_marks() {
        for v in [
            &b"__BREAK__"[..],
            b"__BREAK__ x",
            b"__REVOKE__",
            b"__REVOKE__ permits=3",
            b"__VALUE__",
            b"__VALUE____BREAK__",
            b"x__BREAK__",
            b"permits=3",
            b"",
            b"10.0.0.1",
        ] {
            let data = value_data(v);
            assert!(!is_broken(&data), "{v:?}");
            assert!(!is_revoke_mark(&data), "{v:?}");
            assert_eq!(node_value(&data), v, "{v:?}");
            let lease = permits_data(3, &data);
            assert!(!is_broken(&lease) && !is_revoke_mark(&lease), "{v:?}");
            assert_eq!(lease_value(&lease), v, "{v:?}");
            assert_eq!(parse_permits(&lease), Some(3), "{v:?}");
        }
        // Only values that need it are escaped: Curator reads the rest as
        // written.
        assert_eq!(&*value_data(b"10.0.0.1"), b"10.0.0.1");
        assert_eq!(&*value_data(b"__BREAK__"), b"__VALUE____BREAK__");
    }
}
