//! Semaphore cases (backends with `Capabilities::semaphore`).

use super::*;

/// Many clients contend for 3 permits: never more than 3 holders, and 3 at
/// once is reached (it is not a mutex).
pub async fn semaphore_never_exceeds_permits(h: &Harness) {
    let case = h.case();
    let clients = case.clients(6).await;
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in &clients {
        let (c, inside, most) = (c.clone(), inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let sem = c.semaphore("pool", 3).unwrap();
            for _ in 0..3 {
                let g = tokio::time::timeout(SOON, sem.acquire())
                    .await
                    .expect("permit")
                    .unwrap();
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(60)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        most.load(Ordering::SeqCst) <= 3,
        "more than 3 holders at once"
    );
    assert_eq!(
        most.load(Ordering::SeqCst),
        3,
        "never 3 holders at once: not a semaphore"
    );
    case.finish().await;
}

/// Asking with a different permit count than the holders use is a clear
/// conflict, not a wait; zero permits is rejected before any I/O.
pub async fn semaphore_permit_count_conflict(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    assert_kind(
        a.semaphore("limit", 0).map(|_| ()),
        ErrorKind::InvalidArgument,
        "zero permits",
    );
    let g = a.semaphore("limit", 3).unwrap().acquire().await.unwrap();
    assert_kind(
        b.semaphore("limit", 2).unwrap().try_acquire().await,
        ErrorKind::Conflict,
        "try with 2 of 3",
    );
    let r = tokio::time::timeout(SOON, b.semaphore("limit", 2).unwrap().acquire()).await;
    assert_kind(
        r.expect("a conflicting acquire must fail, not wait"),
        ErrorKind::Conflict,
        "acquire with 2 of 3",
    );
    assert_eq!(
        waiters(&a, "limit").await,
        0,
        "conflicting request left an entry"
    );
    g.release().await.unwrap();
    case.finish().await;
}

/// Permits go to waiters in arrival order.
pub async fn semaphore_fifo(h: &Harness) {
    let case = h.case();
    let holders = case.clients(2).await;
    let clients = case.clients(3).await;
    let mut held = Vec::new();
    for c in &holders {
        held.push(c.semaphore("fifo", 2).unwrap().acquire().await.unwrap());
    }
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let (c, order) = (c.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = c.semaphore("fifo", 2).unwrap().acquire().await.unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(30)).await;
            g.release().await.unwrap();
        }));
        eventually("the waiter to queue", || async {
            waiters(&holders[0], "fifo").await == i + 1
        })
        .await;
    }
    // Release one permit at a time so the order is observable.
    for g in held {
        g.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order[0], 0, "first waiter not served first: {order:?}");
    assert_eq!(order.len(), 3);
    case.finish().await;
}

