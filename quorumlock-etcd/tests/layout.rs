//! The keys on etcd are exactly Go's `concurrency.Mutex` layout (our
//! value says kind and creation time; Go ignores values), read/write and
//! semaphore keys are direct children of the lock's prefix, foreign keys
//! with an empty value are mutex holders of unknown age, and nested lock
//! names do not count as contenders of their parent.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use etcd_client::{
    Certificate, Client, ConnectOptions, GetOptions, Identity, PutOptions, TlsOptions,
};
use quorumlock_conformance::Harness;
use quorumlock_core::{ErrorKind, LockKind};

fn harness() -> Option<Harness> {
    Harness::from_env("QUORUMLOCK_TEST_ETCD_URL", |url| async move {
        Ok(Arc::new(quorumlock_etcd::EtcdBackend::connect(&url).await?) as _)
    })
}

/// The key prefix of a case's clients: the URL's whole path (the test
/// URL's own path, if any, plus the case namespace).
fn key_prefix(h: &Harness, namespace: &str) -> String {
    quorumlock_etcd::EtcdConfig::from_url(&h.url_for(namespace))
        .unwrap()
        .namespace
        .to_string()
}

/// A plain etcd client for the same store, to read the keys directly.
async fn raw(h: &Harness) -> Client {
    let config = quorumlock_etcd::EtcdConfig::from_url(&h.url_for("x")).unwrap();
    let mut opts = ConnectOptions::new();
    if let (Some(u), Some(p)) = (&config.user, &config.password) {
        opts = opts.with_user(u.clone(), p.expose().to_string());
    }
    if config.tls {
        let mut tls = TlsOptions::new();
        if let Some(ca) = &config.ca {
            tls = tls.ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()));
        }
        if let Some((c, k)) = &config.client_cert {
            tls = tls.identity(Identity::from_pem(
                std::fs::read(c).unwrap(),
                std::fs::read(k).unwrap(),
            ));
        }
        opts = opts.with_tls(tls);
    }
    Client::connect(config.endpoints, Some(opts)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_go_mutex_keys() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let ns = key_prefix(&h, case.namespace());
    let mut kv = raw(&h).await;
    let (a, b) = (case.client().await, case.client().await);

    let g = a.lock("jobs/nightly").unwrap().acquire().await.unwrap();
    let key = format!("{ns}/jobs/nightly/{}", g.session_id());
    assert_eq!(g.entry(), key);
    let got = kv.get(key.as_str(), None).await.unwrap();
    let entry = got.kvs()[0].clone();
    let value = std::str::from_utf8(entry.value()).unwrap().to_string();
    assert!(value.starts_with("ql:x:"), "{value}");
    assert_eq!(format!("{:x}", entry.lease()), g.session_id());
    assert_eq!(entry.create_revision() as u64, g.token());
    assert!(!g.session_id().starts_with('0') && g.session_id() == g.session_id().to_lowercase());
    let st = b.inspect("jobs/nightly").await.unwrap();
    let since = st.holders[0].since.expect("creation time");
    let age = SystemTime::now().duration_since(since).unwrap_or_default();
    assert!(age < Duration::from_secs(60), "since {since:?}");

    // A revoke request is a put on the holder's key that keeps its value,
    // lease and create revision; nothing else is written.
    assert!(b.request_revoke("jobs/nightly").await.unwrap());
    tokio::time::timeout(Duration::from_secs(10), g.revoke_requested())
        .await
        .unwrap();
    let got = kv.get(key.as_str(), None).await.unwrap();
    let after = &got.kvs()[0];
    assert_eq!(after.value(), value.as_bytes());
    assert_eq!(after.lease(), entry.lease());
    assert_eq!(after.create_revision(), entry.create_revision());
    assert!(after.mod_revision() > entry.mod_revision());
    let all = kv
        .get(format!("{ns}/"), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(
        all.kvs().len(),
        1,
        "only our contender key in the namespace"
    );
    g.release().await.unwrap();
    case.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_names_are_not_contenders_of_their_parent() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let (a, b, c) = (
        case.client().await,
        case.client().await,
        case.client().await,
    );
    // Created first: the oldest key under "parent/".
    let child = a.lock("parent/child").unwrap().acquire().await.unwrap();
    let parent = b
        .lock("parent")
        .unwrap()
        .try_acquire()
        .await
        .expect("a nested lock's key blocked its parent");
    let st = a.inspect("parent").await.unwrap();
    assert_eq!(st.holders.len(), 1);
    assert_eq!(st.holders[0].token, parent.token());
    assert!(st.waiters.is_empty(), "{st:?}");
    // And the other way round: the parent's key is not the child's holder.
    let w = a.lock("parent/other").unwrap().try_acquire().await.unwrap();
    w.release().await.unwrap();
    // A waiter on the parent skips nested keys created between the holder
    // and itself when it looks for its predecessor.
    let mid = a.lock("parent/mid").unwrap().acquire().await.unwrap();
    let c2 = c.clone();
    let waiting = tokio::spawn(async move { c2.lock("parent").unwrap().acquire().await });
    while a.inspect("parent").await.unwrap().waiters.is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t = parent.token();
    parent.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("waiter stuck behind a nested key")
        .unwrap()
        .unwrap();
    assert!(g.token() > t);
    g.release().await.unwrap();
    mid.release().await.unwrap();
    child.release().await.unwrap();
    case.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_and_semaphore_keys() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let ns = key_prefix(&h, case.namespace());
    let mut kv = raw(&h).await;
    let (a, b) = (case.client().await, case.client().await);

    let r1 = a.rwlock("rw").unwrap().read().await.unwrap();
    let r2 = a.rwlock("rw").unwrap().read().await.unwrap();
    let lease = r1.session_id().to_string();
    for g in [&r1, &r2] {
        let prefix = format!("{ns}/rw/.r-{lease}-");
        assert!(g.entry().starts_with(&prefix), "{}", g.entry());
        let got = kv.get(g.entry(), None).await.unwrap();
        assert!(got.kvs()[0].value().starts_with(b"ql:r:"));
        assert_eq!(got.kvs()[0].create_revision() as u64, g.token());
    }
    assert_ne!(r1.entry(), r2.entry(), "one key per owner");
    let bw = b.clone();
    let w = tokio::spawn(async move { bw.rwlock("rw").unwrap().write().await.unwrap() });
    let st = loop {
        let st = a.inspect("rw").await.unwrap();
        if !st.waiters.is_empty() {
            break st;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(st.holders.len(), 2);
    assert!(st
        .holders
        .iter()
        .all(|c| c.kind == LockKind::Read && c.since.is_some()));
    assert_eq!(st.waiters[0].kind, LockKind::Write);
    assert!(st.waiters[0].entry.contains("-w-"), "{:?}", st.waiters[0]);
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = tokio::time::timeout(Duration::from_secs(10), w)
        .await
        .unwrap()
        .unwrap();
    w.release().await.unwrap();

    let s = a.semaphore("sem", 3).unwrap().acquire().await.unwrap();
    // One entry per permit holder: the attempt's uuid after `-s-`.
    let (stem, uuid) = s.entry().rsplit_once("-s-").unwrap();
    assert_eq!(stem, format!("{ns}/sem/{lease}"));
    assert_eq!(uuid.len(), 32, "{}", s.entry());
    let got = kv.get(s.entry(), None).await.unwrap();
    assert!(got.kvs()[0].value().starts_with(b"ql:s3:"));
    let st = b.inspect("sem").await.unwrap();
    assert_eq!(st.holders[0].kind, LockKind::Semaphore { permits: 3 });
    // A mutex or a reader on a semaphore's name is a conflict, at once.
    let e = b.lock("sem").unwrap().acquire().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    let e = b.rwlock("sem").unwrap().read().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    s.release().await.unwrap();
    case.finish().await;
}

/// A key another program put under the lock's prefix with an empty value
/// (as Go's `concurrency.Mutex` does) inspects as a mutex holder of unknown
/// age; our reader waits for it and our semaphore refuses to mix with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_keys_with_empty_values() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let ns = key_prefix(&h, case.namespace());
    let mut kv = raw(&h).await;
    let a = case.client().await;
    let lease = kv.lease_grant(30, None).await.unwrap().id();
    let foreign = format!("{ns}/f/{lease:x}");
    kv.put(
        foreign.as_str(),
        "",
        Some(PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();
    let st = a.inspect("f").await.unwrap();
    assert_eq!(st.holders.len(), 1);
    assert_eq!(st.holders[0].kind, LockKind::Exclusive);
    assert_eq!(st.holders[0].since, None);
    assert_eq!(st.holders[0].session, format!("{lease:x}"));
    let e = a.rwlock("f").unwrap().try_read().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e}");
    let e = a
        .semaphore("f", 2)
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    let a2 = a.clone();
    let r = tokio::spawn(async move { a2.rwlock("f").unwrap().read().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!r.is_finished(), "a reader overtook a foreign mutex holder");
    kv.lease_revoke(lease).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), r)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    r.release().await.unwrap();

    // A foreign key that queued behind our permit: a later permit request
    // waits for it instead of holding beside a Go mutex holder.
    let b = case.client().await;
    let p1 = a.semaphore("g", 2).unwrap().acquire().await.unwrap();
    let lease = kv.lease_grant(30, None).await.unwrap().id();
    kv.put(
        format!("{ns}/g/{lease:x}"),
        "",
        Some(PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();
    let b2 = b.clone();
    let p2 = tokio::spawn(async move { b2.semaphore("g", 2).unwrap().acquire().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    p1.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !p2.is_finished(),
        "a permit was granted beside a foreign mutex holder"
    );
    kv.lease_revoke(lease).await.unwrap();
    let p2 = tokio::time::timeout(Duration::from_secs(10), p2)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    p2.release().await.unwrap();
    case.finish().await;
}
