//! The fault scenarios. Each takes a [`FaultTarget`], uses a fresh
//! namespace, injects its fault, records a [`Row`], and asserts zero
//! overlaps of believing holders, zero stale writes accepted, zero leaked
//! entries (after the session TTL has run) and its own expectations.
//!
//! Every holder writes its token to one [`FencedRegister`] while it
//! believes it holds the lock, and every hold goes into one [`History`].
//! `QUORUMLOCK_CHAOS_SECONDS` makes each scenario repeat its rounds for
//! that long; unset, each runs one round.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockcore::backend::KeyWrite;
use lockcore::{ErrorKind, LockClient, LockGuard};
use tokio::sync::oneshot;
use tokio::time::Instant;

pub use super::cancel::{calls_return_within_bounds_on_a_dead_link, cancel_at_every_poll};
pub use super::explorer::{explore_on_cluster, explore_random_schedules};
pub use super::unavailable::unreachable_store_is_unavailable;
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
        let c = self.target.client(&self.ns).await;
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
    task: tokio::task::JoinHandle<lockcore::Result<()>>,
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
    async fn release(self) -> lockcore::Result<()> {
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
) -> lockcore::Result<()> {
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

/// Several clients, two owners each, contend with no fault.
pub async fn contention_no_fault(t: &FaultTarget) -> Row {
    let mut s = Scene::new(t, "contention_no_fault").await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(s.client().await);
    }
    let cycles = Arc::new(AtomicU64::new(0));
    let mut round = 0;
    while s.more(round) {
        let mut tasks = Vec::new();
        for (ci, c) in clients.iter().enumerate() {
            for k in 0..2 {
                let (c, h, r, n) = (
                    c.clone(),
                    s.history.clone(),
                    s.register.clone(),
                    cycles.clone(),
                );
                let within = s.soon();
                tasks.push(tokio::spawn(async move {
                    for _ in 0..4 {
                        cycle(
                            &c,
                            &format!("c{ci}.{k}"),
                            &h,
                            &r,
                            Duration::from_millis(2),
                            within,
                        )
                        .await
                        .expect("a cycle without faults failed");
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
        }
        for task in tasks {
            task.await.expect("contender panicked");
        }
        round += 1;
    }
    s.row.cycles = cycles.load(Ordering::Relaxed);
    s.finish().await
}

#[derive(Clone, Copy)]
enum Blow {
    KillSession,
    BreakLock,
}

/// The holder loses its lock from the store's side while a waiter
/// queues: its loss fires, the waiter gets a larger token, and the old
/// holder's late write is rejected.
async fn holder_loses(t: &FaultTarget, scenario: &str, blow: Blow) -> Row {
    let mut s = Scene::new(t, scenario).await;
    if matches!(blow, Blow::KillSession) && !s.admin.backend().capabilities().kill_session {
        s.row.note("skipped: the backend cannot kill sessions");
        return s.finish().await;
    }
    let (a, b) = (s.client().await, s.client().await);
    let mut round = 0;
    while s.more(round) {
        let ga = acquire(&a, s.soon()).await;
        let tra = s.history.track("a", &ga);
        s.register
            .write("a", ga.token())
            .expect("first write of a holder");
        let mut wb = s.waiter(&b, "b", s.soon());
        s.until_waiters(1).await;
        let fault_at = Instant::now();
        match blow {
            Blow::KillSession => s
                .admin
                .backend()
                .kill_session(&ga.session_id())
                .await
                .expect("kill session"),
            Blow::BreakLock => assert!(
                s.admin.break_lock(LOCK).await.expect("break"),
                "nothing to break"
            ),
        }
        // The store took the lock at `fault_at`; the holder learns it
        // only from the store (a watch, a failed keepalive), so a waiter
        // granted at once may overlap the notification: that window is
        // what fencing is for, and its length is the loss delay.
        tra.forced(fault_at);
        s.row.faults += 1;
        let lost = lost_at(&ga, s.soon(), scenario).await;
        s.row.loss_delay(lost - fault_at);
        assert!(!ga.is_held());
        let got = wb.holds(s.soon(), scenario).await;
        assert!(
            got.token > ga.token(),
            "token {} after {}",
            got.token,
            ga.token()
        );
        // The old holder, not looking at its guard, writes late.
        if s.register.write("a", ga.token()).is_ok() {
            s.row.violation("the old holder's late write was accepted");
        }
        tra.releasing();
        match ga.release().await {
            Err(e) if e.kind() == ErrorKind::LockLost => {}
            r => s
                .row
                .violation(format!("release after loss gave {r:?}, not LockLost")),
        }
        wb.release().await.expect("the new holder's release");
        s.row.cycles += 2;
        round += 1;
    }
    s.finish().await
}

/// The store ends the holder's session (`Backend::kill_session`).
pub async fn holder_session_killed(t: &FaultTarget) -> Row {
    holder_loses(t, "holder_session_killed", Blow::KillSession).await
}

/// An operator deletes the holder's entry (`Backend::break_lock`).
pub async fn operator_breaks_lock(t: &FaultTarget) -> Row {
    holder_loses(t, "operator_breaks_lock", Blow::BreakLock).await
}

/// The holder is partitioned (blackhole): its loss future must fire
/// before the waiter is granted.
pub async fn partitioned_holder(t: &FaultTarget) -> Row {
    let mut s = Scene::new(t, "partitioned_holder").await;
    let (a, net) = s.faulty().await;
    let b = s.client().await;
    let mut round = 0;
    while s.more(round) {
        let ga = acquire(&a, s.soon()).await;
        let tra = s.history.track("a", &ga);
        s.register.write("a", ga.token()).expect("first write");
        let mut wb = s.waiter(&b, "b", s.soon());
        s.until_waiters(1).await;
        let cut = Instant::now();
        net.set_mode(NetMode::Blackhole);
        let lost = lost_at(&ga, s.soon(), "partitioned holder").await;
        s.row.loss_delay(lost - cut);
        let got = wb.holds(s.soon(), "waiter after the partition").await;
        let recorded = tra.lost_at().unwrap_or(lost);
        if recorded > got.acquired {
            s.row.violation(format!(
                "the waiter was granted {:?} before the partitioned holder's loss fired",
                recorded - got.acquired
            ));
        }
        net.set_mode(NetMode::Pass);
        if s.register.write("a", ga.token()).is_ok() {
            s.row
                .violation("the partitioned holder's late write was accepted");
        }
        tra.releasing();
        let _ = ga.release().await;
        wb.release().await.expect("release");
        s.row.cycles += 2;
        round += 1;
    }
    s.finish().await
}

/// A waiter is partitioned while queued: it is never granted while cut
/// off, its dead entry does not block others, and after the heal it gets
/// the lock on a new session.
pub async fn partitioned_waiter(t: &FaultTarget) -> Row {
    let mut s = Scene::new(t, "partitioned_waiter").await;
    let a = s.client().await;
    let (b, net) = s.faulty().await;
    let c = s.client().await;
    let mut round = 0;
    while s.more(round) {
        let ga = acquire(&a, s.soon()).await;
        let tra = s.history.track("a", &ga);
        s.register.write("a", ga.token()).expect("first write");
        let retries = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut wb = s.waiter_retrying(&b, "b", s.soon() * 3, Some(retries.clone()));
        s.until_waiters(1).await;
        net.set_mode(NetMode::Blackhole);
        // Long enough for the store to expire the waiter's session.
        tokio::time::sleep(s.ttl * 2 + s.ttl / 2).await;
        if !ga.is_held() {
            s.row
                .violation("the holder lost the lock while only a waiter was cut off");
        }
        let _ = s.register.write("a", ga.token());
        tra.releasing();
        ga.release().await.expect("release of a");
        // The cut-off waiter must not block others.
        let gc = acquire(&c, s.soon()).await;
        let trc = s.history.track("c", &gc);
        let _ = s.register.write("c", gc.token());
        trc.releasing();
        gc.release().await.expect("release of c");
        if wb.task.is_finished() {
            s.row.violation("the cut-off waiter finished while cut off");
        }
        let heal = Instant::now();
        net.set_mode(NetMode::Pass);
        let got = wb.holds(s.soon(), "waiter after the heal").await;
        if got.acquired < heal {
            s.row.violation("the waiter was granted while cut off");
        }
        wb.release().await.expect("release of b");
        let retries = std::mem::take(&mut *retries.lock().unwrap());
        if let Some(last) = retries.last() {
            s.row.note(format!(
                "the cut-off waiter retried {} time(s), last: {last}",
                retries.len()
            ));
        }
        s.row.cycles += 3;
        round += 1;
    }
    s.finish().await
}

/// The holder's process pauses longer than the TTL (its keepalives stop
/// and it does not look at its guard), a second holder appears and
/// writes, then the first resumes and writes with its old token: every
/// such write is rejected by the fenced register.
///
/// The pause is simulated by a blackholed link and a task that does not
/// look at its guard; the runtime keeps running, so the loss future
/// still fires on time and the history shows no overlap. A real
/// SIGSTOP would freeze the loss signal too: then only the fencing token
/// keeps the resource safe, which is what this scenario asserts.
pub async fn paused_holder_fenced(t: &FaultTarget) -> Row {
    let mut s = Scene::new(t, "paused_holder_fenced").await;
    let (a, net) = s.faulty().await;
    let b = s.client().await;
    let mut round = 0;
    while s.more(round) {
        let ga = acquire(&a, s.soon()).await;
        let tra = s.history.track("a", &ga);
        s.register.write("a", ga.token()).expect("first write");
        let mut wb = s.waiter(&b, "b", s.soon());
        s.until_waiters(1).await;
        let pause = Instant::now();
        net.set_mode(NetMode::Blackhole);
        let got = wb.holds(s.soon(), "second holder during the pause").await;
        net.set_mode(NetMode::Pass);
        let before = s.register.rejected_of("a");
        for _ in 0..3 {
            if s.register.write("a", ga.token()).is_ok() {
                s.row
                    .violation("a stale write of the paused holder was accepted");
            }
        }
        let rejected = s.register.rejected_of("a") - before;
        if rejected != 3 {
            s.row
                .violation(format!("{rejected} of 3 stale writes rejected"));
        }
        // The store fences its own keys: the paused holder's write there
        // is refused, while the same write without a fence goes through
        // (so the fence refused it, not the link).
        let key = crate::fenced::scratch_key(a.backend().as_ref(), &s.ns, &format!("p{round}"));
        match ga.fenced_put(key.as_str(), b"stale".to_vec()).await {
            Err(e) if e.kind() == ErrorKind::LockLost => {}
            other => s.row.violation(format!(
                "the paused holder's fenced store write was not refused: {other:?}"
            )),
        }
        let unfenced = KeyWrite::Put {
            key: key.clone(),
            value: b"unfenced".to_vec(),
        };
        a.backend()
            .write_key(&unfenced)
            .await
            .expect("the paused holder's unfenced write");
        crate::fenced::remove_scratch(&s.admin, &key).await;
        if got.token <= ga.token() {
            s.row
                .violation(format!("token {} after {}", got.token, ga.token()));
        }
        if let Some(l) = tra.lost_at() {
            s.row.loss_delay(l - pause);
        }
        tra.releasing();
        let _ = ga.release().await;
        wb.release().await.expect("release of b");
        s.row.cycles += 2;
        round += 1;
    }
    s.finish().await
}

/// Connections reset at random moments while clients acquire: never two
/// entries of one session, never two holders, nothing left behind.
pub async fn reset_during_acquire(t: &FaultTarget) -> Row {
    let mut s = Scene::new(t, "reset_during_acquire").await;
    let mut clients = Vec::new();
    let mut nets = Vec::new();
    for _ in 0..2 {
        let (c, n) = s.faulty().await;
        clients.push(c);
        nets.push(n);
    }
    clients.push(s.client().await);
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let run_for = s.budget.max(Duration::from_secs(3));
    let mut tasks = Vec::new();
    for (ci, c) in clients.iter().enumerate() {
        for k in 0..2 {
            let (c, h, r) = (c.clone(), s.history.clone(), s.register.clone());
            let (stop, cycles, errors) = (stop.clone(), cycles.clone(), errors.clone());
            let within = s.soon();
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match cycle(
                        &c,
                        &format!("c{ci}.{k}"),
                        &h,
                        &r,
                        Duration::from_millis(3),
                        within,
                    )
                    .await
                    {
                        Ok(()) => cycles.fetch_add(1, Ordering::Relaxed),
                        Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            }));
        }
    }
    let injector = {
        let (nets, stop) = (nets.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(5 + rand_below(60))).await;
                nets[rand_below(nets.len() as u64) as usize].pulse_reset();
            }
        })
    };
    // Watch the store for duplicates while the faults run.
    let started = Instant::now();
    let mut dup_seen = Vec::new();
    let mut holders_seen = 0;
    while started.elapsed() < run_for {
        if let Ok(st) = s.admin.inspect(LOCK).await {
            holders_seen = holders_seen.max(st.holders.len());
            let mut sessions: Vec<&str> = st
                .holders
                .iter()
                .chain(st.waiters.iter())
                .map(|c| c.session.as_str())
                .collect();
            sessions.sort();
            if sessions.windows(2).any(|w| w[0] == w[1]) && dup_seen.len() < 3 {
                dup_seen.push(format!("{st:?}"));
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    injector.await.expect("injector panicked");
    for task in tasks {
        task.await.expect("contender panicked");
    }
    for d in dup_seen {
        s.row.violation(format!("two entries of one session: {d}"));
    }
    if holders_seen > 1 {
        s.row
            .violation(format!("{holders_seen} holders of a mutex at once"));
    }
    s.row.cycles = cycles.load(Ordering::Relaxed);
    s.row.note(format!(
        "{} acquire attempts failed",
        errors.load(Ordering::Relaxed)
    ));
    if s.row.cycles == 0 {
        s.row.violation("no cycle completed under resets");
    }
    s.finish().await
}

/// A queued waiter's session is killed: it is never granted on that
/// session while the holder holds; it gets the lock later on a new one.
pub async fn waiter_session_killed_while_queued(t: &FaultTarget) -> Row {
    let mut s = Scene::new(t, "waiter_session_killed_while_queued").await;
    if !s.admin.backend().capabilities().kill_session {
        s.row.note("skipped: the backend cannot kill sessions");
        return s.finish().await;
    }
    let (a, b) = (s.client().await, s.client().await);
    let mut round = 0;
    while s.more(round) {
        let ga = acquire(&a, s.soon()).await;
        let tra = s.history.track("a", &ga);
        s.register.write("a", ga.token()).expect("first write");
        let mut wb = s.waiter(&b, "b", s.soon() * 2);
        s.until_waiters(1).await;
        let killed = b.session_id().await.expect("the waiter has a session");
        s.admin
            .backend()
            .kill_session(&killed)
            .await
            .expect("kill the waiter's session");
        s.row.faults += 1;
        // The holder keeps holding for a while; the waiter must not be
        // granted meanwhile.
        tokio::time::sleep(s.ttl).await;
        if wb.task.is_finished() {
            s.row.violation("the waiter ended while the lock was held");
        }
        if !ga.is_held() {
            s.row
                .violation("the holder lost the lock when a waiter's session was killed");
        }
        if let Ok(st) = s.admin.inspect(LOCK).await {
            if st
                .waiters
                .iter()
                .chain(st.holders.iter())
                .any(|c| c.session == killed)
            {
                s.row.violation(format!(
                    "an entry of the killed session is still queued: {st:?}"
                ));
            }
        }
        let _ = s.register.write("a", ga.token());
        tra.releasing();
        ga.release().await.expect("release of a");
        let got = wb.holds(s.soon(), "waiter after the holder released").await;
        if got.session == killed {
            s.row.violation("granted on the killed session");
        }
        wb.release().await.expect("release of b");
        s.row.cycles += 2;
        round += 1;
    }
    s.finish().await
}

/// Acquire futures dropped at random moments under contention; some
/// guards dropped instead of released. Nothing may be left behind.
pub async fn cancelled_acquires_under_contention(t: &FaultTarget) -> Row {
    let mut s = Scene::new(t, "cancelled_acquires_under_contention").await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(s.client().await);
    }
    let cycles = Arc::new(AtomicU64::new(0));
    let cancels = Arc::new(AtomicU64::new(0));
    let mut round = 0;
    while s.more(round) {
        let mut tasks = Vec::new();
        for (ci, c) in clients.iter().enumerate() {
            for k in 0..3 {
                let (c, h, r) = (c.clone(), s.history.clone(), s.register.clone());
                let (cycles, cancels) = (cycles.clone(), cancels.clone());
                tasks.push(tokio::spawn(async move {
                    let who = format!("c{ci}.{k}");
                    let lock = c.lock(LOCK).unwrap();
                    for _ in 0..15 {
                        let patience = Duration::from_millis(rand_below(40));
                        match tokio::time::timeout(patience, lock.acquire()).await {
                            Err(_) => {
                                cancels.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(Err(e)) => panic!("acquire failed: {e}"),
                            Ok(Ok(g)) => {
                                let tr = h.track(&who, &g);
                                if g.is_held() {
                                    let _ = r.write(&who, g.token());
                                }
                                tokio::time::sleep(Duration::from_millis(1 + rand_below(4))).await;
                                tr.releasing();
                                if rand_below(3) == 0 {
                                    drop(g);
                                } else {
                                    let _ = g.release().await;
                                }
                                cycles.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }));
            }
        }
        for task in tasks {
            task.await.expect("contender panicked");
        }
        round += 1;
    }
    for c in &clients {
        tokio::time::timeout(s.soon(), c.wait_idle())
            .await
            .expect("cleanup stuck");
    }
    // The lock is free again: no phantom holder or waiter.
    match s.admin.inspect(LOCK).await {
        Ok(st) if st.is_free() => {}
        other => s
            .row
            .violation(format!("lock not free after the cancellations: {other:?}")),
    }
    s.row.cycles = cycles.load(Ordering::Relaxed);
    s.row.faults = cancels.load(Ordering::Relaxed);
    s.finish().await
}

/// Keepalives delayed (a tenth of the TTL) or briefly lost (gaps of a
/// fifth of the TTL) are tolerated; lost for longer than the TTL, the
/// loss fires before anyone else acquires.
pub async fn keepalive_delay_then_failure(t: &FaultTarget) -> Row {
    let mut s = Scene::new(t, "keepalive_delay_then_failure").await;
    let (a, net) = s.faulty().await;
    let b = s.client().await;
    let mut round = 0;
    while s.more(round) {
        let ga = acquire(&a, s.soon()).await;
        let tra = s.history.track("a", &ga);
        s.register.write("a", ga.token()).expect("first write");
        // Tolerated: latency.
        net.set_mode(NetMode::Delay(s.ttl / 10));
        tokio::time::sleep(s.ttl * 2).await;
        net.set_mode(NetMode::Pass);
        if !ga.is_held() {
            s.row.violation(format!(
                "lost under a keepalive delay of TTL/10: {:?}",
                ga.loss()
            ));
        }
        // Tolerated: short gaps.
        for _ in 0..3 {
            net.set_mode(NetMode::Blackhole);
            tokio::time::sleep(s.ttl / 5).await;
            net.set_mode(NetMode::Pass);
            tokio::time::sleep(s.ttl / 2).await;
        }
        if !ga.is_held() {
            s.row.violation(format!(
                "lost under keepalive gaps of TTL/5: {:?}",
                ga.loss()
            ));
        }
        if ga.is_held() {
            s.register.write("a", ga.token()).expect("write while held");
        }
        // Not tolerated: a gap longer than the TTL.
        let mut wb = s.waiter(&b, "b", s.soon());
        s.until_waiters(1).await;
        let cut = Instant::now();
        net.set_mode(NetMode::Blackhole);
        let lost = lost_at(&ga, s.soon(), "keepalives lost").await;
        s.row.loss_delay(lost - cut);
        let got = wb
            .holds(s.soon(), "waiter after the keepalive failure")
            .await;
        if tra.lost_at().unwrap_or(lost) > got.acquired {
            s.row
                .violation("the waiter was granted before the holder's loss fired");
        }
        net.set_mode(NetMode::Pass);
        if s.register.write("a", ga.token()).is_ok() {
            s.row.violation("a late write was accepted");
        }
        tra.releasing();
        let _ = ga.release().await;
        wb.release().await.expect("release of b");
        s.row.cycles += 2;
        round += 1;
    }
    s.finish().await
}

// ---------------------------------------------------------------- clusters

use super::Cluster;

/// The leader of a three-node cluster is killed (-9) while a holder holds
/// and two waiters queue, then restarted. The holder either keeps its
/// lock or is told it lost it; the waiters are served afterwards; no
/// overlap, nothing left behind.
pub async fn leader_killed_while_held(t: &FaultTarget, cluster: &mut Cluster) -> Row {
    let mut s = Scene::new(t, "leader_killed_while_held").await;
    let (a, b, c) = (s.client().await, s.client().await, s.client().await);
    let ga = acquire(&a, s.soon()).await;
    let tra = s.history.track("a", &ga);
    s.register.write("a", ga.token()).expect("first write");
    let retries = Arc::new(std::sync::Mutex::new(Vec::new()));
    let wb = s.waiter_retrying(&b, "b", s.soon() * 3, Some(retries.clone()));
    s.until_waiters(1).await;
    let wc = s.waiter_retrying(&c, "c", s.soon() * 3, Some(retries.clone()));
    s.until_waiters(2).await;
    let leader = cluster.leader().await.expect("a leader");
    let kill_at = Instant::now();
    cluster.kill(leader);
    s.row.faults += 1;
    let new_leader = cluster
        .wait_leader(Duration::from_secs(60))
        .await
        .expect("a new leader");
    s.row.note(format!(
        "leader n{leader} killed, n{new_leader} elected in {:?}",
        kill_at.elapsed()
    ));
    tokio::time::sleep(s.ttl).await;
    if ga.is_held() {
        if s.register.write("a", ga.token()).is_err() {
            s.row
                .violation("the holder's write was rejected while it still held");
        }
        s.row.note("the holder kept its lock");
    } else {
        s.row
            .note(format!("the holder lost its lock: {:?}", ga.loss()));
        if let Some(l) = tra.lost_at() {
            s.row.loss_delay(l - kill_at);
        }
    }
    cluster.restart(leader).expect("restart the old leader");
    cluster
        .wait_leader(Duration::from_secs(60))
        .await
        .expect("a leader after the restart");
    tra.releasing();
    let _ = ga.release().await;
    // Both waiters may have lost their sessions in the election and
    // queued again in either order: serve whichever is granted first.
    let (mut wb, mut wc) = (wb, wc);
    let limit = s.soon() * 3;
    let (b_first, got) = tokio::select! {
        g = wb.holds(limit, "waiter b after the leader change") => (true, g),
        g = wc.holds(limit, "waiter c after the leader change") => (false, g),
    };
    let (first, mut second, second_who) = if b_first {
        (wb, wc, "c")
    } else {
        (wc, wb, "b")
    };
    let mut order = vec![got.token];
    first.release().await.ok();
    let got = second
        .holds(
            limit,
            &format!("waiter {second_who} after the leader change"),
        )
        .await;
    order.push(got.token);
    second.release().await.ok();
    if order.windows(2).any(|w| w[0] >= w[1]) {
        s.row
            .violation(format!("waiter tokens not increasing: {order:?}"));
    }
    let r = std::mem::take(&mut *retries.lock().unwrap());
    if !r.is_empty() {
        s.row.note(format!("waiters retried {} time(s)", r.len()));
    }
    s.row.cycles = 3;
    s.finish().await
}

/// Every node of the cluster is stopped (SIGSTOP) for longer than the
/// TTL while held: the holder's loss fires from its local deadline; once
/// the nodes continue, the waiter is granted after that loss and the old
/// holder's late write is rejected.
pub async fn cluster_paused_while_held(t: &FaultTarget, cluster: &mut Cluster) -> Row {
    cluster_down_while_held(t, cluster, false).await
}

/// Every node is killed (-9) while held, and restarted after longer than
/// the TTL: as [`cluster_paused_while_held`].
pub async fn cluster_restarted_while_held(t: &FaultTarget, cluster: &mut Cluster) -> Row {
    cluster_down_while_held(t, cluster, true).await
}

async fn cluster_down_while_held(t: &FaultTarget, cluster: &mut Cluster, kill: bool) -> Row {
    let name = if kill {
        "cluster_restarted_while_held"
    } else {
        "cluster_paused_while_held"
    };
    let mut s = Scene::new(t, name).await;
    let (a, b) = (s.client().await, s.client().await);
    let ga = acquire(&a, s.soon()).await;
    let tra = s.history.track("a", &ga);
    s.register.write("a", ga.token()).expect("first write");
    let retries = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut wb = s.waiter_retrying(&b, "b", s.soon() * 4, Some(retries.clone()));
    s.until_waiters(1).await;
    let down = Instant::now();
    for i in 0..3 {
        if kill {
            cluster.kill(i);
        } else {
            cluster.stop(i);
        }
    }
    s.row.faults += 3;
    let lost = tokio::time::timeout(s.ttl * 2 + Duration::from_secs(10), ga.lost()).await;
    let lost_at_local = Instant::now();
    for i in 0..3 {
        if kill {
            cluster.restart(i).expect("restart");
        } else {
            cluster.cont(i);
        }
    }
    match lost {
        Ok(_) => s.row.loss_delay(lost_at_local - down),
        Err(_) => s
            .row
            .violation("no loss signalled while the whole cluster was down"),
    }
    cluster
        .wait_leader(Duration::from_secs(90))
        .await
        .expect("a leader again");
    let got = wb
        .holds(s.soon() * 4, "waiter after the cluster came back")
        .await;
    if got.token <= ga.token() {
        s.row
            .violation(format!("token {} after {}", got.token, ga.token()));
    }
    if s.register.write("a", ga.token()).is_ok() {
        s.row.violation("the old holder's late write was accepted");
    }
    tra.releasing();
    let _ = ga.release().await;
    wb.release().await.ok();
    let r = std::mem::take(&mut *retries.lock().unwrap());
    if let Some(last) = r.last() {
        s.row.note(format!(
            "the waiter retried {} time(s), last: {last}",
            r.len()
        ));
    }
    s.row.cycles = 2;
    s.finish().await
}
