//! The tables are created once; a client that finds them creates nothing
//! and takes no table lock. `CREATE INDEX IF NOT EXISTS` takes a SHARE
//! lock on its table before it finds the index exists, so a client
//! starting while another transaction writes the table waited behind it
//! (and every later writer behind the new client): under the explorer's
//! twenty schedules at once, connects failed on the server's statement
//! timeout and on deadlocks.

mod common;

use std::sync::Arc;
use std::time::Duration;

use quorumlock_core::LockClient;
use quorumlock_postgres::PostgresBackend;

/// A schema of its own for one test, and the URL of a namespace in it.
fn fresh_schema(base: &str) -> (String, String) {
    let schema = format!(
        "qlschema_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let url = format!("{base}/app?schema={schema}&ttl=3s&connect_timeout=5s");
    (schema, url)
}

#[tokio::test]
async fn a_client_connects_while_another_transaction_writes_the_tables() {
    let Some(base) = common::base_url() else {
        return;
    };
    let (schema, url) = fresh_schema(&base);
    // The first client creates the tables.
    let first = PostgresBackend::connect(&url).await.unwrap();

    // A writer of the entries table, its transaction left open.
    let mut writer = common::sql(&base).await;
    let tx = writer.transaction().await.unwrap();
    tx.batch_execute(&format!(
        "LOCK TABLE \"{schema}\".entries IN ROW EXCLUSIVE MODE"
    ))
    .await
    .unwrap();

    let started = tokio::time::Instant::now();
    let second = tokio::time::timeout(Duration::from_secs(10), PostgresBackend::connect(&url))
        .await
        .expect("connect returned")
        .unwrap_or_else(|e| panic!("a client could not start while the table is written: {e}"));
    let took = started.elapsed();
    let client = LockClient::new(Arc::new(second));
    let guard = client
        .lock("while-written")
        .unwrap()
        .acquire_timeout(Duration::from_secs(5))
        .await
        .unwrap();
    guard.release().await.unwrap();
    client.close().await;
    assert!(
        took < Duration::from_secs(2),
        "connect waited {took:?} behind another transaction"
    );

    tx.rollback().await.unwrap();
    drop(first);
    writer
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
}

/// The first item of a new change feed of lock `x` (the feed dropped).
async fn first_of_a_feed(client: &LockClient) -> quorumlock_core::Result<()> {
    use futures::StreamExt;
    let feed = client
        .backend()
        .changes(&quorumlock_core::LockName::new("x").unwrap())
        .expect("postgres follows changes");
    tokio::time::timeout(Duration::from_secs(10), Box::pin(feed).next())
        .await
        .expect("the feed said nothing")
        .expect("the feed ended")
}

/// A schema made before the trigger that notifies followers existed: the
/// next client adds the trigger alone (the tables' statements, with their
/// table locks, do not run again), and a follower then hears a change; a
/// follower of a schema without the trigger gets an error from its feed
/// (and reads every few seconds instead), never silence.
#[tokio::test]
async fn a_schema_without_the_trigger_gets_it() {
    use futures::StreamExt;
    let Some(base) = common::base_url() else {
        return;
    };
    let (schema, url) = fresh_schema(&base);
    let count_query = format!(
        "SELECT count(*) FROM pg_trigger WHERE tgname = 'entries_changed' \
         AND tgrelid = to_regclass('\"{schema}\".entries')"
    );
    let db = common::sql(&base).await;
    let first = LockClient::new(Arc::new(PostgresBackend::connect(&url).await.unwrap()));
    first.inspect("x").await.unwrap(); // the tables and the trigger
    assert_eq!(
        db.query_one(&count_query, &[])
            .await
            .unwrap()
            .get::<_, i64>(0),
        1
    );
    // A schema of the version before the renewals were told has no
    // `session_renewed`: a follower hears changes all the same (it reads
    // each expiry when due), also where its user could not add it.
    let renewed_query = format!(
        "SELECT count(*) FROM pg_trigger WHERE tgname = 'session_renewed' \
         AND tgrelid = to_regclass('\"{schema}\".sessions')"
    );
    db.batch_execute(&format!(
        "DROP TRIGGER session_renewed ON \"{schema}\".sessions"
    ))
    .await
    .unwrap();
    let opened = first_of_a_feed(&first).await;
    assert!(opened.is_ok(), "a feed without session_renewed: {opened:?}");
    db.batch_execute(&format!(
        "DROP TRIGGER entries_changed ON \"{schema}\".entries"
    ))
    .await
    .unwrap();

    // A follower on a client that found the schema complete before: its
    // feed says that nothing notifies (the watch reads anyway).
    let first_item = first_of_a_feed(&first).await;
    assert!(
        first_item.is_err(),
        "a feed without the trigger: {first_item:?}"
    );

    // A new client adds it back.
    let second = LockClient::new(Arc::new(PostgresBackend::connect(&url).await.unwrap()));
    second.inspect("x").await.unwrap();
    for q in [&count_query, &renewed_query] {
        assert_eq!(
            db.query_one(q, &[]).await.unwrap().get::<_, i64>(0),
            1,
            "{q}"
        );
    }
    let mut watch = Box::pin(
        second
            .watch("x", quorumlock_core::Follow::Notifications)
            .unwrap(),
    );
    let free = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .unwrap();
    assert!(free.unwrap().unwrap().is_free());
    let g = first.lock("x").unwrap().acquire().await.unwrap();
    let held = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("the follower heard nothing of the acquire");
    assert_eq!(held.unwrap().unwrap().holders.len(), 1);
    drop(watch);
    g.release().await.unwrap();
    first.close().await;
    second.close().await;
    db.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
}
