//! Request-level faults (issue 15): one chosen request to the agent is
//! delayed, or its answer lost after the agent applied it, through the
//! HTTP proxy of the fault suite (`quorumlock_conformance::faults::HttpProxy`).
//! Each test puts the client under test behind its own proxy and the other
//! clients (holders, waiters, the operator) on a direct link.
//!
//! Needs `QUORUMLOCK_TEST_CONSUL_URL`. The tests run one at a time
//! ([`serially`]): the first needs a cluster quiet enough for a repeat
//! acquire to leave out its read.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::faults::{HttpFault, HttpProxy, HttpRule, Match};
use quorumlock_conformance::repeat::serially;
use quorumlock_core::{LockClient, LockGuard, Result};
use tokio::time::{timeout, Instant};

const SOON: Duration = Duration::from_secs(30);
/// Long enough that a held request never passes by itself: tests release it.
const HOLD: Duration = Duration::from_secs(60);

/// The agent's URL, or a skip (a failure with `QUORUMLOCK_TEST_REQUIRE=1`).
fn agent_url() -> Option<quorumlock_core::url::Url> {
    let raw = std::env::var("QUORUMLOCK_TEST_CONSUL_URL")
        .ok()
        .filter(|v| !v.is_empty());
    let Some(raw) = raw else {
        if std::env::var("QUORUMLOCK_TEST_REQUIRE").is_ok_and(|v| v == "1") {
            panic!("QUORUMLOCK_TEST_CONSUL_URL is not set and QUORUMLOCK_TEST_REQUIRE=1");
        }
        eprintln!("SKIPPED: QUORUMLOCK_TEST_CONSUL_URL is not set");
        return None;
    };
    Some(quorumlock_core::url::parse(&raw).expect("QUORUMLOCK_TEST_CONSUL_URL"))
}

/// One test: a fresh namespace, the agent's address, and every client made.
struct Env {
    base: quorumlock_core::url::Url,
    ns: String,
    clients: Vec<LockClient>,
}

impl Env {
    fn new() -> Option<Env> {
        let base = agent_url()?;
        Some(Env {
            base,
            ns: format!("qlr-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
            clients: Vec::new(),
        })
    }

    fn agent(&self) -> SocketAddr {
        let host = self.base.host_str().unwrap().trim_matches(['[', ']']);
        let port = self.base.port().unwrap_or(quorumlock_consul::DEFAULT_PORT);
        (host, port).to_socket_addrs().unwrap().next().unwrap()
    }

    async fn connect(&mut self, addr: SocketAddr, options: &str) -> LockClient {
        let url = format!("consul://{addr}/{}?{options}", self.ns);
        let url = quorumlock_core::url::parse(&url).unwrap();
        let b = quorumlock_consul::ConsulBackend::connect(&url)
            .await
            .unwrap();
        let c = LockClient::new(Arc::new(b));
        self.clients.push(c.clone());
        c
    }

    /// A client on a direct link.
    async fn client(&mut self, options: &str) -> LockClient {
        let a = self.agent();
        self.connect(a, options).await
    }

    /// A client behind a new HTTP proxy, and the proxy.
    async fn proxied(&mut self, options: &str) -> (LockClient, HttpProxy) {
        let p = HttpProxy::start(self.agent()).await.unwrap();
        let c = self.connect(p.addr(), options).await;
        (c, p)
    }

    /// The key prefix of lock `name`.
    fn key(&self, name: &str) -> String {
        format!("{}/{name}/.", self.ns)
    }

    /// Closes every client and checks that nothing is left.
    async fn finish(self) {
        for c in &self.clients {
            timeout(SOON, c.wait_idle()).await.expect("cleanup");
            c.close().await;
        }
        let url =
            quorumlock_core::url::parse(&format!("consul://{}/{}", self.agent(), self.ns)).unwrap();
        let probe = quorumlock_consul::ConsulBackend::connect(&url)
            .await
            .unwrap();
        let left = quorumlock_core::backend::Backend::leftovers(&probe)
            .await
            .unwrap();
        assert_eq!(left, Vec::<String>::new(), "left on the store");
    }
}

/// A txn whose first op is `verb` on a key of lock `name`.
fn txn_starting(env: &Env, verb: &str, name: &str) -> Match {
    Match::any().method("PUT").path("/v1/txn").body(&format!(
        r#"[{{"KV":{{"Verb":"{verb}","Key":"{}"#,
        env.key(name)
    ))
}

async fn acquire(c: &LockClient, name: &str) -> LockGuard {
    timeout(SOON, c.lock(name).unwrap().acquire())
        .await
        .expect("acquire took too long")
        .unwrap()
}

fn spawn_acquire(c: &LockClient, name: &str) -> tokio::task::JoinHandle<Result<LockGuard>> {
    let (c, name) = (c.clone(), name.to_string());
    tokio::spawn(async move { c.lock(&name).unwrap().acquire().await })
}

/// The `ModifyIndex` of `key` once an operator's break has rewritten it
/// (its record marked broken), read straight from the agent: `inspect`
/// shows a broken entry as nobody's.
async fn broken_index(env: &Env, key: &str) -> Option<u64> {
    use base64::Engine as _;
    let e = raw_entry(env, key).await?;
    let value = base64::engine::general_purpose::STANDARD
        .decode(e["Value"].as_str()?)
        .ok()?;
    let record: serde_json::Value = serde_json::from_slice(&value).ok()?;
    (record["broken"] == true).then(|| e["ModifyIndex"].as_u64().unwrap())
}

/// The entry `key` as the agent answers it (JSON), or `None` if absent.
async fn raw_entry(env: &Env, key: &str) -> Option<serde_json::Value> {
    let url = format!("http://{}/v1/kv/{key}", env.agent());
    let rsp = reqwest::get(&url).await.unwrap();
    if rsp.status() == reqwest::StatusCode::NOT_FOUND {
        return None;
    }
    let entries: serde_json::Value = rsp.error_for_status().unwrap().json().await.unwrap();
    Some(entries[0].clone())
}

/// The `ModifyIndex` of `key`, read straight from the agent (`inspect`
/// does not show a `.lock` that its taker is giving back as held).
async fn raw_index(env: &Env, key: &str) -> Option<u64> {
    raw_entry(env, key).await?["ModifyIndex"].as_u64()
}

async fn waiters(c: &LockClient, name: &str) -> usize {
    c.inspect(name).await.unwrap().waiters.len()
}

async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < SOON, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Finding 1: a repeat fast acquire that left out its read, but whose
/// `.lock` did not land two indexes after its last grant, reads the lock
/// after its grant. If that read comes late (held here), after an operator
/// broke the lock and another client took it, the acquire must not take
/// the other holder's `.lock` (and token) for its own grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_read_after_a_fast_grant_never_takes_another_holders_lock() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=1h").await;
        let admin = env.client("lock_delay=1s").await;
        let d = env.client("").await;
        let other = env.client("").await;
        let (rule, mut a_acq) = fast_grant_with_its_read_held(&env, &a, &other, &proxy).await;
        // A holds `.lock` but has not reported it; an operator breaks it and
        // D takes the lock.
        assert!(admin.break_lock("x").await.unwrap());
        let dg = acquire(&d, "x").await;
        rule.release();
        match timeout(Duration::from_secs(3), &mut a_acq).await {
            Err(_) => {} // still waiting: right
            Ok(r) => {
                let g = r.unwrap().unwrap();
                panic!(
                    "granted with token {} while D holds with token {} (is_held: {} and {})",
                    g.token(),
                    dg.token(),
                    g.is_held(),
                    dg.is_held()
                );
            }
        }
        let d_token = dg.token();
        dg.release().await.unwrap();
        let g = timeout(SOON, a_acq)
            .await
            .expect("A never granted")
            .unwrap()
            .unwrap();
        assert!(g.token() > d_token, "{} after {d_token}", g.token());
        g.release().await.unwrap();
    })
    .await;
    env.finish().await;
}

/// Cycles `a` (behind `proxy`) on lock `x` until a repeat fast acquire
/// leaves out its read, has `other` write elsewhere so that this acquire
/// must read after its grant, and holds that read: returns the rule that
/// holds it and the acquire, whose `.lock` is written but not reported.
async fn fast_grant_with_its_read_held(
    env: &Env,
    a: &LockClient,
    other: &LockClient,
    proxy: &HttpProxy,
) -> (HttpRule, tokio::task::JoinHandle<Result<LockGuard>>) {
    let cycle = |c: LockClient, name: &'static str| async move {
        acquire(&c, name).await.release().await.unwrap();
    };
    for attempt in 1..=40 {
        cycle(a.clone(), "x").await;
        cycle(a.clone(), "x").await; // quiet: the next one leaves out its read
        cycle(other.clone(), "elsewhere").await; // ...and reads after its grant
        let rule = proxy.on(
            txn_starting(env, "get-tree", "x"),
            1,
            HttpFault::DelayRequest(HOLD),
        );
        let mut acq = spawn_acquire(a, "x");
        tokio::select! {
            _ = rule.wait_hit() => {
                eprintln!("the read after a fast grant is held (attempt {attempt})");
                return (rule, acq);
            }
            r = &mut acq => {
                // The cluster was busy: the read stayed in the acquire.
                proxy.clear_rules();
                r.unwrap().unwrap().release().await.unwrap();
            }
        }
    }
    panic!("never found the cluster quiet enough");
}

