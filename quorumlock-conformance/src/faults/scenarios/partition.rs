//! A client cut off or paused: partitioned holder and waiter, a paused holder fenced off, keepalives delayed then failing.

use super::*;

/// The holder is partitioned (blackhole): its loss future must fire
/// before the waiter is granted.
pub async fn partitioned_holder(t: &FaultTarget) -> Row {
    let mut s = Scene::new(t, "partitioned_holder").await;
    let (a, net) = s.faulty().await;
    let b = s.client().await;
    let mut round = 0;
    while s.more(round) {
        let ga = acquire(&a, s.soon()).await;
        let tra = s.history.track("a", &ga);
        s.register.write("a", ga.token()).expect("first write");
        let mut wb = s.waiter(&b, "b", s.soon());
        s.until_waiters(1).await;
        let cut = Instant::now();
        net.set_mode(NetMode::Blackhole);
        let lost = lost_at(&ga, s.soon(), "partitioned holder").await;
        s.row.loss_delay(lost - cut);
        let got = wb.holds(s.soon(), "waiter after the partition").await;
        let recorded = tra.lost_at().unwrap_or(lost);
        if recorded > got.acquired {
            s.row.violation(format!(
                "the waiter was granted {:?} before the partitioned holder's loss fired",
                recorded - got.acquired
            ));
        }
        net.set_mode(NetMode::Pass);
        if s.register.write("a", ga.token()).is_ok() {
            s.row
                .violation("the partitioned holder's late write was accepted");
        }
        tra.releasing();
        let _ = ga.release().await;
        wb.release().await.expect("release");
        s.row.cycles += 2;
        round += 1;
    }
    s.finish().await
}

/// A waiter is partitioned while queued: it is never granted while cut
/// off, its dead entry does not block others, and after the heal it gets
/// the lock on a new session.
pub async fn partitioned_waiter(t: &FaultTarget) -> Row {
    let mut s = Scene::new(t, "partitioned_waiter").await;
    let a = s.client().await;
    let (b, net) = s.faulty().await;
    let c = s.client().await;
    let mut round = 0;
    while s.more(round) {
        let ga = acquire(&a, s.soon()).await;
        let tra = s.history.track("a", &ga);
        s.register.write("a", ga.token()).expect("first write");
        let retries = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut wb = s.waiter_retrying(&b, "b", s.soon() * 3, Some(retries.clone()));
        s.until_waiters(1).await;
        net.set_mode(NetMode::Blackhole);
        // Long enough for the store to expire the waiter's session.
        tokio::time::sleep(s.ttl * 2 + s.ttl / 2).await;
        if !ga.is_held() {
            s.row
                .violation("the holder lost the lock while only a waiter was cut off");
        }
        let _ = s.register.write("a", ga.token());
        tra.releasing();
        ga.release().await.expect("release of a");
        // The cut-off waiter must not block others.
        let gc = acquire(&c, s.soon()).await;
        let trc = s.history.track("c", &gc);
        let _ = s.register.write("c", gc.token());
        trc.releasing();
        gc.release().await.expect("release of c");
        if wb.task.is_finished() {
            s.row.violation("the cut-off waiter finished while cut off");
        }
        let heal = Instant::now();
        net.set_mode(NetMode::Pass);
        let got = wb.holds(s.soon(), "waiter after the heal").await;
        if got.acquired < heal {
            s.row.violation("the waiter was granted while cut off");
        }
        wb.release().await.expect("release of b");
        let retries = std::mem::take(&mut *retries.lock().unwrap());
        if let Some(last) = retries.last() {
            s.row.note(format!(
                "the cut-off waiter retried {} time(s), last: {last}",
                retries.len()
            ));
        }
        s.row.cycles += 3;
        round += 1;
    }
    s.finish().await
}

