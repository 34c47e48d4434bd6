//! etcd refuses a watch create (issue 17, finding 3): the subscriber must
//! be told. A private etcd with auth (the shared ones run without) where
//! our user loses its read permission on the namespace, then the watch
//! stream reconnects: etcd refuses every create on the new stream, with
//! watch id -1. A waiter must not hang; a holder must watch again once the
//! permission is back, so that a break is still reported.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Permission, RoleRevokePermissionOptions};
use quorumlock_conformance::faults::TcpProxy;
use quorumlock_conformance::support::free_port;
use quorumlock_core::{ErrorKind, LockClient, LossReason};
use tokio::process::{Child, Command};
use tokio::time::Instant;

const SOON: Duration = Duration::from_secs(30);

/// A single etcd member of our own on free loopback ports, with a data
/// directory that goes with it.
struct PrivateEtcd {
    child: Child,
    dir: std::path::PathBuf,
    port: u16,
}

impl PrivateEtcd {
    /// `None` (a loud skip, or a panic under `QUORUMLOCK_TEST_REQUIRE=1`)
    /// when there is no etcd binary.
    async fn start() -> Option<PrivateEtcd> {
        let bin = std::env::var("QUORUMLOCK_ETCD_BIN").unwrap_or_else(|_| "/usr/bin/etcd".into());
        if !std::path::Path::new(&bin).exists() {
            let required = std::env::var("QUORUMLOCK_TEST_REQUIRE").is_ok_and(|v| v == "1");
            assert!(!required, "{bin} is missing and QUORUMLOCK_TEST_REQUIRE=1");
            eprintln!("SKIPPED: {bin} is missing (set QUORUMLOCK_ETCD_BIN)");
            return None;
        }
        let dir = std::env::temp_dir().join(format!("ql-etcd-auth-{}", uuid::Uuid::new_v4()));
        let (port, peer) = (free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new(&bin)
            .args(["--name", "auth", "--data-dir"])
            .arg(&dir)
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("auth={peer_url}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("starting etcd");
        let etcd = PrivateEtcd { child, dir, port };
        let start = Instant::now();
        loop {
            if let Ok(mut c) = Client::connect([etcd.endpoint()], None).await {
                if c.status().await.is_ok() {
                    return Some(etcd);
                }
            }
            assert!(start.elapsed() < SOON, "our etcd did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for PrivateEtcd {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn client_at(url: &str) -> LockClient {
    let url = quorumlock_core::url::parse(url).unwrap();
    LockClient::new(Arc::new(
        quorumlock_etcd::EtcdBackend::connect(&url).await.unwrap(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_watch_reaches_waiter_and_holder() {
    let Some(etcd) = PrivateEtcd::start().await else {
        return;
    };
    // root, and a user `locker` that may read and write `ns/`.
    let mut raw = Client::connect([etcd.endpoint()], None).await.unwrap();
    raw.user_add("root", "rootpw", None).await.unwrap();
    let _ = raw.role_add("root").await;
    raw.user_grant_role("root", "root").await.unwrap();
    raw.user_add("locker", "lockerpw", None).await.unwrap();
    raw.role_add("locker").await.unwrap();
    let perm = || Permission::read_write("ns/").with_prefix();
    raw.role_grant_permission("locker", perm()).await.unwrap();
    raw.user_grant_role("locker", "locker").await.unwrap();
    raw.auth_enable().await.unwrap();
    let opts = etcd_client::ConnectOptions::new().with_user("root", "rootpw");
    let mut root = Client::connect([etcd.endpoint()], Some(opts))
        .await
        .unwrap();

    let target: SocketAddr = etcd.endpoint().parse().unwrap();
    let proxy = TcpProxy::start(target).await.unwrap();
    let admin = client_at(&format!("etcd://root:rootpw@{}/ns", etcd.endpoint())).await;
    let ours = client_at(&format!(
        "etcd://locker:lockerpw@{}/ns?ttl=30s",
        proxy.addr()
    ))
    .await;

    // We hold `h` and wait for `w`; both watches are up.
    let held = ours.lock("h").unwrap().acquire().await.unwrap();
    let other = admin.lock("w").unwrap().acquire().await.unwrap();
    let c = ours.clone();
    let waiting = tokio::spawn(async move { c.lock("w").unwrap().acquire().await });
    let start = Instant::now();
    while admin.inspect("w").await.unwrap().waiters.is_empty() {
        assert!(start.elapsed() < SOON, "our waiter never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // No more read permission, and a new watch stream: etcd refuses
    // every create on it.
    root.role_revoke_permission(
        "locker",
        "ns/",
        Some(RoleRevokePermissionOptions::new().with_prefix()),
    )
    .await
    .unwrap();
    proxy.reset();
    tokio::time::sleep(Duration::from_millis(500)).await;
    other.release().await.unwrap();
    let e = tokio::time::timeout(SOON, waiting)
        .await
        .expect("the waiter hangs after its watch was refused")
        .unwrap()
        .expect_err("granted without read permission");
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(held.is_held(), "{:?}", held.loss());

    // The permission is back: the holder watches again, and a break is
    // reported.
    root.role_grant_permission("locker", perm()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(admin.break_lock("h").await.unwrap());
    let reason = tokio::time::timeout(SOON, held.lost())
        .await
        .expect("break not reported: the refused watch was never created again");
    assert_eq!(reason, LossReason::EntryDeleted);

    drop(held);
    ours.wait_idle().await;
    ours.close().await;
    admin.close().await;
}
