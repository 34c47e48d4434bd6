//! A read-write lock: readers of a shared config share the lock, a writer
//! that publishes a new version holds it alone, and readers that arrive
//! after a waiting writer wait behind it (no writer starvation). Runs on
//! `mem://` with no server, or on the store in `QUORUMLOCK_URL`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[tokio::main]
async fn main() -> quorumlock::Result<()> {
    let url = std::env::var(quorumlock::URL_ENV).unwrap_or_else(|_| quorumlock::DEFAULT_URL.into());
    let client = quorumlock::connect(&url).await?;
    let config = Arc::new(AtomicU32::new(1)); // stands in for a shared file
    let readers_inside = Arc::new(AtomicU32::new(0));

    let mut tasks = Vec::new();
    for reader in 1..=3 {
        let (rw, config, inside) = (
            client.rwlock("config")?,
            config.clone(),
            readers_inside.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let guard = rw.read().await?;
            let together = inside.fetch_add(1, Ordering::SeqCst) + 1;
            println!(
                "reader {reader} reads version {} (token {}, {together} reader(s) inside)",
                config.load(Ordering::SeqCst),
                guard.token()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            guard.release().await
        }));
    }
    tokio::time::sleep(Duration::from_millis(50)).await;

    // The writer queues behind the readers and publishes alone.
    let rw = client.rwlock("config")?;
    let mut writer = rw.write().await?;
    assert_eq!(
        readers_inside.load(Ordering::SeqCst),
        0,
        "a writer holds alone"
    );
    config.store(2, Ordering::SeqCst);
    println!("writer published version 2 (token {})", writer.token());
    {
        // A write holder may read too (downgrade); a reader may not write.
        let read_again = writer.reenter_read();
        println!(
            "writer re-entered for reading with the same token {}",
            read_again.token()
        );
    }
    writer.release().await?;

    for t in tasks {
        t.await.expect("reader panicked")?;
    }
    let guard = rw.read().await?;
    println!(
        "a late reader sees version {}",
        config.load(Ordering::SeqCst)
    );
    guard.release().await?;
    client.close().await;
    println!("done");
    Ok(())
}
