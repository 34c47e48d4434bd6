//! An HTTP/1.1-aware proxy between clients and one server (Consul's HTTP
//! API): it sees each request and its answer whole, so a test can lose,
//! delay or cut the answer to one chosen request, after the server applied
//! it. The TCP proxy ([`super::TcpProxy`]) cannot: it sees bytes, not
//! requests.
//!
//! A fault is a rule: a [`Match`] on method, path and body, the n-th
//! request that matches it from the moment the rule is added, and an
//! [`HttpFault`]. Each rule fires once ([`HttpProxy::on`]), or on every
//! match until it is released ([`HttpProxy::on_every`]). Every request is logged
//! ([`HttpProxy::requests`]), so tests can also count what a client sent.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

/// Which requests a rule applies to. Every part given must match.
#[derive(Debug, Clone, Default)]
pub struct Match {
    method: Option<String>,
    path: Option<String>,
    body: Vec<String>,
    body_not: Vec<String>,
}

impl Match {
    /// Every request.
    pub fn any() -> Match {
        Match::default()
    }

    /// Requests with this method (`GET`, `PUT`, ...).
    pub fn method(mut self, m: &str) -> Match {
        self.method = Some(m.to_ascii_uppercase());
        self
    }

    /// Requests whose target (path and query) starts with `p`.
    pub fn path(mut self, p: &str) -> Match {
        self.path = Some(p.to_string());
        self
    }

    /// Requests whose body contains `s` (repeat for several).
    pub fn body(mut self, s: &str) -> Match {
        self.body.push(s.to_string());
        self
    }

    /// Requests whose body does not contain `s`.
    pub fn body_not(mut self, s: &str) -> Match {
        self.body_not.push(s.to_string());
        self
    }

    /// Whether `r` matches.
    pub fn matches(&self, r: &Seen) -> bool {
        self.method.as_ref().is_none_or(|m| *m == r.method)
            && self.path.as_ref().is_none_or(|p| r.target.starts_with(p))
            && self.body.iter().all(|s| r.body.contains(s))
            && !self.body_not.iter().any(|s| r.body.contains(s))
    }
}

/// What happens to the chosen request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpFault {
    /// The request is forwarded and answered; the answer is thrown away and
    /// the client's connection closed: the server applied the request, the
    /// client never learns the outcome.
    DropAnswer,
    /// The request is held this long (or until [`HttpRule::release`])
    /// before it is forwarded: the server applies it late.
    DelayRequest(Duration),
    /// The answer is held this long (or until [`HttpRule::release`]).
    DelayAnswer(Duration),
    /// Half of the answer passes, then the connection is reset (RST).
    ResetMidAnswer,
    /// The request is held, the client's connection is reset (RST) at
    /// once, and the request is forwarded this long later (or at
    /// [`HttpRule::release`]); its answer is thrown away. The client gives
    /// up on a request that the server applies after whatever the client
    /// did next: a request that an agent, a load balancer or a proxy
    /// delivers late. [`HttpRule::wait_done`] resolves once the server
    /// answered it.
    LateRequest(Duration),
    /// The request is not forwarded: the proxy answers it at once with this
    /// HTTP status (and a short text body), as an agent does that has no
    /// leader (`500 No cluster leader`). The connection stays open.
    Status(u16),
}

/// One request as the proxy saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// `GET`, `PUT`, ...
    pub method: String,
    /// Path and query.
    pub target: String,
    /// The body (lossy UTF-8).
    pub body: String,
    /// When it arrived.
    pub at: Instant,
}

struct RuleState {
    matcher: Match,
    nth: u64,
    fault: HttpFault,
    /// Fires on every match from the `nth` on, until released.
    every: bool,
    matched: AtomicU64,
    /// Requests it fired on.
    hits: AtomicU64,
    /// 0: waiting; 1: the chosen request arrived; 2: its fault was applied.
    stage: watch::Sender<u8>,
    released: watch::Sender<bool>,
    /// The chosen request was written to the server.
    forwarded: watch::Sender<bool>,
}

/// A rule added with [`HttpProxy::on`].
#[derive(Clone)]
pub struct HttpRule {
    state: Arc<RuleState>,
}

impl std::fmt::Debug for HttpRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpRule")
            .field("matcher", &self.state.matcher)
            .field("nth", &self.state.nth)
            .field("fault", &self.state.fault)
            .field("stage", &*self.state.stage.borrow())
            .finish()
    }
}

