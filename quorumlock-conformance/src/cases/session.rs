//! Sessions and operators: expiry and kill, loss, forced break, revoke, client close and drop.

use super::*;

/// The store ends the holder's session: its loss future fires, and a
/// waiter gets the lock with a larger token.
pub async fn session_expiry_fires_loss_and_waiter_gets_larger_token(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let (a, b) = (case.client().await, case.client().await);
    let g = acquire(f, &a, "expiring").await;
    let b2 = b.clone();
    let waiter = tokio::spawn(async move { acquire(f, &b2, "expiring").await });
    eventually("the waiter to queue", || async {
        waiters(&a, "expiring").await == 1
    })
    .await;
    b.backend()
        .kill_session(&g.session_id())
        .await
        .expect("kill session");
    let reason = wait_lost(&g).await;
    assert!(
        matches!(
            reason,
            LossReason::SessionExpired | LossReason::EntryDeleted | LossReason::DeadlinePassed
        ),
        "{reason:?}"
    );
    assert!(!g.is_held());
    let g2 = tokio::time::timeout(SOON, waiter)
        .await
        .expect("waiter not granted")
        .unwrap();
    assert!(
        g2.token() > g.token(),
        "token {} not above {}",
        g2.token(),
        g.token()
    );
    assert_kind(g.release().await, ErrorKind::LockLost, "release after loss");
    g2.release().await.unwrap();
    case.finish().await;
}

/// After its session is lost, a client opens a new one on the next acquire.
pub async fn new_session_after_loss(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let a = case.client().await;
    let g = acquire(f, &a, "again").await;
    let old = g.session_id();
    a.backend().kill_session(&old).await.expect("kill session");
    wait_lost(&g).await;
    drop(g);
    let g = acquire(f, &a, "again").await;
    assert_ne!(g.session_id(), old, "reused a dead session");
    assert!(g.is_held());
    g.release().await.unwrap();
    case.finish().await;
}

/// An operator breaks the lock: the holder is told, others can take it.
/// From the moment the holder is told, `inspect` no longer shows it as the
/// holder, even while the break is still under way (a store's grace).
pub async fn forced_break_reports_loss(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let (a, b) = (case.client().await, case.client().await);
    assert!(!b.break_lock("brk").await.unwrap(), "broke a free lock");
    let g = acquire(f, &a, "brk").await;
    let breaker = b.clone();
    let breaking = tokio::spawn(async move { breaker.break_lock("brk").await });
    assert_eq!(wait_lost(&g).await, LossReason::EntryDeleted);
    assert!(!g.is_held());
    let st = b.inspect("brk").await.unwrap();
    assert!(
        st.holders.is_empty(),
        "a broken holder is still shown as holding: {st:?}"
    );
    let broke = tokio::time::timeout(SOON, breaking)
        .await
        .expect("the break never finished")
        .unwrap();
    assert!(broke.unwrap(), "break found no holder");
    let g2 = acquire(f, &b, "brk").await;
    assert!(g2.token() > g.token());
    assert_kind(
        g.release().await,
        ErrorKind::LockLost,
        "release after break",
    );
    // The broken holder's release must not touch the new holder.
    assert!(g2.is_held());
    assert_eq!(a.inspect("brk").await.unwrap().holders[0].token, g2.token());
    g2.release().await.unwrap();
    case.finish().await;
}

/// An operator breaks the lock and the holder releases at once, before
/// its watch could tell it: the release still fails with `LockLost`
/// (the work under the lock was not protected to its end), leaves
/// nothing behind, and the next holder gets a larger token.
pub async fn release_right_after_a_break_reports_loss(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let (a, b) = (case.client().await, case.client().await);
    let g = acquire(f, &a, "brk-rel").await;
    let broke = tokio::time::timeout(SOON, b.break_lock("brk-rel"))
        .await
        .expect("the break never finished")
        .unwrap();
    assert!(broke, "break found no holder");
    let token = g.token();
    assert_kind(
        g.release().await,
        ErrorKind::LockLost,
        "release of a broken hold (the loss not yet reported)",
    );
    let g2 = acquire(f, &b, "brk-rel").await;
    assert!(g2.token() > token);
    g2.release().await.unwrap();
    case.finish().await;
}

