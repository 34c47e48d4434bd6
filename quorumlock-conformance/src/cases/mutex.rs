//! Mutex cases (run on every flavor): exclusion, tokens, try-acquire, timeouts, order, reentrancy, release, inspect.

use super::*;

/// Many tasks on several clients: never two holders, tokens increase in
/// the order the lock was held.
pub async fn exclusion_under_contention(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let clients = case.clients(3).await;
    contend(f, &clients, 3, 4).await;
    case.finish().await;
}

/// Owners inside one client exclude each other like separate processes.
pub async fn local_owners_exclude_each_other(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let clients = case.clients(1).await;
    contend(f, &clients, 6, 4).await;
    case.finish().await;
}

/// Successive holders on different clients get strictly larger tokens.
pub async fn tokens_strictly_increase(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let clients = case.clients(2).await;
    let mut last = 0;
    for i in 0..8 {
        let g = acquire(f, &clients[i % 2], "fenced").await;
        assert!(g.token() > last, "token {} after {last}", g.token());
        last = g.token();
        g.release().await.unwrap();
    }
    case.finish().await;
}

/// Try-acquire fails at once while the lock is held (by another client or
/// another owner of the same client), and leaves no waiter behind.
pub async fn try_acquire_when_held(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let (a, b) = (case.client().await, case.client().await);
    let g = acquire(f, &a, "busy").await;
    let start = Instant::now();
    assert_kind(
        handle(f, &b, "busy").try_acquire().await,
        ErrorKind::WouldBlock,
        "other client",
    );
    assert_kind(
        handle(f, &a, "busy").try_acquire().await,
        ErrorKind::WouldBlock,
        "other owner",
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "try-acquire waited"
    );
    let state = b.inspect("busy").await.unwrap();
    assert_eq!(state.holders.len(), 1);
    assert!(
        state.waiters.is_empty(),
        "try-acquire left a waiter: {state:?}"
    );
    g.release().await.unwrap();
    let g = handle(f, &b, "busy").try_acquire().await.expect("free now");
    g.release().await.unwrap();
    case.finish().await;
}

/// Another client's holder that comes between a client's repeated cycles
/// excludes its next try (a backend that infers "still alone" from its
/// last cycles must see the holder), and the cycles go on after it.
pub async fn holder_between_repeated_cycles(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let (a, b) = (case.client().await, case.client().await);
    let ours = handle(f, &a, "again");
    for _ in 0..4 {
        ours.try_acquire().await.unwrap().release().await.unwrap();
    }
    let theirs = acquire(f, &b, "again").await;
    assert_kind(
        ours.try_acquire().await,
        ErrorKind::WouldBlock,
        "held by the other client",
    );
    theirs.release().await.unwrap();
    for _ in 0..2 {
        ours.try_acquire().await.unwrap().release().await.unwrap();
    }
    case.finish().await;
}

/// A timed acquire gives up near its deadline and removes its waiter.
pub async fn timeout_bounds_and_no_leftover_waiter(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let (a, b) = (case.client().await, case.client().await);
    let g = acquire(f, &a, "slow").await;
    let start = Instant::now();
    let r = handle(f, &b, "slow")
        .acquire_timeout(Duration::from_millis(600))
        .await;
    let took = start.elapsed();
    assert_kind(r, ErrorKind::Timeout, "timed acquire of a held lock");
    assert!(
        took >= Duration::from_millis(600),
        "gave up early: {took:?}"
    );
    assert!(took < Duration::from_secs(10), "gave up late: {took:?}");
    // Removal past ABANDON_GRACE goes on in the background (the
    // documented contract of acquire_timeout): wait for it.
    b.wait_idle().await;
    assert_eq!(waiters(&a, "slow").await, 0, "timed-out waiter left behind");
    g.release().await.unwrap();
    let g = handle(f, &b, "slow")
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("free lock within the timeout");
    g.release().await.unwrap();
    case.finish().await;
}

/// Waiters on different clients get the lock in arrival order.
pub async fn fifo_order_across_clients(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let holder = case.client().await;
    let clients = case.clients(5).await;
    let g = acquire(f, &holder, "queue").await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let (c, order) = (c.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = acquire(f, &c, "queue").await;
            order.lock().unwrap().push((i, g.token()));
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await.unwrap();
        }));
        eventually("the waiter to queue", || async {
            waiters(&holder, "queue").await == i + 1
        })
        .await;
    }
    g.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    let who: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(who, vec![0, 1, 2, 3, 4], "not served in arrival order");
    assert!(
        order.windows(2).all(|w| w[0].1 < w[1].1),
        "tokens {order:?}"
    );
    case.finish().await;
}