/// The holder's process pauses longer than the TTL (its keepalives stop
/// and it does not look at its guard), a second holder appears and
/// writes, then the first resumes and writes with its old token: every
/// such write is rejected by the fenced register.
///
/// The pause is simulated by a blackholed link and a task that does not
/// look at its guard; the runtime keeps running, so the loss future
/// still fires on time and the history shows no overlap. A real
/// SIGSTOP would freeze the loss signal too: then only the fencing token
/// keeps the resource safe, which is what this scenario asserts.
pub async fn paused_holder_fenced(t: &FaultTarget) -> Row {
    let mut s = Scene::new(t, "paused_holder_fenced").await;
    let (a, net) = s.faulty().await;
    let b = s.client().await;
    let mut round = 0;
    while s.more(round) {
        let ga = acquire(&a, s.soon()).await;
        let tra = s.history.track("a", &ga);
        s.register.write("a", ga.token()).expect("first write");
        let mut wb = s.waiter(&b, "b", s.soon());
        s.until_waiters(1).await;
        let pause = Instant::now();
        net.set_mode(NetMode::Blackhole);
        let got = wb.holds(s.soon(), "second holder during the pause").await;
        net.set_mode(NetMode::Pass);
        let before = s.register.rejected_of("a");
        for _ in 0..3 {
            if s.register.write("a", ga.token()).is_ok() {
                s.row
                    .violation("a stale write of the paused holder was accepted");
            }
        }
        let rejected = s.register.rejected_of("a") - before;
        if rejected != 3 {
            s.row
                .violation(format!("{rejected} of 3 stale writes rejected"));
        }
        // The store fences its own keys: the paused holder's write there
        // is refused, while the same write without a fence goes through
        // (so the fence refused it, not the link).
        let key = crate::scratch::scratch_key(a.backend().as_ref(), &s.ns, &format!("p{round}"));
        match ga.fenced_put(key.as_str(), b"stale".to_vec()).await {
            Err(e) if e.kind() == ErrorKind::LockLost => {}
            other => s.row.violation(format!(
                "the paused holder's fenced store write was not refused: {other:?}"
            )),
        }
        let unfenced = KeyWrite::Put {
            key: key.clone(),
            value: b"unfenced".to_vec(),
        };
        a.backend()
            .write_key(&unfenced)
            .await
            .expect("the paused holder's unfenced write");
        crate::scratch::remove_scratch(&s.admin, &key).await;
        if got.token <= ga.token() {
            s.row
                .violation(format!("token {} after {}", got.token, ga.token()));
        }
        if let Some(l) = tra.lost_at() {
            s.row.loss_delay(l - pause);
        }
        tra.releasing();
        let _ = ga.release().await;
        wb.release().await.expect("release of b");
        s.row.cycles += 2;
        round += 1;
    }
    s.finish().await
}

/// Keepalives delayed (a tenth of the TTL) or briefly lost (gaps of a
/// fifth of the TTL) are tolerated; lost for longer than the TTL, the
/// loss fires before anyone else acquires.
pub async fn keepalive_delay_then_failure(t: &FaultTarget) -> Row {
    let mut s = Scene::new(t, "keepalive_delay_then_failure").await;
    let (a, net) = s.faulty().await;
    let b = s.client().await;
    let mut round = 0;
    while s.more(round) {
        let ga = acquire(&a, s.soon()).await;
        let tra = s.history.track("a", &ga);
        s.register.write("a", ga.token()).expect("first write");
        // Tolerated: latency.
        net.set_mode(NetMode::Delay(s.ttl / 10));
        tokio::time::sleep(s.ttl * 2).await;
        net.set_mode(NetMode::Pass);
        if !ga.is_held() {
            s.row.violation(format!(
                "lost under a keepalive delay of TTL/10: {:?}",
                ga.loss()
            ));
        }
        // Tolerated: short gaps.
        for _ in 0..3 {
            net.set_mode(NetMode::Blackhole);
            tokio::time::sleep(s.ttl / 5).await;
            net.set_mode(NetMode::Pass);
            tokio::time::sleep(s.ttl / 2).await;
        }
        if !ga.is_held() {
            s.row.violation(format!(
                "lost under keepalive gaps of TTL/5: {:?}",
                ga.loss()
            ));
        }
        if ga.is_held() {
            s.register.write("a", ga.token()).expect("write while held");
        }
        // Not tolerated: a gap longer than the TTL.
        let mut wb = s.waiter(&b, "b", s.soon());
        s.until_waiters(1).await;
        let cut = Instant::now();
        net.set_mode(NetMode::Blackhole);
        let lost = lost_at(&ga, s.soon(), "keepalives lost").await;
        s.row.loss_delay(lost - cut);
        let got = wb
            .holds(s.soon(), "waiter after the keepalive failure")
            .await;
        if tra.lost_at().unwrap_or(lost) > got.acquired {
            s.row
                .violation("the waiter was granted before the holder's loss fired");
        }
        net.set_mode(NetMode::Pass);
        if s.register.write("a", ga.token()).is_ok() {
            s.row.violation("a late write was accepted");
        }
        tra.releasing();
        let _ = ga.release().await;
        wb.release().await.expect("release of b");
        s.row.cycles += 2;
        round += 1;
    }
    s.finish().await
}
