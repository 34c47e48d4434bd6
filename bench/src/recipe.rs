//! The store's own lock recipe, done raw by N parties contending for one
//! lock: the floor of the handoff and contention lines.
//!
//! The two-party handoff floor ([`crate::floor::handoffs`]) has one waiter
//! and nothing else on the store. With 4 to 64 waiters the store also
//! serves the waiters' own queueing (a released holder queues again at
//! once), and that is part of what a handoff costs on it; these recipes do
//! that work with the store's raw client and nothing of ours:
//!
//! - etcd: Go's `concurrency.Mutex` (a key per party under the lock's
//!   prefix, created with the party's lease; the owner is the oldest key;
//!   a waiter watches the delete of the newest key older than its own,
//!   then confirms its own key, as `Mutex.Lock` does), with one change:
//!   the watch starts from now and the predecessor is read again once
//!   etcd created it. Go's `waitDelete` watches from the revision of its
//!   read, and etcd serves a watch that starts in the past from a loop
//!   that runs every 100 ms whenever the store moved in between, which
//!   under contention it does: as shipped the recipe's tail would be that
//!   loop, a floor no client should be measured against. Ours does the
//!   same (`quorumlock-etcd`, `wait_turn`);
//! - ZooKeeper: the recipe in ZooKeeper's documentation (and Curator's
//!   `InterProcessMutex`): an ephemeral sequential node, the children
//!   listed, an exists watch on the predecessor;
//! - Consul: the recipe of `consul lock` and the Go API's `Lock`: a
//!   blocking read of the key until it has no session, then `?acquire`
//!   (every waiter wakes on every change: Consul has no queue);
//! - PostgreSQL: `pg_advisory_lock`, which the server queues itself, one
//!   connection per party.
//!
//! Each run checks that no two parties hold at once: a raw recipe that
//! broke mutual exclusion would make a fast floor worthless.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quorumlock::url::Url;
use serde_json::{json, Value};

use crate::floor::{
    consul_put, consul_session, pg_config, pg_text, raw_address, text, zk_connect, Result,
};
use crate::Handoffs;

/// At most this many connections for one run's parties (as many as the
/// handoff measurement of ours uses): ZooKeeper's default allows 60 per
/// host, and a party is not a process.
pub const MAX_CONNECTIONS: usize = 16;

/// The recipe of a scheme, in words, for the report.
pub fn describe(scheme: &str) -> Option<&'static str> {
    match scheme {
        "etcd" => Some("Go's concurrency.Mutex, raw: a key per party with its lease, a watch from now on the predecessor's delete (then read again), the own key confirmed"),
        "zk" => Some("the ZooKeeper lock recipe, raw: ephemeral sequential node, children listed, exists watch on the predecessor"),
        "consul" => Some("consul lock's recipe, raw: blocking read until the key has no session, then ?acquire (no queue; the holder's monitoring read left out)"),
        "postgres" | "postgresql" => Some("pg_advisory_lock / pg_advisory_unlock, one connection per party (the server queues)"),
        _ => None,
    }
}

/// What the parties of one run share: the grants and gaps (as the bench
/// measures ours), the requests sent, who holds, and the run's seconds.
#[derive(Clone)]
struct Shared {
    handoffs: Handoffs,
    requests: Arc<AtomicU64>,
    held: Arc<AtomicBool>,
    secs: f64,
    /// Set when the parties start (after the set-up).
    end: Arc<std::sync::OnceLock<Instant>>,
    /// The process's CPU time over the parties' run (not their set-up
    /// and clean-up outside it).
    cpu: Arc<std::sync::OnceLock<Value>>,
}

impl Shared {
    fn sent(&self, n: u64) {
        self.requests.fetch_add(n, Ordering::Relaxed);
    }

    /// A party was granted: the gap since the last release started, the
    /// mutual exclusion check (held across an await, so that a second
    /// grant meanwhile is seen), then the start of its release.
    async fn hold(&self) -> Result<()> {
        if self.held.swap(true, Ordering::SeqCst) {
            return Err("two parties of the raw recipe held at once".into());
        }
        self.handoffs.granted();
        tokio::task::yield_now().await;
        self.held.store(false, Ordering::SeqCst);
        self.handoffs.releasing();
        Ok(())
    }

    fn running(&self) -> bool {
        self.end.get().is_some_and(|end| Instant::now() < *end)
    }
}

/// `parties` raw parties (on at most [`MAX_CONNECTIONS`] connections)
/// take and give back one lock for `secs` seconds: handoffs per second,
/// the gap from a release starting to the next grant, and store requests
/// per handoff. `None` for stores without a recipe here.
pub async fn contended(url: &Url, parties: usize, secs: f64) -> Result<Option<Value>> {
    contended_as(url, parties, secs, false).await
}

