//! Helpers the Redis test files share: URLs of a namespace, clients, and
//! a plain connection for poking at the server behind the backend's back.

// Each test file uses some of these.
#![allow(dead_code)]

pub mod pair;

use std::sync::Arc;
use std::time::Duration;

use quorumlock_core::LockClient;
use quorumlock_redis::RedisBackend;

/// `base` (a Redis URL) with namespace `ns` and option `query` (or none).
pub fn url_with(base: &str, ns: &str, query: Option<&str>) -> String {
    let mut u = quorumlock_core::url::parse(base).unwrap();
    u.set_path(ns);
    if query.is_some() {
        u.set_query(query);
    }
    u.to_string()
}

pub async fn client(url: &str) -> LockClient {
    LockClient::new(Arc::new(RedisBackend::connect(url).await.unwrap()))
}

/// Waits (up to 10 s) until lock `name`, as `c` sees it, has a waiter.
pub async fn until_queued(c: &LockClient, name: &str) {
    let queued = async {
        while c.inspect(name).await.unwrap().waiters.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), queued)
        .await
        .unwrap_or_else(|_| panic!("nobody queued on {name} within 10 s"));
}

/// A plain client of the server of `base` (no namespace, no options).
pub fn plain_client(base: &str) -> redis::Client {
    let u = quorumlock_core::url::parse(base).unwrap();
    let plain = format!(
        "redis://{}:{}/",
        u.host_str().unwrap(),
        u.port().unwrap_or(6379)
    );
    redis::Client::open(plain).unwrap()
}

/// A plain connection to the server of `base`, for reading and poking at
/// it behind the backend's back.
pub async fn raw(base: &str) -> redis::aio::MultiplexedConnection {
    // Long enough for a busy script's own answer.
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)));
    plain_client(base)
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap()
}

/// The members of the set of session `sid`'s entries (the layout's
/// `P.session/<sid>/.locks`).
pub async fn session_set(
    conn: &mut redis::aio::MultiplexedConnection,
    ns: &str,
    sid: &str,
) -> Vec<String> {
    redis::cmd("SMEMBERS")
        .arg(format!("{ns}/.session/{sid}/.locks"))
        .query_async(conn)
        .await
        .unwrap()
}

/// Steps the server's clock forward by `delta` for every key matching
/// `pattern` (`<namespace>/*`): each key's absolute expiry moves `delta`
/// earlier, and a key whose expiry is then past is gone at once, as Redis
/// does on a clock step. Returns how many keys had an expiry.
pub async fn step_clock(base: &str, pattern: &str, delta: Duration) -> i64 {
    let mut conn = raw(base).await;
    redis::cmd("EVAL")
        .arg(
            "local n = 0 \
             for _, k in ipairs(redis.call('KEYS', ARGV[1])) do \
               local at = redis.call('PEXPIRETIME', k) \
               if at > 0 then \
                 redis.call('PEXPIREAT', k, at - tonumber(ARGV[2])) \
                 n = n + 1 \
               end \
             end \
             return n",
        )
        .arg(0)
        .arg(pattern)
        .arg(delta.as_millis() as u64)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// [`step_clock`] for every key of namespace `ns` and under it, on the
/// server of `QUORUMLOCK_TEST_REDIS_URL`: the fault explorer's clock step.
pub async fn step_namespace_clock(ns: String, by: Duration) -> Result<(), String> {
    let base = std::env::var("QUORUMLOCK_TEST_REDIS_URL").map_err(|e| e.to_string())?;
    match step_clock(&base, &format!("{ns}/*"), by).await {
        0 => Err(format!("no key of {ns} has an expiry")),
        _ => Ok(()),
    }
}

/// Deletes every entry of lock `name` of namespace `ns` (its queue, entries
/// and values; its counter stays, so tokens keep growing) with `DEL`, on
/// the server of `QUORUMLOCK_TEST_REDIS_URL`, as an operator clearing a
/// stuck lock by hand does: the fault explorer's operator delete.
pub async fn delete_lock_entries(ns: String, name: String) -> Result<(), String> {
    let base = std::env::var("QUORUMLOCK_TEST_REDIS_URL").map_err(|e| e.to_string())?;
    let mut conn = raw(&base).await;
    let lock = format!("{ns}/{name}");
    redis::cmd("DEL")
        .arg(format!("{lock}/.q"))
        .arg(format!("{lock}/.e"))
        .arg(format!("{lock}/.v"))
        .query_async::<i64>(&mut conn)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}
