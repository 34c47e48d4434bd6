//! The fault explorer: a random workload under a random fault schedule,
//! both drawn from one seed, checked afterwards over the recorded history.
//!
//! Where the scenarios replay a list of faults, the explorer searches:
//! several clients, each with several tasks that acquire, try, time out,
//! release, drop a future at a random await, read, write and take permits
//! on a few names; and a nemesis that delays, blackholes, cuts and resets
//! each client's link, breaks locks, asks holders to let go and kills
//! sessions. The checker then asks of the history:
//! - no two holds of one name overlap (readers may share; at most N
//!   permit holders), where a hold lasts from the acquire's return to the
//!   release's start, the guard's `lost()`, or a forced break or session
//!   kill of it (until the store tells the holder, only fencing protects);
//! - a hold that began after another of the same name ended has a larger
//!   token;
//! - the fenced register of each name accepted no stale write;
//! - once the faults stop, every task finishes its calls within their
//!   bounds (no hang), and after the clients close nothing of ours is left.
//!
//! A failing run panics with its seed; `QUORUMLOCK_EXPLORE_SEED=<seed>`
//! replays that schedule (the choices, not the exact timing).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::{ErrorKind, LockClient, LockGuard};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::cancel::poll_times;
use super::{Cluster, FaultTarget, FencedRegister, NetControl, NetMode, OneShot, Row};

/// The mutex names of a schedule.
const MUTEXES: [&str; 2] = ["m0", "m1"];
/// The read-write lock of a schedule.
const RWLOCK: &str = "rw";
/// The semaphore of a schedule and its permits.
const SEMAPHORE: (&str, u32) = ("sem", 2);

/// What one hold was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Exclusive,
    Read,
    Permit(u32),
}

#[derive(Debug, Clone)]
struct Hold {
    name: &'static str,
    client: usize,
    kind: Held,
    token: u64,
    /// When the acquire was called.
    started: Instant,
    /// When it returned the guard.
    acquired: Instant,
    ended: Option<Instant>,
    /// A break or session kill hit it while its acquire was in flight:
    /// the store may have granted it before the fault and answered after
    /// it, so it is not a belief the checker can hold against the lock
    /// (its writes are still checked by the fenced register).
    forced: bool,
}

/// Whom a forced fault hit.
#[derive(Debug, Clone, Copy)]
enum Forced {
    /// `break_lock` of a name.
    Name(&'static str),
    /// `kill_session` of a client's session.
    Client(usize),
}

/// The recorded history of a schedule.
#[derive(Debug, Default)]
struct Log {
    holds: Mutex<Vec<Hold>>,
    forced: Mutex<Vec<(Instant, Forced)>>,
}

impl Log {
    fn begin(
        &self,
        name: &'static str,
        client: usize,
        kind: Held,
        token: u64,
        started: Instant,
    ) -> usize {
        let mut h = self.holds.lock().unwrap();
        h.push(Hold {
            name,
            client,
            kind,
            token,
            started,
            acquired: Instant::now(),
            ended: None,
            forced: false,
        });
        h.len() - 1
    }

    /// The earliest end wins.
    fn end(&self, id: usize, at: Instant) {
        let mut h = self.holds.lock().unwrap();
        let hold = &mut h[id];
        if hold.ended.is_none_or(|t| at < t) {
            hold.ended = Some(at);
        }
    }

    /// Records a break or a session kill at `at`: the holder cannot know
    /// before the store tells it, so its belief is cut there.
    fn force(&self, at: Instant, whom: Forced) {
        self.forced.lock().unwrap().push((at, whom));
    }

