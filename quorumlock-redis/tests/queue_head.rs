//! The scripts read a queue from its head only as far as a grant depends
//! on (up to the first entry that does not hold), purging dead entries on
//! the way: entries whose session key is gone are skipped across the
//! chunks that read is done in, every entry that holds is granted, and a
//! release costs the server the same with 4 waiters as with 32.

use std::sync::Arc;
use std::time::Duration;

use quorumlock_conformance::{Case, Harness};
use tokio::sync::mpsc;

/// One-hour sessions: a waiter looks again on its own only when a session
/// ahead would expire, so a grant within seconds is the scripts' doing.
fn harness() -> Option<Harness> {
    Harness::from_env("QUORUMLOCK_TEST_REDIS_URL", |url| async move {
        Ok(Arc::new(quorumlock_redis::RedisBackend::connect(&url).await?) as _)
    })
    .map(|h| h.with_option("ttl", "1h"))
}

async fn raw() -> redis::aio::MultiplexedConnection {
    let url = std::env::var("QUORUMLOCK_TEST_REDIS_URL").unwrap();
    let u = quorumlock_core::url::parse(&url).unwrap();
    let plain = format!(
        "redis://{}:{}/",
        u.host_str().unwrap(),
        u.port().unwrap_or(6379)
    );
    let c = redis::Client::open(plain).unwrap();
    c.get_multiplexed_async_connection().await.unwrap()
}

/// Deletes the session key of `sid`, as its expiry would: its entries
/// stay in the queues until a script meets them.
async fn expire_session(conn: &mut redis::aio::MultiplexedConnection, case: &Case, sid: &str) {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{}*.session/{sid}", case.namespace()))
        .query_async(conn)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "session key of {sid}: {keys:?}");
    let _: () = redis::cmd("DEL")
        .arg(&keys)
        .query_async(conn)
        .await
        .unwrap();
}

/// The tasks of queued clients, stopped when dropped.
struct Queued(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.iter().for_each(|t| t.abort());
    }
}

/// `n` clients queued on `name` (readers or mutex waiters) behind a held
/// lock, in order; each reports its index once it holds.
async fn queue(
    case: &Case,
    name: &str,
    n: usize,
    read: bool,
    held: &mpsc::UnboundedSender<usize>,
) -> Queued {
    let mut out = Vec::new();
    for i in 0..n {
        let c = case.client().await;
        let (c2, owned, held) = (c.clone(), name.to_string(), held.clone());
        let task = tokio::spawn(async move {
            let g = if read {
                c2.rwlock(&owned).unwrap().read().await.unwrap()
            } else {
                c2.lock(&owned).unwrap().acquire().await.unwrap()
            };
            held.send(i).unwrap();
            std::future::pending::<()>().await;
            drop(g);
        });
        // In order: wait until this one is queued.
        let queued = async {
            while c.inspect(name).await.unwrap().waiters.len() < i + 1 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), queued)
            .await
            .expect("waiter not queued");
        out.push(task);
    }
    Queued(out)
}

async fn collect(rx: &mut mpsc::UnboundedReceiver<usize>, n: usize) -> Vec<usize> {
    let mut got = Vec::new();
    while got.len() < n {
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            Ok(Some(i)) => got.push(i),
            _ => break,
        }
    }
    got.sort();
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_release_grants_every_live_reader_past_dead_ones() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let w = case.client().await;
    let writer = w.rwlock("rw").unwrap().write().await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _readers = queue(&case, "rw", 20, true, &tx).await;
    let state = w.inspect("rw").await.unwrap();
    assert_eq!(state.waiters.len(), 20, "{state:?}");
    // Dead readers in the first chunk the scripts read, across its end
    // and in the second one.
    let dead = [1, 4, 7, 8, 9, 15];
    let mut conn = raw().await;
    for &i in &dead {
        expire_session(&mut conn, &case, &state.waiters[i].session).await;
    }
    writer.release().await.unwrap();
    let live: Vec<usize> = (0..20).filter(|i| !dead.contains(i)).collect();
    assert_eq!(collect(&mut rx, live.len()).await, live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_skips_a_run_of_dead_waiters_longer_than_a_read() {
    let Some(h) = harness() else { return };
    let case = h.case();
    let a = case.client().await;
    let g = a.lock("m").unwrap().acquire().await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _waiters = queue(&case, "m", 14, false, &tx).await;
    let state = a.inspect("m").await.unwrap();
    let mut conn = raw().await;
    for w in &state.waiters[..11] {
        expire_session(&mut conn, &case, &w.session).await;
    }
    g.release().await.unwrap();
    // Only the first live waiter holds; the next two wait their turn.
    assert_eq!(collect(&mut rx, 1).await, [11]);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), rx.recv())
            .await
            .is_err(),
        "a second holder of a mutex"
    );
    let state = a.inspect("m").await.unwrap();
    assert_eq!(state.holders.len(), 1, "{state:?}");
    assert_eq!(state.waiters.len(), 2, "{state:?}");
}

/// Commands the server ran (scripts' calls included) over `f`.
async fn server_calls<F: std::future::Future<Output = ()>>(
    conn: &mut redis::aio::MultiplexedConnection,
    f: F,
) -> u64 {
    async fn total(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await
            .unwrap();
        info.lines()
            .filter_map(|l| {
                l.split_once("calls=")?
                    .1
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }
    let before = total(conn).await;
    f.await;
    total(conn).await - before
}

/// The calls of the scripts of one release and the grant it makes, with
/// `n` mutex waiters.
async fn one_handoff(h: &Harness, n: usize) -> u64 {
    let case = h.case();
    let a = case.client().await;
    let g = a.lock("h").unwrap().acquire().await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _waiters = queue(&case, "h", n, false, &tx).await;
    let mut conn = raw().await;
    let calls = server_calls(&mut conn, async {
        g.release().await.unwrap();
        assert_eq!(collect(&mut rx, 1).await, [0]);
    })
    .await;
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_costs_the_server_the_same_with_4_and_32_waiters() {
    let Some(h) = harness() else { return };
    let four = one_handoff(&h, 4).await;
    let many = one_handoff(&h, 32).await;
    eprintln!("server calls for one handoff: {four} with 4 waiters, {many} with 32");
    // Other tests' sessions may renew meanwhile (a few calls); a queue
    // read whole would cost ~7 calls per waiter.
    assert!(many <= four + 10, "{four} with 4 waiters, {many} with 32");
}
