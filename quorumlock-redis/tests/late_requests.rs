//! Requests that reach Redis later than the client thinks: a middlebox
//! (a proxy, a load balancer, a TCP stack retransmitting into a healed
//! partition) holds the bytes of an enqueue while the client's side of
//! that connection breaks; the client reconnects, gives the attempt up
//! (abandon, with a fence since the enqueue's outcome is unknown) and
//! goes on renewing its session. When the held enqueue lands, even more
//! than a TTL later, it must leave nothing: no entry of a live session
//! that no guard of its client owns.
//!
//! A small proxy of our own holds the first request whose bytes contain
//! a pattern (the lock's key: only that attempt's enqueue names it),
//! aborts the client's side of that connection (the client sees a
//! transport error at once and reconnects), and delivers the held bytes
//! on the old server connection when told.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{client, raw, session_set, url_with};
use quorumlock_conformance::support::{env_or_skip as env, unique_namespace};
use quorumlock_core::ErrorKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;

/// What the connections of a [`HoldProxy`] share.
#[derive(Default)]
struct Hold {
    /// Armed: the bytes a request to hold contains.
    pattern: Mutex<Option<Vec<u8>>>,
    /// Set once a request was held.
    held: Notify,
    /// Told to deliver the held request.
    deliver: Notify,
    /// Set once the server answered the held request.
    answered: Notify,
}

/// A loopback TCP proxy that holds one request (see the module's doc).
struct HoldProxy {
    addr: SocketAddr,
    hold: Arc<Hold>,
    accept: tokio::task::JoinHandle<()>,
}

impl HoldProxy {
    async fn start(target: SocketAddr) -> HoldProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hold = Arc::new(Hold::default());
        let h = hold.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(connection(client, target, h.clone()));
            }
        });
        HoldProxy { addr, hold, accept }
    }

    /// Holds the next request containing `pattern`.
    fn arm(&self, pattern: &str) {
        *self.hold.pattern.lock().unwrap() = Some(pattern.as_bytes().to_vec());
    }
}

