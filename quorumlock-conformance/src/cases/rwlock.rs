//! Read-write lock cases (backends with `Capabilities::rwlock`).

use super::*;

/// Spawns `task` (an acquire of `name`) and waits until `c` sees
/// `waiting` waiters on `name`: it has queued.
async fn spawn_queued<T: Send + 'static>(
    c: &LockClient,
    name: &str,
    waiting: usize,
    what: &str,
    task: impl Future<Output = T> + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    let handle = tokio::spawn(task);
    eventually(what, || async { waiters(c, name).await == waiting }).await;
    handle
}

async fn read(c: &LockClient, name: &str) -> LockGuard {
    tokio::time::timeout(SOON, c.rwlock(name).unwrap().read())
        .await
        .unwrap_or_else(|_| panic!("read hold of {name} took longer than {SOON:?}"))
        .unwrap_or_else(|e| panic!("read hold of {name}: {e}"))
}

/// Readers on different clients hold at the same time.
pub async fn rw_readers_overlap(h: &Harness) {
    let case = h.case();
    let clients = case.clients(3).await;
    let mut guards = Vec::new();
    for c in &clients {
        guards.push(read(c, "shared").await);
    }
    assert!(guards.iter().all(|g| g.is_held()));
    let state = clients[0].inspect("shared").await.unwrap();
    assert_eq!(
        state.holders.len(),
        3,
        "readers did not hold together: {state:?}"
    );
    assert!(state
        .holders
        .iter()
        .all(|h| h.kind == quorumlock_core::LockKind::Read));
    for g in guards {
        g.release().await.unwrap();
    }
    case.finish().await;
}

/// A writer holds alone: no reader or writer beside it, and readers keep
/// writers out.
pub async fn rw_writer_excludes_readers_and_writers(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let w = a.rwlock("wx").unwrap().write().await.unwrap();
    assert_kind(
        b.rwlock("wx").unwrap().try_read().await,
        ErrorKind::WouldBlock,
        "read beside a writer",
    );
    assert_kind(
        b.rwlock("wx").unwrap().try_write().await,
        ErrorKind::WouldBlock,
        "write beside a writer",
    );
    w.release().await.unwrap();
    let r1 = read(&a, "wx").await;
    let r2 = read(&b, "wx").await;
    assert_kind(
        b.rwlock("wx").unwrap().try_write().await,
        ErrorKind::WouldBlock,
        "write beside readers",
    );
    assert_eq!(waiters(&a, "wx").await, 0, "try_write left a waiter");
    r1.release().await.unwrap();
    assert_kind(
        a.rwlock("wx").unwrap().try_write().await,
        ErrorKind::WouldBlock,
        "write beside a reader",
    );
    r2.release().await.unwrap();
    let w = a.rwlock("wx").unwrap().try_write().await.expect("free now");
    w.release().await.unwrap();
    case.finish().await;
}

