//! The store's floor: the minimal write sequence of one lock cycle, done
//! with the same client library the backend uses, on the same server.

use std::time::Duration;

use quorumlock::url::Url;

/// What the floor of a scheme's uncontended cycle is, in words, for
/// the report: the same work as ours done raw, where the store's naive
/// lock is less ([`describe_naive`]).
pub fn describe(scheme: &str) -> &'static str {
    match scheme {
        "etcd" | "etcds" => "the same txns raw: put(key, lease) if the attempt's fence key is absent and the key new, then delete(key) if at its create revision",
        "zk" => "create(ephemeral sequential) + delete",
        "consul" | "consuls" => "the same txns raw: [check-not-exists .lock, lock .lock, check-not-exists queue key, check-not-exists fence key] + [check-index .lock, delete-cas .lock], one session",
        "redis" | "rediss" => "the same queue work raw: one script each way (session check, queue, entry, token, session's set; removal and head read)",
        "postgres" | "postgresql" => "the same queue work raw: one prepared statement each way (the queue's advisory lock, its entries counted, the session read alive with a key-share lock, the attempt's fence looked up, the entry with a timeline token; the entry deleted, the queue counted), tables with ours' indexes (not ours' trigger for followers, nor the release's read of the entry's kind)",
        _ => "none (in-process)",
    }
}

/// The store's naive lock, the second floor of the cycle, where it is
/// less work than ours: the plain writes without the guards.
pub fn describe_naive(scheme: &str) -> Option<&'static str> {
    match scheme {
        "etcd" | "etcds" => Some("put(key, lease) + delete(key)"),
        "consul" | "consuls" => Some("txn lock + txn unlock, one session"),
        "redis" | "rediss" => Some("SET key PX NX + DEL key (the naive Redis lock)"),
        "postgres" | "postgresql" => {
            Some("INSERT row + DELETE row (autocommit, prepared, one connection)")
        }
        _ => None,
    }
}

/// Which cycle a floor runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Work {
    /// The same work as ours, done raw ([`describe`]).
    Same,
    /// The store's naive lock ([`describe_naive`]).
    Naive,
}

/// The floors of the uncontended cycle, timed in turn with ours: the
/// same work done raw first (what the cycle is judged against), then
/// the naive lock where the store has one that is less work.
pub async fn cycle_floors(url: &Url) -> Result<Vec<Floor>> {
    let mut floors = Vec::new();
    for work in [Work::Same, Work::Naive] {
        if work == Work::Naive && describe_naive(url.scheme()).is_none() {
            break;
        }
        if let Some(mut f) = Floor::connect(url).await? {
            f.work = work;
            floors.push(f);
        }
    }
    Ok(floors)
}

/// A connection set up to run floor cycles, one at a time.
pub struct Floor {
    /// Which cycle [`Floor::cycle`] runs (the scale floors are the same
    /// either way).
    pub work: Work,
    conn: FloorConn,
}

/// A floor's connection to its store.
enum FloorConn {
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
        session: String,
    },
    Postgres {
        pg: PgFloor,
        same: PgSameWork,
        key: String,
    },
}

/// A raw connection with the floor's two statements prepared on it (one
/// round trip each, nothing parsed again), as the backend prepares its
/// steps.
pub(crate) struct PgFloor {
    client: tokio_postgres::Client,
    insert: tokio_postgres::Statement,
    delete: tokio_postgres::Statement,
}

/// The same-work floor's statements, prepared on a [`PgFloor`]'s
/// connection, and its session's id.
pub(crate) struct PgSameWork {
    take: tokio_postgres::Statement,
    give: tokio_postgres::Statement,
    session: String,
}

/// The numbers of the same-work floors' sessions and contenders in this
/// process ([`pg_uuid`]): a new contender per attempt, as ours (one used
/// again would make each insert's unique check visit every dead entry it
/// left).
static PG_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The same-work floor's tables and sequence, with the columns and
/// indexes of the backend's entries (written here, not taken from its
/// schema), and a session table (dropped by nobody: rows only while held,
/// and the floor's session while it runs).
const PG_SAME_WORK_TABLES: &str = "
CREATE SEQUENCE IF NOT EXISTS qlbench_seq;
CREATE TABLE IF NOT EXISTS qlbench_sessions (id uuid PRIMARY KEY, expires timestamptz NOT NULL);
CREATE TABLE IF NOT EXISTS qlbench_entries (
    lock text NOT NULL, seq bigint NOT NULL, contender uuid NOT NULL UNIQUE,
    session uuid NOT NULL, kind text NOT NULL, permits integer NOT NULL, token bigint,
    revoke boolean NOT NULL DEFAULT false,
    created timestamptz NOT NULL DEFAULT clock_timestamp(), value bytea NOT NULL,
    PRIMARY KEY (lock, seq));
CREATE INDEX IF NOT EXISTS qlbench_entries_session ON qlbench_entries (session);
CREATE TABLE IF NOT EXISTS qlbench_fences (contender uuid PRIMARY KEY, session uuid NOT NULL);
";

/// The same-work take: `$1` lock, `$2` contender, `$3` session, `$4`
/// value. The queue's advisory lock, then its entries counted, the
/// session read alive and held against its removal, the fence looked
/// up, and the entry inserted holding, with a token of the server's
/// timeline above the sequence's next value; the token, or no row.
/// One statement has one snapshot, taken before the advisory lock is:
/// its reads are not ordered after that lock as a correct lock's must
/// be (the backend's function reads in a statement after it). A floor of
/// the cost, not a lock; the correct raw form, a transaction of the lock
/// and then this, costs one more statement each way. The lock is an
/// uncorrelated `EXISTS`, which the server runs before the scan it
/// guards (in a join, the scan of a lock without entries could come
/// first and end it before the lock was taken).
const PG_SAME_TAKE: &str = "
WITH queue_lock AS MATERIALIZED (SELECT pg_advisory_xact_lock(7496294, hashtext($1))),
     queue AS (SELECT count(*) AS n FROM qlbench_entries e
               WHERE e.lock = $1 AND EXISTS (SELECT 1 FROM queue_lock)),
     alive AS (SELECT 1 FROM qlbench_sessions s
               WHERE s.id = $3::text::uuid AND s.expires > clock_timestamp() FOR KEY SHARE)
