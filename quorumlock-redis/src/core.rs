//! The state: [`RedisCore`], what the backend and its sessions share (the
//! client, the connections, the request counter; one request: counted,
//! bounded by the timeout, its errors mapped), and [`SessionState`], what
//! one session shares with its tasks.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quorumlock_core::backend::{EntrySignals, SessionLiveness};
use quorumlock_core::{Error, ErrorKind, LockName, LossReason, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{FromRedisValue, ScriptInvocation, Value};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::RedisConfig;
use crate::error;
use crate::layout;
use crate::scripts;

/// The backend-wide state of a [`crate::RedisBackend`] (its clones share
/// it through an `Arc`), held by every session it opened.
pub(crate) struct RedisCore {
    pub(crate) config: RedisConfig,
    pub(crate) client: redis::Client,
    pub(crate) conn: ConnectionManager,
    pub(crate) requests: AtomicU64,
    /// `<ns>/` or empty.
    pub(crate) prefix: String,
    /// Sessions this instance opened, for `leftovers`.
    pub(crate) opened: Mutex<Vec<String>>,
    /// WAIT mode: idle connections for the WAITs (at most
    /// [`IDLE_WAIT_CONNECTIONS`]). A WAIT blocks the connection it is sent
    /// on until the replicas answer or its timeout passes, so never on
    /// [`conn`](Self::conn), which the renewals and releases share; and
    /// one grant's WAIT at a time on each of these.
    pub(crate) waits: Mutex<Vec<MultiplexedConnection>>,
}

/// One session's state (one session key's), shared by its tasks: the
/// session's acquires, releases and removals (`RedisSession`, in
/// `session.rs`), its keepalive and its mailbox reader (`monitor.rs`).
/// Held in an `Arc`.
pub(crate) struct SessionState {
    pub(crate) core: Arc<RedisCore>,
    /// The session id: its key is `P.session/<sid>`.
    pub(crate) sid: String,
    pub(crate) liveness: Arc<SessionLiveness>,
    /// Ends the keepalive and the mailbox reader when the session is
    /// closed or dropped.
    pub(crate) stop: CancellationToken,
    pub(crate) routes: Routes,
    /// When the last renewal (or the open) that Redis confirmed was sent:
    /// the session's entry set lives on the server at least until two
    /// TTLs after it (see `RedisSession::close`).
    pub(crate) confirmed: Mutex<Instant>,
}

/// Where the mailbox reader delivers messages for one of our entries:
/// grants wake its waiter, losses and revokes go to its signals.
#[derive(Default)]
pub(crate) struct Routes(Mutex<HashMap<String, Route>>);

/// One of our entries, from its enqueue until it is released or
/// abandoned.
pub(crate) struct Route {
    pub(crate) signals: EntrySignals,
    pub(crate) wake: Arc<Notify>,
    /// The lock key: for the renewal's check once granted, and its
    /// audit's notice to the lock's followers (`monitor.rs`).
    lock: String,
    /// Once granted: the token, for the renewal's check.
    held: Option<u64>,
}

impl Routes {
    pub(crate) fn add(&self, id: &str, lock: &str, signals: EntrySignals) -> Arc<Notify> {
        let wake = Arc::new(Notify::new());
        let route = Route {
            signals,
            wake: wake.clone(),
            lock: lock.to_string(),
            held: None,
        };
        self.0
            .lock()
            .expect("poisoned")
            .insert(id.to_string(), route);
        wake
    }

    pub(crate) fn remove(&self, id: &str) {
        self.0.lock().expect("poisoned").remove(id);
    }

    pub(crate) fn granted(&self, id: &str, token: u64) {
        if let Some(r) = self.0.lock().expect("poisoned").get_mut(id) {
            r.held = Some(token);
        }
    }

    /// (lock key, contender, token) of every held entry not finished with.
    pub(crate) fn held(&self) -> Vec<(String, String, u64)> {
        let routes = self.0.lock().expect("poisoned");
        routes
            .iter()
            .filter(|(_, r)| !r.signals.is_finished())
            .filter_map(|(id, r)| Some((r.lock.clone(), id.clone(), r.held?)))
            .collect()
    }

    /// Every contender this client owns: attempts not released or
    /// abandoned, waiting or held (the renewal removes the session's
    /// other entries).
    pub(crate) fn owned(&self) -> HashSet<String> {
        self.0.lock().expect("poisoned").keys().cloned().collect()
    }

    /// The locks of the contenders this client owns, each once.
    pub(crate) fn locks(&self) -> HashSet<String> {
        let routes = self.0.lock().expect("poisoned");
        routes.values().map(|r| r.lock.clone()).collect()
    }

    /// The renewal found these held entries gone from the store.
    pub(crate) fn missing(&self, ids: &[String]) {
        let routes = self.0.lock().expect("poisoned");
        for id in ids {
            if let Some(r) = routes.get(id).filter(|r| !r.signals.is_finished()) {
                tracing::warn!(
                    contender = %id,
                    "a held entry is gone from Redis (a failover to a replica without it?)"
                );
                r.signals.lose(LossReason::EntryDeleted);
            }
        }
    }

    /// Runs `f` on the route of entry `id`, if it is still routed (not
    /// released or abandoned).
    pub(crate) fn with<R>(&self, id: &str, f: impl FnOnce(&Route) -> R) -> Option<R> {
        self.0.lock().expect("poisoned").get(id).map(f)
    }
}

/// How many idle WAIT connections a client keeps (more are opened while
/// more grants wait for their replicas at once, and closed after).
const IDLE_WAIT_CONNECTIONS: usize = 4;

/// A connection that reconnects by itself after a failure (the request
/// that saw the failure gets the error). `response` bounds each answer;
/// `None` for the mailbox's blocking reads, which are bounded by us.
pub(crate) async fn manager(
    client: &redis::Client,
    config: &RedisConfig,
    response: Option<Duration>,
) -> Result<ConnectionManager> {
    let connect =
        ConnectionManager::new_with_config(client.clone(), manager_config(config, response));
    match tokio::time::timeout(config.timeout, connect).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(error::map(e, "connecting to Redis")),
        Err(_) => Err(error::timed_out("connecting to Redis", config.timeout)),
    }
}

