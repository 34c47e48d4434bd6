//! The data marks of a forced break and a revoke request on a holder's
//! node (`__BREAK__`, `__REVOKE__`), against a real server.
//!
//! A break writes `__BREAK__` into the holder's node and deletes the node
//! 40 ms later. The holder reports the loss on the mark, so from then on
//! its fenced writes must be refused, as on the other stores: the node
//! still exists until the delete, and a fenced write that checked only
//! that (issue 39, bug 7) was applied in that window. And a breaker that
//! dies between its mark and its delete leaves a marked node for good.
//!
//! An election's revoke request is written into the election's node
//! instead (see the README's "Elections"); stale ones are cleared.
//!
//! The marks are data, and so is a holder's value: a value or a
//! proclaimed value that starts like a mark must stay a value (issue 39,
//! bug 6): not a loss, not a revoke request, not hidden from `inspect`.
//!
//! Needs `QUORUMLOCK_TEST_ZK_URL`.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use quorumlock_conformance::scratch::{remove_scratch, scratch_key};
use quorumlock_conformance::{Case, Harness};
use quorumlock_core::{ErrorKind, LockClient, LockGuard};
use quorumlock_zk::{ZkBackend, ZkConfig};
use zookeeper_client as zk;

const SOON: Duration = Duration::from_secs(10);

/// Longer than a holder needs to see a mark on its node: its watch is set
/// `HELD_WATCH_DELAY` (20 ms) after the grant and reads the data then.
const SETTLE: Duration = Duration::from_millis(300);

fn harness() -> Option<Harness> {
    Harness::from_env("QUORUMLOCK_TEST_ZK_URL", |url| async move {
        Ok(Arc::new(ZkBackend::connect(&url).await?) as _)
    })
}

/// A plain client of the same server: a breaker that dies between its
/// mark and its delete, or a Curator `Revoker`.
async fn raw(case: &Case) -> zk::Client {
    let cfg = ZkConfig::from_url(&case.harness().url_for(case.namespace())).unwrap();
    zk::Client::connect(&cfg.connect_string()).await.unwrap()
}

async fn value(c: &LockClient, key: &str) -> Option<Vec<u8>> {
    c.read_key(key).await.expect("read key")
}

/// Runs `body`, then removes the scratch key `key` whether it passed or
/// not (a key left behind shows in other tests' `leftovers()`), then
/// passes its panic on.
async fn cleaning_up(c: &LockClient, key: &str, body: impl std::future::Future<Output = ()>) {
    let r = std::panic::AssertUnwindSafe(body).catch_unwind().await;
    remove_scratch(c, key).await;
    if let Err(panic) = r {
        std::panic::resume_unwind(panic);
    }
}

async fn wait_lost(g: &LockGuard) {
    tokio::time::timeout(SOON, g.lost())
        .await
        .expect("the holder never reported the loss");
}

/// Issue 39, bug 7: the holder has reported the loss (it saw the mark),
/// the breaker has not deleted the node yet; the holder's fenced writes
/// must be refused, and the key keep its value.
#[tokio::test]
async fn fenced_write_after_a_break_is_refused() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let key = scratch_key(a.backend().as_ref(), case.namespace(), "k");
    cleaning_up(&b, &key, async {
        for round in 0..5 {
            let g = a.lock("fw").unwrap().acquire().await.unwrap();
            g.fenced_put(key.as_str(), b"held".to_vec()).await.unwrap();
            let lost = g.lost();
            let breaker = b.clone();
            let breaking = tokio::spawn(async move { breaker.break_lock("fw").await });
            tokio::time::timeout(SOON, lost)
                .await
                .expect("the holder never reported the loss");
            let put = g.fenced_put(key.as_str(), format!("late {round}").into_bytes());
            let e = put.await.expect_err(&format!(
                "round {round}: a fenced put of a holder that reported its loss was applied"
            ));
            assert_eq!(e.kind(), ErrorKind::LockLost, "round {round}: {e}");
            assert!(
                breaking.await.unwrap().unwrap(),
                "round {round}: nothing broken"
            );
            assert_eq!(
                value(&b, &key).await.as_deref(),
                Some(&b"held"[..]),
                "round {round}: a refused write changed the key"
            );
            let _ = g.release().await;
        }
    })
    .await;
    a.wait_idle().await;
    case.finish().await;
}

