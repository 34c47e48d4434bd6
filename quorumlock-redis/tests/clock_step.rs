//! A forward step of the Redis server's wall clock, and the bound the
//! README states: Redis stores every expiry as an absolute time of its
//! own clock (`PX` becomes "now + TTL"), so a step of Δ brings every
//! session's expiry Δ closer at once. The holder's client counts its TTL
//! on its own monotonic clock (the local deadline, TTL - TTL/5 after the
//! last renewal it saw confirmed) and cannot notice. So:
//!
//! - a step below TTL/5 never breaks exclusion: even with renewals not
//!   getting through, the holder's local deadline passes before Redis
//!   lets its session expire;
//! - a larger step can: with renewals not getting through, a second client
//!   is granted while the holder still believes it holds;
//! - a step larger than the session's time to live (at most a TTL)
//!   expires every session at once, renewals working or not; the holder
//!   learns at its next renewal, up to TTL/3 later.
//!
//! The step is made on the test's own keys only, exactly as a clock step
//! acts on them: each key's absolute expiry time (`PEXPIRETIME`) moves Δ
//! earlier (`PEXPIREAT`), in one script, so the server's clock and the
//! other tests' keys are left alone. (A server started under libfaketime
//! would step its real clock, but Debian's libfaketime 0.9.10 deadlocks
//! redis-server at start: jemalloc reads the clock while libfaketime
//! initialises.)

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{client, raw, step_clock, url_with};
use quorumlock_conformance::faults::{NetControl, NetMode, TcpProxy};
use quorumlock_conformance::support::open_session;
use quorumlock_conformance::support::{env_or_skip as env, unique_namespace};
use quorumlock_core::{ErrorKind, LockGuard, LossReason};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(5);

/// What happened after a step: when the holder learned of its loss, and
/// when the second client was granted, from the step.
struct After {
    lost: Duration,
    reason: LossReason,
    granted: Duration,
}

/// A holds `x` (through a proxy, blackholed first when `cut`: no renewal
/// gets through any more); the clock steps by `delta`; then B asks for
/// `x` and waits.
async fn step_while_held(delta: Duration, cut: bool) -> Option<After> {
    let base = env("QUORUMLOCK_TEST_REDIS_URL")?;
    let u = quorumlock_core::url::parse(&base).unwrap();
    let target: SocketAddr =
        tokio::net::lookup_host((u.host_str().unwrap().to_string(), u.port().unwrap_or(6379)))
            .await
            .unwrap()
            .next()
            .unwrap();
    let proxy = TcpProxy::start(target).await.unwrap();
    let ns = unique_namespace("qlclock");
    let query = format!("ttl={}s", TTL.as_secs());
    let mut through = quorumlock_core::url::parse(&url_with(&base, &ns, Some(&query))).unwrap();
    through.set_port(Some(proxy.addr().port())).unwrap();
    let a = client(through.as_str()).await;
    let b = client(&url_with(&base, &ns, Some(&query))).await;
    let ga: LockGuard = a.lock("x").unwrap().acquire().await.unwrap();
    if cut {
        proxy.set_mode(NetMode::Blackhole);
    }
    let stepped = step_clock(&base, &format!("{ns}/*"), delta).await;
    assert!(stepped > 0, "no key of {ns} has an expiry");
    let stepped = Instant::now();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            let g = b.lock("x").unwrap().acquire_timeout(TTL * 2).await;
            (Instant::now(), g)
        })
    };
    let reason = tokio::time::timeout(TTL * 2, ga.lost())
        .await
        .expect("the holder never learned of its loss");
    let lost = stepped.elapsed();
    let (at, gb) = waiter.await.unwrap();
    let gb = gb.expect("B was not granted after A's session expired");
    let granted = at - stepped;
    eprintln!("step {delta:?} (renewals cut: {cut}): A lost ({reason:?}) after {lost:?}, B granted after {granted:?}");
    gb.release().await.unwrap();
    drop(ga);
    b.close().await;
    drop(proxy);
    a.close().await;
    Some(After {
        lost,
        reason,
        granted,
    })
}

/// A step of TTL/10, renewals not getting through: the holder's local
/// deadline (TTL/5 before the TTL) passes before its session expires on
/// the stepped server, so B is granted only after A stopped holding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_below_a_fifth_of_the_ttl_keeps_exclusion() {
    let Some(r) = step_while_held(TTL / 10, true).await else {
        return;
    };
    assert_eq!(r.reason, LossReason::DeadlinePassed);
    assert!(
        r.lost < r.granted,
        "B granted after {:?}, A stopped holding after {:?}",
        r.granted,
        r.lost
    );
}

