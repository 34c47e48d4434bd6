//! A short outage between clients and the agent (connections reset, then
//! refused for 1.5 s, through the fault suite's TCP proxy) loses nothing:
//! the holder keeps its lock and its monitor, the waiter its place. The
//! clients use a 5 s lock-delay: a holder whose monitor cannot read gives
//! its locks up after half the lock-delay (a break may free them after
//! the whole of it), so with the default 1 s the holder would rightly
//! report this outage as a loss.

use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::faults::{FaultTarget, NetMode};
use quorumlock_core::LockClient;

fn target() -> Option<FaultTarget> {
    FaultTarget::from_env("consul", "QUORUMLOCK_TEST_CONSUL_URL", |url| async move {
        Ok(Arc::new(quorumlock_consul::ConsulBackend::connect(&url).await?) as _)
    })
    .map(|t| t.with_option("ttl", "10s").with_option("lock_delay", "5s"))
}

/// A waiter's connections are reset and then cut for 1.5 s (well under
/// the TTL): it keeps its place in the queue (same queue key, same
/// CreateIndex) and is granted in turn; the holder keeps its lock and
/// still sees revoke requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_outage_keeps_the_waiters_place() {
    let Some(t) = target() else { return };
    let ns = format!("qlf-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let admin = t.client(&ns).await;
    let (hb, hnet) = t.faulty_backend(&ns).await;
    let (wb, wnet) = t.faulty_backend(&ns).await;
    let (holder, waiter) = (LockClient::new(hb), LockClient::new(wb));

    let g = holder.lock("x").unwrap().acquire().await.unwrap();
    let w = waiter.clone();
    let waiting = tokio::spawn(async move { w.lock("x").unwrap().acquire().await });
    let start = tokio::time::Instant::now();
    let place = loop {
        if let Some(w) = admin.inspect("x").await.unwrap().waiters.first() {
            break w.clone();
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    for net in [&hnet, &wnet] {
        net.pulse_reset();
        net.set_mode(NetMode::Cut);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for net in [&hnet, &wnet] {
        net.set_mode(NetMode::Pass);
    }

    // Long enough for any retry backoff (at most 2 s) to have run.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert!(g.is_held(), "a short outage lost the lock: {:?}", g.loss());
    assert!(admin.request_revoke("x").await.unwrap());
    tokio::time::timeout(Duration::from_secs(30), g.revoke_requested())
        .await
        .expect("revoke not seen after the outage");
    let st = admin.inspect("x").await.unwrap();
    assert_eq!(st.waiters.len(), 1, "{st:?}");
    assert_eq!(st.waiters[0].entry, place.entry, "the waiter re-queued");
    assert_eq!(
        st.waiters[0].token, place.token,
        "the waiter lost its place"
    );

    g.release().await.unwrap();
    let g2 = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("waiter not granted after the outage")
        .unwrap()
        .unwrap();
    assert_eq!(g2.session_id(), place.session, "granted on another session");
    // The new holder's monitor works: a forced break is reported.
    assert!(admin.break_lock("x").await.unwrap());
    let reason = tokio::time::timeout(Duration::from_secs(30), g2.lost())
        .await
        .expect("break not seen");
    assert_eq!(reason, quorumlock_core::LossReason::EntryDeleted);
    drop(g2);
    for c in [&holder, &waiter, &admin] {
        c.wait_idle().await;
        c.close().await;
    }
    let probe = t.backend(&ns).await;
    assert_eq!(probe.leftovers().await.unwrap(), Vec::<String>::new());
}