impl HttpRule {
    /// Whether the chosen request has arrived.
    pub fn hit(&self) -> bool {
        *self.state.stage.borrow() >= 1
    }

    /// Waits until the chosen request has arrived (a delayed request is
    /// being held now).
    pub async fn wait_hit(&self) {
        let mut rx = self.state.stage.subscribe();
        let _ = rx.wait_for(|s| *s >= 1).await;
    }

    /// Waits until the fault was applied: the answer dropped or reset, the
    /// delayed request or answer passed on.
    pub async fn wait_done(&self) {
        let mut rx = self.state.stage.subscribe();
        let _ = rx.wait_for(|s| *s >= 2).await;
    }

    /// Waits until the chosen request was written to the server (a
    /// delayed request passed on; the server may not have read it yet).
    pub async fn wait_forwarded(&self) {
        let mut rx = self.state.forwarded.subscribe();
        let _ = rx.wait_for(|f| *f).await;
    }

    /// How many requests it fired on so far.
    pub fn hits(&self) -> u64 {
        self.state.hits.load(Ordering::SeqCst)
    }

    /// Waits until it fired on at least `n` requests.
    pub async fn wait_hits(&self, n: u64) {
        let mut rx = self.state.stage.subscribe();
        let _ = rx.wait_for(|_| self.hits() >= n).await;
    }

    /// Ends a delay now. A rule of [`HttpProxy::on_every`] also stops
    /// firing: later requests pass untouched.
    pub fn release(&self) {
        self.state.released.send_replace(true);
    }

    async fn hold(&self, d: Duration) {
        let mut rx = self.state.released.subscribe();
        let _ = tokio::time::timeout(d, rx.wait_for(|r| *r)).await;
    }
}

#[derive(Default)]
struct Shared {
    rules: Mutex<Vec<HttpRule>>,
    log: Mutex<Vec<Seen>>,
}

impl Shared {
    /// Logs `r` and returns the rule it fires, if any (the first one).
    fn pick(&self, r: &Seen) -> Option<HttpRule> {
        self.log.lock().unwrap().push(r.clone());
        let mut rules = self.rules.lock().unwrap();
        // A rule of `on_every` ends when it is released.
        rules.retain(|x| !(x.state.every && *x.state.released.borrow()));
        let mut fired = None;
        for rule in rules.iter() {
            let s = &rule.state;
            let nth = s.matcher.matches(r) && {
                let n = s.matched.fetch_add(1, Ordering::SeqCst) + 1;
                n == s.nth || (s.every && n > s.nth)
            };
            if nth && fired.is_none() {
                fired = Some(rule.clone());
            }
        }
        if let Some(f) = &fired {
            if !f.state.every {
                rules.retain(|x| !Arc::ptr_eq(&x.state, &f.state));
            }
            f.state.hits.fetch_add(1, Ordering::SeqCst);
            // Wakes `wait_hits` on every hit, never moves a stage back.
            f.state.stage.send_modify(|s| *s = (*s).max(1));
            tracing::debug!(method = %r.method, target = %r.target, fault = ?f.state.fault, "http proxy: fault");
        }
        fired
    }
}

/// An HTTP/1.1 proxy on `127.0.0.1:<ephemeral>` forwarding to one server,
/// one server connection per client connection. Dropping it closes the
/// listener (open connections end with their client).
pub struct HttpProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for HttpProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpProxy")
            .field("addr", &self.addr)
            .finish()
    }
}

