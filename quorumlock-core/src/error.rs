//! The one error type of quorumlock.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;

/// What went wrong, as a closed-for-matching, open-for-growth list.
///
/// Tests and callers match on the kind; the message is for humans and the
/// `source` keeps the store client's own error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A lock name is empty or longer than [`crate::MAX_NAME_LEN`] bytes
    /// (see [`crate::LockName`]).
    InvalidName,
    /// A connection URL could not be parsed or has a bad option value.
    InvalidUrl,
    /// An argument is out of its range (a semaphore with 0 permits).
    InvalidArgument,
    /// The URL scheme is not known to quorumlock at all.
    UnknownScheme,
    /// The URL scheme is known but its cargo feature is not enabled.
    FeatureDisabled,
    /// A try-acquire found the lock held.
    WouldBlock,
    /// An acquire did not succeed before its deadline, or the store did
    /// not answer `connect()` within its connect timeout.
    Timeout,
    /// The store session ended (expired, revoked, keepalive failed).
    SessionLost,
    /// The lock was lost while held (session loss, forced break).
    LockLost,
    /// The entry on the store belongs to another recipe or another
    /// configuration (different flags, different permit count).
    Conflict,
    /// The store rejected the credentials.
    Unauthenticated,
    /// The credentials are valid but lack permission.
    PermissionDenied,
    /// The TLS handshake failed: the server's certificate is not trusted
    /// (wrong CA, wrong host name, expired) or the server refused ours
    /// (missing or unknown client certificate). Not retried: another
    /// attempt meets the same certificates.
    Tls,
    /// The store could not be reached or the connection broke.
    Connection,
    /// The store answered with an error not covered by another kind.
    Store,
    /// The store could not be reached for longer than the client allows
    /// ([`crate::ClientOptions::unavailable_after`]); an acquire gave up.
    /// Also `connect()`'s error when every attempt within its connect
    /// timeout was refused or broke.
    Unavailable,
    /// A read holder asked to upgrade to write; refused instead of
    /// deadlocking.
    UpgradeRefused,
    /// The client was closed.
    Closed,
    /// A bug in quorumlock or a backend: an invariant did not hold.
    Internal,
}