INSERT INTO qlbench_entries (lock, seq, contender, session, kind, permits, token, value)
SELECT $1, nextval('qlbench_seq'), $2::text::uuid, $3::text::uuid, 'x', 1,
       (('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint << 40)
         + nextval('qlbench_seq'), $4
  FROM queue, alive
 WHERE queue.n = 0
   AND NOT EXISTS (SELECT 1 FROM qlbench_fences f WHERE f.contender = $2::text::uuid)
RETURNING token";

/// The same-work give-back: `$1` lock, `$2` contender. The queue's
/// advisory lock, the entry deleted, the queue's entries counted (whom to
/// grant next; the statement's snapshot still has the deleted one): the
/// count deleted and that count.
const PG_SAME_GIVE: &str = "
WITH queue_lock AS MATERIALIZED (SELECT pg_advisory_xact_lock(7496294, hashtext($1))),
     gone AS (DELETE FROM qlbench_entries
              WHERE contender = $2::text::uuid AND EXISTS (SELECT 1 FROM queue_lock)
              RETURNING 1)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM qlbench_entries e WHERE e.lock = $1)";

/// The floor's own table (dropped by nobody: one row per lock while held).
const PG_TABLE: &str = "qlbench_floor";

/// The value the same-work floors write with a lock's key: as long as
/// the entry value of ours (kind, time, the default holder value).
const SAME_WORK_VALUE: &str = "x 1764400000000 bench-host:12345";

/// A Consul agent, a session of the floor's own, and its `.lock` key.
pub struct ConsulFloor {
    http: reqwest::Client,
    base: String,
    session: String,
    key: String,
}

pub(crate) type Result<T> = std::result::Result<T, String>;

pub(crate) fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Floor {
    /// Connects for `url`'s store, to run the same work as ours; `None`
    /// for stores without a network floor.
    pub async fn connect(url: &Url) -> Result<Option<Floor>> {
        Ok(Self::connect_conn(url).await?.map(|conn| Floor {
            work: Work::Same,
            conn,
        }))
    }

    async fn connect_conn(url: &Url) -> Result<Option<FloorConn>> {
        let Some(address) = raw_address(url) else {
            return Ok(None);
        };
        match url.scheme() {
            "etcd" => {
                let mut client = etcd_client::Client::connect([address], None)
                    .await
                    .map_err(text)?;
                let lease = client.lease_grant(30, None).await.map_err(text)?.id();
                let key = format!("qlbench-floor/{lease:x}");
                Ok(Some(FloorConn::Etcd {
                    client: Box::new(client),
                    lease,
                    key,
                }))
            }
            "zk" => {
                use zookeeper_client::{Acls, CreateMode};
                let client = zk_connect(&address).await?;
                let parent = "/qlbench-floor".to_string();
                let mode = CreateMode::Persistent.with_acls(Acls::anyone_all());
                match client.create(&parent, b"", &mode).await {
                    Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
                    Err(e) => return Err(e.to_string()),
                }
                let prefix = format!("{parent}/n-");
                Ok(Some(FloorConn::Zk {
                    client,
                    parent,
                    prefix,
                }))
            }
            "consul" => {
                let http = reqwest::Client::new();
                let session = consul_session(&http, &address).await?;
                let key = format!("qlbench-floor/{session}/.lock");
                Ok(Some(FloorConn::Consul(ConsulFloor {
                    http,
                    base: address,
                    session,
                    key,
                })))
            }
            "redis" => {
                let client = redis::Client::open(address).map_err(text)?;
                let conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(text)?;
                let key = format!("qlbench-floor/{}", std::process::id());
                // The floor's session key, as a client's (its TTL outlives the run).
                let session = format!("{key}/.session");
                redis::cmd("SET")
                    .arg(&session)
                    .arg("1")
                    .arg("PX")
                    .arg(600_000)
                    .query_async::<()>(&mut conn.clone())
                    .await
                    .map_err(text)?;
                Ok(Some(FloorConn::Redis { conn, key, session }))
            }
            "postgres" | "postgresql" => {
                let pg = pg_prepare(pg_connect(url).await?).await?;
                let same = pg_prepare_same_work(&pg.client).await?;
                let key = format!("qlbench-floor/{}", std::process::id());
                Ok(Some(FloorConn::Postgres { pg, same, key }))
            }
            _ => Ok(None),
        }
    }

    /// The server's time spent running scripts so far, in µs, where the
    /// store reports it: Redis's `INFO commandstats`, the `usec` of
    /// `EVAL`, `EVALSHA` and `FCALL` (with the commands a script calls,
    /// which are also counted on their own lines, so those are left out),
    /// not counting the time requests wait to be read or answered. Both
    /// the floor's cycle and ours are one script each way. `None`
    /// elsewhere.
    pub async fn server_busy_us(&mut self) -> Result<Option<u64>> {
        let FloorConn::Redis { conn, .. } = &mut self.conn else {
            return Ok(None);
        };
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await
            .map_err(text)?;
        Ok(Some(
            info.lines()
                .filter(|l| {
                    ["cmdstat_eval", "cmdstat_fcall"]
                        .iter()
                        .any(|p| l.starts_with(p))
                })
                .filter_map(|l| l.split(',').find_map(|f| f.strip_prefix("usec=")))
                .filter_map(|v| v.parse::<u64>().ok())
                .sum(),
        ))
    }

    /// One lock cycle at the floor: take, then give back.
    pub async fn cycle(&mut self) -> Result<()> {
        match (&mut self.conn, self.work) {
            (FloorConn::Etcd { client, lease, key }, Work::Naive) => {
                let opts = etcd_client::PutOptions::new().with_lease(*lease);
                client
                    .put(key.as_str(), "", Some(opts))
                    .await
                    .map_err(text)?;
                client.delete(key.as_str(), None).await.map_err(text)?;
            }
            (FloorConn::Etcd { client, lease, key }, Work::Same) => {
                // After a quiet cycle ours is the put alone, no read.
                let mut kv = client.kv_client();
                let rev = etcd_same_take(&mut kv, *lease, key, false).await?;
                etcd_same_give(&mut kv, key, rev).await?;
            }
            (FloorConn::Zk { client, prefix, .. }, _) => {
                use zookeeper_client::{Acls, CreateMode};
                let opts = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
                let (_, seq) = client.create(prefix, b"", &opts).await.map_err(text)?;
                client
                    .delete(&format!("{prefix}{seq}"), None)
                    .await
                    .map_err(text)?;
            }
            (FloorConn::Consul(c), Work::Naive) => {
                for verb in ["lock", "unlock"] {
                    consul_txn(&c.http, &c.base, verb, &c.key, &c.session).await?;
                }
            }
            (FloorConn::Consul(c), Work::Same) => {
                // After a quiet cycle ours reads nothing in its take.
                let index = consul_same_take(c, &c.key, false).await?;
                consul_same_give(c, &c.key, index).await?;
            }
            (FloorConn::Redis { conn, key, session }, Work::Same) => {
                redis_queue_op(conn, key, session, "c", true).await?;
                redis_queue_op(conn, key, session, "c", false).await?;
            }
            (FloorConn::Redis { conn, key, .. }, Work::Naive) => {
                redis_op(conn, key, true).await?;
                redis_op(conn, key, false).await?;
            }
            (FloorConn::Postgres { pg, key, .. }, Work::Naive) => {
                pg_op(pg, key, true).await?;
                pg_op(pg, key, false).await?;
            }
            (FloorConn::Postgres { pg, same, key }, Work::Same) => {
                let contender = pg_same_take(pg, same, key).await?;
                pg_same_give(pg, same, key, contender).await?;
            }
        }
        Ok(())
    }

    /// The floor of taking `count` distinct locks on one client and giving
    /// them back, `concurrency` in flight: [`Work::Same`], the requests
    /// ours sends for a lock it never took before, done raw (etcd: the
    /// put guarded as ours, with Go's read of the oldest contender in its
    /// txn; Consul: the take of a free `.lock` with ours' checks and its
    /// read of the lock's keys; then the guarded deletes); [`Work::Naive`]
    /// the plain writes (etcd: put with the lease; Consul: txn `lock`,
    /// then `unlock`; Redis: `SET NX`, then `DEL`; PostgreSQL: `INSERT`,
    /// then `DELETE`). ZooKeeper: create ephemeral, then delete; Redis and
    /// PostgreSQL's same work: their same-work statements.
    /// Seconds for each half.
    pub async fn scale(&self, count: usize, concurrency: usize) -> Result<(f64, f64)> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        let t = std::time::Instant::now();
        let taken: Vec<(usize, u64)> = stream::iter(0..count)
            .map(|i| async move { Ok::<_, String>((i, self.scale_take(i).await?)) })
            .buffer_unordered(concurrency)
            .try_collect()
            .await?;
        let take_secs = t.elapsed().as_secs_f64();
        Ok((take_secs, self.scale_give_all(taken, concurrency).await?))
    }

    /// Gives back every lock of `taken` (each with what its take
    /// answered), `concurrency` in flight: seconds.
    async fn scale_give_all(&self, taken: Vec<(usize, u64)>, concurrency: usize) -> Result<f64> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        let t = std::time::Instant::now();
        stream::iter(taken)
            .map(|(i, at)| self.scale_give(i, at))
            .buffer_unordered(concurrency)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(t.elapsed().as_secs_f64())
    }

    /// [`Self::scale`], each take followed by the watch that a held
    /// lock's loss signal needs where that is a request of its own, as the
    /// backends send it: on etcd a watch of the key from its put's
    /// revision on, on one watch stream (sent, not waited for: the backend
    /// does not wait for its own); on ZooKeeper an exists watch on the
    /// node. The give-back half is the same deletes. `None` for the other
    /// stores.
    pub async fn scale_watched(
        &self,
        count: usize,
        concurrency: usize,
    ) -> Result<Option<(f64, f64)>> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        let stream = match &self.conn {
            FloorConn::Etcd { client, key, .. } => {
                let mut watch = client.watch_client();
                let stream = watch.watch(format!("{key}/w"), None).await.map_err(text)?;
                let (sender, mut responses) = stream.split();
                // Read, so the stream stays open and flows.
                let reader =
                    tokio::spawn(
                        async move { while let Ok(Some(_)) = responses.message().await {} },
                    );
                Some((tokio::sync::Mutex::new(sender), reader))
            }
            FloorConn::Zk { .. } => None,
            _ => return Ok(None),
        };
        let sender = stream.as_ref().map(|(s, _)| s);
        let t = std::time::Instant::now();
        let taken: Vec<(usize, u64)> = stream::iter(0..count)
            .map(|i| async move {
                let at = self.scale_take(i).await?;
                match &self.conn {
                    FloorConn::Etcd { key, .. } => {
                        let k = etcd_scale_key(key, i);
                        let from =
                            etcd_client::WatchOptions::new().with_start_revision(at as i64 + 1);
                        let sender = sender.ok_or("no watch stream")?;
                        sender
                            .lock()
                            .await
                            .watch(k, Some(from))
                            .await
                            .map_err(text)?;
                    }
                    FloorConn::Zk { client, prefix, .. } => {
                        let path = format!("{prefix}s{i}");
                        client.check_and_watch_stat(&path).await.map_err(text)?;
                    }
                    _ => {}
                }
                Ok::<_, String>((i, at))
            })
            .buffer_unordered(concurrency)
            .try_collect()
            .await?;
        let take_secs = t.elapsed().as_secs_f64();
        let give_secs = self.scale_give_all(taken, concurrency).await?;
        if let Some((_, reader)) = stream {
            reader.abort();
        }
        Ok(Some((take_secs, give_secs)))
    }

    /// Takes the `i`th lock of [`Self::scale`]: the revision or index
    /// its give-back checks (0 where none is).
    async fn scale_take(&self, i: usize) -> Result<u64> {
        match (&self.conn, self.work) {
            (FloorConn::Etcd { client, lease, key }, Work::Same) => {
                let k = etcd_scale_key(key, i);
                let rev = etcd_same_take(&mut client.kv_client(), *lease, &k, true).await?;
                Ok(rev as u64)
            }
            (FloorConn::Etcd { client, lease, key }, Work::Naive) => {
                let k = etcd_scale_key(key, i);
                let opts = etcd_client::PutOptions::new().with_lease(*lease);
                let put = client.kv_client().put(k, "", Some(opts)).await;
                Ok(put.map_err(text)?.header().map_or(0, |h| h.revision()) as u64)
            }
            (FloorConn::Zk { client, prefix, .. }, _) => {
                use zookeeper_client::{Acls, CreateMode};
                let opts = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
                let path = format!("{prefix}s{i}");
                client.create(&path, b"", &opts).await.map_err(text)?;
                Ok(0)
            }
            (FloorConn::Consul(c), Work::Same) => {
                consul_same_take(c, &format!("{}/s{i}/.lock", c.key), true).await
            }
            (FloorConn::Consul(c), Work::Naive) => {
                let key = format!("{}/s{i}", c.key);
                consul_txn(&c.http, &c.base, "lock", &key, &c.session).await
            }
            (FloorConn::Redis { conn, key, session }, Work::Same) => {
                let lock = format!("{key}/s{i}");
                redis_queue_op(&mut conn.clone(), &lock, session, "c", true).await?;
                Ok(0)
            }
            (FloorConn::Redis { conn, key, .. }, Work::Naive) => {
                redis_op(&mut conn.clone(), &format!("{key}/n{i}"), true).await?;
                Ok(0)
            }
            (FloorConn::Postgres { pg, key, .. }, Work::Naive) => {
                pg_op(pg, &format!("{key}/n{i}"), true).await?;
                Ok(0)
            }
            (FloorConn::Postgres { pg, same, key }, Work::Same) => {
                pg_same_take(pg, same, &format!("{key}/s{i}")).await
            }
        }
    }

    /// Gives back the `i`th lock of [`Self::scale`], taken at `at`.
    async fn scale_give(&self, i: usize, at: u64) -> Result<()> {
        match (&self.conn, self.work) {
            (FloorConn::Etcd { client, key, .. }, Work::Same) => {
                let k = etcd_scale_key(key, i);
                etcd_same_give(&mut client.kv_client(), &k, at as i64).await?;
            }
            (FloorConn::Etcd { client, key, .. }, Work::Naive) => {
                let k = etcd_scale_key(key, i);
                client.kv_client().delete(k, None).await.map_err(text)?;
            }
            (FloorConn::Zk { client, prefix, .. }, _) => {
                let path = format!("{prefix}s{i}");
                client.delete(&path, None).await.map_err(text)?;
            }
            (FloorConn::Consul(c), Work::Same) => {
                consul_same_give(c, &format!("{}/s{i}/.lock", c.key), at).await?;
            }
            (FloorConn::Consul(c), Work::Naive) => {
                let key = format!("{}/s{i}", c.key);
                consul_txn(&c.http, &c.base, "unlock", &key, &c.session).await?;
            }
            (FloorConn::Redis { conn, key, session }, Work::Same) => {
                let lock = format!("{key}/s{i}");
                redis_queue_op(&mut conn.clone(), &lock, session, "c", false).await?;
            }
            (FloorConn::Redis { conn, key, .. }, Work::Naive) => {
                redis_op(&mut conn.clone(), &format!("{key}/n{i}"), false).await?;
            }
            (FloorConn::Postgres { pg, key, .. }, Work::Naive) => {
                pg_op(pg, &format!("{key}/n{i}"), false).await?;
            }
            (FloorConn::Postgres { pg, same, key }, Work::Same) => {
                pg_same_give(pg, same, &format!("{key}/s{i}"), at).await?;
            }
        }
        Ok(())
    }

    /// Removes what the floor left on the store.
    pub async fn close(self) {
        match self.conn {
            FloorConn::Etcd {
                mut client, lease, ..
            } => {
                let _ = client.lease_revoke(lease).await;
            }
            FloorConn::Zk { client, parent, .. } => {
                let _ = client.delete(&parent, None).await;
            }
            FloorConn::Consul(c) => {
                let destroy = format!("{}/v1/session/destroy/{}", c.base, c.session);
                let _ = c.http.put(destroy).send().await;
                // `.lock` and the scale floor's keys under it.
                let _ = c
                    .http
                    .delete(format!("{}/v1/kv/{}?recurse=true", c.base, c.key))
                    .send()
                    .await;
            }
            FloorConn::Redis {
                mut conn,
                key,
                session,
            } => {
                // Every queue was emptied by its cycle; the counters, the
                // session and its set are left. Found by `SCAN` (`KEYS`
                // would hold the server for the whole keyspace at once).
                let mut keys = vec![session];
                if let Ok(mut found) =
                    redis::AsyncCommands::scan_match::<_, String>(&mut conn, format!("{key}*"))
                        .await
                {
                    while let Some(Ok(k)) = futures::StreamExt::next(&mut found).await {
                        keys.push(k);
                    }
                }
                for some in keys.chunks(512) {
                    let _ = redis::cmd("DEL")
                        .arg(some)
                        .query_async::<()>(&mut conn)
                        .await;
                }
            }
            // Every entry was deleted by its cycle; the session goes.
            FloorConn::Postgres { pg, same, .. } => {
                let _ = pg
                    .client
                    .execute(
                        "DELETE FROM qlbench_sessions WHERE id = $1::text::uuid",
                        &[&same.session],
                    )
                    .await;
            }
        }
    }
}