/// A fast holder of `x` (no queue key) and, queued behind it in this
/// order, X and W behind proxies of their own and P between them.
struct Line {
    hg: LockGuard,
    x_acq: tokio::task::JoinHandle<Result<LockGuard>>,
    xproxy: HttpProxy,
    p_acq: tokio::task::JoinHandle<Result<LockGuard>>,
    w_acq: tokio::task::JoinHandle<Result<LockGuard>>,
    wproxy: HttpProxy,
}

async fn holder_and_three_in_line(env: &mut Env) -> Line {
    let holder = env.client("").await;
    let (x, xproxy) = env.proxied("").await;
    let p = env.client("").await;
    let (w, wproxy) = env.proxied("").await;
    let hg = acquire(&holder, "x").await;
    let mut queued = Vec::new();
    for (who, c) in [("X", &x), ("P", &p), ("W", &w)] {
        queued.push(spawn_acquire(c, "x"));
        let n = queued.len();
        eventually(&format!("{who} to queue"), || async {
            waiters(&holder, "x").await == n
        })
        .await;
    }
    let [x_acq, p_acq, w_acq] = <[_; 3]>::try_from(queued).unwrap_or_else(|_| unreachable!());
    Line {
        hg,
        x_acq,
        xproxy,
        p_acq,
        w_acq,
        wproxy,
    }
}

/// X is granted (not deadlocked) and holds while W waits; W is granted
/// after X lets go.
async fn x_then_w(
    x_acq: tokio::task::JoinHandle<Result<LockGuard>>,
    w_acq: tokio::task::JoinHandle<Result<LockGuard>>,
) {
    let xg = timeout(SOON, x_acq)
        .await
        .expect("X never granted (deadlocked?)")
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(xg.is_held(), "{:?}", xg.loss());
    assert!(!w_acq.is_finished(), "W granted while X holds");
    let x_token = xg.token();
    xg.release().await.unwrap();
    let wg = timeout(SOON, w_acq)
        .await
        .expect("W never granted")
        .unwrap()
        .unwrap();
    assert!(wg.token() > x_token);
    wg.release().await.unwrap();
}

/// A mutex's take (step 4's txn; a waiter's first txn with
/// `check-session`, unless a take of it lost its answer before).
fn take() -> Match {
    Match::any()
        .path("/v1/txn")
        .body(r#""Verb":"check-session""#)
}

/// A waiter whose contender ahead left takes `.lock` at once and reads the
/// line in the same txn; if someone is still ahead of it (here X, first in
/// line, whose own take is held while the contender between them gave
/// up), it must give `.lock` back unreported, and X is served first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_predecessor_left_does_not_jump_the_line() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let Line {
            hg,
            x_acq,
            xproxy,
            p_acq,
            mut w_acq,
            ..
        } = holder_and_three_in_line(&mut env).await;
        // X's take (after the holder lets go) is held.
        let x_take = xproxy.on(take(), 1, HttpFault::DelayRequest(HOLD));
        hg.release().await.unwrap();
        timeout(SOON, x_take.wait_hit())
            .await
            .expect("X never tried to take the lock");
        // P, between X and W, gives up: W's blocking query on P returns.
        p_acq.abort();
        assert!(p_acq.await.unwrap_err().is_cancelled());
        if let Ok(r) = timeout(Duration::from_millis(1500), &mut w_acq).await {
            let g = r.unwrap().unwrap();
            panic!(
                "W was granted (token {}) while X, ahead of it, waited",
                g.token()
            );
        }
        x_take.release();
        x_then_w(x_acq, w_acq).await;
    })
    .await;
    env.finish().await;
}

/// The take of a waiter whose contender ahead left is lost and reaches
/// the agent late: after the waiter has looked again and waits behind X
/// (on X's key, not on `.lock`), and after the holder let go. That late
/// take must not land: a `.lock` of the waiter's then would be one that X
/// waits for and the waiter never sees (both would wait forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_take_of_a_waiter_behind_someone_does_not_deadlock() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let Line {
            hg,
            x_acq,
            xproxy,
            p_acq,
            w_acq,
            wproxy,
        } = holder_and_three_in_line(&mut env).await;
        let w_take = wproxy.on(take(), 1, HttpFault::LateRequest(HOLD));
        // P gives up: W tries to take the lock (held: its txn fails
        // anyway, but W does not know), looks again and waits behind X.
        p_acq.abort();
        assert!(p_acq.await.unwrap_err().is_cancelled());
        timeout(SOON, w_take.wait_hit())
            .await
            .expect("W never tried to take the lock");
        tokio::time::sleep(Duration::from_millis(500)).await;
        // The holder lets go; X's take is held; W's lost take lands.
        let x_take = xproxy.on(take(), 1, HttpFault::DelayRequest(HOLD));
        hg.release().await.unwrap();
        timeout(SOON, x_take.wait_hit())
            .await
            .expect("X never tried to take the lock");
        w_take.release();
        timeout(SOON, w_take.wait_done())
            .await
            .expect("W's late take never reached the agent");
        x_take.release();
        x_then_w(x_acq, w_acq).await;
    })
    .await;
    env.finish().await;
}

/// A queued holder's queue key rewritten during a break's grace (what a
/// waiter that took `.lock` unawares does before it waits again, see the
/// mutex's `settle`): the break still deletes the broken `.lock`, so the
/// lock can be taken after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_whose_holder_rewrote_its_queue_key_still_frees_the_lock() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let first = env.client("").await;
        let holder = env.client("").await;
        let admin = env.client("lock_delay=2s").await;
        let fg = acquire(&first, "x").await;
        let h_acq = spawn_acquire(&holder, "x");
        eventually("the holder to queue", || async {
            waiters(&admin, "x").await == 1
        })
        .await;
        fg.release().await.unwrap();
        let hg = timeout(SOON, h_acq).await.unwrap().unwrap().unwrap();
        let session = hg.session_id();
        let qkey = format!("{}queue/{session}", env.key("x"));
        let a2 = admin.clone();
        let breaking = tokio::spawn(async move { a2.break_lock("x").await });
        timeout(SOON, hg.lost())
            .await
            .expect("the break was not seen");
        // The holder's queue key rewritten in the grace, by its session.
        let url = format!("http://{}/v1/kv/{qkey}?acquire={session}", env.agent());
        let rsp = reqwest::Client::new()
            .put(&url)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(rsp.text().await.unwrap().trim(), "true", "rewriting {qkey}");
        assert!(timeout(SOON, breaking).await.unwrap().unwrap().unwrap());
        let st = admin.inspect("x").await.unwrap();
        assert!(st.is_free(), "after the break: {st:?}");
        let g = timeout(SOON, admin.lock("x").unwrap().try_acquire())
            .await
            .expect("try_acquire after the break")
            .unwrap_or_else(|e| panic!("the lock after the break: {e}"));
        g.release().await.unwrap();
        hg.release().await.ok(); // lost
    })
    .await;
    env.finish().await;
}

/// Finding 1, the variant inside the break's grace: the late read shows
/// `.lock` still locked by our session but rewritten by the operator's
/// break (another index, marked broken). That is not our grant: the
/// acquire waits until the break is done and takes the lock after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_read_inside_a_break_never_grants_the_broken_lock() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=1h").await;
        let admin = env.client("lock_delay=4s").await;
        let other = env.client("").await;
        let (rule, mut a_acq) = fast_grant_with_its_read_held(&env, &a, &other, &proxy).await;
        let ours = admin.inspect("x").await.unwrap().holders[0].token;
        let a2 = admin.clone();
        let breaking = tokio::spawn(async move { a2.break_lock("x").await });
        let start = Instant::now();
        let lock_key = format!("{}lock", env.key("x"));
        let broken_at = loop {
            if let Some(at) = broken_index(&env, &lock_key).await {
                break at;
            }
            assert!(start.elapsed() < SOON, "the break never rewrote .lock");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(broken_at > ours, "{broken_at} <= {ours}");
        let st = admin.inspect("x").await.unwrap();
        assert!(st.holders.is_empty(), "the broken .lock shown held: {st:?}");
        rule.release();
        if let Ok(r) = timeout(Duration::from_millis(1500), &mut a_acq).await {
            let g = r.unwrap().unwrap();
            panic!(
                "granted during the break's grace with token {} (the broken .lock is at {broken_at})",
                g.token()
            );
        }
        assert!(timeout(SOON, breaking).await.unwrap().unwrap().unwrap());
        let g = timeout(SOON, a_acq)
            .await
            .expect("never granted after the break")
            .unwrap()
            .unwrap();
        assert!(g.token() > broken_at, "{} after {broken_at}", g.token());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(g.is_held(), "{:?}", g.loss());
        g.release().await.unwrap();
    })
    .await;
    env.finish().await;
}

