//! Read-write locks and counting semaphores: the same client layer and
//! guard as the mutex, with a different [`LockKind`] on the store.

use std::time::Duration;

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
    value: Option<Vec<u8>>,
    hold_limit: Option<Duration>,
}

impl RwLock {
    pub(crate) fn new(client: LockClient, name: LockName) -> Self {
        RwLock {
            client,
            name,
            value: None,
            hold_limit: None,
        }
    }

    /// This handle's entries carry `value` instead of the client's
    /// [`ClientOptions::value`](crate::ClientOptions::value).
    pub fn with_value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.value = Some(value.into());
        self
    }

    /// Every hold taken through this handle ends after `limit` at the
    /// latest, counted from its grant, even if its holder never releases
    /// and its process keeps the session alive: see
    /// [`Lock::hold_at_most`](crate::Lock::hold_at_most).
    pub fn hold_at_most(mut self, limit: Duration) -> Self {
        self.hold_limit = Some(limit);
        self
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
            .acquire_limited(
                &self.name,
                LockKind::Read,
                Mode::Wait,
                self.value.as_deref(),
                self.hold_limit,
                1,
            )
            .await
    }

    /// Takes a read hold only if no writer holds or waits ahead.
    ///
    /// # Cancel safety
    /// As [`read`](Self::read).
    pub async fn try_read(&self) -> Result<LockGuard> {
        self.client
            .acquire_limited(
                &self.name,
                LockKind::Read,
                Mode::Try,
                self.value.as_deref(),
                self.hold_limit,
                1,
            )
            .await
    }

    /// Waits at most `timeout` for a read hold.
    ///
    /// # Cancel safety
    /// As [`read`](Self::read).
    pub async fn read_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        let mode = Mode::within(timeout);
        self.client
            .acquire_limited(
                &self.name,
                LockKind::Read,
                mode,
                self.value.as_deref(),
                self.hold_limit,
                1,
            )
            .await
    }

    /// Waits until held for reading, upgradeable: beside readers, but
    /// never beside a writer or another upgradeable reader, so that its
    /// holder can [`upgrade`](LockGuard::upgrade) to write without
    /// deadlock and without queueing again. A second upgradeable reader
    /// waits, as a writer does.
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
    /// on a store without
    /// [`Capabilities::upgradeable_read`](crate::backend::Capabilities::upgradeable_read),
    /// before anything is written.
    ///
    /// # Cancel safety
    /// As [`read`](Self::read).
    pub async fn upgradeable_read(&self) -> Result<LockGuard> {
        self.upgradeable_in(Mode::Wait).await
    }

    /// Takes an upgradeable read hold only if no writer or upgradeable
    /// reader holds or waits ahead.
    ///
    /// # Cancel safety
    /// As [`read`](Self::read).
    pub async fn try_upgradeable_read(&self) -> Result<LockGuard> {
        self.upgradeable_in(Mode::Try).await
    }

    /// Waits at most `timeout` for an upgradeable read hold.
    ///
    /// # Cancel safety
    /// As [`read`](Self::read).
    pub async fn upgradeable_read_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        self.upgradeable_in(Mode::within(timeout)).await
    }

    async fn upgradeable_in(&self, mode: Mode) -> Result<LockGuard> {
        let backend = self.client.backend();
        if !backend.capabilities().upgradeable_read {
            return Err(crate::Error::new(
                crate::ErrorKind::InvalidArgument,
                format!(
                    "{}: the store {} has no upgradeable read locks",
                    self.name,
                    backend.describe()
                ),
            ));
        }
        self.client
            .acquire_limited(
                &self.name,
                LockKind::Upgradeable,
                mode,
                self.value.as_deref(),
                self.hold_limit,
                1,
            )
            .await
    }

    /// Waits until held for writing (alone).
    ///
    /// # Cancel safety
    /// As [`read`](Self::read).
    pub async fn write(&self) -> Result<LockGuard> {
        self.client
            .acquire_limited(
                &self.name,
                LockKind::Write,
                Mode::Wait,
                self.value.as_deref(),
                self.hold_limit,
                1,
            )
            .await
    }

    /// Takes the write hold only if nobody holds or waits.
    ///
    /// # Cancel safety
    /// As [`read`](Self::read).
    pub async fn try_write(&self) -> Result<LockGuard> {
        self.client
            .acquire_limited(
                &self.name,
                LockKind::Write,
                Mode::Try,
                self.value.as_deref(),
                self.hold_limit,
                1,
            )
            .await
    }

    /// Waits at most `timeout` for the write hold.
    ///
    /// # Cancel safety
    /// As [`read`](Self::read).
    pub async fn write_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        let mode = Mode::within(timeout);
        self.client
            .acquire_limited(
                &self.name,
                LockKind::Write,
                mode,
                self.value.as_deref(),
                self.hold_limit,
                1,
            )
            .await
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
    value: Option<Vec<u8>>,
    hold_limit: Option<Duration>,
}

impl Semaphore {
    pub(crate) fn new(client: LockClient, name: LockName, permits: u32) -> Self {
        Semaphore {
            client,
            name,
            permits,
            value: None,
            hold_limit: None,
        }
    }

    /// This handle's entries carry `value` instead of the client's
    /// [`ClientOptions::value`](crate::ClientOptions::value).
    pub fn with_value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.value = Some(value.into());
        self
    }

    /// Every hold taken through this handle ends after `limit` at the
    /// latest, counted from its grant, even if its holder never releases
    /// and its process keeps the session alive: see
    /// [`Lock::hold_at_most`](crate::Lock::hold_at_most).
    pub fn hold_at_most(mut self, limit: Duration) -> Self {
        self.hold_limit = Some(limit);
        self
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
        self.many(1, Mode::Wait).await
    }

    /// Takes a permit only if one is free now.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<LockGuard> {
        self.many(1, Mode::Try).await
    }

    /// Waits at most `timeout` for a permit.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        let mode = Mode::within(timeout);
        self.many(1, mode).await
    }

    /// Waits for `count` permits, taken at once: never some of them, and
    /// in arrival order with every other request (a large request is not
    /// overtaken by smaller ones that came later; they wait behind it).
    /// The guard holds all of them ([`LockGuard::count`]) and releases all
    /// of them. `count` must be 1 to [`permits`](Self::permits), on a store
    /// with [`Capabilities::acquire_many`](crate::backend::Capabilities::acquire_many):
    /// else [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
    /// and nothing written.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_many(&self, count: u32) -> Result<LockGuard> {
        self.many(count, Mode::Wait).await
    }

    /// Takes `count` permits only if that many are free now and nobody
    /// waits ahead; as [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire_many(&self, count: u32) -> Result<LockGuard> {
        self.many(count, Mode::Try).await
    }

    /// Waits at most `timeout` for `count` permits; as
    /// [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_many_timeout(&self, count: u32, timeout: Duration) -> Result<LockGuard> {
        self.many(count, Mode::within(timeout)).await
    }

    async fn many(&self, count: u32, mode: Mode) -> Result<LockGuard> {
        self.client
            .acquire_limited(
                &self.name,
                self.kind(),
                mode,
                self.value.as_deref(),
                self.hold_limit,
                count,
            )
            .await
    }

    /// Holders and waiters.
    ///
    /// # Cancel safety
    /// Read-only; safe to drop.
    pub async fn inspect(&self) -> Result<LockState> {
        self.client.backend().inspect(&self.name).await
    }
}
