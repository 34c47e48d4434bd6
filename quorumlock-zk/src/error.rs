//! The one mapping from `zookeeper-client` errors to quorumlock errors.

use quorumlock_core::{Error, ErrorKind};
use zookeeper_client as zk;

/// Maps a client library error to a [`quorumlock_core::Error`] kind, keeping the
/// original as `source`. `what` says what we were doing.
///
/// Connection trouble is [`ErrorKind::Connection`] (retryable); a session
/// that is gone is [`ErrorKind::SessionLost`]; credentials are
/// [`ErrorKind::Unauthenticated`] / [`ErrorKind::PermissionDenied`] and are
/// not retried.
pub(crate) fn map(e: zk::Error, what: &str) -> Error {
    use zk::Error as E;
    let kind = match &e {
        // `Custom` carries I/O errors and "no response from connection".
        E::ConnectionLoss | E::Timeout | E::NoHosts | E::Throttled | E::Custom(_) => {
            ErrorKind::Connection
        }
        E::SessionExpired | E::SessionMoved | E::ClientClosed => ErrorKind::SessionLost,
        E::AuthFailed => ErrorKind::Unauthenticated,
        E::NoAuth => ErrorKind::PermissionDenied,
        E::BadArguments(_) | E::InvalidAcl | E::MarshallingError | E::UnmarshalError { .. } => {
            ErrorKind::Internal
        }
        _ => ErrorKind::Store,
    };
    Error::new(kind, format!("ZooKeeper: {what}")).with_source(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        assert_eq!(
            map(zk::Error::ConnectionLoss, "x").kind(),
            ErrorKind::Connection
        );
        assert!(map(zk::Error::ConnectionLoss, "x").is_retryable());
        assert_eq!(
            map(zk::Error::SessionExpired, "x").kind(),
            ErrorKind::SessionLost
        );
        assert_eq!(
            map(zk::Error::AuthFailed, "x").kind(),
            ErrorKind::Unauthenticated
        );
        assert!(!map(zk::Error::AuthFailed, "x").is_retryable());
        assert_eq!(
            map(zk::Error::NoAuth, "x").kind(),
            ErrorKind::PermissionDenied
        );
        assert_eq!(map(zk::Error::NotEmpty, "x").kind(), ErrorKind::Store);
    }
}
