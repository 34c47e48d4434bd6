//! Schedules by budget, on single nodes and on clusters, and their report.

use super::*;

/// The seed `QUORUMLOCK_EXPLORE_SEED` asks to replay, if any.
pub(super) fn replay_seed() -> Option<u64> {
    std::env::var("QUORUMLOCK_EXPLORE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
}

/// A time-based first seed, different on every run.
pub(super) fn fresh_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

/// How long the explorer runs schedules: `QUORUMLOCK_EXPLORE_SECONDS`
/// (unset or 0: `QUORUMLOCK_EXPLORE_SEEDS` schedules, default 4).
pub(super) fn explore_budget() -> Duration {
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
        self.refusals += o.refusals;
        self.operator_reads += o.operator_reads;
        self.saturations += o.saturations;
        self.closing_cuts += o.closing_cuts;
        self.process_pauses += o.process_pauses;
        self.process_kills += o.process_kills;
        self.clock_steps += o.clock_steps;
        self.failovers += o.failovers;
        self.operator_deletes += o.operator_deletes;
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
            + self.refusals
            + self.operator_reads
            + self.saturations
            + self.closing_cuts
            + self.process_pauses
            + self.process_kills
            + self.clock_steps
            + self.failovers
            + self.operator_deletes
    }
}

impl OpCounts {
    fn add(&mut self, o: &OpCounts) {
        self.elections += o.elections;
        self.multi_locks += o.multi_locks;
        self.hold_limits += o.hold_limits;
        self.many_permits += o.many_permits;
        self.upgrades += o.upgrades;
        self.refused_upgrades += o.refused_upgrades;
        self.fenced_writes += o.fenced_writes;
        self.held_at_close += o.held_at_close;
        self.observed += o.observed;
    }
}

impl std::fmt::Display for OpCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "elections {} multi-locks {} hold-limits {} permits-at-once {} upgrades {} refused-upgrades {} fenced-writes {} held-at-close {} observed-leaders {}",
            self.elections,
            self.multi_locks,
            self.hold_limits,
            self.many_permits,
            self.upgrades,
            self.refused_upgrades,
            self.fenced_writes,
            self.held_at_close,
            self.observed
        )
    }
}

impl std::fmt::Display for FaultCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "delay {} blackhole {} cut {} reset {} break {} revoke {} kill {} drop {} lost-answer {} lost-request {} delayed-message {} cluster {} refused-removals {} operator-reads {} saturated-breaks {} closing-cuts {} process-pauses {} process-kills {} clock-steps {} failovers {} operator-deletes {}",
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
            self.cluster,
            self.refusals,
            self.operator_reads,
            self.saturations,
            self.closing_cuts,
            self.process_pauses,
            self.process_kills,
            self.clock_steps,
            self.failovers,
            self.operator_deletes
        )
    }
}

/// Schedules run at once on one store (each in its own namespace, with
/// its own clients and links): `QUORUMLOCK_EXPLORE_AT_ONCE`, default 2
/// (`scripts/chaos.sh` runs more: the stores are far from busy with one).
pub(super) fn at_once() -> usize {
    env_number("QUORUMLOCK_EXPLORE_AT_ONCE")
        .map(|n| n as usize)
        .filter(|n| *n > 0)
        .unwrap_or(2)
}

/// The shape of a single-node schedule: [`Shape::default`], running for
/// `QUORUMLOCK_EXPLORE_RUN_SECONDS` when set.
pub(super) fn single_node_shape() -> Shape {
    let mut shape = Shape::default();
    if let Some(s) = env_number("QUORUMLOCK_EXPLORE_RUN_SECONDS").filter(|s| *s > 0.0) {
        shape.run_for = Duration::from_secs_f64(s);
    }
    shape
}

/// The gap between the first schedules' starts.
const RAMP_STEP: Duration = Duration::from_millis(200);

fn env_number(var: &str) -> Option<f64> {
    std::env::var(var).ok().and_then(|s| s.parse::<f64>().ok())
}

/// The seed of the `i`th schedule of a run that starts at `first`.
fn nth_seed(first: u64, i: u64) -> u64 {
    first.wrapping_add(i.wrapping_mul(7919))
}