/// A breaker that died between its mark and its delete: the node stays,
/// marked. Its holder has reported the loss; its fenced puts and deletes
/// are refused for as long as the mark stands, and a break deletes it.
#[tokio::test]
async fn fenced_writes_on_a_marked_node_are_refused() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let raw = raw(&case).await;
    let key = scratch_key(a.backend().as_ref(), case.namespace(), "k");
    cleaning_up(&b, &key, async {
        let g = a.lock("fm").unwrap().acquire().await.unwrap();
        g.fenced_put(key.as_str(), b"held".to_vec()).await.unwrap();
        raw.set_data(g.entry(), b"__BREAK__", None).await.unwrap();
        wait_lost(&g).await;
        for _ in 0..2 {
            let e = g
                .fenced_put(key.as_str(), b"late".to_vec())
                .await
                .expect_err("a fenced put on a marked node was applied");
            assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
            let e = g
                .fenced_delete(key.as_str())
                .await
                .expect_err("a fenced delete on a marked node was applied");
            assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
        }
        assert_eq!(value(&b, &key).await.as_deref(), Some(&b"held"[..]));
        // The next break finds the marked node and deletes it.
        assert!(b.break_lock("fm").await.unwrap());
        let _ = g.release().await;
    })
    .await;
    a.wait_idle().await;
    case.finish().await;
}

/// What the fence must still let through: a holder asked to give the lock
/// up (a revoke mark rewrote its node's data) still holds until it does;
/// a leader that proclaimed (it rewrote its node's data itself) still
/// leads.
#[tokio::test]
async fn fenced_writes_pass_after_a_revoke_request_and_a_proclaim() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let key = scratch_key(a.backend().as_ref(), case.namespace(), "k");
    cleaning_up(&b, &key, async {
        let g = a.lock("fr").unwrap().acquire().await.unwrap();
        g.fenced_put(key.as_str(), b"1".to_vec()).await.unwrap();
        assert!(b.request_revoke("fr").await.unwrap());
        tokio::time::timeout(SOON, g.revoke_requested())
            .await
            .expect("revoke request not seen");
        g.fenced_put(key.as_str(), b"2".to_vec()).await.unwrap();
        g.fenced_put(key.as_str(), b"3".to_vec()).await.unwrap();
        assert_eq!(value(&b, &key).await.as_deref(), Some(&b"3"[..]));
        assert!(g.is_held());
        g.release().await.unwrap();

        let mut leader = a.election("fe").unwrap().campaign("one").await.unwrap();
        leader
            .guard()
            .fenced_put(key.as_str(), b"4".to_vec())
            .await
            .unwrap();
        for v in ["two", "three"] {
            leader.proclaim(v).await.unwrap();
            leader.guard().fenced_put(key.as_str(), v).await.unwrap();
        }
        assert_eq!(value(&b, &key).await.as_deref(), Some(&b"three"[..]));
        // A break after the proclaims fences the leader as well.
        let lost = leader.lost();
        assert!(b.break_lock("fe").await.unwrap());
        tokio::time::timeout(SOON, lost)
            .await
            .expect("loss not reported");
        let e = leader
            .guard()
            .fenced_put(key.as_str(), b"5".to_vec())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
        assert_eq!(value(&b, &key).await.as_deref(), Some(&b"three"[..]));
        let _ = leader.resign().await;
    })
    .await;
    a.wait_idle().await;
    case.finish().await;
}

