//! A release wakes one waiter: the store requests caused by one release
//! (over every client) are a small constant, the same with 4 waiters as
//! with 16. (`consul lock` waiters, by contrast, all block on `.lock` and
//! all wake on each release.)

use std::sync::Arc;
use std::time::Duration;

use conformance_tests::Harness;
use lockcore::LockClient;
use tokio::sync::{mpsc, oneshot};

/// A harness whose clients use a one-hour session TTL, so that renewals
/// (one per TTL/2) do not fall inside the measured window.
fn harness() -> Option<Harness> {
    Harness::from_env("QUORUMLOCK_TEST_CONSUL_URL", |mut url| async move {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .filter(|(k, _)| k != "ttl")
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        url.query_pairs_mut()
            .clear()
            .extend_pairs(pairs)
            .append_pair("ttl", "1h");
        Ok(Arc::new(backend_consul::ConsulBackend::connect(&url).await?) as _)
    })
}

fn total(clients: &[LockClient]) -> u64 {
    clients.iter().map(|c| c.backend().requests_sent()).sum()
}

/// Requests sent by all clients from just before the holder's release to
/// just after the next holder's grant, plus a settle delay.
async fn requests_per_release(h: &Harness, waiters: usize) -> u64 {
    let case = h.case();
    let holder = case.client().await;
    let clients = case.clients(waiters).await;
    let g = holder.lock("herd").unwrap().acquire().await.unwrap();

    let (granted_tx, mut granted_rx) = mpsc::unbounded_channel();
    let mut releases = Vec::new();
    let mut tasks = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let (c, granted) = (c.clone(), granted_tx.clone());
        let (rel_tx, rel_rx) = oneshot::channel::<()>();
        releases.push(rel_tx);
        tasks.push(tokio::spawn(async move {
            let g = c.lock("herd").unwrap().acquire().await.unwrap();
            granted.send(i).unwrap();
            let _ = rel_rx.await;
            g.release().await.unwrap();
        }));
        // Queue them one by one, so the arrival order is known.
        let start = tokio::time::Instant::now();
        while holder.inspect("herd").await.unwrap().waiters.len() < i + 1 {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "waiter {i} never queued"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // Let every waiter's blocking query reach the agent before measuring.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut everyone = clients.clone();
    everyone.push(holder.clone());

    let before = total(&everyone);
    g.release().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(30), granted_rx.recv())
        .await
        .expect("no waiter was granted")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let delta = total(&everyone) - before;
    assert_eq!(first, 0, "the first waiter in line was not served first");
    assert!(
        granted_rx.try_recv().is_err(),
        "a second waiter was granted while the first holds"
    );

    // Let the rest go, in order.
    for (i, rel) in releases.into_iter().enumerate() {
        rel.send(()).unwrap();
        if i + 1 < waiters {
            let next = tokio::time::timeout(Duration::from_secs(30), granted_rx.recv())
                .await
                .expect("next waiter not granted")
                .unwrap();
            assert_eq!(next, i + 1, "waiters served out of order");
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    case.finish().await;
    delta
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_costs_the_same_with_4_and_16_waiters() {
    let Some(h) = harness() else { return };
    let four = requests_per_release(&h, 4).await;
    let sixteen = requests_per_release(&h, 16).await;
    eprintln!("requests per release: {four} with 4 waiters, {sixteen} with 16 waiters");
    // Releaser: 1 txn. Next in line (its blocking query on the releaser's
    // queue key returns): 1 read of the lock's keys, 1 txn `lock`, 1
    // blocking query of its monitor. Nobody else wakes: 4.
    assert!(four <= 6, "{four} requests for one release with 4 waiters");
    assert_eq!(
        four, sixteen,
        "the cost of a release grows with the waiters"
    );
}