/// The raw connection settings of a `postgres://` URL: its host, port,
/// user, password and database.
pub(crate) fn pg_config(url: &Url) -> Result<tokio_postgres::Config> {
    let c = quorumlock::postgres::PostgresConfig::from_url(url).map_err(text)?;
    let mut pg = tokio_postgres::Config::new();
    pg.host(&c.host)
        .port(c.port)
        .user(&c.user)
        .dbname(&c.database);
    if let Some(pw) = &c.password {
        pg.password(pw.expose());
    }
    Ok(pg)
}

/// A raw connection to the server of a `postgres://` URL, driven by a
/// task of its own.
async fn pg_connect(url: &Url) -> Result<tokio_postgres::Client> {
    let pg = pg_config(url)?;
    let (client, connection) = pg.connect(tokio_postgres::NoTls).await.map_err(pg_text)?;
    tokio::spawn(connection);
    Ok(client)
}

/// The floor's table made if missing, and its two statements prepared on
/// `client`.
async fn pg_prepare(client: tokio_postgres::Client) -> Result<PgFloor> {
    client
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {PG_TABLE} (name text PRIMARY KEY)"
        ))
        .await
        .map_err(pg_text)?;
    let insert = format!("INSERT INTO {PG_TABLE} (name) VALUES ($1)");
    let delete = format!("DELETE FROM {PG_TABLE} WHERE name = $1");
    Ok(PgFloor {
        insert: client.prepare(&insert).await.map_err(pg_text)?,
        delete: client.prepare(&delete).await.map_err(pg_text)?,
        client,
    })
}

