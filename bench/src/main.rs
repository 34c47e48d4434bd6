//! quorumlock's benchmark program.
//!
//! ```sh
//! cargo run --release -p quorumlock-bench --bin bench -- --url etcd://127.0.0.1:2379/bench
//! ```
//!
//! Everything is measured against the same running store in one run, so the
//! ratios (our cycle over the store's floor) are what to read; absolute
//! figures depend on the machine.

mod alloc;
mod floor;
mod processes;
mod recipe;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::stream::{self, StreamExt};
use quorumlock::{LockClient, LockGuard};
use serde_json::{json, Value};

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

/// Histograms in microseconds.
pub type Histogram = hdrhistogram::Histogram<u64>;

/// Cycles run and thrown away before timing.
pub const WARMUP: usize = 20;

pub fn histogram() -> Histogram {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")
}

#[derive(Parser, Debug)]
#[command(about = "Measures quorumlock against the store's own floor")]
struct Args {
    /// Store URL (its path is used as the namespace root of the run).
    #[arg(long, env = "QUORUMLOCK_URL", default_value = "mem://bench")]
    url: String,
    /// Timed cycles for the floor and the uncontended cycle.
    #[arg(long, default_value_t = 500)]
    cycles: usize,
    /// Waiter counts for the handoff measurement.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 4, 16, 64])]
    waiters: Vec<usize>,
    /// Handoffs timed per waiter count (and for the handoff floor): with
    /// 3,000, a p99 is the 30th-largest gap, so one pause of the server
    /// (a JVM collection, a log roll) moves it less than at 1,000.
    #[arg(long, default_value_t = 3000)]
    handoffs: usize,
    /// Locks held at once by one client for the scale measurement.
    #[arg(long, default_value_t = 10_000)]
    scale_locks: usize,
    /// A smaller count measured the same way first (0: none).
    #[arg(long, default_value_t = 1_000)]
    scale_small: usize,
    /// Client counts (each its own session) for the contended measurement.
    #[arg(long, value_delimiter = ',', default_values_t = [8, 32])]
    contended: Vec<usize>,
    /// Seconds each contended measurement runs.
    #[arg(long, default_value_t = 3.0)]
    contended_secs: f64,
    /// Party counts for the store's own lock recipe done raw (the floor
    /// of the handoff and contention lines), each run for
    /// `--contended-secs`.
    #[arg(long, value_delimiter = ',', default_values_t = [4, 8, 16, 32, 64])]
    recipe: Vec<usize>,
    /// Run only these parts (comma-separated: cycle, handoff, contended,
    /// processes, recipe, scale, loss); all when empty.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Seconds of unmeasured load on the store before anything is timed
    /// (0: none): the floors' cycles and handoffs and ours, over and
    /// over. A store started just before the run serves its first tens
    /// of thousands of requests slower (ZooKeeper's JVM compiles its hot
    /// paths then), and whichever line comes first would pay for it.
    #[arg(long, default_value_t = 20.0)]
    warm_up_secs: f64,
    /// Rounds of the loss-detection measurement.
    #[arg(long, default_value_t = 5)]
    loss_rounds: usize,
    /// Write the JSON report here as well.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Run as one worker process of the `processes` part (on `--url` as it
    /// is, for `--contended-secs`); the bench starts these itself.
    #[arg(long, hide = true)]
    process_worker: bool,
    /// The clients of one worker process.
    #[arg(long, hide = true, default_value_t = 1)]
    process_clients: usize,
}

/// The CPU time this process has used so far in user mode and in the
/// kernel (all threads), from `/proc/self/stat` (Linux; `None`
/// elsewhere). Its difference over a contended run, per handoff, is the
/// client's cost of a handoff, the user part being the client's own
/// code (the kernel's part, its sockets and wake-ups, varies from run to
/// run by a third on this machine). A user cost that grows with the
/// number of clients where the raw recipe's does not is ours to find: a
/// sort of the queue that searched every name at each of its
/// comparisons cost ZooKeeper's clients 116-190 us more user time a
/// handoff at 32 clients than the fix did, found by a profile.
fn process_cpu() -> Option<Cpu> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (which may hold spaces) start
    // at the state (field 3): utime and stime are fields 14 and 15, in
    // ticks of USER_HZ, 100 on Linux.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let mut next = || fields.next()?.parse::<u64>().ok();
    let (user, system) = (next()?, next()?);
    Some(Cpu {
        user: Duration::from_millis(user * 10),
        system: Duration::from_millis(system * 10),
    })
}

/// CPU time in user mode and in the kernel ([`process_cpu`]).
#[derive(Clone, Copy)]
struct Cpu {
    user: Duration,
    system: Duration,
}

impl Cpu {
    /// Microseconds of each per handoff, from `before` to `self`.
    fn per_handoff_since(self, before: Cpu, handoffs: u64) -> Value {
        let us = |now: Duration, then: Duration| {
            now.saturating_sub(then).as_secs_f64() * 1e6 / handoffs.max(1) as f64
        };
        json!({
            "user": us(self.user, before.user),
            "system": us(self.system, before.system),
        })
    }
}

