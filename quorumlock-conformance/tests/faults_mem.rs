//! The fault scenarios against the in-memory backend (simulated links),
//! with a 1 s session TTL so that each runs in a few seconds.

use quorumlock_conformance::faults::FaultTarget;

fn target() -> Option<FaultTarget> {
    Some(FaultTarget::mem("mem://faults?ttl=1s"))
}

quorumlock_conformance::fault_suite!(target());

/// A timed acquire whose deadline timer fires late (the runtime stalled)
/// still returns by its deadline plus the abandon grace when it can, here
/// at once: the grace counts from the deadline, not from the late wake-up.
/// The removal of its entry hangs on a dead link, so the only bound on
/// the wait is the grace.
#[tokio::test]
async fn a_late_deadline_timer_does_not_add_the_abandon_grace() {
    use quorumlock_conformance::faults::NetMode;
    use quorumlock_core::{ErrorKind, LockClient};
    use std::time::Duration;
    use tokio::time::Instant;

    let t = FaultTarget::mem("mem://late-timer?ttl=10s");
    let holder = t.client("late").await;
    let held = holder.lock("x").unwrap().acquire().await.unwrap();
    let (backend, net) = t.faulty_backend("late").await;
    let waiter = LockClient::new(backend);
    // A session first, so that the timed acquire's time goes to waiting.
    quorumlock_conformance::support::open_session(&waiter).await;

    let timeout = Duration::from_millis(300);
    let start = Instant::now();
    // The link dies while the waiter waits (its entry is on the store), and
    // the only thread of the runtime is blocked across the deadline.
    let stall = tokio::spawn({
        let net = net.clone();
        async move {
            tokio::time::sleep_until(start + Duration::from_millis(200)).await;
            net.set_mode(NetMode::Blackhole);
            tokio::time::sleep_until(start + Duration::from_millis(280)).await;
            std::thread::sleep(Duration::from_millis(400));
            Instant::now()
        }
    });
    let got = waiter.lock("x").unwrap().acquire_timeout(timeout).await;
    let returned = Instant::now();
    let woke = stall.await.unwrap();
    assert_eq!(got.err().map(|e| e.kind()), Some(ErrorKind::Timeout));
    let after_wake = returned.saturating_duration_since(woke);
    assert!(
        after_wake < Duration::from_millis(60),
        "returned {after_wake:?} after the runtime woke, {:?} past a deadline it woke 400 ms late for",
        returned - (start + timeout)
    );
    net.set_mode(NetMode::Pass);
    held.release().await.unwrap();
}