/// A step of TTL/2, renewals not getting through: the session expires on
/// the server TTL/2 early, before the holder's local deadline: B is
/// granted while A's guard still says held (about 0.3 TTL of overlap).
/// What the README's clock condition is about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_above_a_fifth_of_the_ttl_can_grant_a_second_holder() {
    let Some(r) = step_while_held(TTL / 2, true).await else {
        return;
    };
    assert_eq!(r.reason, LossReason::DeadlinePassed);
    assert!(
        r.granted < r.lost,
        "B granted after {:?}, A stopped holding after {:?}: no overlap",
        r.granted,
        r.lost
    );
}

/// A step longer than the TTL, renewals working: every session expires
/// at once; B is granted at once, and A learns at its next renewal (up to
/// TTL/3 later, plus the request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_beyond_the_ttl_expires_every_session_at_once() {
    let Some(r) = step_while_held(TTL + Duration::from_secs(1), false).await else {
        return;
    };
    assert_eq!(r.reason, LossReason::SessionExpired);
    assert!(r.granted < r.lost, "B {:?}, A {:?}", r.granted, r.lost);
    assert!(r.granted < TTL / 10, "B granted after {:?}", r.granted);
    assert!(r.lost < TTL / 3 + TTL / 3, "A told after {:?}", r.lost);
}

/// A session whose expiry on the server came earlier than its client
/// believes (what a failover leaves when it lost the session's last
/// renewals: the new primary keeps the expiry the last replicated one set,
/// the README's "Failover"; or a forward step), and a grant made on it
/// after that. The grant is evidence that the session lives, read in the
/// step that decides it: it renews the session there, as a renewal would.
/// Before, the session expired at the early time, a second client was
/// granted, and the first one's guard said held until its next renewal
/// (up to TTL/3 later): two holders, found by the fault explorer
/// (`redis-failover`, seed 1795864033156949064, under chaos.sh's load).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_renews_a_session_whose_expiry_came_early() {
    let Some(base) = env("QUORUMLOCK_TEST_REDIS_URL") else {
        return;
    };
    let ns = unique_namespace("qlearly");
    // A TTL of 10 s: A's first renewal is 3.3 s away, after the test's
    // part that needs none.
    let a = client(&url_with(&base, &ns, Some("ttl=10s"))).await;
    let b = client(&url_with(&base, &ns, Some("ttl=10s"))).await;
    // A's session opens with its first acquire.
    open_session(&a).await;
    let sid = a.session_id().await.unwrap();
    let session = format!("{ns}/.session/{sid}");
    let marker = format!("{ns}/early-marker");
    let mut conn = raw(&base).await;
    // A's session expires 300 ms from now on the server, its client
    // still counting on 10 s; a marker key expires at the same instant.
    let early: i64 = redis::cmd("EVAL")
        .arg(
            "redis.call('PEXPIRE', KEYS[1], 300) \
             local at = redis.call('PEXPIRETIME', KEYS[1]) \
             redis.call('SET', KEYS[2], '1', 'PXAT', at) \
             return at",
        )
        .arg(2)
        .arg(&session)
        .arg(&marker)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(early > 0, "A's session key {session} has no expiry");
    let ga = a.lock("x").unwrap().acquire().await.unwrap();
    // Until the early expiry has passed on the server's clock.
    let waited = Instant::now();
    while exists(&mut conn, &marker).await {
        assert!(
            waited.elapsed() < Duration::from_secs(5),
            "the marker never expired"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tried = b.lock("x").unwrap().try_acquire().await;
    let a_held = ga.is_held();
    match tried {
        Ok(gb) => panic!(
            "B was granted x (token {}) while A's guard said held: {a_held} (token {}); \
             A's session key is {}",
            gb.token(),
            ga.token(),
            if exists(&mut conn, &session).await {
                "there"
            } else {
                "gone"
            }
        ),
        Err(e) => assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e}"),
    }
    assert!(a_held, "A's guard lost x: {:?}", ga.loss());
    assert!(exists(&mut conn, &session).await, "A's session expired");
    ga.release().await.unwrap();
    a.close().await;
    b.close().await;
}

async fn exists(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(conn)
        .await
        .unwrap()
        == 1
}
