//! One ZooKeeper connection per client: admin work (inspect, break,
//! fenced writes) runs on the lock session's connection while it is open,
//! and the session opened by `connect()`'s check becomes the first lock
//! session. ZooKeeper takes 60 connections per client address by default
//! (`maxClientCnxns`, left at its default by scripts/stores.sh): with two
//! connections per client, 40 clients on one host could not all connect.

use std::sync::Arc;
use std::time::Duration;

use quorumlock_core::LockClient;

/// The tests of this file run one at a time: the first counts the
/// server's connections.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn base_url() -> Option<String> {
    match std::env::var("QUORUMLOCK_TEST_ZK_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ if std::env::var("QUORUMLOCK_TEST_REQUIRE").is_ok_and(|v| v == "1") => {
            panic!("QUORUMLOCK_TEST_ZK_URL is not set and QUORUMLOCK_TEST_REQUIRE=1")
        }
        _ => {
            eprintln!("SKIPPED: QUORUMLOCK_TEST_ZK_URL is not set");
            None
        }
    }
}

/// The server's URL and a fresh namespace's under it, with this file's
/// turn held; `None` where no server is given.
async fn serial_namespace() -> Option<(String, String, tokio::sync::MutexGuard<'static, ()>)> {
    let base = base_url()?;
    let serial = SERIAL.lock().await;
    let ns = format!("qlcnx-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    Some((base, ns, serial))
}

/// An observer of election `name` and its first report (nobody leads).
async fn observing(
    client: &LockClient,
    name: &str,
) -> std::pin::Pin<
    Box<impl futures::Stream<Item = quorumlock_core::Result<Option<quorumlock_core::Leader>>>>,
> {
    use futures::StreamExt;
    let mut observed = Box::pin(client.election(name).unwrap().observe());
    let first = tokio::time::timeout(Duration::from_secs(30), observed.next())
        .await
        .expect("the observer reported nothing")
        .expect("the observer ended")
        .expect("the observer failed");
    assert!(first.is_none(), "a leader nobody elected: {first:?}");
    observed
}

/// The server's open client connections (`mntr`'s
/// `zk_num_alive_connections`).
async fn alive_connections(url: &str) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url
        .trim_start_matches("zk://")
        .split(['/', '?'])
        .next()
        .unwrap()
        .to_string();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"mntr").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.lines()
        .find_map(|l| l.strip_prefix("zk_num_alive_connections"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no zk_num_alive_connections in mntr: {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_clients_on_one_host_each_hold_one_connection() {
    let Some((base, ns, _serial)) = serial_namespace().await else {
        return;
    };
    let url = format!("{base}/{ns}");
    let before = alive_connections(&base).await;
    let mut clients = Vec::new();
    for i in 0..40 {
        let backend = quorumlock_zk::ZkBackend::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("client {i} of 40 could not connect: {e}"));
        clients.push(LockClient::new(Arc::new(backend)));
    }
    let mut guards = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let g = c
            .lock(format!("l{i}"))
            .unwrap()
            .acquire_timeout(Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("client {i} of 40 could not acquire: {e}"));
        guards.push(g);
    }
    // Admin work while the locks are held: on the lock sessions.
    let state = clients[0].inspect("l1").await.unwrap();
    assert_eq!(state.holders.len(), 1, "{state:?}");
    let during = alive_connections(&base).await;
    // Other test binaries do not run at once, nor this file's other test.
    assert!(
        during <= before + 40,
        "40 clients holding a lock each: {during} connections open, {before} before"
    );
    for g in guards {
        g.release().await.unwrap();
    }
    for c in &clients {
        c.close().await;
    }
}

/// A value over the server's `jute.maxbuffer` would make ZooKeeper close
/// the connection, which is the lock session's: refused before anything
/// is sent, and the lock stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_fenced_value_is_refused_and_the_hold_survives() {
    let Some((base, ns, _serial)) = serial_namespace().await else {
        return;
    };
    let backend = quorumlock_zk::ZkBackend::connect(format!("{base}/{ns}"))
        .await
        .unwrap();
    let client = LockClient::new(Arc::new(backend));
    let guard = client.lock("big").unwrap().acquire().await.unwrap();
    let key = format!("{ns}-data/big");
    let e = guard
        .fenced_put(&key, vec![7u8; 1_100_000]) // over the default jute.maxbuffer (1 MiB)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), quorumlock_core::ErrorKind::InvalidArgument, "{e}");
    guard
        .fenced_put(&key, vec![7u8; 1000])
        .await
        .unwrap_or_else(|e| panic!("a small write after the refused one: {e}"));
    assert!(guard.is_held());
    guard.fenced_delete(&key).await.unwrap();
    guard.release().await.unwrap();
    client.close().await;
}

