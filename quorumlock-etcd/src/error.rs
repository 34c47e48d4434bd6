//! The one mapping from `etcd-client` errors to quorumlock errors.

use etcd_client::Error as EtcdError;
use quorumlock_core::{Error, ErrorKind};
use tonic::Code;

/// Maps an `etcd-client` error of the request `what` to a quorumlock error
/// kind, keeping the original as `source`.
///
/// - transport trouble, no leader, deadlines: [`ErrorKind::Connection`]
///   (retryable); so is an HTTP/2 error (a stream reset, a `GOAWAY`),
///   which tonic reports as `Internal` (or `Unknown`) "h2 protocol error":
///   the request may or may not have reached etcd, as after a transport
///   error, and a write that ends so is of unknown outcome;
/// - a TLS certificate rejected by either side: [`ErrorKind::Tls`] (final);
/// - bad user or password, invalid token: [`ErrorKind::Unauthenticated`];
///   missing permission: [`ErrorKind::PermissionDenied`] (both final);
/// - "requested lease not found": [`ErrorKind::SessionLost`] (our lease is
///   gone; the client layer opens a new one);
/// - malformed endpoints: [`ErrorKind::InvalidUrl`];
/// - anything else the server says: [`ErrorKind::Store`].
pub(crate) fn map(e: EtcdError, what: &str) -> Error {
    if let Some(tls) = tls_failure(&e, what) {
        return tls.with_source(e);
    }
    let kind = kind_of(&e);
    let msg = match kind {
        ErrorKind::Unauthenticated => {
            format!("{what}: etcd rejected the credentials (check user and password in the URL)")
        }
        ErrorKind::PermissionDenied => {
            format!("{what}: the etcd user lacks permission on the namespace's keys")
        }
        ErrorKind::SessionLost => format!("{what}: our etcd lease no longer exists"),
        ErrorKind::Connection => format!("{what}: etcd is unreachable or has no leader"),
        _ => format!("{what} failed"),
    };
    Error::new(kind, msg).with_source(e)
}

/// A certificate the client or the server did not accept: a setup error
/// that retrying cannot fix. Found by type in the error etcd-client wraps
/// (its own `source()` gives none): rustls' error in the chain of the
/// status, transport or I/O error; or, where h2 kept only an I/O error's
/// kind and text (a server refusing our certificate after the
/// handshake), an I/O error of kind `InvalidData`
/// ([`Error::tls_failure_or_invalid_data`]).
fn tls_failure(e: &EtcdError, what: &str) -> Option<Error> {
    let inner: &(dyn std::error::Error + 'static) = match e {
        EtcdError::GRpcStatus(s) => s,
        EtcdError::TransportError(t) => t,
        EtcdError::IoError(io) => io,
        _ => return None,
    };
    Error::tls_failure_or_invalid_data(inner, &format!("etcd: {what}"))
}

/// The request failed before it reached etcd: the connection to the
/// endpoint could not be made (refused, unreachable). Sending it again is
/// safe even when it is not idempotent.
pub(crate) fn not_sent(e: &EtcdError) -> bool {
    let text = format!("{e:?}");
    text.contains("ConnectError") || text.contains("tcp connect error")
}