/// Finding 2: the answer to a fast acquire is lost after the agent applied
/// it (A holds `.lock` and does not know), and another contender queues
/// before A looks again: A must find its own `.lock` (at any place in the
/// queue), not wait behind a contender that waits for A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_answer_to_a_fast_acquire_does_not_deadlock() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("").await;
        let b = env.client("").await;
        let lost = proxy.on(
            txn_starting(&env, "check-not-exists", "x"),
            1,
            HttpFault::DropAnswer,
        );
        let join = proxy.on(
            Match::any()
                .path("/v1/txn")
                .body(&format!(r#""Verb":"lock","Key":"{}queue/"#, env.key("x"))),
            1,
            HttpFault::DelayRequest(HOLD),
        );
        let mut a_acq = spawn_acquire(&a, "x");
        timeout(SOON, lost.wait_done()).await.expect("no fast acquire");
        // Before A looks again (if it queues), B queues.
        let queued_first = tokio::select! {
            _ = join.wait_hit() => true,
            _ = tokio::time::sleep(Duration::from_secs(5)) => false,
        };
        let b_acq = spawn_acquire(&b, "x");
        eventually("B to queue", || async { waiters(&b, "x").await >= 1 }).await;
        join.release();
        let g = match timeout(Duration::from_secs(15), &mut a_acq).await {
            Ok(r) => r.unwrap().unwrap(),
            Err(_) => panic!(
                "A was never granted (queued again: {queued_first}): it waits behind B, which waits for A's .lock; inspect: {:?}",
                b.inspect("x").await.unwrap()
            ),
        };
        let a_token = g.token();
        g.release().await.unwrap();
        let bg = timeout(SOON, b_acq).await.expect("B never granted").unwrap().unwrap();
        assert!(bg.token() > a_token);
        bg.release().await.unwrap();
    })
    .await;
    env.finish().await;
}

/// Finding 3 (and the issue's "done when"): a revoke request to an
/// uncontended holder does not make its waiter spin: the waiter sends no
/// more requests per second after the request than before it (+1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_request_does_not_make_a_waiter_spin() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let holder = env.client("ttl=1h").await;
        let (w, proxy) = env.proxied("ttl=1h").await;
        let g = acquire(&holder, "x").await;
        let w_acq = spawn_acquire(&w, "x");
        eventually("the waiter to queue", || async {
            waiters(&holder, "x").await == 1
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let window = Duration::from_secs(2);
        let t0 = Instant::now();
        tokio::time::sleep(window).await;
        let before = proxy.count_since(&Match::any(), t0);
        assert!(holder.request_revoke("x").await.unwrap());
        timeout(SOON, g.revoke_requested())
            .await
            .expect("revoke not seen");
        let t1 = Instant::now();
        tokio::time::sleep(window).await;
        let after = proxy.count_since(&Match::any(), t1);
        eprintln!(
            "waiter requests in {window:?}: {before} before the revoke request, {after} after"
        );
        let secs = window.as_secs() as usize;
        assert!(
            after <= before + secs,
            "the waiter sent {after} requests in {window:?} after a revoke request, {before} before"
        );
        g.release().await.unwrap();
        let wg = timeout(SOON, w_acq)
            .await
            .expect("waiter not granted")
            .unwrap()
            .unwrap();
        wg.release().await.unwrap();
    })
    .await;
    env.finish().await;
}

/// Finding 5: a reader whose entry an operator broke before its grant
/// (the re-read after its wait lands in the break's grace, while the entry
/// is rewritten as broken) is not granted that broken entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_entry_broken_before_its_grant_is_not_granted() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let writer = env.client("").await;
        let admin = env.client("lock_delay=3s").await;
        let (r, proxy) = env.proxied("").await;
        let wg = timeout(SOON, writer.rwlock("x").unwrap().write())
            .await
            .unwrap()
            .unwrap();
        let r2 = r.clone();
        let r_acq = tokio::spawn(async move { r2.rwlock("x").unwrap().read().await });
        eventually("the reader to queue", || async {
            waiters(&admin, "x").await == 1
        })
        .await;
        let reread = proxy.on(
            txn_starting(&env, "get-tree", "x"),
            1,
            HttpFault::DelayRequest(HOLD),
        );
        wg.release().await.unwrap();
        timeout(SOON, reread.wait_hit())
            .await
            .expect("the reader never re-read");
        // The reader holds by its place now; the operator breaks it.
        let before = admin.inspect("x").await.unwrap();
        assert_eq!(before.holders.len(), 1, "{before:?}");
        let joined = before.holders[0].token;
        let entry = before.holders[0].entry.clone();
        let a2 = admin.clone();
        let breaking = tokio::spawn(async move { a2.break_lock("x").await });
        let start = Instant::now();
        let broken_at = loop {
            if let Some(at) = broken_index(&env, &entry).await {
                break at;
            }
            assert!(start.elapsed() < SOON, "the break never rewrote the entry");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(broken_at > joined, "{broken_at} <= {joined}");
        reread.release();
        let g = timeout(SOON, r_acq)
            .await
            .expect("reader never granted")
            .unwrap()
            .unwrap();
        assert_ne!(
            g.token(),
            broken_at,
            "granted the entry the operator broke (token {broken_at})"
        );
        assert!(timeout(SOON, breaking).await.unwrap().unwrap().unwrap());
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            g.is_held(),
            "the reader's grant was taken by the break: {:?}",
            g.loss()
        );
        g.release().await.unwrap();
    })
    .await;
    env.finish().await;
}

/// Finding 6: `delete-cas` of a missing key succeeds on Consul. An
/// operator's break whose holder let go during the grace (and queued
/// again, behind a reader) must not delete that new queue key of the same
/// session with its phase 2: the waiter keeps its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_after_the_holder_let_go_keeps_its_new_place_in_line() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let h = env.client("").await;
        let r = env.client("").await;
        let admin = env.client("lock_delay=3s").await;
        let g = acquire(&h, "x").await;
        let a2 = admin.clone();
        let breaking = tokio::spawn(async move { a2.break_lock("x").await });
        timeout(SOON, g.lost())
            .await
            .expect("the break was not seen");
        g.release().await.ok(); // lost: its release removes what is left
        let rg = timeout(SOON, r.rwlock("x").unwrap().read())
            .await
            .unwrap()
            .unwrap();
        let h_acq = spawn_acquire(&h, "x");
        eventually("the holder to queue again", || async {
            waiters(&admin, "x").await == 1
        })
        .await;
        let place = admin.inspect("x").await.unwrap().waiters[0].clone();
        assert!(
            !breaking.is_finished(),
            "the break ended before the holder queued again: make its grace longer"
        );
        assert!(timeout(SOON, breaking).await.unwrap().unwrap().unwrap());
        let st = admin.inspect("x").await.unwrap();
        assert_eq!(st.waiters.len(), 1, "{st:?}");
        assert_eq!(
            (st.waiters[0].entry.as_str(), st.waiters[0].token),
            (place.entry.as_str(), place.token),
            "the break's second phase removed the waiter's new queue key"
        );
        rg.release().await.unwrap();
        let hg = timeout(SOON, h_acq)
            .await
            .expect("never granted")
            .unwrap()
            .unwrap();
        hg.release().await.unwrap();
    })
    .await;
    env.finish().await;
}