/// Issue 39, bug 6: holder values that start like the marks (or like
/// the escape that keeps them values, or like a semaphore's permit line).
/// Each stays a plain value: held (no loss), no revoke request, shown by
/// `inspect` with its value, in the way of others, and its fenced writes
/// pass. Every value is tried; the problems are listed together.
#[tokio::test]
async fn values_that_start_like_a_mark_are_plain_values() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let key = scratch_key(a.backend().as_ref(), case.namespace(), "k");
    cleaning_up(&b, &key, async {
        let values: [&[u8]; 9] = [
            b"__BREAK__",
            b"__BREAK__ of dawn",
            b"__REVOKE__",
            b"__REVOKE__ permits=3",
            b"__VALUE__",
            b"__VALUE____BREAK__",
            b"permits=3",
            b"x__BREAK__",
            b"",
        ];
        let mut problems = Vec::new();
        for (i, v) in values.iter().enumerate() {
            let shown = String::from_utf8_lossy(v);
            let name = format!("v{i}");
            let g = a
                .lock(name.as_str())
                .unwrap()
                .with_value(v.to_vec())
                .acquire()
                .await
                .unwrap();
            tokio::time::sleep(SETTLE).await;
            if !g.is_held() {
                problems.push(format!("value {shown:?}: the holder lost: {:?}", g.loss()));
            }
            if g.is_revoke_requested() {
                problems.push(format!("value {shown:?}: taken for a revoke request"));
            }
            let st = b.inspect(name.as_str()).await.unwrap();
            let shown_values: Vec<_> = st.holders.iter().map(|c| c.value.clone()).collect();
            if shown_values != vec![v.to_vec()] {
                problems.push(format!(
                    "value {shown:?}: inspect shows holders with values {:?}",
                    shown_values
                        .iter()
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                        .collect::<Vec<_>>()
                ));
            }
            match b.lock(name.as_str()).unwrap().try_acquire().await {
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => problems.push(format!("value {shown:?}: another's try: {e}")),
                Ok(other) => {
                    problems.push(format!("value {shown:?}: another client took the lock"));
                    let _ = other.release().await;
                }
            }
            if let Err(e) = g.fenced_put(key.as_str(), v.to_vec()).await {
                problems.push(format!("value {shown:?}: fenced put: {e}"));
            }
            let _ = g.release().await;
        }

        // The same as a leader's proclaimed value.
        let election = a.election("ve").unwrap();
        let mut leader = election.campaign("plain").await.unwrap();
        for v in values {
            let shown = String::from_utf8_lossy(v);
            if let Err(e) = leader.proclaim(v).await {
                problems.push(format!("proclaimed {shown:?}: {e}"));
                break;
            }
            tokio::time::sleep(SETTLE).await;
            if !leader.is_leader() {
                let loss = leader.guard().loss();
                problems.push(format!("proclaimed {shown:?}: the leader lost: {loss:?}"));
                break;
            }
            if leader.guard().is_revoke_requested() {
                problems.push(format!("proclaimed {shown:?}: taken for a revoke request"));
            }
            let seen = b.election("ve").unwrap().leader().await.unwrap();
            if seen.as_ref().map(|l| &l.value[..]) != Some(v) {
                problems.push(format!(
                    "proclaimed {shown:?}: leader() shows {:?}",
                    seen.map(|l| String::from_utf8_lossy(&l.value).into_owned())
                ));
            }
            if let Err(e) = leader.guard().fenced_put(key.as_str(), v.to_vec()).await {
                problems.push(format!("proclaimed {shown:?}: fenced put: {e}"));
            }
        }
        let _ = leader.resign().await;
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    })
    .await;
    a.wait_idle().await;
    case.finish().await;
}

/// A TCP proxy in front of the ZooKeeper server that reads what the
/// client sends frame by frame (a 4-byte length; after the connect
/// request, each request starts with its xid and op code) and, once
/// armed, holds the first `setData` (op code 5), and behind it everything
/// else of that connection, until released: a write of ours that reaches
/// the server after a write of someone else's.
mod hold {
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::watch;

