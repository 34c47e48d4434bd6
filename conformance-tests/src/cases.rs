//! The cases. Each takes a [`Harness`], uses a fresh namespace, asserts
//! something a broken backend would fail, and ends with the leak check.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::{self, StreamExt};
use lockcore::{ErrorKind, LockClient, LockGuard, LossReason};
use tokio::time::Instant;

use crate::{Flavor, Harness};

pub use crate::fenced::fenced_writes_refused_after_loss;
pub use crate::multi::{
    multi_lock_all_or_nothing, multi_lock_loss_of_one_is_loss_of_set,
    multi_lock_opposite_orders_never_deadlock, scoped_run_stops_work_on_loss,
};

/// Generous bound for anything that should happen "soon" on a real store.
const SOON: Duration = Duration::from_secs(30);

/// Polls `check` every 20 ms until it holds, panicking after `SOON`.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < SOON, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn waiters(c: &LockClient, name: &str) -> usize {
    c.inspect(name).await.expect("inspect").waiters.len()
}

/// The lock `name` on `c`, as the flavor under test.
#[derive(Debug)]
enum Handle {
    Mutex(lockcore::Lock),
    Semaphore(lockcore::Semaphore),
    Write(lockcore::RwLock),
}

fn handle(f: Flavor, c: &LockClient, name: &str) -> Handle {
    match f {
        Flavor::Mutex => Handle::Mutex(c.lock(name).unwrap()),
        Flavor::Semaphore1 => Handle::Semaphore(c.semaphore(name, 1).unwrap()),
        Flavor::RwWrite => Handle::Write(c.rwlock(name).unwrap()),
    }
}

impl Handle {
    async fn acquire(&self) -> lockcore::Result<LockGuard> {
        match self {
            Handle::Mutex(l) => l.acquire().await,
            Handle::Semaphore(s) => s.acquire().await,
            Handle::Write(rw) => rw.write().await,
        }
    }
    async fn try_acquire(&self) -> lockcore::Result<LockGuard> {
        match self {
            Handle::Mutex(l) => l.try_acquire().await,
            Handle::Semaphore(s) => s.try_acquire().await,
            Handle::Write(rw) => rw.try_write().await,
        }
    }
    async fn acquire_timeout(&self, d: Duration) -> lockcore::Result<LockGuard> {
        match self {
            Handle::Mutex(l) => l.acquire_timeout(d).await,
            Handle::Semaphore(s) => s.acquire_timeout(d).await,
            Handle::Write(rw) => rw.write_timeout(d).await,
        }
    }
}

async fn acquire(f: Flavor, c: &LockClient, name: &str) -> LockGuard {
    tokio::time::timeout(SOON, handle(f, c, name).acquire())
        .await
        .unwrap_or_else(|_| panic!("acquiring {name} took longer than {SOON:?}"))
        .unwrap_or_else(|e| panic!("acquiring {name}: {e}"))
}

async fn wait_lost(g: &LockGuard) -> LossReason {
    tokio::time::timeout(SOON, g.lost())
        .await
        .expect("the loss future did not fire")
}

fn assert_kind<T: std::fmt::Debug>(r: lockcore::Result<T>, kind: ErrorKind, what: &str) {
    match r {
        Err(e) => assert_eq!(e.kind(), kind, "{what}: {e}"),
        Ok(v) => panic!("{what}: expected {kind}, got Ok({v:?})"),
    }
}

/// Counts holders inside the critical section and records every token in
/// the order the holders got the lock.
#[derive(Default)]
struct CriticalSection {
    inside: AtomicUsize,
    overlaps: AtomicUsize,
    tokens: Mutex<Vec<u64>>,
}

