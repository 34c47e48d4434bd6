//! Queue entries against a real Redis:
//!
//! - an entry is judged by its own session, whatever namespace reads it:
//!   a client one namespace up (where lock `x` of namespace `app` is lock
//!   `app/x`) that lists or inspects it does not purge a live holder, and
//!   its break reaches the holder at once;
//! - a session's set of its entries shrinks as it releases them, and
//!   lives a TTL past its session key whether its entry holds or waits;
//! - a step that queues and grants an entry tells the lock's followers
//!   once;
//! - a release the server refuses for a while (`BUSY`: a long script,
//!   `MISCONF`: writes stopped after a failed snapshot) is retried until
//!   the entry is gone, without ending the session (a `redis-server` of
//!   the test's own, the binary from `QUORUMLOCK_REDIS_SERVER`, so no
//!   other test is held up).

mod common;

use std::time::Duration;

use common::{client, plain_client, raw, session_set, until_queued, url_with};
use futures::StreamExt;
use quorumlock_conformance::support::open_session;
use quorumlock_conformance::support::{env_or_skip as env, free_port, unique_namespace};
use quorumlock_core::{ErrorKind, LockClient};
use tokio::process::{Child, Command};

#[tokio::test]
async fn a_client_one_namespace_up_does_not_purge_live_entries() {
    let Some(base) = env("QUORUMLOCK_TEST_REDIS_URL") else {
        return;
    };
    let top = unique_namespace("qlns");
    let app = format!("{top}/app");
    let a = client(&url_with(&base, &app, None)).await;
    let g = a.lock("x").unwrap().acquire().await.unwrap();

    // The same lock seen from one level up (`app/x`) and from the root
    // of the server (`<top>/app/x`): same keys, other session prefixes.
    let up = client(&url_with(&base, &top, None)).await;
    let listed = up.list("").await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].holders.len(), 1, "{listed:?}");
    let state = up.inspect("app/x").await.unwrap();
    assert_eq!(state.holders.len(), 1, "{state:?}");
    assert_eq!(state.holders[0].session, g.session_id(), "{state:?}");
    let root = client(&url_with(&base, "", None)).await;
    let state = root.inspect(format!("{app}/x")).await.unwrap();
    assert_eq!(state.holders.len(), 1, "{state:?}");

    // Still held by A: another client of `app` is refused, and a waiting
    // client one level up queues behind it.
    let c = client(&url_with(&base, &app, None)).await;
    let e = c
        .lock("x")
        .unwrap()
        .try_acquire()
        .await
        .expect_err("a second holder: the listing purged the live holder");
    assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e}");
    assert!(g.is_held(), "{:?}", g.loss());
    let e = up
        .lock("app/x")
        .unwrap()
        .try_acquire()
        .await
        .expect_err("a second holder from one level up");
    assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e}");
    let state = c.inspect("x").await.unwrap();
    assert_eq!(state.holders.len(), 1, "{state:?}");
    assert_eq!(state.holders[0].token, g.token(), "{state:?}");

    // One level up waits its turn and is granted on A's release.
    let waiter = {
        let up = up.clone();
        tokio::spawn(async move { up.lock("app/x").unwrap().acquire().await })
    };
    until_queued(&c, "x").await;
    let token = g.token();
    g.release().await.unwrap();
    let g2 = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("not granted after the release")
        .unwrap()
        .unwrap();
    assert!(g2.token() > token);
    g2.release().await.unwrap();
    for cl in [a, up, root, c] {
        cl.close().await;
    }
}

#[tokio::test]
async fn a_break_from_one_namespace_up_reaches_the_holder_at_once() {
    let Some(base) = env("QUORUMLOCK_TEST_REDIS_URL") else {
        return;
    };
    let top = unique_namespace("qlns");
    // One-hour sessions: no renewal finds the entry gone within the test,
    // only the break's message to the holder's mailbox can tell it.
    let a = client(&url_with(&base, &format!("{top}/app"), Some("ttl=1h"))).await;
    let g = a.lock("x").unwrap().acquire().await.unwrap();
    let up = client(&url_with(&base, &top, None)).await;
    assert!(up.break_lock("app/x").await.unwrap());
    let reason = tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("the holder did not learn of the break");
    assert_eq!(reason, quorumlock_core::LossReason::EntryDeleted);
    drop(g);
    a.close().await;
    up.close().await;
}

