//! What Redis does NOT guarantee, shown on a real primary-replica pair:
//! a grant the replica had not received when it was promoted is lost.
//! The old holder's client, reconnected to the new primary (as Sentinel
//! or a moved DNS name would do), reports the loss at its next renewal;
//! meanwhile a second client is granted the same lock, with a larger
//! token, so that a register that checks tokens refuses the old holder's
//! writes.
//!
//! The test starts its own two `redis-server` processes (the binary from
//! `QUORUMLOCK_REDIS_SERVER`, exported by `scripts/stores.sh up redis`)
//! on free ports; the replication link goes through the suite's TCP proxy
//! so that it can be partitioned before the grant.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::pair::{caught_up, server_binary, synced, Server, Switch};
use quorumlock_conformance::faults::{FencedRegister, NetControl, NetMode, TcpProxy};
use quorumlock_core::{ErrorKind, LockClient, LossReason};
use quorumlock_redis::RedisBackend;
use tokio::task::JoinSet;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_before_replication_loses_the_lock_and_the_token_fences_the_old_holder() {
    let Some(bin) = server_binary() else { return };
    let primary = Server::start(&bin, &[]).await;
    let link = TcpProxy::start(([127, 0, 0, 1], primary.port).into())
        .await
        .unwrap();
    let link_port = link.addr().port().to_string();
    let mut replica = Server::start(&bin, &["--replicaof", "127.0.0.1", link_port.as_str()]).await;
    synced(&replica).await;

    let ns = format!("qlfo-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let switch = Switch::start(primary.port).await;
    let a = LockClient::new(Arc::new(
        RedisBackend::connect(&primary.url(switch.addr.port(), &ns))
            .await
            .unwrap(),
    ));
    // A's session reaches the replica...
    a.lock("warmup")
        .unwrap()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    caught_up(&primary, &replica).await;

    // ...its grant does not: the replication link is partitioned first.
    link.set_mode(NetMode::Blackhole);
    let register = FencedRegister::new();
    let ga = a.lock("res").unwrap().acquire().await.unwrap();
    register.write("a", ga.token()).unwrap();
    ga.fenced_put("fo-value", b"a".to_vec()).await.unwrap();
    let on_replica: i64 = replica
        .query(redis::cmd("HLEN").arg(format!("{ns}/res/.e")))
        .await
        .unwrap();
    assert_eq!(on_replica, 0, "the replica got the grant after all");

    // Failover: the replica becomes the primary, the old primary dies, and
    // A's address now leads to the new primary.
    let _: () = replica
        .query(redis::cmd("REPLICAOF").arg("NO").arg("ONE"))
        .await
        .unwrap();
    switch.switch_to(replica.port);
    drop(primary);

    // B is granted the lock A still holds: Redis lost A's grant.
    let b = LockClient::new(Arc::new(
        RedisBackend::connect(&replica.url(replica.port, &ns))
            .await
            .unwrap(),
    ));
    let gb = tokio::time::timeout(Duration::from_secs(5), b.lock("res").unwrap().acquire())
        .await
        .expect("B was not granted on the new primary")
        .unwrap();
    eprintln!(
        "A's guard still held when B was granted: {} (tokens A {} B {})",
        ga.is_held(),
        ga.token(),
        gb.token()
    );
    assert!(
        gb.token() > ga.token(),
        "the new primary's token {} is not above the lost grant's {}",
        gb.token(),
        ga.token()
    );
    register.write("b", gb.token()).unwrap();

    // A is told, at its next renewal on the new primary.
    let reason = tokio::time::timeout(Duration::from_secs(4), ga.lost())
        .await
        .expect("A's loss was not reported");
    // The grant never reached the replica; whether A's session key did
    // depends on timing: the renewal then finds its entry gone, or the
    // session itself. Either is the loss, reported.
    assert!(
        matches!(
            reason,
            LossReason::EntryDeleted | LossReason::SessionExpired
        ),
        "{reason:?}"
    );
    assert!(!ga.is_held());

    // The token refuses A's late write; the store refuses A's fenced one.
    let stale = register.write("a", ga.token()).unwrap_err();
    assert_eq!(stale.highest, gb.token(), "{stale}");
    assert_eq!(register.value().unwrap().1, "b");
    let e = ga
        .fenced_put("fo-value", b"a-late".to_vec())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
    gb.fenced_put("fo-value", b"b".to_vec()).await.unwrap();
    assert_eq!(b.read_key("fo-value").await.unwrap(), Some(b"b".to_vec()));

    gb.release().await.unwrap();
    b.close().await;
    a.close().await;
    let _ = replica.child.kill().await;
}

/// `wait_replicas=1`: a grant counts only once the replica acknowledged
/// it. With the replication link partitioned the acquire fails (and
/// leaves no entry behind); with the link back, the grant is on the
/// replica before the acquire returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_mode_counts_a_grant_only_once_the_replica_has_it() {
    let Some(bin) = server_binary() else { return };
    let primary = Server::start(&bin, &[]).await;
    let link = TcpProxy::start(([127, 0, 0, 1], primary.port).into())
        .await
        .unwrap();
    let link_port = link.addr().port().to_string();
    let replica = Server::start(&bin, &["--replicaof", "127.0.0.1", link_port.as_str()]).await;
    let ns = format!("qlwa-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let url = quorumlock_core::url::parse(&format!(
        "redis://127.0.0.1:{}/{ns}?ttl=3s&wait_replicas=1",
        primary.port
    ))
    .unwrap();
    let a = LockClient::new(Arc::new(RedisBackend::connect(&url).await.unwrap()));
    let g = tokio::time::timeout(Duration::from_secs(10), a.lock("w").unwrap().acquire())
        .await
        .expect("acquire in WAIT mode hung")
        .unwrap();
    let entries: i64 = replica
        .query(redis::cmd("HLEN").arg(format!("{ns}/w/.e")))
        .await
        .unwrap();
    assert_eq!(entries, 1, "WAIT returned before the replica had the grant");
    g.release().await.unwrap();

    link.set_mode(NetMode::Blackhole);
    // A try-acquire reports the refusal; a waiting acquire keeps trying
    // (a connection error is retryable) until its own timeout.
    let e = tokio::time::timeout(Duration::from_secs(10), a.lock("w").unwrap().try_acquire())
        .await
        .expect("try-acquire in WAIT mode hung on a partitioned replica")
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    assert!(e.to_string().contains("acknowledged"), "{e}");
    let e = a
        .lock("w")
        .unwrap()
        .acquire_timeout(Duration::from_secs(2))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    let left = a.inspect("w").await.unwrap();
    assert!(left.is_free(), "an unacknowledged grant stayed: {left:?}");
    a.close().await;
}

