//! The store takes a lock away: a killed session, a forced break, a waiter whose session is killed.

use super::*;

#[derive(Clone, Copy)]
enum Blow {
    KillSession,
    BreakLock,
}

/// The holder loses its lock from the store's side while a waiter
/// queues: its loss fires, the waiter gets a larger token, and the old
/// holder's late write is rejected.
async fn holder_loses(t: &FaultTarget, scenario: &str, blow: Blow) -> Row {
    let mut s = Scene::new(t, scenario).await;
    if matches!(blow, Blow::KillSession) && !s.admin.backend().capabilities().kill_session {
        s.row.note("skipped: the backend cannot kill sessions");
        return s.finish().await;
    }
    let (a, b) = (s.client().await, s.client().await);
    let mut round = 0;
    while s.more(round) {
        let ga = acquire(&a, s.soon()).await;
        let tra = s.history.track("a", &ga);
        s.register
            .write("a", ga.token())
            .expect("first write of a holder");
        let mut wb = s.waiter(&b, "b", s.soon());
        s.until_waiters(1).await;
        let fault_at = Instant::now();
        match blow {
            Blow::KillSession => s
                .admin
                .backend()
                .kill_session(&ga.session_id())
                .await
                .expect("kill session"),
            Blow::BreakLock => assert!(
                s.admin.break_lock(LOCK).await.expect("break"),
                "nothing to break"
            ),
        }
        // The store took the lock at `fault_at`; the holder learns it
        // only from the store (a watch, a failed keepalive), so a waiter
        // granted at once may overlap the notification: that window is
        // what fencing is for, and its length is the loss delay.
        tra.forced(fault_at);
        s.row.faults += 1;
        let lost = lost_at(&ga, s.soon(), scenario).await;
        s.row.loss_delay(lost - fault_at);
        assert!(!ga.is_held());
        let got = wb.holds(s.soon(), scenario).await;
        assert!(
            got.token > ga.token(),
            "token {} after {}",
            got.token,
            ga.token()
        );
        // The old holder, not looking at its guard, writes late.
        if s.register.write("a", ga.token()).is_ok() {
            s.row.violation("the old holder's late write was accepted");
        }
        tra.releasing();
        match ga.release().await {
            Err(e) if e.kind() == ErrorKind::LockLost => {}
            r => s
                .row
                .violation(format!("release after loss gave {r:?}, not LockLost")),
        }
        wb.release().await.expect("the new holder's release");
        s.row.cycles += 2;
        round += 1;
    }
    s.finish().await
}

/// The store ends the holder's session (`Backend::kill_session`).
pub async fn holder_session_killed(t: &FaultTarget) -> Row {
    holder_loses(t, "holder_session_killed", Blow::KillSession).await
}

/// An operator deletes the holder's entry (`Backend::break_lock`).
pub async fn operator_breaks_lock(t: &FaultTarget) -> Row {
    holder_loses(t, "operator_breaks_lock", Blow::BreakLock).await
}

/// A queued waiter's session is killed: it is never granted on that
/// session while the holder holds; it gets the lock later on a new one.
pub async fn waiter_session_killed_while_queued(t: &FaultTarget) -> Row {
    let mut s = Scene::new(t, "waiter_session_killed_while_queued").await;
    if !s.admin.backend().capabilities().kill_session {
        s.row.note("skipped: the backend cannot kill sessions");
        return s.finish().await;
    }
    let (a, b) = (s.client().await, s.client().await);
    let mut round = 0;
    while s.more(round) {
        let ga = acquire(&a, s.soon()).await;
        let tra = s.history.track("a", &ga);
        s.register.write("a", ga.token()).expect("first write");
        let mut wb = s.waiter(&b, "b", s.soon() * 2);
        s.until_waiters(1).await;
        let killed = b.session_id().await.expect("the waiter has a session");
        s.admin
            .backend()
            .kill_session(&killed)
            .await
            .expect("kill the waiter's session");
        s.row.faults += 1;
        // The holder keeps holding for a while; the waiter must not be
        // granted meanwhile.
        tokio::time::sleep(s.ttl).await;
        if wb.task.is_finished() {
            s.row.violation("the waiter ended while the lock was held");
        }
        if !ga.is_held() {
            s.row
                .violation("the holder lost the lock when a waiter's session was killed");
        }
        if let Ok(st) = s.admin.inspect(LOCK).await {
            if st
                .waiters
                .iter()
                .chain(st.holders.iter())
                .any(|c| c.session == killed)
            {
                s.row.violation(format!(
                    "an entry of the killed session is still queued: {st:?}"
                ));
            }
        }
        let _ = s.register.write("a", ga.token());
        tra.releasing();
        ga.release().await.expect("release of a");
        let got = wb.holds(s.soon(), "waiter after the holder released").await;
        if got.session == killed {
            s.row.violation("granted on the killed session");
        }
        wb.release().await.expect("release of b");
        s.row.cycles += 2;
        round += 1;
    }
    s.finish().await
}
