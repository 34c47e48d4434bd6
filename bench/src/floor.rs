//! The store's floor: the minimal write sequence of one lock cycle, done
//! with the same client library the backend uses, on the same server.

use std::time::Duration;

use quorumlock::url::Url;

/// What the floor of a scheme is, in words, for the report.
pub fn describe(scheme: &str) -> &'static str {
    match scheme {
        "etcd" | "etcds" => "put(key, lease) + delete(key)",
        "zk" => "create(ephemeral sequential) + delete",
        "consul" | "consuls" => "txn lock + txn unlock, one session",
        "redis" | "rediss" => "SET key PX NX + DEL key (the naive Redis lock)",
        _ => "none (in-process)",
    }
}

/// A connection set up to run floor cycles, one at a time.
pub enum Floor {
    Etcd {
        client: Box<etcd_client::Client>,
        lease: i64,
        key: String,
    },
    Zk {
        client: zookeeper_client::Client,
        parent: String,
        prefix: String,
    },
    Consul(ConsulFloor),
    Redis {
        conn: redis::aio::MultiplexedConnection,
        key: String,
    },
}

/// A Consul agent, a session of the floor's own, and its `.lock` key.
pub struct ConsulFloor {
    http: reqwest::Client,
    base: String,
    session: String,
    key: String,
}

type Result<T> = std::result::Result<T, String>;

fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Floor {
    /// Connects for `url`'s store; `None` for stores without a network floor.
    pub async fn connect(url: &Url) -> Result<Option<Floor>> {
        let host = url.host_str().unwrap_or("127.0.0.1").to_string();
        let port = url.port();
        match url.scheme() {
            "etcd" => {
                let endpoint = format!("http://{host}:{}", port.unwrap_or(2379));
                let mut client = etcd_client::Client::connect([endpoint], None)
                    .await
                    .map_err(text)?;
                let lease = client.lease_grant(30, None).await.map_err(text)?.id();
                let key = format!("qlbench-floor/{lease:x}");
                Ok(Some(Floor::Etcd {
                    client: Box::new(client),
                    lease,
                    key,
                }))
            }
            "zk" => {
                use zookeeper_client::{Acls, CreateMode};
                let client = zookeeper_client::Client::connector()
                    .with_session_timeout(Duration::from_secs(10))
                    .connect(&format!("{host}:{}", port.unwrap_or(2181)))
                    .await
                    .map_err(text)?;
                let parent = "/qlbench-floor".to_string();
                let mode = CreateMode::Persistent.with_acls(Acls::anyone_all());
                match client.create(&parent, b"", &mode).await {
                    Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
                    Err(e) => return Err(e.to_string()),
                }
                let prefix = format!("{parent}/n-");
                Ok(Some(Floor::Zk {
                    client,
                    parent,
                    prefix,
                }))
            }
            "consul" => {
                let base = format!("http://{host}:{}", port.unwrap_or(8500));
                let http = reqwest::Client::new();
                let body = serde_json::json!({"TTL": "30s", "Behavior": "delete", "LockDelay": "0s", "Checks": []});
                let session: serde_json::Value = http
                    .put(format!("{base}/v1/session/create"))
                    .json(&body)
                    .send()
                    .await
                    .map_err(text)?
                    .error_for_status()
                    .map_err(text)?
                    .json()
                    .await
                    .map_err(text)?;
                let session = session["ID"].as_str().ok_or("no session ID")?.to_string();
                let key = format!("qlbench-floor/{session}/.lock");
                Ok(Some(Floor::Consul(ConsulFloor {
                    http,
                    base,
                    session,
                    key,
                })))
            }
            "redis" => {
                let url = format!("redis://{host}:{}", port.unwrap_or(6379));
                let client = redis::Client::open(url).map_err(text)?;
                let conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(text)?;
                let key = format!("qlbench-floor/{}", std::process::id());
                Ok(Some(Floor::Redis { conn, key }))
            }
            _ => Ok(None),
        }
    }

    /// One lock cycle at the floor: take, then give back.
    pub async fn cycle(&mut self) -> Result<()> {
        match self {
            Floor::Etcd { client, lease, key } => {
                let opts = etcd_client::PutOptions::new().with_lease(*lease);
                client
                    .put(key.as_str(), "", Some(opts))
                    .await
                    .map_err(text)?;
                client.delete(key.as_str(), None).await.map_err(text)?;
            }
            Floor::Zk { client, prefix, .. } => {
                use zookeeper_client::{Acls, CreateMode};
                let opts = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
                let (_, seq) = client.create(prefix, b"", &opts).await.map_err(text)?;
                client
                    .delete(&format!("{prefix}{seq}"), None)
                    .await
                    .map_err(text)?;
            }
            Floor::Consul(c) => {
                for verb in ["lock", "unlock"] {
                    // The flags `consul lock` puts on its `.lock`.
                    let op = serde_json::json!([{"KV": {"Verb": verb, "Key": c.key, "Session": c.session, "Flags": 0x2ddc_cbc0_58a5_0c18u64}}]);
                    c.http
                        .put(format!("{}/v1/txn", c.base))
                        .json(&op)
                        .send()
                        .await
                        .map_err(text)?
                        .error_for_status()
                        .map_err(text)?;
                }
            }
            Floor::Redis { conn, key } => {
                redis_op(conn, key, true).await?;
                redis_op(conn, key, false).await?;
            }
        }
        Ok(())
    }

    /// The floor of taking `count` distinct locks on one client and giving
    /// them back: `count` raw writes (etcd: put with the lease; ZooKeeper:
    /// create ephemeral; Consul: txn `lock`), `concurrency` in flight, then
    /// as many deletes (txn `unlock`). Seconds for each half.
    pub async fn scale(&self, count: usize, concurrency: usize) -> Result<(f64, f64)> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        let mut halves = [0.0; 2];
        for (half, secs) in halves.iter_mut().enumerate() {
            let t = std::time::Instant::now();
            stream::iter(0..count)
                .map(|i| self.scale_op(i, half == 0))
                .buffer_unordered(concurrency)
                .try_collect::<Vec<()>>()
                .await?;
            *secs = t.elapsed().as_secs_f64();
        }
        Ok((halves[0], halves[1]))
    }

    async fn scale_op(&self, i: usize, take: bool) -> Result<()> {
        match self {
            Floor::Etcd { client, lease, key } => {
                let mut kv = client.kv_client();
                let k = format!("{key}/s{i}");
                if take {
                    let opts = etcd_client::PutOptions::new().with_lease(*lease);
                    kv.put(k, "", Some(opts)).await.map_err(text)?;
                } else {
                    kv.delete(k, None).await.map_err(text)?;
                }
            }
            Floor::Zk { client, prefix, .. } => {
                use zookeeper_client::{Acls, CreateMode};
                let path = format!("{prefix}s{i}");
                if take {
                    let opts = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
                    client.create(&path, b"", &opts).await.map_err(text)?;
                } else {
                    client.delete(&path, None).await.map_err(text)?;
                }
            }
            Floor::Consul(c) => {
                let verb = if take { "lock" } else { "unlock" };
                let op = serde_json::json!([{"KV": {"Verb": verb, "Key": format!("{}/s{i}", c.key), "Session": c.session, "Flags": 0x2ddc_cbc0_58a5_0c18u64}}]);
                c.http
                    .put(format!("{}/v1/txn", c.base))
                    .json(&op)
                    .send()
                    .await
                    .map_err(text)?
                    .error_for_status()
                    .map_err(text)?;
            }
            Floor::Redis { conn, key } => {
                redis_op(&mut conn.clone(), &format!("{key}/s{i}"), take).await?;
            }
        }
        Ok(())
    }

    /// Removes what the floor left on the store.
    pub async fn close(self) {
        match self {
            Floor::Etcd {
                mut client, lease, ..
            } => {
                let _ = client.lease_revoke(lease).await;
            }
            Floor::Zk { client, parent, .. } => {
                let _ = client.delete(&parent, None).await;
            }
            Floor::Consul(c) => {
                let destroy = format!("{}/v1/session/destroy/{}", c.base, c.session);
                let _ = c.http.put(destroy).send().await;
                // `.lock` and the scale floor's keys under it.
                let _ = c
                    .http
                    .delete(format!("{}/v1/kv/{}?recurse=true", c.base, c.key))
                    .send()
                    .await;
            }
            Floor::Redis { .. } => {} // every key was deleted by its cycle
        }
    }
}

/// `SET key 1 PX 30000 NX` (take) or `DEL key` (give back).
async fn redis_op(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    take: bool,
) -> Result<()> {
    let cmd = if take {
        let mut c = redis::cmd("SET");
        c.arg(key).arg("1").arg("PX").arg(30_000).arg("NX");
        c
    } else {
        let mut c = redis::cmd("DEL");
        c.arg(key);
        c
    };
    cmd.query_async::<redis::Value>(conn).await.map_err(text)?;
    Ok(())
}
