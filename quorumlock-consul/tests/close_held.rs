//! A client closed while it still holds semaphore permits (the fault
//! explorer's "held-at-close"): the permits' contender keys go with the
//! destroyed sessions, and the close must also take our sessions out of
//! `P/.lock` (a plain key, not locked by any session, that would
//! otherwise keep naming dead holders until someone uses the semaphore
//! again). Nothing of the namespace may be left once the client closed,
//! also when its link is cut as it closes and healed soon after.
//!
//! Needs `QUORUMLOCK_TEST_CONSUL_URL`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::faults::{NetControl, NetMode, TcpProxy};
use quorumlock_core::backend::Backend;
use quorumlock_core::LockClient;
use tokio::time::Instant;

/// The TTL of these clients (Consul's least).
const TTL: Duration = Duration::from_secs(10);

/// The agent's URL, or a skip (a failure with `QUORUMLOCK_TEST_REQUIRE=1`).
fn agent_url() -> Option<quorumlock_core::url::Url> {
    let raw = std::env::var("QUORUMLOCK_TEST_CONSUL_URL")
        .ok()
        .filter(|v| !v.is_empty());
    let Some(raw) = raw else {
        if std::env::var("QUORUMLOCK_TEST_REQUIRE").is_ok_and(|v| v == "1") {
            panic!("QUORUMLOCK_TEST_CONSUL_URL is not set and QUORUMLOCK_TEST_REQUIRE=1");
        }
        eprintln!("SKIPPED: QUORUMLOCK_TEST_CONSUL_URL is not set");
        return None;
    };
    Some(quorumlock_core::url::parse(&raw).expect("QUORUMLOCK_TEST_CONSUL_URL"))
}

fn agent(base: &quorumlock_core::url::Url) -> SocketAddr {
    let host = base.host_str().unwrap().trim_matches(['[', ']']);
    let port = base.port().unwrap_or(quorumlock_consul::DEFAULT_PORT);
    (host, port).to_socket_addrs().unwrap().next().unwrap()
}

fn namespace() -> String {
    format!("qlc-{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

async fn backend(addr: SocketAddr, ns: &str) -> quorumlock_consul::ConsulBackend {
    let url = format!("consul://{addr}/{ns}?ttl={}s", TTL.as_secs());
    quorumlock_consul::ConsulBackend::connect(&quorumlock_core::url::parse(&url).unwrap())
        .await
        .unwrap()
}

/// What a fresh backend finds left in `ns`, polled as the fault explorer
/// does (`left_behind`): until nothing is left, or 3 x TTL + 5 s (a lost
/// session's keys have gone with it by then). Returns the last listing
/// and how long it took.
async fn left_behind(addr: SocketAddr, ns: &str) -> (Vec<String>, Duration) {
    let probe = backend(addr, ns).await;
    let start = Instant::now();
    let give_up = start + TTL * 3 + Duration::from_secs(5);
    loop {
        let left = probe.leftovers().await.unwrap();
        if left.is_empty() || Instant::now() > give_up {
            return (left, start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The JSON of the semaphore lock `key`, read from the agent directly.
async fn semaphore_lock(addr: SocketAddr, key: &str) -> serde_json::Value {
    let url = format!("http://{addr}/v1/kv/{key}?raw&consistent");
    let body = quorumlock_consul::reqwest::get(&url)
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .bytes()
        .await
        .unwrap();
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_with_permits_held_leaves_only_the_others_in_the_semaphore_lock() {
    let Some(base) = agent_url() else { return };
    let addr = agent(&base);
    let ns = namespace();
    let a = LockClient::new(Arc::new(backend(addr, &ns).await));
    let b = LockClient::new(Arc::new(backend(addr, &ns).await));
    let sem_a = a.semaphore("sem", 3).unwrap();
    // Two permits of one client: the client's session and a permit session.
    let g1 = sem_a.acquire().await.unwrap();
    let g2 = sem_a.acquire().await.unwrap();
    let gb = b.semaphore("sem", 3).unwrap().acquire().await.unwrap();
    assert_eq!(b.inspect("sem").await.unwrap().holders.len(), 3);

    // Closed with both guards still held (kept alive past the close, as
    // the explorer keeps its guard).
    a.close().await;
    assert!(!g1.is_held() && !g2.is_held());
    // B still holds: `.lock` itself names B alone, at once (not only
    // `inspect`, which counts live holders).
    let b_session = b.session_id().await.unwrap();
    let lock = semaphore_lock(addr, &format!("{ns}/sem/.lock")).await;
    let holders = lock["Holders"].as_object().expect("a holders map");
    assert_eq!(
        holders.keys().collect::<Vec<_>>(),
        vec![&b_session],
        "{lock}"
    );
    assert_eq!(lock["Limit"], 3, "{lock}");
    gb.release().await.unwrap();
    b.close().await;

    let (left, took) = left_behind(addr, &ns).await;
    assert_eq!(
        left,
        Vec::<String>::new(),
        "left on the store {took:?} after every client closed"
    );
    drop((g1, g2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_with_a_permit_held_leaves_nothing() {
    let Some(base) = agent_url() else { return };
    let addr = agent(&base);
    let ns = namespace();
    let a = LockClient::new(Arc::new(backend(addr, &ns).await));
    let g = a.semaphore("app/sem", 2).unwrap().acquire().await.unwrap();
    a.close().await;
    assert!(!g.is_held());
    let (left, took) = left_behind(addr, &ns).await;
    assert_eq!(
        left,
        Vec::<String>::new(),
        "left on the store {took:?} after every client closed"
    );
    drop(g);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_cut_off_at_first_with_a_permit_held_leaves_nothing() {
    let Some(base) = agent_url() else { return };
    let addr = agent(&base);
    let ns = namespace();
    let proxy = Arc::new(TcpProxy::start(addr).await.unwrap());
    let a = LockClient::new(Arc::new(backend(proxy.addr(), &ns).await));
    let g = a.semaphore("app/sem", 2).unwrap().acquire().await.unwrap();
    // The link is cut as the client closes and healed within a TTL (the
    // explorer's closing cut): the session's end fails at first.
    proxy.set_mode(NetMode::Cut);
    let heal = {
        let proxy = proxy.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            proxy.set_mode(NetMode::Pass);
        })
    };
    a.close().await;
    heal.await.unwrap();
    assert!(!g.is_held());
    let (left, took) = left_behind(addr, &ns).await;
    assert_eq!(
        left,
        Vec::<String>::new(),
        "left on the store {took:?} after every client closed"
    );
    drop(g);
}