fn summary(h: &Histogram) -> Value {
    let ms = |us: u64| (us as f64) / 1000.0;
    json!({
        "count": h.len(),
        "p50_ms": ms(h.value_at_quantile(0.5)),
        "p99_ms": ms(h.value_at_quantile(0.99)),
        "max_ms": ms(h.max()),
        "mean_ms": h.mean() / 1000.0,
    })
}

/// A fresh namespace under the URL's path, so runs never see each other.
fn url_in(base: &str, ns: &str) -> String {
    let (head, query) = base
        .split_once('?')
        .map_or((base, None), |(h, q)| (h, Some(q)));
    // `mem://` has an empty authority: keep its `//`.
    let head = if head.ends_with("://") {
        head
    } else {
        head.trim_end_matches('/')
    };
    match query {
        Some(q) => format!("{head}/{ns}?{q}"),
        None => format!("{head}/{ns}"),
    }
}

async fn clients(url: &str, n: usize) -> quorumlock::Result<Vec<LockClient>> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(quorumlock::connect(url).await?);
    }
    Ok(v)
}

fn requests(clients: &[LockClient]) -> u64 {
    clients.iter().map(|c| c.backend().requests_sent()).sum()
}

/// Cycles timed back to back before switching between the floors and ours.
const BLOCK: usize = 10;

/// The uncontended cycle (acquire + release on one client) and its
/// floors ([`floor::cycle_floors`]), interleaved in blocks of [`BLOCK`],
/// each block starting one side later than the last, so that a change of
/// the machine's load during the run weighs on all alike: our latencies,
/// each floor's, and where the store reports it
/// ([`floor::Floor::server_busy_us`]) the server's time per cycle of ours
/// and of the first floor, read between blocks.
async fn uncontended(
    url: &str,
    mut floors: Vec<floor::Floor>,
    cycles: usize,
) -> Result<(Histogram, Vec<Histogram>, Option<[f64; 2]>), Box<dyn std::error::Error>> {
    let c = quorumlock::connect(url).await?;
    let lock = c.lock("uncontended")?;
    let mut ours = histogram();
    let mut theirs: Vec<Histogram> = floors.iter().map(|_| histogram()).collect();
    let mut busy = Some([0u64; 2]);
    let sides = floors.len() + 1;
    let mut i = 0;
    let mut block = 0;
    while i < cycles + WARMUP {
        let n = BLOCK.min(cycles + WARMUP - i);
        let record = i >= WARMUP;
        for side in (0..sides).map(|s| (s + block) % sides) {
            // Side 0 is ours, side k the (k-1)th floor; the server's time
            // is read around ours and the first floor's.
            let timed = record && side < 2;
            let before = match floors.first_mut() {
                Some(f) if timed => f.server_busy_us().await?,
                _ => None,
            };
            for _ in 0..n {
                let t = Instant::now();
                if side == 0 {
                    let g = lock.acquire().await?;
                    g.release().await?;
                } else {
                    floors[side - 1].cycle().await?;
                }
                if record {
                    let h = if side == 0 {
                        &mut ours
                    } else {
                        &mut theirs[side - 1]
                    };
                    h.record(t.elapsed().as_micros().max(1) as u64)?;
                }
            }
            if !timed {
                continue;
            }
            let after = match floors.first_mut() {
                Some(f) => f.server_busy_us().await?,
                None => None,
            };
            busy = match (busy, before, after) {
                (Some(mut b), Some(x), Some(y)) => {
                    b[side] += y.saturating_sub(x);
                    Some(b)
                }
                _ => None,
            };
        }
        i += n;
        block += 1;
    }
    c.close().await;
    for f in floors {
        f.close().await;
    }
    let per_cycle = busy.map(|b| b.map(|us| us as f64 / cycles as f64));
    Ok((ours, theirs, per_cycle))
}