/// Finding 7: A's fast grant finds a contender of ours ahead, so A gives
/// `.lock` back; an operator's break lands before the give-back. A's
/// acquire must go on waiting (and be granted after the contender), not
/// fail with a non-retryable error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_before_the_give_back_does_not_fail_the_acquire() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let holder = env.client("").await;
        let admin = env.client("lock_delay=1s").await;
        let (b, bproxy) = env.proxied("").await;
        let (a, aproxy) = env.proxied("").await;
        let hg = acquire(&holder, "x").await;
        let b_acq = spawn_acquire(&b, "x");
        eventually("B to queue", || async { waiters(&admin, "x").await == 1 }).await;
        // B's grant (after the holder's release) is held: B is in line
        // ahead of anyone who comes now, and `.lock` is free.
        let b_take = bproxy.on(take(), 1, HttpFault::DelayRequest(HOLD));
        hg.release().await.unwrap();
        timeout(SOON, b_take.wait_hit())
            .await
            .expect("B never tried to take the lock");
        // The give-back: `.lock` deleted at A's token, A's queue key written.
        let give_back = aproxy.on(
            Match::any()
                .path("/v1/txn")
                .body(&format!(
                    r#""Verb":"delete-cas","Key":"{}lock""#,
                    env.key("x")
                ))
                .body(&format!(r#""Verb":"lock","Key":"{}queue/"#, env.key("x"))),
            1,
            HttpFault::DelayRequest(HOLD),
        );
        let a_acq = spawn_acquire(&a, "x");
        timeout(SOON, give_back.wait_hit())
            .await
            .expect("A never gave the lock back");
        // A's grant, being given back: `inspect` no longer shows it as
        // held (an observer would report a leader that never led), so
        // its `.lock` is read from the agent.
        let lock_key = format!("{}lock", env.key("x"));
        let a_token = raw_index(&env, &lock_key)
            .await
            .expect("A's fast grant of .lock");
        assert!(
            admin.inspect("x").await.unwrap().holders.is_empty(),
            "a grant being given back shown as held"
        );
        let a2 = admin.clone();
        let breaking = tokio::spawn(async move { a2.break_lock("x").await });
        eventually("the break's rewrite", || async {
            raw_index(&env, &lock_key).await != Some(a_token)
        })
        .await;
        give_back.release();
        b_take.release();
        assert!(timeout(SOON, breaking).await.unwrap().unwrap().unwrap());
        let bg = timeout(SOON, b_acq)
            .await
            .expect("B never granted")
            .unwrap()
            .unwrap();
        let b_token = bg.token();
        tokio::time::sleep(Duration::from_millis(200)).await;
        bg.release().await.unwrap();
        let g = timeout(SOON, a_acq)
            .await
            .expect("A never granted")
            .unwrap()
            .unwrap_or_else(|e| panic!("A's acquire failed: {e} ({:?})", e.kind()));
        assert!(g.token() > b_token);
        g.release().await.unwrap();
    })
    .await;
    env.finish().await;
}

/// Finding 8: with TTL 10 s, one renew whose answer never comes (it hangs
/// to its timeout) must leave time for another try before the local
/// deadline (TTL x 0.8 after the last confirmed renew was sent): the lock
/// is not reported lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hanging_renew_does_not_lose_the_lock() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=10s").await;
        let hang = proxy.on(
            Match::any().method("PUT").path("/v1/session/renew/"),
            1,
            HttpFault::DelayAnswer(HOLD),
        );
        let g = acquire(&a, "x").await;
        timeout(SOON, hang.wait_hit())
            .await
            .expect("no renew within 30 s");
        // Past the deadline of the session's first confirmation (8 s after
        // its create, the renew came at 5 s).
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(g.is_held(), "lost after one hanging renew: {:?}", g.loss());
        hang.release();
        g.release().await.unwrap();
    })
    .await;
    env.finish().await;
}

/// Finding 9: a malformed session id is bad input, not a store failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_session_with_a_malformed_id_is_invalid_argument() {
    let Some(mut env) = Env::new() else { return };
    let c = env.client("").await;
    for bad in ["", "not a session", "../../v1/kv/x"] {
        let e = c.backend().kill_session(bad).await.unwrap_err();
        assert_eq!(
            e.kind(),
            quorumlock_core::ErrorKind::InvalidArgument,
            "{bad:?}: {e}"
        );
    }
    env.finish().await;
}

/// A semaphore permit whose CAS answer was lost (the agent applied it) is
/// found on reading back; if another holder's CAS moved `.lock` in
/// between, `.lock`'s index is that holder's token, not ours: the two
/// permits must not share a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_answer_to_a_permit_does_not_share_another_holders_token() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("").await;
        let b = env.client("").await;
        let lost = proxy.on(
            Match::any()
                .path("/v1/txn")
                .body(&format!(r#""Verb":"cas","Key":"{}/s/.lock""#, env.ns)),
            1,
            HttpFault::DropAnswer,
        );
        let read_back = proxy.on(
            Match::any()
                .method("GET")
                .path(&format!("/v1/kv/{}/s/?recurse", env.ns)),
            1,
            HttpFault::DelayRequest(HOLD),
        );
        let a2 = a.clone();
        let a_acq = tokio::spawn(async move { a2.semaphore("s", 2).unwrap().acquire().await });
        timeout(SOON, lost.wait_done())
            .await
            .expect("A never took a permit");
        timeout(SOON, read_back.wait_hit())
            .await
            .expect("A never read back");
        let bg = timeout(SOON, b.semaphore("s", 2).unwrap().acquire())
            .await
            .unwrap()
            .unwrap();
        read_back.release();
        let ag = timeout(SOON, a_acq)
            .await
            .expect("A never granted")
            .unwrap()
            .unwrap();
        assert_ne!(ag.token(), bg.token(), "two permits with one token");
        ag.release().await.unwrap();
        bg.release().await.unwrap();
    })
    .await;
    env.finish().await;
}

// Late writes: a write of an acquire that the agent applies after the
// client gave up on it (its request cut on the client's side, delivered
// later: `HttpFault::LateRequest`), once the attempt was abandoned or
// released. It must create nothing: no key of ours may stay behind with no
// owner, where it blocks the lock until our session ends.

/// Every key in the test's namespace but the attempts' fences (which
/// belong to their session and go with it).
async fn keys_left(env: &Env) -> Vec<String> {
    let url = quorumlock_core::url::parse(&format!("consul://{}/{}", env.agent(), env.ns)).unwrap();
    let probe = quorumlock_consul::ConsulBackend::connect(&url)
        .await
        .unwrap();
    let mut keys = quorumlock_core::backend::Backend::leftovers(&probe)
        .await
        .unwrap();
    keys.retain(|k| !k.starts_with(&format!("{}/.fence/", env.ns)));
    keys
}

/// The fences in the test's namespace.
async fn fences(env: &Env) -> Vec<String> {
    let url = quorumlock_core::url::parse(&format!("consul://{}/{}", env.agent(), env.ns)).unwrap();
    let probe = quorumlock_consul::ConsulBackend::connect(&url)
        .await
        .unwrap();
    let mut keys = quorumlock_core::backend::Backend::leftovers(&probe)
        .await
        .unwrap();
    keys.retain(|k| k.starts_with(&format!("{}/.fence/", env.ns)));
    keys
}

/// After the late request landed: nothing of the abandoned attempt is
/// left, and `other` takes the lock within a few seconds.
async fn lock_is_free_after_late_write(env: &Env, late: &HttpRule, other: &LockClient) {
    late.release();
    timeout(SOON, late.wait_done())
        .await
        .expect("the late request never reached the agent");
    let left = keys_left(env).await;
    let g = timeout(Duration::from_secs(5), other.lock("x").unwrap().acquire()).await;
    assert!(
        left.is_empty(),
        "after the late write: {left:?} left on the store (lock free for another client: {})",
        g.is_ok()
    );
    let g = g
        .expect("another client could not take the lock after the late write")
        .unwrap();
    g.release().await.unwrap();
}

/// (a) A try-acquire whose fast-path txn is cut on our side fails and is
/// abandoned; the txn reaches the agent afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_fast_acquire_after_a_failed_try_leaves_nothing() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=1h").await;
        let b = env.client("").await;
        let late = proxy.on(
            txn_starting(&env, "check-not-exists", "x"),
            1,
            HttpFault::LateRequest(HOLD),
        );
        let r = timeout(SOON, a.lock("x").unwrap().try_acquire()).await;
        assert!(
            r.expect("try-acquire hung").is_err(),
            "granted by a cut txn"
        );
        assert!(late.hit());
        timeout(SOON, a.wait_idle()).await.expect("abandon hung");
        // The abandon fenced the attempt off, under our session.
        let sid = a.session_id().await.unwrap();
        let fences = fences(&env).await;
        assert!(
            fences.len() == 1 && fences[0].starts_with(&format!("{}/.fence/{sid}/", env.ns)),
            "{fences:?}"
        );
        lock_is_free_after_late_write(&env, &late, &b).await;
    })
    .await;
    env.finish().await;
}

