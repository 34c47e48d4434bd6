//! `connect()` against a real Consul: an unknown ACL token is refused
//! once and at once (a `consul agent -dev` with ACLs on and
//! `default_policy = "deny"`, started by this test on free ports from
//! `QUORUMLOCK_CONSUL_BIN`); `CONSUL_HTTP_TOKEN` supplies the token the
//! URL lacks; a backend over the caller's own `reqwest::Client` takes
//! locks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quorumlock_conformance::support::{env_or_skip as env, free_port, unique_namespace};
use quorumlock_consul::{ConsulBackend, ConsulConfig};
use quorumlock_core::backend::{Backend, Namespace};
use quorumlock_core::{ErrorKind, LockClient};
use tokio::process::{Child, Command};

const MASTER: &str = "7f3c1a52-5d2e-4e0b-9a51-0c6c2b1d9e01";

/// A dev agent of this test with ACLs denying by default; killed and its
/// data removed when dropped.
struct AclConsul {
    _child: Child,
    http: u16,
    _dir: tempfile::TempDir,
}

async fn start_acl_consul(bin: &str) -> AclConsul {
    let dir = tempfile::tempdir().unwrap();
    let http = free_port();
    let hcl = format!(
        r#"disable_update_check = true
acl {{
  enabled = true
  default_policy = "deny"
  tokens {{ master = "{MASTER}" }}
}}
ports {{
  http = {http}
  dns = -1
  grpc = -1
  serf_lan = {}
  serf_wan = {}
  server = {}
}}"#,
        free_port(),
        free_port(),
        free_port()
    );
    let child = Command::new(bin)
        .env("CHECKPOINT_DISABLE", "1")
        .args([
            "agent",
            "-dev",
            "-bind",
            "127.0.0.1",
            "-client",
            "127.0.0.1",
        ])
        .args(["-node", "quorumlock-acl-test"])
        .arg("-hcl")
        .arg(hcl)
        .arg(format!("-data-dir={}", dir.path().display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starting consul");
    // Up once it has a leader and the master token works.
    let http_client = reqwest::Client::new();
    for _ in 0..200 {
        let r = http_client
            .get(format!("http://127.0.0.1:{http}/v1/kv/probe"))
            .header("X-Consul-Token", MASTER)
            .send()
            .await;
        if let Ok(r) = r {
            if r.status().as_u16() == 404 || r.status().is_success() {
                return AclConsul {
                    _child: child,
                    http,
                    _dir: dir,
                };
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("consul with ACLs on {http} did not start");
}

async fn round_trip(client: &LockClient) {
    let g = client.lock("c").unwrap().acquire().await.unwrap();
    let state = client.inspect("c").await.unwrap();
    assert_eq!(state.holders.len(), 1, "{state:?}");
    g.release().await.unwrap();
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_token_is_refused_once() {
    let Some(bin) = env("QUORUMLOCK_CONSUL_BIN") else {
        return;
    };
    let consul = start_acl_consul(&bin).await;
    let start = Instant::now();
    let bogus = "00000000-1111-2222-3333-444444444444";
    let e = ConsulBackend::connect(format!(
        "consul://127.0.0.1:{}/{}?token={bogus}&connect_timeout=10s",
        consul.http,
        unique_namespace("qlconn")
    ))
    .await
    .expect_err("an unknown token was accepted");
    let took = start.elapsed();
    assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");
    assert!(!format!("{e} {e:?}").contains(bogus), "{e:?}");
    assert!(
        took < Duration::from_secs(3),
        "refused after {took:?}: retried"
    );

    // The token from CONSUL_HTTP_TOKEN, the address from CONSUL_HTTP_ADDR.
    let u =
        quorumlock_core::url::parse(&format!("consul:///{}", unique_namespace("qlconn"))).unwrap();
    let addr = format!("127.0.0.1:{}", consul.http);
    let cfg = ConsulConfig::from_url_with_env(&u, &|k| match k {
        "CONSUL_HTTP_TOKEN" => Some(MASTER.to_string()),
        "CONSUL_HTTP_ADDR" => Some(addr.clone()),
        _ => None,
    })
    .unwrap();
    let b = ConsulBackend::from_config(cfg).await.unwrap();
    assert_eq!(b.requests_sent(), 2, "status/leader and one read");
    round_trip(&LockClient::new(Arc::new(b))).await;
}

#[tokio::test]
async fn from_the_callers_client() {
    let Some(url) = env("QUORUMLOCK_TEST_CONSUL_URL") else {
        return;
    };
    let u = quorumlock_core::url::parse(&url).unwrap();
    let config = ConsulConfig::default()
        .with_host(u.host_str().unwrap().to_string())
        .with_port(u.port().unwrap_or(8500))
        .with_namespace(Namespace::new(&unique_namespace("qlconn")).unwrap());
    let theirs = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let b = ConsulBackend::from_client(theirs, config.clone())
        .await
        .unwrap();
    round_trip(&LockClient::new(Arc::new(b))).await;

    let b = ConsulBackend::from_config(
        config.with_namespace(Namespace::new(&unique_namespace("qlconn")).unwrap()),
    )
    .await
    .unwrap();
    round_trip(&LockClient::new(Arc::new(b))).await;
}
