//! Lock names: any text is a name (escaped on the store where it must
//! be), too long ones are refused before any I/O, and layout segments are
//! names of their own.

use super::*;

/// Bad names get `InvalidName` and nothing reaches the store.
pub async fn invalid_names_rejected_and_nothing_written(h: &Harness) {
    let case = h.case();
    let a = case.client().await;
    let before = a.backend().requests_sent();
    // Only the empty name and names over the limit are refused; any other
    // text is a name (escaped on the store: `any_names_work`).
    for bad in [
        "",
        &"n".repeat(quorumlock_core::MAX_NAME_LEN + 1),
        &"\u{e9}".repeat(101),
    ] {
        assert_kind(a.lock(bad).map(|_| ()), ErrorKind::InvalidName, bad);
        assert_kind(
            a.inspect(bad).await.map(|_| ()),
            ErrorKind::InvalidName,
            bad,
        );
        assert_kind(a.break_lock(bad).await, ErrorKind::InvalidName, bad);
        assert_kind(a.request_revoke(bad).await, ErrorKind::InvalidName, bad);
    }
    assert_eq!(
        a.backend().requests_sent(),
        before,
        "invalid input reached the store"
    );
    assert_eq!(a.session_id().await, None, "invalid input opened a session");
    case.finish().await;
}

/// Segments that a store layout uses for the children of a lock's own node
/// or key prefix (ZooKeeper's semaphore `leases` and `locks`, Consul's
/// `.lock`, `.queue`, `.rw`, `.revoke`), and a few look-alikes. As the last
/// segment of a nested name they are either refused (`InvalidName`) or
/// name a lock of its own.
const LAYOUT_SEGMENTS: &[&str] = &[
    "leases",
    "locks",
    "lock",
    "lease",
    "queue",
    "rw",
    "revoke",
    "sem",
    "leases2",
    // Every marker a layout recognises children by, as a whole segment
    // and inside one (ZooKeeper's contenders and Curator's latches).
    "latch-0",
    "latch-0000000001",
    "x-latch-0000000001",
    "_c_0f-latch-0000000001",
    "lock-0000000001",
    "x-lock-0000000001",
    "lease-0000000001",
    "__READ__0000000001",
    "__WRIT__0000000001",
    ".lock",
    ".n",
    ".q",
    ".session",
    "~x",
];

/// Try-acquires `name` as a mutex, a semaphore of 2 and a writer (as the
/// backend supports them) on `c`, each released at once: none may find
/// it taken, since `held` (another name) is what is held.
async fn free_in_every_kind(c: &LockClient, name: &str, held: &str) {
    let caps = c.backend().capabilities();
    let what = |kind: &str| format!("{kind} {name} while only {held} is held");
    let g = c.lock(name).unwrap().try_acquire().await;
    g.unwrap_or_else(|e| panic!("{}: {e}", what("mutex")))
        .release()
        .await
        .unwrap();
    if caps.semaphore {
        let g = c.semaphore(name, 2).unwrap().try_acquire().await;
        g.unwrap_or_else(|e| panic!("{}: {e}", what("semaphore of 2")))
            .release()
            .await
            .unwrap();
    }
    if caps.rwlock {
        let g = c.rwlock(name).unwrap().try_write().await;
        g.unwrap_or_else(|e| panic!("{}: {e}", what("writer")))
            .release()
            .await
            .unwrap();
    }
    let st = c.inspect(name).await.unwrap();
    assert!(
        st.holders.is_empty() && st.waiters.is_empty(),
        "{}: inspect shows {st:?}",
        what("inspect of")
    );
}

/// A nested name whose last segment is one the store layout uses for a
/// lock's own children (`p/leases`, `p/locks`, ...) is either refused
/// with `InvalidName` or a lock of its own: holding it (as a mutex or a
/// semaphore) never makes `p` taken in any kind, and holding `p` never
/// makes it taken.
pub async fn nested_layout_segment_names_are_independent(h: &Harness) {
    let case = h.case();
    let a = case.client().await;
    let b = case.client().await;
    let caps = a.backend().capabilities();
    for (i, seg) in LAYOUT_SEGMENTS.iter().enumerate() {
        let parent = format!("p{i}");
        let nested = format!("{parent}/{seg}");
        let lock = match a.lock(&nested) {
            Ok(l) => l,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::InvalidName, "{nested}: {e}");
                // The parent name itself stays usable.
                free_in_every_kind(&b, &parent, "nothing").await;
                continue;
            }
        };
        // The nested lock held: the parent is free in every kind.
        let g = lock.acquire().await.unwrap();
        free_in_every_kind(&b, &parent, &nested).await;
        assert!(
            !b.break_lock(&parent).await.unwrap(),
            "breaking {parent} found a holder while only {nested} is held"
        );
        assert!(g.is_held(), "{nested} lost by operations on {parent}");
        g.release().await.unwrap();
        if caps.semaphore {
            let g = a.semaphore(&nested, 2).unwrap().acquire().await.unwrap();
            free_in_every_kind(&b, &parent, &nested).await;
            assert!(g.is_held(), "{nested} lost by operations on {parent}");
            g.release().await.unwrap();
        }
        // The parent held (as a mutex, then as a semaphore): the nested
        // name is free in every kind.
        let g = a.lock(&parent).unwrap().acquire().await.unwrap();
        free_in_every_kind(&b, &nested, &parent).await;
        assert!(g.is_held(), "{parent} lost by operations on {nested}");
        g.release().await.unwrap();
        if caps.semaphore {
            let g = a.semaphore(&parent, 2).unwrap().acquire().await.unwrap();
            free_in_every_kind(&b, &nested, &parent).await;
            assert!(g.is_held(), "{parent} lost by operations on {nested}");
            g.release().await.unwrap();
        }
    }
    case.finish().await;
}

