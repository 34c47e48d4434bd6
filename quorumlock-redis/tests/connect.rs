//! `connect()` against a real Redis: a wrong password is refused once and
//! at once (a `redis-server --requirepass` of this test, the binary from
//! `QUORUMLOCK_REDIS_SERVER`); `REDISCLI_AUTH` supplies a password the URL
//! lacks; a backend over the caller's own `redis::Client` takes locks.

use std::time::{Duration, Instant};

use quorumlock_conformance::support::{env_or_skip as env, free_port, unique_namespace};
use quorumlock_core::backend::Namespace;
use quorumlock_core::{ErrorKind, LockClient};
use quorumlock_redis::{RedisBackend, RedisConfig};
use tokio::process::{Child, Command};

/// A `redis-server --requirepass` on a free port, killed when dropped.
struct Server {
    _child: Child,
    port: u16,
}

async fn start(bin: &str, password: &str) -> Server {
    let port = free_port();
    let child = Command::new(bin)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(["--requirepass", password])
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starting redis-server");
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Server {
                _child: child,
                port,
            };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("redis-server on {port} did not start");
}

async fn connections_received(port: u16) -> u64 {
    let c = redis::Client::open(format!("redis://:right-pw@127.0.0.1:{port}/")).unwrap();
    let mut conn = c.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .expect("INFO stats")
        .trim()
        .parse()
        .unwrap()
}

async fn round_trip(client: &LockClient) {
    let g = client.lock("c").unwrap().acquire().await.unwrap();
    let state = client.inspect("c").await.unwrap();
    assert_eq!(state.holders.len(), 1, "{state:?}");
    g.release().await.unwrap();
    client.close().await;
}

#[tokio::test]
async fn wrong_password_is_refused_once() {
    let Some(bin) = env("QUORUMLOCK_REDIS_SERVER") else {
        return;
    };
    let server = start(&bin, "right-pw").await;
    let before = connections_received(server.port).await;
    let start = Instant::now();
    let e = RedisBackend::connect(format!(
        "redis://:wrong-pw@127.0.0.1:{}/{}?connect_timeout=10s",
        server.port,
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
    // One for the attempt, one for our own INFO connection.
    let attempts = connections_received(server.port).await - before - 1;
    assert!(
        attempts <= 1,
        "{attempts} connections for one refused connect"
    );

    // No password at all: NOAUTH on the PING, refused as well.
    let e = RedisBackend::connect(format!("redis://127.0.0.1:{}/x", server.port))
        .await
        .expect_err("no password was accepted");
    assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");

    // The password from REDISCLI_AUTH, as redis-cli takes it.
    let u = quorumlock_core::url::parse(&format!(
        "redis://127.0.0.1:{}/{}",
        server.port,
        unique_namespace("qlconn")
    ))
    .unwrap();
    let cfg = RedisConfig::from_url_with_env(&u, &|k| {
        (k == "REDISCLI_AUTH").then(|| "right-pw".to_string())
    })
    .unwrap();
    let client = LockClient::new(std::sync::Arc::new(
        RedisBackend::from_config(cfg).await.unwrap(),
    ));
    round_trip(&client).await;
}

#[tokio::test]
async fn from_the_callers_client_and_from_setters() {
    let Some(url) = env("QUORUMLOCK_TEST_REDIS_URL") else {
        return;
    };
    let u = quorumlock_core::url::parse(&url).unwrap();
    let plain = format!(
        "redis://{}:{}/",
        u.host_str().unwrap(),
        u.port().unwrap_or(6379)
    );
    let theirs = redis::Client::open(plain).unwrap();
    let config =
        RedisConfig::default().with_namespace(Namespace::new(&unique_namespace("qlconn")).unwrap());
    let b = RedisBackend::from_client(theirs, config).await.unwrap();
    round_trip(&LockClient::new(std::sync::Arc::new(b))).await;

    let config = RedisConfig::default()
        .with_host(u.host_str().unwrap().to_string())
        .with_port(u.port().unwrap_or(6379))
        .with_namespace(Namespace::new(&unique_namespace("qlconn")).unwrap())
        .with_ttl(Duration::from_secs(3))
        .with_timeout(Duration::from_secs(1));
    let b = RedisBackend::from_config(config).await.unwrap();
    round_trip(&LockClient::new(std::sync::Arc::new(b))).await;
}
