//! Cases for holds taken with a limit ([`quorumlock_core::Lock::hold_at_most`]).

use futures::FutureExt;

use super::*;
use crate::scratch::{remove_scratch, scratch_key};

/// A hold whose holder never lets go ends at its limit, while its client
/// stays alive and its session keeps being renewed: the guard reports
/// [`LossReason::HoldLimitReached`] before the store frees the lock (a
/// waiter granted next finds the loss already reported), its fenced
/// writes are refused from then on, the waiter gets the lock within the
/// limit plus one TTL with a larger token, and the session's other lock
/// stays held; the expired guard, kept on, blocks neither its client's
/// next owner nor removes that owner's entry when released late. The
/// same for a semaphore permit. A limit of zero or one too long for the
/// clock is refused and writes nothing.
pub async fn hold_limit_ends_a_hold_its_holder_keeps(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let ttl = a.backend().capabilities().session_ttl;
    let limit = Duration::from_millis(1500);

    for bad in [Duration::ZERO, Duration::MAX] {
        let e = a
            .lock("hl")
            .unwrap()
            .hold_at_most(bad)
            .acquire()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad:?}: {e}");
    }
    assert!(
        b.inspect("hl").await.unwrap().is_free(),
        "a refused limit wrote"
    );

    // Held without a limit throughout: the session lives on.
    let other = a.lock("hl-other").unwrap().acquire().await.unwrap();
    let key = scratch_key(a.backend().as_ref(), case.namespace(), "k");
    let g = a
        .lock("hl")
        .unwrap()
        .hold_at_most(limit)
        .acquire()
        .await
        .unwrap();
    let granted = Instant::now();
    g.fenced_put(key.as_str(), b"1".to_vec()).await.unwrap();

    let waiter = {
        let (b, probe) = (b.clone(), g.lost());
        tokio::spawn(async move {
            let r = b
                .lock("hl")
                .unwrap()
                .acquire_timeout(limit + ttl + Duration::from_secs(10))
                .await;
            // What the holder's guard said when the store let us in.
            (r, Instant::now(), probe.now_or_never())
        })
    };
    let reason = tokio::time::timeout(limit + ttl + SOON, g.lost())
        .await
        .expect("the hold limit did not end the hold");
    assert_eq!(reason, LossReason::HoldLimitReached);
    let at = granted.elapsed();
    assert!(
        at + Duration::from_millis(100) >= limit,
        "lost after {at:?}, before the limit of {limit:?}"
    );
    assert!(!g.is_held());
    let e = g.fenced_put(key.as_str(), b"2".to_vec()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");

    let (r, got_at, told) = waiter.await.unwrap();
    let next = r.expect("the waiter never got the lock after the hold limit");
    assert_eq!(
        told,
        Some(LossReason::HoldLimitReached),
        "the store let the next holder in before the guard reported its loss"
    );
    assert!(
        next.token() > g.token(),
        "{} after {}",
        next.token(),
        g.token()
    );
    let freed = got_at - granted;
    assert!(
        freed <= limit + ttl + Duration::from_secs(2),
        "freed {freed:?} after the grant, limit {limit:?}, TTL {ttl:?}"
    );
    assert!(other.is_held(), "the hold limit ended the session");
    assert_eq!(
        b.read_key(&key).await.unwrap().as_deref(),
        Some(&b"1"[..]),
        "a write after the limit changed the key"
    );
    next.release().await.unwrap();
    // The expired guard, still kept, blocks neither its client's next
    // owner nor, released late, removes that owner's entry (on etcd and
    // Consul a mutex entry's key is the session's).
    let again = a
        .lock("hl")
        .unwrap()
        .acquire_timeout(SOON)
        .await
        .expect("the client's next owner waits for the expired guard");
    let e = g.release().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
    let state = b.inspect("hl").await.unwrap();
    assert!(
        again.is_held() && state.holders.iter().any(|h| h.token == again.token()),
        "the expired guard's release removed the next owner's entry: {state:?}"
    );
    again.release().await.unwrap();

    if a.backend().capabilities().semaphore {
        let permit = a
            .semaphore("hl-sem", 1)
            .unwrap()
            .hold_at_most(Duration::from_millis(500))
            .acquire()
            .await
            .unwrap();
        let next = b
            .semaphore("hl-sem", 1)
            .unwrap()
            .acquire_timeout(ttl + Duration::from_secs(10))
            .await
            .expect("the permit was not freed at its limit");
        assert_eq!(permit.loss(), Some(LossReason::HoldLimitReached));
        assert!(next.token() > permit.token());
        next.release().await.unwrap();
        drop(permit);
    }
    other.release().await.unwrap();
    remove_scratch(&b, &key).await;
    case.finish().await;
}

/// A hold limit on an upgradeable read hold ends its upgrade at the same
/// instant, and both entries go: a reader that asked after the upgrade
/// (it waits for the upgrade's entry) is granted within the limit and
/// the TTL, although the holder keeps both guards and its session lives.
pub async fn hold_limit_ends_an_upgrade_with_its_read_hold(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    if !a.backend().capabilities().upgradeable_read {
        case.finish().await;
        return;
    }
    let ttl = a.backend().capabilities().session_ttl;
    let limit = Duration::from_millis(800);
    let mut u = a
        .rwlock("hlu")
        .unwrap()
        .hold_at_most(limit)
        .upgradeable_read()
        .await
        .unwrap();
    let up = tokio::time::timeout(SOON, u.upgrade())
        .await
        .expect("an upgrade of a lone hold waited")
        .unwrap();
    let reader = {
        let b = b.clone();
        tokio::spawn(async move {
            b.rwlock("hlu")
                .unwrap()
                .read_timeout(limit + ttl + Duration::from_secs(10))
                .await
        })
    };
    eventually("the reader to queue", || async {
        waiters(&b, "hlu").await == 1
    })
    .await;
    let reason = tokio::time::timeout(SOON, up.lost())
        .await
        .expect("the upgrade's loss at the limit");
    assert_eq!(reason, LossReason::HoldLimitReached);
    let r = reader
        .await
        .unwrap()
        .expect("the reader was not granted after the limit: the upgrade's entry stayed");
    assert!(up.loss().is_some());
    r.release().await.unwrap();
    drop(up);
    assert!(!u.is_held(), "the read hold outlived its limit");
    drop(u);
    case.finish().await;
}
