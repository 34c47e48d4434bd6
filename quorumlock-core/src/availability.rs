//! When a store cannot be reached, an acquire says so instead of retrying
//! forever in silence; when it times out on a held lock, it says who holds
//! it.

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Backend;
use crate::{Error, ErrorKind, LockName};

/// Options of a [`crate::LockClient`]; see
/// [`LockClient::with_options`](crate::LockClient::with_options).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    /// How long a waiting acquire keeps trying while it cannot open a
    /// session on the store (unreachable, refusing, or not answering)
    /// before it returns [`ErrorKind::Unavailable`]; `None` waits forever
    /// (until the acquire's own deadline). Default: 60 s.
    pub unavailable_after: Option<Duration>,
    /// The value every entry of this client carries, so that `inspect`,
    /// `status` and a timed-out acquire can say who holds a lock (a lock
    /// may set its own with [`Lock::with_value`](crate::Lock::with_value)).
    /// Default: [`default_value`], `<hostname>:<pid>`.
    pub value: Vec<u8>,
}

/// The default holder value: `<hostname>:<pid>` of this process.
pub fn default_value() -> Vec<u8> {
    format!(
        "{}:{}",
        gethostname::gethostname().to_string_lossy(),
        std::process::id()
    )
    .into_bytes()
}

/// The default of [`ClientOptions::unavailable_after`].
pub const DEFAULT_UNAVAILABLE_AFTER: Duration = Duration::from_secs(60);

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            unavailable_after: Some(DEFAULT_UNAVAILABLE_AFTER),
            value: default_value(),
        }
    }
}

impl ClientOptions {
    /// Sets [`ClientOptions::unavailable_after`] (`None`: wait forever).
    pub fn with_unavailable_after(mut self, after: Option<Duration>) -> Self {
        self.unavailable_after = after;
        self
    }

    /// Sets [`ClientOptions::value`].
    pub fn with_value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.value = value.into();
        self
    }

    /// The former name of [`ClientOptions::with_unavailable_after`].
    #[doc(hidden)]
    pub fn unavailable_after(self, after: Option<Duration>) -> Self {
        self.with_unavailable_after(after)
    }
}

/// How often a still-unreachable store is logged at warn level.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The state of one acquire's trouble reaching the store: since when, and
/// when it was last logged at warn level.
pub(crate) struct Unreachable {
    after: Option<Duration>,
    since: Option<Instant>,
    warned: Option<Instant>,
}

impl Unreachable {
    pub(crate) fn new(options: &ClientOptions) -> Self {
        Unreachable {
            after: options.unavailable_after,
            since: None,
            warned: None,
        }
    }

    /// When opening a session must have succeeded: the trouble's start (or
    /// now, for an attempt that has had none yet) plus the limit.
    pub(crate) fn open_by(&self) -> Option<Instant> {
        let since = self.since.unwrap_or_else(Instant::now);
        // A limit too long for the clock to add (`Duration::MAX`): none.
        self.after.and_then(|a| since.checked_add(a))
    }

    /// Once in trouble, when to give up.
    pub(crate) fn give_up_at(&self) -> Option<Instant> {
        self.since?.checked_add(self.after?)
    }

    /// A session could not be opened, or an attempt failed on the link;
    /// the trouble started no later than `started`.
    pub(crate) fn failed(&mut self, store: &str, error: &Error, started: Instant) {
        let now = Instant::now();
        let since = *self.since.get_or_insert(started);
        if self.warned.is_none_or(|w| now >= w + WARN_EVERY) {
            self.warned = Some(now);
            tracing::warn!(
                %error,
                store,
                for_ms = (now - since).as_millis() as u64,
                "cannot reach the store; retrying"
            );
        } else {
            tracing::debug!(%error, "cannot reach the store; retrying");
        }
    }

    /// The store answered (a new session): the trouble is over.
    pub(crate) fn recovered(&mut self) {
        if self.since.take().is_some() {
            tracing::info!("the store answers again");
        }
        self.warned = None;
    }

    /// The error once the limit passed.
    pub(crate) fn error(&self, name: &LockName, store: &str) -> Error {
        let waited = self.since.map_or(Duration::ZERO, |s| s.elapsed());
        Error::new(
            ErrorKind::Unavailable,
            format!(
                "lock {name}: the store {store} could not be reached for {:.1}s; gave up",
                waited.as_secs_f64()
            ),
        )
    }
}

/// `timeout` with the current holders of `name` named in its message, if
/// the store tells them before `by`.
pub(crate) async fn name_holders(
    backend: &dyn Backend,
    name: &LockName,
    timeout: Error,
    by: Instant,
) -> Error {
    let Ok(Ok(state)) = tokio::time::timeout_at(by, backend.inspect(name)).await else {
        return timeout;
    };
    let holders: Vec<String> = state
        .holders
        .iter()
        .map(|h| match h.value.is_empty() {
            true => format!("session {} (token {})", h.session, h.token),
            false => format!(
                "{:?} (session {}, token {})",
                h.value_text(),
                h.session,
                h.token
            ),
        })
        .collect();
    if holders.is_empty() {
        return timeout;
    }
    Error::new(
        ErrorKind::Timeout,
        format!(
            "{}; held by {}{}",
            timeout.message(),
            holders.join(", "),
            match state.waiters.len() {
                0 => String::new(),
                n => format!(", {n} waiting"),
            }
        ),
    )
}
