//! Transfers between two accounts whose balances live in the lock's own
//! store: both account locks are taken as one set (two clients ask in
//! opposite orders and never deadlock), each transfer runs scoped (its
//! work is dropped if a lock is lost), and the balances are written with
//! fenced writes, which the store refuses once the set is lost. Runs on
//! `mem:///examples` with no server, or on the store in `QUORUMLOCK_URL`
//! (with a namespace, the URL's path: fenced writes need one).

use quorumlock::{ErrorKind, LockClient, MultiGuard};

/// Where an account's balance lives: the same key on every store (on
/// ZooKeeper the path `/quorumlock-example-accounts/<account>`).
fn key(account: &str) -> String {
    format!("quorumlock-example-accounts/{account}")
}

async fn balance(client: &LockClient, key: &str) -> quorumlock::Result<i64> {
    let raw = client.read_key(key).await?.unwrap_or_default();
    Ok(String::from_utf8_lossy(&raw).parse().unwrap_or(0))
}

async fn set_balance(guard: &MultiGuard, key: &str, value: i64) -> quorumlock::Result<()> {
    guard.fenced_put(key, value.to_string()).await
}

#[tokio::main]
async fn main() -> quorumlock::Result<()> {
    // Fenced writes need the locks in a namespace (the URL's path): at
    // the store's root any key could be some lock's own entry.
    let url = std::env::var(quorumlock::URL_ENV).unwrap_or_else(|_| "mem:///examples".into());
    let (alice, bob) = (key("alice"), key("bob"));
    let a = quorumlock::connect(&url).await?;
    let b = quorumlock::connect(&url).await?;

    let accounts = a.multi_lock(["accounts/alice", "accounts/bob"])?;
    let seed = accounts.acquire().await?;
    set_balance(&seed, &alice, 100).await?;
    set_balance(&seed, &bob, 100).await?;
    seed.release().await?;

    // Two clients move money in opposite directions, naming the locks in
    // opposite orders: the set is taken in one canonical order.
    let mut tasks = Vec::new();
    for (client, from, to, names) in [
        (
            a.clone(),
            alice.clone(),
            bob.clone(),
            ["accounts/alice", "accounts/bob"],
        ),
        (
            b.clone(),
            bob.clone(),
            alice.clone(),
            ["accounts/bob", "accounts/alice"],
        ),
    ] {
        tasks.push(tokio::spawn(async move {
            let set = client.multi_lock(names)?;
            for _ in 0..5 {
                let (reader, from, to) = (client.clone(), from.clone(), to.clone());
                set.run(async move |guard| {
                    let (f, t) = (balance(&reader, &from).await?, balance(&reader, &to).await?);
                    set_balance(guard, &from, f - 10).await?;
                    set_balance(guard, &to, t + 10).await
                })
                .await??;
            }
            quorumlock::Result::Ok(())
        }));
    }
    for t in tasks {
        t.await.expect("transfer task panicked")?;
    }
    let (x, y) = (balance(&a, &alice).await?, balance(&a, &bob).await?);
    println!("after 5 transfers each way: alice {x}, bob {y}");
    assert_eq!(x + y, 200, "money was created or destroyed");

    // A holder that lost one lock of its set can no longer write: the
    // store itself refuses (here an operator breaks one lock).
    let held = accounts.acquire().await?;
    let lost = held.lost();
    b.break_lock("accounts/bob").await?;
    println!("set lost: {}", lost.await);
    match set_balance(&held, &alice, 1_000_000).await {
        Err(e) if e.kind() == ErrorKind::LockLost => {
            println!("the store refused the stale holder's write: {e}")
        }
        other => panic!("a stale fenced write was not refused: {other:?}"),
    }
    let _ = held.release().await;
    assert_eq!(balance(&a, &alice).await?, x);

    let cleanup = accounts.acquire().await?;
    cleanup.fenced_delete(alice.as_str()).await?;
    cleanup.fenced_delete(bob.as_str()).await?;
    cleanup.release().await?;
    a.close().await;
    b.close().await;
    println!("transfers done: balances consistent, stale write refused");
    Ok(())
}
