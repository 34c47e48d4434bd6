//! Cases for writes the store itself fences ([`quorumlock_core::LockGuard::fenced_put`]).

use quorumlock_core::backend::KeyWrite;

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

/// A fenced write can never reach lock bookkeeping: not the holder's own
/// entry, not a key with a segment starting with `.` (the recipes' own
/// children: `.lock`, `.n`, `.q`, `.session`, `.fence`), and, for a client
/// without a namespace, no key at all (every key may then be some lock's
/// bookkeeping). Each is [`ErrorKind::InvalidArgument`], nothing is
/// written, and the lock stays held.
pub async fn fenced_writes_cannot_touch_bookkeeping(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let g = a.lock("fb").unwrap().acquire().await.unwrap();
    let scratch = scratch_key(a.backend().as_ref(), case.namespace(), "fb");
    for key in [format!("{scratch}/.n"), format!("{scratch}/.lock/x")] {
        let e = g.fenced_put(key.as_str(), b"x".to_vec()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "key {key:?}: {e}");
    }

    // A client one level up (no namespace) holding the same lock as
    // `<ns>/fb2` ...
    let root = LockClient::new(h.backend("").await);
    let name = format!("{}/fb2", case.namespace());
    let rg = root.lock(name.as_str()).unwrap().acquire().await.unwrap();
    // ... may neither delete its own entry nor anything else.
    let entry = rg.entry().to_string();
    let e = rg.fenced_delete(entry.as_str()).await.unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::InvalidArgument,
        "own entry {entry:?}: {e}"
    );
    let e = rg
        .fenced_put(scratch.as_str(), b"x".to_vec())
        .await
        .unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::InvalidArgument,
        "root key {scratch:?}: {e}"
    );
    assert_kind(
        b.lock("fb2").unwrap().try_acquire().await,
        ErrorKind::WouldBlock,
        "the lock after refused writes to bookkeeping",
    );
    assert!(rg.is_held());
    rg.release().await.unwrap();
    root.close().await;
    g.release().await.unwrap();
    case.finish().await;
}

/// One key rule on every store: the key of a fenced write, and of
/// `read_key`, may be written with or without a leading `/` (ZooKeeper
/// adds the `/` a key lacks, Consul drops it, the other stores use the key
/// as written), so a program keeps its keys when it changes stores. Both
/// forms, under another namespace: written under the lock, read back and
/// deleted in the same form.
pub async fn fenced_keys_with_or_without_a_leading_slash(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let other = format!("quorumlock-fenced/{}", case.namespace());
    let relative = format!("{other}/x/a");
    let absolute = format!("/{other}/x/b");
    let g = a.lock("fk").unwrap().acquire().await.unwrap();
    for (key, v) in [(&relative, b"a"), (&absolute, b"b")] {
        g.fenced_put(key.as_str(), v.to_vec())
            .await
            .unwrap_or_else(|e| panic!("fenced write to {key:?}: {e}"));
        let read = b
            .read_key(key)
            .await
            .unwrap_or_else(|e| panic!("reading {key:?}: {e}"));
        assert_eq!(read.as_deref(), Some(&v[..]), "{key:?} read back");
    }
    for key in [&relative, &absolute] {
        g.fenced_delete(key.as_str())
            .await
            .unwrap_or_else(|e| panic!("fenced delete of {key:?}: {e}"));
        assert_eq!(value(&b, key).await, None, "{key:?} after its delete");
    }
    g.release().await.unwrap();
    // ZooKeeper made the parents; elsewhere they are absent keys, and
    // deleting them does nothing.
    for key in [format!("{other}/x"), other] {
        b.backend()
            .write_key(&KeyWrite::Delete { key })
            .await
            .expect("cleanup");
    }
    case.finish().await;
}

/// Fenced writes over a set of kinds: a mutex or a write side among the
/// members makes a set able to write; its read sides are checked as the
/// rest (a break of the read side alone fences the set's writes, by the
/// store: the guard's own belief is not asked); a lone reader, a set of
/// readers and a set with a permit are refused and write nothing.
pub async fn fenced_writes_over_a_set_of_kinds(h: &Harness) {
    use quorumlock_core::LockKind::{Exclusive, Read, Semaphore, Write};
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let key = scratch_key(a.backend().as_ref(), case.namespace(), "k");

    // A writer alone may write.
    let w = a.rwlock("fk/w").unwrap().write().await.unwrap();
    w.fenced_put(key.as_str(), b"w".to_vec()).await.unwrap();
    assert_eq!(value(&b, &key).await.as_deref(), Some(&b"w"[..]));
    w.release().await.unwrap();

    let refused = [
        vec![("fk/r", Read)],
        vec![("fk/r", Read), ("fk/r2", Read)],
        vec![("fk/m", Exclusive), ("fk/s", Semaphore { permits: 2 })],
    ];
    for members in refused {
        let set = a
            .multi_lock_of(members.clone())
            .unwrap()
            .acquire_timeout(SOON)
            .await
            .unwrap();
        let e = set
            .fenced_put(key.as_str(), b"x".to_vec())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{members:?}: {e}");
        set.release().await.unwrap();
    }
    assert_eq!(value(&b, &key).await.as_deref(), Some(&b"w"[..]));

    // Another reader shares the read side meanwhile.
    let other_reader = b.rwlock("fk/r").unwrap().read().await.unwrap();
    let set = a
        .multi_lock_of([("fk/m", Exclusive), ("fk/r", Read), ("fk/w", Write)])
        .unwrap()
        .acquire_timeout(SOON)
        .await
        .unwrap();
    set.fenced_put(key.as_str(), b"1".to_vec()).await.unwrap();
    assert_eq!(value(&b, &key).await.as_deref(), Some(&b"1"[..]));
    other_reader.release().await.unwrap();

    // The read side alone is broken: the store refuses the set's write
    // at once (a fenced write asks the store, not the guards' belief).
    let lost = set.lost();
    assert!(b.break_lock("fk/r").await.unwrap());
    let e = set
        .fenced_put(key.as_str(), b"2".to_vec())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
    tokio::time::timeout(SOON, lost)
        .await
        .expect("loss of the read side not reported for the set");
    let e = set
        .fenced_put(key.as_str(), b"3".to_vec())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
    assert_eq!(
        value(&b, &key).await.as_deref(),
        Some(&b"1"[..]),
        "a refused write changed the key"
    );
    let _ = set.release().await;

    remove_scratch(&b, &key).await;
    case.finish().await;
}