/// On etcd, [`contended`] with ours' second watch: when the store moved
/// between the predecessor watch's start and the read after it, one more
/// watch from now, so that the wait is late only if both are (etcd
/// serves a watch left behind from its 100 ms catch-up loop). That is
/// ours' queue done raw: the floor of a handoff among parties that queue
/// again at once, which the two-party floor ([`crate::floor::handoffs`])
/// does not have. `None` on other stores.
pub async fn etcd_queue(url: &Url, parties: usize, secs: f64) -> Result<Option<Value>> {
    if url.scheme() != "etcd" {
        return Ok(None);
    }
    contended_as(url, parties, secs, true).await
}

/// [`contended`], on etcd with ours' second watch when `second_watch`.
async fn contended_as(
    url: &Url,
    parties: usize,
    secs: f64,
    second_watch: bool,
) -> Result<Option<Value>> {
    let Some(address) = raw_address(url) else {
        return Ok(None);
    };
    // etcd and ZooKeeper parties share a pool; Consul's and PostgreSQL's
    // each wait on a connection of their own.
    let pooled = parties.clamp(1, MAX_CONNECTIONS);
    let run = format!("qlbench-recipe-{}-{parties}", std::process::id());
    let shared = Shared {
        handoffs: Handoffs::new(),
        requests: Arc::new(AtomicU64::new(0)),
        held: Arc::new(AtomicBool::new(false)),
        secs,
        end: Arc::new(std::sync::OnceLock::new()),
        cpu: Arc::new(std::sync::OnceLock::new()),
    };
    let (elapsed, connections) = match url.scheme() {
        "etcd" => (
            etcd(&address, &run, parties, pooled, &shared, second_watch).await?,
            pooled,
        ),
        "zk" => (zk(&address, &run, parties, pooled, &shared).await?, pooled),
        "consul" => (consul(&address, &run, parties, &shared).await?, parties),
        "postgres" | "postgresql" => (postgres(url, parties, &shared).await?, parties),
        _ => return Ok(None),
    };
    let got = shared.handoffs.count();
    let gaps = shared.handoffs.gaps();
    Ok(Some(json!({
        "parties": parties,
        "connections": connections,
        "handoffs": got,
        "gap": crate::summary(&gaps),
        "requests_per_handoff": shared.requests.load(Ordering::Relaxed) as f64 / got.max(1) as f64,
        "cpu_us_per_handoff": shared.cpu.get(),
        "handoffs_per_s": got as f64 / elapsed.as_secs_f64(),
    })))
}

/// Runs one task per party, each taking and giving back the lock until
/// the run's seconds are over; the first error ends the run. The time
/// from the start to the last party's end.
async fn run_parties<F, Fut>(parties: usize, shared: &Shared, mut party: F) -> Result<Duration>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    let start = Instant::now();
    shared
        .end
        .set(start + Duration::from_secs_f64(shared.secs))
        .map_err(|_| "a recipe run started twice")?;
    let cpu = crate::process_cpu();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..parties {
        tasks.spawn(party(i));
    }
    let mut first = Ok(());
    while let Some(r) = tasks.join_next().await {
        let r = r.map_err(text).and_then(|r| r);
        if r.is_err() && first.is_ok() {
            first = r;
            tasks.abort_all();
        }
    }
    let elapsed = start.elapsed();
    if let Some((now, then)) = crate::process_cpu().zip(cpu) {
        let _ = shared
            .cpu
            .set(now.per_handoff_since(then, shared.handoffs.count()));
    }
    first.map(|()| elapsed)
}

