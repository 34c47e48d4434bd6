//! Requests that reach etcd later than the client thinks: an abandon whose
//! answer never came back (the link broke while it was on its way) is
//! applied after the client has moved on, and must then delete nothing
//! but the attempt it was sent for (issue 17, finding 2); and a waiter
//! whose two reads of one step land at different moments must not be
//! granted on a key deleted between them (finding 4).
//!
//! A small proxy of our own holds the bytes a client sends on one
//! connection (they neither reach etcd nor fail), breaks that connection on
//! the client's side (so the client sees a transport error and retries on
//! a new connection), and later delivers the held bytes to etcd on the old
//! server connection: a request in flight that a gRPC proxy, a load
//! balancer or a member forwarding to its leader delivers late.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::Harness;
use quorumlock_core::url::Url;
use quorumlock_core::{ErrorKind, LockClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

const SOON: Duration = Duration::from_secs(30);

fn harness(var: &str) -> Option<Harness> {
    Harness::from_env(var, |url| async move {
        Ok(Arc::new(quorumlock_etcd::EtcdBackend::connect(&url).await?) as _)
    })
}

/// What the held connections do.
#[derive(Debug, Clone, Copy, Default)]
struct Phase {
    /// Connections accepted before this serial number are held.
    hold_before: u64,
    /// Held connections: their client side is aborted.
    detached: bool,
    /// Held connections: what they held is sent on to etcd.
    flushed: bool,
}

/// A TCP proxy that can hold the client-to-etcd bytes of its open
/// connections, break them on the client's side only, and deliver the
/// held bytes later.
struct HoldProxy {
    addr: SocketAddr,
    phase: watch::Sender<Phase>,
    accepted: Arc<AtomicU64>,
    /// Bytes etcd sent on held connections after the flush.
    answered: Arc<AtomicU64>,
}

impl HoldProxy {
    async fn start(target: SocketAddr) -> HoldProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (phase, _) = watch::channel(Phase::default());
        let accepted = Arc::new(AtomicU64::new(0));
        let answered = Arc::new(AtomicU64::new(0));
        let (rx, acc, ans) = (phase.subscribe(), accepted.clone(), answered.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let serial = acc.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(connection(client, target, serial, rx.clone(), ans.clone()));
            }
        });
        HoldProxy {
            addr,
            phase,
            accepted,
            answered,
        }
    }

    /// Holds what clients send on every connection open now.
    fn hold(&self) {
        let n = self.accepted.load(Ordering::SeqCst);
        self.phase.send_modify(|p| p.hold_before = n);
    }

    /// Aborts the held connections on the client's side only.
    fn detach(&self) {
        self.phase.send_modify(|p| p.detached = true);
    }

    /// Sends what the held connections held on to etcd.
    fn flush(&self) {
        self.phase.send_modify(|p| p.flushed = true);
    }

    fn url(&self, url: &Url) -> Url {
        let mut u = url.clone();
        u.set_host(Some("127.0.0.1")).unwrap();
        u.set_port(Some(self.addr.port())).unwrap();
        u
    }
}

