//! The fenced transaction for the caller's own SQL
//! (`quorumlock_postgres::check_held`), on a real PostgreSQL: a holder
//! whose lock was broken while it was cut off from the lock traffic (a
//! paused or partitioned process: its guard still says held) has its
//! `UPDATE` refused by the database, while the same `UPDATE` without the
//! check (what a holder without fencing does, the mutant) is accepted;
//! and once the guard itself knows it lost, the check refuses before
//! asking.

use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::faults::{NetControl, NetMode, TcpProxy};
use quorumlock_core::{ErrorKind, LockClient, LockGuard};
use quorumlock_postgres::{check_held, PostgresBackend, DEFAULT_SCHEMA};
use tokio_postgres::{Client, NoTls};

fn base() -> Option<String> {
    match std::env::var("QUORUMLOCK_TEST_POSTGRES_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ if std::env::var("QUORUMLOCK_TEST_REQUIRE").is_ok_and(|v| v == "1") => {
            panic!("QUORUMLOCK_TEST_POSTGRES_URL is not set and QUORUMLOCK_TEST_REQUIRE=1")
        }
        _ => {
            eprintln!("SKIPPED: QUORUMLOCK_TEST_POSTGRES_URL is not set");
            None
        }
    }
}

/// The application's own connection to the database.
async fn app(base: &str) -> Client {
    let (c, conn) = tokio_postgres::connect(base, NoTls)
        .await
        .expect("app connection");
    tokio::spawn(conn);
    c
}

/// The application's write: the account's owner, in one transaction that
/// first checks `guard` when `fenced`.
async fn write(
    app: &mut Client,
    table: &str,
    guard: &LockGuard,
    owner: &str,
    fenced: bool,
) -> quorumlock_core::Result<u64> {
    let tx = app.transaction().await.expect("begin");
    if fenced {
        check_held(&tx, DEFAULT_SCHEMA, [guard]).await?;
    }
    let n = tx
        .execute(
            &format!("UPDATE {table} SET owner = $1, token = $2 WHERE id = 1"),
            &[&owner, &(guard.token() as i64)],
        )
        .await
        .expect("update");
    tx.commit().await.expect("commit");
    Ok(n)
}

async fn owner(app: &Client, table: &str) -> String {
    app.query_one(&format!("SELECT owner FROM {table} WHERE id = 1"), &[])
        .await
        .expect("select")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_holders_sql_is_refused_and_the_same_sql_unfenced_is_accepted() {
    let Some(base) = base() else { return };
    let url = quorumlock_core::url::parse(&base).unwrap();
    let target = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(5432));
    let target = tokio::net::lookup_host(&target)
        .await
        .unwrap()
        .next()
        .unwrap();
    let proxy = TcpProxy::start(target).await.unwrap();
    let ns = format!("fsql-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut through = url.clone();
    through.set_port(Some(proxy.addr().port())).unwrap();
    let a = LockClient::new(Arc::new(
        PostgresBackend::connect(format!("{}/{ns}", through.as_str().trim_end_matches('/')))
            .await
            .unwrap(),
    ));
    let b = LockClient::new(Arc::new(
        PostgresBackend::connect(format!("{}/{ns}", base.trim_end_matches('/')))
            .await
            .unwrap(),
    ));
    let mut app_a = app(&base).await;
    let mut app_b = app(&base).await;
    let table = format!("ql_accounts_{}", &ns[5..]);
    app_b
        .batch_execute(&format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, owner text NOT NULL, token bigint NOT NULL);
             INSERT INTO {table} VALUES (1, 'nobody', 0)"
        ))
        .await
        .unwrap();

    let ga = a.lock("account/1").unwrap().acquire().await.unwrap();
    assert_eq!(write(&mut app_a, &table, &ga, "a", true).await.unwrap(), 1);
    assert_eq!(owner(&app_b, &table).await, "a");

    // A is cut off from the lock traffic (its database connection for the
    // application's own SQL still works); an operator breaks the lock and
    // B takes it. A's guard cannot know yet.
    proxy.set_mode(NetMode::Blackhole);
    assert!(b.break_lock("account/1").await.unwrap());
    let gb = b
        .lock("account/1")
        .unwrap()
        .acquire_timeout(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        ga.is_held(),
        "the test needs a holder that does not know yet"
    );
    assert!(gb.token() > ga.token());
    assert_eq!(write(&mut app_b, &table, &gb, "b", true).await.unwrap(), 1);

    // A's fenced UPDATE: refused by the database, nothing written.
    let e = write(&mut app_a, &table, &ga, "a-late", true)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
    assert_eq!(owner(&app_b, &table).await, "b");

    // The mutant: the same UPDATE without the check is accepted, and
    // overwrites B's write.
    assert_eq!(
        write(&mut app_a, &table, &ga, "a-late", false)
            .await
            .unwrap(),
        1
    );
    assert_eq!(owner(&app_b, &table).await, "a-late");

    // Once A's guard knows it lost (its deadline passed), the check
    // refuses without asking.
    tokio::time::timeout(Duration::from_secs(15), ga.lost())
        .await
        .expect("A's guard reports the loss");
    let e = write(&mut app_a, &table, &ga, "a-later", true)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");

    proxy.set_mode(NetMode::Pass);
    gb.release().await.unwrap();
    drop(ga);
    a.close().await;
    b.close().await;
    app_b
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}