/// Names outside the native characters, and names that look like a
/// layout's own children or a recipe's markers: each is escaped on the
/// store (quorumlock_core's `LockName::key`), one rule for every store.
pub const ODD_NAMES: [&str; 20] = [
    "orders/42",
    "orders/3f2a9c",
    "user@example.com",
    "jobs/lock-rotation",
    "with space",
    "caf\u{e9}/\u{1f512} \u{4e2d}\u{6587}",
    ".hidden",
    "a//b",
    "/lead",
    "trail/",
    "x/leases",
    "x/locks",
    "x/.lock",
    "x/.queue/y",
    "x/_c_0-lock-0000000001",
    "x/a__READ__b",
    "x/lease-0000000001",
    "50%/~tilde",
    "a/../b",
    "tab\there",
];

/// Every name of [`ODD_NAMES`] (and a native one) acquires, excludes a
/// second client, leaves its parent free, shows up under its own name in
/// `list` and `inspect`, and releases; all held at once, `list` reports
/// exactly them, in name order. A native name's key is the name itself
/// (its entry is under `<namespace>/<name>/`), an escaped one's is not.
pub async fn any_names_work(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let ns = case.namespace().trim_matches('/').to_string();
    // Whether an entry (a node path, a key, mem's `<key>#<n>`) is one of
    // the lock whose key below the namespace is `key`.
    let under_ns = |entry: &str, key: &str| {
        let full = match ns.as_str() {
            "" => key.to_string(),
            ns => format!("{ns}/{key}"),
        };
        entry
            .match_indices(&full)
            .any(|(i, _)| matches!(entry[i + full.len()..].chars().next(), Some('/' | '#')))
    };
    let native = "plain/native-name_1.x:y";
    let mut held = Vec::new();
    for name in ODD_NAMES.iter().copied().chain([native]) {
        let ln = quorumlock_core::LockName::new(name).unwrap();
        assert_eq!(ln.is_native(), name == native, "{name}");
        let g = acquire(Flavor::Mutex, &a, name).await;
        assert_eq!(g.name().as_str(), name);
        assert!(
            under_ns(g.entry(), &ln.key()),
            "{name}: entry {} is not under its key {}",
            g.entry(),
            ln.key()
        );
        if name == native {
            assert!(under_ns(g.entry(), name), "{}", g.entry());
        }
        assert_kind(
            b.lock(name).unwrap().try_acquire().await,
            ErrorKind::WouldBlock,
            name,
        );
        let st = b.inspect(name).await.unwrap();
        assert_eq!(st.name.as_str(), name);
        assert_eq!(st.holders.len(), 1, "{name}: {st:?}");
        assert_eq!(st.holders[0].token, g.token(), "{name}");
        // The parent of a nested name is a lock of its own, free.
        if let Some((parent, _)) = name.rsplit_once('/').filter(|(p, _)| !p.is_empty()) {
            if !ODD_NAMES.contains(&parent) {
                b.lock(parent)
                    .unwrap()
                    .try_acquire()
                    .await
                    .unwrap_or_else(|e| panic!("{parent} while only {name} is held: {e}"))
                    .release()
                    .await
                    .unwrap();
            }
        }
        held.push(g);
    }
    let mut expected: Vec<String> = ODD_NAMES
        .iter()
        .copied()
        .chain([native])
        .map(String::from)
        .collect();
    expected.sort();
    let listed = a.list("").await.unwrap();
    let names: Vec<String> = listed.iter().map(|s| s.name.as_str().to_string()).collect();
    assert_eq!(names, expected, "list of everything");
    for st in &listed {
        assert_eq!(st.holders.len(), 1, "{st:?}");
        let g = held.iter().find(|g| g.name() == &st.name).unwrap();
        assert_eq!(st.holders[0].token, g.token(), "{}", st.name);
    }
    let orders: Vec<String> = a
        .list("orders")
        .await
        .unwrap()
        .iter()
        .map(|s| s.name.as_str().to_string())
        .collect();
    assert_eq!(orders, ["orders/3f2a9c", "orders/42"]);
    let x: Vec<String> = a
        .list("x")
        .await
        .unwrap()
        .iter()
        .map(|s| s.name.as_str().to_string())
        .collect();
    let mut want_x: Vec<&str> = ODD_NAMES
        .iter()
        .copied()
        .filter(|n| n.starts_with("x/"))
        .collect();
    want_x.sort();
    assert_eq!(x, want_x, "list of x");
    for g in held {
        let name = g.name().as_str().to_string();
        g.release().await.unwrap();
        b.lock(&name)
            .unwrap()
            .try_acquire()
            .await
            .unwrap_or_else(|e| panic!("{name} after release: {e}"))
            .release()
            .await
            .unwrap();
    }
    assert!(
        a.list("").await.unwrap().is_empty(),
        "released names listed"
    );
    case.finish().await;
}