impl Drop for HoldProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn connection(client: TcpStream, target: SocketAddr, hold: Arc<Hold>) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut crd, mut cwr) = client.into_split();
    let (mut srd, mut swr) = server.into_split();
    let (mut cbuf, mut sbuf) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        tokio::select! {
            r = crd.read(&mut cbuf) => {
                let n = match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let chunk = &cbuf[..n];
                let take = {
                    let mut armed = hold.pattern.lock().unwrap();
                    let hit = armed
                        .as_ref()
                        .is_some_and(|p| chunk.windows(p.len()).any(|w| w == p.as_slice()));
                    if hit {
                        *armed = None;
                    }
                    hit
                };
                if !take {
                    if swr.write_all(chunk).await.is_err() {
                        return;
                    }
                    continue;
                }
                // Held: the client's side is aborted (RST, no FIN first),
                // the server's stays open and idle until told.
                let held = chunk.to_vec();
                let _ = crd.as_ref().set_zero_linger();
                cwr.forget();
                drop(crd);
                hold.held.notify_one();
                hold.deliver.notified().await;
                if swr.write_all(&held).await.is_err() {
                    return;
                }
                if matches!(srd.read(&mut sbuf).await, Ok(n) if n > 0) {
                    hold.answered.notify_one();
                }
                return;
            }
            r = srd.read(&mut sbuf) => {
                let n = match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if cwr.write_all(&sbuf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The server address of a Redis URL.
async fn target(base: &str) -> SocketAddr {
    let u = quorumlock_core::url::parse(base).unwrap();
    tokio::net::lookup_host((u.host_str().unwrap().to_string(), u.port().unwrap_or(6379)))
        .await
        .unwrap()
        .next()
        .unwrap()
}

/// An enqueue held past a TTL (so past the old fence's life) lands while
/// its client's session lives on: it must create no entry, so that the
/// lock stays free for others at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_landing_after_a_ttl_leaves_no_entry_of_a_live_session() {
    let Some(base) = env("QUORUMLOCK_TEST_REDIS_URL") else {
        return;
    };
    let proxy = HoldProxy::start(target(&base).await).await;
    let ns = unique_namespace("qllate");
    let ttl = Duration::from_secs(2);
    let mut through = quorumlock_core::url::parse(&url_with(&base, &ns, Some("ttl=2s"))).unwrap();
    through.set_port(Some(proxy.addr.port())).unwrap();
    let a = client(through.as_str()).await;
    let b = client(&url_with(&base, &ns, None)).await;
    // The scripts are in the server's cache (the held request runs, rather
    // than being refused NOSCRIPT), and A's session is open.
    a.lock("warmup")
        .unwrap()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let sid = a.session_id().await.unwrap();

    // A's try of `late`: its enqueue is held, the client sees its
    // connection break, and gives the attempt up.
    let key = format!("{ns}/late");
    proxy.arm(&key);
    let e = a.lock("late").unwrap().try_acquire().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    tokio::time::timeout(Duration::from_secs(5), proxy.hold.held.notified())
        .await
        .expect("no request was held");
    a.wait_idle().await;
    let abandoned = Instant::now();

    // More than a TTL later (what this case is about: a fence that expires
    // after one TTL no longer stops the late copy), with A's session
    // renewed all along.
    tokio::time::sleep_until(abandoned + ttl + ttl / 2).await;
    assert_eq!(
        a.session_id().await.unwrap(),
        sid,
        "A's session was renewed"
    );
    assert!(b.inspect("late").await.unwrap().is_free());

    proxy.hold.deliver.notify_one();
    tokio::time::timeout(Duration::from_secs(5), proxy.hold.answered.notified())
        .await
        .expect("the late enqueue got no answer");

    let state = b.inspect("late").await.unwrap();
    assert!(
        state.is_free(),
        "the late enqueue left an entry of A's live session (no guard owns it): {state:?}"
    );
    let mut conn = raw(&base).await;
    let left = session_set(&mut conn, &ns, &sid).await;
    assert!(left.is_empty(), "A's session set: {left:?}");
    let g = b
        .lock("late")
        .unwrap()
        .try_acquire()
        .await
        .expect("another client is refused the lock the late enqueue took");
    g.release().await.unwrap();
    a.close().await;
    b.close().await;
}

/// A renewal lists the attempts its client owns, and removes the
/// session's entries not listed; one held back and delivered late (its
/// list built before an acquire) must not remove that acquire's entry:
/// the guard stays held, and the lock stays taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_landing_late_removes_no_entry_acquired_since() {
    let Some(base) = env("QUORUMLOCK_TEST_REDIS_URL") else {
        return;
    };
    let proxy = HoldProxy::start(target(&base).await).await;
    let ns = unique_namespace("qllaterenew");
    let ttl = Duration::from_secs(2);
    let mut through = quorumlock_core::url::parse(&url_with(&base, &ns, Some("ttl=2s"))).unwrap();
    through.set_port(Some(proxy.addr.port())).unwrap();
    let a = client(through.as_str()).await;
    let b = client(&url_with(&base, &ns, None)).await;
    a.lock("warmup")
        .unwrap()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let sid = a.session_id().await.unwrap();

    // A renewal's arguments start with the session id and the TTL in ms
    // (no other request has these two in a row): the next one is held.
    proxy.arm(&format!("{sid}\r\n$4\r\n{}\r\n", ttl.as_millis()));
    tokio::time::timeout(ttl, proxy.hold.held.notified())
        .await
        .expect("no renewal was held");
    let g = a.lock("x").unwrap().acquire().await.unwrap();
    proxy.hold.deliver.notify_one();
    tokio::time::timeout(Duration::from_secs(5), proxy.hold.answered.notified())
        .await
        .expect("the late renewal got no answer");

    // Over the next renewals (three a TTL), A keeps `x`.
    if let Ok(reason) = tokio::time::timeout(ttl, g.lost()).await {
        panic!("A lost the lock it acquired after the late renewal's list: {reason:?}");
    }
    let e = b.lock("x").unwrap().try_acquire().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e}");
    assert_eq!(a.session_id().await.unwrap(), sid);
    g.release().await.unwrap();
    a.close().await;
    b.close().await;
}
