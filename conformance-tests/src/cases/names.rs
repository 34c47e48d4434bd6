//! Lock names: invalid ones are refused before any I/O; layout segments are names of their own.

use super::*;

/// Bad names get `InvalidName` and nothing reaches the store.
pub async fn invalid_names_rejected_and_nothing_written(h: &Harness) {
    let case = h.case();
    let a = case.client().await;
    let before = a.backend().requests_sent();
    for bad in [
        "",
        "/x",
        "x/",
        "a//b",
        "a/../b",
        "sp ace",
        "ctl\u{7}",
        ".lock",
        "x/0lock-1",
        "x/leases",
        &"n".repeat(300),
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
const LAYOUT_SEGMENTS: [&str; 9] = [
    "leases", "locks", "lock", "lease", "queue", "rw", "revoke", "sem", "leases2",
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