/// As [`manager`], but connects on first use (and again after a
/// failure), so that [`quorumlock_core::backend::connect::check_connect`] can
/// tell refused from silent.
pub(crate) fn lazy_manager(
    client: &redis::Client,
    config: &RedisConfig,
    response: Option<Duration>,
) -> Result<ConnectionManager> {
    ConnectionManager::new_lazy_with_config(client.clone(), manager_config(config, response))
        .map_err(|e| error::map(e, "configuring the Redis connection"))
}

fn manager_config(config: &RedisConfig, response: Option<Duration>) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.timeout))
        .set_response_timeout(response)
        .set_number_of_retries(2)
        .set_max_delay(config.timeout)
}

/// A script's answer element as text.
pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

/// Milliseconds since the Unix epoch, for an entry's creation time.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl RedisCore {
    /// Sends one command: counts it, bounds it by the timeout, maps its
    /// error.
    pub(crate) async fn cmd<T: FromRedisValue>(&self, what: &str, cmd: &redis::Cmd) -> Result<T> {
        let mut conn = self.conn.clone();
        self.bounded(what, cmd.query_async(&mut conn)).await
    }

    /// One request on the shared connection: counted, bounded by the
    /// timeout, its error mapped.
    async fn bounded<T>(
        &self,
        what: &str,
        request: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(self.config.timeout, request).await {
            Ok(r) => r.map_err(|e| error::map(e, what)),
            Err(_) => Err(error::timed_out(what, self.config.timeout)),
        }
    }

    /// Sends the commands of `pipe` in one request, as
    /// [`cmd`](Self::cmd): each command's answer, a server error among
    /// them as [`Value::ServerError`].
    pub(crate) async fn pipeline(&self, what: &str, pipe: &redis::Pipeline) -> Result<Vec<Value>> {
        let mut conn = self.conn.clone();
        self.bounded(what, pipe.query_async(&mut conn)).await
    }

    /// Loads `script` into the server's cache (for an `EVALSHA` sent in a
    /// pipeline, which does not load it by itself), as [`cmd`](Self::cmd).
    pub(crate) async fn load_script(&self, what: &str, script: &redis::Script) -> Result<()> {
        let mut conn = self.conn.clone();
        self.bounded(what, script.load_async(&mut conn))
            .await
            .map(drop)
    }

    /// Runs one script (EVALSHA, EVAL if the server lacks it), as
    /// [`cmd`](Self::cmd).
    pub(crate) async fn script<T: FromRedisValue>(
        &self,
        what: &str,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T> {
        let mut conn = self.conn.clone();
        self.bounded(what, inv.invoke_async(&mut conn)).await
    }

    /// In WAIT mode, whether `wait_replicas` replicas acknowledged the
    /// grant of entry `id` of lock `key` (with `token`); else
    /// [`ErrorKind::Connection`] (or [`ErrorKind::SessionLost`] if the
    /// entry is gone meanwhile). Without WAIT mode, `Ok` at once.
    ///
    /// On a WAIT connection of its own, never the shared one: the
    /// `CONFIRM` script rewrites the entry unchanged (a write after the
    /// grant, so in the replication stream at or after it: what `WAIT`
    /// waits for is this connection's last write), then `WAIT N
    /// timeout/2`. The connection goes back to the idle ones once both
    /// were answered; one that failed or ran out of time (maybe still
    /// blocked in the WAIT) is closed.
    pub(crate) async fn replicated(&self, key: &str, id: &str, token: u64) -> Result<()> {
        let n = self.config.wait_replicas;
        if n == 0 {
            return Ok(());
        }
        let what = "grant";
        let wait_ms = (self.config.timeout.as_millis() as u64 / 2).max(1);
        let timeout = self.config.timeout;
        let mut inv = scripts::CONFIRM.prepare_invoke();
        inv.arg(&self.prefix).arg(key).arg(id).arg(token);
        let asked = async {
            let mut conn = self.wait_connection().await?;
            self.requests.fetch_add(1, Ordering::Relaxed);
            let still: i64 = inv.invoke_async(&mut conn).await?;
            if still == 0 {
                return Ok((conn, None));
            }
            self.requests.fetch_add(1, Ordering::Relaxed);
            let acked: u32 = redis::cmd("WAIT")
                .arg(n)
                .arg(wait_ms)
                .query_async(&mut conn)
                .await?;
            Ok::<_, redis::RedisError>((conn, Some(acked)))
        };
        let acked = match tokio::time::timeout(timeout, asked).await {
            Ok(Ok((conn, acked))) => {
                let mut idle = self.waits.lock().expect("poisoned");
                if idle.len() < IDLE_WAIT_CONNECTIONS {
                    idle.push(conn);
                }
                acked
            }
            Ok(Err(e)) => return Err(error::map(e, what)),
            Err(_) => return Err(error::timed_out(what, timeout)),
        };
        match acked {
            Some(acked) if acked >= n => Ok(()),
            Some(acked) => Err(Error::new(
                ErrorKind::Connection,
                format!(
                    "{what}: only {acked} of the {n} replicas asked for (wait_replicas) \
                     acknowledged the grant within {wait_ms} ms; not counted as held"
                ),
            )),
            None => Err(Error::new(
                ErrorKind::SessionLost,
                "our Redis entry or session is gone (broken, killed or expired) before \
                 the replicas acknowledged its grant",
            )),
        }
    }

    /// An idle WAIT connection, or a new one.
    async fn wait_connection(&self) -> redis::RedisResult<MultiplexedConnection> {
        if let Some(c) = self.waits.lock().expect("poisoned").pop() {
            return Ok(c);
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.config.timeout))
            .set_response_timeout(None);
        self.client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    pub(crate) fn lock_key(&self, name: &LockName) -> String {
        layout::lock_key(&self.prefix, name)
    }

    pub(crate) fn record_session(&self, sid: &str) {
        self.opened.lock().expect("poisoned").push(sid.to_string());
    }

    /// Ends session `sid` on the store; `notify`: tell its own client
    /// through its mailbox.
    pub(crate) async fn end_session(&self, sid: &str, notify: bool) -> Result<bool> {
        let mut inv = scripts::KILL.prepare_invoke();
        inv.arg(&self.prefix)
            .arg(sid)
            .arg(if notify { "1" } else { "0" })
            .arg(self.config.ttl.as_millis() as u64);
        let existed: i64 = self.script("end session", &inv).await?;
        Ok(existed == 1)
    }
}