/// A release the failover loses: it reached the old primary, not the
/// replica promoted in its place, so the new primary still has the
/// entry, on a session its client goes on renewing there. The client no
/// longer owns that entry; it must not keep the lock from everyone else:
/// another client is granted within a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_lost_in_a_failover_does_not_keep_the_lock_held() {
    let Some(bin) = server_binary() else { return };
    let primary = Server::start(&bin, &[]).await;
    let link = TcpProxy::start(([127, 0, 0, 1], primary.port).into())
        .await
        .unwrap();
    let link_port = link.addr().port().to_string();
    let mut replica = Server::start(&bin, &["--replicaof", "127.0.0.1", link_port.as_str()]).await;
    synced(&replica).await;

    let ns = format!("qlrl-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let ttl = Duration::from_secs(3);
    let url = |port: u16| {
        quorumlock_core::url::parse(&format!("redis://127.0.0.1:{port}/{ns}?ttl=3s")).unwrap()
    };
    let switch = Switch::start(primary.port).await;
    let a = LockClient::new(Arc::new(
        RedisBackend::connect(&url(switch.addr.port()))
            .await
            .unwrap(),
    ));
    // The replica lags, as a loaded link does: the test must wait for
    // the replica to have the grant, not for a fixed time.
    link.set_mode(NetMode::Delay(Duration::from_millis(300)));
    let ga = a.lock("res").unwrap().acquire().await.unwrap();
    let sid = a.session_id().await.unwrap();
    // The session and the grant are on the replica...
    caught_up(&primary, &replica).await;
    // ...the release is not: the replication link is partitioned first.
    link.set_mode(NetMode::Blackhole);
    let bytes_at_cut = link.stats().bytes.load(Ordering::Relaxed);
    let loss_before_release = ga.loss();
    ga.release().await.unwrap();
    let on_primary: i64 = primary
        .query(redis::cmd("HLEN").arg(format!("{ns}/res/.e")))
        .await
        .unwrap();
    assert_eq!(on_primary, 0, "the release did not reach the primary");
    let on_replica: i64 = replica
        .query(redis::cmd("HLEN").arg(format!("{ns}/res/.e")))
        .await
        .unwrap();
    if on_replica != 1 {
        // Failed once in a full run (run 3 of 7bf4c6c): the test asked
        // `WAIT` on a connection of its own, which answered at once, and
        // the grant was still on its way when the link was cut (HLEN 0).
        // `caught_up` waits for the replica's offset; should this fail
        // again: did the link forward after the cut, or was the entry
        // gone before it.
        panic!(
            "the replica got the release after all: HLEN {on_replica}; A's loss before its \
             release: {loss_before_release:?}; the link forwarded {} bytes after the cut; \
             replication: {} | {}",
            link.stats().bytes.load(Ordering::Relaxed) - bytes_at_cut,
            one_line(&primary).await,
            one_line(&replica).await
        );
    }

    // Failover: the replica becomes the primary, the old one dies, A's
    // address leads to the new primary.
    let _: () = replica
        .query(redis::cmd("REPLICAOF").arg("NO").arg("ONE"))
        .await
        .unwrap();
    switch.switch_to(replica.port);
    drop(primary);
    let failed_over = Instant::now();

    let b = LockClient::new(Arc::new(
        RedisBackend::connect(&url(replica.port)).await.unwrap(),
    ));
    let gb = b
        .lock("res")
        .unwrap()
        .acquire_timeout(ttl * 3)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "B was not granted {:?} after the failover ({e}); the entry A released \
                 is still there, on A's session that A renews",
                failed_over.elapsed()
            )
        });
    let took = failed_over.elapsed();
    eprintln!("B granted {took:?} after the failover");
    assert!(
        took < ttl,
        "B granted only {took:?} after the failover (TTL {ttl:?})"
    );
    // A's session lived on: the entry went because A no longer owned it.
    assert_eq!(a.session_id().await.unwrap(), sid);
    gb.release().await.unwrap();
    b.close().await;
    a.close().await;
    let _ = replica.child.kill().await;
}

