//! A backend built from `ZkConfig`'s setters takes locks on the real
//! ZooKeeper, and `lazy` opens no session in `connect()`. (Digest
//! credentials are the TLS/auth work's; no `from_client`: see
//! `ZkBackend::from_config`.)

use std::sync::Arc;
use std::time::Duration;

use backend_zk::{ZkBackend, ZkConfig};
use lockcore::backend::{Backend, Namespace};
use lockcore::LockClient;

#[tokio::test]
async fn from_setters() {
    let url = match std::env::var("QUORUMLOCK_TEST_ZK_URL") {
        Ok(u) if !u.is_empty() => u,
        _ if std::env::var("QUORUMLOCK_TEST_REQUIRE").as_deref() == Ok("1") => {
            panic!("QUORUMLOCK_TEST_ZK_URL is not set and QUORUMLOCK_TEST_REQUIRE=1")
        }
        _ => return eprintln!("SKIPPED: QUORUMLOCK_TEST_ZK_URL is not set"),
    };
    let servers = ZkConfig::parse(&url).unwrap().servers;
    let ns = format!(
        "qlconn-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let config = ZkConfig::default()
        .with_servers(servers)
        .with_namespace(Namespace::new(&ns).unwrap())
        .with_session_timeout(Duration::from_secs(4))
        .with_connect_timeout(Duration::from_secs(3));

    let lazy = ZkBackend::from_config(config.clone().with_lazy(true))
        .await
        .unwrap();
    assert_eq!(lazy.requests_sent(), 0, "a lazy connect sent something");

    let b = ZkBackend::from_config(config).await.unwrap();
    assert!(b.requests_sent() > 0, "connect opened no session");
    let client = LockClient::new(Arc::new(b));
    let g = client.lock("c").unwrap().acquire().await.unwrap();
    assert_eq!(client.inspect("c").await.unwrap().holders.len(), 1);
    g.release().await.unwrap();
    client.close().await;
}
