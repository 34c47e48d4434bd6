//! A client opens at most `connections=` server connections for its
//! transactions (plus one per session for `LISTEN`), however many
//! requests it has in flight: many clients on one server must not run it
//! out of `max_connections` (the explorer's 20 schedules at once did, with
//! a pool that grew with the requests in flight).

mod common;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use quorumlock_conformance::support::open_session;
use quorumlock_core::LockClient;
use quorumlock_postgres::{PostgresBackend, PostgresConfig};

/// Server connections named `app`, sampled every few milliseconds until
/// `done`: the most seen at once.
async fn most_connections(url: String, app: String, done: Arc<AtomicBool>) -> i64 {
    let watcher = common::sql(&url).await;
    let most = AtomicI64::new(0);
    while !done.load(Ordering::Relaxed) {
        let row = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&app],
            )
            .await
            .unwrap();
        most.fetch_max(row.get::<_, i64>(0), Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    most.load(Ordering::Relaxed)
}

/// A lock client on `url` whose server connections carry an application
/// name of their own (returned), with its session (and listener) opened.
async fn named_client(url: &str) -> (LockClient, String) {
    let config = PostgresConfig::parse(url).unwrap();
    let app = format!("qlconn-{}", uuid::Uuid::new_v4().simple());
    let mut pg = quorumlock_postgres::tokio_postgres::Config::new();
    pg.host(&config.host)
        .port(config.port)
        .user(&config.user)
        .dbname(&config.database)
        .application_name(&app);
    let backend = PostgresBackend::from_client(pg, config).await.unwrap();
    let client = LockClient::new(Arc::new(backend));
    open_session(&client).await;
    (client, app)
}

#[tokio::test]
async fn sixty_four_acquires_in_flight_use_at_most_the_configured_connections() {
    let Some(base) = common::base_url() else {
        return;
    };
    let ns = format!(
        "qlconn-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    for connections in [2u32, 4] {
        let (client, app) = named_client(&format!("{base}/{ns}?connections={connections}")).await;

        let done = Arc::new(AtomicBool::new(false));
        let watcher = tokio::spawn(most_connections(base.clone(), app.clone(), done.clone()));
        let guards: Vec<_> = stream::iter(0..256)
            .map(|i| {
                let c = client.clone();
                async move { c.lock(format!("burst/{i}"))?.acquire().await }
            })
            .buffer_unordered(64)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<quorumlock_core::Result<_>>()
            .unwrap();
        stream::iter(guards)
            .map(|g| g.release())
            .buffer_unordered(64)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<quorumlock_core::Result<Vec<()>>>()
            .unwrap();
        done.store(true, Ordering::Relaxed);
        let most = watcher.await.unwrap();
        client.close().await;
        // The transactions' connections and the session's listener.
        let allowed = i64::from(connections) + 1;
        assert!(
            most <= allowed,
            "connections={connections}: {most} server connections at once, more than {allowed}"
        );
        assert!(
            most >= 2,
            "the sampling saw the client's connections: {most}"
        );
    }
}

/// Queues whose lock a transaction keeps (a client in the middle of a
/// transaction decided in Rust, or one that went silent there) hold up
/// the acquires of those locks, not those of the client's other locks:
/// not when every connection for transactions waits for one, nor when a
/// statement for one went first on the connection that single
/// statements share (it gives up waiting after `lock_timeout` and waits
/// on a connection of its own). Before the shared connection, acquires
/// of other locks waited for a connection until the queues were let go.
#[tokio::test]
async fn a_queue_held_by_a_slow_transaction_holds_up_no_other_lock() {
    let Some(base) = common::base_url() else {
        return;
    };
    let ns = common::namespace("qlstuck");
    // A timeout longer than the test: the waits for the queues last.
    let (client, app) =
        named_client(&format!("{base}/{ns}?connections=3&ttl=90s&timeout=30s")).await;

    // The queues of `stuck-0` to `stuck-5`, kept by a transaction of our
    // own, and an acquire of each: more than the client has connections.
    let mut holder = common::sql(&base).await;
    let tx = holder.transaction().await.unwrap();
    for i in 0..6 {
        tx.execute(
            "SELECT pg_advisory_xact_lock(7433323, hashtext($1))",
            &[&format!("{ns}/stuck-{i}")],
        )
        .await
        .unwrap();
    }
    let stuck: Vec<_> = (0..6)
        .map(|i| {
            let c = client.clone();
            tokio::spawn(async move {
                c.lock(format!("stuck-{i}"))?
                    .acquire()
                    .await?
                    .release()
                    .await
            })
        })
        .collect();
    let watcher = common::sql(&base).await;
    let waiting = || async {
        let row = watcher
            .query_one(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
                 WHERE a.application_name = $1 AND l.locktype = 'advisory' AND NOT l.granted",
                &[&app],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0)
    };
    // Both connections for transactions wait for a queue.
    common::wait_for(
        "the client's connections waiting for the queues",
        Duration::from_secs(10),
        || async { (waiting().await >= 2).then_some(()) },
    )
    .await;

    let others = stream::iter(0..32)
        .map(|i| {
            let c = client.clone();
            async move {
                c.lock(format!("free/{i}"))?
                    .acquire()
                    .await?
                    .release()
                    .await
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>();
    let others = tokio::time::timeout(Duration::from_secs(10), others)
        .await
        .expect("acquires of other locks waited for the held queues");
    for r in others {
        r.unwrap();
    }
    assert!(
        waiting().await >= 2,
        "the queues were still held while the others went through"
    );

    tx.commit().await.unwrap();
    for s in stuck {
        tokio::time::timeout(Duration::from_secs(60), s)
            .await
            .expect("the acquires of the held queues went on once they were let go")
            .unwrap()
            .unwrap();
    }
    client.close().await;
}