impl ErrorKind {
    /// A short, stable, lowercase name of the kind.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidName => "invalid name",
            ErrorKind::InvalidUrl => "invalid url",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::UnknownScheme => "unknown scheme",
            ErrorKind::FeatureDisabled => "feature disabled",
            ErrorKind::WouldBlock => "would block",
            ErrorKind::Timeout => "timeout",
            ErrorKind::SessionLost => "session lost",
            ErrorKind::LockLost => "lock lost",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::PermissionDenied => "permission denied",
            ErrorKind::Tls => "tls",
            ErrorKind::Connection => "connection",
            ErrorKind::Store => "store",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::UpgradeRefused => "upgrade refused",
            ErrorKind::Closed => "closed",
            ErrorKind::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of every quorumlock operation.
pub struct Error {
    kind: ErrorKind,
    message: Cow<'static, str>,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

/// `Result` with quorumlock's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind` with a human message.
    pub fn new(kind: ErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        Error {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// Keeps the underlying error (usually the store client's) as `source`.
    pub fn with_source(mut self, source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// The underlying error (usually the store client's), to downcast:
    /// its message is already part of this error's `Display`.
    pub fn cause(&self) -> Option<&(dyn StdError + Send + Sync + 'static)> {
        self.source.as_deref()
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The human message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// If `e` or one of its sources is a failed TLS handshake (a
    /// [`rustls::Error`], which every backend's TLS uses), an
    /// [`ErrorKind::Tls`] error `"<store>: TLS handshake failed: <the
    /// certificate problem>"` with a hint at the options to check. `None`
    /// for anything else, whatever its message says.
    ///
    /// Found by type: the chain of `source()`s is walked, and also the
    /// error inside an [`std::io::Error`] (its `source()` skips it: that
    /// is where tokio-rustls puts the rustls error), inside an
    /// `Arc<dyn Error + Send + Sync>` (as the `redis` crate keeps an
    /// io::Error) and inside an [`Error`]'s [`Error::cause`].
    pub fn tls_failure(e: &(dyn StdError + 'static), store: &str) -> Option<Error> {
        let tls = find_rustls_error(e)?;
        let hint = tls_hint(tls)?;
        Some(Error::new(
            ErrorKind::Tls,
            format!("{store}: TLS handshake failed: {tls} ({hint})"),
        ))
    }

    /// [`Error::tls_failure`] for a store client that keeps only the kind
    /// and text of some I/O errors: h2 (under tonic, so etcd-client) does
    /// so for an error on an established connection, such as the alert of
    /// a server that refuses our certificate after the handshake. Where
    /// the chain holds no rustls error at all, an [`std::io::Error`] of
    /// kind [`InvalidData`](std::io::ErrorKind::InvalidData) is taken for
    /// a TLS failure too: tokio-rustls gives every rustls error that
    /// kind, a TCP socket none. Its hint names every TLS option.
    pub fn tls_failure_or_invalid_data(e: &(dyn StdError + 'static), store: &str) -> Option<Error> {
        if find_rustls_error(e).is_some() {
            return Error::tls_failure(e, store);
        }
        let io = chain(e)
            .filter_map(|err| err.downcast_ref::<std::io::Error>())
            .find(|io| io.kind() == std::io::ErrorKind::InvalidData)?;
        Some(Error::new(
            ErrorKind::Tls,
            format!("{store}: TLS handshake failed: {io} (check ca=, cert= and key=)"),
        ))
    }

    /// Whether the same call may succeed if tried again later: connection
    /// trouble and lost sessions are, bad input and bad credentials are not.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Connection
                | ErrorKind::Unavailable
                | ErrorKind::SessionLost
                | ErrorKind::Timeout
                | ErrorKind::WouldBlock
        )
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind).field("message", &self.message);
        if let Some(s) = &self.source {
            d.field("source", &format_args!("{s}"));
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)?;
        if let Some(s) = &self.source {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

/// `Display` already ends with the underlying error's message, so
/// `source()` is *its* source: a report that walks the chain (anyhow,
/// eyre, `{:#}`) shows each message once. The underlying error itself is
/// [`Error::cause`].
impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source.as_deref().and_then(|e| e.source())
    }
}

/// The first [`rustls::Error`] in `e`'s chain (see [`Error::tls_failure`]).
fn find_rustls_error<'e>(e: &'e (dyn StdError + 'static)) -> Option<&'e rustls::Error> {
    chain(e).find_map(|err| err.downcast_ref::<rustls::Error>())
}

/// `e` and the errors under it: its `source()`s, and also the error
/// inside an [`std::io::Error`] (whose `source()` skips it), inside an
/// `Arc<dyn Error + Send + Sync>` and inside an [`Error`]'s cause.
fn chain<'e>(
    e: &'e (dyn StdError + 'static),
) -> impl Iterator<Item = &'e (dyn StdError + 'static)> {
    type Shared = std::sync::Arc<dyn StdError + Send + Sync>;
    std::iter::successors(Some(e), |&err: &&'e (dyn StdError + 'static)| {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            io.get_ref().map(|inner| inner as &(dyn StdError + 'static))
        } else if let Some(shared) = err.downcast_ref::<Shared>() {
            Some(&**shared as &(dyn StdError + 'static))
        } else if let Some(ours) = err.downcast_ref::<Error>() {
            ours.cause().map(|c| c as &(dyn StdError + 'static))
        } else {
            err.source()
        }
    })
}

/// What to check for a rustls handshake error, or `None` if it is not a
/// handshake's verdict on the certificates or the protocol.
fn tls_hint(e: &rustls::Error) -> Option<&'static str> {
    match e {
        rustls::Error::InvalidCertificate(_) => Some("the server's certificate is not signed by a trusted CA or does not name this host: check ca="),
        rustls::Error::AlertReceived(_) => Some("the server refused the handshake; it may require a client certificate: check cert= and key="),
        rustls::Error::PeerIncompatible(_) | rustls::Error::PeerMisbehaved(_) => {
            Some("the server speaks no TLS version or cipher in common, or no TLS on this port")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_has_kind_message_and_source() {
        let e = Error::new(ErrorKind::Connection, "etcd unreachable")
            .with_source(std::io::Error::other("refused"));
        assert_eq!(e.to_string(), "connection: etcd unreachable: refused");
        assert!(e.is_retryable());
        assert!(!Error::new(ErrorKind::InvalidName, "x").is_retryable());
    }

    /// A report that prints each error of the chain (as anyhow does)
    /// shows every message once.
    #[test]
    fn a_chain_report_repeats_nothing() {
        #[derive(Debug)]
        struct Wrapped(std::io::Error);
        impl fmt::Display for Wrapped {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "transport error: {}", self.0)
            }
        }
        impl StdError for Wrapped {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let e = Error::new(ErrorKind::Connection, "etcd unreachable")
            .with_source(Wrapped(std::io::Error::other("refused")));
        let mut report = Vec::new();
        let mut cur: Option<&(dyn StdError + 'static)> = Some(&e);
        while let Some(err) = cur {
            report.push(err.to_string());
            cur = err.source();
        }
        let report = report.join("\n");
        assert_eq!(report.matches("transport error").count(), 1, "{report}");
        assert_eq!(report.matches("refused").count(), 2, "{report}");
        assert!(e.cause().unwrap().downcast_ref::<Wrapped>().is_some());
    }

    /// An error as the redis crate keeps an io::Error: in an `Arc`, which
    /// it gives as its `source()`.
    #[derive(Debug)]
    struct KeptInArc(std::sync::Arc<dyn StdError + Send + Sync>);
    impl fmt::Display for KeptInArc {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "io error")
        }
    }
    impl StdError for KeptInArc {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    /// The classifier goes by rustls' error type, wherever the store
    /// client keeps it (in an io::Error, whose `source()` skips it, in an
    /// `Arc`, in our own error's cause), not by what a message says.
    #[test]
    fn tls_failures_are_recognised_by_type_not_text() {
        use rustls::{AlertDescription, CertificateError};
        let io = |e: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);

        let untrusted = io(rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer,
        ));
        let outer = Error::new(ErrorKind::Connection, "request failed").with_source(untrusted);
        let e = Error::tls_failure(&outer, "etcd").expect("a TLS failure");
        assert_eq!(e.kind(), ErrorKind::Tls);
        assert!(e.to_string().contains("UnknownIssuer"), "{e}");
        assert!(e.to_string().contains("check ca="), "{e}");

        let alert = io(rustls::Error::AlertReceived(
            AlertDescription::CertificateRequired,
        ));
        let kept = KeptInArc(std::sync::Arc::new(alert));
        let e = Error::tls_failure(&kept, "Redis").expect("a TLS failure in an Arc");
        assert!(e.to_string().contains("CertificateRequired"), "{e}");
        assert!(e.to_string().contains("cert= and key="), "{e}");

        let odd = io(rustls::Error::PeerMisbehaved(
            rustls::PeerMisbehaved::IllegalMiddleboxChangeCipherSpec,
        ));
        assert!(Error::tls_failure(&odd, "x").is_some());

        // Text alone is not a TLS failure: a server error, a lock name or
        // a value may read like one.
        for text in [
            "invalid peer certificate: UnknownIssuer",
            "ERR received fatal alert in key lock/x",
        ] {
            let plain = std::io::Error::other(text);
            assert!(Error::tls_failure(&plain, "x").is_none(), "{text}");
        }
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(Error::tls_failure(&refused, "etcd").is_none());
    }

    /// h2 keeps only the kind and text of an I/O error: InvalidData
    /// without rustls' error is a TLS failure there, but a rustls error
    /// that is no verdict on the certificates stays what it is.
    #[test]
    fn invalid_data_without_a_rustls_error_is_tls_where_asked() {
        let lossy = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "received fatal alert: BadCertificate",
        );
        let outer = Error::new(ErrorKind::Connection, "transport error").with_source(lossy);
        assert!(Error::tls_failure(&outer, "etcd").is_none());
        let e = Error::tls_failure_or_invalid_data(&outer, "etcd").expect("a TLS failure");
        assert_eq!(e.kind(), ErrorKind::Tls);
        assert!(e.to_string().contains("BadCertificate"), "{e}");
        assert!(e.to_string().contains("cert= and key="), "{e}");

        let typed = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let e = Error::tls_failure_or_invalid_data(&typed, "etcd").unwrap();
        assert!(e.to_string().contains("check ca="), "{e}");
        // A TLS client at a port without TLS: rustls' own verdict (not
        // one on the certificates) stays a connection error.
        let corrupt = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
        );
        assert!(Error::tls_failure_or_invalid_data(&corrupt, "etcd").is_none());
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(Error::tls_failure_or_invalid_data(&reset, "etcd").is_none());
    }

    #[test]
    fn tls_failures_are_found_in_the_source_chain() {
        let inner = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let outer = Error::new(ErrorKind::Connection, "request failed").with_source(inner);
        let e = Error::tls_failure(&outer, "etcd").expect("a TLS failure");
        assert_eq!(e.kind(), ErrorKind::Tls);
        assert!(!e.is_retryable());
        assert!(e.to_string().contains("UnknownIssuer"), "{e}");
        assert!(e.to_string().contains("check ca="), "{e}");
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired);
        let e = Error::tls_failure(&alert, "redis").unwrap();
        assert!(e.to_string().contains("cert= and key="), "{e}");
        let plain = std::io::Error::other("connection refused");
        assert!(Error::tls_failure(&plain, "etcd").is_none());
    }
}
