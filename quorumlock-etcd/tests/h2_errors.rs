//! HTTP/2 errors on a write of unknown outcome (issue 39, suspicion 2).
//!
//! tonic reports an HTTP/2 stream or connection error (a `RST_STREAM` or
//! `GOAWAY` with `INTERNAL_ERROR`, `PROTOCOL_ERROR`, `NO_ERROR`, ...) as a
//! gRPC status `Internal` ("h2 protocol error: ..."). Such an error says
//! nothing about whether etcd got the request: a proxy, a load balancer or
//! a member forwarding to its leader may reset the stream after passing
//! the request on. A write of an acquire attempt that ends this way may
//! still create the attempt's key, so the attempt's abandon must fence it
//! off as after a transport error or a timeout.
//!
//! A small HTTP/2-aware proxy of our own reads the frames the client
//! sends; armed, it passes on the `HEADERS` of the first request whose
//! body (`DATA`) carries a given byte string (the lock's key prefix: the
//! enqueue txn), holds that body, and answers the client at once with a
//! `RST_STREAM(INTERNAL_ERROR)` for the stream. Flushed, it sends the held
//! body on to etcd, which then applies the txn, late.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::Harness;
use quorumlock_core::url::Url;
use quorumlock_core::{ErrorKind, LockClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

const SOON: Duration = Duration::from_secs(30);

fn harness(var: &str) -> Option<Harness> {
    Harness::from_env(var, |url| async move {
        Ok(Arc::new(quorumlock_etcd::EtcdBackend::connect(&url).await?) as _)
    })
}

fn target_of(url: &Url) -> SocketAddr {
    let host = url.host_str().unwrap();
    let port = url.port().unwrap_or(2379);
    std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .unwrap()
        .next()
        .unwrap()
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const INTERNAL_ERROR: u32 = 2;

/// One HTTP/2 frame: its 9-byte header and payload.
struct Frame {
    head: [u8; 9],
    payload: Vec<u8>,
}

impl Frame {
    fn kind(&self) -> u8 {
        self.head[3]
    }

    fn stream(&self) -> u32 {
        u32::from_be_bytes(self.head[5..9].try_into().unwrap()) & 0x7fff_ffff
    }

    fn rst(stream: u32, code: u32) -> Frame {
        let mut head = [0u8, 0, 4, RST_STREAM, 0, 0, 0, 0, 0];
        head[5..9].copy_from_slice(&stream.to_be_bytes());
        Frame {
            head,
            payload: code.to_be_bytes().to_vec(),
        }
    }

    async fn read(r: &mut (impl AsyncReadExt + Unpin)) -> Option<Frame> {
        let mut head = [0u8; 9];
        r.read_exact(&mut head).await.ok()?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        r.read_exact(&mut payload).await.ok()?;
        Some(Frame { head, payload })
    }

    async fn write(&self, w: &mut (impl AsyncWriteExt + Unpin)) -> bool {
        w.write_all(&self.head).await.is_ok() && w.write_all(&self.payload).await.is_ok()
    }
}

#[derive(Clone, Default)]
struct Control {
    /// Reset the first request whose body contains this, and hold its body.
    catch: Option<Vec<u8>>,
    /// Send the held body on.
    flushed: bool,
}

struct ResetProxy {
    addr: SocketAddr,
    control: watch::Sender<Control>,
    /// The stream reset (0: none yet).
    caught: watch::Receiver<u32>,
    /// Set once etcd answered the held request.
    answered: watch::Receiver<bool>,
}

impl ResetProxy {
    async fn start(target: SocketAddr) -> ResetProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let control = watch::channel(Control::default()).0;
        let (caught_tx, caught) = watch::channel(0u32);
        let (answered_tx, answered) = watch::channel(false);
        let (caught_tx, answered_tx) = (Arc::new(caught_tx), Arc::new(answered_tx));
        let taken = Arc::new(AtomicBool::new(false));
        let c = control.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let conn = Connection {
                    control: c.subscribe(),
                    caught: caught_tx.clone(),
                    answered: answered_tx.clone(),
                    taken: taken.clone(),
                };
                tokio::spawn(conn.run(client, target));
            }
        });
        ResetProxy {
            addr,
            control,
            caught,
            answered,
        }
    }

    fn url(&self, url: &Url) -> Url {
        let mut u = url.clone();
        u.set_host(Some("127.0.0.1")).unwrap();
        u.set_port(Some(self.addr.port())).unwrap();
        u
    }

    fn arm(&self, marker: &[u8]) {
        self.control
            .send_modify(|c| c.catch = Some(marker.to_vec()));
    }

    fn flush(&self) {
        self.control.send_modify(|c| c.flushed = true);
    }
}

struct Connection {
    control: watch::Receiver<Control>,
    caught: Arc<watch::Sender<u32>>,
    answered: Arc<watch::Sender<bool>>,
    /// One request in all is reset.
    taken: Arc<AtomicBool>,
}