impl HttpProxy {
    /// Starts a proxy to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<HttpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                tokio::spawn(connection(sock, target, s.clone()));
            }
        });
        Ok(HttpProxy {
            addr,
            shared,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Applies `fault` to the `nth` request (1: the next one) from now on
    /// that matches `m`.
    pub fn on(&self, m: Match, nth: u64, fault: HttpFault) -> HttpRule {
        self.add(m, nth, fault, false)
    }

    /// Applies `fault` to every request from now on that matches `m`,
    /// until [`HttpRule::release`] (which also lets held requests pass)
    /// or [`HttpProxy::clear_rules`].
    pub fn on_every(&self, m: Match, fault: HttpFault) -> HttpRule {
        self.add(m, 1, fault, true)
    }

    fn add(&self, m: Match, nth: u64, fault: HttpFault, every: bool) -> HttpRule {
        let rule = HttpRule {
            state: Arc::new(RuleState {
                matcher: m,
                nth: nth.max(1),
                fault,
                every,
                matched: AtomicU64::new(0),
                hits: AtomicU64::new(0),
                stage: watch::channel(0).0,
                released: watch::channel(false).0,
                forwarded: watch::channel(false).0,
            }),
        };
        self.shared.rules.lock().unwrap().push(rule.clone());
        rule
    }

    /// Drops every rule that has not fired yet.
    pub fn clear_rules(&self) {
        self.shared.rules.lock().unwrap().clear();
    }

    /// Every request seen so far, in arrival order.
    pub fn requests(&self) -> Vec<Seen> {
        self.shared.log.lock().unwrap().clone()
    }

    /// How many requests matching `m` arrived at or after `since`.
    pub fn count_since(&self, m: &Match, since: Instant) -> usize {
        let log = self.shared.log.lock().unwrap();
        log.iter().filter(|r| r.at >= since && m.matches(r)).count()
    }
}

impl Drop for HttpProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// One message read off a connection: its raw bytes, and for a request
/// its method, target and body.
struct Message {
    raw: Vec<u8>,
    first: String,
    body_at: usize,
}

/// Reads one HTTP/1.1 message (head and body). `None` on EOF before a
/// message starts, or on any error.
async fn read_message<R: tokio::io::AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    is_response_to_head: Option<bool>,
) -> Option<Message> {
    let mut raw = Vec::new();
    let mut first = String::new();
    let mut length: Option<usize> = None;
    let mut chunked = false;
    loop {
        let start = raw.len();
        let n = rd.read_until(b'\n', &mut raw).await.ok()?;
        if n == 0 {
            return None;
        }
        let line = String::from_utf8_lossy(&raw[start..])
            .trim_end()
            .to_string();
        if first.is_empty() {
            if line.is_empty() {
                continue; // stray CRLF between messages
            }
            first = line;
            continue;
        }
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "content-length" {
                length = v.parse().ok();
            } else if k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked") {
                chunked = true;
            }
        }
    }
    let body_at = raw.len();
    let no_body = match is_response_to_head {
        None => false,
        Some(head) => {
            let code: u16 = first
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            head || code / 100 == 1 || code == 204 || code == 304
        }
    };
    if no_body {
    } else if chunked {
        loop {
            let start = raw.len();
            if rd.read_until(b'\n', &mut raw).await.ok()? == 0 {
                return None;
            }
            let line = String::from_utf8_lossy(&raw[start..]).trim().to_string();
            let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
            if size == 0 {
                // Trailers, up to an empty line.
                loop {
                    let start = raw.len();
                    if rd.read_until(b'\n', &mut raw).await.ok()? == 0 {
                        return None;
                    }
                    if raw[start..].iter().all(|b| *b == b'\r' || *b == b'\n') {
                        break;
                    }
                }
                break;
            }
            let at = raw.len();
            raw.resize(at + size + 2, 0);
            rd.read_exact(&mut raw[at..]).await.ok()?;
        }
    } else if let Some(n) = length {
        let at = raw.len();
        raw.resize(at + n, 0);
        rd.read_exact(&mut raw[at..]).await.ok()?;
    } else if is_response_to_head.is_some() {
        // No length: the body runs to the end of the connection.
        rd.read_to_end(&mut raw).await.ok()?;
    }
    Some(Message {
        raw,
        first,
        body_at,
    })
}

fn reset(s: &TcpStream) {
    let _ = s.set_zero_linger();
}