#[tokio::test]
async fn a_sessions_set_of_entries_shrinks_as_it_releases() {
    let Some(base) = env("QUORUMLOCK_TEST_REDIS_URL") else {
        return;
    };
    let ns = unique_namespace("qlset");
    let a = client(&url_with(&base, &ns, None)).await;
    let b = client(&url_with(&base, &ns, None)).await;
    let mut conn = raw(&base).await;
    for i in 0..200 {
        let g = a.lock(format!("n{i}")).unwrap().acquire().await.unwrap();
        g.release().await.unwrap();
    }
    let sid = a.session_id().await.unwrap();
    let left = session_set(&mut conn, &ns, &sid).await;
    assert!(
        left.len() <= 1,
        "{} members in the set of a session after 200 released names: {:?}...",
        left.len(),
        &left[..left.len().min(3)]
    );

    // Held ones stay; attempts that did not get them (refused at once,
    // timed out) leave nothing in the other session's set.
    let held = a.lock("h").unwrap().acquire().await.unwrap();
    for _ in 0..20 {
        let e = b.lock("h").unwrap().try_acquire().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e}");
        let e = b
            .lock("h")
            .unwrap()
            .acquire_timeout(Duration::from_millis(20))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    }
    b.wait_idle().await;
    assert_eq!(session_set(&mut conn, &ns, &sid).await.len(), 1);
    let bsid = b.session_id().await.unwrap();
    let left = session_set(&mut conn, &ns, &bsid).await;
    assert!(left.is_empty(), "{left:?}");

    // Closing the session still finds the held entry: its waiter is
    // granted at once.
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("h").unwrap().acquire().await })
    };
    until_queued(&b, "h").await;
    a.close().await;
    let g = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("closing the session did not grant its waiter")
        .unwrap()
        .unwrap();
    drop(held);
    g.release().await.unwrap();
    b.close().await;
}

/// The uncontended acquire queues and grants its entry in one script:
/// the lock's followers get one message for it (they read the queue after
/// the script anyway), the release one more. The session's entry set
/// lives a TTL past the session key, whether its entry was granted at
/// once or waits.
#[tokio::test]
async fn a_step_announces_once_and_the_entry_set_outlives_the_session() {
    let Some(base) = env("QUORUMLOCK_TEST_REDIS_URL") else {
        return;
    };
    let ns = unique_namespace("qlann");
    let url = url_with(&base, &ns, Some("ttl=10s"));
    let (a, b) = (client(&url).await, client(&url).await);
    // Sessions open before the count starts.
    open_session(&a).await;
    open_session(&b).await;
    let conn = raw(&base).await;
    let mut ps = plain_client(&base).get_async_pubsub().await.unwrap();
    ps.psubscribe(format!("{ns}/x*")).await.unwrap();
    let mut messages = ps.into_on_message();
    // Messages up to a marker published after the step: the server writes
    // them to the subscriber in the order they were published.
    let mut count_changes = async |marker: &str| {
        let _: i64 = redis::cmd("PUBLISH")
            .arg(format!("{ns}/x{marker}"))
            .arg("")
            .query_async(&mut conn.clone())
            .await
            .unwrap();
        let mut n = 0;
        loop {
            let m = tokio::time::timeout(Duration::from_secs(10), messages.next())
                .await
                .expect("the marker did not come")
                .unwrap();
            if m.get_channel_name().ends_with(marker) {
                return n;
            }
            if m.get_channel_name() == format!("{ns}/x/.changes")
                && m.get_payload_bytes().is_empty()
            {
                n += 1;
            }
        }
    };
    let held = a.lock("x").unwrap().acquire().await.unwrap();
    assert_eq!(
        count_changes("/m1").await,
        1,
        "messages for one uncontended acquire"
    );

    let pttl = |key: String| {
        let mut conn = conn.clone();
        async move {
            redis::cmd("PTTL")
                .arg(key)
                .query_async::<i64>(&mut conn)
                .await
                .unwrap()
        }
    };
    let outlives = async |sid: String| {
        let session = pttl(format!("{ns}/.session/{sid}")).await;
        let set = pttl(format!("{ns}/.session/{sid}/.locks")).await;
        assert!(
            session > 0 && set >= session + 5_000,
            "entry set {set} ms, session key {session} ms (a TTL of 10 s)"
        );
    };
    outlives(a.session_id().await.unwrap()).await;

    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("x").unwrap().acquire().await })
    };
    until_queued(&b, "x").await;
    outlives(b.session_id().await.unwrap()).await;

    held.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not granted")
        .unwrap()
        .unwrap();
    g.release().await.unwrap();
    a.close().await;
    b.close().await;
}

/// A `redis-server` on a free port with a save point (so a failed
/// snapshot stops writes) in a directory of its own, killed when dropped.
struct Server {
    _child: Child,
    dir: tempfile::TempDir,
    url: String,
}

