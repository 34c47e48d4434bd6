//! A release wakes one waiter: the store requests caused by one release
//! (over every client) are a small constant, the same with 4 waiters as
//! with 16, and only the releaser and the next holder send any. The
//! contrast: `consul lock` waiters all block on `.lock` and all wake on
//! each release (counted through one TCP proxy per waiter).

use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::faults::TcpProxy;
use quorumlock_conformance::herd::{cost_of_one_release, cost_of_release, Herd};
use quorumlock_conformance::Harness;
use tokio::process::Command;

/// A harness whose clients use a one-hour session TTL, so that renewals
/// (one per TTL/2) do not fall inside the measured window.
fn harness() -> Option<Harness> {
    Harness::from_env("QUORUMLOCK_TEST_CONSUL_URL", |url| async move {
        Ok(Arc::new(quorumlock_consul::ConsulBackend::connect(&url).await?) as _)
    })
    .map(|h| h.with_option("ttl", "1h"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_costs_the_same_with_4_and_16_waiters() {
    let Some(h) = harness() else { return };
    let four = cost_of_one_release(&h, 4).await;
    let sixteen = cost_of_one_release(&h, 16).await;
    eprintln!("one release: {four:?} with 4 waiters, {sixteen:?} with 16 waiters");
    assert_eq!(four.clients_woken, 2, "{four:?}");
    assert_eq!(sixteen.clients_woken, 2, "{sixteen:?}");
    let (four, sixteen) = (four.requests, sixteen.requests);
    // Releaser (a fast holder: no queue key): 1 txn. Next in line (first
    // in our queue, its blocking query on `.lock` returns it gone): 1 txn
    // `lock`, 1 blocking query of its monitor. Nobody else wakes: 3.
    assert!(four <= 3, "{four} requests for one release with 4 waiters");
    assert_eq!(
        four, sixteen,
        "the cost of a release grows with the waiters"
    );
}

/// A handoff between queued contenders (the holder came through the
/// queue, so it has a queue key, and the next waiter blocks on that key):
/// the releaser's txn, the next one's `lock` txn (which reads the line
/// itself: no read before it) and its monitor's blocking query. Nobody
/// else wakes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_in_the_queue_costs_three_requests() {
    let Some(h) = harness() else { return };
    let cost = cost_of_release(&h, 4, Herd::MutexQueued).await;
    eprintln!("a handoff in the queue: {cost:?}");
    assert_eq!(
        cost.clients_woken, 2,
        "clients other than the releaser and the next one sent requests"
    );
    assert!(
        cost.requests <= 3,
        "{} requests for one handoff in the queue",
        cost.requests
    );
}

/// The contrast: `consul lock` waiters (Go `api.Lock`) all block on
/// `.lock`, and all of them wake when it is released. Each waiter talks to
/// the agent through its own TCP proxy; after one release, every proxy
/// carried traffic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_lock_waiters_all_wake_on_a_release() {
    const WAITERS: usize = 4;
    let Some(h) = harness() else { return };
    let case = h.case();
    let ours = case.client().await;
    let url = h.url_for(case.namespace());
    let agent = std::net::ToSocketAddrs::to_socket_addrs(&(
        url.host_str().unwrap().trim_matches(['[', ']']),
        url.port().unwrap_or(quorumlock_consul::DEFAULT_PORT),
    ))
    .unwrap()
    .next()
    .unwrap();
    let bin = std::env::var("QUORUMLOCK_CONSUL_BIN")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "consul".to_string());

    let g = ours.lock("herd").unwrap().acquire().await.unwrap();
    let mut proxies = Vec::new();
    let mut children = Vec::new();
    for _ in 0..WAITERS {
        let p = TcpProxy::start(agent).await.unwrap();
        let child = Command::new(&bin)
            .args(["lock", "-shell=false"])
            .arg(format!("{}/herd", case.namespace()))
            .args(["sh", "-c", "sleep 0.1"])
            .env("CONSUL_HTTP_ADDR", p.addr().to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("running {bin} failed ({e}); set QUORUMLOCK_CONSUL_BIN"));
        proxies.push(p);
        children.push(child);
    }
    // Wait until every waiter has sent its blocking query and gone quiet.
    let bytes = |p: &TcpProxy| p.stats().bytes.load(std::sync::atomic::Ordering::Relaxed);
    let start = tokio::time::Instant::now();
    let mut last: Vec<u64> = proxies.iter().map(bytes).collect();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now: Vec<u64> = proxies.iter().map(bytes).collect();
        if now == last && now.iter().all(|b| *b > 0) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "consul lock waiters never settled"
        );
        last = now;
    }
    g.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let woken = proxies
        .iter()
        .zip(&last)
        .filter(|(p, b)| bytes(p) != **b)
        .count();
    eprintln!("consul lock waiters woken by one release: {woken} of {WAITERS}");
    assert_eq!(woken, WAITERS, "expected every consul lock waiter to wake");
    for mut c in children {
        let st = tokio::time::timeout(Duration::from_secs(60), c.wait())
            .await
            .expect("consul lock did not finish")
            .unwrap();
        assert!(st.success(), "consul lock: {st}");
    }
    case.finish().await;
}

/// A holder's monitor watches its own `.lock` only: waiters queueing on
/// its lock, and other locks of the namespace changing hands, cost the
/// holder no request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_is_not_woken_by_others() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let holder = case.client().await;
    let others = case.clients(4).await;
    let g = holder.lock("held").unwrap().acquire().await.unwrap();
    // Let the monitor's first blocking query reach the agent.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = holder.backend().requests_sent();

    let mut waiting = Vec::new();
    for c in &others {
        let c2 = c.clone();
        waiting.push(tokio::spawn(async move {
            c2.lock("held")
                .unwrap()
                .acquire()
                .await
                .unwrap()
                .release()
                .await
        }));
        for _ in 0..3 {
            c.lock("elsewhere")
                .unwrap()
                .acquire()
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
        }
    }
    let start = tokio::time::Instant::now();
    while others[0].inspect("held").await.unwrap().waiters.len() < others.len() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "waiters never queued"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let spent = holder.backend().requests_sent() - before;
    assert_eq!(
        spent, 0,
        "the holder sent {spent} requests while others worked"
    );

    g.release().await.unwrap();
    for w in waiting {
        w.await.unwrap().unwrap();
    }
    case.finish().await;
}

/// The uncontended cycle is Consul's floor: one txn to acquire (take
/// `.lock` and join the queue at once), one to release; a hold shorter
/// than the monitor's first-watch delay costs no monitor request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_cycle_is_two_requests() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let c = case.client().await;
    let lock = c.lock("solo").unwrap();
    lock.acquire().await.unwrap().release().await.unwrap(); // opens the session
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = c.backend().requests_sent();
    for _ in 0..20 {
        lock.acquire().await.unwrap().release().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let per_cycle = (c.backend().requests_sent() - before) as f64 / 20.0;
    eprintln!("requests per uncontended cycle: {per_cycle}");
    assert!(
        per_cycle <= 2.2,
        "{per_cycle} requests per uncontended cycle"
    );
    case.finish().await;
}