/// The same-work floor's tables made if missing, its session written
/// (alive for an hour; a row a failed run of a process with the same id
/// left is taken over), its statements prepared on `client`, planned as
/// the backend's functions are: kept from scans that return every dead
/// entry of a busy lock (`enable_seqscan` and `enable_bitmapscan` off),
/// and planned once (`plan_cache_mode = force_generic_plan`).
async fn pg_prepare_same_work(client: &tokio_postgres::Client) -> Result<PgSameWork> {
    client
        .batch_execute(&format!(
            "{PG_SAME_WORK_TABLES} SET enable_seqscan = off; SET enable_bitmapscan = off; \
             SET plan_cache_mode = force_generic_plan;"
        ))
        .await
        .map_err(pg_text)?;
    let session = pg_uuid(PG_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    client
        .execute(
            "INSERT INTO qlbench_sessions (id, expires) \
             VALUES ($1::text::uuid, clock_timestamp() + interval '1 hour') \
             ON CONFLICT (id) DO UPDATE SET expires = excluded.expires",
            &[&session],
        )
        .await
        .map_err(pg_text)?;
    Ok(PgSameWork {
        take: client.prepare(PG_SAME_TAKE).await.map_err(pg_text)?,
        give: client.prepare(PG_SAME_GIVE).await.map_err(pg_text)?,
        session,
    })
}

/// A PostgreSQL error with the server's message (its `Display` alone is
/// "db error").
pub(crate) fn pg_text(e: tokio_postgres::Error) -> String {
    e.as_db_error()
        .map_or_else(|| e.to_string(), ToString::to_string)
}

/// A UUID of this process and `n`, as text.
fn pg_uuid(n: u64) -> String {
    let pid = std::process::id();
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        pid,
        (n >> 48) & 0xffff,
        (n >> 36) & 0xfff,
        (n >> 24) & 0xfff,
        n & 0xff_ffff
    )
}