/// (a) A waiting acquire whose fast-path txn is cut on our side is granted
/// through the queue and released; the fast txn reaches the agent after
/// the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_fast_acquire_after_the_release_leaves_nothing() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=1h").await;
        let b = env.client("").await;
        let late = proxy.on(
            txn_starting(&env, "check-not-exists", "x"),
            1,
            HttpFault::LateRequest(HOLD),
        );
        let g = acquire(&a, "x").await;
        assert!(late.hit(), "the fast txn was not the one cut");
        g.release().await.unwrap();
        timeout(SOON, a.wait_idle()).await.expect("release hung");
        lock_is_free_after_late_write(&env, &late, &b).await;
    })
    .await;
    env.finish().await;
}

/// (b) A try-acquire of a held lock whose queue join is cut on our side
/// fails and is abandoned; the join reaches the agent afterwards, when the
/// holder has let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_queue_join_after_a_failed_try_leaves_nothing() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=1h").await;
        let b = env.client("").await;
        let c = env.client("").await;
        let bg = acquire(&b, "x").await;
        let late = proxy.on(
            Match::any().path("/v1/txn").body(&format!(
                r#"[{{"KV":{{"Verb":"lock","Key":"{}queue/"#,
                env.key("x")
            )),
            1,
            HttpFault::LateRequest(HOLD),
        );
        let r = timeout(SOON, a.lock("x").unwrap().try_acquire()).await;
        assert!(r.expect("try-acquire hung").is_err());
        assert!(late.hit(), "the join was not the one cut");
        timeout(SOON, a.wait_idle()).await.expect("abandon hung");
        bg.release().await.unwrap();
        lock_is_free_after_late_write(&env, &late, &c).await;
    })
    .await;
    env.finish().await;
}

/// (c) A's fast txn is cut on its side; A queues behind C (which waits for
/// B's `.lock`). B lets go; before C sees it (C's answer is held), A's fast
/// txn lands on the free `.lock`. C must not then wait for A's `.lock`
/// while A waits for C's queue key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_fast_acquire_of_a_queued_waiter_does_not_deadlock() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, pa) = env.proxied("ttl=1h").await;
        let (c, pc) = env.proxied("ttl=1h").await;
        let b = env.client("").await;
        let bg = acquire(&b, "x").await;
        // C queues and waits on `.lock`; the answer to that wait is held.
        let c_wait = pc.on(
            Match::any()
                .method("GET")
                .path(&format!("/v1/kv/{}/x/.lock?", env.ns)),
            1,
            HttpFault::DelayAnswer(HOLD),
        );
        let c_acq = spawn_acquire(&c, "x");
        timeout(SOON, c_wait.wait_hit())
            .await
            .expect("C never waited on .lock");
        let late = pa.on(
            txn_starting(&env, "check-not-exists", "x"),
            1,
            HttpFault::LateRequest(HOLD),
        );
        let a_acq = spawn_acquire(&a, "x");
        timeout(SOON, late.wait_hit()).await.expect("A never tried");
        eventually("A to queue behind C", || async {
            waiters(&b, "x").await >= 2
        })
        .await;
        bg.release().await.unwrap();
        late.release();
        timeout(SOON, late.wait_done())
            .await
            .expect("the late request never reached the agent");
        c_wait.release();
        let cg = match timeout(Duration::from_secs(15), c_acq).await {
            Ok(r) => r.unwrap().unwrap(),
            Err(_) => panic!("C was never granted: {:?}", b.inspect("x").await.unwrap()),
        };
        let c_token = cg.token();
        cg.release().await.unwrap();
        let ag = timeout(SOON, a_acq)
            .await
            .expect("A never granted")
            .unwrap()
            .unwrap();
        assert!(ag.token() > c_token);
        ag.release().await.unwrap();
    })
    .await;
    env.finish().await;
}

/// (d) A try-write of a held read-write lock whose join is cut on our
/// side fails and is abandoned; the join reaches the agent afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_rw_join_after_a_failed_try_leaves_nothing() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=1h").await;
        let b = env.client("").await;
        let c = env.client("").await;
        let bg = acquire(&b, "x").await;
        let late = proxy.on(
            Match::any().path("/v1/txn").body(&format!(
                r#"[{{"KV":{{"Verb":"lock","Key":"{}rw/"#,
                env.key("x")
            )),
            1,
            HttpFault::LateRequest(HOLD),
        );
        let r = timeout(SOON, a.rwlock("x").unwrap().try_write()).await;
        assert!(r.expect("try-write hung").is_err());
        assert!(late.hit(), "the join was not the one cut");
        timeout(SOON, a.wait_idle()).await.expect("abandon hung");
        bg.release().await.unwrap();
        lock_is_free_after_late_write(&env, &late, &c).await;
    })
    .await;
    env.finish().await;
}

/// (d) A try-acquire of a full semaphore whose join is cut on our side
/// fails and is abandoned; the join reaches the agent afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_semaphore_join_after_a_failed_try_leaves_nothing() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=1h").await;
        let b = env.client("").await;
        let c = env.client("").await;
        let bg = timeout(SOON, b.semaphore("s", 1).unwrap().acquire())
            .await
            .unwrap()
            .unwrap();
        let late = proxy.on(
            Match::any()
                .path("/v1/txn")
                .body(&format!(r#"[{{"KV":{{"Verb":"lock","Key":"{}/s/"#, env.ns)),
            1,
            HttpFault::LateRequest(HOLD),
        );
        let r = timeout(SOON, a.semaphore("s", 1).unwrap().try_acquire()).await;
        assert!(r.expect("try-acquire hung").is_err());
        assert!(late.hit(), "the join was not the one cut");
        timeout(SOON, a.wait_idle()).await.expect("abandon hung");
        bg.release().await.unwrap();
        late.release();
        timeout(SOON, late.wait_done())
            .await
            .expect("the late request never reached the agent");
        let left = keys_left(&env).await;
        let g = timeout(
            Duration::from_secs(5),
            c.semaphore("s", 1).unwrap().acquire(),
        )
        .await;
        assert!(
            left.is_empty(),
            "after the late write: {left:?} left on the store (permit free for another client: {})",
            g.is_ok()
        );
        g.expect("another client could not take the permit after the late write")
            .unwrap()
            .release()
            .await
            .unwrap();
    })
    .await;
    env.finish().await;
}

/// (b) A waiting acquire of a held lock whose queue join is cut on our
/// side joins again and waits; it times out and is abandoned; the first
/// join reaches the agent afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_queue_join_after_a_timed_out_acquire_leaves_nothing() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=1h").await;
        let b = env.client("").await;
        let c = env.client("").await;
        let bg = acquire(&b, "x").await;
        let late = proxy.on(
            Match::any().path("/v1/txn").body(&format!(
                r#"[{{"KV":{{"Verb":"lock","Key":"{}queue/"#,
                env.key("x")
            )),
            1,
            HttpFault::LateRequest(HOLD),
        );
        let r = a
            .lock("x")
            .unwrap()
            .acquire_timeout(Duration::from_secs(2))
            .await;
        assert_eq!(
            r.err().map(|e| e.kind()),
            Some(quorumlock_core::ErrorKind::Timeout)
        );
        assert!(late.hit(), "the join was not the one cut");
        timeout(SOON, a.wait_idle()).await.expect("abandon hung");
        bg.release().await.unwrap();
        lock_is_free_after_late_write(&env, &late, &c).await;
    })
    .await;
    env.finish().await;
}

/// The current leader of election `name`, as another client reads it.
async fn leader_of(c: &LockClient, name: &str) -> Option<quorumlock_core::Leader> {
    c.election(name).unwrap().leader().await.unwrap()
}

/// A proclaim whose answer is lost after the agent applied it: the
/// proclaim still succeeds (read back), the token stays, and neither the
/// monitor (which sees `.lock` at an index it never was told of) nor a
/// later proclaim, a revoke request, the resign or the next candidate
/// takes it for a loss or for another grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_answer_to_a_proclaim_is_not_a_loss() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("").await;
        let b = env.client("").await;
        let mut g = timeout(SOON, a.election("e").unwrap().campaign("v1"))
            .await
            .unwrap()
            .unwrap();
        let token = g.token();
        let lost = proxy.on(
            txn_starting(&env, "check-session", "e"),
            1,
            HttpFault::DropAnswer,
        );
        timeout(SOON, g.proclaim("v2"))
            .await
            .unwrap()
            .expect("a proclaim applied but unanswered is a proclaim");
        assert!(lost.hit(), "the proclaim's answer was not dropped");
        let l = leader_of(&b, "e").await.expect("a leader");
        assert_eq!(l.value, b"v2");
        assert_eq!(l.token, token, "a proclaim keeps the token");
        // The monitor has read `.lock` at its new index by now.
        tokio::time::sleep(quorumlock_core::backend::HELD_WATCH_DELAY + Duration::from_secs(2))
            .await;
        assert!(g.is_leader(), "our own proclaim taken for a loss");
        timeout(SOON, g.proclaim("v3")).await.unwrap().unwrap();
        assert_eq!(leader_of(&b, "e").await.unwrap().value, b"v3");
        // A revoke request names the grant's token, which the holder knows.
        assert!(b
            .backend()
            .request_revoke(&quorumlock_core::LockName::new("e").unwrap())
            .await
            .unwrap());
        eventually("the revoke request to reach the leader", || async {
            g.guard().is_revoke_requested()
        })
        .await;
        let eb = b.election("e").unwrap();
        let next = tokio::spawn(async move { eb.campaign("b").await });
        eventually("B to queue", || async { waiters(&b, "e").await == 1 }).await;
        assert!(!next.is_finished(), "two leaders after a proclaim");
        assert!(g.is_leader());
        g.resign().await.unwrap();
        let gb = timeout(SOON, next)
            .await
            .expect("B never led")
            .unwrap()
            .unwrap();
        assert!(gb.token() > token);
        assert_eq!(leader_of(&a, "e").await.unwrap().value, b"b");
        gb.resign().await.unwrap();
    })
    .await;
    env.finish().await;
}

