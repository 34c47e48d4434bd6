//! The shared fault scenarios (`quorumlock_conformance::fault_suite!`) against
//! a real ZooKeeper, clients behind a fault-injecting TCP proxy where the
//! scenario needs one. Sessions ask for a 2 s timeout (the dev and CI
//! servers run with tickTime=200 ms, so 2 s is granted) so that the
//! scenarios that wait for an expiry stay short.

quorumlock_conformance::fault_suite!(
    quorumlock_conformance::faults::FaultTarget::from_env(
        "zk",
        "QUORUMLOCK_TEST_ZK_URL",
        |url| async move {
            Ok(std::sync::Arc::new(quorumlock_zk::ZkBackend::connect(&url).await?) as _)
        },
    )
    .map(|t| t.with_option("session_timeout", "2s"))
);
quorumlock_conformance::process_fault_suite!(
    quorumlock_conformance::faults::FaultTarget::from_env(
        "zk",
        "QUORUMLOCK_TEST_ZK_URL",
        |url| async move {
            Ok(std::sync::Arc::new(quorumlock_zk::ZkBackend::connect(&url).await?) as _)
        },
    )
    .map(|t| t.with_option("session_timeout", "2s"))
);

/// `kill_session` on a holder whose own client is cut off (so it cannot
/// close its session itself): the session is closed from a new connection
/// with its id and password, and a waiter gets the lock long before the
/// session would have expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_session_of_a_cut_off_holder() {
    use quorumlock_conformance::faults::NetMode;
    use std::time::Duration;
    let Some(t) = quorumlock_conformance::faults::FaultTarget::from_env(
        "zk",
        "QUORUMLOCK_TEST_ZK_URL",
        |url| async move {
            Ok(std::sync::Arc::new(quorumlock_zk::ZkBackend::connect(&url).await?) as _)
        },
    )
    .map(|t| t.with_option("session_timeout", "4s")) else {
        return;
    };
    let case = t.harness().case();
    let (backend, net) = t.faulty_backend(case.namespace()).await;
    let a = quorumlock_core::LockClient::new(backend);
    let b = case.client().await;
    let g = a.lock("k").unwrap().acquire().await.unwrap();
    let b2 = b.clone();
    let waiter = tokio::spawn(async move { b2.lock("k").unwrap().acquire().await });
    while b.inspect("k").await.unwrap().waiters.len() != 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    net.set_mode(NetMode::Blackhole);
    let t0 = tokio::time::Instant::now();
    b.backend()
        .kill_session(&g.session_id())
        .await
        .expect("kill");
    assert!(!g.is_held());
    let g2 = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("waiter not granted")
        .unwrap()
        .unwrap();
    let took = t0.elapsed();
    eprintln!("kill + grant took {took:?}");
    assert!(
        took < Duration::from_millis(3500),
        "{took:?}: the kill did not end the session early"
    );
    assert!(g2.token() > g.token());
    g2.release().await.unwrap();
    net.set_mode(NetMode::Pass);
    drop(g);
    a.wait_idle().await;
    a.close().await;
    case.finish().await;
}
