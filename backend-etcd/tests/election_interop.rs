//! `etcdctl elect` (Go's `concurrency.Election`) and our elections on the
//! same name are one election: never two leaders at once, each sees the
//! other's leader value (`etcdctl elect -l` prints ours, our `leader()`
//! reads etcdctl's proposal), and a resign hands over across the two.
//!
//! Runs against etcd 3.4 and 3.5 with their own etcdctl, as `interop.rs`.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use conformance_tests::Harness;
use lockcore::url::Url;
use lockcore::ErrorKind;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

struct Target {
    harness: Harness,
    etcdctl: String,
}

fn target(url_var: &str, etcdctl_var: &str) -> Option<Target> {
    let harness = Harness::from_env(url_var, |url| async move {
        Ok(Arc::new(backend_etcd::EtcdBackend::connect(&url).await?) as _)
    })?;
    let etcdctl = std::env::var(etcdctl_var)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "etcdctl".to_string());
    Some(Target { harness, etcdctl })
}

macro_rules! election_tests {
    ($url_var:literal, $etcdctl_var:literal) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn etcdctl_elect_and_ours_are_one_election() {
            let Some(t) = super::target($url_var, $etcdctl_var) else {
                return;
            };
            super::one_election(&t).await;
        }
    };
}

mod etcd34 {
    election_tests!("QUORUMLOCK_TEST_ETCD_URL", "QUORUMLOCK_ETCDCTL");
}

mod etcd35 {
    election_tests!("QUORUMLOCK_TEST_ETCD35_URL", "QUORUMLOCK_ETCDCTL35");
}

/// `etcdctl <args>` against the store of `url`, stdout piped.
fn etcdctl(bin: &str, url: &Url) -> Command {
    let config = backend_etcd::EtcdConfig::from_url(url).expect("test URL");
    let mut cmd = Command::new(bin);
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", config.endpoints.join(",")))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    cmd
}

fn election_key(url: &Url, name: &str) -> String {
    let ns = backend_etcd::EtcdConfig::from_url(url)
        .expect("test URL")
        .namespace
        .to_string();
    format!("{ns}/{name}")
}

fn spawn_lines(mut cmd: Command) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = cmd.spawn().expect("spawn etcdctl");
    let out = child.stdout.take().expect("piped stdout");
    (child, BufReader::new(out).lines())
}

/// The next line within `limit`, `None` if there was none by then.
async fn line_within(lines: &mut Lines<BufReader<ChildStdout>>, limit: Duration) -> Option<String> {
    match tokio::time::timeout(limit, lines.next_line()).await {
        Ok(Ok(Some(l))) => Some(l),
        Ok(_) => panic!("etcdctl's output ended"),
        Err(_) => None,
    }
}

/// SIGINT: `etcdctl elect` resigns and exits on it.
async fn interrupt(child: &mut Child) {
    let pid = child.id().expect("running").to_string();
    let ok = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .await
        .expect("kill");
    assert!(ok.success());
    tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("etcdctl elect did not exit on SIGINT")
        .unwrap();
}

async fn one_election(t: &Target) {
    let h = &t.harness;
    let case = h.case();
    let url = h.url_for(case.namespace());
    let (ours, other) = (case.client().await, case.client().await);
    let key = election_key(&url, "leader");
    let election = ours.election("leader").unwrap();

    // 1. We lead; etcdctl campaigns behind us and is not elected.
    let leader = election.campaign("ours-1").await.unwrap();
    let mut cmd = etcdctl(&t.etcdctl, &url);
    cmd.args(["elect", &key, "etcdctl-1"]);
    let (mut theirs, mut their_out) = spawn_lines(cmd);
    tokio::time::timeout(Duration::from_secs(20), async {
        while other.inspect("leader").await.unwrap().waiters.len() != 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("etcdctl's candidate never queued behind ours");
    assert_eq!(
        line_within(&mut their_out, Duration::from_millis(1500)).await,
        None,
        "etcdctl elected while we lead"
    );

    // 2. `etcdctl elect -l` sees our leader and its value.
    let mut cmd = etcdctl(&t.etcdctl, &url);
    cmd.args(["elect", "-l", &key]);
    let (mut listener, mut listen_out) = spawn_lines(cmd);
    let k = line_within(&mut listen_out, Duration::from_secs(20))
        .await
        .expect("etcdctl elect -l printed no leader");
    let v = line_within(&mut listen_out, Duration::from_secs(5))
        .await
        .expect("etcdctl elect -l printed no value");
    assert!(k.starts_with(&format!("{key}/")), "{k}");
    assert_eq!(v, "ours-1", "etcdctl elect -l does not see our value");

    // 3. We resign: etcdctl leads, prints its key and value; everyone
    // (our leader(), the listener) sees its proposal.
    leader.resign().await.unwrap();
    let elected = line_within(&mut their_out, Duration::from_secs(20))
        .await
        .expect("etcdctl not elected after our resign");
    assert!(elected.starts_with(&format!("{key}/")), "{elected}");
    let now = other
        .election("leader")
        .unwrap()
        .leader()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(now.value, b"etcdctl-1");
    let mut seen = Vec::new();
    while let Some(l) = line_within(&mut listen_out, Duration::from_secs(10)).await {
        seen.push(l);
        if seen.last().map(String::as_str) == Some("etcdctl-1") {
            break;
        }
    }
    assert_eq!(
        seen.last().map(String::as_str),
        Some("etcdctl-1"),
        "{seen:?}"
    );

    // 4. While etcdctl leads, ours waits; when it resigns, ours leads.
    let e = election.clone();
    let next = tokio::spawn(async move { e.campaign("ours-2").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!next.is_finished(), "two leaders at once");
    assert_eq!(
        election
            .campaign_timeout("x", Duration::from_millis(200))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::Timeout
    );
    interrupt(&mut theirs).await;
    let g = tokio::time::timeout(Duration::from_secs(20), next)
        .await
        .expect("ours not elected after etcdctl resigned")
        .unwrap()
        .unwrap();
    assert!(g.token() > now.token);
    let mut seen = Vec::new();
    while let Some(l) = line_within(&mut listen_out, Duration::from_secs(10)).await {
        seen.push(l);
        if seen.last().map(String::as_str) == Some("ours-2") {
            break;
        }
    }
    assert_eq!(seen.last().map(String::as_str), Some("ours-2"), "{seen:?}");
    g.resign().await.unwrap();
    listener.kill().await.unwrap();
    case.finish().await;
}
