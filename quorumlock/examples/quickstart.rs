//! Quickstart: four workers contend for one lock and show the fencing
//! tokens they get. Runs on the embedded `mem://` store with no server;
//! set `QUORUMLOCK_URL` (e.g. `etcd://127.0.0.1:2379/demo`) to use a real
//! store, with the matching cargo feature enabled.

use std::time::Duration;

#[tokio::main]
async fn main() -> quorumlock::Result<()> {
    let url = std::env::var(quorumlock::URL_ENV).unwrap_or_else(|_| quorumlock::DEFAULT_URL.into());
    let client = quorumlock::connect(&url).await?;
    println!("store: {client:?}");

    let mut workers = Vec::new();
    for worker in 1..=4 {
        // Each worker is its own owner; clones share the client's session.
        let lock = client.lock("quickstart/report")?;
        workers.push(tokio::spawn(async move {
            let guard = lock.acquire().await?;
            println!(
                "worker {worker} holds {} with fencing token {} (session {})",
                guard.name(),
                guard.token(),
                guard.session_id()
            );
            // Work protected by the lock; a real resource would reject
            // writes whose token is lower than one it has seen.
            tokio::time::sleep(Duration::from_millis(50)).await;
            guard.release().await
        }));
    }

    // While they work, look at the lock from outside.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let state = client.inspect("quickstart/report").await?;
    match state.holders.first() {
        Some(h) => println!("holder: session {} with token {}", h.session, h.token),
        None => println!("holder: nobody"),
    }

    for w in workers {
        w.await.expect("worker panicked")?;
    }
    client.close().await;
    println!("all workers done; tokens increased with each holder");
    Ok(())
}
