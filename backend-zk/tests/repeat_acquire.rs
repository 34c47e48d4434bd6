//! A repeat acquire of a lock this session last found free sends only the
//! create (no listing): the cycle costs what the floor costs. These tests
//! show, on a real server, that it is used, and that it never grants
//! while someone else has a node: not after a create between our cycles,
//! and not when the (container) parent was deleted and made again with
//! the sequence count where ours left off.
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

/// A plain client of the same server, for the other party.
async fn raw(case: &Case) -> zk::Client {
    let cfg = ZkConfig::from_url(&case.harness().url_for(case.namespace())).unwrap();
    zk::Client::connect(&cfg.connect_string()).await.unwrap()
}

/// Takes and gives back `name` `n` times; the path of the last node.
async fn cycles(client: &LockClient, name: &str, n: usize) -> String {
    let lock = client.lock(name).unwrap();
    let mut last = String::new();
    for _ in 0..n {
        let g = lock.try_acquire().await.unwrap();
        last = g.entry().to_string();
        g.release().await.unwrap();
    }
    last
}

fn split(node: &str) -> (&str, &str) {
    node.rsplit_once('/').unwrap()
}

#[tokio::test]
async fn repeat_cycles_send_one_create_and_one_delete() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let client = case.client().await;
    // 1st cycle: create + listing; 2nd: also arms the parent watch.
    cycles(&client, "repeat", 2).await;
    let before = client.backend().requests_sent();
    cycles(&client, "repeat", 20).await;
    let sent = client.backend().requests_sent() - before;
    assert_eq!(
        sent, 40,
        "20 repeat cycles should be 20 creates and 20 deletes"
    );
    case.finish().await;
}

#[tokio::test]
async fn a_node_created_between_our_cycles_is_seen() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let ours = case.client().await;
    let theirs = case.client().await;
    cycles(&ours, "between", 3).await;
    // Another session takes the lock between our cycles.
    let held = theirs.lock("between").unwrap().try_acquire().await.unwrap();
    let err = ours
        .lock("between")
        .unwrap()
        .try_acquire()
        .await
        .expect_err("the other session holds it");
    assert_eq!(err.kind(), ErrorKind::WouldBlock);
    held.release().await.unwrap();
    // And we are back to one create per cycle afterwards.
    cycles(&ours, "between", 2).await;
    let before = ours.backend().requests_sent();
    cycles(&ours, "between", 5).await;
    assert_eq!(ours.backend().requests_sent() - before, 10);
    case.finish().await;
}

#[tokio::test]
async fn a_parent_made_anew_with_the_same_count_is_seen() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let ours = case.client().await;
    let last = cycles(&ours, "anew", 3).await;
    let (dir, name) = split(&last);
    let seq: usize = name[name.len() - 10..].parse().unwrap();
    // The parent is a container: the server reaps it once empty, and a
    // Curator client may make it again. Do both by hand, and bring the
    // fresh parent's count to where ours left off, keeping a holder.
    let other = raw(&case).await;
    other.delete(dir, None).await.unwrap();
    let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    other.create(dir, &[], &container).await.unwrap();
    let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let prefix = format!("{dir}/_c_{}-lock-", uuid::Uuid::new_v4().hyphenated());
    let mut made = Vec::new();
    for _ in 0..=seq {
        let (_, s) = other.create(&prefix, &[], &ephemeral).await.unwrap();
        made.push(format!("{prefix}{s}"));
    }
    for node in &made[1..] {
        other.delete(node, None).await.unwrap();
    }
    // Our next node gets the number after our last one, yet the other
    // client holds the lock.
    let lock = ours.lock("anew").unwrap();
    let err = lock
        .try_acquire()
        .await
        .expect_err("the other client holds it");
    assert_eq!(err.kind(), ErrorKind::WouldBlock);
    let state = lock.inspect().await.unwrap();
    assert_eq!(state.holders.len(), 1);
    // Our node did get that number: the next one is one past it.
    let (_, next) = other.create(&prefix, &[], &ephemeral).await.unwrap();
    assert_eq!(next.into_i64() as usize, seq + 2);
    other
        .delete(&format!("{prefix}{next}"), None)
        .await
        .unwrap();
    other.delete(&made[0], None).await.unwrap();
    case.finish().await;
}
