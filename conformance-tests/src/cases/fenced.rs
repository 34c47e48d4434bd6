//! Cases for writes the store itself fences ([`lockcore::LockGuard::fenced_put`]).

use super::*;
use crate::scratch::{remove_scratch, scratch_key};

async fn value(c: &LockClient, key: &str) -> Option<Vec<u8>> {
    c.read_key(key).await.expect("read key")
}

/// A holder's fenced writes apply while it holds; once its entry is gone
/// (broken here; a paused holder's expired session in the fault suite)
/// the store refuses them and nothing changes. Bad keys and non-mutex
/// holds are refused before anything is written.
pub async fn fenced_writes_refused_after_loss(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let key = scratch_key(a.backend().as_ref(), case.namespace(), "k");
    let g = a.lock("fw").unwrap().acquire().await.unwrap();
    g.fenced_put(key.as_str(), b"1".to_vec()).await.unwrap();
    assert_eq!(value(&b, &key).await.as_deref(), Some(&b"1"[..]));

    for bad in [String::new(), format!("{key}\nx")] {
        let e = g.fenced_put(bad.as_str(), b"x".to_vec()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "key {bad:?}: {e}");
    }
    if a.backend().capabilities().rwlock {
        let reader = a.rwlock("fw-rw").unwrap().read().await.unwrap();
        let e = reader
            .fenced_put(key.as_str(), b"r".to_vec())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        reader.release().await.unwrap();
    }
    assert_eq!(value(&b, &key).await.as_deref(), Some(&b"1"[..]));

    let lost = g.lost();
    assert!(b.break_lock("fw").await.unwrap());
    tokio::time::timeout(SOON, lost)
        .await
        .expect("loss not reported");
    let e = g.fenced_put(key.as_str(), b"2".to_vec()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
    let e = g.fenced_delete(key.as_str()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
    assert_eq!(
        value(&b, &key).await.as_deref(),
        Some(&b"1"[..]),
        "a refused write changed the key"
    );

    let _ = g.release().await;
    let g = a.lock("fw").unwrap().acquire().await.unwrap();
    g.fenced_put(key.as_str(), b"4".to_vec()).await.unwrap();
    g.fenced_delete(key.as_str()).await.unwrap();
    assert_eq!(value(&b, &key).await, None);
    g.fenced_delete(key.as_str()).await.unwrap();
    g.release().await.unwrap();

    // A set: one lost lock fences the whole set's writes.
    let set = a
        .multi_lock(["fw/x", "fw/y"])
        .unwrap()
        .acquire()
        .await
        .unwrap();
    set.fenced_put(key.as_str(), b"5".to_vec()).await.unwrap();
    let lost = set.lost();
    assert!(b.break_lock("fw/y").await.unwrap());
    tokio::time::timeout(SOON, lost)
        .await
        .expect("loss not reported");
    let e = set
        .fenced_put(key.as_str(), b"6".to_vec())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
    assert_eq!(value(&b, &key).await.as_deref(), Some(&b"5"[..]));
    let _ = set.release().await;

    remove_scratch(&b, &key).await;
    case.finish().await;
}