/// A proclaim that reaches the agent late, after its leader resigned and
/// another candidate took the lead, changes nothing: the txn's checks
/// (our session, the grant's last index, the attempt's fence) refuse it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_proclaim_after_resign_changes_nothing() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("").await;
        let b = env.client("").await;
        let mut g = timeout(SOON, a.election("e").unwrap().campaign("v1"))
            .await
            .unwrap()
            .unwrap();
        let late = proxy.on(
            txn_starting(&env, "check-session", "e"),
            1,
            HttpFault::LateRequest(HOLD),
        );
        // The first txn is cut on our side; the proclaim reads back, sees
        // it not applied, and sends it again.
        timeout(SOON, g.proclaim("stale")).await.unwrap().unwrap();
        assert!(late.hit());
        g.resign().await.unwrap();
        let gb = timeout(SOON, b.election("e").unwrap().campaign("b"))
            .await
            .unwrap()
            .unwrap();
        late.release();
        timeout(SOON, late.wait_done())
            .await
            .expect("the late proclaim never reached the agent");
        let l = leader_of(&a, "e").await.expect("B leads");
        assert_eq!(
            l.value, b"b",
            "a late proclaim rewrote another leader's value"
        );
        assert_eq!(l.token, gb.token());
        assert_eq!(l.session, gb.guard().session_id());
        tokio::time::sleep(quorumlock_core::backend::HELD_WATCH_DELAY + Duration::from_secs(1))
            .await;
        assert!(gb.is_leader(), "the late proclaim cost B its lead");
        gb.resign().await.unwrap();
        assert!(leader_of(&a, "e").await.is_none());
    })
    .await;
    env.finish().await;
}

// Late removals (issue 37): a removal of an attempt (its abandon, its
// release, a try-acquire leaving the line) that the agent applies after
// the client gave up on it (cut on our side, sent again, done), when the
// same session has a newer attempt on the same name. The late copy must
// remove nothing of the newer attempt: it names the key versions of its
// own attempt, which are gone.