async fn connection(client: TcpStream, target: SocketAddr, shared: Arc<Shared>) {
    let Ok(server) = TcpStream::connect(target).await else {
        return reset(&client);
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (crd, mut cwr) = client.into_split();
    let (srd, mut swr) = server.into_split();
    let (mut crd, mut srd) = (BufReader::new(crd), BufReader::new(srd));
    loop {
        let Some(req) = read_message(&mut crd, None).await else {
            return;
        };
        let mut parts = req.first.split_whitespace();
        let seen = Seen {
            method: parts.next().unwrap_or_default().to_string(),
            target: parts.next().unwrap_or_default().to_string(),
            body: String::from_utf8_lossy(&req.raw[req.body_at..]).into_owned(),
            at: Instant::now(),
        };
        let rule = shared.pick(&seen);
        let fault = rule.as_ref().map(|r| r.state.fault);
        if let (Some(r), Some(HttpFault::DelayRequest(d))) = (&rule, fault) {
            r.hold(d).await;
        }
        if let (Some(r), Some(HttpFault::LateRequest(d))) = (&rule, fault) {
            if let Ok(c) = crd.into_inner().reunite(cwr) {
                reset(&c);
            }
            r.hold(d).await;
            if swr.write_all(&req.raw).await.is_ok() {
                r.state.forwarded.send_replace(true);
                let _ = read_message(&mut srd, Some(seen.method == "HEAD")).await;
            }
            r.state.stage.send_replace(2);
            return;
        }
        if let (Some(r), Some(HttpFault::Status(code))) = (&rule, fault) {
            let body = format!("quorumlock test proxy: injected {code}\n");
            let out = format!(
                "HTTP/1.1 {code} Injected\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            if cwr.write_all(out.as_bytes()).await.is_err() {
                return;
            }
            r.state.stage.send_replace(2);
            continue;
        }
        if swr.write_all(&req.raw).await.is_err() {
            return;
        }
        if let Some(r) = &rule {
            r.state.forwarded.send_replace(true);
        }
        let Some(resp) = read_message(&mut srd, Some(seen.method == "HEAD")).await else {
            return;
        };
        let done = |r: &Option<HttpRule>| {
            if let Some(r) = r {
                r.state.stage.send_replace(2);
            }
        };
        match fault {
            Some(HttpFault::DropAnswer) => {
                let _ = cwr.shutdown().await;
                done(&rule);
                return;
            }
            Some(HttpFault::ResetMidAnswer) => {
                let _ = cwr.write_all(&resp.raw[..resp.raw.len() / 2]).await;
                let _ = cwr.flush().await;
                let client = crd.into_inner().reunite(cwr);
                if let Ok(c) = client {
                    reset(&c);
                }
                done(&rule);
                return;
            }
            Some(HttpFault::DelayAnswer(d)) => {
                if let Some(r) = &rule {
                    r.hold(d).await;
                }
            }
            _ => {}
        }
        if cwr.write_all(&resp.raw).await.is_err() {
            return;
        }
        done(&rule);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny HTTP server: answers every request with its own body
    /// (Content-Length), or chunked when the path is `/chunked`, and
    /// counts the requests it served.
    async fn server() -> (SocketAddr, Arc<AtomicU64>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let served = Arc::new(AtomicU64::new(0));
        let s = served.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = l.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    let (rd, mut wr) = sock.into_split();
                    let mut rd = BufReader::new(rd);
                    while let Some(m) = read_message(&mut rd, None).await {
                        s.fetch_add(1, Ordering::SeqCst);
                        let body = &m.raw[m.body_at..];
                        let out = if m.first.contains("/chunked") {
                            let mut o =
                                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
                            o.extend(format!("{:x}\r\n", body.len()).bytes());
                            o.extend(body);
                            o.extend(b"\r\n0\r\n\r\n");
                            o
                        } else {
                            let mut o = format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                                body.len()
                            )
                            .into_bytes();
                            o.extend(body);
                            o
                        };
                        if wr.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, served)
    }

    async fn call(c: &mut BufReader<TcpStream>, path: &str, body: &str) -> Option<String> {
        let req = format!(
            "PUT {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        c.get_mut().write_all(req.as_bytes()).await.ok()?;
        let m = read_message(c, Some(false)).await?;
        Some(String::from_utf8_lossy(&m.raw[m.body_at..]).into_owned())
    }

    fn unchunk(s: &str) -> String {
        s.lines().nth(1).unwrap_or_default().to_string()
    }

    #[tokio::test]
    async fn passes_logs_and_drops_the_chosen_answer() {
        let (addr, served) = server().await;
        let p = HttpProxy::start(addr).await.unwrap();
        let rule = p.on(
            Match::any().method("PUT").body("two"),
            2,
            HttpFault::DropAnswer,
        );
        let mut c = BufReader::new(TcpStream::connect(p.addr()).await.unwrap());
        assert_eq!(call(&mut c, "/v1/a", "one").await.unwrap(), "one");
        assert_eq!(
            call(&mut c, "/chunked", "two")
                .await
                .map(|s| unchunk(&s))
                .unwrap(),
            "two"
        );
        assert!(!rule.hit());
        // The second match: applied by the server, the answer lost.
        assert_eq!(call(&mut c, "/v1/b", "two").await, None);
        rule.wait_done().await;
        assert_eq!(served.load(Ordering::SeqCst), 3);
        // Fired once: later matches pass.
        let mut c = BufReader::new(TcpStream::connect(p.addr()).await.unwrap());
        assert_eq!(call(&mut c, "/v1/b", "two").await.unwrap(), "two");
        let seen = p.requests();
        assert_eq!(seen.len(), 4);
        assert_eq!(seen[2].target, "/v1/b");
        assert_eq!(p.count_since(&Match::any().path("/v1/"), seen[0].at), 3);
    }

    #[tokio::test]
    async fn delays_a_request_until_released_and_resets_mid_answer() {
        let (addr, served) = server().await;
        let p = HttpProxy::start(addr).await.unwrap();
        let held = p.on(
            Match::any().path("/slow"),
            1,
            HttpFault::DelayRequest(Duration::from_secs(60)),
        );
        let mut c = BufReader::new(TcpStream::connect(p.addr()).await.unwrap());
        let call_slow = tokio::spawn(async move { call(&mut c, "/slow", "late").await });
        held.wait_hit().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(served.load(Ordering::SeqCst), 0, "forwarded while held");
        held.release();
        held.wait_forwarded().await;
        assert_eq!(call_slow.await.unwrap().unwrap(), "late");
        assert_eq!(served.load(Ordering::SeqCst), 1);

        let slow = p.on(
            Match::any(),
            1,
            HttpFault::DelayAnswer(Duration::from_millis(300)),
        );
        let mut c = BufReader::new(TcpStream::connect(p.addr()).await.unwrap());
        let t = Instant::now();
        assert_eq!(call(&mut c, "/x", "a").await.unwrap(), "a");
        assert!(t.elapsed() >= Duration::from_millis(300));
        slow.wait_done().await;

        let cut = p.on(Match::any(), 1, HttpFault::ResetMidAnswer);
        assert_eq!(call(&mut c, "/x", "abcdefgh").await, None);
        cut.wait_done().await;
        assert_eq!(served.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn answers_every_match_with_a_status_until_released() {
        let (addr, served) = server().await;
        let p = HttpProxy::start(addr).await.unwrap();
        let rule = p.on_every(Match::any().path("/err"), HttpFault::Status(500));
        let mut c = BufReader::new(TcpStream::connect(p.addr()).await.unwrap());
        for _ in 0..3 {
            // Answered by the proxy on the same connection, not forwarded.
            let m = {
                let req = "PUT /err HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx";
                c.get_mut().write_all(req.as_bytes()).await.unwrap();
                read_message(&mut c, Some(false)).await.unwrap()
            };
            assert!(m.first.contains(" 500 "), "{}", m.first);
        }
        rule.wait_hits(3).await;
        assert_eq!(rule.hits(), 3);
        assert_eq!(call(&mut c, "/ok", "y").await.unwrap(), "y");
        assert_eq!(served.load(Ordering::SeqCst), 1);
        rule.release();
        assert_eq!(call(&mut c, "/err", "z").await.unwrap(), "z");
        assert_eq!(rule.hits(), 3);
        assert_eq!(served.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_late_request_fails_the_client_first_and_reaches_the_server_later() {
        let (addr, served) = server().await;
        let p = HttpProxy::start(addr).await.unwrap();
        let late = p.on(
            Match::any().path("/late"),
            1,
            HttpFault::LateRequest(Duration::from_secs(60)),
        );
        let mut c = BufReader::new(TcpStream::connect(p.addr()).await.unwrap());
        // The client's side ends at once, before the server has it.
        assert_eq!(call(&mut c, "/late", "x").await, None);
        assert!(late.hit());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(served.load(Ordering::SeqCst), 0, "forwarded before release");
        // Other connections pass meanwhile.
        let mut c = BufReader::new(TcpStream::connect(p.addr()).await.unwrap());
        assert_eq!(call(&mut c, "/now", "y").await.unwrap(), "y");
        late.release();
        late.wait_done().await;
        assert_eq!(served.load(Ordering::SeqCst), 2, "the late request arrived");
    }
}
