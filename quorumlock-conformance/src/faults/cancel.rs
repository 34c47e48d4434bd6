//! Cancellation at every await: each lock operation is polled exactly `k`
//! times over a slow link, for k = 1, 2, 3 ..., then dropped, until `k`
//! is past the number of awaits the operation has (it completes within
//! `k` polls). Each poll after the first happens when the operation woke
//! up, so every `k` lands in a different await: the session open, the
//! store request, the wait in the queue, and the cleanup after a timeout
//! or an error. After each drop the client's background cleanup must
//! finish, nothing of the dropped operation may stay on the store, and
//! the lock must still be takeable.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use quorumlock_core::{ErrorKind, LockClient, LockGuard, Result};
use tokio::sync::Notify;

use super::{FaultTarget, NetMode, Row};

/// Added to every request and every answer of the client under test.
const DELAY: Duration = Duration::from_millis(15);
/// The timeout of the timed operations: a few round trips.
const TIMEOUT: Duration = Duration::from_millis(120);
/// How long a poll waits for the operation to wake it before polling
/// again anyway (a waiting acquire of a held lock never wakes).
const IDLE: Duration = Duration::from_millis(250);
/// The most polls of an operation that never completes.
const MAX_POLLS: usize = 12;
/// Background cleanup and the lock's handover must finish within this.
pub(super) const SETTLE: Duration = Duration::from_secs(20);

/// The operations under test. `Held*` ones wait for a lock the admin
/// client holds; the others work on a free lock.
#[derive(Debug, Clone, Copy)]
enum Op {
    HeldAcquire,
    HeldAcquireTimeout,
    HeldTryAcquire,
    HeldReadTimeout,
    HeldWriteTimeout,
    HeldPermitTimeout,
    FreeAcquire,
    Release,
}

const OPS: [Op; 8] = [
    Op::HeldAcquire,
    Op::HeldAcquireTimeout,
    Op::HeldTryAcquire,
    Op::HeldReadTimeout,
    Op::HeldWriteTimeout,
    Op::HeldPermitTimeout,
    Op::FreeAcquire,
    Op::Release,
];

struct NotifyWaker(Notify);

impl Wake for NotifyWaker {
    fn wake(self: Arc<Self>) {
        self.0.notify_one();
    }
}

/// Polls `fut` at most `k` times, each poll after the first once the
/// future has woken its waker (or [`IDLE`] passed); its output if it
/// completed.
pub(crate) async fn poll_times<F: Future + ?Sized>(
    mut fut: Pin<&mut F>,
    k: usize,
) -> Option<F::Output> {
    let wake = Arc::new(NotifyWaker(Notify::new()));
    let waker = Waker::from(wake.clone());
    for i in 0..k {
        if i > 0 {
            let _ = tokio::time::timeout(IDLE, wake.0.notified()).await;
        }
        if let Poll::Ready(v) = fut.as_mut().poll(&mut Context::from_waker(&waker)) {
            return Some(v);
        }
    }
    None
}

/// What the admin client holds while an operation waits.
async fn hold_for(op: Op, admin: &LockClient, name: &str) -> Option<LockGuard> {
    let g = match op {
        Op::HeldAcquire | Op::HeldAcquireTimeout | Op::HeldTryAcquire => {
            admin.lock(name).unwrap().acquire().await
        }
        // A reader waits for a writer, a writer for a reader.
        Op::HeldReadTimeout => admin.rwlock(name).unwrap().write().await,
        Op::HeldWriteTimeout => admin.rwlock(name).unwrap().read().await,
        Op::HeldPermitTimeout => admin.semaphore(name, 1).unwrap().acquire().await,
        Op::FreeAcquire | Op::Release => return None,
    };
    Some(g.unwrap_or_else(|e| panic!("{op:?}: the admin's hold: {e}")))
}

/// Takes and gives back what `op` works on, from `client`, within
/// [`SETTLE`]: proof that nothing of ours blocks it.
async fn takeable(op: Op, client: &LockClient, name: &str) -> Result<()> {
    let g = match op {
        Op::HeldReadTimeout | Op::HeldWriteTimeout => {
            client.rwlock(name)?.write_timeout(SETTLE).await?
        }
        Op::HeldPermitTimeout => client.semaphore(name, 1)?.acquire_timeout(SETTLE).await?,
        _ => client.lock(name)?.acquire_timeout(SETTLE).await?,
    };
    g.release().await
}

