//! A TCP proxy between one client and one store address, that can pass,
//! cut, blackhole, delay and reset the traffic.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{NetControl, NetMode};

/// The proxy's state as the connection tasks see it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct State {
    mode: NetMode,
    /// Bumped by every cut or reset: a connection started in an older
    /// epoch is closed (cut: FIN) or aborted (reset: RST).
    epoch: u64,
    abort: bool,
}

/// A one-shot fault at request granularity, armed on the proxy and
/// spent on the first request (client bytes) that any connection forwards
/// after arming, and on that connection's next answer (server bytes).
///
/// Exact for a protocol with one request in flight per connection (HTTP/1.1
/// as Consul's client uses it) and for ZooKeeper's ordered frames; on
/// etcd's HTTP/2 connection a "request" or "answer" is the next chunk of
/// frames in that direction (often a request or its answer, sometimes a
/// ping or a window update): an approximation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OneShot {
    /// The request reaches the server (which applies it); its answer is
    /// dropped and the connection reset.
    LoseAnswer,
    /// The request is dropped before the server sees it and the
    /// connection reset.
    LoseRequest,
    /// The answer is held back this long.
    DelayAnswer(Duration),
    /// The request is held back this long.
    DelayRequest(Duration),
}

/// Where an armed one-shot fault is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Armed {
    Idle,
    /// Waiting for the next request on any connection.
    Request(OneShot),
    /// The request went out on connection `conn`; waiting for its answer.
    Answer(OneShot, u64),
}

/// Counters of a proxy.
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Connections accepted from clients.
    pub accepted: AtomicU64,
    /// Bytes forwarded, both directions.
    pub bytes: AtomicU64,
    /// Chunks the clients sent (one read of client bytes each): a request,
    /// a ping, or on HTTP/2 a window update: what a client sends, counted
    /// outside the client.
    pub requests: AtomicU64,
    /// Mode changes away from [`NetMode::Pass`], and one-shot faults spent.
    pub faults: AtomicU64,
}

/// What the connections of one proxy share besides the mode.
#[derive(Debug)]
struct Shared {
    stats: ProxyStats,
    armed: std::sync::Mutex<Armed>,
    next_conn: AtomicU64,
}