    const SET_DATA: i32 = 5;

    pub struct HoldProxy {
        pub addr: SocketAddr,
        armed: Arc<AtomicBool>,
        held: watch::Receiver<bool>,
        release: Arc<watch::Sender<bool>>,
    }

    impl HoldProxy {
        pub async fn start(target: SocketAddr) -> HoldProxy {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let armed = Arc::new(AtomicBool::new(false));
            let (held_tx, held) = watch::channel(false);
            let held_tx = Arc::new(held_tx);
            let release = Arc::new(watch::channel(false).0);
            let (a, r) = (armed.clone(), release.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let (a, h, r) = (a.clone(), held_tx.clone(), r.subscribe());
                    tokio::spawn(async move {
                        let Ok(server) = TcpStream::connect(target).await else {
                            return;
                        };
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let (crd, cwr) = client.into_split();
                        let (srd, swr) = server.into_split();
                        let up = upstream(crd, swr, a, h, r);
                        let down = async move {
                            let (mut srd, mut cwr) = (srd, cwr);
                            let _ = tokio::io::copy(&mut srd, &mut cwr).await;
                        };
                        tokio::select! {
                            _ = up => {}
                            _ = down => {}
                        }
                    });
                }
            });
            HoldProxy {
                addr,
                armed,
                held,
                release,
            }
        }

        /// Holds the next `setData` any connection sends.
        pub fn arm(&self) {
            self.release.send_replace(false);
            self.armed.store(true, Ordering::SeqCst);
        }

        /// Resolves once a `setData` is held.
        pub async fn wait_held(&mut self) {
            self.held.wait_for(|h| *h).await.unwrap();
        }

        /// Sends the held request (and what queued behind it) on.
        pub fn release(&self) {
            self.release.send_replace(true);
        }
    }

    async fn upstream(
        mut crd: tokio::net::tcp::OwnedReadHalf,
        mut swr: tokio::net::tcp::OwnedWriteHalf,
        armed: Arc<AtomicBool>,
        held: Arc<watch::Sender<bool>>,
        mut release: watch::Receiver<bool>,
    ) {
        let mut first = true;
        loop {
            let mut len = [0u8; 4];
            if crd.read_exact(&mut len).await.is_err() {
                return;
            }
            let n = i32::from_be_bytes(len).max(0) as usize;
            let mut body = vec![0u8; n];
            if crd.read_exact(&mut body).await.is_err() {
                return;
            }
            let op = (!first && n >= 8).then(|| i32::from_be_bytes(body[4..8].try_into().unwrap()));
            first = false;
            if op == Some(SET_DATA) && armed.swap(false, Ordering::SeqCst) {
                held.send_replace(true);
                if release.wait_for(|r| *r).await.is_err() {
                    return;
                }
                held.send_replace(false);
            }
            if swr.write_all(&len).await.is_err() || swr.write_all(&body).await.is_err() {
                return;
            }
        }
    }
}

/// A client whose sessions all go through `proxy`.
async fn client_through(case: &Case, proxy: &hold::HoldProxy) -> LockClient {
    let mut u = case.harness().url_for(case.namespace());
    u.set_host(Some("127.0.0.1")).unwrap();
    u.set_port(Some(proxy.addr.port())).unwrap();
    LockClient::new(Arc::new(ZkBackend::connect(u.as_str()).await.unwrap()))
}

fn server_of(case: &Case) -> std::net::SocketAddr {
    let cfg = ZkConfig::from_url(&case.harness().url_for(case.namespace())).unwrap();
    let (host, port) = cfg.servers[0].clone();
    std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
        .unwrap()
        .next()
        .unwrap()
}