/// One client holds several permits at once: `N` tasks of one client
/// hold `N` permits together, the `N+1`th (of this client or another)
/// waits until one is released, and the limit is never exceeded while six
/// tasks of one client and one of another contend.
pub async fn semaphore_permits_per_client(h: &Harness) {
    const N: usize = 3;
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let sem = a.semaphore("per-client", N as u32).unwrap();
    let mut held = Vec::new();
    for i in 0..N {
        let g = tokio::time::timeout(Duration::from_secs(10), sem.acquire())
            .await
            .unwrap_or_else(|_| panic!("permit {} of {N} on one client never came", i + 1))
            .unwrap();
        held.push(g);
    }
    let tokens: std::collections::BTreeSet<u64> = held.iter().map(|g| g.token()).collect();
    assert_eq!(tokens.len(), N, "permits share a token");
    assert_eq!(
        a.inspect("per-client").await.unwrap().holders.len(),
        N,
        "inspect shows fewer holders"
    );
    assert_kind(
        sem.try_acquire().await,
        ErrorKind::WouldBlock,
        "permit N+1 on the same client",
    );
    let other = b.semaphore("per-client", N as u32).unwrap();
    assert_kind(
        other.try_acquire().await,
        ErrorKind::WouldBlock,
        "permit N+1 on another client",
    );
    let next = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!next.is_finished(), "permit N+1 granted while N are held");
    held.pop().unwrap().release().await.unwrap();
    let g = tokio::time::timeout(SOON, next)
        .await
        .expect("permit N+1 after a release")
        .unwrap()
        .unwrap();
    held.push(g);
    for g in held {
        g.release().await.unwrap();
    }

    // Contention: six owners of `a` and one of `b`, three rounds each.
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..7 {
        let c = if i < 6 { a.clone() } else { b.clone() };
        let (inside, most) = (inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let sem = c.semaphore("per-client", N as u32).unwrap();
            for _ in 0..3 {
                let g = tokio::time::timeout(SOON, sem.acquire())
                    .await
                    .expect("permit")
                    .unwrap();
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(40)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= N, "{most} holders at once, limit {N}");
    assert_eq!(most, N, "never {N} holders at once");
    case.finish().await;
}

/// Several permits at once ([`quorumlock_core::Semaphore::acquire_many`]):
/// never part of them (a request for 3 of 3 waits while one is held, and
/// `inspect` shows none of its permits held meanwhile), in arrival order
/// (a single permit asked after it waits behind it, even while permits
/// are free), released together; a count of 0 or above the permits is
/// refused and writes nothing; a timed-out or tried request leaves
/// nothing. On a store that cannot take several permits at once, a
/// request for 2 is `InvalidArgument` and writes nothing.
pub async fn semaphore_acquire_many_is_atomic_and_in_order(h: &Harness) {
    let case = h.case();
    let clients = case.clients(3).await;
    let (a, b, c) = (&clients[0], &clients[1], &clients[2]);
    let sem = |x: &LockClient| x.semaphore("many", 3).unwrap();
    if !a.backend().capabilities().acquire_many {
        assert_kind(
            sem(a).acquire_many(2).await,
            ErrorKind::InvalidArgument,
            "2 permits where the store cannot",
        );
        assert!(
            c.inspect("many").await.unwrap().is_free(),
            "a refusal wrote"
        );
        case.finish().await;
        return;
    }
    for bad in [0, 4] {
        assert_kind(
            sem(a).acquire_many(bad).await,
            ErrorKind::InvalidArgument,
            &format!("{bad} of 3 permits"),
        );
    }
    assert!(
        c.inspect("many").await.unwrap().is_free(),
        "a refusal wrote"
    );

    let one = sem(a).acquire().await.unwrap();
    assert_kind(
        sem(b).try_acquire_many(3).await,
        ErrorKind::WouldBlock,
        "3 of 3 tried while one is held",
    );
    assert_kind(
        sem(b)
            .acquire_many_timeout(3, Duration::from_millis(300))
            .await,
        ErrorKind::Timeout,
        "3 of 3 while one is held",
    );
    b.wait_idle().await;
    let state = c.inspect("many").await.unwrap();
    assert_eq!(
        (state.holders.len(), state.waiters.len()),
        (1, 0),
        "a failed request left entries: {state:?}"
    );

    let big = {
        let s = sem(b);
        tokio::spawn(async move { s.acquire_many(3).await })
    };
    // Wait until the request is on the store (3 waiting entries).
    eventually("the request for 3 to queue", || async {
        let state = c.inspect("many").await.unwrap();
        assert_eq!(
            state.holders.len(),
            1,
            "part of a 3-permit request held while it waits: {state:?}"
        );
        state.waiters.len() == 3
    })
    .await;
    // Two permits are free, but a single one asked now waits behind it.
    assert_kind(
        sem(c).try_acquire().await,
        ErrorKind::WouldBlock,
        "a permit taken ahead of an earlier 3-permit request",
    );
    let small = {
        let s = sem(c);
        tokio::spawn(async move { s.acquire().await })
    };
    // Its entry queued behind the request's three: not granted.
    eventually("the single permit to queue", || async {
        waiters(c, "many").await == 4
    })
    .await;
    assert!(
        !small.is_finished(),
        "a later single permit overtook the request for 3"
    );
    one.release().await.unwrap();
    let g = tokio::time::timeout(SOON, big)
        .await
        .expect("3 permits not granted")
        .unwrap()
        .unwrap();
    assert_eq!(g.count(), 3);
    let state = c.inspect("many").await.unwrap();
    assert_eq!(state.holders.len(), 3, "{state:?}");
    assert!(state.holders.iter().all(|h| h.session == g.session_id()));
    assert_eq!(
        state.waiters.len(),
        1,
        "a permit granted beside 3 of 3: {state:?}"
    );
    assert!(!small.is_finished(), "a permit granted beside 3 of 3");
    g.release().await.unwrap();
    let s = tokio::time::timeout(SOON, small)
        .await
        .expect("the single permit waited on after the release")
        .unwrap()
        .unwrap();
    assert_eq!(s.count(), 1);
    s.release().await.unwrap();

    // Requests for fewer than all of them, between single ones: 1 + 2 of
    // 3 hold at once; a second request for 2 waits, and a single one
    // asked after it waits behind it.
    let one = sem(a).acquire().await.unwrap();
    let two = tokio::time::timeout(SOON, sem(b).acquire_many(2))
        .await
        .expect("2 of 3 beside 1")
        .unwrap();
    let other_two = {
        let s = sem(c);
        tokio::spawn(async move { s.acquire_many(2).await })
    };
    eventually("the second request for 2 to queue", || async {
        waiters(c, "many").await == 2
    })
    .await;
    assert_kind(
        sem(a).try_acquire().await,
        ErrorKind::WouldBlock,
        "a permit taken ahead of an earlier request for 2",
    );
    two.release().await.unwrap();
    let g2 = tokio::time::timeout(SOON, other_two)
        .await
        .expect("the second request for 2 after the first's release")
        .unwrap()
        .unwrap();
    let state = c.inspect("many").await.unwrap();
    assert_eq!(
        (state.holders.len(), state.waiters.len()),
        (3, 0),
        "{state:?}"
    );
    g2.release().await.unwrap();
    one.release().await.unwrap();

    // A break of a request of several permits: all of its entries go, its
    // guard learns of the loss, a waiter gets a permit.
    let g = sem(b).acquire_many(3).await.unwrap();
    let lost = g.lost();
    let waiter = {
        let s = sem(c);
        tokio::spawn(async move { s.acquire_timeout(SOON).await })
    };
    eventually("the waiter to queue", || async {
        waiters(c, "many").await > 0
    })
    .await;
    assert!(a.break_lock("many").await.unwrap());
    let w = waiter
        .await
        .unwrap()
        .expect("the waiter never got a permit after the break");
    tokio::time::timeout(SOON, lost)
        .await
        .expect("the broken holder of 3 was not told");
    assert!(!g.is_held());
    let state = c.inspect("many").await.unwrap();
    assert_eq!(
        state.holders.len(),
        1,
        "a broken request left entries: {state:?}"
    );
    w.release().await.unwrap();
    drop(g);
    // Released right after a break (before its loss can be heard): every
    // entry of the request was gone, the release says so.
    let g = sem(b).acquire_many(2).await.unwrap();
    assert!(a.break_lock("many").await.unwrap());
    assert_kind(
        g.release().await,
        ErrorKind::LockLost,
        "release of a broken request of 2 permits",
    );
    case.finish().await;
}