async fn etcd(
    address: &str,
    run: &str,
    parties: usize,
    connections: usize,
    shared: &Shared,
    second_watch: bool,
) -> Result<Duration> {
    use etcd_client::{
        Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
        TxnOpResponse,
    };
    let mut clients = Vec::new();
    for _ in 0..connections {
        let c = etcd_client::Client::connect([address], None)
            .await
            .map_err(text)?;
        clients.push(c);
    }
    // Never renewed: outlives the run.
    let ttl = shared.secs.ceil() as i64 + 60;
    let mut leases = Vec::new();
    for i in 0..parties {
        let lease = clients[i % connections]
            .lease_grant(ttl, None)
            .await
            .map_err(text)?
            .id();
        leases.push(lease);
    }
    let pfx = format!("{run}/");
    let result = run_parties(parties, shared, |i| {
        let (mut client, lease) = (clients[i % connections].clone(), leases[i]);
        let (pfx, shared) = (pfx.clone(), shared.clone());
        async move {
            let key = format!("{pfx}{lease:x}");
            let owner = || {
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1)
            };
            while shared.running() {
                // Mutex.tryAcquire: our key if absent, and the owner.
                let txn = Txn::new()
                    .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                    .and_then([
                        TxnOp::put(key.as_str(), "", Some(PutOptions::new().with_lease(lease))),
                        TxnOp::get(pfx.as_str(), Some(owner())),
                    ])
                    .or_else([
                        TxnOp::get(key.as_str(), None),
                        TxnOp::get(pfx.as_str(), Some(owner())),
                    ]);
                let r = client.txn(txn).await.map_err(text)?;
                shared.sent(1);
                let first_created = |op: Option<&TxnOpResponse>| match op {
                    Some(TxnOpResponse::Get(g)) => g.kvs().first().map(|kv| kv.create_revision()),
                    _ => None,
                };
                let ops = r.op_responses();
                let rev = if r.succeeded() {
                    r.header().map_or(0, |h| h.revision())
                } else {
                    first_created(ops.first()).unwrap_or(0)
                };
                let owner_rev = first_created(ops.get(1));
                if owner_rev.is_some_and(|o| o != rev) {
                    // waitDeletes: the newest key older than ours, until none.
                    loop {
                        let opts = GetOptions::new()
                            .with_prefix()
                            .with_sort(SortTarget::Create, SortOrder::Descend)
                            .with_max_create_revision(rev - 1)
                            .with_limit(1);
                        let g = client.get(pfx.as_str(), Some(opts)).await.map_err(text)?;
                        shared.sent(1);
                        let Some(kv) = g.kvs().first() else { break };
                        let (pred, pred_rev) = (kv.key().to_vec(), kv.create_revision());
                        // From now, then the key read again (see above):
                        // the same copy, since a party that let go puts
                        // the same key again, behind us.
                        let mut w = client.watch(pred.clone(), None).await.map_err(text)?;
                        shared.sent(1);
                        let created = w.message().await.map_err(text)?.ok_or("the watch ended")?;
                        let again = client.get(pred.clone(), None).await.map_err(text)?;
                        shared.sent(1);
                        if again
                            .kvs()
                            .first()
                            .is_none_or(|k| k.create_revision() != pred_rev)
                        {
                            continue;
                        }
                        let revision =
                            |h: Option<&etcd_client::ResponseHeader>| h.map_or(0, |h| h.revision());
                        let mut more = None;
                        if second_watch && revision(again.header()) > revision(created.header()) {
                            let mut w2 = client.watch(pred, None).await.map_err(text)?;
                            shared.sent(1);
                            w2.message().await.map_err(text)?.ok_or("the watch ended")?;
                            more = Some(w2);
                        }
                        match more.as_mut() {
                            Some(w2) => tokio::select! {
                                r = deleted(&mut w) => r?,
                                r = deleted(w2) => r?,
                            },
                            None => deleted(&mut w).await?,
                        }
                    }
                    // The session is alive and our key is still there.
                    let g = client.get(key.as_str(), None).await.map_err(text)?;
                    shared.sent(1);
                    if g.kvs().is_empty() {
                        return Err("the party's key is gone".into());
                    }
                }
                shared.hold().await?;
                client.delete(key.as_str(), None).await.map_err(text)?;
                shared.sent(1);
            }
            Ok(())
        }
    })
    .await;
    let mut client = clients[0].clone();
    for lease in leases {
        let _ = client.lease_revoke(lease).await;
    }
    result
}

/// Waits on `w` for a delete (or its end).
async fn deleted(w: &mut etcd_client::WatchStream) -> Result<()> {
    while let Some(m) = w.message().await.map_err(text)? {
        if m.events()
            .iter()
            .any(|e| e.event_type() == etcd_client::EventType::Delete)
        {
            break;
        }
    }
    Ok(())
}

