//! Exit codes of the `quorumlock` command, and the mapping from errors.
//!
//! The codes follow BSD `sysexits.h` where one fits, so that scripts can
//! tell "try again later" from "fix your command line".

use std::fmt;

use quorumlock::{Error, ErrorKind};

/// Success (and the child's own exit status for `lock`).
pub const OK: u8 = 0;
/// Bad command line, lock name or store URL, no store URL at all, a scheme
/// whose backend is not built in, or `break` without `--yes` (`EX_USAGE`).
pub const USAGE: u8 = 64;
/// The store could not be reached or answered with an error
/// (`EX_UNAVAILABLE`).
pub const UNAVAILABLE: u8 = 69;
/// A bug: an invariant inside quorumlock did not hold (`EX_SOFTWARE`).
pub const SOFTWARE: u8 = 70;
/// `lock`: the lock was not acquired: held with `-n`, or not within
/// `--timeout` (`EX_TEMPFAIL`); `-E N` chooses another code.
pub const NOT_ACQUIRED: u8 = 75;
/// `lock`: the lock was lost while the command ran (session expired, lock
/// broken); the command was stopped with SIGTERM, then SIGKILL.
/// `--lost-exit-code N` chooses another code.
pub const LOCK_LOST: u8 = 76;
/// The store rejected the credentials or the permission (`EX_NOPERM`).
pub const NO_PERMISSION: u8 = 77;
/// `lock`: the command exists but could not be run (as a shell does).
pub const CANNOT_EXECUTE: u8 = 126;
/// `lock`: the command was not found (as a shell does).
pub const NOT_FOUND: u8 = 127;
/// Added to a signal number when the command, or quorumlock while
/// waiting, was ended by that signal (as a shell does).
pub const SIGNAL_BASE: u8 = 128;

/// The table printed at the end of `--help`.
pub const HELP: &str = "\
Exit status:
  0       success; for `lock`, the command's own exit status is passed on
  64      usage error: bad arguments, lock name or URL, no URL given,
          unknown scheme, `break` without --yes, NAME in use with another
          kind or --permits
  69      the store is unreachable or answered with an error
  70      internal error (a bug in quorumlock)
  75      `lock`: not acquired (held with -n, or --timeout ran out);
          -E N / --conflict-exit-code N picks another code
  76      `lock`: the lock was lost while the command ran; the command was
          sent SIGTERM, then SIGKILL after --grace; --lost-exit-code N
          picks another code
  77      the store refused the credentials or the permission
  126     `lock`: the command could not be executed
  127     `lock`: the command was not found
  128+N   `lock`: the command was killed by signal N, or quorumlock was
          interrupted by signal N while waiting for the lock, or stopped
          the command on realtime signal N

Environment:
  QUORUMLOCK_URL  the store, as for --url; there is no default (mem://,
                  which lives only inside one process, must be named)
  RUST_LOG        log filter, overrides -v (logs go to stderr, secrets
                  redacted)";

/// A failure of the command: a message for stderr and an exit code.
#[derive(Debug)]
pub struct Failure {
    /// The exit status.
    pub code: u8,
    /// What to print on stderr, without the program name; empty for
    /// nothing at all.
    pub message: String,
}

impl Failure {
    /// A failure with this code and message.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }

    /// A failure that prints nothing, only exits with `code`.
    pub fn silent(code: u8) -> Self {
        Self::new(code, String::new())
    }

    /// A usage error.
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(USAGE, message)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::new(code_of(e.kind()), e.to_string())
    }
}

/// The exit code for an error of `kind`.
pub fn code_of(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::InvalidName
        | ErrorKind::InvalidUrl
        | ErrorKind::UnknownScheme
        | ErrorKind::FeatureDisabled
        | ErrorKind::InvalidArgument
        // The name is in use with another recipe or permit count.
        | ErrorKind::Conflict => USAGE,
        ErrorKind::Timeout | ErrorKind::WouldBlock => NOT_ACQUIRED,
        ErrorKind::LockLost => LOCK_LOST,
        ErrorKind::Unauthenticated | ErrorKind::PermissionDenied => NO_PERMISSION,
        ErrorKind::Internal => SOFTWARE,
        // Connection, Store, SessionLost, Closed, UpgradeRefused
        // and kinds added later: the store did not do what we asked.
        _ => UNAVAILABLE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_errors_map_to_documented_codes() {
        assert_eq!(code_of(ErrorKind::InvalidName), USAGE);
        assert_eq!(code_of(ErrorKind::InvalidUrl), USAGE);
        assert_eq!(code_of(ErrorKind::UnknownScheme), USAGE);
        assert_eq!(code_of(ErrorKind::FeatureDisabled), USAGE);
        assert_eq!(code_of(ErrorKind::Connection), UNAVAILABLE);
        assert_eq!(code_of(ErrorKind::Unavailable), UNAVAILABLE);
        assert_eq!(code_of(ErrorKind::Timeout), NOT_ACQUIRED);
        assert_eq!(code_of(ErrorKind::WouldBlock), NOT_ACQUIRED);
        assert_eq!(code_of(ErrorKind::LockLost), LOCK_LOST);
        assert_eq!(code_of(ErrorKind::Unauthenticated), NO_PERMISSION);
        for code in [USAGE, UNAVAILABLE, NOT_ACQUIRED, LOCK_LOST, NO_PERMISSION] {
            assert!(HELP.contains(&format!("  {code} ")), "{code} undocumented");
        }
    }
}
