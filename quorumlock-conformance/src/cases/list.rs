//! Listing the locks under a prefix.

use super::*;

/// `list` reports every held or awaited lock under a prefix (whole
/// segments: `jobs` covers `jobs/a/nested`, not `jobsx`), in name order,
/// with the holders and waiters `inspect` shows; free locks are left out
/// and a too long prefix is refused.
pub async fn list_reports_locks_under_a_prefix(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let caps = a.backend().capabilities();
    let held = a.lock("jobs/a").unwrap().acquire().await.unwrap();
    let nested = if caps.rwlock {
        a.rwlock("jobs/a/nested").unwrap().read().await.unwrap()
    } else {
        a.lock("jobs/a/nested").unwrap().acquire().await.unwrap()
    };
    let other = a.lock("jobsx").unwrap().acquire().await.unwrap();
    let freed = a.lock("jobs/freed").unwrap().acquire().await.unwrap();
    freed.release().await.unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("jobs/a").unwrap().acquire().await?.release().await })
    };
    eventually("the waiter to queue", || async {
        waiters(&a, "jobs/a").await == 1
    })
    .await;

    let names = |v: &[quorumlock_core::LockState]| -> Vec<String> {
        v.iter().map(|s| s.name.as_str().to_string()).collect()
    };
    let under = a.list("jobs").await.unwrap();
    assert_eq!(names(&under), ["jobs/a", "jobs/a/nested"], "{under:#?}");
    assert_eq!(under[0].holders.len(), 1);
    assert_eq!(under[0].holders[0].token, held.token());
    assert_eq!(under[0].holders[0].session, held.session_id());
    assert_eq!(
        under[0].holders[0].kind,
        quorumlock_core::LockKind::Exclusive
    );
    assert_eq!(under[0].waiters.len(), 1, "{under:#?}");
    assert_eq!(under[0].waiters[0].session, b.session_id().await.unwrap());
    assert_eq!(under[1].holders[0].token, nested.token());
    if caps.rwlock {
        assert_eq!(under[1].holders[0].kind, quorumlock_core::LockKind::Read);
    }
    assert_eq!(
        under,
        a.list("jobs/").await.unwrap(),
        "a trailing / is ignored"
    );
    assert_eq!(
        names(&a.list("jobs/a").await.unwrap()),
        ["jobs/a", "jobs/a/nested"]
    );
    assert_eq!(
        names(&a.list("").await.unwrap()),
        ["jobs/a", "jobs/a/nested", "jobsx"]
    );
    assert!(a.list("nothing/here").await.unwrap().is_empty());
    assert_kind(
        a.list("n".repeat(quorumlock_core::MAX_NAME_LEN + 1)).await,
        ErrorKind::InvalidName,
        "list",
    );

    held.release().await.unwrap();
    waiter.await.unwrap().unwrap();
    nested.release().await.unwrap();
    other.release().await.unwrap();
    assert!(
        a.list("").await.unwrap().is_empty(),
        "released locks are still listed"
    );
    case.finish().await;
}

/// An operator one level up (a client with no namespace) reads the locks
/// of an application's namespace: `list`, `inspect` and `status`-style
/// reads show the holder and the waiter, and change nothing: the holder
/// keeps its lock and another client of the application still finds it
/// held.
pub async fn another_namespace_never_purges_live_entries(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let g = a.lock("x").unwrap().acquire().await.unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("x").unwrap().acquire().await?.release().await })
    };
    eventually("the waiter to queue", || async {
        waiters(&a, "x").await == 1
    })
    .await;

    let root = LockClient::new(h.backend("").await);
    let name = format!("{}/x", case.namespace());
    for _ in 0..3 {
        let listed = root.list(case.namespace()).await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:#?}");
        assert_eq!(listed[0].name.as_str(), name);
        assert_eq!(listed[0].holders.len(), 1, "{listed:#?}");
        assert_eq!(listed[0].holders[0].token, g.token());
        let state = root.inspect(name.as_str()).await.unwrap();
        assert_eq!(state.holders.len(), 1, "{state:#?}");
        assert_eq!(state.waiters.len(), 1, "{state:#?}");
        let _ = root.list("").await.unwrap();
    }
    assert!(
        g.is_held(),
        "the holder lost its lock to another namespace's reads"
    );
    let c = case.client().await;
    assert_kind(
        c.lock("x").unwrap().try_acquire().await,
        ErrorKind::WouldBlock,
        "the lock after another namespace's reads",
    );
    assert_eq!(waiters(&a, "x").await, 1, "the waiter was purged");
    root.close().await;
    g.release().await.unwrap();
    waiter.await.unwrap().unwrap();
    case.finish().await;
}
