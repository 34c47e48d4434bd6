//! The one mapping from `redis` errors to quorumlock errors.

use lockcore::{Error, ErrorKind};
use redis::{RedisError, ServerErrorKind};

/// Maps a `redis` error of the request `what` to a quorumlock error,
/// keeping the original as `source`.
///
/// - transport trouble, timeouts, a server still loading, a replica
///   refusing writes (`READONLY`, as after a failover in progress):
///   [`ErrorKind::Connection`] (retryable);
/// - bad password or user (`WRONGPASS`, `NOAUTH`): [`ErrorKind::Unauthenticated`];
/// - an ACL denial (`NOPERM`): [`ErrorKind::PermissionDenied`];
/// - a bad client configuration: [`ErrorKind::InvalidUrl`];
/// - a failed TLS handshake: [`ErrorKind::Tls`] (not retried);
/// - anything else the server says: [`ErrorKind::Store`].
pub(crate) fn map(e: RedisError, what: &str) -> Error {
    if let Some(tls) = Error::tls_failure(&e, &format!("Redis: {what}")) {
        return tls.with_source(e);
    }
    let kind = kind_of(&e);
    let msg = match kind {
        ErrorKind::Unauthenticated => {
            format!("{what}: Redis rejected the credentials (check user and password in the URL)")
        }
        ErrorKind::PermissionDenied => {
            format!("{what}: the Redis user lacks permission (ACL) for the lock scripts or keys")
        }
        ErrorKind::Connection => format!("{what}: Redis is unreachable or not serving writes"),
        _ => format!("{what} failed"),
    };
    Error::new(kind, msg).with_source(e)
}

fn kind_of(e: &RedisError) -> ErrorKind {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return ErrorKind::Connection;
    }
    match e.code() {
        Some("WRONGPASS" | "NOAUTH") => return ErrorKind::Unauthenticated,
        Some("NOPERM") => return ErrorKind::PermissionDenied,
        _ => {}
    }
    match e.kind() {
        redis::ErrorKind::AuthenticationFailed => ErrorKind::Unauthenticated,
        redis::ErrorKind::InvalidClientConfig => ErrorKind::InvalidUrl,
        redis::ErrorKind::Io => ErrorKind::Connection,
        redis::ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::MasterDown
            | ServerErrorKind::TryAgain,
        ) => ErrorKind::Connection,
        redis::ErrorKind::Server(ServerErrorKind::NoPerm) => ErrorKind::PermissionDenied,
        _ => ErrorKind::Store,
    }
}

/// A request of `what` that got no answer within `timeout`.
pub(crate) fn timed_out(what: &str, timeout: std::time::Duration) -> Error {
    Error::new(
        ErrorKind::Connection,
        format!("{what}: no answer from Redis within {timeout:?}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        let io: RedisError = std::io::Error::from(std::io::ErrorKind::ConnectionReset).into();
        assert_eq!(map(io, "t").kind(), ErrorKind::Connection);
        let auth: RedisError = (redis::ErrorKind::AuthenticationFailed, "nope").into();
        assert_eq!(map(auth, "t").kind(), ErrorKind::Unauthenticated);
        let ro: RedisError = (
            redis::ErrorKind::Server(ServerErrorKind::ReadOnly),
            "replica",
        )
            .into();
        assert!(map(ro, "t").is_retryable());
        let other: RedisError = (
            redis::ErrorKind::Server(ServerErrorKind::ResponseError),
            "bad",
        )
            .into();
        assert_eq!(map(other, "t").kind(), ErrorKind::Store);
    }
}
