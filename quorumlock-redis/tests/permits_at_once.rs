//! Several permits at once (`Semaphore::acquire_many`) on Redis: the
//! request's entries (`<contender>.<j>.<k>` and `<contender>`) are one
//! attempt of the client, so the renewal's reconciliation, which removes
//! the session's entries that its client no longer owns, keeps all of
//! them for as long as the guard holds.

mod common;

use std::time::Duration;

use common::{client, url_with};
use quorumlock_conformance::support::{env_or_skip as env, unique_namespace};

#[tokio::test]
async fn a_held_request_of_several_permits_survives_renewals() {
    let Some(base) = env("QUORUMLOCK_TEST_REDIS_URL") else {
        return;
    };
    let ns = unique_namespace("qlmany");
    // Renewals every 200 ms: a stray is removed by the second one.
    let a = client(&url_with(&base, &ns, Some("ttl=600ms"))).await;
    let b = client(&url_with(&base, &ns, None)).await;
    let g = a
        .semaphore("pool", 3)
        .unwrap()
        .acquire_many(3)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let state = b.inspect("pool").await.unwrap();
    assert_eq!(
        state.holders.len(),
        3,
        "the renewals removed permits of a held request: {state:?}"
    );
    assert!(g.is_held());
    let e = b
        .semaphore("pool", 3)
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), quorumlock_core::ErrorKind::WouldBlock, "{e}");
    g.release().await.unwrap();
    assert!(b.inspect("pool").await.unwrap().is_free());
    a.close().await;
    b.close().await;
}
