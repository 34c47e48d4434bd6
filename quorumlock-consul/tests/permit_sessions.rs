//! Several permits of one client on Consul: the second and later
//! concurrent permits of one semaphore are held through permit sessions
//! of their own (`consul lock -n` counts holders by session). The loss of
//! one of them loses exactly the permits held through it; `close` ends
//! them all.
//!
//! Needs `QUORUMLOCK_TEST_CONSUL_URL`.

use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::Harness;
use quorumlock_core::LossReason;

fn harness() -> Option<Harness> {
    Harness::from_env("QUORUMLOCK_TEST_CONSUL_URL", |url| async move {
        Ok(Arc::new(quorumlock_consul::ConsulBackend::connect(&url).await?) as _)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_permit_session_loses_only_its_permit() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let (a, b) = (case.client().await, case.client().await);
    let sem = a.semaphore("psess", 3).unwrap();
    let g1 = sem.acquire().await.unwrap();
    let g2 = sem.acquire().await.unwrap();
    let main = a.session_id().await.unwrap();
    let st = b.inspect("psess").await.unwrap();
    let sessions: Vec<&str> = st.holders.iter().map(|c| c.session.as_str()).collect();
    assert_eq!(sessions.len(), 2, "{st:?}");
    assert!(sessions.contains(&main.as_str()), "{st:?}");
    let permit_session = sessions.iter().find(|s| **s != main).unwrap().to_string();
    // The first permit uses the client's session, the second a permit
    // session (guards report the client's session either way).
    let (kept, lost) = (g1, g2);
    b.backend().kill_session(&permit_session).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(30), lost.lost())
        .await
        .expect("the permit held through the killed session was not lost");
    assert!(
        matches!(
            reason,
            LossReason::SessionExpired | LossReason::EntryDeleted
        ),
        "{reason:?}"
    );
    assert!(kept.is_held(), "the main session's permit was lost too");
    // The freed permit can be taken again (through another session).
    let g3 = tokio::time::timeout(Duration::from_secs(30), sem.acquire())
        .await
        .expect("no permit after the loss")
        .unwrap();
    assert_eq!(b.inspect("psess").await.unwrap().holders.len(), 2);
    drop(lost);
    kept.release().await.unwrap();
    g3.release().await.unwrap();
    case.finish().await;
}