/// Runs schedules of the default [`Shape`] (`QUORUMLOCK_EXPLORE_RUN_SECONDS`
/// long when set), `QUORUMLOCK_EXPLORE_AT_ONCE` of them in flight
/// (a new one starts as soon as one ends): the replay seed alone, or for
/// `QUORUMLOCK_EXPLORE_SECONDS`, or `QUORUMLOCK_EXPLORE_SEEDS` of them
/// (default 4, the share of `scripts/test.sh`); one at a time on a target
/// with a failover (it hits every namespace). Records one row
/// (schedules and faults by kind in its notes) and fails with the seed of
/// every schedule that found a violation.
pub async fn explore_random_schedules(t: &FaultTarget) -> Row {
    use futures::stream::{FuturesUnordered, StreamExt};

    let budget = explore_budget();
    let count: u64 = std::env::var("QUORUMLOCK_EXPLORE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let replay = replay_seed();
    let first = replay.unwrap_or_else(fresh_seed);
    let shape = single_node_shape();
    let start = Instant::now();
    let mut row = Row::new(t.name(), "explore_random_schedules");
    let mut totals = Totals::default();
    let mut schedules = 0u64;
    let mut started = 0u64;
    let may_start = |started: u64| {
        if replay.is_some() {
            started == 0
        } else if budget.is_zero() {
            started < count
        } else {
            start.elapsed() < budget
        }
    };
    let at_once = if t.failover().is_some() { 1 } else { at_once() };
    let mut running = FuturesUnordered::new();
    loop {
        while running.len() < at_once && may_start(started) {
            // The first ones start 200 ms apart: a dozen schedules opening
            // all their sessions in one instant starve the runtime's
            // timers, which the checker would see as late returns.
            let stagger = RAMP_STEP * started.min(at_once as u64) as u32;
            let seed = nth_seed(first, started);
            running.push(async move {
                tokio::time::sleep(stagger).await;
                explore(t, seed, shape, None).await
            });
            started += 1;
        }
        let Some(o) = running.next().await else { break };
        schedules += 1;
        tally(t, &mut row, &mut totals, &o);
    }
    summarize(row, schedules, &totals)
}

/// Adds one schedule's outcome to the row.
pub(super) fn tally(t: &FaultTarget, row: &mut Row, totals: &mut Totals, o: &Outcome) {
    eprintln!(
        "explorer {}: seed {}: {} ops ({}), {} holds, faults: {}, {} violations",
        t.name(),
        o.seed,
        o.ops,
        o.kinds,
        o.holds,
        o.faults,
        o.violations.len()
    );
    for v in &o.violations {
        eprintln!("explorer {}: seed {}: violation: {v}", t.name(), o.seed);
    }
    row.cycles += o.ops;
    totals.faults.add(&o.faults);
    totals.kinds.add(&o.kinds);
    if !o.violations.is_empty() {
        row.violation(format!(
            "seed {} (replay: QUORUMLOCK_EXPLORE_SEED={}): {}",
            o.seed,
            o.seed,
            o.violations.join("; ")
        ));
    }
}

/// What the schedules of a row did, summed.
#[derive(Debug, Default)]
pub(super) struct Totals {
    faults: FaultCounts,
    kinds: OpCounts,
}

/// Puts the schedules, operations and faults by kind first in the row's
/// notes, records it and asserts that no schedule found a violation.
pub(super) fn summarize(mut row: Row, schedules: u64, totals: &Totals) -> Row {
    let Totals { faults, kinds } = totals;
    row.faults = faults.total();
    let notes = std::mem::take(&mut row.notes);
    row.note(format!("{schedules} schedules; {kinds}; faults: {faults}"));
    if !notes.is_empty() {
        row.note(notes);
    }
    row.finish()
}

/// What a cluster schedule does to the cluster, early in the schedule.
pub(super) async fn cluster_fault(cluster: &mut Cluster, seed: u64, ttl: Duration) -> &'static str {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xc1c1_c1c1);
    let recover = Duration::from_secs(60);
    tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1500))).await;
    let Some(leader) = cluster.leader().await else {
        return "no leader to fault";
    };
    // Per-link cuts only where the cluster's links go through proxies.
    let kinds = if cluster.is_linked() { 6 } else { 4 };
    let what = match rng.gen_range(0..kinds) {
        4 => {
            // A follower cut from its leader past the TTL, still serving
            // its clients (from its own copy, where it may).
            let follower = (leader + rng.gen_range(1..3)) % 3;
            cluster.cut(follower, leader);
            tokio::time::sleep(ttl + Duration::from_millis(500)).await;
            cluster.heal(follower, leader);
            "a follower cut from its leader past the TTL"
        }
        5 => {
            // The leader cut from both followers, still serving its
            // clients until it learns it lost, until the others elect
            // another (or the TTL has run).
            cluster.cut(leader, (leader + 1) % 3);
            cluster.cut(leader, (leader + 2) % 3);
            let give_up = Instant::now() + ttl.max(Duration::from_secs(10));
            while Instant::now() < give_up && cluster.leader().await.is_none_or(|l| l == leader) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            cluster.heal(leader, (leader + 1) % 3);
            cluster.heal(leader, (leader + 2) % 3);
            "the leader cut from both followers until deposed"
        }
        3 => {
            // A deposed leader: paused until the others elect a new one,
            // then resumed with its old view (a client on it may be
            // served that view until it learns it lost).
            cluster.stop(leader);
            let give_up = Instant::now() + recover;
            while Instant::now() < give_up && cluster.leader().await.is_none_or(|l| l == leader) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            cluster.cont(leader);
            "leader paused until deposed, then resumed"
        }
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
    // The next round's faulty clients dial the first member: it must be
    // back, not only some leader.
    if cluster.wait_serving(recover).await.is_err() {
        return "a member not serving after the fault";
    }
    what
}

