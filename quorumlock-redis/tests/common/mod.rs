//! Helpers the Redis test files share: URLs of a namespace, clients, and
//! a plain connection for poking at the server behind the backend's back.

// Each test file uses some of these.
#![allow(dead_code)]

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

/// A plain connection to the server of `base`, for reading and poking at
/// it behind the backend's back.
pub async fn raw(base: &str) -> redis::aio::MultiplexedConnection {
    let u = quorumlock_core::url::parse(base).unwrap();
    let plain = format!(
        "redis://{}:{}/",
        u.host_str().unwrap(),
        u.port().unwrap_or(6379)
    );
    // Long enough for a busy script's own answer.
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)));
    redis::Client::open(plain)
        .unwrap()
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