/// Issue 39, suspicion 1 (revoke): a revoke request that lands between a
/// break's mark and its delete (its write reaches the server after the
/// mark; the breaker here dies after its mark, so the node stays). The
/// mark must survive: otherwise the holder learns of the break only from
/// the delete, with the next waiter, and its fenced writes pass until
/// then (for good, if the breaker died). A mutex holder's node and a
/// semaphore lease (whose revoke marker keeps the permit count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_never_hides_a_break_mark() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let mut proxy = hold::HoldProxy::start(server_of(&case)).await;
    let revoker = client_through(&case, &proxy).await;
    let raw = raw(&case).await;
    let key = scratch_key(a.backend().as_ref(), case.namespace(), "k");
    cleaning_up(&b, &key, async {
        let mut problems = Vec::new();
        for kind in ["mutex", "semaphore"] {
            let name = format!("rb-{kind}");
            let g = match kind {
                "mutex" => a.lock(name.as_str()).unwrap().acquire().await.unwrap(),
                _ => a
                    .semaphore(name.as_str(), 2)
                    .unwrap()
                    .acquire()
                    .await
                    .unwrap(),
            };
            // (Fenced writes are a mutex's or a leader's.)
            let fenced = kind == "mutex";
            if fenced {
                g.fenced_put(key.as_str(), b"held".to_vec()).await.unwrap();
            }
            // The revoke reads the lock, and its write is held on its way.
            proxy.arm();
            let r = revoker.clone();
            let n = name.clone();
            let revoke = tokio::spawn(async move { r.request_revoke(n.as_str()).await });
            proxy.wait_held().await;
            // The break's mark lands first; its breaker dies.
            raw.set_data(g.entry(), b"__BREAK__", None).await.unwrap();
            proxy.release();
            revoke.await.unwrap().unwrap();
            let (data, _) = raw.get_data(g.entry()).await.unwrap();
            if data != b"__BREAK__" {
                problems.push(format!(
                    "{kind}: the revoke rewrote the break's mark to {:?}",
                    String::from_utf8_lossy(&data)
                ));
            }
            if tokio::time::timeout(SOON, g.lost()).await.is_err() {
                problems.push(format!("{kind}: the holder never reported the loss"));
            }
            match g.fenced_put(key.as_str(), b"late".to_vec()).await {
                _ if !fenced => {}
                Err(e) if e.kind() == ErrorKind::LockLost => {}
                Err(e) => problems.push(format!("{kind}: fenced put after the mark: {e}")),
                Ok(()) => problems.push(format!(
                    "{kind}: a fenced put after the break's mark was applied"
                )),
            }
            if fenced && value(&b, &key).await.as_deref() != Some(&b"held"[..]) {
                problems.push(format!("{kind}: the key lost the holder's last write"));
                b.backend()
                    .write_key(&quorumlock_core::backend::KeyWrite::Put {
                        key: key.clone(),
                        value: b"held".to_vec(),
                    })
                    .await
                    .unwrap();
            }
            // The next break finishes the dead breaker's work.
            assert!(b.break_lock(name.as_str()).await.unwrap());
            let _ = g.release().await;
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    })
    .await;
    a.wait_idle().await;
    revoker.close().await;
    case.finish().await;
}

/// Issue 39, suspicion 1 (proclaim): a leader's proclaim that reaches the
/// server after a break's mark (sent before it, held on its way) must not
/// overwrite the mark: it is refused with `LockLost`, and the mark stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaim_never_hides_a_break_mark() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let b = case.client().await;
    let mut proxy = hold::HoldProxy::start(server_of(&case)).await;
    let ours = client_through(&case, &proxy).await;
    let raw = raw(&case).await;
    let mut leader = ours.election("pb").unwrap().campaign("one").await.unwrap();
    let node = leader.guard().entry().to_string();
    proxy.arm();
    let proclaim = tokio::spawn(async move {
        let r = leader.proclaim("two").await;
        (leader, r)
    });
    proxy.wait_held().await;
    raw.set_data(&node, b"__BREAK__", None).await.unwrap();
    proxy.release();
    let (leader, r) = proclaim.await.unwrap();
    let e = r.expect_err("a proclaim after the break's mark was applied");
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
    let (data, _) = raw.get_data(&node).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&data),
        "__BREAK__",
        "the proclaim rewrote the mark"
    );
    tokio::time::timeout(SOON, leader.lost())
        .await
        .expect("the leader never reported the loss");
    assert!(b.break_lock("pb").await.unwrap());
    let _ = leader.resign().await;
    ours.wait_idle().await;
    ours.close().await;
    case.finish().await;
}