/// A revoke request reaches the holder, which keeps the lock until it lets go.
pub async fn cooperative_revoke(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let (a, b) = (case.client().await, case.client().await);
    assert!(
        !b.request_revoke("rv").await.unwrap(),
        "revoked a free lock"
    );
    let g = acquire(f, &a, "rv").await;
    assert!(!g.is_revoke_requested());
    assert!(b.request_revoke("rv").await.unwrap());
    tokio::time::timeout(SOON, g.revoke_requested())
        .await
        .expect("revoke request not seen");
    assert!(g.is_revoke_requested());
    assert!(g.is_held(), "a revoke request is not a loss");
    assert_kind(
        handle(f, &b, "rv").try_acquire().await,
        ErrorKind::WouldBlock,
        "still held",
    );
    g.release().await.unwrap();
    let g = acquire(f, &b, "rv").await;
    assert!(
        !g.is_revoke_requested(),
        "a new holder inherited an old revoke request"
    );
    // The old request went with its holder (whose client lives on): a new
    // one reaches the new holder.
    assert!(a.request_revoke("rv").await.unwrap());
    tokio::time::timeout(SOON, g.revoke_requested())
        .await
        .expect("a revoke request to the next holder was not seen");
    g.release().await.unwrap();
    // A request in a hold's last moments (let go before the holder could
    // see it) neither reaches nor blocks a request to the next holder.
    let g = acquire(f, &a, "rv").await;
    assert!(b.request_revoke("rv").await.unwrap());
    g.release().await.unwrap();
    let g = acquire(f, &b, "rv").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !g.is_revoke_requested(),
        "a new holder inherited a revoke request of a short hold"
    );
    assert!(a.request_revoke("rv").await.unwrap());
    tokio::time::timeout(SOON, g.revoke_requested())
        .await
        .expect("a revoke request after a short revoked hold was not seen");
    g.release().await.unwrap();
    case.finish().await;
}

/// The loss future is independent of the guard, and closing the client
/// fires it.
pub async fn loss_future_outlives_guard_and_fires_on_client_close(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let a = case.client().await;
    let g = acquire(f, &a, "closing").await;
    let lost = tokio::spawn(g.lost());
    assert!(g.is_held());
    a.close().await;
    let reason = tokio::time::timeout(SOON, lost)
        .await
        .expect("loss not signalled")
        .unwrap();
    assert_eq!(reason, LossReason::ClientClosed);
    assert!(!g.is_held());
    drop(g);
    case.finish().await;
}

/// Dropping every handle of a client without `close()` ends its session
/// on the store; nothing stays alive until a TTL runs out.
pub async fn dropped_client_ends_its_session(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let observer = case.client().await;
    let backend = h.backend(case.namespace()).await;
    let sid = {
        let a = LockClient::new(backend.clone());
        let g = acquire(f, &a, "dropped").await;
        let sid = g.session_id();
        drop(g);
        sid
    };
    // The guard's background release and the session close run on their
    // own, well before the TTL would have ended the session anyway.
    let bound = backend.capabilities().session_ttl / 2;
    let start = Instant::now();
    while !backend.leftovers().await.expect("leftovers").is_empty() {
        assert!(
            start.elapsed() < bound,
            "session {sid} outlived its client by {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        observer.inspect("dropped").await.unwrap().is_free(),
        "session {sid} still holds"
    );
    case.finish().await;
}

/// `kill_session` with an id that is not of the store's form is
/// `InvalidArgument` (the contract), for every such id, and kills nothing:
/// a lock held meanwhile stays held.
pub async fn kill_session_refuses_a_malformed_id(h: &Harness) {
    let case = h.case();
    let a = case.client().await;
    let g = acquire(h.flavor(), &a, "kept").await;
    // Not an id on any store: no etcd hex lease id, no ZooKeeper `0x...`,
    // no Consul UUID, no `mem-...`.
    for bad in [
        "",
        "not a session",
        "0x",
        "g0",
        "../x",
        "12-34",
        "mem-",
        "-1",
    ] {
        let r = a.backend().kill_session(bad).await;
        assert_kind(
            r,
            ErrorKind::InvalidArgument,
            &format!("kill_session({bad:?})"),
        );
    }
    let st = a.inspect("kept").await.expect("inspect");
    let holders: Vec<&str> = st.holders.iter().map(|c| c.session.as_str()).collect();
    assert_eq!(
        holders,
        [g.session_id()],
        "a refused kill must end no session"
    );
    assert!(g.is_held());
    g.release().await.expect("release");
    case.finish().await;
}
