//! Holder values: every entry carries who holds it, and another client's
//! `inspect` (and a timed-out acquire) reports it.

use super::*;

/// The default value (`<hostname>:<pid>`), a client-wide value and a
/// per-lock value are each seen by another client's inspect, for holders
/// and waiters; a timed-out acquire names the holder's value.
pub async fn holder_values_seen_by_another_client(h: &Harness) {
    let case = h.case();
    let plain = case.client().await;
    let custom = case
        .client_with(lockcore::ClientOptions::default().with_value("worker-7 on build-3"))
        .await;
    let observer = case.client().await;
    let value_of = |state: &lockcore::LockState| state.holders[0].value.clone();

    let g1 = plain.lock("default").unwrap().acquire().await.unwrap();
    let expected = lockcore::default_value();
    assert!(
        String::from_utf8_lossy(&expected).ends_with(&format!(":{}", std::process::id())),
        "default value {expected:?} is not <hostname>:<pid>"
    );
    assert_eq!(
        value_of(&observer.inspect("default").await.unwrap()),
        expected
    );

    let g2 = custom.lock("client-wide").unwrap().acquire().await.unwrap();
    assert_eq!(
        value_of(&observer.inspect("client-wide").await.unwrap()),
        b"worker-7 on build-3"
    );

    // Per lock, over the client's: any bytes, not only text.
    let raw = b"job \xff:42\n".to_vec();
    let g3 = custom
        .lock("per-lock")
        .unwrap()
        .with_value(raw.clone())
        .acquire()
        .await
        .unwrap();
    let state = observer.inspect("per-lock").await.unwrap();
    assert_eq!(value_of(&state), raw);
    let listed = observer.list("").await.unwrap();
    let per_lock = listed
        .iter()
        .find(|s| s.name.as_str() == "per-lock")
        .expect("per-lock listed");
    assert_eq!(
        value_of(per_lock),
        raw,
        "list shows the value as inspect does"
    );

    // A waiter's value is seen too, in its place in the queue.
    let waiter = plain.lock("client-wide").unwrap().with_value("waiting one");
    let task = tokio::spawn(async move { waiter.acquire().await?.release().await });
    eventually("the waiter to queue", || async {
        waiters(&observer, "client-wide").await == 1
    })
    .await;
    let state = observer.inspect("client-wide").await.unwrap();
    assert_eq!(state.waiters[0].value, b"waiting one");

    // A timed-out acquire says who holds.
    let e = observer
        .lock("default")
        .unwrap()
        .acquire_timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    let text = String::from_utf8_lossy(&expected).into_owned();
    assert!(
        e.to_string().contains(&format!("{text:?}")),
        "the timeout does not name the holder's value {text:?}: {e}"
    );

    g1.release().await.unwrap();
    g2.release().await.unwrap();
    task.await.unwrap().unwrap();
    g3.release().await.unwrap();
    case.finish().await;
}

/// Readers, writers and semaphore permits carry their values too.
pub async fn holder_values_on_every_kind(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let r1 = a
        .rwlock("rw")
        .unwrap()
        .with_value("reader a")
        .read()
        .await
        .unwrap();
    let r2 = b
        .rwlock("rw")
        .unwrap()
        .with_value("reader b")
        .read()
        .await
        .unwrap();
    let mut values: Vec<Vec<u8>> = a
        .inspect("rw")
        .await
        .unwrap()
        .holders
        .into_iter()
        .map(|c| c.value)
        .collect();
    values.sort();
    assert_eq!(values, [b"reader a".to_vec(), b"reader b".to_vec()]);
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = a
        .rwlock("rw")
        .unwrap()
        .with_value("writer a")
        .write()
        .await
        .unwrap();
    assert_eq!(b.inspect("rw").await.unwrap().holders[0].value, b"writer a");
    w.release().await.unwrap();
    let p = a
        .semaphore("sem", 2)
        .unwrap()
        .with_value("permit a")
        .acquire()
        .await
        .unwrap();
    assert_eq!(
        b.inspect("sem").await.unwrap().holders[0].value,
        b"permit a"
    );
    p.release().await.unwrap();
    case.finish().await;
}
