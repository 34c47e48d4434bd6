//! After a quiet cycle, a repeat acquire of a lock this lease last held
//! alone is one plain put (no txn, no read): the cycle costs what the floor
//! costs. These tests show, on a real server, that it is used (the
//! server's own count of `Put` requests), that a write anywhere in between
//! costs one request and a busy cluster none, and that it never grants
//! while someone else is in line: not after another holder's key came
//! between our cycles, and not when our last grant shared the lock with a
//! reader of another client.
//!
//! Needs `QUORUMLOCK_TEST_ETCD_URL` (plain http: the counts come from the
//! server's `/metrics`).

use std::sync::Arc;

use conformance_tests::Harness;
use lockcore::{ErrorKind, LockClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The tests of this file count the server's requests: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn harness() -> Option<Harness> {
    // Long leases: no keepalive lands inside a counted window.
    Harness::from_env("QUORUMLOCK_TEST_ETCD_URL", |url| async move {
        Ok(Arc::new(backend_etcd::EtcdBackend::connect(&url).await?) as _)
    })
    .map(|h| h.with_option("ttl", "120s"))
}

/// How many `method` requests of the KV service the server has answered
/// with OK (its `grpc_server_handled_total`).
async fn served(h: &Harness, method: &str) -> u64 {
    let url = h.url_for("");
    let addr = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(2379));
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let ask = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    conn.write_all(ask.as_bytes()).await.unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).await.unwrap();
    let series = format!(
        "grpc_server_handled_total{{grpc_code=\"OK\",grpc_method=\"{method}\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"}} "
    );
    let line = body
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .unwrap_or_else(|| panic!("no {series} in the server's metrics"));
    line.trim().parse::<f64>().unwrap() as u64
}

/// One try-acquire and release of `name`; the requests it sent.
async fn cycle(client: &LockClient, name: &str) -> u64 {
    let before = client.backend().requests_sent();
    let g = client.lock(name).unwrap().try_acquire().await.unwrap();
    g.release().await.unwrap();
    client.backend().requests_sent() - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeat_cycles_are_one_put_and_one_release() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness() else { return };
    let case = h.case();
    let client = case.client().await;
    // 1st cycle: the enqueue txn; 2nd: the txn again, two revisions after
    // the 1st grant (a quiet cycle); from the 3rd on: the put.
    for _ in 0..2 {
        cycle(&client, "repeat").await;
    }
    let (puts, txns) = (served(&h, "Put").await, served(&h, "Txn").await);
    let mut sent = Vec::new();
    for _ in 0..20 {
        sent.push(cycle(&client, "repeat").await);
    }
    let puts = served(&h, "Put").await - puts;
    let txns = served(&h, "Txn").await - txns;
    eprintln!("requests per cycle: {sent:?}; the server saw {puts} puts and {txns} txns");
    // A write elsewhere on the server (an old lease expiring) may send a
    // cycle or two through the txn: most, not all.
    assert!(puts >= 16, "20 repeat cycles sent only {puts} puts");
    assert!(
        txns <= 24,
        "20 repeat cycles sent {txns} txns (releases are 20)"
    );
    assert!(sent.iter().filter(|n| **n == 2).count() >= 16, "{sent:?}");
    case.finish().await;
}

/// The put is tried only after a cycle that found the cluster quiet: a
/// write anywhere in between (here another client's lock) makes the
/// acquire read the lock after its put, one request more; with a write
/// before every cycle (a busy cluster) every acquire is the one txn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_between_costs_one_request_and_a_busy_cluster_none() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness() else { return };
    let case = h.case();
    let (ours, other) = (case.client().await, case.client().await);
    let write_elsewhere = || async {
        cycle(&other, "elsewhere").await;
    };
    cycle(&ours, "repeat").await;
    let mut after_write = Vec::new();
    for _ in 0..10 {
        cycle(&ours, "repeat").await;
        cycle(&ours, "repeat").await; // quiet: the next one puts
        write_elsewhere().await;
        after_write.push(cycle(&ours, "repeat").await);
    }
    let mut busy = Vec::new();
    for _ in 0..10 {
        write_elsewhere().await;
        busy.push(cycle(&ours, "repeat").await);
    }
    eprintln!("requests per cycle after a write: {after_write:?}, busy: {busy:?}");
    let threes = after_write.iter().filter(|n| **n == 3).count();
    assert!(threes >= 7, "cycles after another write: {after_write:?}");
    assert!(busy[1..].iter().all(|n| *n == 2), "busy cycles: {busy:?}");
    case.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_between_our_cycles_is_seen() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness() else { return };
    let case = h.case();
    let (ours, theirs) = (case.client().await, case.client().await);
    for _ in 0..3 {
        cycle(&ours, "between").await;
    }
    let held = theirs.lock("between").unwrap().try_acquire().await.unwrap();
    let err = ours
        .lock("between")
        .unwrap()
        .try_acquire()
        .await
        .expect_err("the other client holds it");
    assert_eq!(err.kind(), ErrorKind::WouldBlock);
    held.release().await.unwrap();
    // And after it, a cycle of ours is granted again.
    cycle(&ours, "between").await;
    case.finish().await;
}

/// Our grants that shared a read-write lock with another client's reader
/// found someone in line: however quiet the cycles, a later writer of ours
/// reads the lock and waits for that reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_we_shared_with_is_seen_by_our_writer() {
    let _serial = SERIAL.lock().await;
    let Some(h) = harness() else { return };
    let case = h.case();
    let (ours, theirs) = (case.client().await, case.client().await);
    let reading = theirs.rwlock("shared").unwrap().read().await.unwrap();
    let rw = ours.rwlock("shared").unwrap();
    for _ in 0..3 {
        rw.read().await.unwrap().release().await.unwrap();
    }
    let err = rw.try_write().await.expect_err("the other client reads");
    assert_eq!(err.kind(), ErrorKind::WouldBlock);
    reading.release().await.unwrap();
    rw.try_write().await.unwrap().release().await.unwrap();
    case.finish().await;
}
