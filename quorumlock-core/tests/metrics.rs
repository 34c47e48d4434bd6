//! The metrics of the `metrics` feature are recorded, with their
//! documented names and labels, on the in-memory store.

use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use quorumlock_core::mem::MemBackend;
use quorumlock_core::{ErrorKind, LockClient};

#[tokio::test(flavor = "current_thread")]
async fn acquire_hold_loss_store_calls_and_keepalive_are_recorded() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");

    let url = "mem://metrics-test/ns?ttl=1s";
    let a = LockClient::new(Arc::new(MemBackend::connect(url).await.unwrap()));
    let b = LockClient::new(Arc::new(MemBackend::connect(url).await.unwrap()));
    let g = a.lock("m").unwrap().acquire().await.unwrap();
    let e = b
        .lock("m")
        .unwrap()
        .acquire_timeout(Duration::from_millis(50))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert!(b.break_lock("m").await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .unwrap();
    drop(g);
    a.wait_idle().await;

    let snapshot = snapshotter.snapshot().into_vec();
    let find = |kind: MetricKind, name: &str, labels: &[(&str, &str)]| {
        snapshot
            .iter()
            .find(|(key, _, _, _)| {
                let k = key.key();
                key.kind() == kind
                    && k.name() == name
                    && labels
                        .iter()
                        .all(|(l, v)| k.labels().any(|x| x.key() == *l && x.value() == *v))
            })
            .map(|(_, _, _, value)| value)
            .unwrap_or_else(|| panic!("{name} {labels:?} not recorded; got {snapshot:#?}"))
    };
    let samples = |v: &DebugValue| match v {
        DebugValue::Histogram(h) => h.len(),
        other => panic!("not a histogram: {other:?}"),
    };
    let acquired = [("kind", "mutex"), ("outcome", "acquired")];
    let h = find(
        MetricKind::Histogram,
        "quorumlock_acquire_seconds",
        &acquired,
    );
    assert_eq!(samples(h), 1);
    let timed_out = [("kind", "mutex"), ("outcome", "timeout")];
    let h = find(
        MetricKind::Histogram,
        "quorumlock_acquire_seconds",
        &timed_out,
    );
    assert_eq!(samples(h), 1);
    assert_eq!(
        samples(find(MetricKind::Histogram, "quorumlock_hold_seconds", &[])),
        1
    );
    assert!(
        samples(find(
            MetricKind::Histogram,
            "quorumlock_keepalive_seconds",
            &[]
        )) >= 1
    );
    let lost = [("kind", "mutex"), ("reason", "entry_deleted")];
    assert!(matches!(
        find(MetricKind::Counter, "quorumlock_losses_total", &lost),
        DebugValue::Counter(1)
    ));
    // The timed-out attempt never ended at the store; its entry was
    // abandoned.
    assert!(matches!(
        find(
            MetricKind::Counter,
            "quorumlock_store_calls_total",
            &[("op", "acquire")]
        ),
        DebugValue::Counter(1)
    ));
    assert!(matches!(
        find(MetricKind::Counter, "quorumlock_store_calls_total", &[("op", "abandon")]),
        DebugValue::Counter(n) if *n >= 1
    ));
    let holds = find(MetricKind::Gauge, "quorumlock_holds", &[("kind", "mutex")]);
    assert!(
        matches!(holds, DebugValue::Gauge(v) if v.into_inner() == 0.0),
        "a hold that ended is still counted: {holds:?}"
    );
}
