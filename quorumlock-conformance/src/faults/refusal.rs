//! A store that refuses removals: every release and abandon of one client
//! answers with an error that is not retryable, as a Redis server stuck in
//! a long script (`BUSY`) or refusing writes (`MISCONF`) does, or as an ACL
//! changed under a running client does. The real store keeps the entry;
//! the client must not report the removal as done, and must not leave the
//! entry renewed by a live session.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use quorumlock_core::backend::{
    AcquireRequest, Acquired, Backend, Capabilities, HeldEntry, KeyWrite, SessionLiveness,
    StoreSession,
};
use quorumlock_core::{Error, ErrorKind, LockClient, LockName, LockState, Result};

use super::cancel::{finish, SETTLE};
use super::{FaultTarget, Row};

/// The switch of one client's refusals, and how many it made.
#[derive(Debug, Default)]
pub(super) struct Refusals {
    on: AtomicBool,
    made: AtomicU64,
    /// Milliseconds a grant's answer is held in the acquire's own poll
    /// (the thread blocks): the grant reaches the caller after its
    /// deadline, with no await in between for a timer to fire at.
    stall_grant_ms: AtomicU64,
}

impl Refusals {
    /// Starts (`true`) or stops refusing removals.
    pub(super) fn set(&self, on: bool) {
        self.on.store(on, Ordering::SeqCst);
    }

    /// A backend over `inner` whose sessions refuse removals while the
    /// returned switch is on.
    pub(super) fn wrap(inner: Arc<dyn Backend>) -> (Arc<dyn Backend>, Arc<Refusals>) {
        let refusals = Arc::new(Refusals::default());
        let backend = Arc::new(RefusingBackend {
            inner,
            refusals: refusals.clone(),
        });
        (backend, refusals)
    }

    fn check(&self, what: &str) -> Result<()> {
        if !self.on.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.made.fetch_add(1, Ordering::SeqCst);
        Err(Error::new(
            ErrorKind::Store,
            format!("{what} refused (injected: the store answers BUSY)"),
        ))
    }
}

/// A real store's backend whose sessions refuse removals while switched on.
struct RefusingBackend {
    inner: Arc<dyn Backend>,
    refusals: Arc<Refusals>,
}

impl fmt::Debug for RefusingBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RefusingBackend")
            .field("inner", &self.inner.describe())
            .finish()
    }
}

#[derive(Debug)]
struct RefusingSession {
    inner: Arc<dyn StoreSession>,
    refusals: Arc<Refusals>,
}

#[async_trait]
impl Backend for RefusingBackend {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn changes(&self, name: &LockName) -> Option<quorumlock_core::backend::ChangeFeed> {
        self.inner.changes(name)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn open_session(&self, l: Arc<SessionLiveness>) -> Result<Arc<dyn StoreSession>> {
        Ok(Arc::new(RefusingSession {
            inner: self.inner.open_session(l).await?,
            refusals: self.refusals.clone(),
        }))
    }
    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        self.inner.inspect(name).await
    }
    async fn break_lock(&self, name: &LockName) -> Result<bool> {
        self.inner.break_lock(name).await
    }
    async fn request_revoke(&self, name: &LockName) -> Result<bool> {
        self.inner.request_revoke(name).await
    }
    async fn kill_session(&self, session: &str) -> Result<()> {
        self.inner.kill_session(session).await
    }
    async fn leftovers(&self) -> Result<Vec<String>> {
        self.inner.leftovers().await
    }
    fn requests_sent(&self) -> u64 {
        self.inner.requests_sent()
    }
    async fn fenced_write(&self, held: &[HeldEntry], write: &KeyWrite) -> Result<()> {
        self.inner.fenced_write(held, write).await
    }
    async fn read_key(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.inner.read_key(key).await
    }
    async fn list(&self, prefix: Option<&LockName>) -> Result<Vec<LockState>> {
        self.inner.list(prefix).await
    }
    async fn write_key(&self, write: &KeyWrite) -> Result<()> {
        self.inner.write_key(write).await
    }
}

