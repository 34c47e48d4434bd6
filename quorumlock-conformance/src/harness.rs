//! The harness: a backend factory, a fresh namespace per case, and the
//! leak check that ends every case.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use quorumlock_core::backend::{Backend, Capabilities};
use quorumlock_core::url::{self, Url};
use quorumlock_core::LockClient;

/// Makes one backend (one "process") for a URL whose path is the case's
/// namespace.
pub type BackendFactory =
    Arc<dyn Fn(Url) -> BoxFuture<'static, quorumlock_core::Result<Arc<dyn Backend>>> + Send + Sync>;

/// Which lock the mutex cases run on: they hold for a mutex, a semaphore
/// of one permit and the write side of a read-write lock alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// `client.lock(name)`.
    Mutex,
    /// `client.semaphore(name, 1)`.
    Semaphore1,
    /// `client.rwlock(name).write()`.
    RwWrite,
}

/// A store under test.
#[derive(Clone)]
pub struct Harness {
    store: String,
    base: Url,
    factory: BackendFactory,
    flavor: Flavor,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("store", &self.store)
            .field("base", &url::redact(&self.base))
            .finish()
    }
}

impl Harness {
    /// A harness for the store at `base` (its path, if any, is the parent of
    /// every case's namespace; its query options are kept).
    pub fn new<F, Fut>(store: &str, base: Url, factory: F) -> Harness
    where
        F: Fn(Url) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = quorumlock_core::Result<Arc<dyn Backend>>> + Send + 'static,
    {
        Harness {
            store: store.to_string(),
            base,
            factory: Arc::new(move |u| Box::pin(factory(u))),
            flavor: Flavor::Mutex,
        }
    }

    /// The same store, with the mutex cases run on `flavor`.
    pub fn with_flavor(mut self, flavor: Flavor) -> Self {
        self.flavor = flavor;
        self
    }

    /// The same store with the URL option `key` set to `value` (replacing
    /// any value the environment gave), e.g. a long TTL for request counts.
    pub fn with_option(mut self, key: &str, value: &str) -> Self {
        let pairs: Vec<(String, String)> = self
            .base
            .query_pairs()
            .filter(|(k, _)| k != key)
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        self.base
            .query_pairs_mut()
            .clear()
            .extend_pairs(pairs)
            .append_pair(key, value);
        self
    }

    /// Which lock the mutex cases use.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// A harness for the URL in the environment variable `var`. Unset:
    /// a loud skip (`None`), or a panic when `QUORUMLOCK_TEST_REQUIRE=1`.
    pub fn from_env<F, Fut>(var: &str, factory: F) -> Option<Harness>
    where
        F: Fn(Url) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = quorumlock_core::Result<Arc<dyn Backend>>> + Send + 'static,
    {
        let Some(raw) = std::env::var(var).ok().filter(|v| !v.is_empty()) else {
            if require() {
                panic!("{var} is not set and QUORUMLOCK_TEST_REQUIRE=1: this test needs its store (run scripts/test.sh)");
            }
            eprintln!("SKIPPED: {var} is not set; start the stores with scripts/stores.sh up");
            return None;
        };
        let base = url::parse(&raw).unwrap_or_else(|e| panic!("{var}: {e}"));
        Some(Harness::new(var, base, factory))
    }

    /// The name of the store under test (the environment variable).
    pub fn store(&self) -> &str {
        &self.store
    }

    /// A new case with a fresh random namespace.
    pub fn case(&self) -> Case {
        let ns = format!("qlt-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        Case {
            harness: self.clone(),
            namespace: ns,
            clients: Mutex::new(Vec::new()),
        }
    }

    /// The base URL with `namespace` appended to its path.
    pub fn url_for(&self, namespace: &str) -> Url {
        let mut u = self.base.clone();
        let path = format!("{}/{}", u.path().trim_end_matches('/'), namespace);
        u.set_path(&path);
        u
    }