fn kind_of(e: &EtcdError) -> ErrorKind {
    match e {
        EtcdError::GRpcStatus(s) => {
            let m = s.message();
            match s.code() {
                // tonic's status for an HTTP/2 error: `RST_STREAM` or
                // `GOAWAY` with INTERNAL_ERROR, PROTOCOL_ERROR, NO_ERROR
                // and most other reasons is `Internal`, an I/O error on the
                // connection `Unknown`, both with this prefix. A proxy or
                // load balancer may reset a stream after passing the
                // request on: etcd may apply it. As `Store`, a write that
                // ended so counted as answered, and the attempt's abandon
                // skipped its fence (issue 39; `tests/h2_errors.rs`).
                Code::Internal | Code::Unknown if m.starts_with("h2 protocol error") => {
                    ErrorKind::Connection
                }
                Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::Aborted
                | Code::ResourceExhausted => ErrorKind::Connection,
                // etcd says "authentication failed, invalid user ID or
                // password" with InvalidArgument.
                Code::InvalidArgument if m.contains("authentication failed") => {
                    ErrorKind::Unauthenticated
                }
                Code::InvalidArgument if m.contains("user name is empty") => {
                    ErrorKind::Unauthenticated
                }
                Code::Unauthenticated => ErrorKind::Unauthenticated,
                Code::PermissionDenied => ErrorKind::PermissionDenied,
                Code::FailedPrecondition if m.contains("permission denied") => {
                    ErrorKind::PermissionDenied
                }
                Code::NotFound if m.contains("lease not found") => ErrorKind::SessionLost,
                // tonic reports broken connections as Unknown with a
                // transport message.
                Code::Unknown if m.contains("transport") || m.contains("connect") => {
                    ErrorKind::Connection
                }
                _ => ErrorKind::Store,
            }
        }
        EtcdError::TransportError(_) | EtcdError::IoError(_) | EtcdError::WatchError(_) => {
            ErrorKind::Connection
        }
        EtcdError::LeaseKeepAliveError(m) if m.contains("not found") => ErrorKind::SessionLost,
        EtcdError::LeaseKeepAliveError(_) => ErrorKind::Connection,
        EtcdError::InvalidArgs(_) | EtcdError::InvalidUri(_) => ErrorKind::InvalidUrl,
        _ => ErrorKind::Store,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Status;

    fn k(s: Status) -> ErrorKind {
        map(EtcdError::GRpcStatus(s), "test").kind()
    }

    /// TLS failures are found by type where etcd-client keeps them: the
    /// status, transport or io error it wraps (its own `source()` gives
    /// none). A message that only reads like one is not one.
    #[test]
    fn tls_failures_by_type_not_text() {
        use std::io::{Error as IoError, ErrorKind as IoKind};
        // rustls' own error, as a wrong CA gives it: quorumlock-core's
        // tests and tests/tls.rs. h2 keeps an I/O error's kind and text
        // only: a server refusing our certificate after the handshake.
        let alert = IoError::new(IoKind::InvalidData, "received fatal alert: BadCertificate");
        let e = map(
            EtcdError::GRpcStatus(Status::from_error(Box::new(alert))),
            "status",
        );
        assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
        assert!(e.message().contains("cert= and key="), "{e}");
        // A lock name in a server message is not a certificate problem.
        let e = map(
            EtcdError::GRpcStatus(Status::permission_denied(
                "etcdserver: permission denied on jobs/UnknownCA",
            )),
            "acquire",
        );
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    }

    #[test]
    fn kinds() {
        assert_eq!(
            k(Status::unavailable("etcdserver: no leader")),
            ErrorKind::Connection
        );
        assert_eq!(
            k(Status::invalid_argument(
                "etcdserver: authentication failed, invalid user ID or password"
            )),
            ErrorKind::Unauthenticated
        );
        assert_eq!(
            k(Status::unauthenticated("etcdserver: invalid auth token")),
            ErrorKind::Unauthenticated
        );
        assert_eq!(
            k(Status::permission_denied("etcdserver: permission denied")),
            ErrorKind::PermissionDenied
        );
        assert_eq!(
            k(Status::not_found("etcdserver: requested lease not found")),
            ErrorKind::SessionLost
        );
        assert_eq!(k(Status::out_of_range("compacted")), ErrorKind::Store);
        // HTTP/2 errors as tonic reports them: the outcome is unknown.
        assert_eq!(
            k(Status::internal("h2 protocol error: http2 error")),
            ErrorKind::Connection
        );
        assert_eq!(
            k(Status::unknown("h2 protocol error: broken pipe")),
            ErrorKind::Connection
        );
        assert_eq!(k(Status::internal("etcdserver: x")), ErrorKind::Store);
        let e = map(
            EtcdError::LeaseKeepAliveError("lease not found".into()),
            "keepalive",
        );
        assert_eq!(e.kind(), ErrorKind::SessionLost);
        assert!(!map(EtcdError::GRpcStatus(Status::unauthenticated("x")), "t").is_retryable());
        assert!(map(EtcdError::GRpcStatus(Status::unavailable("x")), "t").is_retryable());
    }
}