/// Re-entering through the guard keeps the token and the store entry; the
/// lock is released only with the outer guard.
pub async fn reentrancy_by_guard(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let (a, b) = (case.client().await, case.client().await);
    let mut g = acquire(f, &a, "reentrant").await;
    let token = g.token();
    {
        let mut r = g.reenter();
        assert_eq!(r.token(), token);
        assert_eq!(r.hold_count(), 2);
        let r2 = r.reenter();
        assert_eq!(r2.hold_count(), 3);
        assert_eq!(r2.token(), token);
    }
    assert_eq!(g.hold_count(), 1);
    // Dropping the nested holds released nothing.
    assert_kind(
        handle(f, &b, "reentrant").try_acquire().await,
        ErrorKind::WouldBlock,
        "other client",
    );
    assert_kind(
        handle(f, &a, "reentrant").try_acquire().await,
        ErrorKind::WouldBlock,
        "new owner, same client",
    );
    let state = b.inspect("reentrant").await.unwrap();
    assert_eq!(state.holders.len(), 1);
    assert_eq!(state.holders[0].token, token);
    g.release().await.unwrap();
    let g = handle(f, &b, "reentrant")
        .try_acquire()
        .await
        .expect("released at count 0");
    g.release().await.unwrap();
    case.finish().await;
}

/// Drop releases in the background; `release()` confirms before returning.
pub async fn release_by_drop_and_by_release(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let (a, b) = (case.client().await, case.client().await);
    let g = acquire(f, &a, "rel").await;
    drop(g);
    let g = acquire(f, &b, "rel").await;
    g.release().await.unwrap();
    let state = a.inspect("rel").await.unwrap();
    assert!(
        state.is_free(),
        "release() returned before the entry was gone: {state:?}"
    );
    case.finish().await;
}

/// A thousand locks held on one client share its single session.
pub async fn thousand_locks_on_one_session(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let a = case.client().await;
    let guards: Vec<LockGuard> = stream::iter(0..1000)
        .map(|i| {
            let a = a.clone();
            async move { acquire(f, &a, &format!("bulk/l{i}")).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let sid = guards[0].session_id();
    assert!(guards.iter().all(|g| g.session_id() == sid && g.is_held()));
    assert_eq!(a.session_id().await.as_deref(), Some(sid.as_str()));
    let st = a.inspect("bulk/l999").await.unwrap();
    assert_eq!(st.holders.len(), 1);
    assert_eq!(st.holders[0].session, sid);
    stream::iter(guards)
        .map(|g| async move { g.release().await.unwrap() })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    case.finish().await;
}

/// `inspect` shows the holder (token, session) and the waiters in order.
pub async fn inspect_reports_holder_and_waiters_in_order(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let (a, b, c) = (
        case.client().await,
        case.client().await,
        case.client().await,
    );
    let g = acquire(f, &a, "seen").await;
    let mut tasks = Vec::new();
    for (i, w) in [b.clone(), c.clone()].into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            acquire(f, &w, "seen").await.release().await
        }));
        eventually("the waiter to queue", || async {
            waiters(&a, "seen").await == i + 1
        })
        .await;
    }
    let state = a.inspect("seen").await.unwrap();
    assert_eq!(state.holders.len(), 1);
    assert_eq!(state.holders[0].token, g.token());
    assert_eq!(state.holders[0].session, g.session_id());
    let sessions: Vec<String> = state.waiters.iter().map(|w| w.session.clone()).collect();
    let expected = vec![b.session_id().await.unwrap(), c.session_id().await.unwrap()];
    assert_eq!(sessions, expected, "waiters not in arrival order");
    g.release().await.unwrap();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    case.finish().await;
}

/// A timeout too long for the clock to add (`Duration::MAX`) waits
/// without end, as `acquire()` does, on every timed call: no panic, and a
/// free lock is granted.
pub async fn timeouts_of_any_length(h: &Harness) {
    let case = h.case();
    let a = case.client().await;
    let caps = a.backend().capabilities();
    let forever = Duration::MAX;
    let g = a
        .lock("t/m")
        .unwrap()
        .acquire_timeout(forever)
        .await
        .unwrap();
    g.release().await.unwrap();
    let g = a
        .multi_lock(["t/a", "t/b"])
        .unwrap()
        .acquire_timeout(forever)
        .await
        .unwrap();
    g.release().await.unwrap();
    if caps.rwlock {
        let rw = a.rwlock("t/rw").unwrap();
        rw.read_timeout(forever)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        rw.write_timeout(forever)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    if caps.semaphore {
        let s = a.semaphore("t/s", 2).unwrap();
        s.acquire_timeout(forever)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let leader = a
        .election("t/e")
        .unwrap()
        .campaign_timeout("v", forever)
        .await
        .unwrap();
    leader.resign().await.unwrap();
    case.finish().await;
}