async fn connection(
    client: TcpStream,
    target: SocketAddr,
    serial: u64,
    mut rx: watch::Receiver<Phase>,
    answered: Arc<AtomicU64>,
) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    // Closing the client side aborts it (RST): the client must see an
    // error at once, not a clean end.
    let _ = client.set_zero_linger();
    let (crd, cwr) = client.into_split();
    let mut client = Some((crd, cwr));
    let (mut srd, mut swr) = server.into_split();
    let mut held: Vec<u8> = Vec::new();
    let (mut cbuf, mut sbuf) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    loop {
        let p = *rx.borrow_and_update();
        let holding = serial < p.hold_before;
        if holding && p.detached {
            client = None;
        }
        if holding && p.flushed && !held.is_empty() {
            if swr.write_all(&held).await.is_err() {
                return;
            }
            held.clear();
        }
        let from_client = async {
            match client.as_mut() {
                Some((crd, _)) => crd.read(&mut cbuf).await,
                None => std::future::pending().await,
            }
        };
        // What came in is judged by the phase in force now, not by `p`,
        // read before the wait: a hold (detach, flush) sent during the wait
        // whose wake-up has not been handled yet (the read and the change
        // ready together, or this task scheduled late) must apply to the
        // bytes the client sent after it. Judged by `p`, the enqueue sent
        // right after `hold` went on to etcd.
        tokio::select! {
            r = from_client => {
                let p = *rx.borrow();
                let holding = serial < p.hold_before;
                match r {
                    Ok(0) | Err(_) => {
                        if !holding {
                            return;
                        }
                        client = None;
                    }
                    Ok(n) => {
                        // Behind what is held: never overtakes it.
                        held.extend_from_slice(&cbuf[..n]);
                        if !holding || p.flushed {
                            if swr.write_all(&held).await.is_err() {
                                return;
                            }
                            held.clear();
                        }
                    }
                }
            }
            r = srd.read(&mut sbuf) => {
                let p = *rx.borrow();
                let holding = serial < p.hold_before;
                match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if holding && p.flushed {
                            answered.fetch_add(n as u64, Ordering::SeqCst);
                        }
                        if let Some((_, cwr)) = client.as_mut() {
                            if !(holding && p.detached) && cwr.write_all(&sbuf[..n]).await.is_err() {
                                client = None;
                            }
                        }
                    }
                }
            }
            r = rx.changed() => {
                if r.is_err() {
                    return;
                }
            }
        }
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

async fn client_at(url: &Url) -> LockClient {
    LockClient::new(Arc::new(
        quorumlock_etcd::EtcdBackend::connect(url).await.unwrap(),
    ))
}