/// A reader that arrives after a waiting writer waits behind it: a stream
/// of readers cannot starve a writer.
pub async fn rw_writer_not_starved_by_readers(h: &Harness) {
    let case = h.case();
    let (a, b, c) = (
        case.client().await,
        case.client().await,
        case.client().await,
    );
    let r1 = read(&a, "fair").await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let (b2, o) = (b.clone(), order.clone());
    let writer = tokio::spawn(async move {
        let w = b2.rwlock("fair").unwrap().write().await.unwrap();
        o.lock().unwrap().push(("writer", w.token()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        w.release().await.unwrap();
    });
    eventually("the writer to queue", || async {
        waiters(&a, "fair").await == 1
    })
    .await;
    assert_kind(
        c.rwlock("fair").unwrap().try_read().await,
        ErrorKind::WouldBlock,
        "reader overtaking a writer",
    );
    let (c2, o) = (c.clone(), order.clone());
    let late_reader = tokio::spawn(async move {
        let r = read(&c2, "fair").await;
        o.lock().unwrap().push(("reader", r.token()));
        r.release().await.unwrap();
    });
    eventually("the late reader to queue", || async {
        waiters(&a, "fair").await == 2
    })
    .await;
    r1.release().await.unwrap();
    writer.await.unwrap();
    late_reader.await.unwrap();
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order.iter().map(|(w, _)| *w).collect::<Vec<_>>(),
        ["writer", "reader"]
    );
    assert!(order[0].1 < order[1].1, "tokens {order:?}");
    case.finish().await;
}

/// A write holder may re-enter for reading (downgrade); a read holder's
/// request to write is refused at once, never a deadlock.
pub async fn rw_downgrade_allowed_upgrade_refused(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let mut w = a.rwlock("grade").unwrap().write().await.unwrap();
    let token = w.token();
    {
        let r = w.reenter_read();
        assert_eq!(r.token(), token);
        assert_eq!(r.hold_count(), 2);
    }
    assert!(
        w.reenter_write().is_ok(),
        "a writer may re-enter for writing"
    );
    w.release().await.unwrap();
    let mut r = read(&b, "grade").await;
    let start = Instant::now();
    assert_kind(
        r.reenter_write().map(|_| ()),
        ErrorKind::UpgradeRefused,
        "upgrade",
    );
    assert!(start.elapsed() < Duration::from_secs(1));
    assert_eq!(r.reenter_read().hold_count(), 2);
    r.release().await.unwrap();
    case.finish().await;
}

/// Readers and writers of one client are separate owners: readers share,
/// a writer of the same client waits for them.
pub async fn rw_owners_in_one_client(h: &Harness) {
    let case = h.case();
    let a = case.client().await;
    let rw = a.rwlock("local").unwrap();
    let r1 = rw.read().await.unwrap();
    let r2 = tokio::time::timeout(SOON, rw.read())
        .await
        .expect("second local reader waited")
        .unwrap();
    assert_kind(
        rw.try_write().await,
        ErrorKind::WouldBlock,
        "local writer beside local readers",
    );
    let rw2 = rw.clone();
    let writer = tokio::spawn(async move { rw2.write().await.unwrap().release().await.unwrap() });
    eventually("the local writer to queue", || async {
        waiters(&a, "local").await == 1
    })
    .await;
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    tokio::time::timeout(SOON, writer)
        .await
        .expect("writer not granted")
        .unwrap();
    case.finish().await;
}

/// A reader that comes between a client's repeated mutex cycles excludes
/// its next acquire (a backend that infers "still alone" from its last
/// cycles must see the reader).
pub async fn rw_reader_between_repeated_mutex_cycles(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let lock = a.lock("again").unwrap();
    for _ in 0..4 {
        lock.try_acquire().await.unwrap().release().await.unwrap();
    }
    let r = read(&b, "again").await;
    assert_kind(
        lock.try_acquire().await,
        ErrorKind::WouldBlock,
        "mutex beside a reader",
    );
    r.release().await.unwrap();
    lock.try_acquire().await.unwrap().release().await.unwrap();
    case.finish().await;
}

/// A client's read holds that shared the lock with another client's
/// reader never let its writer in beside that reader, however quiet its
/// cycles were.
pub async fn rw_writer_after_reads_shared_with_another_client(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let theirs = read(&b, "shared").await;
    let rw = a.rwlock("shared").unwrap();
    for _ in 0..4 {
        rw.try_read().await.unwrap().release().await.unwrap();
    }
    assert_kind(
        rw.try_write().await,
        ErrorKind::WouldBlock,
        "writer beside the other client's reader",
    );
    theirs.release().await.unwrap();
    rw.try_write().await.unwrap().release().await.unwrap();
    case.finish().await;
}

/// A mutex and the readers of a read-write lock on one name exclude each
/// other (a mutex counts as a writer): `quorumlock lock` and
/// `quorumlock lock --shared` on one name rely on it.
pub async fn rw_mutex_and_readers_exclude(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let m = a.lock("mixed").unwrap().acquire().await.unwrap();
    assert_kind(
        b.rwlock("mixed").unwrap().try_read().await,
        ErrorKind::WouldBlock,
        "read beside a mutex",
    );
    m.release().await.unwrap();
    let r = read(&b, "mixed").await;
    assert_kind(
        a.lock("mixed").unwrap().try_acquire().await,
        ErrorKind::WouldBlock,
        "mutex beside a reader",
    );
    let a2 = a.clone();
    let waiting = tokio::spawn(async move {
        a2.lock("mixed")
            .unwrap()
            .acquire()
            .await
            .unwrap()
            .release()
            .await
    });
    eventually("the mutex to queue", || async {
        waiters(&b, "mixed").await == 1
    })
    .await;
    r.release().await.unwrap();
    tokio::time::timeout(SOON, waiting)
        .await
        .expect("mutex not granted after the reader")
        .unwrap()
        .unwrap();
    case.finish().await;
}

/// The upgradeable read lock ([`quorumlock_core::RwLock::upgradeable_read`]):
/// it shares with readers and excludes writers and a second upgradeable
/// reader (which waits: two upgrades never wait for each other); its
/// upgrade waits for the readers granted before it, and only for them,
/// with a larger token; readers and writers that asked later wait, a
/// writer queued behind the upgradeable hold still comes after the
/// upgrade; a failed or tried upgrade leaves the read hold as it was and
/// nothing on the store; a downgrade lets readers in again. On a store
/// without upgradeable read locks, the request is `InvalidArgument` and
/// writes nothing.
pub async fn rw_upgradeable_read_upgrades_after_readers_drain(h: &Harness) {
    use quorumlock_core::LockKind;
    let case = h.case();
    let clients = case.clients(3).await;
    let (a, b, c) = (&clients[0], &clients[1], &clients[2]);
    let rw = |x: &LockClient| x.rwlock("up").unwrap();
    if !a.backend().capabilities().upgradeable_read {
        assert_kind(
            rw(a).upgradeable_read().await,
            ErrorKind::InvalidArgument,
            "an upgradeable read where the store has none",
        );
        assert!(c.inspect("up").await.unwrap().is_free(), "a refusal wrote");
        case.finish().await;
        return;
    }
    let r1 = read(b, "up").await;
    let mut u = tokio::time::timeout(SOON, rw(a).upgradeable_read())
        .await
        .expect("an upgradeable read beside a reader waited")
        .unwrap();
    assert_eq!(u.kind(), LockKind::Upgradeable);
    assert_kind(
        rw(c).try_upgradeable_read().await,
        ErrorKind::WouldBlock,
        "a second upgradeable reader beside the first",
    );
    assert_kind(
        rw(c)
            .upgradeable_read_timeout(Duration::from_millis(300))
            .await,
        ErrorKind::Timeout,
        "a second upgradeable reader beside the first",
    );
    assert_kind(
        rw(c).try_write().await,
        ErrorKind::WouldBlock,
        "a writer beside an upgradeable reader",
    );
    let r2 = read(c, "up").await;
    assert_kind(
        u.reenter_write().map(|_| ()),
        ErrorKind::UpgradeRefused,
        "re-entering an upgradeable read hold to write",
    );
    assert_kind(
        c.multi_lock_of([("up", LockKind::Upgradeable)]).map(|_| ()),
        ErrorKind::InvalidArgument,
        "a multi-lock of an upgradeable read",
    );
    let mut plain = read(b, "up").await;
    assert_kind(
        plain.upgrade().await.map(|_| ()),
        ErrorKind::UpgradeRefused,
        "upgrading a plain read hold",
    );
    plain.release().await.unwrap();
    let key = crate::scratch::scratch_key(a.backend().as_ref(), case.namespace(), "up");
    assert_kind(
        u.fenced_put(key.as_str(), b"r".to_vec()).await,
        ErrorKind::InvalidArgument,
        "a fenced write of an upgradeable read hold",
    );

    // A writer queues behind the upgradeable hold.
    let writer = {
        let c = c.clone();
        spawn_queued(a, "up", 1, "the writer to queue", async move {
            let w = c.rwlock("up").unwrap().write().await.unwrap();
            let t = w.token();
            w.release().await.unwrap();
            t
        })
        .await
    };

    // Tried and timed-out upgrades change nothing.
    assert_kind(
        u.try_upgrade().await.map(|_| ()),
        ErrorKind::WouldBlock,
        "an upgrade beside readers, tried",
    );
    assert_kind(
        u.upgrade_timeout(Duration::from_millis(300))
            .await
            .map(|_| ()),
        ErrorKind::Timeout,
        "an upgrade beside readers",
    );
    assert!(u.is_held(), "a failed upgrade lost the read hold");
    a.wait_idle().await;
    let state = c.inspect("up").await.unwrap();
    assert_eq!(
        (state.holders.len(), state.waiters.len()),
        (3, 1),
        "a failed upgrade left entries, or the read hold went: {state:?}"
    );

    let read_token = u.token();
    let (granted_tx, mut granted) = tokio::sync::oneshot::channel();
    let (done_tx, done) = tokio::sync::oneshot::channel::<()>();
    let upgrader = {
        let key = key.clone();
        tokio::spawn(async move {
            {
                let up = u.upgrade().await.unwrap();
                up.fenced_put(key.as_str(), b"w".to_vec()).await.unwrap();
                granted_tx.send(up.token()).unwrap();
                done.await.unwrap();
                up.downgrade().await.unwrap();
            }
            assert!(u.is_held(), "the downgrade lost the read hold");
            u.release().await.unwrap();
        })
    };
    eventually("the upgrade to queue", || async {
        waiters(a, "up").await == 2
    })
    .await;
    assert_kind(
        rw(b).try_read().await,
        ErrorKind::WouldBlock,
        "a reader beside a waiting upgrade",
    );
    let late_reader = {
        let b = b.clone();
        spawn_queued(a, "up", 3, "the late reader to queue", async move {
            let r = read(&b, "up").await;
            let t = r.token();
            r.release().await.unwrap();
            t
        })
        .await
    };
    r1.release().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut granted)
            .await
            .is_err(),
        "upgraded while a reader granted after the upgradeable hold still held"
    );
    r2.release().await.unwrap();
    let up_token = tokio::time::timeout(SOON, granted)
        .await
        .expect("the upgrade was not granted once the readers had gone")
        .unwrap();
    assert_eq!(
        up_token, read_token,
        "the upgrade keeps its place and token"
    );
    assert_eq!(
        c.read_key(&key).await.unwrap().as_deref(),
        Some(&b"w"[..]),
        "the upgraded hold's fenced write"
    );
    let state = c.inspect("up").await.unwrap();
    let kinds: Vec<LockKind> = state.holders.iter().map(|h| h.kind).collect();
    assert_eq!(
        kinds,
        [LockKind::Upgradeable, LockKind::Upgrade],
        "holders while upgraded: {state:?}"
    );
    assert_eq!(state.waiters.len(), 2, "{state:?}");
    done_tx.send(()).unwrap();
    tokio::time::timeout(SOON, upgrader)
        .await
        .expect("the upgrader did not finish")
        .unwrap();
    let writer_token = tokio::time::timeout(SOON, writer)
        .await
        .expect("the writer was not granted")
        .unwrap();
    let reader_token = tokio::time::timeout(SOON, late_reader)
        .await
        .expect("the late reader was not granted")
        .unwrap();
    assert!(
        up_token < writer_token && writer_token < reader_token,
        "upgrade {up_token}, writer {writer_token}, late reader {reader_token}"
    );

    // A downgrade lets readers in again; an upgrade with no reader is at
    // once.
    let mut u = rw(a).upgradeable_read().await.unwrap();
    {
        let up = tokio::time::timeout(SOON, u.try_upgrade())
            .await
            .expect("an upgrade of a lone hold waited")
            .unwrap();
        assert_kind(
            rw(b).try_read().await,
            ErrorKind::WouldBlock,
            "a reader beside an upgraded hold",
        );
        up.downgrade().await.unwrap();
    }
    let r = rw(b).try_read().await.expect("a reader after a downgrade");
    assert_kind(
        u.try_upgrade().await.map(|_| ()),
        ErrorKind::WouldBlock,
        "an upgrade beside a reader, tried",
    );
    r.release().await.unwrap();
    drop(
        u.try_upgrade()
            .await
            .expect("an upgrade once the reader left"),
    );
    u.release().await.unwrap();
    // Broken, the read hold upgrades to nothing: the store refuses an
    // upgrade whose entry is gone, if its holder asks before it learns.
    let mut u = rw(a).upgradeable_read().await.unwrap();
    assert!(c.break_lock("up").await.unwrap());
    let r = u.upgrade_timeout(Duration::from_secs(5)).await.map(|_| ());
    match r {
        Err(e) => assert!(
            matches!(e.kind(), ErrorKind::LockLost | ErrorKind::UpgradeRefused),
            "an upgrade of a broken hold: {e}"
        ),
        Ok(()) => panic!("an upgrade of a broken hold was granted"),
    }
    drop(u);
    crate::scratch::remove_scratch(c, &key).await;
    case.finish().await;
}

