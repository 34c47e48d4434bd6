//! TLS to ZooKeeper's `secureClientPort` (the TLS test server requires a
//! client certificate) and digest auth on an ACL'd namespace.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quorumlock_conformance::tls;
use quorumlock_core::{ErrorKind, LockClient};
use zookeeper_client as zk;

async fn connect(
    url: String,
) -> quorumlock_core::Result<Arc<dyn quorumlock_core::backend::Backend>> {
    Ok(Arc::new(quorumlock_zk::ZkBackend::connect(&url).await?) as _)
}

quorumlock_conformance::tls_suite!("QUORUMLOCK_TEST_ZK_TLS_URL", connect);

/// A namespace node that only `alice` (digest auth) may create children
/// in: a client without credentials is refused at once
/// (`PermissionDenied`, not retried), one with `alice:...@` locks.
#[tokio::test]
async fn digest_auth_opens_an_acld_namespace() {
    let Some(base) = std::env::var("QUORUMLOCK_TEST_ZK_URL")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        assert!(
            std::env::var("QUORUMLOCK_TEST_REQUIRE").as_deref() != Ok("1"),
            "QUORUMLOCK_TEST_ZK_URL is not set and QUORUMLOCK_TEST_REQUIRE=1"
        );
        eprintln!("SKIPPED: QUORUMLOCK_TEST_ZK_URL is not set");
        return;
    };
    let ns = tls::namespace();
    // A password with characters that must be percent-encoded in the URL.
    let (user, pw, pw_in_url) = ("alice", "p@ss:w/rd", "p%40ss%3Aw%2Frd");
    let hostport = base.trim_start_matches("zk://");
    let admin = zk::Client::connector()
        .with_auth("digest", format!("{user}:{pw}").as_bytes())
        .connect(hostport)
        .await
        .expect("admin connect");
    admin
        .create(
            &format!("/{ns}"),
            b"",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::creator_all()),
        )
        .await
        .expect("create the ACL'd namespace");

    // No credentials: refused, typed, fast.
    let anon = quorumlock_zk::ZkBackend::connect(format!("{base}/{ns}"))
        .await
        .expect("connecting needs no permission");
    let client = LockClient::new(Arc::new(anon));
    let start = Instant::now();
    let e = client
        .lock("x")
        .unwrap()
        .acquire_timeout(Duration::from_secs(20))
        .await
        .expect_err("an anonymous client created a node in alice's namespace");
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    client.close().await;

    // Wrong password: refused too (ZooKeeper accepts any digest login and
    // checks it against the ACL).
    let wrong = quorumlock_zk::ZkBackend::connect(format!("zk://{user}:nope@{hostport}/{ns}"))
        .await
        .expect("connect");
    let client = LockClient::new(Arc::new(wrong));
    let e = client
        .lock("x")
        .unwrap()
        .try_acquire()
        .await
        .expect_err("wrong password");
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    client.close().await;

    // alice: locks, and her password shows nowhere.
    let url = format!("zk://{user}:{pw_in_url}@{hostport}/{ns}");
    let b = quorumlock_zk::ZkBackend::connect(&url)
        .await
        .expect("alice connects");
    let shown = format!("{:?} {}", b.config(), b.config().display);
    assert!(
        !shown.contains("ss:w") && !shown.contains(pw_in_url),
        "{shown}"
    );
    let client = LockClient::new(Arc::new(b));
    let g = client
        .lock("x")
        .unwrap()
        .acquire()
        .await
        .expect("alice locks");
    g.release().await.unwrap();
    client.close().await;

    // Clean up (the lock's container node may linger a while).
    for _ in 0..20 {
        for child in admin
            .list_children(&format!("/{ns}"))
            .await
            .unwrap_or_default()
        {
            let _ = admin.delete(&format!("/{ns}/{child}"), None).await;
        }
        if admin.delete(&format!("/{ns}"), None).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
