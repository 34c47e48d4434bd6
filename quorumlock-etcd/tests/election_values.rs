//! Election values on etcd (issue 39, bugs 4 and 6).
//!
//! - A proclaim whose answer was lost (etcd applied it, the connection
//!   broke before the answer came back) leaves the guard believing the old
//!   value. Retried, it must not look like a revoke request to the
//!   leader's own watch; and proclaiming the old value back must write it.
//! - A value that looks like one of the library's own encodings (`ql:...`,
//!   a mutex, reader, writer or semaphore value, the escape of an election
//!   value) is the leader's value, byte for byte: other candidates wait
//!   behind it (no `Conflict`), and `leader()` shows exactly it. Likewise a
//!   lock's holder value.
//!
//! The lost answer is the fault proxy's `OneShot::LoseAnswer`: the next
//! request the leader's client sends reaches etcd, and the next thing etcd
//! sends back on that connection is dropped and the connection reset.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::faults::{OneShot, TcpProxy};
use quorumlock_conformance::Harness;
use quorumlock_core::url::Url;
use quorumlock_core::{ErrorKind, LeaderGuard, LockClient, LossReason};
use tokio::time::Instant;

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

/// `url` through `proxy`, with a lease long enough that a reset
/// connection never costs it.
fn via(proxy: &TcpProxy, url: &Url) -> Url {
    let mut u = url.clone();
    u.set_host(Some("127.0.0.1")).unwrap();
    u.set_port(Some(proxy.addr().port())).unwrap();
    u.query_pairs_mut().append_pair("ttl", "30s");
    u
}

/// The leader's value as another client reads it.
async fn leader_value(c: &LockClient, name: &str) -> Vec<u8> {
    quorumlock_conformance::support::leader_of(c, name)
        .await
        .value
}

