//! After a quiet cycle, a repeat acquire of a lock this lease last held
//! alone is one put (a txn with compares only, no read): the cycle costs
//! what the floor costs. These tests show, on a real server, that it is
//! used (the server's own count of `Txn` requests), and that a write anywhere in
//! between costs one request and a busy cluster none
//! (`quorumlock_conformance::repeat`); and they run the conformance cases that
//! put someone else in line between our cycles one at a time, so that the
//! put is really tried: it never grants then.
//!
//! Needs `QUORUMLOCK_TEST_ETCD_URL` (plain http: the counts come from the
//! server's `/metrics`).

use std::sync::Arc;

use quorumlock_conformance::repeat::{cycle, reads_only_after_quiet_cycles, serially};
use quorumlock_conformance::Harness;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn harness() -> Option<Harness> {
    // Long leases: no keepalive lands inside a counted window.
    Harness::from_env("QUORUMLOCK_TEST_ETCD_URL", |url| async move {
        Ok(Arc::new(quorumlock_etcd::EtcdBackend::connect(&url).await?) as _)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeat_cycles_are_one_put_and_one_release() {
    let Some(h) = harness() else { return };
    serially(one_put_per_repeat_cycle(&h)).await;
}

async fn one_put_per_repeat_cycle(h: &Harness) {
    let case = h.case();
    let client = case.client().await;
    // 1st cycle: the enqueue txn; 2nd: the txn again, two revisions after
    // the 1st grant (a quiet cycle); from the 3rd on: the put.
    for _ in 0..2 {
        cycle(&client, "repeat").await;
    }
    let (puts, txns) = (served(h, "Put").await, served(h, "Txn").await);
    let mut sent = Vec::new();
    for _ in 0..20 {
        sent.push(cycle(&client, "repeat").await);
    }
    let puts = served(h, "Put").await - puts;
    let txns = served(h, "Txn").await - txns;
    eprintln!("requests per cycle: {sent:?}; the server saw {puts} puts and {txns} txns");
    // The put is a one-op txn guarded by compares only (the attempt's
    // fence is absent, the key is new): one request like the release. A
    // write elsewhere on the server (an old lease expiring) may send a
    // cycle or two through the enqueue txn as well: at most a few more.
    assert_eq!(puts, 0, "the guarded put is a txn");
    assert!(
        (40..=44).contains(&txns),
        "20 repeat cycles sent {txns} txns (puts and releases are 40)"
    );
    assert!(sent.iter().filter(|n| **n == 2).count() >= 16, "{sent:?}");
    case.finish().await;
}

/// The put is tried only after a cycle that found the cluster quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_between_costs_one_request_and_a_busy_cluster_none() {
    let Some(h) = harness() else { return };
    serially(reads_only_after_quiet_cycles(&h)).await;
}

quorumlock_conformance::quiet_repeat_suite!(harness());