/// Waits until `f` is true, polling every 20 ms, at most [`SOON`].
async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !f().await {
        assert!(start.elapsed() < SOON, "{what}: not within {SOON:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Finding 2: a queued attempt times out; its abandon is sent, the link
/// breaks before etcd gets it, the retried abandon removes the key, and
/// the next attempt of the same client creates the same key again (a
/// mutex key is `<pfx>/<lease hex>` on every attempt) and holds. Then the
/// first abandon reaches etcd: it must not delete the new holder's key.
async fn late_abandon_spares_the_next_attempts_key(var: &str) {
    let Some(h) = harness(var) else { return };
    let case = h.case();
    let other = case.client().await;
    let url = h.url_for(case.namespace());
    let proxy = HoldProxy::start(target_of(&url)).await;
    let ours = client_at(&proxy.url(&url)).await;

    let g0 = other.lock("m").unwrap().acquire().await.unwrap();
    let wait = Duration::from_millis(1500);
    let c = ours.clone();
    let attempt = tokio::spawn(async move { c.lock("m").unwrap().acquire_timeout(wait).await });
    let start = Instant::now();
    let first_key = loop {
        let st = other.inspect("m").await.unwrap();
        if let Some(w) = st.waiters.first() {
            break (w.token, w.entry.clone());
        }
        assert!(start.elapsed() < SOON, "our attempt never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let queued_at = Instant::now();
    // Hold everything our client sends from now on: the abandon after the
    // timeout is sent but does not reach etcd.
    proxy.hold();
    tokio::time::sleep_until(queued_at + wait + Duration::from_millis(700)).await;
    proxy.detach();
    let e = tokio::time::timeout(SOON, attempt)
        .await
        .expect("the timed-out attempt never came back")
        .unwrap()
        .expect_err("acquired a held lock");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    // The abandon runs in the background: its retry, on a new connection,
    // removed the first attempt's key.
    tokio::time::timeout(SOON, ours.wait_idle())
        .await
        .expect("the abandon never finished");
    let st = other.inspect("m").await.unwrap();
    assert!(st.waiters.is_empty(), "abandon left {:?}", st.waiters);

    g0.release().await.unwrap();
    let g1 = tokio::time::timeout(SOON, ours.lock("m").unwrap().acquire())
        .await
        .expect("the next attempt was not granted")
        .unwrap();
    assert!(g1.token() > first_key.0);
    let st = other.inspect("m").await.unwrap();
    assert_eq!(st.holders.len(), 1);
    assert_eq!(
        st.holders[0].entry, first_key.1,
        "a mutex key is the same on every attempt of a lease"
    );

    // The first abandon reaches etcd now.
    proxy.flush();
    eventually("etcd answers the late requests", || async {
        proxy.answered.load(Ordering::SeqCst) > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let st = other.inspect("m").await.unwrap();
    assert_eq!(
        st.holders.iter().map(|c| c.token).collect::<Vec<_>>(),
        vec![g1.token()],
        "the late abandon of the first attempt deleted the next attempt's key"
    );
    assert!(g1.is_held(), "holder lost its lock: {:?}", g1.loss());
    let e = other.lock("m").unwrap().try_acquire().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e}");

    g1.release().await.unwrap();
    ours.wait_idle().await;
    ours.close().await;
    case.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_abandon_spares_the_next_attempts_key_etcd34() {
    late_abandon_spares_the_next_attempts_key("QUORUMLOCK_TEST_ETCD_URL").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_abandon_spares_the_next_attempts_key_etcd35() {
    late_abandon_spares_the_next_attempts_key("QUORUMLOCK_TEST_ETCD35_URL").await;
}

/// Finding 4: a waiter's read meets a nested lock's key (`x/sub/...`
/// among `x`'s keys) and reads the lock again; our key is deleted between
/// the two reads, while the holder ahead is gone. The grant must never
/// rest on the second read alone. With 2 s of latency on the way to etcd
/// only, the waiter's first read after the release lands about 2 s after
/// it and the second about 4 s after it; the key is deleted at 3 s.
async fn no_grant_on_a_key_deleted_between_two_reads(var: &str) {
    let Some(h) = harness(var) else { return };
    let case = h.case();
    let admin = case.client().await;
    let url = h.url_for(case.namespace());
    let proxy = LatencyProxy::start(target_of(&url)).await;
    let mut slow_url = proxy_url(proxy.addr, &url);
    // Keepalives answered 2 s late must not cost the lease.
    slow_url.query_pairs_mut().append_pair("ttl", "30s");
    let ours = client_at(&slow_url).await;

    let holder = admin.lock("x").unwrap().acquire().await.unwrap();
    let nested = admin.lock("x/sub").unwrap().acquire().await.unwrap();
    let c = ours.clone();
    let waiting = tokio::spawn(async move { c.lock("x").unwrap().acquire().await });
    let start = Instant::now();
    let (first_token, first_entry) = loop {
        let st = admin.inspect("x").await.unwrap();
        if let Some(w) = st.waiters.first() {
            break (w.token, w.entry.clone());
        }
        assert!(start.elapsed() < SOON, "our waiter never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Let it read past the nested key and watch the holder.
    tokio::time::sleep(Duration::from_millis(700)).await;

    proxy.delay.send_replace(Duration::from_secs(2));
    let released = Instant::now();
    holder.release().await.unwrap();
    tokio::time::sleep_until(released + Duration::from_secs(3)).await;
    let config = quorumlock_etcd::EtcdConfig::from_url(&url).unwrap();
    let mut raw = etcd_client::Client::connect(config.endpoints.clone(), None)
        .await
        .expect("this test needs a plain etcd:// URL");
    let del = raw.delete(first_entry.as_str(), None).await.unwrap();
    assert_eq!(del.deleted(), 1, "our waiter's key was not there any more");

    let got = tokio::time::timeout(SOON, waiting)
        .await
        .expect("the waiter hangs")
        .unwrap();
    proxy.delay.send_replace(Duration::ZERO);
    // The client layer retries a lost key with a new one, which holds (the
    // nested lock is no contender); the deleted key never does.
    let g = got.expect("the waiter failed instead of queueing again");
    assert_ne!(
        g.token(),
        first_token,
        "granted on our key that was deleted before the grant"
    );
    let st = admin.inspect("x").await.unwrap();
    assert_eq!(
        st.holders.iter().map(|c| c.token).collect::<Vec<_>>(),
        vec![g.token()]
    );
    g.release().await.unwrap();
    nested.release().await.unwrap();
    ours.wait_idle().await;
    ours.close().await;
    case.finish().await;
}

/// A TCP proxy that delays what clients send by a settable latency (each
/// chunk `delay` after it was read, chunks in flight overlapping); what
/// etcd sends passes at once.
struct LatencyProxy {
    addr: SocketAddr,
    delay: Arc<watch::Sender<Duration>>,
}

impl LatencyProxy {
    async fn start(target: SocketAddr) -> LatencyProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let delay = Arc::new(watch::channel(Duration::ZERO).0);
        let d = delay.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let d = d.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (mut crd, mut cwr) = client.into_split();
                    let (mut srd, mut swr) = server.into_split();
                    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
                    let up_read = async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        while let Ok(n @ 1..) = crd.read(&mut buf).await {
                            let due = Instant::now() + *d.borrow();
                            if tx.send((due, buf[..n].to_vec())).is_err() {
                                return;
                            }
                        }
                    };
                    let up_write = async move {
                        while let Some((due, bytes)) = rx.recv().await {
                            tokio::time::sleep_until(due).await;
                            if swr.write_all(&bytes).await.is_err() {
                                return;
                            }
                        }
                    };
                    let down = tokio::io::copy(&mut srd, &mut cwr);
                    tokio::select! {
                        _ = async { tokio::join!(up_read, up_write) } => {}
                        _ = down => {}
                    }
                });
            }
        });
        LatencyProxy { addr, delay }
    }
}

fn proxy_url(addr: SocketAddr, url: &Url) -> Url {
    let mut u = url.clone();
    u.set_host(Some("127.0.0.1")).unwrap();
    u.set_port(Some(addr.port())).unwrap();
    u
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_grant_on_a_key_deleted_between_two_reads_etcd34() {
    no_grant_on_a_key_deleted_between_two_reads("QUORUMLOCK_TEST_ETCD_URL").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_grant_on_a_key_deleted_between_two_reads_etcd35() {
    no_grant_on_a_key_deleted_between_two_reads("QUORUMLOCK_TEST_ETCD35_URL").await;
}

/// An enqueue request outlives its attempt: the acquire times out while
/// the enqueue txn is held on its way to etcd, the txn then ends on our
/// side without etcd's answer (the link breaks: a transport error, like a
/// request timeout, leaves its outcome unknown), the abandon finds no key
/// and finishes, and only then does etcd apply the held txn. The key it
/// creates under our still-alive lease belongs to no attempt: it must not
/// be created, or every other client waits behind it until we close.
async fn late_enqueue_after_abandon_creates_nothing(var: &str) {
    let Some(h) = harness(var) else { return };
    let case = h.case();
    let other = case.client().await;
    let url = h.url_for(case.namespace());
    let proxy = HoldProxy::start(target_of(&url)).await;
    let mut short = proxy.url(&url);
    // Held keepalives must not cost the lease.
    short.query_pairs_mut().append_pair("ttl", "30s");
    let ours = client_at(&short).await;
    // Opens our session (and the connection that is held below).
    quorumlock_conformance::support::open_session(&ours).await;

    proxy.hold();
    let c = ours.clone();
    let wait = Duration::from_millis(500);
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let attempt = tokio::spawn(async move {
        let _ = started_tx.send(Instant::now());
        c.lock("m").unwrap().acquire_timeout(wait).await
    });
    // The attempt times out; its abandon waits for the enqueue txn, which
    // the broken link ends without an answer. The deadline counts from
    // the attempt's own start: on a loaded machine the spawned task may
    // start late, and a link broken before its deadline lets the retried
    // enqueue through on a new connection (a grant, not this case).
    let started = started.await.unwrap();
    tokio::time::sleep_until(started + wait + Duration::from_millis(700)).await;
    proxy.detach();
    let e = tokio::time::timeout(SOON, attempt)
        .await
        .expect("the timed-out attempt never came back")
        .unwrap()
        .expect_err("acquired a lock whose enqueue never reached etcd");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    tokio::time::timeout(SOON, ours.wait_idle())
        .await
        .expect("the abandon never finished");
    let st = other.inspect("m").await.unwrap();
    assert!(
        st.holders.is_empty() && st.waiters.is_empty(),
        "before the late txn: {st:?}"
    );

    // The held enqueue txn reaches etcd now.
    proxy.flush();
    eventually("etcd answers the late requests", || async {
        proxy.answered.load(Ordering::SeqCst) > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let st = other.inspect("m").await.unwrap();
    assert!(
        st.holders.is_empty() && st.waiters.is_empty(),
        "the late enqueue left an entry of ours: {st:?}"
    );
    let g = tokio::time::timeout(Duration::from_secs(5), other.lock("m").unwrap().acquire())
        .await
        .expect("another client cannot acquire the lock after our late enqueue")
        .unwrap();
    g.release().await.unwrap();
    // Ours still works on the same name.
    let g = tokio::time::timeout(SOON, ours.lock("m").unwrap().acquire())
        .await
        .expect("our next attempt was not granted")
        .unwrap();
    g.release().await.unwrap();
    ours.wait_idle().await;
    ours.close().await;
    case.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_enqueue_after_abandon_creates_nothing_etcd34() {
    late_enqueue_after_abandon_creates_nothing("QUORUMLOCK_TEST_ETCD_URL").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_enqueue_after_abandon_creates_nothing_etcd35() {
    late_enqueue_after_abandon_creates_nothing("QUORUMLOCK_TEST_ETCD35_URL").await;
}

/// An earlier try of a granted attempt lands after its release: the
/// enqueue (`quiet`: the plain put of a repeat acquire after a quiet
/// cycle) ends without an answer when the link breaks, the waiter's retry
/// on a new connection queues it, it is granted and released, and only
/// then does etcd apply the first try. It must create nothing.
async fn late_try_after_release_creates_nothing(var: &str, quiet: bool) {
    let Some(h) = harness(var) else { return };
    let case = h.case();
    let other = case.client().await;
    let url = h.url_for(case.namespace());
    let proxy = HoldProxy::start(target_of(&url)).await;
    let mut long = proxy.url(&url);
    long.query_pairs_mut().append_pair("ttl", "30s");
    let ours = client_at(&long).await;
    // Opens our session; twice on `m`, a quiet cycle: the next acquire of
    // `m` starts with the plain put.
    let warm = if quiet { "m" } else { "warm" };
    for _ in 0..2 {
        let g = ours.lock(warm).unwrap().acquire().await.unwrap();
        g.release().await.unwrap();
    }
    let g0 = other.lock("m").unwrap().acquire().await.unwrap();

    proxy.hold();
    let c = ours.clone();
    let attempt = tokio::spawn(async move { c.lock("m").unwrap().acquire().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.detach();
    eventually("our retried enqueue queues", || async {
        !other.inspect("m").await.unwrap().waiters.is_empty()
    })
    .await;
    g0.release().await.unwrap();
    let g = tokio::time::timeout(SOON, attempt)
        .await
        .expect("the waiter was not granted")
        .unwrap()
        .unwrap();
    g.release().await.unwrap();
    tokio::time::timeout(SOON, ours.wait_idle())
        .await
        .expect("the release never finished");

    // The first try reaches etcd now.
    proxy.flush();
    eventually("etcd answers the late requests", || async {
        proxy.answered.load(Ordering::SeqCst) > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let st = other.inspect("m").await.unwrap();
    assert!(
        st.holders.is_empty() && st.waiters.is_empty(),
        "the late try left an entry of ours: {st:?}"
    );
    let g = tokio::time::timeout(Duration::from_secs(5), other.lock("m").unwrap().acquire())
        .await
        .expect("another client cannot acquire the lock after our late try")
        .unwrap();
    g.release().await.unwrap();
    ours.close().await;
    case.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_enqueue_try_after_release_creates_nothing_etcd34() {
    late_try_after_release_creates_nothing("QUORUMLOCK_TEST_ETCD_URL", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_quiet_put_after_release_creates_nothing_etcd35() {
    late_try_after_release_creates_nothing("QUORUMLOCK_TEST_ETCD35_URL", true).await;
}
