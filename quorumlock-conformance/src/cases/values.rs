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
        .client_with(quorumlock_core::ClientOptions::default().with_value("worker-7 on build-3"))
        .await;
    let observer = case.client().await;
    let value_of = |state: &quorumlock_core::LockState| state.holders[0].value.clone();

    let g1 = plain.lock("default").unwrap().acquire().await.unwrap();
    let expected = quorumlock_core::default_value();
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

/// Values that look like what the layouts write themselves (break and
/// revoke markers, encoded entries, escapes, a semaphore's `permits=`):
/// as a holder value and as an election proposal each is only a value.
/// Another client sees exactly those bytes, finds the lock held (not
/// free, not broken, not in use by another kind), and the holder keeps
/// it, with no revoke request.
pub async fn values_that_look_like_markers_are_values(h: &Harness) {
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let values: Vec<Vec<u8>> = [
        &b"__BREAK__"[..],
        b"__BREAK__x",
        b"__REVOKE__",
        b"__REVOKE__x",
        b"__VALUE__x",
        b"ql:x:5:h",
        b"ql:s1:5",
        b"ql:e:",
        b"ql:anything",
        b"permits=3",
        b".lock",
        b"~x",
        b"",
        b"\xff\x00\xfe",
    ]
    .iter()
    .map(|v| v.to_vec())
    .collect();
    for (i, v) in values.iter().enumerate() {
        let name = format!("v{i}");
        let g = a
            .lock(name.as_str())
            .unwrap()
            .with_value(v.clone())
            .acquire()
            .await
            .unwrap();
        let state = b.inspect(name.as_str()).await.unwrap();
        assert_eq!(state.holders.len(), 1, "value {v:?}: {state:#?}");
        assert_eq!(state.holders[0].value, *v, "value {v:?} as a holder value");
        assert_kind(
            b.lock(name.as_str()).unwrap().try_acquire().await,
            ErrorKind::WouldBlock,
            &format!("a lock held with value {v:?}"),
        );
        assert!(g.is_held() && !g.is_revoke_requested(), "value {v:?}");
        g.release().await.unwrap();

        let election = format!("e{i}");
        let leader = a
            .election(election.as_str())
            .unwrap()
            .campaign(v.clone())
            .await
            .unwrap();
        let seen = b
            .election(election.as_str())
            .unwrap()
            .leader()
            .await
            .unwrap();
        assert_eq!(
            seen.map(|l| l.value).as_deref(),
            Some(v.as_slice()),
            "value {v:?} as a proposal"
        );
        assert_kind(
            b.election(election.as_str())
                .unwrap()
                .campaign_timeout("other", Duration::from_millis(200))
                .await
                .map(drop),
            ErrorKind::Timeout,
            &format!("a second candidate while {v:?} leads"),
        );
        assert!(
            leader.is_leader() && !leader.guard().is_revoke_requested(),
            "value {v:?}"
        );
        leader.resign().await.unwrap();
    }
    case.finish().await;
}