async fn start(bin: &str) -> Server {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(bin)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args([
            "--save",
            "3600 1",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ])
        .arg("--dir")
        .arg(dir.path())
        // BUSY to other clients once a script has run 100 ms.
        .args(["--lua-time-limit", "100"])
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starting redis-server");
    let url = format!("redis://127.0.0.1:{port}");
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Server {
                _child: child,
                dir,
                url,
            };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("redis-server on {port} did not start");
}

/// How many errors with `code` the server has answered.
async fn errors(conn: &mut redis::aio::MultiplexedConnection, code: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("errorstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("errorstat_{code}:count=")))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// Two clients of one namespace of `server` (one-hour sessions: no
/// renewal and no mailbox read runs into the server's refusals), A
/// holding locks `l` and `other`.
struct Holder {
    a: LockClient,
    b: LockClient,
    l: quorumlock_core::LockGuard,
    other: quorumlock_core::LockGuard,
}

async fn holder(server: &Server) -> Holder {
    let url = url_with(&server.url, &unique_namespace("qlbusy"), Some("ttl=1h"));
    let a = client(&url).await;
    let b = client(&url).await;
    let l = a.lock("l").unwrap().acquire().await.unwrap();
    let other = a.lock("other").unwrap().acquire().await.unwrap();
    Holder { a, b, l, other }
}

/// After `l`'s release: B takes `l` at once (the entry is gone), and A
/// still holds `other` (its session was not ended over `l`).
async fn check_released(a: LockClient, b: LockClient, other: quorumlock_core::LockGuard) {
    let g = b
        .lock("l")
        .unwrap()
        .try_acquire()
        .await
        .expect("the released entry is still there");
    assert!(other.is_held(), "{:?}", other.loss());
    g.release().await.unwrap();
    other.release().await.unwrap();
    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_answered_busy_is_retried_until_the_entry_is_gone() {
    let Some(bin) = env("QUORUMLOCK_REDIS_SERVER") else {
        return;
    };
    let server = start(&bin).await;
    let Holder { a, b, l, other } = holder(&server).await;

    // A script that keeps the server busy for 2 s, on a connection of
    // its own.
    let mut busy_conn = raw(&server.url).await;
    let busy = tokio::spawn(async move {
        redis::cmd("EVAL")
            .arg(
                "local t = redis.call('TIME') \
                 local t0 = t[1] * 1000000 + t[2] \
                 repeat t = redis.call('TIME') \
                 until t[1] * 1000000 + t[2] - t0 > 2000000 \
                 return 1",
            )
            .arg(0)
            .query_async::<i64>(&mut busy_conn)
            .await
    });
    // Until the server answers BUSY (after the 100 ms limit).
    let mut probe = raw(&server.url).await;
    loop {
        match redis::cmd("GET")
            .arg("probe")
            .query_async::<Option<String>>(&mut probe)
            .await
        {
            Err(e) if e.code() == Some("BUSY") => break,
            Err(e) => panic!("probe: {e}"),
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    let released = l.release().await;
    assert_eq!(busy.await.unwrap().unwrap(), 1);
    // The probe's BUSY and at least one of the release's.
    let n = errors(&mut probe, "BUSY").await;
    assert!(n >= 2, "{n} BUSY answers: the release did not meet one");
    released.expect("release, once the server is no longer busy");
    check_released(a, b, other).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_answered_misconf_is_retried_until_the_entry_is_gone() {
    let Some(bin) = env("QUORUMLOCK_REDIS_SERVER") else {
        return;
    };
    let server = start(&bin).await;
    let Holder { a, b, l, other } = holder(&server).await;

    // A snapshot that fails (its directory is gone) stops writes: MISCONF.
    let mut conn = raw(&server.url).await;
    std::fs::remove_dir_all(server.dir.path()).unwrap();
    let _: String = redis::cmd("BGSAVE").query_async(&mut conn).await.unwrap();
    loop {
        match redis::cmd("SET")
            .arg("probe")
            .arg("1")
            .query_async::<()>(&mut conn)
            .await
        {
            Err(e) if e.code() == Some("MISCONF") => break,
            Err(e) => panic!("probe: {e}"),
            Ok(()) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    let probed = errors(&mut conn, "MISCONF").await;
    let release = tokio::spawn(l.release());
    // Until the release was refused a few times (more than a permanent
    // refusal would be tried).
    while errors(&mut conn, "MISCONF").await < probed + 4 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("stop-writes-on-bgsave-error")
        .arg("no")
        .query_async(&mut conn)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), release)
        .await
        .expect("release did not end once writes were allowed again")
        .unwrap()
        .expect("release, once writes are allowed again");
    check_released(a, b, other).await;
}
