//! A follower of a lock (`observe`, `status --watch`) on the real server,
//! where nothing notifies a session's expiry: a session dies by the
//! server's clock, and its entries go when a transaction next reads the
//! queue. The follower wakes when the first session of the lock's
//! entries is due to expire.

mod common;

use std::time::Duration;

use futures::StreamExt;
use quorumlock_conformance::faults::{NetControl, NetMode, TcpProxy};
use quorumlock_core::LockClient;
use quorumlock_postgres::{PostgresBackend, DEFAULT_SCHEMA};

async fn client(url: &str) -> LockClient {
    LockClient::new(std::sync::Arc::new(
        PostgresBackend::connect(url).await.unwrap(),
    ))
}

/// The leader's link goes silent (so its client cannot end its session
/// either) and its session expires on the server (its `expires` set in
/// the past, as the TTL running out would leave it), and nobody touches
/// the election after that. An observer reports that nobody leads (before, it waited for a
/// notification that never came: no row changed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sees_a_leader_whose_session_expired() {
    let Some(base) = common::base_url() else {
        return;
    };
    let ns = common::namespace("qlobs");
    let url = format!("{base}/{ns}?ttl=2s");
    let u = quorumlock_core::url::parse(&url).unwrap();
    let proxy = TcpProxy::start(([127, 0, 0, 1], u.port().unwrap_or(5432)).into())
        .await
        .unwrap();
    let mut through = u.clone();
    through.set_port(Some(proxy.addr().port())).unwrap();
    let (a, o) = (client(through.as_str()).await, client(&url).await);
    let leader = a.election("e").unwrap().campaign("a").await.unwrap();
    let mut seen = Box::pin(o.election("e").unwrap().observe());
    let first = tokio::time::timeout(Duration::from_secs(10), seen.next())
        .await
        .unwrap();
    assert_eq!(
        first.unwrap().unwrap().map(|l| l.value),
        Some(b"a".to_vec())
    );
    let sid = uuid::Uuid::parse_str(&a.session_id().await.unwrap()).unwrap();
    proxy.set_mode(NetMode::Blackhole);
    let db = common::sql(&base).await;
    let n = db
        .execute(
            &format!(
                "UPDATE \"{DEFAULT_SCHEMA}\".sessions SET expires = clock_timestamp() - interval '1 second' WHERE id = $1"
            ),
            &[&sid],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    let next = tokio::time::timeout(Duration::from_secs(10), seen.next())
        .await
        .expect("the observer never saw the leader's session expire");
    assert_eq!(next.unwrap().unwrap(), None);
    drop((seen, leader));
    proxy.set_mode(NetMode::Pass);
    a.close().await;
    o.close().await;
}
