//! The check every backend's `connect()` makes: the store answers within
//! the connect timeout, and the error says which of unreachable, refused
//! credentials or no answer it was. One place, so that the four stores
//! give the same kinds for the same trouble.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Error, ErrorKind, Result};

/// How long `connect()` waits for the store to answer when the URL has
/// no `connect_timeout=`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Shortest `connect_timeout=` accepted.
pub const MIN_CONNECT_TIMEOUT: Duration = Duration::from_millis(100);
/// Longest `connect_timeout=` accepted.
pub const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs `attempt` (one cheap request that needs a working connection and
/// valid credentials) until it succeeds or `timeout` has passed.
///
/// - An [`ErrorKind::Connection`] error (refused, reset, no route) is
///   retried with a short backoff; if the store still cannot be reached
///   when `timeout` passes, the result is [`ErrorKind::Unavailable`], with
///   the last error as its source.
/// - If the last attempt was still waiting for an answer when `timeout`
///   passed (a silent host), or itself gave up waiting for one (an
///   [`ErrorKind::Timeout`] error: a client library with its own
///   deadline), the result is [`ErrorKind::Timeout`].
/// - Any other error ([`ErrorKind::Unauthenticated`],
///   [`ErrorKind::PermissionDenied`], ...) is returned at once: bad
///   credentials are refused once, never retried.
///
/// `store` is the store's redacted URL, for the messages.
///
/// # Cancel Safety
/// Only as cancel-safe as `attempt`; the backends pass reads, so dropping
/// it leaves nothing behind.
pub async fn check_connect<F, Fut>(store: &str, timeout: Duration, mut attempt: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let deadline = Instant::now() + timeout;
    let mut backoff = super::Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
    loop {
        let e = match tokio::time::timeout_at(deadline, attempt()).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) if matches!(e.kind(), ErrorKind::Connection | ErrorKind::Timeout) => e,
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(silent(store, timeout)),
        };
        tracing::debug!(error = %e, store, "the store does not answer yet; retrying");
        let pause = backoff.next_delay();
        if Instant::now() + pause >= deadline {
            if e.kind() == ErrorKind::Timeout {
                return Err(silent(store, timeout).with_source(e));
            }
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "the store {store} could not be reached within connect_timeout={timeout:?}: {}",
                    e.message()
                ),
            )
            .with_source(e));
        }
        tokio::time::sleep(pause).await;
    }
}

/// The error of a store that never answered within `timeout`.
pub fn silent(store: &str, timeout: Duration) -> Error {
    Error::new(
        ErrorKind::Timeout,
        format!("the store {store} did not answer within connect_timeout={timeout:?}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn kinds_of_failure() {
        let t = Duration::from_millis(300);
        let n = AtomicU32::new(0);
        let e = check_connect("s://h", t, || async {
            n.fetch_add(1, Ordering::Relaxed);
            Err(Error::new(ErrorKind::Connection, "connection refused"))
        })
        .await
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert!(e.message().contains("connection refused"), "{e}");
        assert!(n.load(Ordering::Relaxed) > 1, "not retried");

        let n = AtomicU32::new(0);
        let e = check_connect("s://h", t, || async {
            n.fetch_add(1, Ordering::Relaxed);
            Err(Error::new(ErrorKind::Unauthenticated, "bad password"))
        })
        .await
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unauthenticated);
        assert_eq!(n.load(Ordering::Relaxed), 1, "credentials retried");

        let e = check_connect("s://h", t, || async {
            Err(Error::new(ErrorKind::Timeout, "the library gave up"))
        })
        .await
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        assert!(e.message().contains("did not answer"), "{e}");

        let start = Instant::now();
        let e = check_connect("s://h", t, std::future::pending)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        assert!(start.elapsed() < t * 3);

        let n = AtomicU32::new(0);
        check_connect("s://h", t, || async {
            match n.fetch_add(1, Ordering::Relaxed) {
                0 => Err(Error::new(ErrorKind::Connection, "refused")),
                _ => Ok(()),
            }
        })
        .await
        .unwrap();
    }
}