/// Waits until `f` is true, polling every 20 ms; false after `limit`.
async fn within<F, Fut>(limit: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if f().await {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Proclaims `value`, retrying while the link fails (the connection the
/// fault reset is made again on the first request after it): what a
/// caller does after an error of unknown outcome.
async fn proclaim_until_answered(g: &mut LeaderGuard, value: &[u8]) {
    let start = Instant::now();
    loop {
        match g.proclaim(value.to_vec()).await {
            Ok(()) => return,
            Err(e) if e.kind() == ErrorKind::Connection && start.elapsed() < SOON => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("proclaim {:?}: {e}", String::from_utf8_lossy(value)),
        }
    }
}

/// A proclaim whose answer is lost: etcd applies it, the leader's client
/// gets an error. Returns the value etcd now has (the guard still
/// believes the one before). On HTTP/2 the armed fault takes the next
/// chunk the client sends, which is the proclaim unless a keepalive or
/// watch message slipped in first; then it is tried again with a new
/// value.
async fn proclaim_with_lost_answer(
    g: &mut LeaderGuard,
    proxy: &TcpProxy,
    ours: &LockClient,
    other: &LockClient,
    name: &str,
    stem: &str,
) -> Vec<u8> {
    for i in 0..5 {
        let v = format!("{stem}-{i}").into_bytes();
        // One round trip on the leader's connection: what it sent before
        // (the held key's watch create) has passed the proxy.
        ours.election(name).unwrap().leader().await.unwrap();
        let before = g.value().to_vec();
        proxy.arm(OneShot::LoseAnswer);
        match g.proclaim(v.clone()).await {
            Ok(()) => continue, // the fault took another message
            Err(e) => {
                assert_eq!(g.value(), before, "a failed proclaim changed the guard");
                let applied = within(Duration::from_secs(5), || async {
                    leader_value(other, name).await == v
                })
                .await;
                if applied {
                    eprintln!("the proclaim whose answer was lost ended with: {e}");
                    return v;
                }
                // The fault broke the connection before the proclaim
                // reached etcd: nothing was written; try again.
            }
        }
    }
    panic!("no proclaim with a lost answer in 5 tries");
}

/// Bug 4 (a): the answer of `proclaim(v)` is lost and the caller proclaims
/// `v` again. The leader's guard must not report a revoke request: nobody
/// asked. (A forced break afterwards is the end of the key's watch
/// history: once the guard reports it, every put before it has been seen.)
async fn retried_proclaim_is_no_revoke_request(var: &str) {
    let Some(h) = harness(var) else { return };
    let case = h.case();
    let other = case.client().await;
    let url = h.url_for(case.namespace());
    let proxy = TcpProxy::start(target_of(&url)).await.unwrap();
    let ours = LockClient::new(Arc::new(
        quorumlock_etcd::EtcdBackend::connect(&via(&proxy, &url))
            .await
            .unwrap(),
    ));
    let mut g = ours.election("e").unwrap().campaign("v0").await.unwrap();

    let v = proclaim_with_lost_answer(&mut g, &proxy, &ours, &other, "e", "v1").await;
    proclaim_until_answered(&mut g, &v).await;
    assert_eq!(g.value(), v);
    assert_eq!(leader_value(&other, "e").await, v);

    assert!(other.break_lock("e").await.unwrap());
    let reason = tokio::time::timeout(SOON, g.lost())
        .await
        .expect("the break was not reported");
    assert_eq!(reason, LossReason::EntryDeleted);
    assert!(
        !g.guard().is_revoke_requested(),
        "the leader's guard reports a revoke request after its own proclaim \
         was retried (its answer lost); nobody asked"
    );
    drop(g);
    ours.wait_idle().await;
    ours.close().await;
    case.finish().await;
}

/// Bug 4 (b): the answer of `proclaim(v1)` is lost; the caller, not knowing
/// whether it landed, proclaims the old value back. That must write it:
/// everyone then reads the old value. A revoke request still reaches the
/// leader afterwards.
async fn proclaiming_the_old_value_back_writes_it(var: &str) {
    let Some(h) = harness(var) else { return };
    let case = h.case();
    let other = case.client().await;
    let url = h.url_for(case.namespace());
    let proxy = TcpProxy::start(target_of(&url)).await.unwrap();
    let ours = LockClient::new(Arc::new(
        quorumlock_etcd::EtcdBackend::connect(&via(&proxy, &url))
            .await
            .unwrap(),
    ));
    let mut g = ours.election("e").unwrap().campaign("v0").await.unwrap();

    let v = proclaim_with_lost_answer(&mut g, &proxy, &ours, &other, "e", "v1").await;
    let old = g.value().to_vec();
    assert_ne!(old, v);
    proclaim_until_answered(&mut g, &old).await;
    assert_eq!(
        String::from_utf8_lossy(&leader_value(&other, "e").await),
        String::from_utf8_lossy(&old),
        "proclaiming the old value back returned Ok, but etcd still has the \
         value of the proclaim whose answer was lost"
    );
    assert!(!g.guard().is_revoke_requested());

    assert!(other.request_revoke("e").await.unwrap());
    tokio::time::timeout(SOON, g.guard().revoke_requested())
        .await
        .expect("a revoke request after the proclaims was not reported");
    assert!(g.is_leader());
    g.resign().await.unwrap();
    ours.wait_idle().await;
    ours.close().await;
    case.finish().await;
}

/// Values that look like the library's own: its reserved prefix alone and
/// with anything after it, each kind's lock value (mutex, reader, writer,
/// semaphore, the form before holder values), the escape of an election
/// value, bytes that are not UTF-8.
const LOOKALIKES: &[&[u8]] = &[
    b"ql:anything",
    b"ql:",
    b"ql:x:1700000000000:holder",
    b"ql:x:5",
    b"ql:r:1:",
    b"ql:w:1:h",
    b"ql:s2:1:h",
    b"ql:s1:5",
    b"ql:e:",
    b"ql:e:x",
    b"ql:e:ql:x:1:h",
    b"ql:\xff\x00:",
];

fn text(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

/// Bug 6: each lookalike leads; a second candidate (with the next
/// lookalike as its value) waits behind it, `leader()` and `inspect()` show
/// exactly the leader's bytes, a proclaimed lookalike too, and after the
/// resign the second candidate leads with its own bytes. Every value is
/// tried; the failure lists what went wrong with each.
async fn lookalike_election_values_are_values(var: &str) {
    let Some(h) = harness(var) else { return };
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let mut problems = Vec::new();
    for (i, v) in LOOKALIKES.iter().enumerate() {
        for p in one_lookalike_election(&a, &b, i).await {
            problems.push(format!("{:?}: {p}", text(v)));
        }
    }
    assert!(
        problems.is_empty(),
        "election values that look like ours:\n{}",
        problems.join("\n")
    );
    case.finish().await;
}

/// [`lookalike_election_values_are_values`] for `LOOKALIKES[i]`: what went
/// wrong.
async fn one_lookalike_election(a: &LockClient, b: &LockClient, i: usize) -> Vec<String> {
    let mut problems = Vec::new();
    let v = LOOKALIKES[i];
    let next = LOOKALIKES[(i + 1) % LOOKALIKES.len()].to_vec();
    let proclaimed = LOOKALIKES[(i + 2) % LOOKALIKES.len()];
    let name = format!("e{i}");
    let mut g = a.election(&name).unwrap().campaign(v).await.unwrap();
    let shown = leader_value(b, &name).await;
    if shown != v {
        problems.push(format!("leader() shows {:?}", text(&shown)));
    }

    let e = b.election(&name).unwrap();
    let n = next.clone();
    let second = tokio::spawn(async move { e.campaign(n).await });
    // Its entry is on the store (as a waiter, or as whatever the values
    // are read as).
    let queued = within(SOON, || async {
        let st = b.inspect(&name).await.unwrap();
        second.is_finished() || st.holders.len() + st.waiters.len() == 2
    })
    .await;
    assert!(queued, "{:?}: the second candidate never queued", text(v));
    if second.is_finished() {
        match second.await.unwrap() {
            Ok(g2) => {
                problems.push(format!("{:?} was elected beside it", text(&next)));
                g2.resign().await.unwrap();
            }
            Err(e) => problems.push(format!(
                "a second candidate ({:?}) failed at once instead of waiting: {e}",
                text(&next)
            )),
        }
        g.resign().await.unwrap();
        return problems;
    }
    let st = b.inspect(&name).await.unwrap();
    let holders: Vec<_> = st.holders.iter().map(|c| text(&c.value)).collect();
    let waiters: Vec<_> = st.waiters.iter().map(|c| text(&c.value)).collect();
    if holders != [text(v)] || waiters != [text(&next)] {
        problems.push(format!(
            "inspect() shows holders {holders:?} and waiters {waiters:?}"
        ));
    }

    g.proclaim(proclaimed).await.unwrap();
    let shown = leader_value(b, &name).await;
    if shown != proclaimed {
        problems.push(format!(
            "after proclaiming {:?}, leader() shows {:?}",
            text(proclaimed),
            text(&shown)
        ));
    }
    if g.guard().is_revoke_requested() {
        problems.push("the leader's guard reports a revoke request".into());
    }

    g.resign().await.unwrap();
    let g2 = match tokio::time::timeout(SOON, second)
        .await
        .expect("the second candidate was not elected after the resign")
        .unwrap()
    {
        Ok(g2) => g2,
        Err(e) => {
            problems.push(format!(
                "the second candidate ({:?}) failed instead of leading: {e}",
                text(&next)
            ));
            return problems;
        }
    };
    let shown = leader_value(a, &name).await;
    if shown != next {
        problems.push(format!(
            "the next leader ({:?}) is shown as {:?}",
            text(&next),
            text(&shown)
        ));
    }
    g2.resign().await.unwrap();
    problems
}

/// A lock's holder value that looks like the library's own is shown as
/// it is, and the lock stays a mutex: another client waits behind it.
async fn lookalike_holder_values_are_values(var: &str) {
    let Some(h) = harness(var) else { return };
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    for (i, v) in LOOKALIKES.iter().enumerate() {
        let name = format!("m{i}");
        let g = a
            .lock(&name)
            .unwrap()
            .with_value(*v)
            .acquire()
            .await
            .unwrap();
        let st = b.inspect(&name).await.unwrap();
        assert_eq!(
            st.holders
                .iter()
                .map(|c| text(&c.value))
                .collect::<Vec<_>>(),
            vec![text(v)]
        );
        let e = b.lock(&name).unwrap().try_acquire().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e}");
        g.release().await.unwrap();
    }
    case.finish().await;
}

macro_rules! election_value_tests {
    ($var:literal) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn retried_proclaim_after_a_lost_answer_is_no_revoke_request() {
            super::retried_proclaim_is_no_revoke_request($var).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn proclaiming_the_old_value_back_after_a_lost_answer_writes_it() {
            super::proclaiming_the_old_value_back_writes_it($var).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn election_values_that_look_like_ours_are_values() {
            super::lookalike_election_values_are_values($var).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn holder_values_that_look_like_ours_are_values() {
            super::lookalike_holder_values_are_values($var).await;
        }
    };
}

mod etcd34 {
    election_value_tests!("QUORUMLOCK_TEST_ETCD_URL");
}

mod etcd35 {
    election_value_tests!("QUORUMLOCK_TEST_ETCD35_URL");
}