/// An admin call that waits (`leftovers` waits for the backend's sessions
/// to end) runs on an admin session of its own: run on the lock
/// session's connection, its clone of the client kept that session open
/// through the client's `close()`, which then waited, and `leftovers`
/// reported the session it was holding open itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_admin_call_does_not_hold_the_lock_session_open() {
    let Some((base, ns, _serial)) = serial_namespace().await else {
        return;
    };
    let backend = Arc::new(
        quorumlock_zk::ZkBackend::connect(format!("{base}/{ns}"))
            .await
            .unwrap(),
    );
    let client = LockClient::new(backend.clone());
    let guard = client.lock("x").unwrap().acquire().await.unwrap();
    guard.release().await.unwrap();
    // `leftovers` finds no node, then waits for the open lock session
    // to end; the client closes meanwhile.
    let leftovers = {
        let b = backend.clone();
        tokio::spawn(async move { quorumlock_core::backend::Backend::leftovers(b.as_ref()).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = tokio::time::Instant::now();
    client.close().await;
    let took = started.elapsed();
    let left = leftovers.await.unwrap().unwrap();
    assert!(left.is_empty(), "left after close: {left:?}");
    assert!(took < Duration::from_secs(2), "close took {took:?}");
}

/// An observer watches on the connection its client has already (the
/// admin session's): 20 clients each reading and observing an election
/// hold 20 connections. Before, each watch opened a session of its own
/// (40 connections, and twice the pings: the idle-watch fault scenario
/// counted 14 messages in 3 s against 7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_adds_no_connection() {
    use futures::StreamExt;
    let Some((base, ns, _serial)) = serial_namespace().await else {
        return;
    };
    let url = format!("{base}/{ns}");
    let before = alive_connections(&base).await;
    let mut observers = Vec::new();
    let mut clients = Vec::new();
    for i in 0..20 {
        let backend = quorumlock_zk::ZkBackend::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("client {i} of 20 could not connect: {e}"));
        let client = LockClient::new(Arc::new(backend));
        client.inspect("e").await.unwrap();
        observers.push(observing(&client, "e").await);
        clients.push(client);
    }
    let during = alive_connections(&base).await;
    assert!(
        during <= before + 20,
        "20 clients observing an election: {during} connections open, {before} before"
    );
    // The observers still see a change.
    let leader = clients[0]
        .election("e")
        .unwrap()
        .campaign("here")
        .await
        .unwrap();
    for (i, o) in observers.iter_mut().enumerate() {
        let next = tokio::time::timeout(Duration::from_secs(30), o.next())
            .await
            .unwrap_or_else(|_| panic!("observer {i} did not see the leader"))
            .expect("the observer ended")
            .expect("the observer failed");
        assert_eq!(
            next.map(|l| l.value),
            Some(b"here".to_vec()),
            "observer {i}"
        );
    }
    leader.resign().await.unwrap();
    drop(observers);
    for c in &clients {
        c.close().await;
    }
}

/// A client that holds a lock and observes: the watch runs on the admin
/// session (the lock session's client, held that long, would keep that
/// session open past its close), which closes when the observer is
/// dropped: the client is back to one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_dropped_beside_a_lock_session_leaves_one_connection() {
    let Some((base, ns, _serial)) = serial_namespace().await else {
        return;
    };
    let before = alive_connections(&base).await;
    let backend = quorumlock_zk::ZkBackend::connect(format!("{base}/{ns}"))
        .await
        .unwrap();
    let client = LockClient::new(Arc::new(backend));
    let guard = client.lock("x").unwrap().acquire().await.unwrap();
    let observed = observing(&client, "e").await;
    let during = alive_connections(&base).await;
    assert!(
        during <= before + 2,
        "a lock session and an observer: {during} connections, {before} before"
    );
    drop(observed);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = alive_connections(&base).await;
        if now <= before + 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the observer was dropped 10 s ago and the client holds {} connections",
            now - before
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    guard.release().await.unwrap();
    client.close().await;
}