/// Load for `secs` before anything is measured, every result thrown
/// away: the uncontended cycle and its floor, the handoff floor, and our
/// handoff with 4 waiters, in turn, in a namespace of its own. Seconds it
/// ran (0 on `mem://`, which has no server to warm).
async fn warm_up(
    url: &str,
    parsed: &quorumlock::url::Url,
    secs: f64,
) -> Result<f64, Box<dyn std::error::Error>> {
    if secs <= 0.0 || parsed.scheme() == "mem" {
        return Ok(0.0);
    }
    let url = url_in(url, "warm-up");
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs {
        uncontended(&url, floor::cycle_floors(parsed).await?, 100).await?;
        floor::handoffs(parsed, 100).await?;
        handoff(&url, 4, 200).await?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// What the contending tasks of a handoff run share: grants counted, and
/// the gap from a release starting to the next grant.
#[derive(Clone)]
struct Handoffs {
    last_release: Arc<Mutex<Option<Instant>>>,
    gaps: Arc<Mutex<Histogram>>,
    granted: Arc<AtomicU64>,
}

impl Handoffs {
    fn new() -> Self {
        Handoffs {
            last_release: Arc::new(Mutex::new(None)),
            gaps: Arc::new(Mutex::new(histogram())),
            granted: Arc::new(AtomicU64::new(0)),
        }
    }

    /// One acquire and release of `lock`, recording the gap since the
    /// previous release started.
    async fn cycle(&self, lock: &quorumlock::Lock) -> quorumlock::Result<()> {
        let g = lock.acquire().await?;
        self.granted();
        self.releasing();
        g.release().await
    }

    /// A grant: counted, and the gap since the last release started.
    fn granted(&self) {
        self.granted.fetch_add(1, Ordering::Relaxed);
        if let Some(t) = self.last_release.lock().unwrap().take() {
            self.gaps
                .lock()
                .unwrap()
                .record(t.elapsed().as_micros().max(1) as u64)
                .expect("in range");
        }
    }

    /// The holder starts its release now.
    fn releasing(&self) {
        *self.last_release.lock().unwrap() = Some(Instant::now());
    }

    fn count(&self) -> u64 {
        self.granted.load(Ordering::Relaxed)
    }

    fn gaps(&self) -> Histogram {
        self.gaps.lock().unwrap().clone()
    }
}

/// `waiters` tasks on up to 16 clients contend for one lock; times the gap
/// from a release starting to the next holder being granted, and counts
/// store requests per handoff.
async fn handoff(url: &str, waiters: usize, handoffs: usize) -> quorumlock::Result<Value> {
    let cs = clients(url, waiters.min(16)).await?;
    // Open every session before counting.
    for c in &cs {
        c.lock("warm")?.acquire().await?.release().await?;
    }
    let rounds = handoffs.div_ceil(waiters).max(2);
    let h = Handoffs::new();
    let before = requests(&cs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..waiters {
        let (c, h) = (cs[w % cs.len()].clone(), h.clone());
        tasks.push(tokio::spawn(async move {
            let lock = c.lock("handoff")?;
            for _ in 0..rounds {
                h.cycle(&lock).await?;
            }
            Ok::<_, quorumlock::Error>(())
        }));
    }
    for t in tasks {
        t.await.expect("task panicked")?;
    }
    let elapsed = start.elapsed();
    let sent = requests(&cs) - before;
    let n = h.count();
    for c in &cs {
        c.close().await;
    }
    let gaps = h.gaps();
    Ok(json!({
        "waiters": waiters,
        "clients": cs.len(),
        "handoffs": n,
        "gap": summary(&gaps),
        "requests_per_handoff": sent as f64 / n as f64,
        "handoffs_per_s": n as f64 / elapsed.as_secs_f64(),
    }))
}

/// `n` clients, each its own session, contend for one lock for `secs`
/// seconds (acquire, release, again): handoffs per second, and the gap
/// from a release starting to the next grant (p50, p99).
async fn contended(url: &str, n: usize, secs: f64) -> quorumlock::Result<Value> {
    let cs = clients(url, n).await?;
    for c in &cs {
        c.lock("warm")?.acquire().await?.release().await?;
    }
    let h = Handoffs::new();
    let before = requests(&cs);
    let cpu = process_cpu();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for c in cs.clone() {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            let lock = c.lock("contended")?;
            while Instant::now() < end {
                h.cycle(&lock).await?;
            }
            Ok::<_, quorumlock::Error>(())
        }));
    }
    for t in tasks {
        t.await.expect("task panicked")?;
    }
    let elapsed = start.elapsed();
    let sent = requests(&cs) - before;
    let got = h.count();
    let cpu = process_cpu()
        .zip(cpu)
        .map(|(now, then)| now.per_handoff_since(then, got));
    for c in &cs {
        c.close().await;
    }
    let gaps = h.gaps();
    Ok(json!({
        "clients": n,
        "handoffs": got,
        "gap": summary(&gaps),
        "requests_per_handoff": sent as f64 / got.max(1) as f64,
        "cpu_us_per_handoff": cpu,
        "handoffs_per_s": got as f64 / elapsed.as_secs_f64(),
    }))
}

/// Acquires (and releases) in flight at once in the scale measurement.
const SCALE_CONCURRENCY: usize = 64;

/// Timed rounds of each burst in the scale measurement: ours and each
/// floor take turns within a round, the first side one later each round,
/// and each figure is the median of its rounds. One burst of 1,000 locks
/// lasts 10-100 ms, and on this machine one burst of the same work took
/// from 0.036 to 0.078 s from one run to the next (the slow ones after
/// seconds of idleness): a single pair of bursts decided the line by
/// which side was lucky.
const SCALE_ROUNDS: usize = 5;

