//! The one mapping from `redis` errors to quorumlock errors.

use quorumlock_core::{Error, ErrorKind};
use redis::{RedisError, ServerErrorKind};

/// Maps a `redis` error of the request `what` to a quorumlock error,
/// keeping the original as `source`.
///
/// - transport trouble, timeouts, a server still loading, a replica
///   refusing writes (`READONLY`, as after a failover in progress):
///   [`ErrorKind::Connection`] (retryable);
/// - a server that refuses a request for now, without running it:
///   `BUSY` (another client's script or function is running past the
///   busy threshold), `MISCONF` (writes stopped after a failed
///   snapshot), `NOSCRIPT` (the script cache was flushed between the
///   `SCRIPT LOAD` and the `EVALSHA` the `redis` crate sends after a first
///   `NOSCRIPT`): [`ErrorKind::Connection`] too, so that a release is
///   tried again rather than given up (none of them ran any of the
///   script's writes);
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
        ErrorKind::Connection => match transient_refusal(&e) {
            Some(why) => format!("{what}: Redis refused it for now ({why}); try again"),
            None => format!("{what}: Redis is unreachable or not serving writes"),
        },
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
    if transient_refusal(e).is_some() {
        return ErrorKind::Connection;
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

/// Why the server refused a request it did not run and may run later:
/// `BUSY`, `MISCONF` and `NOSCRIPT` (see [`map`]). `BUSY` and `MISCONF`
/// are not among the `redis` crate's [`ServerErrorKind`]s: their code is.
fn transient_refusal(e: &RedisError) -> Option<&'static str> {
    if e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) {
        return Some("the script cache was flushed meanwhile");
    }
    match e.code() {
        Some("BUSY") => Some("busy running a long script or function"),
        Some("MISCONF") => Some("writes stopped after a failed snapshot"),
        Some("NOSCRIPT") => Some("the script cache was flushed meanwhile"),
        _ => None,
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
        let noscript: RedisError = (
            redis::ErrorKind::Server(ServerErrorKind::NoScript),
            "No matching script",
        )
            .into();
        assert!(map(noscript, "t").is_retryable());
    }

    /// A failed handshake as the `redis` crate reports it (the io::Error
    /// of tokio-rustls, with rustls' error inside) is `Tls`, found by its
    /// type; a server error that only reads like one is not.
    #[test]
    fn tls_failures_by_type_not_text() {
        let io = |e: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let untrusted: RedisError = io(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        ))
        .into();
        let e = map(untrusted, "connecting");
        assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
        assert!(e.message().contains("check ca="), "{e}");
        let refused: RedisError = io(rustls::Error::AlertReceived(
            rustls::AlertDescription::CertificateRequired,
        ))
        .into();
        assert_eq!(map(refused, "connecting").kind(), ErrorKind::Tls);
        let e = map(
            server_error("ERR invalid peer certificate: UnknownIssuer, in key app/x"),
            "release",
        );
        assert_eq!(e.kind(), ErrorKind::Store, "{e}");
    }

    /// The errors as the server sends them, parsed by the `redis` crate.
    fn server_error(line: &str) -> RedisError {
        let v = redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).unwrap();
        v.extract_error().unwrap_err()
    }

    #[test]
    fn transient_refusals_are_retryable() {
        for line in [
            "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
            "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
            "NOSCRIPT No matching script. Please use EVAL.",
        ] {
            let e = map(server_error(line), "release");
            assert_eq!(e.kind(), ErrorKind::Connection, "{line}: {e}");
            assert!(e.message().contains("refused it for now"), "{e}");
        }
        for line in [
            "ERR wrong number of arguments",
            "WRONGTYPE Operation against a key",
        ] {
            let e = map(server_error(line), "release");
            assert_eq!(e.kind(), ErrorKind::Store, "{line}: {e}");
        }
    }
}
