//! The end of a session when its request does not get through at once.
//!
//! Redis cannot expire a member of a sorted set: a session's entries go
//! when the session-end script settles the queues its entry set lists,
//! or when some later script happens to read their queue. A session that
//! merely expires (its key's TTL) leaves them behind, and a queue that
//! nobody reads again keeps them for good. So a client that closes must
//! get its session-end script through, also when the first try meets a
//! broken connection, and also when by then the session key has expired
//! on the server (a link cut for longer than the session's life).
//!
//! Found by the explorer (seed 1795728689094731773): a client's link
//! stalled (an answer held back, then its connections reset), so an
//! enqueue it sent took a semaphore permit whose answer never came; its
//! session's local deadline passed, and the session-end script was sent
//! on the connection that had just broken (`broken pipe`), once, and
//! given up. A fresh client took the other permit, released, and nobody
//! read the semaphore's queue again: when the session key expired, the
//! permit entry (`sem/.q`, `sem/.e`, `sem/.v`) stayed on the store after
//! every client had closed.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{client, raw, url_with};
use quorumlock_conformance::faults::{NetControl, NetMode, TcpProxy};
use quorumlock_conformance::support::{env_or_skip as env, unique_namespace};
use quorumlock_core::backend::Backend;
use quorumlock_core::LockClient;
use quorumlock_redis::RedisBackend;

const TTL: Duration = Duration::from_secs(2);

/// A client behind a proxy of its own, and the plain URL of its
/// namespace.
struct Behind {
    base: String,
    ns: String,
    proxy: TcpProxy,
    a: LockClient,
}

async fn behind_proxy(prefix: &str) -> Option<Behind> {
    let base = env("QUORUMLOCK_TEST_REDIS_URL")?;
    let u = quorumlock_core::url::parse(&base).unwrap();
    let target: SocketAddr =
        tokio::net::lookup_host((u.host_str().unwrap().to_string(), u.port().unwrap_or(6379)))
            .await
            .unwrap()
            .next()
            .unwrap();
    let proxy = TcpProxy::start(target).await.unwrap();
    let ns = unique_namespace(prefix);
    let query = format!("ttl={}s", TTL.as_secs());
    let mut through = quorumlock_core::url::parse(&url_with(&base, &ns, Some(&query))).unwrap();
    through.set_port(Some(proxy.addr().port())).unwrap();
    let a = client(through.as_str()).await;
    Some(Behind { base, ns, proxy, a })
}

/// Whether session `sid`'s key is gone from the server within `limit`
/// (polled: the expiry is the server's, with no event to wait for).
async fn session_gone_within(base: &str, ns: &str, sid: &str, limit: Duration) -> bool {
    let give_up = tokio::time::Instant::now() + limit;
    while session_exists(base, ns, sid).await {
        if tokio::time::Instant::now() >= give_up {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

/// What of namespace `ns` is on the store, read without running any
/// script (so without purging anything), as the explorer's leak check
/// reads it.
async fn left(base: &str, ns: &str) -> Vec<String> {
    let probe = RedisBackend::connect(url_with(base, ns, None))
        .await
        .unwrap();
    probe.leftovers().await.unwrap()
}

/// Whether session `sid`'s key is still on the server.
async fn session_exists(base: &str, ns: &str, sid: &str) -> bool {
    let mut conn = raw(base).await;
    let n: i64 = redis::cmd("EXISTS")
        .arg(format!("{ns}/.session/{sid}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    n == 1
}

/// A holds a permit when it closes; the first try of the session's end
/// meets a cut link, which heals at once. The close must get the end
/// through: nothing of A may be left once `close()` returned (before,
/// the end was tried once and given up, and the permit entry stayed for
/// good once the session key expired, nobody reading that queue again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_end_that_fails_once_is_sent_again() {
    let Some(Behind { base, ns, proxy, a }) = behind_proxy("qlend").await else {
        return;
    };
    let g = a.semaphore("sem", 2).unwrap().acquire().await.unwrap();
    let sid = a.session_id().await.unwrap();

    proxy.set_mode(NetMode::Cut);
    let closing = tokio::spawn({
        let a = a.clone();
        async move { a.close().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set_mode(NetMode::Pass);
    tokio::time::timeout(TTL * 3, closing)
        .await
        .expect("close() hung")
        .unwrap();
    drop(g);

    let now = left(&base, &ns).await;
    // Once the session is gone as well (an entry of an expired session is
    // never removed by the expiry itself).
    assert!(
        session_gone_within(&base, &ns, &sid, TTL + TTL / 2).await,
        "A's session outlived its TTL"
    );
    let later = left(&base, &ns).await;
    assert!(
        now.is_empty() && later.is_empty(),
        "left on the store after A closed: {now:?}; a TTL later: {later:?}"
    );
}

/// A holds a permit; its link is cut until its session key has expired
/// on the server (its local deadline passes meanwhile, and the session's
/// end is tried on the cut link), then heals, and A closes. The end of
/// the session must still find the queues of its entries and settle
/// them, although the session key is gone: nothing of A may be left once
/// `close()` returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_end_after_the_session_expired_still_removes_its_entries() {
    let Some(Behind { base, ns, proxy, a }) = behind_proxy("qlendlate").await else {
        return;
    };
    let g = a.semaphore("sem", 2).unwrap().acquire().await.unwrap();
    let sid = a.session_id().await.unwrap();

    proxy.set_mode(NetMode::Cut);
    let lost = tokio::time::timeout(TTL * 2, g.lost()).await;
    assert!(lost.is_ok(), "A's guard did not report its loss");
    // Until the server let the session expire (at most a TTL after the
    // last renewal that got through).
    assert!(
        session_gone_within(&base, &ns, &sid, TTL * 2).await,
        "A's session never expired"
    );
    proxy.set_mode(NetMode::Pass);
    tokio::time::timeout(TTL * 3, a.close())
        .await
        .expect("close() hung");
    drop(g);

    let now = left(&base, &ns).await;
    assert!(
        now.is_empty(),
        "left on the store after A closed (its session expired while its link was cut): {now:?}"
    );
}

/// A leader's link goes silent and its session key expires on the
/// server; no script runs on the election after that (nobody else
/// campaigns or reads it). An observer still reports that nobody leads,
/// within about the TTL: Redis publishes nothing when a key expires, so
/// the observer wakes when the first session of the election's entries
/// is due to expire (before, it waited for a message that never came).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sees_a_leader_whose_session_expired() {
    use futures::StreamExt;
    let Some(Behind { base, ns, proxy, a }) = behind_proxy("qlobs").await else {
        return;
    };
    let leader = a.election("e").unwrap().campaign("a").await.unwrap();
    let o = client(&url_with(&base, &ns, None)).await;
    let mut seen = Box::pin(o.election("e").unwrap().observe());
    let first = tokio::time::timeout(TTL * 5, seen.next()).await.unwrap();
    assert_eq!(
        first.unwrap().unwrap().map(|l| l.value),
        Some(b"a".to_vec())
    );
    proxy.set_mode(NetMode::Blackhole);
    let next = tokio::time::timeout(TTL * 5, seen.next())
        .await
        .expect("the observer never saw the leader's session expire");
    assert_eq!(next.unwrap().unwrap(), None);
    drop(seen);
    proxy.set_mode(NetMode::Pass);
    drop(leader);
    a.close().await;
    o.close().await;
    assert!(left(&base, &ns).await.is_empty());
}
