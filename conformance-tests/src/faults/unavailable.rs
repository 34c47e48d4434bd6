//! A store that cannot be reached is an error within a bound, not an
//! acquire that retries forever in silence; a timed-out acquire on a held
//! lock names the holder.

use std::time::Duration;

use lockcore::{ClientOptions, ErrorKind, LockClient};
use tokio::time::Instant;

use super::{FaultTarget, NetMode, Row};

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
