//! A store that cannot be reached is an error within a bound, not an
//! acquire that retries forever in silence; a timed-out acquire on a held
//! lock names the holder.

use std::time::Duration;

use quorumlock_core::{ClientOptions, ErrorKind, LockClient};
use tokio::time::Instant;

use super::{FaultTarget, Link, NetControl, NetMode, Row, TcpProxy};

/// The client's limit in this scenario.
const AFTER: Duration = Duration::from_secs(2);
/// Scheduling and connection set-up beyond the limit.
const SLACK: Duration = Duration::from_secs(3);
/// Generous bound for a healed link to work again.
const SETTLE: Duration = Duration::from_secs(30);

/// With the link refused (`Cut`) and with it silent (`Blackhole`), a
/// waiting `acquire()` of a client with no session returns
/// [`ErrorKind::Unavailable`] after `unavailable_after`, and works again
/// once the link heals. Then a timed-out acquire on a held lock names the
/// holder's session.
pub async fn unreachable_store_is_unavailable(t: &FaultTarget) -> Row {
    let ns = format!("qlu-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut row = Row::new(t.name(), "unreachable_store_is_unavailable");
    let admin = t.client(&ns).await;
    for mode in [NetMode::Cut, NetMode::Blackhole] {
        let (backend, net) = t.faulty_backend(&ns).await;
        let options = ClientOptions::default().with_unavailable_after(Some(AFTER));
        let client = LockClient::with_options(backend, options);
        net.set_mode(mode);
        row.faults += 1;
        let start = Instant::now();
        let r = tokio::time::timeout(AFTER + SETTLE, client.lock("u").unwrap().acquire())
            .await
            .unwrap_or_else(|_| panic!("{mode:?}: acquire() still retrying on {}", t.name()));
        let took = start.elapsed();
        match r {
            Err(e) if e.kind() == ErrorKind::Unavailable => {}
            other => panic!(
                "{mode:?} on {}: expected Unavailable, got {other:?}",
                t.name()
            ),
        }
        assert!(
            took + Duration::from_millis(100) >= AFTER && took <= AFTER + SLACK,
            "{mode:?} on {}: Unavailable after {took:?}, the limit is {AFTER:?}",
            t.name()
        );
        net.set_mode(NetMode::Pass);
        let g = client
            .lock("u")
            .unwrap()
            .acquire_timeout(SETTLE)
            .await
            .unwrap_or_else(|e| panic!("{mode:?}: after the heal on {}: {e}", t.name()));
        g.release().await.unwrap();
        client.close().await;
        row.cycles += 1;
    }

    let holder = admin
        .lock("h")
        .unwrap()
        .acquire()
        .await
        .expect("a free lock");
    let other = t.client(&ns).await;
    let e = other
        .lock("h")
        .unwrap()
        .acquire_timeout(Duration::from_millis(300))
        .await
        .expect_err("granted a held lock");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(
        e.message().contains(&holder.session_id()),
        "the timeout does not name the holder's session {}: {e}",
        holder.session_id()
    );
    holder.release().await.unwrap();
    other.close().await;
    admin.close().await;
    row
}

/// The connect timeout of [`connect_checks_the_store`].
const CONNECT: Duration = Duration::from_secs(2);

/// `connect()` finds out at once whether the store answers: to a port
/// where nothing listens it returns [`ErrorKind::Unavailable`] after its
/// `connect_timeout`, to a link that swallows everything
/// [`ErrorKind::Timeout`]; with `lazy=true` it returns at once and the
/// first acquire reports [`ErrorKind::Unavailable`] after
/// `unavailable_after`. (A `mem://` store has no network to check.)
pub async fn connect_checks_the_store(t: &FaultTarget) -> Row {
    let mut row = Row::new(t.name(), "connect_checks_the_store");
    let Link::Proxy(target) = &t.link else {
        return row;
    };
    let ns = format!("qlc-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let at = |port: u16, extra: &[(&str, &str)]| {
        let mut u = t.url_for(&ns);
        u.set_host(Some("127.0.0.1")).expect("set host");
        u.set_port(Some(port)).expect("set port");
        u.query_pairs_mut()
            .append_pair("connect_timeout", &format!("{}ms", CONNECT.as_millis()));
        for (k, v) in extra {
            u.query_pairs_mut().append_pair(k, v);
        }
        u
    };

    // Nothing listens: refused until the connect timeout.
    row.faults += 1;
    let start = Instant::now();
    let r = tokio::time::timeout(CONNECT + SETTLE, (t.factory)(at(dead_port, &[]))).await;
    let took = start.elapsed();
    match r {
        Ok(Err(e)) if e.kind() == ErrorKind::Unavailable => {
            assert!(!e.message().is_empty(), "{e}");
        }
        Ok(Err(e)) => panic!(
            "{}: connect to a dead port: expected Unavailable, got {e}",
            t.name()
        ),
        Ok(Ok(_)) => panic!("{}: connect to a dead port succeeded", t.name()),
        Err(_) => panic!("{}: connect to a dead port never returned", t.name()),
    }
    assert!(
        took <= CONNECT + SLACK,
        "{}: Unavailable after {took:?}, connect_timeout is {CONNECT:?}",
        t.name()
    );

    // A link that accepts and never answers: the connect timeout, named.
    row.faults += 1;
    let proxy = TcpProxy::start(*target).await.expect("starting a proxy");
    proxy.set_mode(NetMode::Blackhole);
    let start = Instant::now();
    let r = tokio::time::timeout(CONNECT + SETTLE, (t.factory)(at(proxy.addr().port(), &[]))).await;
    let took = start.elapsed();
    match r {
        Ok(Err(e)) if e.kind() == ErrorKind::Timeout => {
            assert!(e.message().contains("connect_timeout"), "{e}");
        }
        Ok(Err(e)) => panic!(
            "{}: connect to a silent link: expected Timeout, got {e}",
            t.name()
        ),
        Ok(Ok(_)) => panic!("{}: connect to a silent link succeeded", t.name()),
        Err(_) => panic!("{}: connect to a silent link never returned", t.name()),
    }
    assert!(
        took <= CONNECT + SLACK,
        "{}: Timeout after {took:?}, connect_timeout is {CONNECT:?}",
        t.name()
    );

    // Lazy: connect returns at once; the first acquire finds the store
    // unreachable and gives up after unavailable_after.
    row.faults += 1;
    let start = Instant::now();
    let backend = (t.factory)(at(dead_port, &[("lazy", "true")]))
        .await
        .unwrap_or_else(|e| panic!("{}: a lazy connect failed: {e}", t.name()));
    assert!(
        start.elapsed() < CONNECT,
        "{}: a lazy connect waited",
        t.name()
    );
    let client = LockClient::with_options(
        backend,
        ClientOptions::default().with_unavailable_after(Some(AFTER)),
    );
    let start = Instant::now();
    let r = tokio::time::timeout(AFTER + SETTLE, client.lock("u").unwrap().acquire())
        .await
        .unwrap_or_else(|_| panic!("{}: lazy client's acquire still retrying", t.name()));
    let took = start.elapsed();
    match r {
        Err(e) if e.kind() == ErrorKind::Unavailable => {}
        other => panic!(
            "{}: lazy, dead port: expected Unavailable, got {other:?}",
            t.name()
        ),
    }
    assert!(
        took <= AFTER + SLACK,
        "{}: Unavailable after {took:?}",
        t.name()
    );
    client.close().await;
    row.cycles += 1;
    row
}
