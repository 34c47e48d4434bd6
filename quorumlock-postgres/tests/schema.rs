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

#[tokio::test]
async fn a_client_connects_while_another_transaction_writes_the_tables() {
    let Some(base) = common::base_url() else {
        return;
    };
    let schema = format!(
        "qlschema_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let url = format!("{base}/app?schema={schema}&ttl=3s&connect_timeout=5s");
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