/// Takes `lock` with the same work as ours, with a new contender:
/// the contender's number, for [`pg_same_give`].
async fn pg_same_take(pg: &PgFloor, same: &PgSameWork, lock: &str) -> Result<u64> {
    let n = PG_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let contender = pg_uuid(n);
    let value = SAME_WORK_VALUE.as_bytes();
    let rows = pg
        .client
        .query(&same.take, &[&lock, &contender, &same.session, &value])
        .await
        .map_err(pg_text)?;
    match rows.first().map(|r| r.get::<_, i64>(0)) {
        Some(token) if token > 0 => Ok(n),
        other => Err(format!("the same-work take of {lock} answered {other:?}")),
    }
}

/// Gives back `lock`, taken by contender number `n`.
async fn pg_same_give(pg: &PgFloor, same: &PgSameWork, lock: &str, n: u64) -> Result<()> {
    let row = pg
        .client
        .query_one(&same.give, &[&lock, &pg_uuid(n)])
        .await
        .map_err(pg_text)?;
    match row.get::<_, i64>(0) {
        1 => Ok(()),
        gone => Err(format!("the same-work give-back of {lock} deleted {gone}")),
    }
}

/// `INSERT` the lock's row (take) or `DELETE` it (give back), each its
/// own autocommit statement, prepared.
async fn pg_op(pg: &PgFloor, key: &str, take: bool) -> Result<()> {
    let statement = if take { &pg.insert } else { &pg.delete };
    let n = pg
        .client
        .execute(statement, &[&key])
        .await
        .map_err(pg_text)?;
    if n != 1 {
        return Err(format!("{take:?}: {n} rows"));
    }
    Ok(())
}

/// The work of an uncontended grant and of its release on Redis, raw: one
/// script each way, with the commands a queue lock needs and nothing of
/// quorumlock's (written here from that list, not taken from its
/// scripts). Take: the session key checked, the attempt's fence looked
/// up, the queue's head read, a sequence number, the entry queued and
/// recorded, the session's set of entries and its expiry, the token.
/// Give back: the entry read, removed from the queue, the record and the
/// session's set, the new head read.
const REDIS_TAKE: &str = r"
local L, s, id = KEYS[1], KEYS[2], ARGV[1]
if redis.call('EXISTS', s) == 0 then return redis.error_reply('no session') end
redis.call('ZSCORE', s .. '/.fenced', id)
redis.call('ZRANGE', L .. '/.q', 0, 0)
local seq = redis.call('INCR', L .. '/.n')
redis.call('ZADD', L .. '/.q', seq, id)
redis.call('HSET', L .. '/.e', id, seq)
redis.call('SADD', s .. '/.locks', L .. '/.q/' .. id)
redis.call('PEXPIRE', s .. '/.locks', redis.call('PTTL', s) + 10000)
local token = redis.call('INCR', L .. '/.t')
redis.call('HSET', L .. '/.e', id, token)
return token
";
const REDIS_GIVE: &str = r"
local L, s, id = KEYS[1], KEYS[2], ARGV[1]
redis.call('HGET', L .. '/.e', id)
redis.call('ZREM', L .. '/.q', id)
redis.call('HDEL', L .. '/.e', id)
redis.call('SREM', s .. '/.locks', L .. '/.q/' .. id)
redis.call('ZRANGE', L .. '/.q', 0, 0)
return 1
";

/// One take or give back of the same-work floor (by EVALSHA).
async fn redis_queue_op(
    conn: &mut redis::aio::MultiplexedConnection,
    lock: &str,
    session: &str,
    id: &str,
    take: bool,
) -> Result<()> {
    static SCRIPTS: std::sync::LazyLock<[redis::Script; 2]> = std::sync::LazyLock::new(|| {
        [
            redis::Script::new(REDIS_TAKE),
            redis::Script::new(REDIS_GIVE),
        ]
    });
    let script = &SCRIPTS[usize::from(!take)];
    script
        .key(lock)
        .key(session)
        .arg(id)
        .invoke_async::<redis::Value>(conn)
        .await
        .map_err(text)?;
    Ok(())
}

/// `SET key 1 PX 30000 NX` (take) or `DEL key` (give back): the naive
/// Redis lock.
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

/// What the floor of one handoff is, in words, for the report.
pub fn describe_handoff(scheme: &str) -> Option<&'static str> {
    match scheme {
        "etcd" | "etcds" => Some("delete seen by a watcher, then its put(key, lease)"),
        "zk" => Some("delete seen by an exists watch, then its create(ephemeral)"),
        "consul" | "consuls" => Some("txn unlock seen by a blocking read, then its txn lock"),
        "postgres" | "postgresql" => {
            Some("DELETE + NOTIFY (one prepared statement) seen by a LISTEN, then its INSERT")
        }
        _ => None,
    }
}

