//! Fencing tokens on the shared test server: the server's timeline above
//! the sequence's value, and a sequence near 2^40 refused rather than
//! wrapped (new acquires refused 2^32 values early, with `Store`; the
//! grants of entries already queued still go, so releases work).

mod common;

use std::sync::Arc;
use std::time::Duration;

use quorumlock_core::{ErrorKind, LockClient};
use quorumlock_postgres::PostgresBackend;

const SEQ_BITS: u32 = 40;
const ENQUEUE_LIMIT: i64 = (1 << SEQ_BITS) - (1 << 32);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_carry_the_timeline_and_never_wrap() {
    let Some(base) = common::base_url() else {
        return;
    };
    let schema = format!("qltok_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let url = format!("{base}?schema={schema}");
    let db = common::sql(&base).await;
    let timeline = common::timeline(&db).await;
    let a = LockClient::new(Arc::new(PostgresBackend::connect(&url).await.unwrap()));
    let b = LockClient::new(Arc::new(PostgresBackend::connect(&url).await.unwrap()));
    let c = LockClient::new(Arc::new(PostgresBackend::connect(&url).await.unwrap()));

    let held = a.lock("t").unwrap().acquire().await.unwrap();
    let t1 = held.token() as i64;
    assert_eq!(t1 >> SEQ_BITS, timeline, "{t1}");
    assert!(t1 & ((1 << SEQ_BITS) - 1) < 100, "{t1}");
    // Two waiters queued (b first, then c), before the sequence nears
    // its end.
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.lock("t").unwrap().acquire().await }
    });
    common::wait_for("the waiter queued", Duration::from_secs(10), || async {
        (a.inspect("t").await.unwrap().waiters.len() == 1).then_some(())
    })
    .await;
    let next = tokio::spawn({
        let c = c.clone();
        async move {
            c.lock("t")
                .unwrap()
                .acquire_timeout(Duration::from_secs(5))
                .await
        }
    });
    common::wait_for(
        "the second waiter queued",
        Duration::from_secs(10),
        || async { (a.inspect("t").await.unwrap().waiters.len() == 2).then_some(()) },
    )
    .await;

    // The sequence at the enqueue limit: a new acquire is refused.
    db.execute(
        &format!("SELECT setval('{schema}.seq', {})", ENQUEUE_LIMIT - 1),
        &[],
    )
    .await
    .unwrap();
    let e = a.lock("u").unwrap().try_acquire().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Store, "{e}");
    assert!(e.to_string().contains("refused rather than wrapped"), "{e}");
    assert!(a.inspect("u").await.unwrap().holders.is_empty());

    // The queued waiter is still granted when the holder releases.
    held.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not granted")
        .unwrap()
        .unwrap();
    let t2 = g.token() as i64;
    assert_eq!(t2 >> SEQ_BITS, timeline, "{t2}");
    assert!(t2 & ((1 << SEQ_BITS) - 1) > ENQUEUE_LIMIT, "{t2}");
    assert!(t2 > t1);

    // Past 2^40 no token is given: the grant is refused, not wrapped into
    // the timeline's bits (the release that would grant the second
    // waiter fails and changes nothing).
    db.execute(
        &format!("SELECT setval('{schema}.seq', {})", (1i64 << SEQ_BITS) - 1),
        &[],
    )
    .await
    .unwrap();
    let e = g.release().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Store, "{e}");
    assert!(e.to_string().contains("refused rather than wrapped"), "{e}");
    assert!(next.await.unwrap().is_err());
    a.close().await;
    b.close().await;
    c.close().await;
    db.execute(&format!("DROP SCHEMA {schema} CASCADE"), &[])
        .await
        .unwrap();
}