/// A txn of lock `name` that deletes our queue key (an abandon, or a
/// try-acquire leaving the line) and takes nothing: not a release, which
/// checks `.lock` at its token first.
fn queue_removal(env: &Env, name: &str) -> Match {
    Match::any()
        .method("PUT")
        .path("/v1/txn")
        .body(r#""Verb":"delete"#)
        .body(&format!("{}queue/", env.key(name)))
        .body_not(r#""Verb":"lock""#)
        .body_not(r#""Verb":"get-tree""#)
        .body_not(r#""Verb":"check-index""#)
}

/// Issue 37, bug 1: A's waiting acquire times out and is abandoned; the
/// removal's txn is cut on A's side (A sends it again: done) and reaches
/// the agent after A has acquired the lock again (same session) and V
/// queued behind it. The late removal must not delete A's new `.lock`
/// (or its queue key): V is not granted while A holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_abandon_of_an_earlier_attempt_keeps_the_new_lock() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=1h").await;
        let h = env.client("").await;
        let v = env.client("").await;
        let hg = acquire(&h, "x").await;
        let late = proxy.on(queue_removal(&env, "x"), 1, HttpFault::LateRequest(HOLD));
        let r = a
            .lock("x")
            .unwrap()
            .acquire_timeout(Duration::from_secs(1))
            .await;
        assert_eq!(
            r.err().map(|e| e.kind()),
            Some(quorumlock_core::ErrorKind::Timeout)
        );
        timeout(SOON, late.wait_hit())
            .await
            .expect("the abandon never removed the queue key");
        timeout(SOON, a.wait_idle()).await.expect("abandon hung");
        hg.release().await.unwrap();
        let ag = acquire(&a, "x").await;
        let mut v_acq = spawn_acquire(&v, "x");
        eventually("V to queue", || async { waiters(&h, "x").await == 1 }).await;
        late.release();
        timeout(SOON, late.wait_done())
            .await
            .expect("the late removal never reached the agent");
        if let Ok(r) = timeout(Duration::from_millis(1500), &mut v_acq).await {
            let vg = r.unwrap().unwrap();
            panic!(
                "V granted with token {} while A holds with token {} (A is_held: {}, loss: {:?}): the late abandon of A's earlier attempt removed A's new .lock",
                vg.token(),
                ag.token(),
                ag.is_held(),
                ag.loss()
            );
        }
        assert!(
            ag.is_held(),
            "A lost its new lock to the late abandon of its earlier attempt: {:?}",
            ag.loss()
        );
        let a_token = ag.token();
        ag.release().await.unwrap();
        let vg = timeout(SOON, v_acq)
            .await
            .expect("V never granted")
            .unwrap()
            .unwrap();
        assert!(vg.token() > a_token);
        vg.release().await.unwrap();
    })
    .await;
    env.finish().await;
}

/// Issue 37, bug 2: the same on a semaphore of 1. A's waiting acquire
/// times out; the removal's txn is cut on A's side (sent again: done) and
/// reaches the agent after A holds the permit again and V waits. The late
/// removal must not delete A's new contender key (which makes A a dead
/// holder that V prunes): one holder at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_permit_removal_of_an_earlier_attempt_keeps_the_new_permit() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=1h").await;
        let h = env.client("").await;
        let v = env.client("").await;
        let sem = |c: &LockClient| c.semaphore("s", 1).unwrap();
        let hg = timeout(SOON, sem(&h).acquire()).await.unwrap().unwrap();
        let late = proxy.on(
            Match::any()
                .method("PUT")
                .path("/v1/txn")
                .body(r#""Verb":"delete"#)
                .body(&format!(r#""Key":"{}/s/"#, env.ns))
                .body_not(r#""Verb":"lock""#),
            1,
            HttpFault::LateRequest(HOLD),
        );
        let r = sem(&a).acquire_timeout(Duration::from_secs(1)).await;
        assert_eq!(
            r.err().map(|e| e.kind()),
            Some(quorumlock_core::ErrorKind::Timeout)
        );
        timeout(SOON, late.wait_hit())
            .await
            .expect("the abandon never removed the contender key");
        timeout(SOON, a.wait_idle()).await.expect("abandon hung");
        hg.release().await.unwrap();
        let ag = timeout(SOON, sem(&a).acquire()).await.unwrap().unwrap();
        let v2 = v.clone();
        let mut v_acq = tokio::spawn(async move { v2.semaphore("s", 1).unwrap().acquire().await });
        eventually("V to wait", || async { waiters(&h, "s").await == 1 }).await;
        late.release();
        timeout(SOON, late.wait_done())
            .await
            .expect("the late removal never reached the agent");
        if let Ok(r) = timeout(Duration::from_millis(1500), &mut v_acq).await {
            let vg = r.unwrap().unwrap();
            panic!(
                "two holders of a semaphore of 1: V granted with token {} while A holds with token {} (A is_held: {}, loss: {:?})",
                vg.token(),
                ag.token(),
                ag.is_held(),
                ag.loss()
            );
        }
        assert!(
            ag.is_held(),
            "A lost its new permit to the late removal of its earlier attempt: {:?}",
            ag.loss()
        );
        ag.release().await.unwrap();
        let vg = timeout(SOON, v_acq)
            .await
            .expect("V never granted")
            .unwrap()
            .unwrap();
        vg.release().await.unwrap();
    })
    .await;
    env.finish().await;
}

/// Issue 37, bug 5: A's try-acquire of a held lock leaves the line; that
/// txn is cut on A's side (the try fails, its abandon removes the key)
/// and reaches the agent after A queued again (same session) and V
/// queued behind A. The late leave must not delete A's new queue key:
/// A is granted before V.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_leave_of_an_earlier_try_keeps_the_new_place_in_line() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=1h").await;
        let h = env.client("").await;
        let v = env.client("").await;
        let hg = acquire(&h, "x").await;
        let late = proxy.on(
            Match::any()
                .method("PUT")
                .path("/v1/txn")
                .body(r#"[{"KV":{"Verb":"delete"#)
                .body(&format!("{}queue/", env.key("x"))),
            1,
            HttpFault::LateRequest(HOLD),
        );
        let r = timeout(SOON, a.lock("x").unwrap().try_acquire())
            .await
            .expect("try-acquire hung");
        assert!(r.is_err(), "granted while H holds");
        assert!(late.hit(), "the try's leave was not the one cut");
        timeout(SOON, a.wait_idle()).await.expect("abandon hung");
        let mut a_acq = spawn_acquire(&a, "x");
        eventually("A to queue", || async { waiters(&h, "x").await == 1 }).await;
        let mut v_acq = spawn_acquire(&v, "x");
        eventually("V to queue", || async { waiters(&h, "x").await == 2 }).await;
        late.release();
        timeout(SOON, late.wait_done())
            .await
            .expect("the late leave never reached the agent");
        let line = h.inspect("x").await.unwrap().waiters;
        hg.release().await.unwrap();
        let ag = tokio::select! {
            r = &mut a_acq => r.unwrap().unwrap(),
            r = &mut v_acq => {
                let vg = r.unwrap().unwrap();
                panic!(
                    "V granted first (token {}) although A queued before it: the late leave of A's earlier try removed A's new queue key (the line after it landed: {line:?})",
                    vg.token()
                );
            }
            _ = tokio::time::sleep(SOON) => panic!("nobody granted"),
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(ag.is_held(), "{:?}", ag.loss());
        assert!(!v_acq.is_finished(), "V granted while A holds");
        let a_token = ag.token();
        ag.release().await.unwrap();
        let vg = timeout(SOON, v_acq)
            .await
            .expect("V never granted")
            .unwrap()
            .unwrap();
        assert!(vg.token() > a_token);
        vg.release().await.unwrap();
    })
    .await;
    env.finish().await;
}

/// The same for a release: A held `x` through the queue (so its release
/// also deletes its queue key); the release's txn is cut on A's side
/// (sent again: done) and reaches the agent after A queued again behind
/// a reader (`.lock` is free then: nobody holds it) and V behind A. The
/// late release must not delete A's new queue key: A is granted before V.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_release_of_an_earlier_hold_keeps_the_new_place_in_line() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=1h").await;
        let h = env.client("").await;
        let r = env.client("").await;
        let v = env.client("").await;
        // A holds through the queue (it came while H held).
        let hg = acquire(&h, "x").await;
        let a_acq = spawn_acquire(&a, "x");
        eventually("A to queue", || async { waiters(&h, "x").await == 1 }).await;
        hg.release().await.unwrap();
        let ag = timeout(SOON, a_acq).await.unwrap().unwrap().unwrap();
        let late = proxy.on(
            Match::any()
                .method("PUT")
                .path("/v1/txn")
                .body(&format!(r#""Verb":"delete-cas","Key":"{}lock""#, env.key("x")))
                .body(&format!("{}queue/", env.key("x")))
                .body_not(r#""Verb":"lock""#),
            1,
            HttpFault::LateRequest(HOLD),
        );
        ag.release().await.unwrap();
        assert!(late.hit(), "the release was not the one cut");
        let rg = timeout(SOON, r.rwlock("x").unwrap().read())
            .await
            .unwrap()
            .unwrap();
        let mut a_acq = spawn_acquire(&a, "x");
        eventually("A to queue", || async { waiters(&h, "x").await == 1 }).await;
        let mut v_acq = spawn_acquire(&v, "x");
        eventually("V to queue", || async { waiters(&h, "x").await == 2 }).await;
        late.release();
        timeout(SOON, late.wait_done())
            .await
            .expect("the late release never reached the agent");
        let line = h.inspect("x").await.unwrap().waiters;
        rg.release().await.unwrap();
        let ag = tokio::select! {
            r = &mut a_acq => r.unwrap().unwrap(),
            r = &mut v_acq => {
                let vg = r.unwrap().unwrap();
                panic!(
                    "V granted first (token {}) although A queued before it: the late release of A's earlier hold removed A's new queue key (the line after it landed: {line:?})",
                    vg.token()
                );
            }
            _ = tokio::time::sleep(SOON) => panic!("nobody granted"),
        };
        let a_token = ag.token();
        ag.release().await.unwrap();
        let vg = timeout(SOON, v_acq)
            .await
            .expect("V never granted")
            .unwrap()
            .unwrap();
        assert!(vg.token() > a_token);
        vg.release().await.unwrap();
    })
    .await;
    env.finish().await;
}

/// Issue 37, the read-write recipe: its entries are named by the attempt
/// (`.rw/<session>-<contender>`), so a late removal of an earlier try
/// cannot reach the same session's newer entry. A's try-read of a
/// write-held lock leaves the line; that txn is cut on A's side and
/// reaches the agent after A queued again and a writer V behind A: A is
/// granted before V.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_rw_leave_of_an_earlier_try_keeps_the_new_place_in_line() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=1h").await;
        let h = env.client("").await;
        let v = env.client("").await;
        let hg = timeout(SOON, h.rwlock("x").unwrap().write())
            .await
            .unwrap()
            .unwrap();
        let late = proxy.on(
            Match::any()
                .method("PUT")
                .path("/v1/txn")
                .body(r#""Verb":"delete"#)
                .body(&format!("{}rw/", env.key("x")))
                .body_not(r#""Verb":"lock""#),
            1,
            HttpFault::LateRequest(HOLD),
        );
        let r = timeout(SOON, a.rwlock("x").unwrap().try_read())
            .await
            .expect("try-read hung");
        assert!(r.is_err(), "granted while H writes");
        assert!(late.hit(), "the try's leave was not the one cut");
        timeout(SOON, a.wait_idle()).await.expect("abandon hung");
        let a2 = a.clone();
        let mut a_acq = tokio::spawn(async move { a2.rwlock("x").unwrap().read().await });
        eventually("A to queue", || async { waiters(&h, "x").await == 1 }).await;
        let v2 = v.clone();
        let mut v_acq = tokio::spawn(async move { v2.rwlock("x").unwrap().write().await });
        eventually("V to queue", || async { waiters(&h, "x").await == 2 }).await;
        late.release();
        timeout(SOON, late.wait_done())
            .await
            .expect("the late leave never reached the agent");
        hg.release().await.unwrap();
        let ag = tokio::select! {
            r = &mut a_acq => r.unwrap().unwrap(),
            r = &mut v_acq => {
                let vg = r.unwrap().unwrap();
                panic!("V granted first (token {}) although A queued before it", vg.token());
            }
            _ = tokio::time::sleep(SOON) => panic!("nobody granted"),
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(ag.is_held(), "{:?}", ag.loss());
        assert!(!v_acq.is_finished(), "V writes while A reads");
        ag.release().await.unwrap();
        timeout(SOON, v_acq)
            .await
            .expect("V never granted")
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
    })
    .await;
    env.finish().await;
}

/// The monitor's reads of the holder of `name`: blocking queries (or, once
/// one failed, immediate reads) of `.lock` with `?recurse`.
fn monitor_read(env: &Env, name: &str) -> Match {
    Match::any()
        .method("GET")
        .path(&format!("/v1/kv/{}/{name}/.lock?recurse", env.ns))
}

/// An operator (`admin`, whose lock-delay is the break's grace) breaks
/// `name` and D takes it once the break frees it: by then A's guard `ga`
/// must have reported the loss (the break's grace exists for that). The
/// panic says how late A learned, if it did within 30 s.
async fn break_then_d_takes(
    admin: &LockClient,
    d: &LockClient,
    name: &str,
    ga: &LockGuard,
) -> LockGuard {
    let broke_at = Instant::now();
    let (a2, n) = (admin.clone(), name.to_string());
    let breaking = tokio::spawn(async move { a2.break_lock(&n).await });
    let dg = acquire(d, name).await;
    let granted = broke_at.elapsed();
    if ga.is_held() {
        let learned = match timeout(SOON, ga.lost()).await {
            Ok(reason) => format!(
                "{:.1} s after D's grant ({reason:?})",
                (broke_at.elapsed() - granted).as_secs_f64()
            ),
            Err(_) => "nothing within 30 s".to_string(),
        };
        panic!(
            "D was granted {:.1} s after the break (token {}) while A still said held (token {}); A learned {learned}",
            granted.as_secs_f64(),
            dg.token(),
            ga.token()
        );
    }
    // `false` if A had given the lock up (and freed it) before the break.
    timeout(SOON, breaking)
        .await
        .expect("the break hung")
        .unwrap()
        .unwrap();
    dg
}

/// Issue 37, bug 3: the holder's monitor reads fail (the agent answers
/// 500, as one without a leader does) three times, then pass again, and
/// right then an operator breaks the lock; D takes it when the break's
/// grace (1 s) ends. A failed read must be retried well within that
/// grace (it was retried after 0.5, 1, then 2 s), so A knows of the break
/// before D is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_read_errors_do_not_outlast_a_break_grace() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=1h").await;
        let admin = env.client("lock_delay=1s").await;
        let d = env.client("").await;
        let errors = proxy.on_every(monitor_read(&env, "x"), HttpFault::Status(500));
        let ga = acquire(&a, "x").await;
        timeout(SOON, errors.wait_hits(3))
            .await
            .expect("the monitor did not read three times");
        errors.release();
        let dg = break_then_d_takes(&admin, &d, "x", &ga).await;
        dg.release().await.unwrap();
        ga.release().await.ok(); // lost
    })
    .await;
    env.finish().await;
}