/// The floor of a handoff: two raw clients of the store pass one key back
/// and forth `count` times (after [`crate::WARMUP`] untimed ones). The
/// waiter watches the key before the holder lets go; each figure is the
/// time from the holder's release starting to the waiter's own write
/// being acknowledged, as the handoff gap of ours is. `None` for stores
/// without a watch in their raw lock (Redis's naive lock polls).
pub async fn handoffs(url: &Url, count: usize) -> Result<Option<crate::Histogram>> {
    let Some(address) = raw_address(url) else {
        return Ok(None);
    };
    let key = format!("qlbench-floor/handoff-{}", std::process::id());
    match url.scheme() {
        "etcd" => etcd_handoffs(address, key, count).await.map(Some),
        "zk" => zk_handoffs(address, count).await.map(Some),
        "consul" => consul_handoffs(address, key, count).await.map(Some),
        "postgres" | "postgresql" => pg_handoffs(url, key, count, 0).await.map(Some),
        _ => Ok(None),
    }
}

/// The PostgreSQL handoff floor with `others` more connections listening
/// on channels of their own, idle, as each client's session listens on
/// its own: whether the server's `NOTIFY` costs grow with the listeners
/// of the database, not of the channel. `None` on other stores.
pub async fn pg_handoffs_among(
    url: &Url,
    count: usize,
    others: usize,
) -> Result<Option<crate::Histogram>> {
    if !matches!(url.scheme(), "postgres" | "postgresql") {
        return Ok(None);
    }
    let key = format!("qlbench-floor/handoff-among-{}", std::process::id());
    pg_handoffs(url, key, count, others).await.map(Some)
}

/// The address a raw client of `url`'s store connects to (its own
/// library's form, the store's default port); `None` for stores without
/// a network floor.
pub(crate) fn raw_address(url: &Url) -> Option<String> {
    let host = url.host_str().unwrap_or("127.0.0.1");
    let port = url.port();
    Some(match url.scheme() {
        "etcd" => format!("http://{host}:{}", port.unwrap_or(2379)),
        "zk" => format!("{host}:{}", port.unwrap_or(2181)),
        "consul" => format!("http://{host}:{}", port.unwrap_or(8500)),
        "redis" => format!("redis://{host}:{}", port.unwrap_or(6379)),
        "postgres" | "postgresql" => format!("{host}:{}", port.unwrap_or(5432)),
        _ => return None,
    })
}

/// Runs `count` timed handoffs (after the warm-up) between party 0 and
/// party 1, party 0 holding first: `handoff(holder, waiter)` releases and
/// takes, returning the time from the release starting to the take.
async fn ping_pong<P, F>(
    parties: &mut [P; 2],
    count: usize,
    mut handoff: F,
) -> Result<crate::Histogram>
where
    F: for<'a> FnMut(&'a mut P, &'a mut P) -> futures::future::BoxFuture<'a, Result<Duration>>,
{
    let mut h = crate::histogram();
    for i in 0..count + crate::WARMUP {
        let [a, b] = parties;
        let gap = if i % 2 == 0 {
            handoff(a, b).await?
        } else {
            handoff(b, a).await?
        };
        if i >= crate::WARMUP {
            h.record(gap.as_micros().max(1) as u64).map_err(text)?;
        }
    }
    Ok(h)
}

/// One side of the etcd handoff floor: a client, its lease, a watch on
/// the key for the whole run, and the revision of its last take.
struct EtcdParty {
    client: etcd_client::Client,
    lease: i64,
    watch: etcd_client::WatchStream,
    taken_at: i64,
}

async fn etcd_handoffs(endpoint: String, key: String, count: usize) -> Result<crate::Histogram> {
    let mut parties = Vec::new();
    for _ in 0..2 {
        let mut client = etcd_client::Client::connect([endpoint.clone()], None)
            .await
            .map_err(text)?;
        let lease = client.lease_grant(30, None).await.map_err(text)?.id();
        let mut watch = client.watch(key.as_str(), None).await.map_err(text)?;
        // Created before anyone writes: a synced watcher.
        watch.message().await.map_err(text)?;
        parties.push(EtcdParty {
            client,
            lease,
            watch,
            taken_at: 0,
        });
    }
    let mut parties: [EtcdParty; 2] = parties.try_into().map_err(|_| "two parties")?;
    let opts = etcd_client::PutOptions::new().with_lease(parties[0].lease);
    let put = parties[0].client.put(key.as_str(), "", Some(opts)).await;
    parties[0].taken_at = put.map_err(text)?.header().map_or(0, |h| h.revision());
    let key2 = key.clone();
    let h = ping_pong(&mut parties, count, move |holder, waiter| {
        let key = key2.clone();
        Box::pin(async move {
            let t = std::time::Instant::now();
            let since = holder.taken_at;
            let release = async { holder.client.delete(key.as_str(), None).await.map_err(text) };
            let take = async {
                // The holder's delete: an event after its take.
                loop {
                    let m = waiter.watch.message().await.map_err(text)?;
                    let m = m.ok_or("the watch ended")?;
                    if m.events().iter().any(|e| {
                        e.event_type() == etcd_client::EventType::Delete
                            && e.kv().is_some_and(|kv| kv.mod_revision() > since)
                    }) {
                        break;
                    }
                }
                let opts = etcd_client::PutOptions::new().with_lease(waiter.lease);
                let put = waiter.client.put(key.as_str(), "", Some(opts)).await;
                waiter.taken_at = put.map_err(text)?.header().map_or(0, |h| h.revision());
                Ok::<_, String>(t.elapsed())
            };
            let (_, gap) = tokio::try_join!(release, take)?;
            Ok(gap)
        })
    })
    .await;
    for p in &mut parties {
        let _ = p.client.lease_revoke(p.lease).await;
    }
    h
}

