//! The first acquire of a lock whose node does not exist yet creates the
//! lock node and our contender node in ONE transaction (and reads our
//! node's stat right behind it): one round trip, one log write, where it
//! took three round trips before (create + list, parents, create + list
//! again). These tests show, on a real server, the cost, that the grant
//! is right (ours is the only child, the token is its czxid), and that a
//! lock node made by someone else, or reaped behind our back, is handled.
//!
//! Needs `QUORUMLOCK_TEST_ZK_URL`.

use std::sync::Arc;

use backend_zk::{ZkBackend, ZkConfig};
use conformance_tests::{Case, Harness};
use lockcore::{ErrorKind, LockClient};
use zookeeper_client as zk;

fn harness() -> Option<Harness> {
    // Long sessions: no keepalive lands inside a counted window.
    Harness::from_env("QUORUMLOCK_TEST_ZK_URL", |url| async move {
        Ok(Arc::new(ZkBackend::connect(&url).await?) as _)
    })
    .map(|h| h.with_option("ttl", "60s"))
}

/// A plain client of the same server, rooted at the case's namespace.
async fn raw(case: &Case) -> zk::Client {
    let cfg = ZkConfig::from_url(&case.harness().url_for(case.namespace())).unwrap();
    zk::Client::connect(&cfg.connect_string()).await.unwrap()
}

/// The lock node of `entry` (a contender node's path) and its children.
async fn children_of(raw: &zk::Client, entry: &str) -> (String, Vec<String>) {
    let dir = entry.rsplit_once('/').unwrap().0.to_string();
    let children = raw.list_children(&dir).await.unwrap();
    (dir, children)
}

#[tokio::test]
async fn a_new_lock_is_one_transaction_and_one_read() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let client = case.client().await;
    let raw = raw(&case).await;
    // The namespace's nodes exist after a first lock.
    let _warm = client.lock("warm").unwrap().try_acquire().await.unwrap();
    let before = client.backend().requests_sent();
    let g = client.lock("fresh").unwrap().try_acquire().await.unwrap();
    let sent = client.backend().requests_sent() - before;
    assert_eq!(
        sent, 2,
        "a new lock should cost the transaction and the read of our node"
    );
    let (dir, children) = children_of(&raw, g.entry()).await;
    assert_eq!(
        children.len(),
        1,
        "ours should be the only child: {children:?}"
    );
    assert!(g.entry().ends_with(&children[0]));
    let (_, dir_stat) = raw.get_data(&dir).await.unwrap();
    let (_, ours) = raw.get_data(g.entry()).await.unwrap();
    assert_eq!(
        g.token(),
        ours.czxid as u64,
        "the token is our node's czxid"
    );
    assert_eq!(dir_stat.czxid, ours.czxid, "one transaction made both");
    g.release().await.unwrap();
    case.finish().await;
}

#[tokio::test]
async fn a_lock_node_made_by_someone_else_is_joined() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let client = case.client().await;
    let raw = raw(&case).await;
    let warm = client.lock("warm").unwrap().try_acquire().await.unwrap();
    // Another party (Curator's layout) made the lock node and holds it.
    let opts = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    let (warm_dir, _) = warm.entry().rsplit_once('/').unwrap();
    let dir = format!("{}/theirs", warm_dir.rsplit_once('/').unwrap().0);
    let dir = dir.as_str();
    raw.create(dir, &[], &opts).await.unwrap();
    let theirs = format!("{dir}/_c_{}-lock-", uuid::Uuid::new_v4().hyphenated());
    let eph = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let (_, seq) = raw.create(&theirs, b"", &eph).await.unwrap();
    let err = client
        .lock("theirs")
        .unwrap()
        .try_acquire()
        .await
        .expect_err("the other party holds it");
    assert_eq!(err.kind(), ErrorKind::WouldBlock);
    raw.delete(&format!("{theirs}{seq}"), None).await.unwrap();
    let g = client.lock("theirs").unwrap().try_acquire().await.unwrap();
    let (_, children) = children_of(&raw, g.entry()).await;
    assert_eq!(children.len(), 1, "{children:?}");
    g.release().await.unwrap();
    case.finish().await;
}

#[tokio::test]
async fn a_lock_node_reaped_behind_our_back_is_made_again() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let client = case.client().await;
    let other: LockClient = case.client().await;
    let raw = raw(&case).await;
    let _warm = client.lock("warm").unwrap().try_acquire().await.unwrap();
    // Taken by another session (no repeat-acquire memory of ours), then
    // the empty lock node goes, as the container reaper would do it.
    let g = other.lock("reaped").unwrap().try_acquire().await.unwrap();
    let entry = g.entry().to_string();
    let g2 = client.lock("reaped").unwrap().try_acquire().await;
    assert_eq!(g2.expect_err("held").kind(), ErrorKind::WouldBlock);
    g.release().await.unwrap();
    let dir = entry.rsplit_once('/').unwrap().0;
    raw.delete(dir, None).await.unwrap();
    let g = client.lock("reaped").unwrap().try_acquire().await.unwrap();
    let (_, children) = children_of(&raw, g.entry()).await;
    assert_eq!(children.len(), 1, "{children:?}");
    g.release().await.unwrap();
    case.finish().await;
}