/// Runs `op` on `client`, one future to poll.
fn operation<'a>(
    op: Op,
    client: &'a LockClient,
    name: &'a str,
    held: Option<LockGuard>,
) -> Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>> {
    Box::pin(async move {
        let g = match op {
            Op::HeldAcquire | Op::FreeAcquire => client.lock(name)?.acquire().await?,
            Op::HeldAcquireTimeout => client.lock(name)?.acquire_timeout(TIMEOUT).await?,
            Op::HeldTryAcquire => client.lock(name)?.try_acquire().await?,
            Op::HeldReadTimeout => client.rwlock(name)?.read_timeout(TIMEOUT).await?,
            Op::HeldWriteTimeout => client.rwlock(name)?.write_timeout(TIMEOUT).await?,
            Op::HeldPermitTimeout => client.semaphore(name, 1)?.acquire_timeout(TIMEOUT).await?,
            Op::Release => {
                return held.expect("a guard to release").release().await;
            }
        };
        drop(g);
        Ok(())
    })
}

/// Every operation cancelled at every await; see the module docs.
pub async fn cancel_at_every_poll(t: &FaultTarget) -> Row {
    let ns = format!("qlc-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut row = Row::new(t.name(), "cancel_at_every_poll");
    let admin = t.client(&ns).await;
    let third = t.client(&ns).await;
    let (backend, net) = t.faulty_backend(&ns).await;
    let slow = LockClient::new(backend);
    net.set_mode(NetMode::Delay(DELAY));
    for (i, op) in OPS.into_iter().enumerate() {
        let name = format!("cancel{i}");
        let mut k = 1;
        loop {
            let admin_hold = hold_for(op, &admin, &name).await;
            let ours = match op {
                Op::Release => Some(
                    slow.lock(&name)
                        .unwrap()
                        .acquire_timeout(SETTLE)
                        .await
                        .unwrap_or_else(|e| panic!("{op:?}: a free lock: {e}")),
                ),
                _ => None,
            };
            let mut fut = operation(op, &slow, &name, ours);
            let out = poll_times(fut.as_mut(), k).await;
            drop(fut);
            row.cycles += 1;
            if out.is_none() {
                row.faults += 1;
            }
            if let Some(Err(e)) = &out {
                let expected = matches!(e.kind(), ErrorKind::Timeout | ErrorKind::WouldBlock);
                assert!(expected, "{op:?} after {k} polls: {e}");
            }
            tokio::time::timeout(SETTLE, slow.wait_idle())
                .await
                .unwrap_or_else(|_| panic!("{op:?} dropped after {k} polls: cleanup stuck"));
            // Whatever the admin holds is the only entry; nothing of the
            // dropped operation is left, holding or waiting.
            let state = admin.inspect(&name).await.expect("inspect");
            let expected_holders = usize::from(admin_hold.is_some());
            assert!(
                state.waiters.is_empty() && state.holders.len() == expected_holders,
                "{op:?} dropped after {k} polls left entries on {}: {state:?}",
                t.name()
            );
            if let Some(g) = admin_hold {
                g.release().await.expect("admin release");
            }
            // And the lock is takeable: by a third client, then by the
            // slow client itself (its local queue is not stuck).
            takeable(op, &third, &name)
                .await
                .unwrap_or_else(|e| panic!("{op:?} dropped after {k} polls: third client: {e}"));
            takeable(op, &slow, &name)
                .await
                .unwrap_or_else(|e| panic!("{op:?} dropped after {k} polls: same client: {e}"));
            if out.is_some() || k >= MAX_POLLS {
                break;
            }
            k += 1;
        }
    }
    net.set_mode(NetMode::Pass);
    finish(t, &ns, &[&slow, &third, &admin], row).await
}

/// Ends a test of this file: waits for every client's cleanup, closes
/// them, and records the row after asserting that nothing is left.
pub(super) async fn finish(
    t: &FaultTarget,
    ns: &str,
    clients: &[&LockClient],
    mut row: Row,
) -> Row {
    for c in clients {
        tokio::time::timeout(SETTLE, c.wait_idle())
            .await
            .expect("cleanup stuck at the end");
        c.close().await;
    }
    let probe = t.backend(ns).await;
    let left = probe.leftovers().await.expect("listing leftovers");
    row.leaked = left.len();
    assert!(left.is_empty(), "left on the store: {left:?}");
    row.record();
    row
}

/// How far past its timeout a timed acquire may return on a dead link.
const TIMEOUT_SLACK: Duration = Duration::from_millis(250);

/// On a blackholed link, every call returns within its bound: a timed
/// acquire (waiting for a held lock, or for a free one) within its
/// timeout + 250 ms, a release within the session TTL; what is
/// left to do goes to the background, and after the link heals nothing of
/// ours is left on the store.
pub async fn calls_return_within_bounds_on_a_dead_link(t: &FaultTarget) -> Row {
    let ns = format!("qlb-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut row = Row::new(t.name(), "calls_return_within_bounds_on_a_dead_link");
    let admin = t.client(&ns).await;
    let ttl = admin.backend().capabilities().session_ttl;
    let (backend, net) = t.faulty_backend(&ns).await;
    let cut_off = LockClient::new(backend);
    let timeout = Duration::from_millis(1500);

    let held = admin.lock("held").unwrap().acquire().await.expect("admin");
    // The cut-off client holds one lock and has its session open.
    let ours = cut_off
        .lock("ours")
        .unwrap()
        .acquire_timeout(SETTLE)
        .await
        .expect("a free lock");
    // A multi-lock that took its first name and waits for the second
    // when the link dies: its timeout bounds it too, the give-back of
    // the name it took included.
    let blocker = admin.lock("m/b").unwrap().acquire().await.expect("admin");
    let set = cut_off.multi_lock(["m/a", "m/b"]).unwrap();
    let start = tokio::time::Instant::now();
    let multi = tokio::spawn(async move {
        let r = set.acquire_timeout(timeout).await.map(drop);
        (r, start.elapsed())
    });
    let probe = admin.clone();
    tokio::time::timeout(SETTLE, async move {
        loop {
            let a = probe.inspect("m/a").await.expect("inspect");
            let b = probe.inspect("m/b").await.expect("inspect");
            if a.holders.len() == 1 && b.waiters.len() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the multi-lock did not take m/a and queue for m/b");
    net.set_mode(NetMode::Blackhole);
    row.faults += 1;
    let (r, took) = multi.await.expect("multi-lock task");
    assert!(
        r.is_err(),
        "multi-lock granted over a dead link on {}",
        t.name()
    );
    assert!(
        took <= timeout + TIMEOUT_SLACK,
        "multi_lock.acquire_timeout({timeout:?}) returned after {took:?} on {}: {:?}",
        t.name(),
        r.err()
    );
    row.cycles += 1;

    for name in ["held", "free"] {
        let start = tokio::time::Instant::now();
        let r = cut_off.lock(name).unwrap().acquire_timeout(timeout).await;
        let took = start.elapsed();
        assert!(
            r.is_err(),
            "{name}: granted over a dead link on {}",
            t.name()
        );
        assert!(
            took <= timeout + TIMEOUT_SLACK,
            "{name}: acquire_timeout({timeout:?}) returned after {took:?} on {}: {:?}",
            t.name(),
            r.err()
        );
        row.cycles += 1;
    }
    let start = tokio::time::Instant::now();
    let _ = ours.release().await;
    let took = start.elapsed();
    assert!(
        took <= ttl,
        "release took {took:?} on a dead link, past the TTL {ttl:?}, on {}",
        t.name()
    );

    net.set_mode(NetMode::Pass);
    held.release().await.expect("admin release");
    blocker.release().await.expect("admin release");
    tokio::time::timeout(SETTLE + ttl * 2, cut_off.wait_idle())
        .await
        .expect("cleanup stuck after the link healed");
    // The store frees what the lost session held; then all is takeable.
    for name in ["held", "free", "ours", "m/a", "m/b"] {
        let g = admin
            .lock(name)
            .unwrap()
            .acquire_timeout(SETTLE + ttl * 2)
            .await
            .unwrap_or_else(|e| panic!("{name} after the heal on {}: {e}", t.name()));
        g.release().await.unwrap();
    }
    finish(t, &ns, &[&cut_off, &admin], row).await
}