async fn zk_handoffs(endpoint: String, count: usize) -> Result<crate::Histogram> {
    use zookeeper_client::{Acls, CreateMode};
    let mut parties = Vec::new();
    for _ in 0..2 {
        parties.push(zk_connect(&endpoint).await?);
    }
    let mut parties: [zookeeper_client::Client; 2] =
        parties.try_into().map_err(|_| "two parties")?;
    let parent = "/qlbench-floor";
    let mode = CreateMode::Persistent.with_acls(Acls::anyone_all());
    match parties[0].create(parent, b"", &mode).await {
        Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
        Err(e) => return Err(e.to_string()),
    }
    let node = format!("{parent}/handoff-{}", std::process::id());
    let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
    parties[0]
        .create(&node, b"", &ephemeral)
        .await
        .map_err(text)?;
    let node2 = node.clone();
    let h = ping_pong(&mut parties, count, move |holder, waiter| {
        let node = node2.clone();
        let ephemeral = ephemeral.clone();
        Box::pin(async move {
            // The waiter's watch is set before the release, as ours is.
            let (stat, watcher) = waiter.check_and_watch_stat(&node).await.map_err(text)?;
            stat.ok_or("the holder's node is missing")?;
            let t = std::time::Instant::now();
            let release = async { holder.delete(&node, None).await.map_err(text) };
            let take = async {
                watcher.changed().await;
                waiter.create(&node, b"", &ephemeral).await.map_err(text)?;
                Ok::<_, String>(t.elapsed())
            };
            let (_, gap) = tokio::try_join!(release, take)?;
            Ok(gap)
        })
    })
    .await;
    for p in parties {
        let _ = p.delete(&node, None).await;
        let _ = p.delete(parent, None).await;
    }
    h
}

/// One side of the Consul handoff floor: its session, and the index of
/// its last take.
struct ConsulParty {
    session: String,
    taken_at: u64,
}

async fn consul_handoffs(base: String, key: String, count: usize) -> Result<crate::Histogram> {
    let http = reqwest::Client::new();
    let mut parties = Vec::new();
    for _ in 0..2 {
        parties.push(ConsulParty {
            session: consul_session(&http, &base).await?,
            taken_at: 0,
        });
    }
    let mut parties: [ConsulParty; 2] = parties.try_into().map_err(|_| "two parties")?;
    let key = format!("{key}/.lock");
    let first = parties[0].session.clone();
    parties[0].taken_at = consul_txn(&http, &base, "lock", &key, &first).await?;
    let (http2, base2, key2) = (http.clone(), base.clone(), key.clone());
    let h = ping_pong(&mut parties, count, move |holder, waiter| {
        let (http, base, key) = (http2.clone(), base2.clone(), key2.clone());
        Box::pin(async move {
            let t = std::time::Instant::now();
            let release = consul_txn(&http, &base, "unlock", &key, &holder.session);
            let take = async {
                // A blocking read from the holder's take: it returns once
                // the key moved past it.
                let url = format!("{base}/v1/kv/{key}?index={}&wait=10s", holder.taken_at);
                http.get(url)
                    .send()
                    .await
                    .map_err(text)?
                    .error_for_status()
                    .map_err(text)?;
                let at = consul_txn(&http, &base, "lock", &key, &waiter.session).await?;
                Ok::<_, String>((at, t.elapsed()))
            };
            let (_, (at, gap)) = tokio::try_join!(release, take)?;
            waiter.taken_at = at;
            Ok(gap)
        })
    })
    .await;
    for p in &parties {
        let _ = http
            .put(format!("{base}/v1/session/destroy/{}", p.session))
            .send()
            .await;
    }
    let _ = http.delete(format!("{base}/v1/kv/{key}")).send().await;
    h
}

/// One side of the PostgreSQL handoff floor: a connection, and the
/// notifications of the channel it listens on.
struct PgParty {
    pg: PgFloor,
    /// The release: the row's `DELETE` and the `NOTIFY`, one statement
    /// (one commit, as the backend's release), prepared.
    release: tokio_postgres::Statement,
    notified: tokio::sync::mpsc::UnboundedReceiver<()>,
}

async fn pg_handoffs(
    url: &Url,
    key: String,
    count: usize,
    others: usize,
) -> Result<crate::Histogram> {
    use futures::StreamExt;
    let channel = format!("qlbench_{}", std::process::id());
    let pg = pg_config(url)?;
    // Idle listeners, each on a channel nobody notifies; kept to the end.
    let mut idle = Vec::new();
    for i in 0..others {
        let (client, mut connection) = pg.connect(tokio_postgres::NoTls).await.map_err(pg_text)?;
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(_)) = messages.next().await {}
        });
        client
            .batch_execute(&format!("LISTEN {channel}_idle_{i}"))
            .await
            .map_err(pg_text)?;
        idle.push(client);
    }
    let mut parties = Vec::new();
    for _ in 0..2 {
        let (client, mut connection) = pg.connect(tokio_postgres::NoTls).await.map_err(pg_text)?;
        let (tx, notified) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(m)) = messages.next().await {
                if let tokio_postgres::AsyncMessage::Notification(_) = m {
                    let _ = tx.send(());
                }
            }
        });
        client
            .batch_execute(&format!("LISTEN {channel}"))
            .await
            .map_err(pg_text)?;
        let pg = pg_prepare(client).await?;
        let release = format!(
            "WITH d AS (DELETE FROM {PG_TABLE} WHERE name = $1 RETURNING name) \
             SELECT pg_notify($2, '') FROM d"
        );
        let release = pg.client.prepare(&release).await.map_err(pg_text)?;
        parties.push(PgParty {
            pg,
            release,
            notified,
        });
    }
    let mut parties: [PgParty; 2] = parties.try_into().map_err(|_| "two parties")?;
    pg_op(&parties[0].pg, &key, true).await?;
    let key2 = key.clone();
    let channel2 = channel.clone();
    let h = ping_pong(&mut parties, count, move |holder, waiter| {
        let (key, channel) = (key2.clone(), channel2.clone());
        Box::pin(async move {
            // Both listen: drop what the holder's own release will echo.
            while waiter.notified.try_recv().is_ok() {}
            let t = std::time::Instant::now();
            let give = async {
                let n = holder
                    .pg
                    .client
                    .execute(&holder.release, &[&key, &channel])
                    .await
                    .map_err(pg_text)?;
                if n != 1 {
                    return Err(format!("the release found {n} rows"));
                }
                Ok(())
            };
            let take = async {
                waiter.notified.recv().await.ok_or("the listener ended")?;
                pg_op(&waiter.pg, &key, true).await?;
                Ok::<_, String>(t.elapsed())
            };
            let (_, gap) = tokio::try_join!(give, take)?;
            while holder.notified.try_recv().is_ok() {}
            Ok(gap)
        })
    })
    .await;
    let _ = pg_op(&parties[0].pg, &key, false).await;
    drop(idle);
    h
}