/// Explorer schedules on a three-node cluster (`scripts/chaos.sh`): each
/// also kills the leader, pauses the whole cluster past the TTL, kills
/// a follower, or pauses the leader until the others elect a new one and
/// resumes it (a deposed leader), or on a linked cluster
/// ([`Cluster::start_linked`]) cuts a follower from its leader past the
/// TTL or the leader from both followers until deposed, early in the
/// schedule (chosen by the seed), and heals it
/// before the schedule's faults stop; `QUORUMLOCK_EXPLORE_AT_ONCE` schedules share each
/// cluster fault. `QUORUMLOCK_EXPLORE_SECONDS` long (default: 2 rounds).
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
    let mut totals = Totals::default();
    let mut schedules = 0u64;
    let mut rounds = 0u64;
    loop {
        // One cluster fault per round, under `at_once()` schedules (the
        // replay seed alone when replaying): each lives through it.
        let width = if replay_seed().is_some() {
            1
        } else {
            at_once() as u64
        };
        let seeds: Vec<u64> = (0..width).map(|i| nth_seed(first, schedules + i)).collect();
        // The fault waits for every schedule's clients: one still
        // connecting to the member it kills would wait out its
        // connect_timeout, a failure of the harness and not of a client.
        let connected = tokio::sync::Semaphore::new(0);
        let (outs, what) = tokio::join!(
            futures::future::join_all(seeds.iter().map(|seed| explore(
                t,
                *seed,
                shape,
                Some(&connected)
            ))),
            async {
                let all = connected.acquire_many(width as u32);
                match tokio::time::timeout(Duration::from_secs(60), all).await {
                    Ok(Ok(p)) => p.forget(),
                    _ => eprintln!(
                        "explorer {}: seeds {seeds:?}: still connecting after 60 s; \
                         faulting the cluster anyway",
                        t.name()
                    ),
                }
                cluster_fault(cluster, seeds[0], ttl).await
            }
        );
        eprintln!(
            "explorer {}: seeds {seeds:?}: cluster fault: {what}",
            t.name()
        );
        rounds += 1;
        for o in outs {
            schedules += 1;
            tally(t, &mut row, &mut totals, &o);
        }
        if what != "no leader to fault" {
            totals.faults.cluster += 1;
        }
        let done = replay_seed().is_some()
            || if budget.is_zero() {
                rounds >= 2
            } else {
                start.elapsed() >= budget
            };
        if done {
            break;
        }
    }
    summarize(row, schedules, &totals)
}