/// WAIT mode with the only replica unreachable: every grant waits for an
/// acknowledgement that never comes, and a client that keeps acquiring
/// must not starve its own renewals with those waits: a lock it holds
/// stays held for several TTLs, the primary answering all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_mode_keeps_renewing_while_the_replica_does_not_answer() {
    let Some(bin) = server_binary() else { return };
    let primary = Server::start(&bin, &[]).await;
    let link = TcpProxy::start(([127, 0, 0, 1], primary.port).into())
        .await
        .unwrap();
    let link_port = link.addr().port().to_string();
    let replica = Server::start(&bin, &["--replicaof", "127.0.0.1", link_port.as_str()]).await;
    synced(&replica).await;
    let ns = format!("qlws-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let ttl = Duration::from_secs(2);
    let url = quorumlock_core::url::parse(&format!(
        "redis://127.0.0.1:{}/{ns}?ttl=2s&wait_replicas=1",
        primary.port
    ))
    .unwrap();
    let a = LockClient::new(Arc::new(RedisBackend::connect(&url).await.unwrap()));
    let g = tokio::time::timeout(Duration::from_secs(10), a.lock("held").unwrap().acquire())
        .await
        .expect("acquire in WAIT mode hung")
        .unwrap();

    // The replica stops answering; A keeps acquiring other names, from
    // four tasks (each grant is refused: not acknowledged).
    link.set_mode(NetMode::Blackhole);
    // A token, not a `Notify`: `notify_waiters` reaches only the tasks
    // waiting at that moment, and a task between two tries missed it and
    // tried forever (the test hung in a full run).
    let stop = tokio_util::sync::CancellationToken::new();
    let refused = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut busy = JoinSet::new();
    for i in 0..4 {
        let (a, stop, refused) = (a.clone(), stop.clone(), refused.clone());
        busy.spawn(async move {
            for k in 0.. {
                // A new name each time: the abandon of the last one may
                // still be on its way.
                let lock = a.lock(format!("busy{i}-{k}")).unwrap();
                tokio::select! {
                    _ = stop.cancelled() => return,
                    r = lock.try_acquire() => {
                        let e = r.expect_err("granted without the replica's acknowledgement");
                        if e.kind() == ErrorKind::Connection {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        });
    }
    // The primary itself answers at once all along: its slowest PING, in
    // microseconds.
    let slowest = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let pings = {
        let (port, slowest) = (primary.port, slowest.clone());
        tokio::spawn(async move {
            let c = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
            let mut conn = c.get_multiplexed_async_connection().await.unwrap();
            loop {
                let t = Instant::now();
                let _: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
                slowest.fetch_max(t.elapsed().as_micros() as u64, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let started = Instant::now();
    let lost = tokio::time::timeout(ttl * 3, g.lost()).await;
    pings.abort();
    stop.cancel();
    let n = refused.load(Ordering::Relaxed);
    if let Ok(reason) = lost {
        panic!(
            "the held lock was lost ({reason:?}) {:?} after the replica stopped answering, \
             with {n} grants refused meanwhile; the primary's slowest PING took {} µs",
            started.elapsed(),
            slowest.load(Ordering::Relaxed)
        );
    }
    eprintln!(
        "{n} grants refused in {:?}, slowest PING {} µs",
        started.elapsed(),
        slowest.load(Ordering::Relaxed)
    );
    assert!(n > 0, "no grant was refused: WAIT mode was not exercised");
    while busy.join_next().await.is_some() {}
    g.release().await.unwrap();
    a.close().await;
}

/// A server's `INFO replication` on one line, for a failure message.
async fn one_line(s: &Server) -> String {
    let info = s
        .replication()
        .await
        .unwrap_or_else(|e| format!("(INFO failed: {e})"));
    format!("{}: {}", s.port, info.replace("\r\n", " "))
}