    /// The holds with every forced fault applied: a hold that the fault
    /// found held ends at it; one whose acquire was in flight is marked
    /// `forced` and ends where it began.
    fn settled(&self, now: Instant) -> Vec<Hold> {
        let forced = self.forced.lock().unwrap().clone();
        let mut holds = self.holds.lock().unwrap().clone();
        for h in &mut holds {
            let end = h.ended.unwrap_or(now);
            for (at, whom) in &forced {
                let hits = match whom {
                    Forced::Name(n) => *n == h.name,
                    Forced::Client(c) => *c == h.client,
                };
                if !hits || *at < h.started || *at >= end {
                    continue;
                }
                if *at < h.acquired {
                    h.forced = true;
                    h.ended = Some(h.acquired);
                } else if h.ended.is_none_or(|t| *at < t) {
                    h.ended = Some(*at);
                }
            }
        }
        holds
    }
}

/// What the faults of a schedule were, by kind.
#[derive(Debug, Default, Clone)]
pub struct FaultCounts {
    /// Link delays.
    pub delay: u64,
    /// Link blackholes (partitions).
    pub blackhole: u64,
    /// Links cut (connections closed, new ones refused).
    pub cut: u64,
    /// Connections reset.
    pub reset: u64,
    /// Locks broken by the admin.
    pub breaks: u64,
    /// Revokes asked for.
    pub revokes: u64,
    /// Sessions killed.
    pub kills: u64,
    /// Futures dropped at a random await.
    pub drops: u64,
    /// One answer lost after the store applied its request.
    pub lost_answers: u64,
    /// One request lost before it reached the store.
    pub lost_requests: u64,
    /// One request or one answer held back.
    pub delayed_messages: u64,
    /// Cluster faults: a leader or follower killed, the cluster paused.
    pub cluster: u64,
}

/// The outcome of one schedule.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The seed that replays it.
    pub seed: u64,
    /// Operations completed by the workload.
    pub ops: u64,
    /// Holds recorded.
    pub holds: usize,
    /// Faults injected, by kind.
    pub faults: FaultCounts,
    /// What the checker found (empty: none).
    pub violations: Vec<String>,
}

/// The size of a schedule.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Clients, each behind its own faulty link.
    pub clients: usize,
    /// Tasks per client.
    pub tasks: usize,
    /// How long the workload and the nemesis run.
    pub run_for: Duration,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            clients: 3,
            tasks: 2,
            run_for: Duration::from_secs(6),
        }
    }
}

struct Shared {
    log: Log,
    registers: HashMap<&'static str, FencedRegister>,
    stop: AtomicBool,
    ops: AtomicU64,
    drops: AtomicU64,
    errors: Mutex<Vec<String>>,
}