async fn zk(
    address: &str,
    run: &str,
    parties: usize,
    connections: usize,
    shared: &Shared,
) -> Result<Duration> {
    use zookeeper_client::{Acls, CreateMode};
    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(zk_connect(address).await?);
    }
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    let dir = format!("/{run}");
    clients[0]
        .create(&dir, b"", &persistent)
        .await
        .map_err(text)?;
    let result = run_parties(parties, shared, |i| {
        let client = clients[i % connections].clone();
        let (dir, shared) = (dir.clone(), shared.clone());
        async move {
            let node_mode = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
            while shared.running() {
                let (_, seq) = client
                    .create(&format!("{dir}/lock-"), b"", &node_mode)
                    .await
                    .map_err(text)?;
                shared.sent(1);
                let mine = format!("lock-{seq}");
                loop {
                    let mut children = client.list_children(&dir).await.map_err(text)?;
                    shared.sent(1);
                    children.sort();
                    let at = children
                        .iter()
                        .position(|c| *c == mine)
                        .ok_or("the party's node is gone")?;
                    if at == 0 {
                        break;
                    }
                    // A data watch, as Curator sets: none is left behind
                    // on a predecessor already gone.
                    let before = format!("{dir}/{}", children[at - 1]);
                    let watched = client.get_and_watch_data(&before).await;
                    shared.sent(1);
                    match watched {
                        Ok((_, _, watcher)) => {
                            watcher.changed().await;
                        }
                        Err(zookeeper_client::Error::NoNode) => {}
                        Err(e) => return Err(e.to_string()),
                    }
                }
                shared.hold().await?;
                client
                    .delete(&format!("{dir}/{mine}"), None)
                    .await
                    .map_err(text)?;
                shared.sent(1);
            }
            Ok(())
        }
    })
    .await;
    // Each party deleted its node, so the folder is empty unless the run
    // failed (then its sessions' ends take the nodes, and the folder stays).
    let _ = clients[0].delete(&dir, None).await;
    result
}

async fn consul(base: &str, run: &str, parties: usize, shared: &Shared) -> Result<Duration> {
    let http = reqwest::Client::new();
    let mut sessions = Vec::new();
    for _ in 0..parties {
        sessions.push(consul_session(&http, base).await?);
    }
    // Every party's blocking read holds a connection of its own.
    let key = format!("{run}/.lock");
    let result = run_parties(parties, shared, |i| {
        let (http, session, shared) = (http.clone(), sessions[i].clone(), shared.clone());
        let (base, key) = (base.to_string(), key.clone());
        async move {
            let mut index = 0u64;
            while shared.running() {
                // api.Lock: wait until the key has no session, then acquire.
                loop {
                    let url = format!("{base}/v1/kv/{key}?index={index}&wait=5s");
                    let r = http.get(url).send().await.map_err(text)?;
                    shared.sent(1);
                    let at: u64 = r
                        .headers()
                        .get("X-Consul-Index")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .unwrap_or(0);
                    // As api.Lock: an index that went back starts over.
                    index = if at < index { 0 } else { at };
                    let free = if r.status() == reqwest::StatusCode::NOT_FOUND {
                        true
                    } else {
                        let kv: Value = r
                            .error_for_status()
                            .map_err(text)?
                            .json()
                            .await
                            .map_err(text)?;
                        kv[0]["Session"].as_str().is_none_or(str::is_empty)
                    };
                    if !free {
                        continue;
                    }
                    let url = format!("{base}/v1/kv/{key}?acquire={session}");
                    let took = consul_put(&http, &url, &Value::Null).await?;
                    shared.sent(1);
                    if took.as_bool() == Some(true) {
                        break;
                    }
                }
                shared.hold().await?;
                let url = format!("{base}/v1/kv/{key}?release={session}");
                consul_put(&http, &url, &Value::Null).await?;
                shared.sent(1);
            }
            Ok(())
        }
    })
    .await;
    for s in &sessions {
        let _ = http
            .put(format!("{base}/v1/session/destroy/{s}"))
            .send()
            .await;
    }
    let _ = http.delete(format!("{base}/v1/kv/{key}")).send().await;
    result
}

async fn postgres(url: &Url, parties: usize, shared: &Shared) -> Result<Duration> {
    let pg = pg_config(url)?;
    // One key per run, from the process id: runs never share it.
    let lock_key = (i64::from(std::process::id()) << 8) | (parties as i64 & 0xff);
    let mut clients = Vec::new();
    for _ in 0..parties {
        let (client, connection) = pg.connect(tokio_postgres::NoTls).await.map_err(pg_text)?;
        tokio::spawn(connection);
        clients.push(client);
    }
    // Prepared before the start: set-up is not timed.
    let mut prepared = Vec::new();
    for client in clients {
        let take = client
            .prepare("SELECT pg_advisory_lock($1)")
            .await
            .map_err(pg_text)?;
        let give = client
            .prepare("SELECT pg_advisory_unlock($1)")
            .await
            .map_err(pg_text)?;
        prepared.push(Arc::new((client, take, give)));
    }
    run_parties(parties, shared, |i| {
        let (party, shared) = (prepared[i].clone(), shared.clone());
        async move {
            let (client, take, give) = &*party;
            while shared.running() {
                client.execute(take, &[&lock_key]).await.map_err(pg_text)?;
                shared.sent(1);
                shared.hold().await?;
                client.execute(give, &[&lock_key]).await.map_err(pg_text)?;
                shared.sent(1);
            }
            Ok(())
        }
    })
    .await
}
