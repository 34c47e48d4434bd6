//! Transfers between two accounts in a table of your own PostgreSQL
//! database, each transfer one SQL transaction that first checks both
//! account locks still hold (`quorumlock::postgres::check_held`): a holder
//! that lost its locks (here an operator breaks one) has its `UPDATE`
//! refused by the database itself. The PostgreSQL counterpart of
//! `transfer.rs`; needs `QUORUMLOCK_URL=postgres://user@host:port/database/namespace`.

use quorumlock::postgres::tokio_postgres::{self, NoTls};
use quorumlock::postgres::{check_held, DEFAULT_SCHEMA};
use quorumlock::{ErrorKind, MultiGuard};

/// Moves `amount` from `from` to `to`, only while `guard` holds both locks.
async fn transfer(
    db: &mut tokio_postgres::Client,
    guard: &MultiGuard,
    from: &str,
    to: &str,
    amount: i64,
) -> Result<(), Box<dyn std::error::Error>> {
    let tx = db.transaction().await?;
    check_held(&tx, DEFAULT_SCHEMA, guard.guards()).await?;
    let update = "UPDATE quorumlock_example_accounts SET balance = balance + $2 WHERE name = $1";
    tx.execute(update, &[&from, &-amount]).await?;
    tx.execute(update, &[&to, &amount]).await?;
    tx.commit().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var(quorumlock::URL_ENV)?;
    // The application's own connection: the lock URL without its
    // namespace (postgres://user@host:port/database).
    let (scheme_host, path) = url
        .split_once("://")
        .and_then(|(s, rest)| rest.split_once('/').map(|(h, p)| (format!("{s}://{h}"), p)))
        .ok_or("QUORUMLOCK_URL must be postgres://host:port/database/namespace")?;
    let database = path.split(['/', '?']).next().unwrap_or_default();
    let (mut db, connection) =
        tokio_postgres::connect(&format!("{scheme_host}/{database}"), NoTls).await?;
    tokio::spawn(connection);
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS quorumlock_example_accounts (name text PRIMARY KEY, balance bigint NOT NULL);
         INSERT INTO quorumlock_example_accounts VALUES ('alice', 100), ('bob', 100)
           ON CONFLICT (name) DO UPDATE SET balance = 100",
    )
    .await?;

    let a = quorumlock::connect(&url).await?;
    let b = quorumlock::connect(&url).await?;
    let accounts = a.multi_lock(["accounts/alice", "accounts/bob"])?;
    for _ in 0..5 {
        let held = accounts.acquire().await?;
        transfer(&mut db, &held, "alice", "bob", 10).await?;
        held.release().await?;
    }

    // A holder that lost its set: the database refuses its transaction.
    let held = accounts.acquire().await?;
    b.break_lock("accounts/bob").await?;
    println!("set lost: {}", held.lost().await);
    match transfer(&mut db, &held, "alice", "bob", 1_000_000).await {
        Err(e) => match e.downcast_ref::<quorumlock::Error>() {
            Some(q) if q.kind() == ErrorKind::LockLost => {
                println!("the database refused the stale holder's transfer: {q}")
            }
            _ => return Err(e),
        },
        Ok(()) => panic!("a stale holder's transfer was not refused"),
    }
    let _ = held.release().await;
    let rows = db
        .query(
            "SELECT name, balance FROM quorumlock_example_accounts ORDER BY name",
            &[],
        )
        .await?;
    let balances: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    println!("after 5 transfers: {balances:?}");
    assert_eq!(
        balances,
        [("alice".to_string(), 50), ("bob".to_string(), 150)]
    );
    db.batch_execute("DROP TABLE quorumlock_example_accounts")
        .await?;
    a.close().await;
    b.close().await;
    Ok(())
}
