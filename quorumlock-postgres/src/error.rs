//! The one mapping from `tokio_postgres` errors to quorumlock errors.

use std::time::Duration;

use quorumlock_core::{Error, ErrorKind};
use tokio_postgres::error::SqlState;

/// Maps a `tokio_postgres` error of the request `what` to a quorumlock
/// error, keeping the original as `source`:
///
/// - no answer, a closed or broken connection, a server shutting down or
///   starting up, too many connections, a serialization failure or a
///   deadlock the server broke (the transaction was rolled back, nothing
///   of it applied), a read-only server (a standby, or a primary during a
///   failover): [`ErrorKind::Connection`] (retryable);
/// - a TLS handshake that failed (an untrusted certificate, a refused
///   client certificate): [`ErrorKind::Tls`];
/// - a refused password, user or client certificate:
///   [`ErrorKind::Unauthenticated`];
/// - a missing privilege: [`ErrorKind::PermissionDenied`];
/// - a database that does not exist: [`ErrorKind::InvalidArgument`];
/// - anything else the server says: [`ErrorKind::Store`].
pub(crate) fn map(e: tokio_postgres::Error, what: &str) -> Error {
    if let Some(tls) = Error::tls_failure(&e, &format!("{what}: PostgreSQL")) {
        return tls.with_source(e);
    }
    let kind = kind_of(&e);
    let msg = match kind {
        ErrorKind::Unauthenticated => match e.as_db_error() {
            Some(db) => format!(
                "{what}: PostgreSQL refused the login: {} (check the user, the password \
                 or the client certificate)",
                db.message()
            ),
            None => format!("{what}: PostgreSQL refused the login ({e})"),
        },
        ErrorKind::PermissionDenied => {
            format!("{what}: the PostgreSQL user lacks a privilege the lock tables need")
        }
        ErrorKind::Connection => match e.as_db_error() {
            Some(db) => format!(
                "{what}: PostgreSQL refused it for now ({}); try again",
                db.message()
            ),
            None => format!("{what}: PostgreSQL is unreachable ({e})"),
        },
        _ => match e.as_db_error() {
            Some(db) => format!("{what} failed: {}", db.message()),
            None => format!("{what} failed: {e}"),
        },
    };
    Error::new(kind, msg).with_source(e)
}

fn kind_of(e: &tokio_postgres::Error) -> ErrorKind {
    let Some(code) = e.code() else {
        // No SQLSTATE: transport trouble, a closed connection, or a
        // message we could not read.
        return ErrorKind::Connection;
    };
    if *code == SqlState::INVALID_PASSWORD || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
    {
        ErrorKind::Unauthenticated
    } else if *code == SqlState::INSUFFICIENT_PRIVILEGE {
        ErrorKind::PermissionDenied
    } else if *code == SqlState::INVALID_CATALOG_NAME {
        ErrorKind::InvalidArgument
    } else if *code == SqlState::T_R_SERIALIZATION_FAILURE
        || *code == SqlState::T_R_DEADLOCK_DETECTED
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
        || *code == SqlState::TOO_MANY_CONNECTIONS
        || *code == SqlState::READ_ONLY_SQL_TRANSACTION
        || *code == SqlState::QUERY_CANCELED
        || code.code().starts_with("08")
    {
        ErrorKind::Connection
    } else {
        ErrorKind::Store
    }
}

/// The error of a request that got no answer within `timeout`: retryable,
/// and its outcome unknown (it may still be applied).
pub(crate) fn timed_out(what: &str, timeout: Duration) -> Error {
    Error::new(
        ErrorKind::Connection,
        format!("{what}: no answer from PostgreSQL within {timeout:?}"),
    )
}