    /// A backend for `namespace`, as a new process would make it.
    pub async fn backend(&self, namespace: &str) -> Arc<dyn Backend> {
        let u = self.url_for(namespace);
        (self.factory)(u.clone())
            .await
            .unwrap_or_else(|e| panic!("connecting to {}: {e}", url::redact(&u)))
    }

    /// Whether the backend declares every capability `case` needs; if not,
    /// says so on stderr (a loud skip: the suite runs every case on every
    /// backend, and the backend's [`Capabilities`] decide), or panics when
    /// `QUORUMLOCK_TEST_REQUIRE=1`.
    pub async fn supports(&self, case: &str, needs: &[Needs]) -> bool {
        if needs.is_empty() {
            return true;
        }
        let caps = self.backend("capabilities").await.capabilities();
        let missing: Vec<&Needs> = needs.iter().filter(|n| !n.met_by(&caps)).collect();
        if !missing.is_empty() {
            // A skipped case must not count as passed where skipping is
            // forbidden: every backend in CI declares every capability.
            if require() {
                panic!(
                    "{case} needs {missing:?}, which {} lacks, and QUORUMLOCK_TEST_REQUIRE=1",
                    self.store
                );
            }
            eprintln!(
                "SKIPPED: {case} needs {missing:?}, which {} lacks",
                self.store
            );
        }
        missing.is_empty()
    }
}

/// A capability a case needs, checked against the backend's
/// [`Capabilities`] when the case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// [`Capabilities::rwlock`].
    RwLock,
    /// [`Capabilities::semaphore`].
    Semaphore,
    /// [`Capabilities::kill_session`].
    KillSession,
    /// [`Capabilities::changes`].
    Changes,
}

impl Needs {
    fn met_by(self, caps: &Capabilities) -> bool {
        match self {
            Needs::RwLock => caps.rwlock,
            Needs::Semaphore => caps.semaphore,
            Needs::KillSession => caps.kill_session,
            Needs::Changes => caps.changes,
        }
    }
}

/// Whether skipping is forbidden (`QUORUMLOCK_TEST_REQUIRE=1`).
pub fn require() -> bool {
    std::env::var("QUORUMLOCK_TEST_REQUIRE").is_ok_and(|v| v == "1")
}

/// One case: a fresh namespace and the clients made in it, checked for
/// leftovers at the end.
pub struct Case {
    harness: Harness,
    namespace: String,
    clients: Mutex<Vec<LockClient>>,
}

impl Case {
    /// The case's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The harness.
    pub fn harness(&self) -> &Harness {
        &self.harness
    }

    /// A new client (its own backend and session), like another process.
    pub async fn client(&self) -> LockClient {
        let c = LockClient::new(self.harness.backend(&self.namespace).await);
        self.clients.lock().unwrap().push(c.clone());
        c
    }

    /// A new client with `options` (its own backend and session).
    pub async fn client_with(&self, options: quorumlock_core::ClientOptions) -> LockClient {
        let c = LockClient::with_options(self.harness.backend(&self.namespace).await, options);
        self.clients.lock().unwrap().push(c.clone());
        c
    }

    /// `n` new clients.
    pub async fn clients(&self, n: usize) -> Vec<LockClient> {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.client().await);
        }
        v
    }

    /// Ends the case: waits for every client's background cleanup, closes
    /// them, and asserts that nothing of ours is left on the store (no
    /// entries under the namespace, no sessions still open).
    pub async fn finish(self) {
        let clients = std::mem::take(&mut *self.clients.lock().unwrap());
        for c in &clients {
            tokio::time::timeout(Duration::from_secs(30), c.wait_idle())
                .await
                .expect("background cleanup did not finish within 30 s");
            c.close().await;
        }
        let mut left = Vec::new();
        for c in &clients {
            left.extend(c.backend().leftovers().await.expect("listing leftovers"));
        }
        // A fresh client sees the namespace from outside.
        let probe = self.harness.backend(&self.namespace).await;
        left.extend(probe.leftovers().await.expect("listing leftovers"));
        left.sort();
        left.dedup();
        assert!(
            left.is_empty(),
            "leak check in namespace {}: left on the store: {left:?}",
            self.namespace
        );
    }
}