impl Connection {
    async fn run(mut self, client: TcpStream, target: SocketAddr) {
        let Ok(server) = TcpStream::connect(target).await else {
            return;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (mut crd, mut cwr) = client.into_split();
        let (mut srd, mut swr) = server.into_split();
        let mut preface = [0u8; 24];
        if crd.read_exact(&mut preface).await.is_err() || preface != PREFACE {
            return;
        }
        if swr.write_all(&preface).await.is_err() {
            return;
        }
        // Frames the client sends, read by a task of their own (a read is
        // not cancel-safe), and the resets to inject towards the client.
        let (up_tx, mut up_rx) = mpsc::unbounded_channel::<Frame>();
        tokio::spawn(async move {
            while let Some(f) = Frame::read(&mut crd).await {
                if up_tx.send(f).is_err() {
                    return;
                }
            }
        });
        let (inject_tx, mut inject_rx) = mpsc::unbounded_channel::<Frame>();
        let held_stream = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let answered = self.answered.clone();
        let watched = held_stream.clone();
        let down = async move {
            loop {
                tokio::select! {
                    f = Frame::read(&mut srd) => {
                        let Some(f) = f else { return };
                        let s = watched.load(Ordering::SeqCst);
                        if s != 0 && f.stream() == s && f.kind() == HEADERS {
                            answered.send_replace(true);
                        }
                        if !f.write(&mut cwr).await {
                            return;
                        }
                    }
                    Some(f) = inject_rx.recv() => {
                        if !f.write(&mut cwr).await {
                            return;
                        }
                    }
                }
            }
        };
        let up = async move {
            let mut held: Vec<Frame> = Vec::new();
            loop {
                let frame = tokio::select! {
                    f = up_rx.recv() => match f {
                        Some(f) => f,
                        None => return,
                    },
                    r = self.control.changed() => {
                        if r.is_err() {
                            return;
                        }
                        if self.control.borrow().flushed {
                            for f in held.drain(..) {
                                if !f.write(&mut swr).await {
                                    return;
                                }
                            }
                        }
                        continue;
                    }
                };
                let control = self.control.borrow().clone();
                let s = held_stream.load(Ordering::SeqCst);
                let hold = if s != 0 && frame.stream() == s {
                    frame.kind() == DATA && !control.flushed
                } else if let Some(marker) = &control.catch {
                    let hit = frame.kind() == DATA
                        && frame.stream() % 2 == 1
                        && frame
                            .payload
                            .windows(marker.len())
                            .any(|w| w == &marker[..])
                        && !self.taken.swap(true, Ordering::SeqCst);
                    if hit {
                        held_stream.store(frame.stream(), Ordering::SeqCst);
                        let _ = inject_tx.send(Frame::rst(frame.stream(), INTERNAL_ERROR));
                        self.caught.send_replace(frame.stream());
                    }
                    hit
                } else {
                    false
                };
                if hold {
                    held.push(frame);
                } else if !frame.write(&mut swr).await {
                    return;
                }
            }
        };
        tokio::select! {
            _ = down => {}
            _ = up => {}
        }
    }
}

/// An acquire attempt queued behind another client's holder; its enqueue
/// txn is reset (`RST_STREAM(INTERNAL_ERROR)`) before etcd has it, and
/// reaches etcd only after the attempt timed out and was abandoned. It
/// must create nothing: no entry of ours may wait in the queue, and the
/// lock must come free when its holder releases it.
async fn late_enqueue_after_an_h2_reset_creates_nothing(var: &str) {
    let Some(h) = harness(var) else { return };
    let case = h.case();
    let other = case.client().await;
    let url = h.url_for(case.namespace());
    let mut proxy = ResetProxy::start(target_of(&url)).await;
    let mut long = proxy.url(&url);
    // The held request must not cost the lease.
    long.query_pairs_mut().append_pair("ttl", "30s");
    let ours = LockClient::new(Arc::new(
        quorumlock_etcd::EtcdBackend::connect(&long).await.unwrap(),
    ));
    // Opens our session.
    quorumlock_conformance::support::open_session(&ours).await;
    let g0 = other.lock("h2m").unwrap().acquire().await.unwrap();
    let config = quorumlock_etcd::EtcdConfig::from_url(&url).unwrap();
    let prefix = config
        .namespace
        .lock_key(&quorumlock_core::LockName::new("h2m").unwrap());
    proxy.arm(format!("{prefix}/").as_bytes());

    let mut problems = Vec::new();
    let attempt = ours
        .lock("h2m")
        .unwrap()
        .acquire_timeout(Duration::from_millis(1500))
        .await;
    match attempt {
        Err(e) if e.kind() == ErrorKind::Timeout => {}
        Err(e) => problems.push(format!("the attempt failed with {e:?}, not Timeout")),
        Ok(g) => panic!("granted a held lock (token {})", g.token()),
    }
    tokio::time::timeout(SOON, proxy.caught.wait_for(|s| *s != 0))
        .await
        .expect("the proxy never saw the enqueue")
        .unwrap();
    tokio::time::timeout(SOON, ours.wait_idle())
        .await
        .expect("the abandon never finished");

    // The reset enqueue reaches etcd now.
    proxy.flush();
    tokio::time::timeout(SOON, proxy.answered.wait_for(|a| *a))
        .await
        .expect("etcd never answered the late enqueue")
        .unwrap();
    let st = other.inspect("h2m").await.unwrap();
    if !st.waiters.is_empty() {
        problems.push(format!(
            "the late enqueue left an entry of ours waiting: {:?}",
            st.waiters
                .iter()
                .map(|c| (&c.entry, c.token))
                .collect::<Vec<_>>()
        ));
    }
    g0.release().await.unwrap();
    match tokio::time::timeout(Duration::from_secs(5), other.lock("h2m").unwrap().acquire()).await {
        Ok(g) => g.unwrap().release().await.unwrap(),
        Err(_) => problems.push(
            "another client cannot acquire the lock after the late enqueue (5 s)".to_string(),
        ),
    }
    ours.close().await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    case.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_enqueue_after_an_h2_reset_creates_nothing_etcd34() {
    late_enqueue_after_an_h2_reset_creates_nothing("QUORUMLOCK_TEST_ETCD_URL").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_enqueue_after_an_h2_reset_creates_nothing_etcd35() {
    late_enqueue_after_an_h2_reset_creates_nothing("QUORUMLOCK_TEST_ETCD35_URL").await;
}
