//! Cases for several locks at once ([`quorumlock_core::MultiLock`]) and for the
//! scoped form ([`quorumlock_core::Lock::run`]).

use std::sync::atomic::AtomicBool;

use super::*;

/// Holders of one name at a time, counted by every task of a case.
#[derive(Default)]
struct Occupancy(AtomicUsize);

impl Occupancy {
    fn enter(&self, what: &str) {
        let before = self.0.fetch_add(1, Ordering::SeqCst);
        assert_eq!(before, 0, "two holders of {what} at once");
    }
    fn leave(&self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Two clients take the same two names in opposite orders, many times:
/// the set is taken in one canonical order, so neither waits for the other
/// in a cycle (a deadlock would end in the timeout), and neither name ever
/// has two holders.
pub async fn multi_lock_opposite_orders_never_deadlock(h: &Harness) {
    let case = h.case();
    let clients = case.clients(2).await;
    let occupancy = Arc::new([Occupancy::default(), Occupancy::default()]);
    let rounds = 15;
    let mut tasks = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let names = if i == 0 {
            ["ab/a", "ab/b"]
        } else {
            ["ab/b", "ab/a"]
        };
        let set = c.multi_lock(names).unwrap();
        let occupancy = occupancy.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..rounds {
                let g = set
                    .acquire_timeout(SOON)
                    .await
                    .unwrap_or_else(|e| panic!("client {i} round {round}: {e}"));
                occupancy[0].enter("ab/a");
                occupancy[1].enter("ab/b");
                assert_eq!(g.tokens().count(), 2);
                tokio::time::sleep(Duration::from_millis(5)).await;
                occupancy[0].leave();
                occupancy[1].leave();
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let a = &clients[0];
    for name in ["ab/a", "ab/b"] {
        assert!(a.inspect(name).await.unwrap().is_free(), "{name} left held");
    }
    case.finish().await;
}

/// The set is all or nothing: one held name makes a try fail and a timed
/// acquire time out, and the names taken on the way are given back.
pub async fn multi_lock_all_or_nothing(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    assert_eq!(
        a.multi_lock(Vec::<String>::new()).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        a.multi_lock(["fine", ""]).unwrap_err().kind(),
        ErrorKind::InvalidName
    );
    let blocker = b.lock("aon/z").unwrap().acquire().await.unwrap();
    let set = a.multi_lock(["aon/z", "aon/a", "aon/a"]).unwrap();
    assert_eq!(
        set.names().map(|n| n.as_str()).collect::<Vec<_>>(),
        ["aon/a", "aon/z"],
        "not canonical order without duplicates"
    );
    assert_eq!(
        set.try_acquire().await.unwrap_err().kind(),
        ErrorKind::WouldBlock
    );
    assert!(
        a.inspect("aon/a").await.unwrap().is_free(),
        "kept a after a failed try"
    );
    let started = Instant::now();
    assert_eq!(
        set.acquire_timeout(Duration::from_millis(400))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::Timeout
    );
    assert!(started.elapsed() < SOON);
    a.wait_idle().await;
    assert!(
        a.inspect("aon/a").await.unwrap().is_free(),
        "kept a after a timeout"
    );
    blocker.release().await.unwrap();
    let g = set.acquire_timeout(SOON).await.unwrap();
    assert!(g.is_held());
    assert!(g.token("aon/a").is_some() && g.token("aon/z").is_some());
    assert_eq!(g.token("other"), None);
    g.release().await.unwrap();
    case.finish().await;
}

/// Loss of one lock of a held set is loss of the set; releasing it gives
/// back the others and reports the loss.
pub async fn multi_lock_loss_of_one_is_loss_of_set(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let g = a
        .multi_lock(["ml/p", "ml/q"])
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let lost = g.lost();
    assert!(b.break_lock("ml/q").await.unwrap(), "break found no holder");
    let reason = tokio::time::timeout(SOON, lost)
        .await
        .expect("set not reported lost");
    assert_eq!(reason, LossReason::EntryDeleted);
    assert!(!g.is_held());
    assert_eq!(g.loss(), Some(LossReason::EntryDeleted));
    assert_eq!(g.release().await.unwrap_err().kind(), ErrorKind::LockLost);
    let p = b.lock("ml/p").unwrap().try_acquire().await;
    assert!(p.is_ok(), "the rest of a lost set stayed held: {p:?}");
    p.unwrap().release().await.unwrap();
    case.finish().await;
}

/// The scoped form runs the work under the lock and releases; when the
/// lock is lost, the work is dropped at once and the result is
/// `LockLost`.
pub async fn scoped_run_stops_work_on_loss(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let lock = a.lock("scoped").unwrap();
    let token = lock.run(async |g| g.token()).await.unwrap();
    assert!(token > 0);
    assert!(
        a.inspect("scoped").await.unwrap().is_free(),
        "run did not release"
    );

    let started = Arc::new(tokio::sync::Notify::new());
    let dropped = Arc::new(AtomicBool::new(false));
    let run = {
        let (started, dropped) = (started.clone(), dropped.clone());
        tokio::spawn(async move {
            lock.run(async move |_g| {
                let _sentinel = DropFlag(dropped);
                started.notify_one();
                std::future::pending::<()>().await
            })
            .await
        })
    };
    tokio::time::timeout(SOON, started.notified())
        .await
        .expect("work never started");
    assert!(b.break_lock("scoped").await.unwrap());
    let out = tokio::time::timeout(SOON, run)
        .await
        .expect("work not stopped after the loss")
        .unwrap();
    assert_eq!(out.unwrap_err().kind(), ErrorKind::LockLost);
    assert!(
        dropped.load(Ordering::SeqCst),
        "the work's future was not dropped"
    );
    let g = b.lock("scoped").unwrap().try_acquire().await.unwrap();
    g.release().await.unwrap();
    case.finish().await;
}

struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A set of mixed kinds: a bad set is refused before anything is written;
/// readers and permits of two sets share while a writer's set waits (and
/// gives back what it took on the way); three clients taking a mutex, a
/// write side and a permit in different orders never deadlock and never
/// overlap on a name.
pub async fn multi_lock_of_kinds_shares_excludes_and_never_deadlocks(h: &Harness) {
    use quorumlock_core::LockKind::{Exclusive, Read, Semaphore, Write};
    let case = h.case();
    let clients = case.clients(3).await;
    let (a, b, c) = (&clients[0], &clients[1], &clients[2]);
    for bad in [
        vec![("mk/x", Read), ("mk/x", Write)],
        vec![("mk/e", quorumlock_core::LockKind::Election)],
        vec![("mk/s", Semaphore { permits: 0 })],
    ] {
        let e = a.multi_lock_of(bad.clone()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad:?}: {e}");
    }
    let set = a
        .multi_lock_of([("mk/r", Read), ("mk/m", Exclusive), ("mk/r", Read)])
        .unwrap();
    assert_eq!(
        set.members()
            .map(|(n, k)| (n.as_str(), k))
            .collect::<Vec<_>>(),
        [("mk/m", Exclusive), ("mk/r", Read)],
        "not canonical order without duplicates"
    );

    // Readers and permits share across sets.
    let ga = set.acquire_timeout(SOON).await.unwrap();
    let gb = b
        .multi_lock_of([
            ("mk/r", Read),
            ("mk/n", Exclusive),
            ("mk/p", Semaphore { permits: 2 }),
        ])
        .unwrap()
        .try_acquire()
        .await
        .expect("a second reader's set while the first holds");
    let gp = a
        .multi_lock_of([("mk/p", Semaphore { permits: 2 })])
        .unwrap()
        .try_acquire()
        .await
        .expect("the second permit");
    // A writer's set waits, and gives back the names it took on the way.
    let writer = c
        .multi_lock_of([("mk/a-free", Exclusive), ("mk/r", Write)])
        .unwrap();
    assert_eq!(
        writer.try_acquire().await.unwrap_err().kind(),
        ErrorKind::WouldBlock
    );
    let third = c
        .multi_lock_of([("mk/p", Semaphore { permits: 2 })])
        .unwrap()
        .try_acquire()
        .await;
    assert_eq!(
        third.unwrap_err().kind(),
        ErrorKind::WouldBlock,
        "a third permit of two"
    );
    c.wait_idle().await;
    assert!(
        c.inspect("mk/a-free").await.unwrap().is_free(),
        "kept a name of a set that could not be held"
    );
    let waiting = tokio::spawn({
        let writer = writer.clone();
        async move { writer.acquire_timeout(SOON).await }
    });
    eventually("the writer to queue", || async {
        waiters(a, "mk/r").await == 1
    })
    .await;
    assert!(!waiting.is_finished(), "a writer's set beside readers");
    ga.release().await.unwrap();
    gb.release().await.unwrap();
    gp.release().await.unwrap();
    let gw = waiting
        .await
        .unwrap()
        .expect("the writer's set once readers left");
    assert!(gw.token("mk/r").is_some() && gw.token("mk/a-free").is_some());
    gw.release().await.unwrap();

    // Opposite orders, three kinds: no deadlock (it would end in the
    // timeout), one holder per name.
    let occupancy = Arc::new([
        Occupancy::default(),
        Occupancy::default(),
        Occupancy::default(),
    ]);
    let orders = [
        vec![
            ("mx/a", Exclusive),
            ("mx/b", Write),
            ("mx/s", Semaphore { permits: 1 }),
        ],
        vec![
            ("mx/s", Semaphore { permits: 1 }),
            ("mx/b", Write),
            ("mx/a", Exclusive),
        ],
        vec![
            ("mx/b", Write),
            ("mx/s", Semaphore { permits: 1 }),
            ("mx/a", Exclusive),
        ],
    ];
    let mut tasks = Vec::new();
    for (i, (c, order)) in clients.iter().zip(orders).enumerate() {
        let set = c.multi_lock_of(order).unwrap();
        let occupancy = occupancy.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..8 {
                let g = set
                    .acquire_timeout(SOON)
                    .await
                    .unwrap_or_else(|e| panic!("client {i} round {round}: {e}"));
                for (o, name) in occupancy.iter().zip(["mx/a", "mx/b", "mx/s"]) {
                    o.enter(name);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                for o in occupancy.iter() {
                    o.leave();
                }
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    case.finish().await;
}
