//! The keys on etcd are exactly Go's `concurrency.Mutex` layout, markers
//! stay outside the lock's prefix, and nested lock names do not count as
//! contenders of their parent.

use std::sync::Arc;
use std::time::Duration;

use conformance_tests::Harness;
use etcd_client::{Certificate, Client, ConnectOptions, GetOptions, Identity, TlsOptions};

fn harness() -> Option<Harness> {
    Harness::from_env("QUORUMLOCK_TEST_ETCD_URL", |url| async move {
        Ok(Arc::new(backend_etcd::EtcdBackend::connect(&url).await?) as _)
    })
}

/// A plain etcd client for the same store, to read the keys directly.
async fn raw(h: &Harness) -> Client {
    let config = backend_etcd::EtcdConfig::from_url(&h.url_for("x")).unwrap();
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
    let ns = case.namespace().to_string();
    let mut kv = raw(&h).await;
    let (a, b) = (case.client().await, case.client().await);

    let g = a.lock("jobs/nightly").unwrap().acquire().await.unwrap();
    let key = format!("{ns}/jobs/nightly/{}", g.session_id());
    assert_eq!(g.entry(), key);
    let got = kv.get(key.as_str(), None).await.unwrap();
    let entry = &got.kvs()[0];
    assert_eq!(entry.value(), b"", "Go's Mutex writes an empty value");
    assert_eq!(format!("{:x}", entry.lease()), g.session_id());
    assert_eq!(entry.create_revision() as u64, g.token());
    assert!(!g.session_id().starts_with('0') && g.session_id() == g.session_id().to_lowercase());

    // The revoke marker lives outside <ns>/<name>/, bound to the holder's lease.
    assert!(b.request_revoke("jobs/nightly").await.unwrap());
    tokio::time::timeout(Duration::from_secs(10), g.revoke_requested())
        .await
        .unwrap();
    let marker = kv
        .get(format!("{ns}/.revoke/jobs/nightly"), None)
        .await
        .unwrap();
    assert_eq!(marker.kvs()[0].value(), key.as_bytes());
    assert_eq!(marker.kvs()[0].lease(), entry.lease());
    let under = kv
        .get(
            format!("{ns}/jobs/nightly/"),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert_eq!(
        under.kvs().len(),
        1,
        "only our contender key under the lock's prefix"
    );
    g.release().await.unwrap();
    let marker = kv
        .get(format!("{ns}/.revoke/jobs/nightly"), None)
        .await
        .unwrap();
    assert!(marker.kvs().is_empty(), "release left the revoke marker");
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