/// An upgrade is refused (`UpgradeRefused`, nothing left on the store)
/// while a reader waits behind a writer that waits for the upgradeable
/// hold: granted, it would let that reader in beside the write as soon
/// as the writer gave up; waited for, it would wait for ever (the reader
/// waits for the writer, the writer for the upgradeable hold). Once the
/// writer gives up, the reader holds and the upgrade waits for it.
pub async fn rw_upgrade_refused_while_a_reader_waits_behind_a_writer(h: &Harness) {
    let case = h.case();
    let clients = case.clients(3).await;
    let (a, b, c) = (&clients[0], &clients[1], &clients[2]);
    if !a.backend().capabilities().upgradeable_read {
        case.finish().await;
        return;
    }
    // A reader holds; the upgradeable hold beside it; a writer queues
    // behind, and a reader behind the writer.
    let r0 = tokio::time::timeout(SOON, c.rwlock("upw").unwrap().read())
        .await
        .expect("a reader waited on a free lock")
        .unwrap();
    let mut u = a.rwlock("upw").unwrap().upgradeable_read().await.unwrap();
    let writer = {
        let b = b.clone();
        let task = async move { b.rwlock("upw").unwrap().write().await };
        spawn_queued(a, "upw", 1, "the writer to queue", task).await
    };
    let reader = {
        let c = c.clone();
        let task = async move { c.rwlock("upw").unwrap().read().await };
        spawn_queued(a, "upw", 2, "the reader to queue", task).await
    };
    // The upgrade waits for the reader that holds; once that one leaves,
    // it is refused, at once (not a TTL later).
    let ttl = a.backend().capabilities().session_ttl;
    let let_go = async {
        eventually("the upgrade to queue", || async {
            waiters(a, "upw").await == 3
        })
        .await;
        r0.release().await.unwrap();
        Instant::now()
    };
    let (upgraded, released) = tokio::join!(u.upgrade_timeout(SOON), let_go);
    match upgraded {
        Ok(up) => {
            // The writer gives up: does the reader behind it get in
            // beside the write?
            writer.abort();
            let beside = tokio::time::timeout(Duration::from_secs(2), reader).await;
            panic!(
                "upgraded (token {}) while a reader waited behind a writer; after the writer gave up the reader {}",
                up.token(),
                if beside.is_ok() { "was granted beside the write: two holders" } else { "still waited" }
            );
        }
        Err(e) => assert_eq!(e.kind(), ErrorKind::UpgradeRefused, "{e}"),
    }
    assert!(
        released.elapsed() < ttl / 2,
        "the refusal came {:?} after the reader left (TTL {ttl:?})",
        released.elapsed()
    );
    // Asked again, it is refused at once, tried too.
    assert_kind(
        u.upgrade_timeout(SOON).await.map(|_| ()),
        ErrorKind::UpgradeRefused,
        "an upgrade while a reader waits behind a writer",
    );
    assert_kind(
        u.try_upgrade().await.map(|_| ()),
        ErrorKind::UpgradeRefused,
        "an upgrade while a reader waits behind a writer, tried",
    );
    assert!(u.is_held(), "a refused upgrade lost the read hold");
    a.wait_idle().await;
    assert_eq!(
        waiters(a, "upw").await,
        2,
        "a refused upgrade left an entry, or took one away"
    );
    // The writer gives up: the reader holds beside the upgradeable hold,
    // and an upgrade waits for it.
    writer.abort();
    let r = tokio::time::timeout(SOON, reader)
        .await
        .expect("the reader was not granted after the writer gave up")
        .unwrap()
        .unwrap();
    assert_kind(
        u.try_upgrade().await.map(|_| ()),
        ErrorKind::WouldBlock,
        "an upgrade beside a reader, tried",
    );
    r.release().await.unwrap();
    drop(
        tokio::time::timeout(SOON, u.upgrade())
            .await
            .expect("the upgrade waited after the reader left")
            .unwrap(),
    );
    u.release().await.unwrap();
    case.finish().await;
}
