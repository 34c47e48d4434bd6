//! Swapping the store: the code below never names a store. The URL in
//! `QUORUMLOCK_URL` picks it (required: `mem://` is the embedded store),
//! and the cargo features pick which stores are compiled in.
//!
//! ```sh
//! QUORUMLOCK_URL=mem:// cargo run -p quorumlock --example swap_store
//! for url in etcd://127.0.0.1:2379/demo zk://127.0.0.1:2181/demo consul://127.0.0.1:8500/demo; do
//!   QUORUMLOCK_URL=$url cargo run -q -p quorumlock --all-features --example swap_store
//! done
//! ```

use std::time::Duration;

use quorumlock::{ErrorKind, LockClient};

/// Application code: takes a client, whatever the store.
async fn nightly_report(client: &LockClient) -> quorumlock::Result<()> {
    let lock = client.lock("reports/nightly")?;
    let guard = match lock.acquire_timeout(Duration::from_secs(10)).await {
        Ok(g) => g,
        Err(e) if e.kind() == ErrorKind::Timeout => {
            println!("someone else is writing the report; skipping");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    println!(
        "  holding {} with fencing token {} on session {}",
        guard.name(),
        guard.token(),
        guard.session_id()
    );
    let state = client.inspect("reports/nightly").await?;
    if let Some(h) = state.holders.first() {
        println!(
            "  the store says: held by session {}, token {}",
            h.session, h.token
        );
    }
    tokio::select! {
        reason = guard.lost() => println!("  lock lost: {reason}; stopping"),
        _ = tokio::time::sleep(Duration::from_millis(50)) => println!("  report written"),
    }
    guard.release().await
}

#[tokio::main]
async fn main() -> quorumlock::Result<()> {
    // The only line that knows about configuration.
    let client = quorumlock::connect_from_env().await?;

    let store = client.backend().describe(); // secrets redacted
    let scheme = store.split("://").next().unwrap_or("?");
    let kind = match scheme {
        "mem" => "the embedded in-memory store (this process only)",
        "etcd" | "etcds" => "etcd",
        "zk" => "ZooKeeper",
        "consul" | "consuls" => "Consul",
        _ => "another store",
    };
    let caps = client.backend().capabilities();
    println!("store: {kind} at {store}");
    println!(
        "  session TTL {:?}, read-write locks: {}, semaphores: {}",
        caps.session_ttl, caps.rwlock, caps.semaphore
    );

    nightly_report(&client).await?;
    client.close().await;
    println!("done on {kind}");
    Ok(())
}