/// A TCP proxy on `127.0.0.1:<ephemeral>` forwarding to one target.
///
/// Modes ([`NetMode`]):
/// - `Pass`: forward both ways.
/// - `Cut`: close every open connection (FIN) and refuse new ones (a new
///   connection is accepted and aborted at once, so the client sees a
///   reset rather than a hang).
/// - `Blackhole`: accept but never forward or answer; bytes already sent
///   wait in the kernel's buffers like unacknowledged segments and are
///   delivered if the mode goes back to `Pass` before the peer gives up,
///   as after a healed partition.
/// - `Delay(d)`: forward each chunk `d` after it was read (at least `d` of
///   added latency each way).
/// - `Reset`: abort every open connection (RST) and new ones while the
///   mode stays `Reset`. [`TcpProxy::reset`] aborts the open connections
///   and keeps passing new ones.
///
/// Dropping the proxy closes its listener and every connection.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    target: SocketAddr,
    state: Arc<watch::Sender<State>>,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Starts a proxy to `target` on an ephemeral port of 127.0.0.1.
    pub async fn start(target: SocketAddr) -> std::io::Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (tx, _) = watch::channel(State {
            mode: NetMode::Pass,
            epoch: 0,
            abort: false,
        });
        let state = Arc::new(tx);
        let shared = Arc::new(Shared {
            stats: ProxyStats::default(),
            armed: std::sync::Mutex::new(Armed::Idle),
            next_conn: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, target, state.clone(), shared.clone()));
        Ok(TcpProxy {
            addr,
            target,
            state,
            shared,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the proxy forwards to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// The counters.
    pub fn stats(&self) -> &ProxyStats {
        &self.shared.stats
    }

    /// Arms `fault` for the next request any connection forwards (it
    /// replaces a fault armed before and not yet spent).
    pub fn arm(&self, fault: OneShot) {
        *self.shared.armed.lock().expect("poisoned") = Armed::Request(fault);
    }

    /// Whether an armed fault is still waiting to be spent.
    pub fn armed(&self) -> bool {
        *self.shared.armed.lock().expect("poisoned") != Armed::Idle
    }

    /// Aborts (RST) every open connection; new ones pass.
    pub fn reset(&self) {
        self.set_mode(NetMode::Reset);
        self.set_mode(NetMode::Pass);
    }
}

impl NetControl for TcpProxy {
    fn set_mode(&self, mode: NetMode) {
        if mode != NetMode::Pass {
            self.shared.stats.faults.fetch_add(1, Ordering::Relaxed);
        }
        self.state.send_modify(|s| {
            match mode {
                NetMode::Cut => {
                    s.epoch += 1;
                    s.abort = false;
                }
                NetMode::Reset => {
                    s.epoch += 1;
                    s.abort = true;
                }
                _ => {}
            }
            s.mode = mode;
        });
    }

    fn mode(&self) -> NetMode {
        self.state.borrow().mode
    }

    fn faults(&self) -> u64 {
        self.shared.stats.faults.load(Ordering::Relaxed)
    }

    fn requests(&self) -> u64 {
        self.shared.stats.requests.load(Ordering::Relaxed)
    }

    fn arm(&self, fault: OneShot) -> bool {
        TcpProxy::arm(self, fault);
        true
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Connection tasks see the sender gone and close.
        self.state.send_modify(|s| {
            s.mode = NetMode::Cut;
            s.epoch += 1;
            s.abort = false;
        });
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    state: Arc<watch::Sender<State>>,
    shared: Arc<Shared>,
) {
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        shared.stats.accepted.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(connection(sock, target, state.subscribe(), shared.clone()));
    }
}

fn abort(s: &TcpStream) {
    let _ = s.set_zero_linger();
}

async fn connection(
    client: TcpStream,
    target: SocketAddr,
    mut rx: watch::Receiver<State>,
    shared: Arc<Shared>,
) {
    // Until the path is open: hold the connection while blackholed,
    // refuse it while cut or reset.
    let epoch = loop {
        let s = *rx.borrow_and_update();
        match s.mode {
            NetMode::Blackhole => {
                if rx.changed().await.is_err() {
                    return abort(&client);
                }
            }
            NetMode::Cut | NetMode::Reset => return abort(&client),
            NetMode::Pass | NetMode::Delay(_) => break s.epoch,
        }
    };
    let server = match TcpStream::connect(target).await {
        Ok(s) => s,
        Err(_) => return abort(&client),
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (crd, cwr) = client.into_split();
    let (srd, swr) = server.into_split();
    let conn = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    let kill = Arc::new(watch::channel(false).0);
    let up = Way {
        shared: shared.clone(),
        conn,
        up: true,
        kill: kill.clone(),
    };
    let down = Way {
        shared,
        conn,
        up: false,
        kill,
    };
    let up = tokio::spawn(pump(crd, swr, rx.clone(), epoch, up));
    pump(srd, cwr, rx, epoch, down).await;
    let _ = up.await;
}

/// One direction of one connection.
struct Way {
    shared: Arc<Shared>,
    conn: u64,
    /// Client to server.
    up: bool,
    /// Set when a one-shot fault breaks the connection: both ways abort.
    kill: Arc<watch::Sender<bool>>,
}

/// What an armed one-shot fault does to a chunk.
enum Spend {
    Pass,
    Drop,
    Delay(Duration),
}

impl Way {
    /// Spends the armed fault on this chunk if it is the one it waits for.
    fn spend(&self) -> Spend {
        let mut armed = self.shared.armed.lock().expect("poisoned");
        let (fault, spent) = match *armed {
            Armed::Request(f) if self.up => match f {
                OneShot::LoseRequest => (Spend::Drop, Armed::Idle),
                OneShot::DelayRequest(d) => (Spend::Delay(d), Armed::Idle),
                _ => (Spend::Pass, Armed::Answer(f, self.conn)),
            },
            Armed::Answer(f, conn) if !self.up && conn == self.conn => match f {
                OneShot::DelayAnswer(d) => (Spend::Delay(d), Armed::Idle),
                _ => (Spend::Drop, Armed::Idle),
            },
            _ => return Spend::Pass,
        };
        *armed = spent;
        if !matches!(fault, Spend::Pass) {
            self.shared.stats.faults.fetch_add(1, Ordering::Relaxed);
        }
        fault
    }
}

/// What a direction does next, given the current state.
enum Next {
    Forward(Option<Duration>),
    Wait,
    Close { abort: bool },
}

fn next(s: &State, epoch: u64) -> Next {
    if s.epoch != epoch {
        return Next::Close { abort: s.abort };
    }
    match s.mode {
        NetMode::Pass => Next::Forward(None),
        NetMode::Delay(d) => Next::Forward(Some(d)),
        NetMode::Blackhole => Next::Wait,
        // A cut or reset always bumps the epoch; this is not reached.
        NetMode::Cut => Next::Close { abort: false },
        NetMode::Reset => Next::Close { abort: true },
    }
}

async fn close(rd: OwnedReadHalf, mut wr: OwnedWriteHalf, abort_it: bool) {
    if abort_it {
        abort(rd.as_ref());
        abort(wr.as_ref());
        // No FIN first: the peer must see the reset.
        wr.forget();
        drop(rd);
    } else {
        let _ = wr.shutdown().await;
    }
}

/// Forwards one direction until EOF, an error, or a cut/reset.
async fn pump(
    mut rd: OwnedReadHalf,
    mut wr: OwnedWriteHalf,
    mut rx: watch::Receiver<State>,
    epoch: u64,
    way: Way,
) {
    let stats = &way.shared.stats;
    let mut killed = way.kill.subscribe();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if *killed.borrow_and_update() {
            return close(rd, wr, true).await;
        }
        let s = *rx.borrow_and_update();
        match next(&s, epoch) {
            Next::Close { abort } => return close(rd, wr, abort).await,
            Next::Wait => {
                tokio::select! {
                    r = rx.changed() => if r.is_err() {
                        return close(rd, wr, false).await;
                    },
                    _ = killed.changed() => {}
                }
            }
            Next::Forward(_) => {
                let n = tokio::select! {
                    r = rd.read(&mut buf) => match r {
                        Ok(0) | Err(_) => return close(rd, wr, false).await,
                        Ok(n) => n,
                    },
                    r = rx.changed() => {
                        if r.is_err() {
                            return close(rd, wr, false).await;
                        }
                        continue;
                    }
                    _ = killed.changed() => continue,
                };
                if way.up {
                    stats.requests.fetch_add(1, Ordering::Relaxed);
                }
                let mut read_at = Instant::now();
                match way.spend() {
                    Spend::Pass => {}
                    // Lost: the connection breaks, as a lost packet's
                    // connection would once its retransmits ran out.
                    Spend::Drop => {
                        way.kill.send_replace(true);
                        return close(rd, wr, true).await;
                    }
                    Spend::Delay(d) => {
                        tokio::time::sleep(d).await;
                        read_at = Instant::now();
                    }
                }
                // Deliver under whatever mode is in force now.
                loop {
                    let s = *rx.borrow_and_update();
                    match next(&s, epoch) {
                        Next::Close { abort } => return close(rd, wr, abort).await,
                        Next::Wait => {
                            if rx.changed().await.is_err() {
                                return close(rd, wr, false).await;
                            }
                        }
                        Next::Forward(delay) => {
                            if let Some(d) = delay {
                                let until = read_at + d;
                                if Instant::now() < until {
                                    tokio::select! {
                                        _ = tokio::time::sleep_until(until) => {}
                                        r = rx.changed() => {
                                            if r.is_err() {
                                                return close(rd, wr, false).await;
                                            }
                                            continue;
                                        }
                                    }
                                }
                            }
                            if wr.write_all(&buf[..n]).await.is_err() {
                                return close(rd, wr, false).await;
                            }
                            stats.bytes.fetch_add(n as u64, Ordering::Relaxed);
                            break;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;
    use tokio::time::timeout;

    /// An echo server on an ephemeral loopback port.
    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if s.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        s.write_all(msg).await?;
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got).await?;
        Ok(got)
    }

    const SHORT: Duration = Duration::from_millis(300);

    #[tokio::test]
    async fn pass_forwards_both_ways() {
        let p = TcpProxy::start(echo_server().await).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        for i in 0..20u8 {
            let msg = vec![i; 1000 + i as usize * 500];
            assert_eq!(round_trip(&mut c, &msg).await.unwrap(), msg);
        }
        assert_eq!(p.stats().accepted.load(Ordering::Relaxed), 1);
        assert!(p.stats().bytes.load(Ordering::Relaxed) > 2 * 20 * 1000);
    }

    #[tokio::test]
    async fn delay_adds_latency_each_way() {
        let p = TcpProxy::start(echo_server().await).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        let start = Instant::now();
        round_trip(&mut c, b"fast").await.unwrap();
        let fast = start.elapsed();
        p.set_mode(NetMode::Delay(Duration::from_millis(100)));
        let start = Instant::now();
        assert_eq!(round_trip(&mut c, b"slow").await.unwrap(), b"slow");
        let slow = start.elapsed();
        assert!(slow >= Duration::from_millis(200), "{slow:?}");
        assert!(slow < Duration::from_secs(2), "{slow:?}");
        assert!(fast < Duration::from_millis(100), "{fast:?}");
        p.set_mode(NetMode::Pass);
        let start = Instant::now();
        round_trip(&mut c, b"fast").await.unwrap();
        assert!(start.elapsed() < Duration::from_millis(100));
        assert_eq!(p.faults(), 1);
    }

    #[tokio::test]
    async fn blackhole_holds_traffic_until_healed() {
        let p = TcpProxy::start(echo_server().await).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        round_trip(&mut c, b"hello").await.unwrap();
        p.set_mode(NetMode::Blackhole);
        c.write_all(b"lost?").await.unwrap();
        let mut buf = [0u8; 5];
        assert!(
            timeout(SHORT, c.read_exact(&mut buf)).await.is_err(),
            "answered through a blackhole"
        );
        // A new connection is accepted but gets no answer either.
        let mut c2 = TcpStream::connect(p.addr()).await.unwrap();
        c2.write_all(b"new").await.unwrap();
        let mut b2 = [0u8; 3];
        assert!(timeout(SHORT, c2.read_exact(&mut b2)).await.is_err());
        // Healing delivers what was held, on both connections.
        p.set_mode(NetMode::Pass);
        timeout(SHORT * 5, c.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf, b"lost?");
        timeout(SHORT * 5, c2.read_exact(&mut b2))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&b2, b"new");
    }

    #[tokio::test]
    async fn cut_closes_open_connections_and_refuses_new_ones() {
        let p = TcpProxy::start(echo_server().await).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        round_trip(&mut c, b"hello").await.unwrap();
        p.set_mode(NetMode::Cut);
        let mut buf = [0u8; 8];
        let n = timeout(SHORT * 5, c.read(&mut buf))
            .await
            .expect("cut connection hangs");
        assert_eq!(n.unwrap(), 0, "expected EOF on a cut connection");
        // New connections are refused (reset) while cut.
        let refused = match TcpStream::connect(p.addr()).await {
            Err(_) => true,
            Ok(mut c2) => {
                let r = timeout(SHORT * 5, round_trip(&mut c2, b"x"))
                    .await
                    .expect("hangs");
                r.is_err()
            }
        };
        assert!(refused, "a new connection passed while cut");
        // Healed: new connections pass again.
        p.set_mode(NetMode::Pass);
        let mut c3 = TcpStream::connect(p.addr()).await.unwrap();
        assert_eq!(round_trip(&mut c3, b"back").await.unwrap(), b"back");
    }

    #[tokio::test]
    async fn reset_aborts_open_connections_only() {
        let p = TcpProxy::start(echo_server().await).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        round_trip(&mut c, b"hello").await.unwrap();
        p.reset();
        let mut buf = [0u8; 8];
        let r = timeout(SHORT * 5, c.read(&mut buf))
            .await
            .expect("reset connection hangs");
        match r {
            Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}"),
            Ok(n) => panic!("expected a reset, read {n} bytes"),
        }
        // New connections pass at once after a reset.
        let mut c2 = TcpStream::connect(p.addr()).await.unwrap();
        assert_eq!(round_trip(&mut c2, b"again").await.unwrap(), b"again");
        // Sticky reset mode: new ones are aborted too.
        p.set_mode(NetMode::Reset);
        let mut c3 = TcpStream::connect(p.addr()).await.unwrap();
        let r = timeout(SHORT * 5, round_trip(&mut c3, b"x"))
            .await
            .expect("hangs");
        assert!(r.is_err(), "passed while in reset mode");
        let r = timeout(SHORT * 5, round_trip(&mut c2, b"y"))
            .await
            .expect("hangs");
        assert!(r.is_err(), "an older connection survived the reset");
    }

    /// A server that counts the bytes it got and echoes them.
    async fn counting_echo() -> (SocketAddr, Arc<AtomicU64>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let got = Arc::new(AtomicU64::new(0));
        let g = got.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let g = g.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        g.fetch_add(n as u64, Ordering::SeqCst);
                        if s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, got)
    }

    #[tokio::test]
    async fn lose_answer_applies_the_request_and_breaks_the_connection() {
        let (server, got) = counting_echo().await;
        let p = TcpProxy::start(server).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        round_trip(&mut c, b"one").await.unwrap();
        p.arm(OneShot::LoseAnswer);
        assert!(p.armed());
        let r = timeout(SHORT * 5, round_trip(&mut c, b"two"))
            .await
            .expect("hangs");
        assert!(r.is_err(), "the answer came through: {r:?}");
        assert_eq!(got.load(Ordering::SeqCst), 6, "the server got the request");
        assert!(!p.armed(), "spent once");
        let mut c2 = TcpStream::connect(p.addr()).await.unwrap();
        assert_eq!(round_trip(&mut c2, b"three").await.unwrap(), b"three");
    }

    #[tokio::test]
    async fn lose_request_never_reaches_the_server() {
        let (server, got) = counting_echo().await;
        let p = TcpProxy::start(server).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        round_trip(&mut c, b"one").await.unwrap();
        p.arm(OneShot::LoseRequest);
        let r = timeout(SHORT * 5, round_trip(&mut c, b"two"))
            .await
            .expect("hangs");
        assert!(r.is_err(), "answered: {r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            got.load(Ordering::SeqCst),
            3,
            "the server saw the lost request"
        );
    }

    #[tokio::test]
    async fn delay_answer_holds_one_answer_back() {
        let p = TcpProxy::start(echo_server().await).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        round_trip(&mut c, b"warm").await.unwrap();
        p.arm(OneShot::DelayAnswer(Duration::from_millis(200)));
        let start = Instant::now();
        round_trip(&mut c, b"slow").await.unwrap();
        assert!(start.elapsed() >= Duration::from_millis(200));
        let start = Instant::now();
        round_trip(&mut c, b"fast").await.unwrap();
        assert!(start.elapsed() < Duration::from_millis(150));
    }

    #[tokio::test]
    async fn dropping_the_proxy_closes_connections() {
        let p = TcpProxy::start(echo_server().await).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        round_trip(&mut c, b"hello").await.unwrap();
        drop(p);
        let mut buf = [0u8; 8];
        let n = timeout(SHORT * 5, c.read(&mut buf))
            .await
            .expect("hangs after drop");
        assert!(matches!(n, Ok(0) | Err(_)));
    }
}
