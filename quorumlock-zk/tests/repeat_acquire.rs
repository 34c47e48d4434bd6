//! The short paths of an acquire, on a real server.
//!
//! A repeat acquire of a lock this session last found free sends only the
//! create (no listing): the cycle costs what the floor costs. These tests
//! show that it is used, and that it never grants while someone else has
//! a node: not after a create between our cycles, and not when the
//! (container) parent was deleted and made again with the sequence count
//! where ours left off.
//!
//! The first acquire of a lock whose node does not exist yet creates the
//! lock node and our contender node in ONE transaction (and reads our
//! node's stat right behind it): one round trip, one log write, where it
//! took three round trips before (create + list, parents, create + list
//! again). These tests show the cost, that the grant is right (ours is
//! the only child, the token is its czxid), and that a lock node made by
//! someone else, or reaped behind our back, is handled.
//!
//! Needs `QUORUMLOCK_TEST_ZK_URL`.

use std::sync::Arc;

use quorumlock_conformance::{Case, Harness};
use quorumlock_core::{ErrorKind, LockClient};
use quorumlock_zk::{ZkBackend, ZkConfig};
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