/// Rounds of each contended measurement (see where they run).
const CONTENDED_ROUNDS: usize = 3;

/// Where the clients of a contended measurement run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Contenders {
    InBench,
    EachInAProcess,
    InOneOtherProcess,
}

impl Contenders {
    fn label(self) -> &'static str {
        match self {
            Contenders::InBench => "bench",
            Contenders::EachInAProcess => "processes",
            Contenders::InOneOtherProcess => "one other process",
        }
    }
}

/// Of a measurement's rounds, the one of median handoffs/s, with every
/// round's rate beside it (`handoffs_per_s_rounds`).
fn median_round(mut rounds: Vec<Value>) -> Value {
    let rates: Vec<f64> = rounds
        .iter()
        .map(|r| r["handoffs_per_s"].as_f64().unwrap_or(0.0))
        .collect();
    let mut v = rounds.swap_remove(median_at(&rates));
    v["handoffs_per_s_rounds"] = json!(rates);
    v
}

/// Where in `xs` its median is (the upper of the middle two of an even
/// count; the bench's rounds are odd).
fn median_at(xs: &[f64]) -> usize {
    let mut order: Vec<usize> = (0..xs.len()).collect();
    order.sort_by(|&a, &b| xs[a].total_cmp(&xs[b]));
    order[xs.len() / 2]
}

/// One client holds `count` locks: the requests and keepalive requests
/// per lock and per TTL while they are held (against one lock held),
/// memory per lock. Not timed: [`scale_with_floor`] times the bursts.
async fn scale(url: &str, count: usize) -> quorumlock::Result<Value> {
    let c = quorumlock::connect(url).await?;
    let ttl = c.backend().capabilities().session_ttl;
    let first = c.lock("scale/l0")?.acquire().await?;
    // Counted from a few seconds after the last grant: the backends'
    // watchers catch up with a burst of grants first (Consul's monitor
    // spaces its reads of 10,000 held locks a second apart).
    let idle_requests = |c: LockClient| async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let before = c.backend().requests_sent();
        tokio::time::sleep(ttl).await;
        c.backend().requests_sent() - before
    };
    let with_one = idle_requests(c.clone()).await;
    let mem_before = alloc::live_bytes();
    let sent_before = c.backend().requests_sent();
    let guards = acquire_all(&c, "scale/l", count).await?;
    let acquire_requests = c.backend().requests_sent() - sent_before;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mem_per_lock = (alloc::live_bytes() - mem_before) as f64 / (count - 1) as f64;
    let with_all = idle_requests(c.clone()).await;
    let sessions: std::collections::HashSet<String> =
        guards.iter().map(|g| g.session_id()).collect();
    let sent_before = c.backend().requests_sent();
    release_all(guards).await?;
    let release_requests = c.backend().requests_sent() - sent_before;
    first.release().await?;
    c.close().await;
    Ok(json!({
        "locks": count,
        "sessions": sessions.len(),
        "acquire_requests_per_lock": acquire_requests as f64 / (count - 1) as f64,
        "release_requests_per_lock": release_requests as f64 / (count - 1) as f64,
        "ttl_s": ttl.as_secs_f64(),
        "requests_per_ttl_one_lock": with_one,
        "requests_per_ttl_all_locks": with_all,
        "client_bytes_per_lock": mem_per_lock,
    }))
}