/// Issue 37, bug 3, fail-safe: the holder's monitor reads all fail (500)
/// from the grant on. A holder that cannot confirm its entry must give it
/// up within a break's grace: when an operator breaks the lock and D
/// takes it after the grace, A has reported the loss (it tolerated
/// failures for TTL/2, here half an hour).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_monitor_cannot_read_gives_up_within_a_break_grace() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=1h").await;
        let admin = env.client("lock_delay=1s").await;
        let d = env.client("").await;
        let errors = proxy.on_every(monitor_read(&env, "x"), HttpFault::Status(500));
        let ga = acquire(&a, "x").await;
        timeout(SOON, errors.wait_hit())
            .await
            .expect("the monitor never read");
        let dg = break_then_d_takes(&admin, &d, "x", &ga).await;
        assert_eq!(ga.loss(), Some(quorumlock_core::LossReason::DeadlinePassed));
        errors.release();
        dg.release().await.unwrap();
        ga.release().await.ok(); // lost
    })
    .await;
    env.finish().await;
}

/// One failed monitor read (500) is retried at once and confirms the lock:
/// not a loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failed_monitor_read_does_not_lose_the_lock() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=1h").await;
        let error = proxy.on(monitor_read(&env, "x"), 1, HttpFault::Status(500));
        let ga = acquire(&a, "x").await;
        timeout(SOON, error.wait_done())
            .await
            .expect("the monitor never read");
        let failed_at = Instant::now();
        // The read after the failure was answered: the monitor blocks again.
        eventually("the monitor to read twice more", || async {
            proxy.count_since(&monitor_read(&env, "x"), failed_at) >= 2
        })
        .await;
        assert!(ga.is_held(), "lost after one failed read: {:?}", ga.loss());
        ga.release().await.unwrap();
    })
    .await;
    env.finish().await;
}

/// Issue 37, bug 6: a client saturated with ordinary requests (40
/// acquires of other names whose txns the proxy holds: every one of its
/// 32 request slots taken) still hears a break of a lock it holds before
/// the break's grace ends. The monitor's check of the session after the
/// loss queued behind those 32 requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_client_hears_a_break_within_its_grace() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=1h").await;
        let admin = env.client("lock_delay=1s").await;
        let d = env.client("").await;
        let start = Instant::now();
        let ga = acquire(&a, "x").await;
        eventually("the monitor to watch x", || async {
            proxy.count_since(&monitor_read(&env, "x"), start) >= 1
        })
        .await;
        let held = proxy.on_every(
            Match::any()
                .method("PUT")
                .path("/v1/txn")
                .body(&format!(r#""Key":"{}/busy"#, env.ns)),
            HttpFault::DelayRequest(HOLD),
        );
        let busy: Vec<_> = (0..40)
            .map(|i| spawn_acquire(&a, &format!("busy{i}")))
            .collect();
        timeout(SOON, held.wait_hits(32))
            .await
            .expect("the acquires of other names never took every slot");
        let dg = break_then_d_takes(&admin, &d, "x", &ga).await;
        held.release();
        for b in busy {
            timeout(SOON, b)
                .await
                .expect("an acquire of another name hung")
                .unwrap()
                .unwrap()
                .release()
                .await
                .unwrap();
        }
        dg.release().await.unwrap();
        ga.release().await.ok(); // lost
    })
    .await;
    env.finish().await;
}

/// Whether `r` is a read that the client decides on: a `/v1/txn` with
/// only reads and checks, or a KV GET that does not block (a blocking
/// query only waits for a change; what follows it decides).
fn is_deciding_read(r: &quorumlock_conformance::faults::Seen) -> bool {
    const WRITES: [&str; 7] = [
        "lock",
        "unlock",
        "set",
        "cas",
        "delete",
        "delete-cas",
        "delete-tree",
    ];
    if r.method == "PUT" && r.target.starts_with("/v1/txn") {
        return !WRITES
            .iter()
            .any(|v| r.body.contains(&format!(r#""Verb":"{v}""#)));
    }
    // `connect()`'s probe of the token decides nothing.
    r.method == "GET"
        && r.target.starts_with("/v1/kv/")
        && !r.target.contains("index=")
        && !r.target.contains(".quorumlock-connect-check")
}

/// Issue 37, bug 7 (what a single agent can show): every read on a grant
/// path is `?consistent`, so that a leader cut off from its cluster (and
/// deposed meanwhile) cannot answer it from its old state. Runs the
/// acquires whose reads decide: a fast acquire whose answer is lost (read
/// back), a repeat fast acquire after others wrote (read after the
/// grant), a waiter's take whose answer is lost, a read-write join whose
/// answer is lost, a proclaim whose answer is lost; then checks every
/// such read the client sent. (`tests/fault_cluster.rs`
/// `a_deposed_leader_never_decides_a_grant` shows the stale grant itself
/// on three servers.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_read_on_a_grant_path_is_consistent() {
    let Some(mut env) = Env::new() else { return };
    serially(async {
        let (a, proxy) = env.proxied("ttl=1h").await;
        let h = env.client("").await;
        let other = env.client("").await;
        // A fast acquire whose answer is lost: read back.
        let lost = proxy.on(
            txn_starting(&env, "check-not-exists", "x"),
            1,
            HttpFault::DropAnswer,
        );
        let g = acquire(&a, "x").await;
        assert!(lost.hit());
        g.release().await.unwrap();
        // A repeat fast acquire that left out its read, after another
        // client wrote: a read after the grant.
        acquire(&a, "x").await.release().await.unwrap();
        acquire(&a, "x").await.release().await.unwrap();
        acquire(&other, "elsewhere").await.release().await.unwrap();
        acquire(&a, "x").await.release().await.unwrap();
        // A waiter's take whose answer is lost: read back.
        let hg = acquire(&h, "x").await;
        let lost = proxy.on(take(), 1, HttpFault::DropAnswer);
        let a_acq = spawn_acquire(&a, "x");
        eventually("A to queue", || async { waiters(&h, "x").await == 1 }).await;
        hg.release().await.unwrap();
        let g = timeout(SOON, a_acq).await.unwrap().unwrap().unwrap();
        assert!(lost.hit(), "A's take was not the one cut");
        g.release().await.unwrap();
        // A proclaim whose answer is lost: read back.
        let mut leader = timeout(SOON, a.election("e").unwrap().campaign("v1"))
            .await
            .unwrap()
            .unwrap();
        let lost = proxy.on(
            txn_starting(&env, "check-session", "e"),
            1,
            HttpFault::DropAnswer,
        );
        timeout(SOON, leader.proclaim("v2")).await.unwrap().unwrap();
        assert!(lost.hit(), "the proclaim was not the one cut");
        leader.resign().await.unwrap();
        // A read-write join whose answer is lost: read back.
        let lost = proxy.on(txn_starting(&env, "lock", "r"), 1, HttpFault::DropAnswer);
        let rg = timeout(SOON, a.rwlock("r").unwrap().read())
            .await
            .unwrap()
            .unwrap();
        assert!(lost.hit());
        rg.release().await.unwrap();
        let reads: Vec<_> = proxy
            .requests()
            .into_iter()
            .filter(is_deciding_read)
            .collect();
        assert!(reads.len() >= 4, "too few reads: {reads:?}");
        let stale: Vec<String> = reads
            .iter()
            .filter(|r| !r.target.contains("consistent"))
            .map(|r| format!("{} {} {:.160}", r.method, r.target, r.body))
            .collect();
        assert!(
            stale.is_empty(),
            "{} of {} reads may be served stale:\n{}",
            stale.len(),
            reads.len(),
            stale.join("\n")
        );
    })
    .await;
    env.finish().await;
}
