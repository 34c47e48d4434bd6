//! Measures what the pipelined children listing saves on an uncontended
//! acquire (numbers in the README). Ignored by default; run with
//! `cargo test -p quorumlock-zk --release --test acquire_cost -- --ignored --nocapture`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quorumlock_core::LockClient;
use quorumlock_zk::{ZkBackend, ZkConfig};
use zookeeper_client as zk;

const CYCLES: u32 = 500;

fn url() -> Option<quorumlock_core::url::Url> {
    let raw = std::env::var("QUORUMLOCK_TEST_ZK_URL").ok()?;
    let mut u = quorumlock_core::url::parse(&raw).ok()?;
    u.set_path(&format!(
        "/qlt-cost-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    Some(u)
}

async fn ours(cfg: ZkConfig) -> (Duration, Duration) {
    // Lazy: no admin session; the lock session opens at the first acquire.
    let b = ZkBackend::from_config(cfg.with_lazy(true)).await.unwrap();
    let c = LockClient::new(Arc::new(b));
    let lock = c.lock("cost").unwrap();
    for _ in 0..20 {
        lock.try_acquire().await.unwrap().release().await.unwrap();
    }
    let (mut acq, mut total) = (Vec::new(), Vec::new());
    for _ in 0..CYCLES {
        let t0 = Instant::now();
        let g = lock.try_acquire().await.unwrap();
        let t1 = Instant::now();
        g.release().await.unwrap();
        acq.push(t1 - t0);
        total.push(t0.elapsed());
    }
    c.close().await;
    (median(acq), median(total))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn raw(cfg: &ZkConfig) -> (Duration, Duration) {
    let c = zk::Client::connect(&cfg.connect_string()).await.unwrap();
    let dir = format!("/{}-raw", cfg.namespace);
    let _ = c
        .create(
            &dir,
            &[],
            &zk::CreateMode::Container.with_acls(zk::Acls::anyone_all()),
        )
        .await;
    let opts = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let (mut rt, mut cd) = (Vec::new(), Vec::new());
    for _ in 0..CYCLES {
        let t0 = Instant::now();
        c.check_stat("/").await.unwrap();
        rt.push(t0.elapsed());
        let t0 = Instant::now();
        let (_, seq) = c.create(&format!("{dir}/n-"), &[], &opts).await.unwrap();
        c.delete(&format!("{dir}/n-{seq}"), None).await.unwrap();
        cd.push(t0.elapsed());
    }
    (median(rt), median(cd))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn pipelined_listing_saves_a_round_trip() {
    let Some(u) = url() else {
        eprintln!("SKIPPED: QUORUMLOCK_TEST_ZK_URL is not set");
        return;
    };
    let cfg = ZkConfig::from_url(&u).unwrap();
    let (rt, cd) = raw(&cfg).await;
    let mut off = cfg.clone();
    off.pipeline = false;
    // Alternate to spread machine noise over both.
    let mut on_r = Vec::new();
    let mut off_r = Vec::new();
    for _ in 0..4 {
        on_r.push(ours(cfg.clone()).await);
        off_r.push(ours(off.clone()).await);
    }
    eprintln!("raw: median read round trip {rt:?}, create+delete {cd:?}");
    eprintln!("pipelined  median (acquire, acquire+release): {on_r:?}");
    eprintln!("sequential median (acquire, acquire+release): {off_r:?}");
}
