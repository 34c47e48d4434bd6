//! The connection and the request helpers every other module uses: one
//! place that counts requests, bounds them by the timeout and maps their
//! errors.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockcore::{Error, ErrorKind, LockName, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, ScriptInvocation};

use crate::config::RedisConfig;
use crate::error;
use crate::layout;
use crate::scripts;

/// What a backend and its sessions share.
pub(crate) struct Inner {
    pub(crate) config: RedisConfig,
    pub(crate) client: redis::Client,
    pub(crate) conn: ConnectionManager,
    pub(crate) requests: AtomicU64,
    /// `<ns>/` or empty.
    pub(crate) prefix: String,
    /// Sessions this instance opened, for `leftovers`.
    pub(crate) opened: Mutex<Vec<String>>,
}

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
/// failure), so that [`lockcore::backend::connect::check_connect`] can
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

/// Milliseconds since the Unix epoch, for an entry's creation time.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Inner {
    /// Sends one command: counts it, bounds it by the timeout, maps its
    /// error.
    pub(crate) async fn cmd<T: FromRedisValue>(&self, what: &str, cmd: &redis::Cmd) -> Result<T> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut conn = self.conn.clone();
        match tokio::time::timeout(self.config.timeout, cmd.query_async(&mut conn)).await {
            Ok(r) => r.map_err(|e| error::map(e, what)),
            Err(_) => Err(error::timed_out(what, self.config.timeout)),
        }
    }

    /// Runs one script (EVALSHA, EVAL if the server lacks it), as
    /// [`cmd`](Self::cmd).
    pub(crate) async fn script<T: FromRedisValue>(
        &self,
        what: &str,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut conn = self.conn.clone();
        match tokio::time::timeout(self.config.timeout, inv.invoke_async(&mut conn)).await {
            Ok(r) => r.map_err(|e| error::map(e, what)),
            Err(_) => Err(error::timed_out(what, self.config.timeout)),
        }
    }

    /// In WAIT mode, whether `wait_replicas` replicas acknowledged every
    /// write of this connection so far (the caller's grant among them);
    /// else [`ErrorKind::Connection`]. Without WAIT mode, `Ok` at once.
    pub(crate) async fn replicated(&self, what: &str) -> Result<()> {
        let n = self.config.wait_replicas;
        if n == 0 {
            return Ok(());
        }
        let wait_ms = self.config.timeout.as_millis() as u64 / 2;
        let acked: u32 = self
            .cmd(what, redis::cmd("WAIT").arg(n).arg(wait_ms.max(1)))
            .await?;
        if acked >= n {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::Connection,
                format!(
                    "{what}: only {acked} of the {n} replicas asked for (wait_replicas) \
                     acknowledged the grant within {wait_ms} ms; not counted as held"
                ),
            ))
        }
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
