//! `connect()` against a real etcd: wrong credentials are refused once and
//! at once (an etcd with auth enabled, started by this test on free
//! ports: `/usr/bin/etcd` or `QUORUMLOCK_ETCD_BIN`, and
//! `QUORUMLOCK_ETCDCTL`); `ETCDCTL_USER` supplies credentials the URL
//! lacks; a backend over the caller's own `etcd_client::Client` takes
//! locks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use quorumlock_conformance::support::{env_or_skip as env, free_port, unique_namespace};
use quorumlock_core::backend::{Backend, Namespace};
use quorumlock_core::{ClientOptions, ErrorKind, LockClient};
use quorumlock_etcd::{EtcdBackend, EtcdConfig};
use tokio::process::{Child, Command};

/// An etcd of this test with user `root` (password `right-pw`) and auth
/// enabled; killed and its data removed when dropped.
struct AuthEtcd {
    _child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

async fn start_auth_etcd(etcdctl: &str) -> AuthEtcd {
    let bin = std::env::var("QUORUMLOCK_ETCD_BIN").unwrap_or_else(|_| "/usr/bin/etcd".into());
    let (port, peer) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let client_url = format!("http://127.0.0.1:{port}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new(bin)
        .arg("--name=auth")
        .arg(format!("--data-dir={}", dir.path().display()))
        .arg(format!("--listen-client-urls={client_url}"))
        .arg(format!("--advertise-client-urls={client_url}"))
        .arg(format!("--listen-peer-urls={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster=auth={peer_url}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starting etcd");
    let ctl = |args: &[&str]| {
        std::process::Command::new(etcdctl)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={client_url}"))
            .args(args)
            .output()
            .expect("running etcdctl")
    };
    let mut up = false;
    for _ in 0..100 {
        if ctl(&["endpoint", "health"]).status.success() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(up, "etcd on {port} did not start");
    for args in [
        &["user", "add", "root:right-pw"][..],
        &["auth", "enable"][..],
    ] {
        let out = ctl(args);
        assert!(out.status.success(), "etcdctl {args:?}: {out:?}");
    }
    AuthEtcd {
        _child: child,
        port,
        _dir: dir,
    }
}

async fn round_trip(client: &LockClient) {
    let g = client.lock("c").unwrap().acquire().await.unwrap();
    let state = client.inspect("c").await.unwrap();
    assert_eq!(state.holders.len(), 1, "{state:?}");
    g.release().await.unwrap();
    client.close().await;
}

#[tokio::test]
async fn wrong_credentials_are_refused_once() {
    let Some(etcdctl) = env("QUORUMLOCK_ETCDCTL") else {
        return;
    };
    let etcd = start_auth_etcd(&etcdctl).await;
    let start = Instant::now();
    let e = EtcdBackend::connect(format!(
        "etcd://root:wrong-pw@127.0.0.1:{}/{}?connect_timeout=10s",
        etcd.port,
        unique_namespace("qlconn")
    ))
    .await
    .expect_err("a wrong password was accepted");
    let took = start.elapsed();
    assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");
    assert!(!format!("{e} {e:?}").contains("wrong-pw"), "{e:?}");
    assert!(
        took < Duration::from_secs(3),
        "refused after {took:?}: retried"
    );

    // Credentials from ETCDCTL_USER, as etcdctl takes them.
    let u = quorumlock_core::url::parse(&format!(
        "etcd://127.0.0.1:{}/{}",
        etcd.port,
        unique_namespace("qlconn")
    ))
    .unwrap();
    let cfg = EtcdConfig::from_url_with_env(&u, &|k| {
        (k == "ETCDCTL_USER").then(|| "root:right-pw".to_string())
    })
    .unwrap();
    assert_eq!(cfg.user.as_deref(), Some("root"));
    let b = EtcdBackend::from_config(cfg).await.unwrap();
    assert_eq!(b.requests_sent(), 2, "one Authenticate, one Status");
    round_trip(&LockClient::new(Arc::new(b))).await;
}

#[tokio::test]
async fn from_the_callers_client_and_from_setters() {
    let Some(url) = env("QUORUMLOCK_TEST_ETCD_URL") else {
        return;
    };
    let u = quorumlock_core::url::parse(&url).unwrap();
    let endpoint = format!(
        "http://{}:{}",
        u.host_str().unwrap(),
        u.port().unwrap_or(2379)
    );
    let theirs = etcd_client::Client::connect([endpoint.clone()], None)
        .await
        .unwrap();
    let config =
        EtcdConfig::default().with_namespace(Namespace::new(&unique_namespace("qlconn")).unwrap());
    let b = EtcdBackend::from_client(theirs, config).await.unwrap();
    round_trip(&LockClient::new(Arc::new(b))).await;

    let config = EtcdConfig::default()
        .with_endpoints(vec![endpoint])
        .with_namespace(Namespace::new(&unique_namespace("qlconn")).unwrap())
        .with_ttl(Duration::from_secs(3))
        .with_connect_timeout(Duration::from_secs(3));
    let b = EtcdBackend::from_config(config).await.unwrap();
    assert!(b.describe().contains("127.0.0.1"), "{}", b.describe());
    round_trip(&LockClient::new(Arc::new(b))).await;
}

/// A port where nothing listens.
fn dead_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

/// `lazy=true` with credentials sends nothing at connect, by URL and by
/// typed config: `connect()` returns at once (it used to authenticate
/// inside etcd-client's connect, waiting out `connect_timeout` and failing
/// `Unavailable` on a dead port), and the first acquire then gives up with
/// `Unavailable` as a non-lazy connect does (issue 45).
#[tokio::test]
async fn lazy_with_credentials_sends_nothing_at_connect() {
    let port = dead_port();
    let url = format!("etcd://root:pw@127.0.0.1:{port}/ns?lazy=true&connect_timeout=3s");
    let typed = EtcdConfig::default()
        .with_endpoints(vec![format!("http://127.0.0.1:{port}")])
        .with_user(Some("root".into()))
        .with_password(Some(quorumlock_core::url::Secret::new("pw")))
        .with_connect_timeout(Duration::from_secs(3))
        .with_lazy(true);
    for (how, connect) in [
        ("url", EtcdBackend::connect(url.clone()).boxed()),
        ("typed config", EtcdBackend::from_config(typed).boxed()),
    ] {
        let start = Instant::now();
        let b = tokio::time::timeout(Duration::from_secs(5), connect)
            .await
            .unwrap_or_else(|_| panic!("{how}: a lazy connect still waits"))
            .unwrap_or_else(|e| panic!("{how}: a lazy connect failed: {e}"));
        let took = start.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "{how}: a lazy connect took {took:?}"
        );
        assert_eq!(b.requests_sent(), 0, "{how}: a lazy connect sent something");
        let client = LockClient::with_options(
            Arc::new(b),
            ClientOptions::default().with_unavailable_after(Some(Duration::from_secs(1))),
        );
        let e = tokio::time::timeout(Duration::from_secs(10), client.lock("c").unwrap().acquire())
            .await
            .unwrap_or_else(|_| panic!("{how}: the first acquire never gave up"))
            .expect_err("acquired on a dead port");
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{how}: {e}");
        assert!(!format!("{e} {e:?}").contains(":pw"), "{e:?}");
        client.close().await;
    }
    // Not lazy: the connect itself fails so.
    let e =
        EtcdBackend::connect(url.replace("lazy=true&connect_timeout=3s", "connect_timeout=500ms"))
            .await
            .expect_err("connected to a dead port");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
}

/// On an etcd with auth: a lazy backend authenticates with its first
/// request, not at connect; right credentials take locks, wrong ones fail
/// the first acquire with `Unauthenticated`, at once (issue 45).
#[tokio::test]
async fn lazy_credentials_are_checked_on_first_use() {
    let Some(etcdctl) = env("QUORUMLOCK_ETCDCTL") else {
        return;
    };
    let etcd = start_auth_etcd(&etcdctl).await;
    let at = |pw: &str| {
        format!(
            "etcd://root:{pw}@127.0.0.1:{}/{}?lazy=true",
            etcd.port,
            unique_namespace("qlconn")
        )
    };
    let b = EtcdBackend::connect(at("right-pw")).await.unwrap();
    assert_eq!(b.requests_sent(), 0, "a lazy connect sent something");
    round_trip(&LockClient::new(Arc::new(b))).await;

    let b = EtcdBackend::connect(at("wrong-pw")).await.unwrap();
    assert_eq!(b.requests_sent(), 0, "a lazy connect sent something");
    let client = LockClient::new(Arc::new(b));
    let start = Instant::now();
    let e = client
        .lock("c")
        .unwrap()
        .acquire()
        .await
        .expect_err("a wrong password was accepted");
    assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");
    assert!(!format!("{e} {e:?}").contains("wrong-pw"), "{e:?}");
    assert!(start.elapsed() < Duration::from_secs(3), "retried");
    client.close().await;
}
