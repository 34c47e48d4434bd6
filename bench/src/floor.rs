//! The store's floor: the minimal write sequence of one lock cycle, done
//! with the same client library the backend uses, on the same server.

use std::time::{Duration, Instant};

use quorumlock::url::Url;

use crate::Histogram;

/// What the floor of a scheme is, in words, for the report.
pub fn describe(scheme: &str) -> &'static str {
    match scheme {
        "etcd" | "etcds" => "put(key, lease) + delete(key)",
        "zk" => "create(ephemeral sequential) + delete",
        "consul" | "consuls" => "txn lock + txn unlock, one session",
        _ => "none (in-process)",
    }
}

/// Times `cycles` floor cycles; `None` for stores without a network floor.
pub async fn measure(url: &Url, cycles: usize) -> Result<Option<Histogram>, String> {
    let host = url.host_str().unwrap_or("127.0.0.1").to_string();
    let port = url.port();
    match url.scheme() {
        "etcd" => etcd(&format!("http://{host}:{}", port.unwrap_or(2379)), cycles)
            .await
            .map(Some),
        "zk" => zk(&format!("{host}:{}", port.unwrap_or(2181)), cycles)
            .await
            .map(Some),
        "consul" => consul(&format!("http://{host}:{}", port.unwrap_or(8500)), cycles)
            .await
            .map(Some),
        _ => Ok(None),
    }
}

fn record(h: &mut Histogram, start: Instant) {
    h.record(start.elapsed().as_micros().max(1) as u64)
        .expect("in range");
}

async fn etcd(endpoint: &str, cycles: usize) -> Result<Histogram, String> {
    let mut c = etcd_client::Client::connect([endpoint], None)
        .await
        .map_err(|e| e.to_string())?;
    let lease = c
        .lease_grant(30, None)
        .await
        .map_err(|e| e.to_string())?
        .id();
    let key = format!("qlbench-floor/{lease:x}");
    let mut h = crate::histogram();
    for i in 0..cycles + crate::WARMUP {
        let t = Instant::now();
        let opts = etcd_client::PutOptions::new().with_lease(lease);
        c.put(key.as_str(), "", Some(opts))
            .await
            .map_err(|e| e.to_string())?;
        c.delete(key.as_str(), None)
            .await
            .map_err(|e| e.to_string())?;
        if i >= crate::WARMUP {
            record(&mut h, t);
        }
    }
    let _ = c.lease_revoke(lease).await;
    Ok(h)
}

async fn zk(cluster: &str, cycles: usize) -> Result<Histogram, String> {
    use zookeeper_client::{Acls, CreateMode};
    let c = zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(cluster)
        .await
        .map_err(|e| e.to_string())?;
    let parent = "/qlbench-floor";
    match c
        .create(
            parent,
            b"",
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
    {
        Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
        Err(e) => return Err(e.to_string()),
    }
    let prefix = format!("{parent}/n-");
    let opts = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let mut h = crate::histogram();
    for i in 0..cycles + crate::WARMUP {
        let t = Instant::now();
        let (_, seq) = c
            .create(&prefix, b"", &opts)
            .await
            .map_err(|e| e.to_string())?;
        c.delete(&format!("{prefix}{seq}"), None)
            .await
            .map_err(|e| e.to_string())?;
        if i >= crate::WARMUP {
            record(&mut h, t);
        }
    }
    let _ = c.delete(parent, None).await;
    Ok(h)
}

async fn consul(base: &str, cycles: usize) -> Result<Histogram, String> {
    let http = reqwest::Client::new();
    let err = |e: reqwest::Error| e.to_string();
    let session: serde_json::Value = http
        .put(format!("{base}/v1/session/create"))
        .json(&serde_json::json!({"TTL": "30s", "Behavior": "delete", "LockDelay": "0s", "Checks": []}))
        .send()
        .await
        .map_err(err)?
        .error_for_status()
        .map_err(err)?
        .json()
        .await
        .map_err(err)?;
    let id = session["ID"].as_str().ok_or("no session ID")?.to_string();
    let key = "qlbench-floor/.lock";
    let op = |verb: &str| serde_json::json!([{"KV": {"Verb": verb, "Key": key, "Session": id, "Flags": 0x2ddc_cbc0_58a5_0c18u64}}]);
    let mut h = crate::histogram();
    for i in 0..cycles + crate::WARMUP {
        let t = Instant::now();
        for verb in ["lock", "unlock"] {
            http.put(format!("{base}/v1/txn"))
                .json(&op(verb))
                .send()
                .await
                .map_err(err)?
                .error_for_status()
                .map_err(err)?;
        }
        if i >= crate::WARMUP {
            record(&mut h, t);
        }
    }
    let _ = http
        .put(format!("{base}/v1/session/destroy/{id}"))
        .send()
        .await;
    let _ = http.delete(format!("{base}/v1/kv/{key}")).send().await;
    Ok(h)
}
