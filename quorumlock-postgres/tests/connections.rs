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
        let config =
            PostgresConfig::parse(&format!("{base}/{ns}?connections={connections}")).unwrap();
        let app = format!("qlconn-{}", uuid::Uuid::new_v4().simple());
        let mut pg = quorumlock_postgres::tokio_postgres::Config::new();
        pg.host(&config.host)
            .port(config.port)
            .user(&config.user)
            .dbname(&config.database)
            .application_name(&app);
        let backend = PostgresBackend::from_client(pg, config).await.unwrap();
        let client = LockClient::new(Arc::new(backend));
        // The session (and its listener) before the burst.
        client
            .lock("warm")
            .unwrap()
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();

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
