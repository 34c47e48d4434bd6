//! The fault scenarios. Each takes a [`FaultTarget`], uses a fresh
//! namespace, injects its fault, records a [`Row`], and asserts zero
//! overlaps of believing holders, zero stale writes accepted, zero leaked
//! entries (after the session TTL has run) and its own expectations.
//!
//! Every holder writes its token to one [`FencedRegister`] while it
//! believes it holds the lock, and every hold goes into one [`History`].
//! `QUORUMLOCK_CHAOS_SECONDS` makes each scenario repeat its rounds for
//! that long; unset, each runs one round.
//!
//! One file per topic; the scene and the helpers they share are here.

mod cluster;
mod contention;
mod loss;
mod partition;
mod watch;

pub use cluster::*;
pub use contention::*;
pub use loss::*;
pub use partition::*;
pub use watch::*;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quorumlock_core::backend::KeyWrite;
use quorumlock_core::{ErrorKind, LockClient, LockGuard};
use tokio::sync::oneshot;
use tokio::time::Instant;

pub use super::cancel::{calls_return_within_bounds_on_a_dead_link, cancel_at_every_poll};
pub use super::explorer::{explore_on_cluster, explore_random_schedules};
pub use super::refusal::{late_grant_is_given_back, refused_removal_ends_the_session};
pub use super::unavailable::{connect_checks_the_store, unreachable_store_is_unavailable};
use super::{chaos_budget, FaultTarget, FencedRegister, History, NetControl, NetMode, Row};

/// The lock every scenario contends for.
const LOCK: &str = "fenced";

/// One scenario run: a namespace, its clients and links, the shared
/// history and register, and the row being filled.
struct Scene<'a> {
    target: &'a FaultTarget,
    ns: String,
    admin: LockClient,
    clients: Vec<LockClient>,
    nets: Vec<Arc<dyn NetControl>>,
    history: Arc<History>,
    register: Arc<FencedRegister>,
    row: Row,
    ttl: Duration,
    started: Instant,
    budget: Duration,
}