/// A ZooKeeper client with the floor's session timeout.
pub(crate) async fn zk_connect(endpoint: &str) -> Result<zookeeper_client::Client> {
    zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(endpoint)
        .await
        .map_err(text)
}

/// A Consul session of the floor's own: no health checks, no lock-delay,
/// never renewed (its TTL outlives any run of the bench's parts).
pub(crate) async fn consul_session(http: &reqwest::Client, base: &str) -> Result<String> {
    let body =
        serde_json::json!({"TTL": "600s", "Behavior": "delete", "LockDelay": "0s", "Checks": []});
    let session = consul_put(http, &format!("{base}/v1/session/create"), &body).await?;
    Ok(session["ID"].as_str().ok_or("no session ID")?.to_string())
}

/// One Consul txn of `verb` (`lock` or `unlock`) on `key` for `session`,
/// with the flags `consul lock` puts on its `.lock`; the key's modify
/// index after it.
/// The flags of our `.lock` (quorumlock-consul's `LOCK_FLAGS`).
const CONSUL_LOCK_FLAGS: u64 = 0x2ddc_cbc0_58a5_0c18;

async fn consul_txn(
    http: &reqwest::Client,
    base: &str,
    verb: &str,
    key: &str,
    session: &str,
) -> Result<u64> {
    let op = serde_json::json!([{"KV": {"Verb": verb, "Key": key, "Session": session, "Flags": CONSUL_LOCK_FLAGS}}]);
    let r = consul_put(http, &format!("{base}/v1/txn"), &op).await?;
    r["Results"][0]["KV"]["ModifyIndex"]
        .as_u64()
        .ok_or_else(|| format!("no index in {r}"))
}

/// Ours' take of a free `.lock` (`lock`), raw: `.lock` absent, then
/// locked by our session with our flags and a record, our queue key
/// absent (a late fast take never lands once we queued), the attempt's
/// fence key absent; with `read`, the lock's keys read in the same txn
/// (what ours reads on a lock it has no quiet last cycle of). A refused
/// take fails the request (409). `.lock`'s index.
async fn consul_same_take(c: &ConsulFloor, lock: &str, read: bool) -> Result<u64> {
    use base64::Engine as _;
    let value = base64::engine::general_purpose::STANDARD.encode(SAME_WORK_VALUE);
    let tree = lock.strip_suffix(".lock").unwrap_or(lock);
    let mut ops = vec![
        serde_json::json!({"KV": {"Verb": "check-not-exists", "Key": lock}}),
        serde_json::json!({"KV": {"Verb": "lock", "Key": lock, "Session": c.session, "Flags": CONSUL_LOCK_FLAGS, "Value": value}}),
    ];
    if read {
        ops.push(serde_json::json!({"KV": {"Verb": "get-tree", "Key": tree}}));
    }
    ops.extend([
        serde_json::json!({"KV": {"Verb": "check-not-exists", "Key": format!("{tree}q/{}", c.session)}}),
        serde_json::json!({"KV": {"Verb": "check-not-exists", "Key": format!("{tree}fence")}}),
    ]);
    let r = consul_put(
        &c.http,
        &format!("{}/v1/txn", c.base),
        &serde_json::Value::Array(ops),
    )
    .await?;
    // The checks answer nothing: `.lock` is the first result.
    r["Results"][0]["KV"]["ModifyIndex"]
        .as_u64()
        .ok_or_else(|| format!("no index in {r}"))
}

/// Ours' release of `.lock` taken at `index`, raw: at that index only
/// (`check-index` fails on a missing `.lock`, `delete-cas` would not).
async fn consul_same_give(c: &ConsulFloor, lock: &str, index: u64) -> Result<()> {
    let give = serde_json::json!([
        {"KV": {"Verb": "check-index", "Key": lock, "Index": index}},
        {"KV": {"Verb": "delete-cas", "Key": lock, "Index": index}},
    ]);
    consul_put(&c.http, &format!("{}/v1/txn", c.base), &give).await?;
    Ok(())
}

/// Ours' put of an entry, raw: guarded as ours (the attempt's fence key
/// absent, the key new), with the lease; with `read`, Go's read of the
/// oldest contender in the same txn (ours' enqueue txn on a lock it has
/// no quiet last cycle of). The revision it wrote at.
async fn etcd_same_take(
    kv: &mut etcd_client::KvClient,
    lease: i64,
    key: &str,
    read: bool,
) -> Result<i64> {
    use etcd_client::{
        Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    };
    let mut then = vec![TxnOp::put(
        key,
        SAME_WORK_VALUE,
        Some(PutOptions::new().with_lease(lease)),
    )];
    if read {
        // The lock's prefix, where the key is the one entry.
        let prefix = key.rsplit_once('/').map_or(key, |(p, _)| p);
        let oldest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        then.push(TxnOp::get(format!("{prefix}/"), Some(oldest)));
    }
    let txn = Txn::new()
        .when([
            Compare::version(format!("{key}/fence"), CompareOp::Equal, 0),
            Compare::create_revision(key, CompareOp::Equal, 0),
        ])
        .and_then(then);
    let r = kv.txn(txn).await.map_err(text)?;
    if !r.succeeded() {
        return Err("a guard of the floor's put failed".into());
    }
    Ok(r.header().map_or(0, |h| h.revision()))
}

/// The entry key of the `i`th lock of the scale floor: the one key
/// under the lock's own prefix, as ours is.
fn etcd_scale_key(key: &str, i: usize) -> String {
    format!("{key}/s{i}/e")
}

/// Ours' delete of an entry, raw: only of the key at its create
/// revision `rev`.
async fn etcd_same_give(kv: &mut etcd_client::KvClient, key: &str, rev: i64) -> Result<()> {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, rev)])
        .and_then([TxnOp::delete(key, None)]);
    if !kv.txn(txn).await.map_err(text)?.succeeded() {
        return Err("a guard of the floor's delete failed".into());
    }
    Ok(())
}

/// PUTs `body` to `url`; the JSON answer of a 2xx.
pub(crate) async fn consul_put(
    http: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> Result<serde_json::Value> {
    http.put(url)
        .json(body)
        .send()
        .await
        .map_err(text)?
        .error_for_status()
        .map_err(text)?
        .json()
        .await
        .map_err(text)
}