/// Acquires the locks `{prefix}1` to `{prefix}{count - 1}` on `c`,
/// [`SCALE_CONCURRENCY`] in flight.
async fn acquire_all(
    c: &LockClient,
    prefix: &str,
    count: usize,
) -> quorumlock::Result<Vec<LockGuard>> {
    stream::iter(1..count)
        .map(|i| {
            let c = c.clone();
            async move { c.lock(format!("{prefix}{i}"))?.acquire().await }
        })
        .buffer_unordered(SCALE_CONCURRENCY)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// Releases every guard, [`SCALE_CONCURRENCY`] in flight.
async fn release_all(guards: Vec<LockGuard>) -> quorumlock::Result<()> {
    stream::iter(guards)
        .map(|g| g.release())
        .buffer_unordered(SCALE_CONCURRENCY)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// [`scale`], then [`SCALE_ROUNDS`] rounds of bursts of `count - 1`
/// locks, acquired then released, `SCALE_CONCURRENCY` in flight: ours
/// (new lock names each round, on one client that holds one more lock
/// throughout, as in [`scale`]), the same work raw
/// ([`floor::Floor::scale`]), with each lock's loss watch where that is
/// a request of its own ([`floor::Floor::scale_watched`]), and the
/// store's naive lock where it has one. Each figure is the median of its
/// rounds (the rounds beside it, `*_rounds`).
async fn scale_with_floor(
    url: &str,
    parsed: &quorumlock::url::Url,
    count: usize,
) -> Result<Value, Box<dyn std::error::Error>> {
    let mut v = scale(url, count).await?;
    let c = quorumlock::connect(url).await?;
    let first = c.lock("scale/l0")?.acquire().await?;
    // Side by side: ours, the same work, with the loss watch, naive. Each
    // floor on a connection of its own for its burst, as ours has had
    // its session throughout: an etcd floor's lease is never renewed.
    let names = ["", "floor_", "floor_watched_", "floor_naive_"];
    let naive = floor::describe_naive(parsed.scheme()).is_some();
    let mut times: [Vec<(f64, f64)>; 4] = Default::default();
    for round in 0..SCALE_ROUNDS {
        for k in 0..names.len() {
            let side = (k + round) % names.len();
            if side == 0 {
                let t = Instant::now();
                let guards = acquire_all(&c, &format!("scale/r{round}/l"), count).await?;
                let take = t.elapsed().as_secs_f64();
                let t = Instant::now();
                release_all(guards).await?;
                times[0].push((take, t.elapsed().as_secs_f64()));
                continue;
            }
            if side == 3 && !naive {
                continue;
            }
            let Some(mut f) = floor::Floor::connect(parsed).await? else {
                continue;
            };
            let took = match side {
                1 => Some(f.scale(count - 1, SCALE_CONCURRENCY).await?),
                2 => f.scale_watched(count - 1, SCALE_CONCURRENCY).await?,
                _ => {
                    f.work = floor::Work::Naive;
                    Some(f.scale(count - 1, SCALE_CONCURRENCY).await?)
                }
            };
            f.close().await;
            if let Some(t) = took {
                times[side].push(t);
            }
        }
    }
    first.release().await?;
    c.close().await;
    for (name, t) in names.iter().zip(&times) {
        if t.is_empty() {
            continue;
        }
        let take: Vec<f64> = t.iter().map(|x| x.0).collect();
        let give: Vec<f64> = t.iter().map(|x| x.1).collect();
        v[format!("{name}acquire_all_s")] = json!(take[median_at(&take)]);
        v[format!("{name}release_all_s")] = json!(give[median_at(&give)]);
        v[format!("{name}acquire_all_s_rounds")] = json!(take);
        v[format!("{name}release_all_s_rounds")] = json!(give);
    }
    v["rounds"] = json!(SCALE_ROUNDS);
    Ok(v)
}

/// How long the holder has held before the break or kill: past
/// [`quorumlock::backend::HELD_WATCH_DELAY`], as most holds that anyone would break
/// are (a grant younger than that learns of a break up to that much later).
const HELD_BEFORE_LOSS: Duration = Duration::from_millis(100);

/// Time from a forced break and from a session kill to the holder's loss
/// future firing, on a lock held for [`HELD_BEFORE_LOSS`].
async fn loss_detection(url: &str, rounds: usize) -> quorumlock::Result<Value> {
    let cs = clients(url, 2).await?;
    let (holder, operator) = (&cs[0], &cs[1]);
    let mut brk = histogram();
    let mut kill = histogram();
    for i in 0..rounds {
        for (h, how) in [(&mut brk, "break"), (&mut kill, "kill")] {
            let name = format!("loss/{how}{i}");
            let g = holder.lock(&name)?.acquire().await?;
            tokio::time::sleep(HELD_BEFORE_LOSS).await;
            // Timed on its own task: a break call may return after the
            // holder already knows (Consul's break waits out lock-delay).
            let lost = g.lost();
            let seen = tokio::spawn(async move {
                tokio::time::timeout(Duration::from_secs(60), lost)
                    .await
                    .ok()?;
                Some(Instant::now())
            });
            let t = Instant::now();
            if how == "break" {
                operator.break_lock(&name).await?;
            } else {
                operator.backend().kill_session(&g.session_id()).await?;
            }
            let at = seen.await.expect("loss timer panicked").ok_or_else(|| {
                quorumlock::Error::new(quorumlock::ErrorKind::Timeout, "loss not detected in 60 s")
            })?;
            h.record(at.duration_since(t).as_micros().max(1) as u64)
                .expect("in range");
            let _ = g.release().await;
        }
    }
    for c in &cs {
        c.close().await;
    }
    Ok(json!({
        "held_before_ms": HELD_BEFORE_LOSS.as_millis() as u64,
        "break": summary(&brk),
        "session_kill": summary(&kill),
    }))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if args.process_worker {
        // A worker of one client runs on one runtime thread, as a program
        // that holds one lock would: not two per process competing for the
        // host's cores with every other worker's. One of many clients runs
        // on tokio's default runtime, as the bench does.
        let rt = if args.process_clients == 1 {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
        } else {
            tokio::runtime::Runtime::new()?
        };
        let work = processes::worker(&args.url, args.process_clients, args.contended_secs);
        rt.block_on(work)?;
        return Ok(());
    }
    tokio::runtime::Runtime::new()?.block_on(run(args))
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let run = format!("bench-{}", std::process::id());
    let url = url_in(&args.url, &run);
    let parsed = quorumlock::url::parse(&url)?;
    let scheme = parsed.scheme().to_string();
    eprintln!(
        "bench: {} (namespace {run})",
        quorumlock::url::redact(&parsed)
    );

    let runs = |part: &str| args.only.is_empty() || args.only.iter().any(|p| p == part);
    eprintln!("bench: warm-up, {} s", args.warm_up_secs);
    let warmed_up = warm_up(&url, &parsed, args.warm_up_secs).await?;
    let (mut cycle, mut floor, mut ratio, mut naive_floor) = (None, None, None, None);
    let mut naive_ratio = None;
    let mut server_us = None;
    if runs("cycle") {
        eprintln!("bench: uncontended cycle and the floor, interleaved");
        let floors = floor::cycle_floors(&parsed).await?;
        let (c, mut f, busy) = uncontended(&url, floors, args.cycles).await?;
        server_us = busy;
        let over =
            |f: &Histogram| c.value_at_quantile(0.5) as f64 / f.value_at_quantile(0.5) as f64;
        ratio = f.first().map(over);
        naive_ratio = f.get(1).map(over);
        naive_floor = (f.len() > 1).then(|| f.remove(1));
        floor = f.into_iter().next();
        cycle = Some(c);
    }
    let mut handoffs = Vec::new();
    let mut handoff_floor = None;
    let mut handoff_floor_among = Vec::new();
    let mut handoff_floor_queue = Vec::new();
    if runs("handoff") {
        eprintln!("bench: the floor of a handoff");
        handoff_floor = floor::handoffs(&parsed, args.handoffs).await?;
        // As many other listening connections as the handoff's and the
        // contended line's clients have sessions.
        for others in [8, 16, 32]
            .into_iter()
            .filter(|_| matches!(scheme.as_str(), "postgres" | "postgresql"))
        {
            eprintln!("bench: the floor of a handoff among {others} idle listeners");
            if let Some(h) = floor::pg_handoffs_among(&parsed, args.handoffs, others).await? {
                handoff_floor_among.push(json!({"others": others, "gap": summary(&h)}));
            }
        }
        // etcd: the same queue as ours, raw, with handoffs overlapping
        // as the waiters below make them.
        for parties in [4, 16].into_iter().filter(|_| scheme == "etcd") {
            let secs = args.contended_secs;
            eprintln!("bench: the same queue raw, {parties} parties, {secs} s");
            if let Some(q) = recipe::etcd_queue(&parsed, parties, secs).await? {
                handoff_floor_queue.push(q);
            }
        }
        for &w in &args.waiters {
            eprintln!("bench: handoff with {w} waiters");
            handoffs.push(handoff(&url, w, args.handoffs).await?);
        }
    }
    // Rounds: each measurement of every client count once a round, the
    // first one later each round, and of each its round of median rate
    // ([`median_round`]). One run of 3 s each decided whether 32 clients
    // made 0.9 of 8's rate by this machine's run-to-run spread (10-20 %).
    let mut kinds: Vec<Contenders> = Vec::new();
    if runs("contended") {
        kinds.push(Contenders::InBench);
    }
    // A mem:// store lives in its process: workers would not share it.
    if runs("processes") && scheme != "mem" {
        kinds.extend([Contenders::EachInAProcess, Contenders::InOneOtherProcess]);
    }
    let counts = &args.contended;
    let secs = args.contended_secs;
    let mut rounds: Vec<Vec<Value>> = vec![Vec::new(); kinds.len() * counts.len()];
    for round in 0..CONTENDED_ROUNDS {
        for k in 0..rounds.len() {
            let at = (k + round) % rounds.len();
            let (kind, n) = (kinds[at / counts.len()], counts[at % counts.len()]);
            eprintln!(
                "bench: {n} contending clients ({}), {secs} s, round {}",
                kind.label(),
                round + 1
            );
            rounds[at].push(match kind {
                Contenders::InBench => contended(&url, n, secs).await?,
                Contenders::EachInAProcess => processes::contended(&url, n, n, secs).await?,
                Contenders::InOneOtherProcess => processes::contended(&url, n, 1, secs).await?,
            });
        }
    }
    let measured: Vec<Value> = rounds.into_iter().map(median_round).collect();
    let of = |kind: Contenders| -> Vec<Value> {
        match kinds.iter().position(|k| *k == kind) {
            Some(i) => measured[i * counts.len()..(i + 1) * counts.len()].to_vec(),
            None => Vec::new(),
        }
    };
    let contention = of(Contenders::InBench);
    let in_processes = of(Contenders::EachInAProcess);
    let in_one_process = of(Contenders::InOneOtherProcess);
    let mut recipe = Vec::new();
    if runs("recipe") {
        for &n in &args.recipe {
            eprintln!(
                "bench: the store's recipe raw, {n} parties, {} s",
                args.contended_secs
            );
            if let Some(r) = recipe::contended(&parsed, n, args.contended_secs).await? {
                recipe.push(r);
            }
        }
    }
    let (mut scale_small, mut scale) = (Value::Null, Value::Null);
    if runs("scale") {
        for (count, out) in [
            (args.scale_small, &mut scale_small),
            (args.scale_locks, &mut scale),
        ] {
            if count < 2 {
                continue;
            }
            eprintln!("bench: scale ({count} locks)");
            *out = scale_with_floor(&url, &parsed, count).await?;
        }
    }
    let loss = if runs("loss") {
        eprintln!("bench: loss detection");
        loss_detection(&url, args.loss_rounds).await?
    } else {
        Value::Null
    };

    let report = json!({
        "store": quorumlock::url::redact(&parsed),
        "scheme": scheme,
        "warm_up_s": warmed_up,
        "floor_is": floor::describe(&scheme),
        "floor": floor.as_ref().map(summary),
        "cycle": cycle.as_ref().map(summary),
        "cycle_over_floor_p50": ratio,
        "server_us_per_cycle": server_us.map(|[ours, floor]| json!({"ours": ours, "floor": floor})),
        "naive_floor_is": naive_floor.as_ref().and_then(|_| floor::describe_naive(&scheme)),
        "naive_floor": naive_floor.as_ref().map(summary),
        "cycle_over_naive_floor_p50": naive_ratio,
        "handoff_floor_is": floor::describe_handoff(&scheme),
        "handoff_floor": handoff_floor.as_ref().map(summary),
        "handoff_floor_among_listeners": handoff_floor_among,
        "handoff_floor_queue_is": (scheme == "etcd").then_some(
            "the store's recipe as above with ours' second watch when the store moved \
             between the first one's start and the read after it: ours' queue done raw, \
             every party queueing again at once"
        ),
        "handoff_floor_queue": handoff_floor_queue,
        "handoff": handoffs,
        "contended": contention,
        "contended_processes": in_processes,
        "contended_one_process": in_one_process,
        "recipe_is": recipe::describe(&scheme),
        "recipe": recipe,
        "scale_small": scale_small,
        "scale": scale,
        "loss_detection": loss,
    });
    print_markdown(&report);
    let text = serde_json::to_string_pretty(&report)?;
    if let Some(path) = &args.json {
        std::fs::write(path, &text)?;
    }
    println!("\n```json\n{text}\n```");
    Ok(())
}

fn print_markdown(r: &Value) {
    let f = |v: &Value| v.as_f64().map_or("—".to_string(), |x| format!("{x:.3}"));
    println!("### {}\n", r["store"].as_str().unwrap_or("?"));
    println!(
        "After {} s of unmeasured load (the floors' cycles and handoffs, and ours).\n",
        f(&r["warm_up_s"])
    );
    println!("| measure | p50 ms | p99 ms | note |");
    println!("|---|---|---|---|");
    println!(
        "| floor: {} | {} | {} | |",
        r["floor_is"].as_str().unwrap_or(""),
        f(&r["floor"]["p50_ms"]),
        f(&r["floor"]["p99_ms"])
    );
    if let Some(is) = r["naive_floor_is"].as_str() {
        println!(
            "| second floor: {is} | {} | {} | |",
            f(&r["naive_floor"]["p50_ms"]),
            f(&r["naive_floor"]["p99_ms"])
        );
    }
    println!(
        "| acquire + release, uncontended | {} | {} | {} x floor (p50){} |",
        f(&r["cycle"]["p50_ms"]),
        f(&r["cycle"]["p99_ms"]),
        f(&r["cycle_over_floor_p50"]),
        r["cycle_over_naive_floor_p50"]
            .as_f64()
            .map_or(String::new(), |x| format!(", {x:.3} x the second floor"))
    );
    if r["server_us_per_cycle"].is_object() {
        println!(
            "| server time in scripts per cycle (`INFO commandstats`): ours, the floor's | | | {} µs, {} µs |",
            f(&r["server_us_per_cycle"]["ours"]),
            f(&r["server_us_per_cycle"]["floor"])
        );
    }
    if let Some(is) = r["handoff_floor_is"].as_str() {
        println!(
            "| floor of a handoff: {is} | {} | {} | |",
            f(&r["handoff_floor"]["p50_ms"]),
            f(&r["handoff_floor"]["p99_ms"])
        );
    }
    for h in r["handoff_floor_among_listeners"]
        .as_array()
        .into_iter()
        .flatten()
    {
        println!(
            "| floor of a handoff, {} other connections listening (idle, channels of their own) | {} | {} | |",
            h["others"],
            f(&h["gap"]["p50_ms"]),
            f(&h["gap"]["p99_ms"])
        );
    }
    for h in r["handoff_floor_queue"].as_array().into_iter().flatten() {
        println!(
            "| the same queue raw, {} parties, handoffs overlapping | {} | {} | {} store requests per handoff |",
            h["parties"],
            f(&h["gap"]["p50_ms"]),
            f(&h["gap"]["p99_ms"]),
            f(&h["requests_per_handoff"])
        );
    }
    for h in r["handoff"].as_array().into_iter().flatten() {
        println!(
            "| handoff, {} waiters on {} clients | {} | {} | {} store requests per handoff |",
            h["waiters"],
            h["clients"],
            f(&h["gap"]["p50_ms"]),
            f(&h["gap"]["p99_ms"]),
            f(&h["requests_per_handoff"])
        );
    }
    for h in r["contended"].as_array().into_iter().flatten() {
        println!(
            "| contended, {} clients (own sessions), one lock | {} | {} | {} handoffs/s; {} store requests per handoff; the bench's CPU per handoff {} us user, {} us kernel |",
            h["clients"],
            f(&h["gap"]["p50_ms"]),
            f(&h["gap"]["p99_ms"]),
            f(&h["handoffs_per_s"]),
            f(&h["requests_per_handoff"]),
            f(&h["cpu_us_per_handoff"]["user"]),
            f(&h["cpu_us_per_handoff"]["system"])
        );
    }
    for h in r["contended_processes"].as_array().into_iter().flatten() {
        println!(
            "| contended, {} clients each in a process of its own, one lock | | | {} handoffs/s |",
            h["clients"],
            f(&h["handoffs_per_s"])
        );
    }
    for h in r["contended_one_process"].as_array().into_iter().flatten() {
        println!(
            "| contended, {} clients all in one other process, one lock | | | {} handoffs/s |",
            h["clients"],
            f(&h["handoffs_per_s"])
        );
    }
    for h in r["recipe"].as_array().into_iter().flatten() {
        println!(
            "| the store's recipe raw ({}), {} parties on {} connections | {} | {} | {} handoffs/s; {} store requests per handoff; the bench's CPU per handoff {} us user, {} us kernel |",
            r["recipe_is"].as_str().unwrap_or(""),
            h["parties"],
            h["connections"],
            f(&h["gap"]["p50_ms"]),
            f(&h["gap"]["p99_ms"]),
            f(&h["handoffs_per_s"]),
            f(&h["requests_per_handoff"]),
            f(&h["cpu_us_per_handoff"]["user"]),
            f(&h["cpu_us_per_handoff"]["system"])
        );
    }
    for s in [&r["scale_small"], &r["scale"]] {
        if s.is_null() {
            continue;
        }
        // A further floor's two halves, where the run measured it.
        let other = |field: &str, what: &str| {
            let take = &s[format!("floor_{field}_acquire_all_s")];
            let give = &s[format!("floor_{field}_release_all_s")];
            if take.is_null() {
                String::new()
            } else {
                format!(
                    "; {what}: acquire all {} s, release all {} s",
                    f(take),
                    f(give)
                )
            }
        };
        // etcd and ZooKeeper: the floor with each lock's loss watch too.
        let watched = other("watched", "the floor with each lock's loss watch");
        let naive = other("naive", "the naive lock's floor");
        println!(
            "| {} locks held by one client ({} session) | | | acquire all {} s (floor {} s, {} requests per lock), release all {} s (floor {} s, {} requests per lock); keepalive requests per TTL: {} with 1 lock, {} with all; {} bytes per lock{watched}{naive} |",
            s["locks"], s["sessions"], f(&s["acquire_all_s"]), f(&s["floor_acquire_all_s"]), f(&s["acquire_requests_per_lock"]), f(&s["release_all_s"]), f(&s["floor_release_all_s"]), f(&s["release_requests_per_lock"]), s["requests_per_ttl_one_lock"], s["requests_per_ttl_all_locks"], f(&s["client_bytes_per_lock"])
        );
    }
    let l = &r["loss_detection"];
    println!(
        "| loss detection after forced break (held {} ms) | {} | {} | |",
        l["held_before_ms"],
        f(&l["break"]["p50_ms"]),
        f(&l["break"]["p99_ms"])
    );
    println!(
        "| loss detection after session kill (held {} ms) | {} | {} | |",
        l["held_before_ms"],
        f(&l["session_kill"]["p50_ms"]),
        f(&l["session_kill"]["p99_ms"])
    );
}

#[cfg(test)]
mod tests {
    use super::url_in;

    #[test]
    fn run_namespace_goes_under_the_url_path() {
        assert_eq!(url_in("mem://", "b-1"), "mem:///b-1");
        assert_eq!(url_in("etcd://h:2379/", "b-1"), "etcd://h:2379/b-1");
        assert_eq!(url_in("zk://h/app?ttl=2s", "b-1"), "zk://h/app/b-1?ttl=2s");
        for url in ["mem://", "mem:///x"] {
            let parsed = quorumlock::url::parse(&url_in(url, "b-1")).unwrap();
            assert!(
                quorumlock::mem::MemConfig::from_url(&parsed).is_ok(),
                "{url}"
            );
        }
    }
}