#[async_trait]
impl StoreSession for RefusingSession {
    fn id(&self) -> String {
        self.inner.id()
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired> {
        let acquired = self.inner.acquire(req).await?;
        let stall = self.refusals.stall_grant_ms.load(Ordering::SeqCst);
        if stall > 0 {
            std::thread::sleep(Duration::from_millis(stall));
        }
        Ok(acquired)
    }
    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()> {
        self.refusals.check("release")?;
        self.inner.release(req, held).await
    }
    async fn set_value(&self, req: &AcquireRequest, held: &Acquired, value: &[u8]) -> Result<()> {
        self.inner.set_value(req, held, value).await
    }
    async fn abandon(&self, req: &AcquireRequest) -> Result<()> {
        self.refusals.check("abandon")?;
        self.inner.abandon(req).await
    }
    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}

/// A release and an abandon that the store keeps refusing: `release()`
/// returns an error (never `Ok` with the entry left behind), the client
/// ends its session so that the store drops both entries, its other lock
/// reports the loss, and another client takes every lock at once (well
/// within one TTL: nothing waits for an expiry). The client works again
/// with a new session once the store accepts removals.
pub async fn refused_removal_ends_the_session(t: &FaultTarget) -> Row {
    let ns = format!("qlr-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut row = Row::new(t.name(), "refused_removal_ends_the_session");
    let admin = t.client(&ns).await;
    let ttl = admin.backend().capabilities().session_ttl;
    let (backend, refusals) = Refusals::wrap(t.backend(&ns).await);
    let refusing = LockClient::new(backend);

    // The release.
    let g = refusing.lock("r").unwrap().acquire().await.expect("r");
    let other = refusing.lock("o").unwrap().acquire().await.expect("o");
    refusals.set(true);
    row.faults += 1;
    let r = g.release().await;
    assert!(
        r.is_err(),
        "release() returned Ok on {} although the store refused every removal",
        t.name()
    );
    assert!(refusals.made.load(Ordering::SeqCst) > 0);
    tokio::time::timeout(SETTLE, other.lost())
        .await
        .expect("the session's other lock did not report the loss");
    // Ended, not expired: another client takes both at once.
    for name in ["r", "o"] {
        let g = admin
            .lock(name)
            .unwrap()
            .acquire_timeout(ttl / 2)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{name} after a refused release on {}: {e} (its entry is still on the store)",
                    t.name()
                )
            });
        g.release().await.unwrap();
        row.cycles += 1;
    }
    drop(other);
    tokio::time::timeout(SETTLE, refusing.wait_idle())
        .await
        .expect("cleanup stuck");

    // The abandon of a timed-out waiter.
    refusals.set(false);
    let blocker = admin.lock("w").unwrap().acquire().await.expect("w");
    refusals.set(true);
    let r = refusing
        .lock("w")
        .unwrap()
        .acquire_timeout(Duration::from_millis(300))
        .await;
    assert_eq!(
        r.map(drop).unwrap_err().kind(),
        ErrorKind::Timeout,
        "a waiter behind a held lock"
    );
    tokio::time::timeout(SETTLE, refusing.wait_idle())
        .await
        .expect("the refused abandon did not finish");
    blocker.release().await.unwrap();
    // The waiter's entry went with its session: nobody was granted the
    // lock behind the blocker.
    let g = admin
        .lock("w")
        .unwrap()
        .acquire_timeout(ttl / 2)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "w after a refused abandon on {}: {e} (the waiter's entry is still on the store)",
                t.name()
            )
        });
    g.release().await.unwrap();
    row.cycles += 1;

    // Removals accepted again: the client works on a new session.
    refusals.set(false);
    let g = refusing.lock("r").unwrap().acquire().await.expect("again");
    g.release().await.expect("a release the store accepts");
    finish(t, &ns, &[&refusing, &admin], row).await
}

/// A grant that reaches the caller after the acquire's deadline (the
/// store granted in time, the answer came late) is given back: the call
/// returns `Timeout`, never a guard after its deadline, and another
/// client takes the lock at once.
pub async fn late_grant_is_given_back(t: &FaultTarget) -> Row {
    let ns = format!("qlg-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut row = Row::new(t.name(), "late_grant_is_given_back");
    let admin = t.client(&ns).await;
    let ttl = admin.backend().capabilities().session_ttl;
    let (backend, switch) = Refusals::wrap(t.backend(&ns).await);
    let late = LockClient::new(backend);
    // The session first, so that the stall hits the grant alone.
    crate::support::open_session(&late).await;

    switch.stall_grant_ms.store(400, Ordering::SeqCst);
    row.faults += 1;
    let timeout = Duration::from_millis(100);
    let start = tokio::time::Instant::now();
    let r = late.lock("lg").unwrap().acquire_timeout(timeout).await;
    let took = start.elapsed();
    switch.stall_grant_ms.store(0, Ordering::SeqCst);
    match r {
        Err(e) => assert_eq!(e.kind(), ErrorKind::Timeout, "{e}"),
        Ok(g) => panic!(
            "acquire_timeout({timeout:?}) handed out a guard after {took:?}, past its deadline, on {}: {g:?}",
            t.name()
        ),
    }
    let g = admin
        .lock("lg")
        .unwrap()
        .acquire_timeout(ttl / 2)
        .await
        .unwrap_or_else(|e| panic!("the late grant was not given back on {}: {e}", t.name()));
    g.release().await.unwrap();
    row.cycles += 1;
    let g = late
        .lock("lg")
        .unwrap()
        .acquire_timeout(SETTLE)
        .await
        .unwrap();
    g.release().await.unwrap();
    finish(t, &ns, &[&late, &admin], row).await
}
