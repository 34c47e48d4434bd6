//! Outages between a client and etcd, through a small TCP proxy of our own:
//! a short outage loses nothing (holders keep their locks, waiters keep
//! their place, watches come back); a long one fires the holder's loss
//! signal before any other client can acquire.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::Harness;
use quorumlock_core::url::Url;
use quorumlock_core::{LockClient, LossReason};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

const SOON: Duration = Duration::from_secs(30);

fn harness() -> Option<Harness> {
    Harness::from_env("QUORUMLOCK_TEST_ETCD_URL", |url| async move {
        Ok(Arc::new(quorumlock_etcd::EtcdBackend::connect(&url).await?) as _)
    })
}

/// A TCP proxy that passes traffic, or cuts every connection and refuses
/// new ones.
struct Proxy {
    addr: SocketAddr,
    /// (cut, epoch): every cut bumps the epoch and closes older connections.
    state: watch::Sender<(bool, u64)>,
}

impl Proxy {
    async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (state, _) = watch::channel((false, 0u64));
        let rx = state.subscribe();
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                let mut rx = rx.clone();
                let (cut, epoch) = *rx.borrow();
                if cut {
                    drop(inbound);
                    continue;
                }
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = rx.wait_for(|(_, e)| *e != epoch) => {}
                    }
                });
            }
        });
        Proxy { addr, state }
    }

    fn cut(&self) {
        self.state.send_modify(|(cut, epoch)| {
            *cut = true;
            *epoch += 1;
        });
    }

    fn pass(&self) {
        self.state.send_modify(|(cut, _)| *cut = false);
    }

    /// `url` with its host and port replaced by the proxy's.
    fn url(&self, url: &Url) -> Url {
        let mut u = url.clone();
        u.set_host(Some("127.0.0.1")).unwrap();
        u.set_port(Some(self.addr.port())).unwrap();
        u
    }
}

fn target_of(url: &Url) -> SocketAddr {
    let host = url.host_str().unwrap();
    let port = url.port().unwrap_or(2379);
    std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .unwrap()
        .next()
        .unwrap()
}

fn with_ttl(url: &Url, ttl: &str) -> Url {
    let mut u = url.clone();
    let pairs: Vec<(String, String)> = u
        .query_pairs()
        .filter(|(k, _)| k != "ttl")
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    u.query_pairs_mut()
        .clear()
        .extend_pairs(pairs)
        .append_pair("ttl", ttl);
    u
}

async fn client_at(url: &Url) -> LockClient {
    LockClient::new(Arc::new(
        quorumlock_etcd::EtcdBackend::connect(url).await.unwrap(),
    ))
}