/// While a holder's fenced transaction is open (checked, not committed),
/// the next holder is not granted: the check's row locks keep the
/// holder's entry until the transaction ends, so its writes never overlap
/// the next holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_holder_waits_for_an_open_fenced_transaction() {
    let Some(base) = base() else { return };
    let ns = format!("fsql-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let url = format!("{}/{ns}", base.trim_end_matches('/'));
    let a = LockClient::new(Arc::new(PostgresBackend::connect(&url).await.unwrap()));
    let b = LockClient::new(Arc::new(PostgresBackend::connect(&url).await.unwrap()));
    let mut app_a = app(&base).await;
    let ga = a.lock("x").unwrap().acquire().await.unwrap();
    let tx = app_a.transaction().await.unwrap();
    check_held(&tx, DEFAULT_SCHEMA, [&ga]).await.unwrap();
    // The operator breaks the lock meanwhile: the break itself waits for
    // the transaction (it would delete the entry the check locked).
    let breaking = tokio::spawn({
        let b = b.clone();
        async move { b.break_lock("x").await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !breaking.is_finished(),
        "the break did not wait for the fenced transaction"
    );
    tx.commit().await.unwrap();
    assert!(breaking.await.unwrap().unwrap());
    let gb = b
        .lock("x")
        .unwrap()
        .acquire_timeout(Duration::from_secs(10))
        .await
        .unwrap();
    gb.release().await.unwrap();
    drop(ga);
    a.close().await;
    b.close().await;
}

/// An upgraded read hold checks as held: `check_held` looks at the
/// upgrade's own entry and token (its `token()` is the upgradeable
/// hold's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_hold_checks_as_held() {
    let Some(base) = base() else { return };
    let ns = format!("fsql-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let url = format!("{}/{ns}", base.trim_end_matches('/'));
    let a = LockClient::new(Arc::new(PostgresBackend::connect(&url).await.unwrap()));
    let mut app_a = app(&base).await;
    let mut u = a.rwlock("x").unwrap().upgradeable_read().await.unwrap();
    {
        let up = u.upgrade().await.unwrap();
        let tx = app_a.transaction().await.unwrap();
        check_held(&tx, DEFAULT_SCHEMA, [&*up])
            .await
            .expect("an upgraded hold checks as held");
        tx.commit().await.unwrap();
        up.downgrade().await.unwrap();
    }
    u.release().await.unwrap();
    a.close().await;
}