impl<'a> Scene<'a> {
    async fn new(target: &'a FaultTarget, scenario: &str) -> Scene<'a> {
        crate::support::trace_from_env();
        let ns = format!("qlf-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let admin = target.client(&ns).await;
        let ttl = admin.backend().capabilities().session_ttl;
        Scene {
            target,
            ns,
            clients: vec![admin.clone()],
            admin,
            nets: Vec::new(),
            history: Arc::new(History::new()),
            register: Arc::new(FencedRegister::new()),
            row: Row::new(target.name(), scenario),
            ttl,
            started: Instant::now(),
            budget: chaos_budget(),
        }
    }

    /// A client with a direct link.
    async fn client(&mut self) -> LockClient {
        let target = self.target;
        self.client_of(target).await
    }

    /// A client of `target` (e.g. one member of a cluster) in this
    /// scene's namespace, with a direct link.
    async fn client_of(&mut self, target: &FaultTarget) -> LockClient {
        let c = target.client(&self.ns).await;
        self.clients.push(c.clone());
        c
    }

    /// A client behind a faulty link.
    async fn faulty(&mut self) -> (LockClient, Arc<dyn NetControl>) {
        let (b, net) = self.target.faulty_backend(&self.ns).await;
        let c = LockClient::new(b);
        self.clients.push(c.clone());
        self.nets.push(net.clone());
        (c, net)
    }

    /// Whether to run another round (`round` rounds done so far).
    fn more(&self, round: u64) -> bool {
        round == 0 || self.started.elapsed() < self.budget
    }

    /// A generous bound for anything that must happen within a few TTLs
    /// (Consul may take twice its TTL to expire a session).
    fn soon(&self) -> Duration {
        self.ttl * 3 + Duration::from_secs(30)
    }

    /// How many waiters the store shows.
    async fn waiters(&self) -> usize {
        match self.admin.inspect(LOCK).await {
            Ok(s) => s.waiters.len(),
            Err(_) => usize::MAX,
        }
    }

    async fn until_waiters(&self, n: usize) {
        let soon = self.soon();
        eventually(soon, &format!("{n} waiter(s) to queue"), || async {
            self.waiters().await == n
        })
        .await;
    }

    /// Spawns a holder that acquires, writes, reports, then holds until
    /// told to release.
    fn waiter(&self, c: &LockClient, who: &str, timeout: Duration) -> Waiter {
        self.waiter_retrying(c, who, timeout, None)
    }

    /// As [`waiter`](Self::waiter); with `retries`, a retryable error
    /// (connection trouble, lost session) makes it try again, as an
    /// application would, until `timeout` has run; each retry is counted.
    fn waiter_retrying(
        &self,
        c: &LockClient,
        who: &str,
        timeout: Duration,
        retries: Option<Arc<std::sync::Mutex<Vec<String>>>>,
    ) -> Waiter {
        let (got_tx, got) = oneshot::channel();
        let (release, release_rx) = oneshot::channel::<()>();
        let (c, who) = (c.clone(), who.to_string());
        let (history, register) = (self.history.clone(), self.register.clone());
        let task = tokio::spawn(async move {
            let deadline = Instant::now() + timeout;
            let lock = c.lock(LOCK).unwrap();
            let g = loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match lock.acquire_timeout(left).await {
                    Ok(g) => break g,
                    Err(e) if e.is_retryable() && e.kind() != ErrorKind::Timeout => {
                        match &retries {
                            Some(r) => {
                                r.lock().unwrap().push(e.to_string());
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                            None => return Err(e),
                        }
                    }
                    Err(e) => return Err(e),
                }
            };
            let tr = history.track(&who, &g);
            if g.is_held() {
                let _ = register.write(&who, g.token());
            }
            let _ = got_tx.send(Got {
                token: g.token(),
                acquired: tr.acquired(),
                session: g.session_id(),
            });
            let _ = release_rx.await;
            tr.releasing();
            g.release().await
        });
        Waiter { got, release, task }
    }

    /// Heals every link, waits for cleanup, closes the clients, then
    /// counts what is left on the store once sessions had time to expire;
    /// fills the row from the history and the register, records it and
    /// asserts.
    async fn finish(mut self) -> Row {
        for n in &self.nets {
            n.set_mode(NetMode::Pass);
            self.row.faults += n.faults();
        }
        let soon = self.soon();
        for c in &self.clients {
            if tokio::time::timeout(soon, c.wait_idle()).await.is_err() {
                self.row.violation("background cleanup did not finish");
            }
            let _ = tokio::time::timeout(soon, c.close()).await;
        }
        let probe = self.target.backend(&self.ns).await;
        // A session lost while cut off could not be closed; the store
        // drops it (and its entries) after its TTL, twice that on Consul.
        let deadline = Instant::now() + self.ttl * 2 + Duration::from_secs(5);
        let left = loop {
            let mut left = Vec::new();
            for c in &self.clients {
                match c.backend().leftovers().await {
                    Ok(l) => left.extend(l),
                    Err(e) => left.push(format!("(leftovers failed: {e})")),
                }
            }
            match probe.leftovers().await {
                Ok(l) => left.extend(l),
                Err(e) => left.push(format!("(leftovers failed: {e})")),
            }
            left.sort();
            left.dedup();
            if left.is_empty() || Instant::now() >= deadline {
                break left;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        self.row.leaked = left.len();
        if !left.is_empty() {
            self.row
                .note(format!("left on the store in {}: {left:?}", self.ns));
        }
        let overlaps = self.history.overlaps();
        self.row.overlaps = overlaps.len();
        if let Some(o) = overlaps.first() {
            self.row
                .note(format!("first overlap: {:?} / {:?}", o.first, o.second));
        }
        self.row.stale_accepted =
            self.history.stale_accepted(&self.register) + self.register.regressions();
        self.row.stale_rejected = self.register.rejected();
        self.row.finish()
    }
}

/// What a [`Waiter`] reports once it holds.
#[derive(Debug)]
struct Got {
    token: u64,
    acquired: Instant,
    session: String,
}

struct Waiter {
    got: oneshot::Receiver<Got>,
    release: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<quorumlock_core::Result<()>>,
}

impl Waiter {
    /// Waits until the waiter holds (panics after `within`).
    async fn holds(&mut self, within: Duration, what: &str) -> Got {
        match tokio::time::timeout(within, &mut self.got).await {
            Ok(Ok(g)) => g,
            Ok(Err(_)) => {
                let r = (&mut self.task).await;
                panic!("{what}: the waiter ended without the lock: {r:?}")
            }
            Err(_) => panic!("{what}: the waiter was not granted within {within:?}"),
        }
    }

    /// Tells it to release and waits; `Ok` if it still held at release.
    async fn release(self) -> quorumlock_core::Result<()> {
        let _ = self.release.send(());
        self.task.await.expect("waiter task panicked")
    }
}

async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < within, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn acquire(c: &LockClient, within: Duration) -> LockGuard {
    c.lock(LOCK)
        .unwrap()
        .acquire_timeout(within)
        .await
        .unwrap_or_else(|e| panic!("acquiring {LOCK}: {e}"))
}

/// Waits for the loss future; the time it fired.
async fn lost_at(g: &LockGuard, within: Duration, what: &str) -> Instant {
    tokio::time::timeout(within, g.lost())
        .await
        .unwrap_or_else(|_| panic!("{what}: the loss future did not fire within {within:?}"));
    Instant::now()
}

/// One careful cycle: acquire, write while held, release.
async fn cycle(
    c: &LockClient,
    who: &str,
    history: &Arc<History>,
    register: &FencedRegister,
    hold: Duration,
    within: Duration,
) -> quorumlock_core::Result<()> {
    let g = c.lock(LOCK)?.acquire_timeout(within).await?;
    let tr = history.track(who, &g);
    if g.is_held() {
        let _ = register.write(who, g.token());
    }
    tokio::time::sleep(hold).await;
    if g.is_held() {
        let _ = register.write(who, g.token());
    }
    tr.releasing();
    match g.release().await {
        Err(e) if e.kind() == ErrorKind::LockLost => Ok(()),
        r => r,
    }
}

fn rand_below(n: u64) -> u64 {
    if n == 0 {
        0
    } else {
        rand::random::<u64>() % n
    }
}