/// A 1.5 s outage on a 10 s lease: the holder keeps the lock, the waiter
/// its place in the queue, and both have working watches afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_outage_loses_nothing() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let admin = case.client().await;
    let url = h.url_for(case.namespace());
    let proxy = Proxy::start(target_of(&url)).await;
    let (holder, waiter) = (
        client_at(&proxy.url(&url)).await,
        client_at(&proxy.url(&url)).await,
    );

    let g = holder.lock("x").unwrap().acquire().await.unwrap();
    let w = waiter.clone();
    let waiting = tokio::spawn(async move { w.lock("x").unwrap().acquire().await });
    let start = Instant::now();
    let place = loop {
        let st = admin.inspect("x").await.unwrap();
        if let Some(w) = st.waiters.first() {
            break w.token;
        }
        assert!(start.elapsed() < SOON, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    proxy.cut();
    let cut_at = Instant::now();
    let e = holder
        .inspect("x")
        .await
        .expect_err("the proxy did not cut");
    assert_eq!(e.kind(), quorumlock_core::ErrorKind::Connection, "{e}");
    tokio::time::sleep_until(cut_at + Duration::from_millis(1500)).await;
    proxy.pass();

    assert!(g.is_held(), "a short outage lost the lock: {:?}", g.loss());
    // The holder's watches came back: a revoke request reaches it.
    assert!(admin.request_revoke("x").await.unwrap());
    tokio::time::timeout(SOON, g.revoke_requested())
        .await
        .expect("revoke not seen after the outage");
    assert!(g.is_held());
    let st = admin.inspect("x").await.unwrap();
    assert_eq!(st.waiters.len(), 1);
    assert_eq!(st.waiters[0].token, place, "the waiter lost its place");

    g.release().await.unwrap();
    let g2 = tokio::time::timeout(SOON, waiting)
        .await
        .expect("waiter not granted after the outage")
        .unwrap()
        .unwrap();
    assert_eq!(
        g2.token(),
        place,
        "the waiter re-queued instead of keeping its key"
    );
    // The new holder's own-key watch works: a forced break is reported.
    assert!(admin.break_lock("x").await.unwrap());
    let reason = tokio::time::timeout(SOON, g2.lost())
        .await
        .expect("break not seen");
    assert_eq!(reason, LossReason::EntryDeleted);
    drop(g2);
    for c in [&holder, &waiter] {
        c.wait_idle().await;
        c.close().await;
    }
    case.finish().await;
}

/// A partition longer than the lease: the holder's loss future fires
/// (local deadline) before another client is granted the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_partition_fires_loss_before_anyone_else_acquires() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let other = case.client().await;
    let url = h.url_for(case.namespace());
    let proxy = Proxy::start(target_of(&url)).await;
    let holder = client_at(&with_ttl(&proxy.url(&url), "2s")).await;

    let g = holder.lock("p").unwrap().acquire().await.unwrap();
    let lost = g.lost();
    let lost_at = tokio::spawn(async move {
        let reason = lost.await;
        (reason, Instant::now())
    });
    proxy.cut();
    let cut_at = Instant::now();
    let g2 = tokio::time::timeout(SOON, other.lock("p").unwrap().acquire())
        .await
        .expect("the lease never expired")
        .unwrap();
    let granted_at = Instant::now();
    let (reason, lost_at) = tokio::time::timeout(SOON, lost_at).await.unwrap().unwrap();
    assert_eq!(reason, LossReason::DeadlinePassed);
    assert!(
        lost_at < granted_at,
        "loss fired {:?} after the cut, another client got the lock {:?} after it",
        lost_at - cut_at,
        granted_at - cut_at
    );
    assert!(
        lost_at - cut_at < Duration::from_secs(2),
        "loss fired late: {:?}",
        lost_at - cut_at
    );
    assert!(g2.token() > g.token());

    proxy.pass();
    assert_eq!(
        g.release().await.unwrap_err().kind(),
        quorumlock_core::ErrorKind::LockLost
    );
    let t2 = g2.token();
    g2.release().await.unwrap();
    // The partitioned client recovers with a new lease.
    let g3 = tokio::time::timeout(SOON, holder.lock("p").unwrap().acquire())
        .await
        .expect("no new session after the partition")
        .unwrap();
    assert!(g3.token() > t2);
    g3.release().await.unwrap();
    holder.close().await;
    case.finish().await;
}

/// The history a broken watch would resume from is compacted during the
/// outage: etcd cancels the re-created watch, and the holder re-reads its
/// key and the revoke marker instead, then watches again from there, under
/// a new watch id (etcd refuses a create that reuses the cancelled id, and
/// a later break would go unseen).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_with_compaction_rereads_and_watches_again() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let admin = case.client().await;
    let url = h.url_for(case.namespace());
    let proxy = Proxy::start(target_of(&url)).await;
    let holder = client_at(&proxy.url(&url)).await;
    let g = holder.lock("c").unwrap().acquire().await.unwrap();
    // The watch on the held key opens in the background: let it.
    tokio::time::sleep(Duration::from_millis(500)).await;

    proxy.cut();
    // Move the revision past our watch's start (the revision after our
    // key's) and compact that away.
    let config = quorumlock_etcd::EtcdConfig::from_url(&url).unwrap();
    let mut raw = etcd_client::Client::connect(config.endpoints.clone(), None)
        .await
        .expect("this test needs a plain etcd:// URL");
    let scratch = format!("{}/scratch", case.namespace());
    raw.put(scratch.as_str(), "x", None).await.unwrap();
    let del = raw.delete(scratch.as_str(), None).await.unwrap();
    raw.compact(del.header().unwrap().revision(), None)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.pass();

    // A revoke request written after the heal reaches the holder.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(admin.request_revoke("c").await.unwrap());
    tokio::time::timeout(SOON, g.revoke_requested())
        .await
        .expect("revoke not seen after an outage with compaction");
    assert!(g.is_held());
    // And a forced break is still reported.
    assert!(admin.break_lock("c").await.unwrap());
    let reason = tokio::time::timeout(SOON, g.lost())
        .await
        .expect("break not seen");
    assert_eq!(reason, LossReason::EntryDeleted);
    drop(g);
    holder.wait_idle().await;
    holder.close().await;
    case.finish().await;
}
