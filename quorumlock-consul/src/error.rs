//! The one mapping from Consul HTTP API failures to quorumlock errors.

use std::fmt;

use quorumlock_core::{Error, ErrorKind};

/// A failed call to the Consul HTTP API, as the transport saw it.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// The request did not get an answer (connect, TLS, timeout, reset).
    Transport(reqwest::Error),
    /// The agent answered with an unexpected status.
    Status {
        /// HTTP status code.
        code: u16,
        /// The agent's text (Consul answers errors in plain text).
        body: String,
    },
    /// The answer could not be decoded.
    Decode(String),
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiError::Transport(e) => {
                write!(f, "{e}")?;
                let mut src = std::error::Error::source(e);
                while let Some(s) = src {
                    write!(f, ": {s}")?;
                    src = s.source();
                }
                Ok(())
            }
            ApiError::Status { code, body } => write!(f, "HTTP {code}: {}", body.trim()),
            ApiError::Decode(m) => write!(f, "unexpected answer: {m}"),
        }
    }
}

impl std::error::Error for ApiError {}

/// Maps a Consul API failure to a [`quorumlock_core::Error`] kind, keeping the
/// original as `source`. `what` says what we were doing.
///
/// - no answer, 429 (too many connections) and 5xx (no leader, RPC
///   timeouts, agent restarting) are [`ErrorKind::Connection`]: retryable;
/// - 401 and 403 "ACL not found" are [`ErrorKind::Unauthenticated`], other
///   403s [`ErrorKind::PermissionDenied`]: not retried;
/// - a failed TLS handshake is [`ErrorKind::Tls`]: not retried;
/// - any other status is [`ErrorKind::Store`], an undecodable answer
///   [`ErrorKind::Internal`].
pub(crate) fn map(e: ApiError, what: &str) -> Error {
    if let ApiError::Transport(t) = &e {
        if let Some(tls) = Error::tls_failure(t, &format!("Consul: {what}")) {
            return tls.with_source(e);
        }
    }
    let kind = match &e {
        ApiError::Transport(_) => ErrorKind::Connection,
        ApiError::Status { code: 429, .. } => ErrorKind::Connection,
        ApiError::Status { code, .. } if *code >= 500 => ErrorKind::Connection,
        ApiError::Status { code: 401, .. } => ErrorKind::Unauthenticated,
        ApiError::Status { code: 403, body } if body.contains("ACL not found") => {
            ErrorKind::Unauthenticated
        }
        ApiError::Status { code: 403, .. } => ErrorKind::PermissionDenied,
        ApiError::Status { .. } => ErrorKind::Store,
        ApiError::Decode(_) => ErrorKind::Internal,
    };
    Error::new(kind, format!("Consul: {what}")).with_source(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, body: &str) -> ApiError {
        ApiError::Status {
            code,
            body: body.to_string(),
        }
    }

    #[test]
    fn kinds() {
        let e = map(status(500, "No cluster leader"), "renew");
        assert_eq!(e.kind(), ErrorKind::Connection);
        assert!(e.is_retryable());
        assert!(e.to_string().contains("No cluster leader"), "{e}");
        assert_eq!(map(status(503, ""), "x").kind(), ErrorKind::Connection);
        assert_eq!(map(status(429, ""), "x").kind(), ErrorKind::Connection);
        let e = map(status(403, "ACL not found"), "x");
        assert_eq!(e.kind(), ErrorKind::Unauthenticated);
        assert!(!e.is_retryable());
        assert_eq!(
            map(status(403, "Permission denied"), "x").kind(),
            ErrorKind::PermissionDenied
        );
        assert_eq!(map(status(401, ""), "x").kind(), ErrorKind::Unauthenticated);
        assert_eq!(map(status(400, "bad"), "x").kind(), ErrorKind::Store);
        assert_eq!(
            map(ApiError::Decode("x".into()), "x").kind(),
            ErrorKind::Internal
        );
    }
}