/// An election's revoke request is written into the election's node,
/// naming the leader's node (issue 39, bug 2). One that names another
/// node is stale (its leader is gone): our leader takes it for no revoke
/// request and clears it. One left when the election empties (a Curator
/// leader's, or one written as our leader resigned) is no leftover: the
/// server reaps the node with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_election_revoke_marks_are_cleared_and_no_leftover() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let raw = raw(&case).await;
    let leader = a.election("se").unwrap().campaign("one").await.unwrap();
    let node = leader.guard().entry().to_string();
    let dir = node.rsplit_once('/').unwrap().0.to_string();
    let stale = b"__REVOKE__ _c_00000000-0000-0000-0000-000000000000-latch-0000000099";
    let (_, stat, watch) = raw.get_and_watch_data(&dir).await.unwrap();
    raw.set_data(&dir, stale, Some(stat.version)).await.unwrap();
    drop(watch);
    // Our leader clears it (a write of the node's data after ours).
    tokio::time::timeout(SOON, async {
        loop {
            let (data, _, watch) = raw.get_and_watch_data(&dir).await.unwrap();
            if data.is_empty() {
                return;
            }
            watch.changed().await;
        }
    })
    .await
    .expect("the stale revoke mark was never cleared");
    assert!(
        !leader.guard().is_revoke_requested(),
        "a stale mark revoked"
    );
    assert!(leader.is_leader());
    // A real one still reaches it, and is cleared as well.
    assert!(b.request_revoke("se").await.unwrap());
    tokio::time::timeout(SOON, leader.guard().revoke_requested())
        .await
        .expect("the revoke request was not heard");
    leader.resign().await.unwrap();
    // Left behind on the emptied election's node: not a leftover.
    match raw.set_data(&dir, stale, None).await {
        Ok(_) | Err(zk::Error::NoNode) => {} // (reaped already)
        Err(e) => panic!("writing the stale mark: {e}"),
    }
    a.wait_idle().await;
    case.finish().await;
}

/// A break of a request of several permits (`acquire_many`): every lease
/// is marked before any is deleted, so the holder (which watches its last
/// lease) reports the loss before a waiter gets a permit. Marking and
/// deleting lease by lease let a waiter in after the first delete while
/// the holder still believed it held all three (4 permits of 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_of_several_permits_tells_before_a_waiter_gets_one() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let (a, b, admin) = (
        case.client().await,
        case.client().await,
        case.client().await,
    );
    let g = a
        .semaphore("many", 3)
        .unwrap()
        .acquire_many(3)
        .await
        .unwrap();
    tokio::time::sleep(SETTLE).await;
    let waiter = {
        let (sem, probe) = (b.semaphore("many", 3).unwrap(), g.lost());
        tokio::spawn(async move {
            let r = sem.acquire_timeout(SOON).await;
            (r, probe.now_or_never())
        })
    };
    let t0 = std::time::Instant::now();
    while admin.inspect("many").await.unwrap().waiters.is_empty() {
        assert!(t0.elapsed() < SOON, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(admin.break_lock("many").await.unwrap());
    let (r, told) = waiter.await.unwrap();
    let w = r.expect("the waiter never got a permit after the break");
    assert!(
        told.is_some(),
        "a waiter got a permit before the broken holder of 3 was told"
    );
    w.release().await.unwrap();
    drop(g);
    case.finish().await;
}
