//! Read-write locks and counting semaphores: the same client layer and
//! guard as the mutex, with a different [`LockKind`] on the store.

use std::time::Duration;

use tokio::time::Instant;

use crate::client::Mode;
use crate::{LockClient, LockGuard, LockName, Result};
use crate::{LockKind, LockState};

/// A named read-write lock; see [`LockClient::rwlock`].
///
/// Each reader and writer is its own entry on the store, served in arrival
/// order: a reader waits only for the nearest writer ahead of it, a writer
/// for everyone ahead of it. A write holder may re-enter for reading
/// ([`LockGuard::reenter_read`]); a read holder asking to write is refused
/// ([`LockGuard::reenter_write`]). A second `read()` or `write()` call is a
/// new owner, like a second `acquire()` on a mutex.
#[derive(Clone, Debug)]
pub struct RwLock {
    client: LockClient,
    name: LockName,
}

impl RwLock {
    pub(crate) fn new(client: LockClient, name: LockName) -> Self {
        RwLock { client, name }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// Waits until held for reading.
    ///
    /// # Cancel safety
    /// Dropping the future at any await point leaves nothing on the store
    /// once the background cleanup has run.
    pub async fn read(&self) -> Result<LockGuard> {
        self.client
            .acquire(&self.name, LockKind::Read, Mode::Wait)
            .await
    }

    /// Takes a read hold only if no writer holds or waits ahead.
    ///
    /// # Cancel safety
    /// As [`read`](Self::read).
    pub async fn try_read(&self) -> Result<LockGuard> {
        self.client
            .acquire(&self.name, LockKind::Read, Mode::Try)
            .await
    }

    /// Waits at most `timeout` for a read hold.
    ///
    /// # Cancel safety
    /// As [`read`](Self::read).
    pub async fn read_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        let mode = Mode::Until(Instant::now() + timeout);
        self.client.acquire(&self.name, LockKind::Read, mode).await
    }

    /// Waits until held for writing (alone).
    ///
    /// # Cancel safety
    /// As [`read`](Self::read).
    pub async fn write(&self) -> Result<LockGuard> {
        self.client
            .acquire(&self.name, LockKind::Write, Mode::Wait)
            .await
    }

    /// Takes the write hold only if nobody holds or waits.
    ///
    /// # Cancel safety
    /// As [`read`](Self::read).
    pub async fn try_write(&self) -> Result<LockGuard> {
        self.client
            .acquire(&self.name, LockKind::Write, Mode::Try)
            .await
    }

    /// Waits at most `timeout` for the write hold.
    ///
    /// # Cancel safety
    /// As [`read`](Self::read).
    pub async fn write_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        let mode = Mode::Until(Instant::now() + timeout);
        self.client.acquire(&self.name, LockKind::Write, mode).await
    }

    /// Holders and waiters.
    ///
    /// # Cancel safety
    /// Read-only; safe to drop.
    pub async fn inspect(&self) -> Result<LockState> {
        self.client.backend().inspect(&self.name).await
    }
}

/// A named counting semaphore; see [`LockClient::semaphore`].
#[derive(Clone, Debug)]
pub struct Semaphore {
    client: LockClient,
    name: LockName,
    permits: u32,
}

impl Semaphore {
    pub(crate) fn new(client: LockClient, name: LockName, permits: u32) -> Self {
        Semaphore {
            client,
            name,
            permits,
        }
    }

    /// The semaphore's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// Holders allowed at once.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    fn kind(&self) -> LockKind {
        LockKind::Semaphore {
            permits: self.permits,
        }
    }

    /// Waits for a permit, in arrival order.
    ///
    /// # Cancel safety
    /// Dropping the future at any await point leaves nothing on the store
    /// once the background cleanup has run.
    pub async fn acquire(&self) -> Result<LockGuard> {
        self.client
            .acquire(&self.name, self.kind(), Mode::Wait)
            .await
    }

    /// Takes a permit only if one is free now.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<LockGuard> {
        self.client
            .acquire(&self.name, self.kind(), Mode::Try)
            .await
    }

    /// Waits at most `timeout` for a permit.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        let mode = Mode::Until(Instant::now() + timeout);
        self.client.acquire(&self.name, self.kind(), mode).await
    }

    /// Holders and waiters.
    ///
    /// # Cancel safety
    /// Read-only; safe to drop.
    pub async fn inspect(&self) -> Result<LockState> {
        self.client.backend().inspect(&self.name).await
    }
}