impl CriticalSection {
    async fn run(&self, g: &LockGuard) {
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        assert!(
            g.is_held(),
            "guard says not held inside the critical section"
        );
        self.tokens.lock().unwrap().push(g.token());
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    fn check(&self, expected_rounds: usize) {
        assert_eq!(
            self.overlaps.load(Ordering::SeqCst),
            0,
            "two holders at once"
        );
        let tokens = self.tokens.lock().unwrap();
        assert_eq!(tokens.len(), expected_rounds);
        for w in tokens.windows(2) {
            assert!(
                w[0] < w[1],
                "fencing tokens not strictly increasing: {tokens:?}"
            );
        }
    }
}

async fn contend(f: Flavor, clients: &[LockClient], tasks_per_client: usize, rounds: usize) {
    let cs = Arc::new(CriticalSection::default());
    let mut tasks = Vec::new();
    for (ci, c) in clients.iter().enumerate() {
        for t in 0..tasks_per_client {
            let (c, cs) = (c.clone(), cs.clone());
            tasks.push(tokio::spawn(async move {
                for r in 0..rounds {
                    let g = acquire(f, &c, "contended").await;
                    cs.run(&g).await;
                    // Half the releases confirm, half go through Drop.
                    if (ci + t + r) % 2 == 0 {
                        g.release().await.expect("release");
                    } else {
                        drop(g);
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("contender task panicked");
    }
    cs.check(clients.len() * tasks_per_client * rounds);
}

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

/// The store ends the holder's session: its loss future fires, and a
/// waiter gets the lock with a larger token.
pub async fn session_expiry_fires_loss_and_waiter_gets_larger_token(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let (a, b) = (case.client().await, case.client().await);
    if !a.backend().capabilities().kill_session {
        assert!(
            !crate::harness::require(),
            "{} cannot kill a session: this case cannot run",
            h.store()
        );
        eprintln!("SKIPPED (capability): {} cannot kill a session", h.store());
        return case.finish().await;
    }
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
    if !a.backend().capabilities().kill_session {
        assert!(
            !crate::harness::require(),
            "{} cannot kill a session: this case cannot run",
            h.store()
        );
        eprintln!("SKIPPED (capability): {} cannot kill a session", h.store());
        return case.finish().await;
    }
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
pub async fn forced_break_reports_loss(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let (a, b) = (case.client().await, case.client().await);
    assert!(!b.break_lock("brk").await.unwrap(), "broke a free lock");
    let g = acquire(f, &a, "brk").await;
    assert!(b.break_lock("brk").await.unwrap(), "break found no holder");
    assert_eq!(wait_lost(&g).await, LossReason::EntryDeleted);
    assert!(!g.is_held());
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

/// Polls `fut` `polls` times, letting I/O progress between polls.
async fn poll_n<F: Future>(fut: std::pin::Pin<&mut F>, polls: usize) -> Option<F::Output> {
    let mut fut = fut;
    for _ in 0..polls {
        if let std::task::Poll::Ready(v) = futures::poll!(fut.as_mut()) {
            return Some(v);
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    None
}

/// Dropping a waiting acquire at any await point leaves no waiter.
pub async fn cancelled_acquire_at_each_await_point_leaves_nothing(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let (a, b) = (case.client().await, case.client().await);
    let g = acquire(f, &a, "cancel").await;
    let lock = handle(f, &b, "cancel");
    for polls in 0..10 {
        let mut fut = Box::pin(lock.acquire());
        assert!(
            poll_n(fut.as_mut(), polls).await.is_none(),
            "acquired a held lock"
        );
        drop(fut);
    }
    for i in 0..6u64 {
        let _ = tokio::time::timeout(Duration::from_millis(i * 7), lock.acquire()).await;
    }
    tokio::time::timeout(SOON, b.wait_idle())
        .await
        .expect("cleanup stuck");
    let state = a.inspect("cancel").await.unwrap();
    assert!(
        state.waiters.is_empty(),
        "cancelled acquires left waiters: {state:?}"
    );
    assert_eq!(state.holders.len(), 1);
    g.release().await.unwrap();
    // The local queue is not stuck either.
    let g = lock
        .try_acquire()
        .await
        .expect("lock free after cancellations");
    g.release().await.unwrap();
    case.finish().await;
}

/// Dropping an acquire of a free lock midway never leaves a phantom holder.
pub async fn cancelled_acquire_of_free_lock_leaves_no_holder(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let (a, b) = (case.client().await, case.client().await);
    let lock = handle(f, &b, "phantom");
    for polls in 0..10 {
        let mut fut = Box::pin(lock.acquire());
        if let Some(r) = poll_n(fut.as_mut(), polls).await {
            drop(r.expect("acquire of a free lock"));
        }
        drop(fut);
        tokio::time::timeout(SOON, b.wait_idle())
            .await
            .expect("cleanup stuck");
        let state = a.inspect("phantom").await.unwrap();
        assert!(state.is_free(), "after {polls} polls: {state:?}");
    }
    let g = handle(f, &a, "phantom").try_acquire().await.expect("free");
    g.release().await.unwrap();
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

/// Bad names get `InvalidName` and nothing reaches the store.
pub async fn invalid_names_rejected_and_nothing_written(h: &Harness) {
    let case = h.case();
    let a = case.client().await;
    let before = a.backend().requests_sent();
    for bad in [
        "",
        "/x",
        "x/",
        "a//b",
        "a/../b",
        "sp ace",
        "ctl\u{7}",
        ".lock",
        "x/0lock-1",
        "x/leases",
        &"n".repeat(300),
    ] {
        assert_kind(a.lock(bad).map(|_| ()), ErrorKind::InvalidName, bad);
        assert_kind(
            a.inspect(bad).await.map(|_| ()),
            ErrorKind::InvalidName,
            bad,
        );
        assert_kind(a.break_lock(bad).await, ErrorKind::InvalidName, bad);
        assert_kind(a.request_revoke(bad).await, ErrorKind::InvalidName, bad);
    }
    assert_eq!(
        a.backend().requests_sent(),
        before,
        "invalid input reached the store"
    );
    assert_eq!(a.session_id().await, None, "invalid input opened a session");
    case.finish().await;
}

/// Segments that a store layout uses for the children of a lock's own node
/// or key prefix (ZooKeeper's semaphore `leases` and `locks`, Consul's
/// `.lock`, `.queue`, `.rw`, `.revoke`), and a few look-alikes. As the last
/// segment of a nested name they are either refused (`InvalidName`) or
/// name a lock of its own.
const LAYOUT_SEGMENTS: [&str; 9] = [
    "leases", "locks", "lock", "lease", "queue", "rw", "revoke", "sem", "leases2",
];

/// Try-acquires `name` as a mutex, a semaphore of 2 and a writer (as the
/// backend supports them) on `c`, each released at once: none may find
/// it taken, since `held` (another name) is what is held.
async fn free_in_every_kind(c: &LockClient, name: &str, held: &str) {
    let caps = c.backend().capabilities();
    let what = |kind: &str| format!("{kind} {name} while only {held} is held");
    let g = c.lock(name).unwrap().try_acquire().await;
    g.unwrap_or_else(|e| panic!("{}: {e}", what("mutex")))
        .release()
        .await
        .unwrap();
    if caps.semaphore {
        let g = c.semaphore(name, 2).unwrap().try_acquire().await;
        g.unwrap_or_else(|e| panic!("{}: {e}", what("semaphore of 2")))
            .release()
            .await
            .unwrap();
    }
    if caps.rwlock {
        let g = c.rwlock(name).unwrap().try_write().await;
        g.unwrap_or_else(|e| panic!("{}: {e}", what("writer")))
            .release()
            .await
            .unwrap();
    }
    let st = c.inspect(name).await.unwrap();
    assert!(
        st.holders.is_empty() && st.waiters.is_empty(),
        "{}: inspect shows {st:?}",
        what("inspect of")
    );
}

/// A nested name whose last segment is one the store layout uses for a
/// lock's own children (`p/leases`, `p/locks`, ...) is either refused
/// with `InvalidName` or a lock of its own: holding it (as a mutex or a
/// semaphore) never makes `p` taken in any kind, and holding `p` never
/// makes it taken.
pub async fn nested_layout_segment_names_are_independent(h: &Harness) {
    let case = h.case();
    let a = case.client().await;
    let b = case.client().await;
    let caps = a.backend().capabilities();
    for (i, seg) in LAYOUT_SEGMENTS.iter().enumerate() {
        let parent = format!("p{i}");
        let nested = format!("{parent}/{seg}");
        let lock = match a.lock(&nested) {
            Ok(l) => l,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::InvalidName, "{nested}: {e}");
                // The parent name itself stays usable.
                free_in_every_kind(&b, &parent, "nothing").await;
                continue;
            }
        };
        // The nested lock held: the parent is free in every kind.
        let g = lock.acquire().await.unwrap();
        free_in_every_kind(&b, &parent, &nested).await;
        assert!(
            !b.break_lock(&parent).await.unwrap(),
            "breaking {parent} found a holder while only {nested} is held"
        );
        assert!(g.is_held(), "{nested} lost by operations on {parent}");
        g.release().await.unwrap();
        if caps.semaphore {
            let g = a.semaphore(&nested, 2).unwrap().acquire().await.unwrap();
            free_in_every_kind(&b, &parent, &nested).await;
            assert!(g.is_held(), "{nested} lost by operations on {parent}");
            g.release().await.unwrap();
        }
        // The parent held (as a mutex, then as a semaphore): the nested
        // name is free in every kind.
        let g = a.lock(&parent).unwrap().acquire().await.unwrap();
        free_in_every_kind(&b, &nested, &parent).await;
        assert!(g.is_held(), "{parent} lost by operations on {nested}");
        g.release().await.unwrap();
        if caps.semaphore {
            let g = a.semaphore(&parent, 2).unwrap().acquire().await.unwrap();
            free_in_every_kind(&b, &nested, &parent).await;
            assert!(g.is_held(), "{parent} lost by operations on {nested}");
            g.release().await.unwrap();
        }
    }
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

// ---- read-write locks -------------------------------------------------

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
        .all(|h| h.kind == lockcore::LockKind::Read));
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

// ---- semaphores -------------------------------------------------------

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

/// One client holds at most one permit of a semaphore at a time; its other
/// owners queue locally (as `consul lock -n` counts one holder per session).
pub async fn semaphore_one_permit_per_client(h: &Harness) {
    let case = h.case();
    let a = case.client().await;
    let sem = a.semaphore("per-client", 3).unwrap();
    let g = sem.acquire().await.unwrap();
    assert_kind(
        sem.try_acquire().await,
        ErrorKind::WouldBlock,
        "second permit on one client",
    );
    g.release().await.unwrap();
    sem.try_acquire()
        .await
        .expect("free again")
        .release()
        .await
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

// ---- every kind on one name ---------------------------------------------

/// A kind of holder on one name, for [`tokens_increase_across_kinds`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mutex,
    Read,
    Write,
    /// A permit of a semaphore of 2.
    Permit,
}

/// One hold of [`tokens_increase_across_kinds`]: when its acquire
/// started and returned, when its release returned, and its token.
#[derive(Debug, Clone, Copy)]
struct Hold {
    kind: Kind,
    token: u64,
    started: Instant,
    acquired: Instant,
    released: Instant,
}

async fn hold_as(kind: Kind, c: LockClient, name: &'static str, keep: Duration) -> Hold {
    let started = Instant::now();
    let g = tokio::time::timeout(SOON, async {
        match kind {
            Kind::Mutex => c.lock(name).unwrap().acquire().await,
            Kind::Read => c.rwlock(name).unwrap().read().await,
            Kind::Write => c.rwlock(name).unwrap().write().await,
            Kind::Permit => c.semaphore(name, 2).unwrap().acquire().await,
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{kind:?} on {name} not granted within {SOON:?}"))
    .unwrap_or_else(|e| panic!("{kind:?} on {name}: {e}"));
    let acquired = Instant::now();
    tokio::time::sleep(keep).await;
    let token = g.token();
    g.release().await.unwrap();
    Hold {
        kind,
        token,
        started,
        acquired,
        released: Instant::now(),
    }
}

/// Holds `first` on client 0, queues `then` (one client each, in order,
/// each seen waiting before the next comes), lets `first` go; returns
/// every hold.
async fn line_up(
    clients: &[LockClient],
    name: &'static str,
    first: Kind,
    then: &[Kind],
) -> Vec<Hold> {
    let keep = Duration::from_millis(40);
    let head = {
        let c = clients[0].clone();
        tokio::spawn(hold_as(first, c, name, Duration::from_millis(300)))
    };
    eventually("the first holder", || async {
        !clients[0].inspect(name).await.unwrap().holders.is_empty()
    })
    .await;
    let mut tasks = vec![head];
    let entries = |st: lockcore::LockState| st.holders.len() + st.waiters.len();
    for (i, kind) in then.iter().enumerate() {
        let before = entries(clients[0].inspect(name).await.unwrap());
        let t = tokio::spawn(hold_as(*kind, clients[i + 1].clone(), name, keep));
        eventually("the next one to queue (or be granted)", || async {
            t.is_finished() || entries(clients[0].inspect(name).await.unwrap()) > before
        })
        .await;
        tasks.push(t);
    }
    let mut holds = Vec::new();
    for t in tasks {
        holds.push(t.await.expect("a holder panicked"));
    }
    holds
}

/// Tokens on one name increase in grant order across every kind of holder
/// (mutex, reader, writer, semaphore permit): a resource fenced by the
/// name's tokens must refuse every earlier holder, whatever its kind. A
/// mutex that gets the lock between a writer's arrival and its grant must
/// not leave the writer a smaller token. Checked on every pair of holds:
/// one that was granted before the other started, or that let go before
/// the other was granted when both cannot hold together, has the smaller
/// token.
pub async fn tokens_increase_across_kinds(h: &Harness) {
    use Kind::*;
    let case = h.case();
    let clients = case.clients(6).await;
    let name = "kinds";
    let mut holds = Vec::new();
    // Mutex first, then waiters of every lock kind in line behind it.
    holds.extend(line_up(&clients, name, Mutex, &[Mutex, Write, Read, Read, Mutex]).await);
    // Semaphore permits on the same name, once it is free (run from
    // `rwlock_suite!`: only where the backend has semaphores too).
    if clients[0].backend().capabilities().semaphore {
        holds.extend(line_up(&clients, name, Permit, &[Permit, Permit]).await);
    }
    // A reader first, then a mutex, a writer and readers behind it.
    holds.extend(line_up(&clients, name, Read, &[Mutex, Write, Read, Mutex]).await);
    holds.extend(line_up(&clients, name, Write, &[Read, Mutex]).await);
    for a in &holds {
        for b in &holds {
            let shared = a.kind == b.kind && matches!(a.kind, Read | Permit);
            let before = a.acquired < b.started || (!shared && a.released < b.acquired);
            assert!(
                !before || a.token < b.token,
                "{:?} with token {} came before {:?} with token {}: tokens not in grant order\n{holds:#?}",
                a.kind,
                a.token,
                b.kind,
                b.token
            );
        }
    }
    case.finish().await;
}

/// `list` reports every held or awaited lock under a prefix (whole
/// segments: `jobs` covers `jobs/a/nested`, not `jobsx`), in name order,
/// with the holders and waiters `inspect` shows; free locks are left out
/// and a bad prefix is refused.
pub async fn list_reports_locks_under_a_prefix(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let caps = a.backend().capabilities();
    let held = a.lock("jobs/a").unwrap().acquire().await.unwrap();
    let nested = if caps.rwlock {
        a.rwlock("jobs/a/nested").unwrap().read().await.unwrap()
    } else {
        a.lock("jobs/a/nested").unwrap().acquire().await.unwrap()
    };
    let other = a.lock("jobsx").unwrap().acquire().await.unwrap();
    let freed = a.lock("jobs/freed").unwrap().acquire().await.unwrap();
    freed.release().await.unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("jobs/a").unwrap().acquire().await?.release().await })
    };
    eventually("the waiter to queue", || async {
        waiters(&a, "jobs/a").await == 1
    })
    .await;

    let names = |v: &[lockcore::LockState]| -> Vec<String> {
        v.iter().map(|s| s.name.as_str().to_string()).collect()
    };
    let under = a.list("jobs").await.unwrap();
    assert_eq!(names(&under), ["jobs/a", "jobs/a/nested"], "{under:#?}");
    assert_eq!(under[0].holders.len(), 1);
    assert_eq!(under[0].holders[0].token, held.token());
    assert_eq!(under[0].holders[0].session, held.session_id());
    assert_eq!(under[0].holders[0].kind, lockcore::LockKind::Exclusive);
    assert_eq!(under[0].waiters.len(), 1, "{under:#?}");
    assert_eq!(under[0].waiters[0].session, b.session_id().await.unwrap());
    assert_eq!(under[1].holders[0].token, nested.token());
    if caps.rwlock {
        assert_eq!(under[1].holders[0].kind, lockcore::LockKind::Read);
    }
    assert_eq!(
        under,
        a.list("jobs/").await.unwrap(),
        "a trailing / is ignored"
    );
    assert_eq!(
        names(&a.list("jobs/a").await.unwrap()),
        ["jobs/a", "jobs/a/nested"]
    );
    assert_eq!(
        names(&a.list("").await.unwrap()),
        ["jobs/a", "jobs/a/nested", "jobsx"]
    );
    assert!(a.list("nothing/here").await.unwrap().is_empty());
    assert_kind(a.list("bad name").await, ErrorKind::InvalidName, "list");

    held.release().await.unwrap();
    waiter.await.unwrap().unwrap();
    nested.release().await.unwrap();
    other.release().await.unwrap();
    assert!(
        a.list("").await.unwrap().is_empty(),
        "released locks are still listed"
    );
    case.finish().await;
}
