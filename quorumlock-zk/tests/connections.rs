//! One ZooKeeper connection per client: admin work (inspect, break,
//! fenced writes) runs on the lock session's connection while it is open,
//! and the session opened by `connect()`'s check becomes the first lock
//! session. ZooKeeper takes 60 connections per client address by default
//! (`maxClientCnxns`, left at its default by scripts/stores.sh): with two
//! connections per client, 40 clients on one host could not all connect.

use std::sync::Arc;
use std::time::Duration;

use quorumlock_core::LockClient;

fn base_url() -> Option<String> {
    match std::env::var("QUORUMLOCK_TEST_ZK_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ if std::env::var("QUORUMLOCK_TEST_REQUIRE").is_ok_and(|v| v == "1") => {
            panic!("QUORUMLOCK_TEST_ZK_URL is not set and QUORUMLOCK_TEST_REQUIRE=1")
        }
        _ => {
            eprintln!("SKIPPED: QUORUMLOCK_TEST_ZK_URL is not set");
            None
        }
    }
}

/// The server's open client connections (`mntr`'s
/// `zk_num_alive_connections`).
async fn alive_connections(url: &str) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url
        .trim_start_matches("zk://")
        .split(['/', '?'])
        .next()
        .unwrap()
        .to_string();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"mntr").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.lines()
        .find_map(|l| l.strip_prefix("zk_num_alive_connections"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no zk_num_alive_connections in mntr: {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_clients_on_one_host_each_hold_one_connection() {
    let Some(base) = base_url() else {
        return;
    };
    let ns = format!("qlcnx-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let url = format!("{base}/{ns}");
    let before = alive_connections(&base).await;
    let mut clients = Vec::new();
    for i in 0..40 {
        let backend = quorumlock_zk::ZkBackend::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("client {i} of 40 could not connect: {e}"));
        clients.push(LockClient::new(Arc::new(backend)));
    }
    let mut guards = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let g = c
            .lock(format!("l{i}"))
            .unwrap()
            .acquire_timeout(Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("client {i} of 40 could not acquire: {e}"));
        guards.push(g);
    }
    // Admin work while the locks are held: on the lock sessions.
    let state = clients[0].inspect("l1").await.unwrap();
    assert_eq!(state.holders.len(), 1, "{state:?}");
    let during = alive_connections(&base).await;
    // Other test binaries do not run at once; this file's one test does.
    assert!(
        during <= before + 40,
        "40 clients holding a lock each: {during} connections open, {before} before"
    );
    for g in guards {
        g.release().await.unwrap();
    }
    for c in &clients {
        c.close().await;
    }
}