/// Runs one schedule from `seed` against `t`.
pub async fn explore(t: &FaultTarget, seed: u64, shape: Shape) -> Outcome {
    let ns = format!("qle-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let admin = t.client(&ns).await;
    let ttl = admin.backend().capabilities().session_ttl;
    let mut clients = Vec::new();
    let mut nets: Vec<Arc<dyn NetControl>> = Vec::new();
    for _ in 0..shape.clients {
        let (backend, net) = t.faulty_backend(&ns).await;
        clients.push(LockClient::new(backend));
        nets.push(net);
    }
    let mut names: Vec<&'static str> = MUTEXES.to_vec();
    names.extend([RWLOCK, SEMAPHORE.0]);
    let shared = Arc::new(Shared {
        log: Log::default(),
        registers: names.iter().map(|n| (*n, FencedRegister::new())).collect(),
        stop: AtomicBool::new(false),
        ops: AtomicU64::new(0),
        drops: AtomicU64::new(0),
        errors: Mutex::new(Vec::new()),
    });

    let mut tasks = Vec::new();
    for (ci, c) in clients.iter().enumerate() {
        for ti in 0..shape.tasks {
            let rng = StdRng::seed_from_u64(
                seed ^ ((ci * 16 + ti + 1) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            );
            tasks.push(tokio::spawn(worker(
                c.clone(),
                ci,
                rng,
                shared.clone(),
                ttl,
            )));
        }
    }
    let faults = nemesis(
        StdRng::seed_from_u64(seed),
        &admin,
        &clients,
        &nets,
        &shared,
        shape.run_for,
        ttl,
    )
    .await;
    shared.stop.store(true, Ordering::SeqCst);
    for n in &nets {
        n.set_mode(NetMode::Pass);
    }

    let mut violations = Vec::new();
    // Every call has a bound: a timed acquire its timeout, a release the
    // TTL. Past them plus the TTL to recover a session, a task hangs.
    let bound = MAX_WAIT + ttl * 3 + Duration::from_secs(5);
    for task in tasks {
        match tokio::time::timeout(bound, task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => violations.push(format!("a task panicked: {e}")),
            Err(_) => violations.push(format!(
                "a task hung for {bound:?} after the faults stopped"
            )),
        }
    }
    for c in &clients {
        if tokio::time::timeout(bound, c.wait_idle()).await.is_err() {
            violations.push("background cleanup hung after the faults stopped".into());
        }
    }
    violations.extend(shared.errors.lock().unwrap().drain(..));
    violations.extend(check(&shared));
    // Every lock is free now that every task is done: a fresh client
    // takes each within the time a dead session needs to go (an entry
    // nobody owns on a live session would block it for good).
    let fresh = t.client(&ns).await;
    for name in names.iter().copied() {
        let wait = ttl * 3 + Duration::from_secs(5);
        let got = match name {
            RWLOCK => match fresh.rwlock(name) {
                Ok(rw) => rw.write_timeout(wait).await,
                Err(e) => Err(e),
            },
            n if n == SEMAPHORE.0 => match fresh.semaphore(name, SEMAPHORE.1) {
                Ok(s) => s.acquire_timeout(wait).await,
                Err(e) => Err(e),
            },
            _ => match fresh.lock(name) {
                Ok(l) => l.acquire_timeout(wait).await,
                Err(e) => Err(e),
            },
        };
        match got {
            Ok(g) => {
                let _ = g.release().await;
            }
            Err(e) => violations.push(format!("{name} not takeable after the workload ended: {e}")),
        }
    }
    fresh.close().await;

    for c in clients.iter().chain([&admin]) {
        c.close().await;
    }
    // What a lost session held goes with it, at the latest after its TTL.
    let probe = t.backend(&ns).await;
    let give_up = Instant::now() + ttl * 3 + Duration::from_secs(5);
    loop {
        let left = probe
            .leftovers()
            .await
            .unwrap_or_else(|e| vec![format!("(listing failed: {e})")]);
        if left.is_empty() {
            break;
        }
        if Instant::now() > give_up {
            violations.push(format!(
                "left on the store after every client closed: {left:?}"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut faults = faults;
    faults.drops = shared.drops.load(Ordering::Relaxed);
    let holds = shared.log.holds.lock().unwrap().len();
    Outcome {
        seed,
        ops: shared.ops.load(Ordering::Relaxed),
        holds,
        faults,
        violations,
    }
}

/// The longest an operation of the workload waits for a lock.
const MAX_WAIT: Duration = Duration::from_millis(1500);

async fn worker(c: LockClient, ci: usize, mut rng: StdRng, sh: Arc<Shared>, ttl: Duration) {
    while !sh.stop.load(Ordering::SeqCst) {
        let wait = Duration::from_millis(rng.gen_range(20..=MAX_WAIT.as_millis() as u64));
        let choice = rng.gen_range(0..100);
        let (name, kind): (&'static str, Held) = match choice {
            0..=49 => (MUTEXES[rng.gen_range(0..MUTEXES.len())], Held::Exclusive),
            50..=64 => (RWLOCK, Held::Read),
            65..=79 => (RWLOCK, Held::Exclusive),
            _ => (SEMAPHORE.0, Held::Permit(SEMAPHORE.1)),
        };
        let how = rng.gen_range(0..10);
        let started = Instant::now();
        let acquire = async {
            match (name, kind) {
                (RWLOCK, Held::Read) => c.rwlock(name)?.read_timeout(wait).await,
                (RWLOCK, _) => c.rwlock(name)?.write_timeout(wait).await,
                (_, Held::Permit(n)) => c.semaphore(name, n)?.acquire_timeout(wait).await,
                _ if how == 0 => c.lock(name)?.try_acquire().await,
                _ => c.lock(name)?.acquire_timeout(wait).await,
            }
        };
        let got = if how == 1 {
            // Dropped after a random number of polls.
            let k = rng.gen_range(1..8);
            let mut fut = Box::pin(acquire);
            let out = poll_times(fut.as_mut(), k).await;
            drop(fut);
            match out {
                Some(r) => r,
                None => {
                    sh.drops.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
        } else {
            let start = Instant::now();
            let r = acquire.await;
            let took = start.elapsed();
            if took > wait + Duration::from_millis(250) && how != 0 {
                sh.errors.lock().unwrap().push(format!(
                    "client {ci}: a timed acquire of {name} for {wait:?} returned after {took:?}"
                ));
            }
            r
        };
        let g = match got {
            Ok(g) => g,
            Err(e) => {
                let expected = matches!(
                    e.kind(),
                    ErrorKind::Timeout
                        | ErrorKind::WouldBlock
                        | ErrorKind::SessionLost
                        | ErrorKind::Connection
                );
                if !expected {
                    sh.errors.lock().unwrap().push(format!(
                        "client {ci}: acquire of {name}: unexpected error: {e}"
                    ));
                }
                sh.ops.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        sh.ops.fetch_add(1, Ordering::Relaxed);
        hold(g, name, ci, kind, started, &mut rng, &sh, ttl).await;
    }
}

/// Holds `g` for a while, writing to the fenced register, then lets go by
/// release or drop.
#[allow(clippy::too_many_arguments)]
async fn hold(
    g: LockGuard,
    name: &'static str,
    ci: usize,
    kind: Held,
    started: Instant,
    rng: &mut StdRng,
    sh: &Arc<Shared>,
    ttl: Duration,
) {
    let id = sh.log.begin(name, ci, kind, g.token(), started);
    let lost = g.lost();
    let watcher = {
        let sh = sh.clone();
        tokio::spawn(async move {
            lost.await;
            sh.log.end(id, Instant::now());
        })
    };
    let write = |sh: &Shared, g: &LockGuard| {
        if kind == Held::Exclusive && g.is_held() {
            let _ = sh.registers[name].write(&format!("c{ci}"), g.token());
        }
    };
    write(sh, &g);
    let dwell =
        Duration::from_millis(rng.gen_range(0..=(ttl.as_millis() as u64 / 4).clamp(1, 300)));
    tokio::time::sleep(dwell).await;
    write(sh, &g);
    sh.log.end(id, Instant::now());
    // `is_held()` says false from the local deadline on, whatever the
    // reason the loss was later reported with and however late the task
    // that fires `lost()` ran (on a loaded machine the store's own expiry
    // can be heard first): a deadline already passed ended the belief.
    if let Some(d) = g.deadline().filter(|d| *d <= Instant::now()) {
        sh.log.end(id, d);
    }
    watcher.abort();
    if rng.gen_bool(0.5) {
        let _ = g.release().await;
    } else {
        drop(g);
    }
}

async fn nemesis(
    mut rng: StdRng,
    admin: &LockClient,
    clients: &[LockClient],
    nets: &[Arc<dyn NetControl>],
    sh: &Arc<Shared>,
    run_for: Duration,
    ttl: Duration,
) -> FaultCounts {
    let mut n = FaultCounts::default();
    let end = Instant::now() + run_for;
    let mut all: Vec<&'static str> = MUTEXES.to_vec();
    all.extend([RWLOCK, SEMAPHORE.0]);
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(50..400))).await;
        let ci = rng.gen_range(0..nets.len());
        let net = &nets[ci];
        let length =
            Duration::from_millis(rng.gen_range(50..=(ttl.as_millis() as u64 * 3 / 2).max(100)));
        match rng.gen_range(0..130) {
            100..=114 => {
                if net.arm(OneShot::LoseAnswer) {
                    n.lost_answers += 1;
                }
            }
            115..=121 => {
                if net.arm(OneShot::LoseRequest) {
                    n.lost_requests += 1;
                }
            }
            122..=129 => {
                let d =
                    Duration::from_millis(rng.gen_range(50..=(ttl.as_millis() as u64).max(100)));
                let fault = if rng.gen_bool(0.5) {
                    OneShot::DelayAnswer(d)
                } else {
                    OneShot::DelayRequest(d)
                };
                if net.arm(fault) {
                    n.delayed_messages += 1;
                }
            }
            0..=19 => {
                n.delay += 1;
                net.set_mode(NetMode::Delay(Duration::from_millis(rng.gen_range(5..200))));
                tokio::time::sleep(length.min(end.saturating_duration_since(Instant::now()))).await;
                net.set_mode(NetMode::Pass);
            }
            20..=39 => {
                n.blackhole += 1;
                net.set_mode(NetMode::Blackhole);
                tokio::time::sleep(length.min(end.saturating_duration_since(Instant::now()))).await;
                net.set_mode(NetMode::Pass);
            }
            40..=49 => {
                n.cut += 1;
                net.set_mode(NetMode::Cut);
                tokio::time::sleep(length.min(Duration::from_millis(500))).await;
                net.set_mode(NetMode::Pass);
            }
            50..=69 => {
                n.reset += 1;
                net.pulse_reset();
            }
            70..=79 => {
                let name = all[rng.gen_range(0..all.len())];
                n.breaks += 1;
                let at = Instant::now();
                if let Ok(true) = admin.break_lock(name).await {
                    sh.log.force(at, Forced::Name(name));
                }
            }
            80..=89 => {
                let name = all[rng.gen_range(0..all.len())];
                n.revokes += 1;
                let _ = admin.request_revoke(name).await;
            }
            _ => {
                if let Some(id) = clients[ci].session_id().await {
                    n.kills += 1;
                    let at = Instant::now();
                    if admin.backend().kill_session(&id).await.is_ok() {
                        sh.log.force(at, Forced::Client(ci));
                    }
                }
            }
        }
    }
    n
}

/// The checker over the recorded history.
fn check(sh: &Shared) -> Vec<String> {
    let now = Instant::now();
    let holds = sh.log.settled(now);
    let mut out = Vec::new();
    let mut by_name: HashMap<&str, Vec<&Hold>> = HashMap::new();
    for h in holds.iter().filter(|h| !h.forced) {
        by_name.entry(h.name).or_default().push(h);
    }
    for (name, mut hs) in by_name {
        hs.sort_by_key(|h| h.acquired);
        let end = |h: &Hold| h.ended.unwrap_or(now);
        for (i, a) in hs.iter().enumerate() {
            for b in &hs[i + 1..] {
                if b.acquired >= end(a) {
                    continue;
                }
                match (a.kind, b.kind) {
                    (Held::Read, Held::Read) | (Held::Permit(_), Held::Permit(_)) => {}
                    _ => out.push(format!(
                        "{name}: two holders at once: client {} ({:?}, token {}) and client {} ({:?}, token {}), overlap {:?}",
                        a.client,
                        a.kind,
                        a.token,
                        b.client,
                        b.kind,
                        b.token,
                        end(a).min(end(b)) - b.acquired
                    )),
                }
            }
            // Permit holders at the moment `a` began, `a` included.
            if let Held::Permit(n) = a.kind {
                let at_once = hs[..=i]
                    .iter()
                    .filter(|h| matches!(h.kind, Held::Permit(_)) && a.acquired < end(h))
                    .count();
                if at_once > n as usize {
                    out.push(format!(
                        "{name}: {at_once} permit holders at once, more than {n} (token {} among them)",
                        a.token
                    ));
                }
            }
            // Two shared holds (readers, permits) granted together may
            // return to their clients in either order; any other pair is
            // ordered by the store: the later one waited for the earlier.
            for b in &hs[i + 1..] {
                let shared = |h: &Hold| matches!(h.kind, Held::Read | Held::Permit(_));
                if shared(a) && shared(b) {
                    continue;
                }
                if b.acquired > end(a) && b.token <= a.token {
                    out.push(format!(
                        "{name}: token {} granted after a hold with token {} had ended",
                        b.token, a.token
                    ));
                }
            }
        }
        // A write accepted with a token lower than a hold already begun.
        let reg = &sh.registers[name];
        for w in reg.log().iter().filter(|w| w.accepted) {
            if hs
                .iter()
                .any(|h| h.kind == Held::Exclusive && h.token > w.token && h.acquired <= w.at)
            {
                out.push(format!(
                    "{name}: the register accepted a stale write of token {} by {}",
                    w.token, w.holder
                ));
            }
        }
    }
    out
}

/// The seed `QUORUMLOCK_EXPLORE_SEED` asks to replay, if any.
fn replay_seed() -> Option<u64> {
    std::env::var("QUORUMLOCK_EXPLORE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
}

/// A time-based first seed, different on every run.
fn fresh_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

/// How long the explorer runs schedules: `QUORUMLOCK_EXPLORE_SECONDS`
/// (unset or 0: `QUORUMLOCK_EXPLORE_SEEDS` schedules, default 3).
fn explore_budget() -> Duration {
    std::env::var("QUORUMLOCK_EXPLORE_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .map_or(Duration::ZERO, Duration::from_secs_f64)
}

impl FaultCounts {
    fn add(&mut self, o: &FaultCounts) {
        self.delay += o.delay;
        self.blackhole += o.blackhole;
        self.cut += o.cut;
        self.reset += o.reset;
        self.breaks += o.breaks;
        self.revokes += o.revokes;
        self.kills += o.kills;
        self.drops += o.drops;
        self.lost_answers += o.lost_answers;
        self.lost_requests += o.lost_requests;
        self.delayed_messages += o.delayed_messages;
        self.cluster += o.cluster;
    }

    fn total(&self) -> u64 {
        self.delay
            + self.blackhole
            + self.cut
            + self.reset
            + self.breaks
            + self.revokes
            + self.kills
            + self.drops
            + self.lost_answers
            + self.lost_requests
            + self.delayed_messages
            + self.cluster
    }
}

impl std::fmt::Display for FaultCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "delay {} blackhole {} cut {} reset {} break {} revoke {} kill {} drop {} lost-answer {} lost-request {} delayed-message {} cluster {}",
            self.delay,
            self.blackhole,
            self.cut,
            self.reset,
            self.breaks,
            self.revokes,
            self.kills,
            self.drops,
            self.lost_answers,
            self.lost_requests,
            self.delayed_messages,
            self.cluster
        )
    }
}

/// Schedules run at once on one store (each in its own namespace, with
/// its own clients and links).
const AT_ONCE: usize = 2;

/// Runs schedules of the default [`Shape`], two at a time:
/// the replay seed alone, or for `QUORUMLOCK_EXPLORE_SECONDS`, or
/// `QUORUMLOCK_EXPLORE_SEEDS` of them (default 3, the share of
/// `scripts/test.sh`). Records one row (schedules and faults by kind in
/// its notes) and fails with the seed of every schedule that found a
/// violation.
pub async fn explore_random_schedules(t: &FaultTarget) -> Row {
    let budget = explore_budget();
    let count: u64 = std::env::var("QUORUMLOCK_EXPLORE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let replay = replay_seed();
    let first = replay.unwrap_or_else(fresh_seed);
    let start = Instant::now();
    let mut row = Row::new(t.name(), "explore_random_schedules");
    let mut faults = FaultCounts::default();
    let mut schedules = 0u64;
    let mut next = 0u64;
    loop {
        let batch: Vec<u64> = (0..AT_ONCE as u64)
            .map(|i| first.wrapping_add((next + i).wrapping_mul(7919)))
            .take(if replay.is_some() { 1 } else { AT_ONCE })
            .collect();
        next += batch.len() as u64;
        let outs =
            futures::future::join_all(batch.iter().map(|seed| explore(t, *seed, Shape::default())))
                .await;
        for o in outs {
            schedules += 1;
            tally(t, &mut row, &mut faults, &o);
        }
        let done = replay.is_some()
            || if budget.is_zero() {
                next >= count
            } else {
                start.elapsed() >= budget
            };
        if done {
            break;
        }
    }
    summarize(row, schedules, &faults)
}

/// Adds one schedule's outcome to the row.
fn tally(t: &FaultTarget, row: &mut Row, faults: &mut FaultCounts, o: &Outcome) {
    eprintln!(
        "explorer {}: seed {}: {} ops, {} holds, faults: {}, {} violations",
        t.name(),
        o.seed,
        o.ops,
        o.holds,
        o.faults,
        o.violations.len()
    );
    row.cycles += o.ops;
    faults.add(&o.faults);
    if !o.violations.is_empty() {
        row.violation(format!(
            "seed {} (replay: QUORUMLOCK_EXPLORE_SEED={}): {}",
            o.seed,
            o.seed,
            o.violations.join("; ")
        ));
    }
}

/// Puts the schedules and faults by kind first in the row's notes,
/// records it and asserts that no schedule found a violation.
fn summarize(mut row: Row, schedules: u64, faults: &FaultCounts) -> Row {
    row.faults = faults.total();
    let notes = std::mem::take(&mut row.notes);
    row.note(format!("{schedules} schedules; faults: {faults}"));
    if !notes.is_empty() {
        row.note(notes);
    }
    row.finish()
}

/// What a cluster schedule does to the cluster, early in the schedule.
async fn cluster_fault(cluster: &mut Cluster, seed: u64, ttl: Duration) -> &'static str {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xc1c1_c1c1);
    let recover = Duration::from_secs(60);
    tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1500))).await;
    let Some(leader) = cluster.leader().await else {
        return "no leader to fault";
    };
    let what = match rng.gen_range(0..3) {
        0 => {
            cluster.kill(leader);
            let _ = cluster.wait_leader(recover).await;
            let _ = cluster.restart(leader);
            "leader killed and restarted"
        }
        1 => {
            for i in 0..3 {
                cluster.stop(i);
            }
            tokio::time::sleep(ttl + Duration::from_millis(500)).await;
            for i in 0..3 {
                cluster.cont(i);
            }
            "whole cluster paused past the TTL"
        }
        _ => {
            let follower = (leader + 1) % 3;
            cluster.kill(follower);
            tokio::time::sleep(ttl).await;
            let _ = cluster.restart(follower);
            "a follower killed and restarted"
        }
    };
    if cluster.wait_leader(recover).await.is_err() {
        return "no leader after the fault";
    }
    what
}

/// Explorer schedules on a three-node cluster (`scripts/chaos.sh`): each
/// also kills the leader, pauses the whole cluster past the TTL, or kills
/// a follower, early in the schedule (chosen by the seed), and heals it
/// before the schedule's faults stop. `QUORUMLOCK_EXPLORE_SECONDS` long
/// (default: 2 schedules).
pub async fn explore_on_cluster(t: &FaultTarget, cluster: &mut Cluster) -> Row {
    let ttl = t.backend("qle-probe").await.capabilities().session_ttl;
    let shape = Shape {
        run_for: Duration::from_secs(15).max(ttl * 3),
        ..Shape::default()
    };
    let budget = explore_budget();
    let first = replay_seed().unwrap_or_else(fresh_seed);
    let start = Instant::now();
    let mut row = Row::new(t.name(), "explore_on_cluster");
    let mut faults = FaultCounts::default();
    let mut schedules = 0u64;
    loop {
        let seed = first.wrapping_add(schedules.wrapping_mul(7919));
        let (o, what) = tokio::join!(explore(t, seed, shape), cluster_fault(cluster, seed, ttl));
        eprintln!("explorer {}: seed {seed}: cluster fault: {what}", t.name());
        schedules += 1;
        tally(t, &mut row, &mut faults, &o);
        if what != "no leader to fault" {
            faults.cluster += 1;
        }
        let done = replay_seed().is_some()
            || if budget.is_zero() {
                schedules >= 2
            } else {
                start.elapsed() >= budget
            };
        if done {
            break;
        }
    }
    summarize(row, schedules, &faults)
}
