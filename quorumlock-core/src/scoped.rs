//! "Lock, run this, always unlock": work that stops the moment its lock
//! is lost.

use std::future::Future;

use crate::{Error, ErrorKind, Lock, LockGuard, LossReason, MultiGuard, MultiLock, Result};

/// The error of work stopped because its lock was lost.
fn stopped(what: &str, reason: LossReason) -> Error {
    Error::new(
        ErrorKind::LockLost,
        format!("{what} was lost while the work ran ({reason}); the work was stopped"),
    )
}

/// Runs `work` while `lost` has not fired; the work's future is dropped
/// the moment it does.
async fn run_while_held<T>(
    work: impl Future<Output = T>,
    lost: impl Future<Output = LossReason>,
    what: &str,
) -> Result<T> {
    tokio::select! {
        // Loss first: a value computed after the lock was gone is not
        // handed out as if it had been protected.
        biased;
        reason = lost => Err(stopped(what, reason)),
        value = work => Ok(value),
    }
}

impl Lock {
    /// Acquires the lock, runs `work` with the guard, and releases.
    ///
    /// If the lock is lost while `work` runs, `work`'s future is dropped at
    /// once (within the loss signal's bound, see [`LockGuard::lost`]) and
    /// the result is [`ErrorKind::LockLost`]. Also `LockLost` if the lock
    /// turns out lost at the release, after `work` returned: its effects
    /// were then not fully protected. The lock is released in every case.
    ///
    /// ```no_run
    /// # async fn f(client: quorumlock_core::LockClient) -> quorumlock_core::Result<()> {
    /// let lock = client.lock("reports/daily")?;
    /// let rows = lock
    ///     .run(async |guard| {
    ///         // write with guard.token() as the fencing token ...
    ///         guard.token()
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Dropping the future drops `work` and queues the release (or the
    /// removal of the pending entry) in the background, as dropping a
    /// [`LockGuard`] does.
    pub async fn run<T>(&self, work: impl AsyncFnOnce(&LockGuard) -> T) -> Result<T> {
        let guard = self.acquire().await?;
        let what = format!("lock {}", guard.name());
        let value = run_while_held(work(&guard), guard.lost(), &what).await;
        finish(value, guard.release().await)
    }
}

impl MultiLock {
    /// Acquires the whole set, runs `work` with the guard, and releases;
    /// as [`Lock::run`], the work is dropped when any lock of the set is
    /// lost.
    ///
    /// # Cancel safety
    /// As [`Lock::run`].
    pub async fn run<T>(&self, work: impl AsyncFnOnce(&MultiGuard) -> T) -> Result<T> {
        let guard = self.acquire().await?;
        let value = run_while_held(work(&guard), guard.lost(), "a lock of the set").await;
        finish(value, guard.release().await)
    }
}

/// The work's outcome, unless the release found the lock already lost.
fn finish<T>(value: Result<T>, released: Result<()>) -> Result<T> {
    let value = value?;
    released.map(|()| value)
}
