//! Following one lock's state as it changes: the store's own change
//! notification ([`Backend::changes`](crate::backend::Backend::changes))
//! tells when to read, so nothing is read while nothing changes. Shared by
//! [`crate::Election::observe`] and `quorumlock status --watch`.

use std::time::Duration;

use futures::{Stream, StreamExt};

use crate::backend::{Backoff, ChangeFeed};
use crate::{LockClient, LockName, LockState, Result};

/// How often a watch reads the lock where the store cannot notify, or
/// when [`Follow::Poll`] asks for it without an interval of its own.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// The shortest interval [`Follow::Poll`] reads at (a shorter one is
/// raised to it).
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// How a watch learns that a lock changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Follow {
    /// The store's own change notification (etcd watch, ZooKeeper watch,
    /// Consul blocking query, Redis pub/sub, PostgreSQL `LISTEN`, the mem
    /// store's own): a read after each change, none while nothing
    /// changes. A store that cannot notify is read every
    /// [`DEFAULT_POLL_INTERVAL`] instead.
    #[default]
    Notifications,
    /// A read every interval (at least [`MIN_POLL_INTERVAL`]), whatever
    /// the store: a change shorter than the interval can be missed.
    Poll(Duration),
}

impl LockClient {
    /// `name`'s state now, then a state after each change of its entries,
    /// as `follow` learns of them. Changes that come close together may be
    /// read as one, and a state may repeat (a change that was undone, or
    /// one that touched only a waiter): compare what you care about.
    /// An error (a failed read, a watch the store ended) is yielded and
    /// the stream goes on: it reads again (with backoff) and sets up a new
    /// watch, whose first read reports what changed meanwhile. It never
    /// ends by itself.
    ///
    /// # Cancel Safety
    /// Read-only; drop the stream at any point (its watch ends with it).
    pub fn watch(
        &self,
        name: impl AsRef<str>,
        follow: Follow,
    ) -> Result<impl Stream<Item = Result<LockState>> + Send + 'static> {
        let name = LockName::new(name.as_ref())?;
        Ok(states(self.clone(), name, follow))
    }
}

/// The stream behind [`LockClient::watch`].
pub(crate) fn states(
    client: LockClient,
    name: LockName,
    follow: Follow,
) -> impl Stream<Item = Result<LockState>> + Send + 'static {
    let follow = match follow {
        Follow::Poll(every) => Follow::Poll(every.max(MIN_POLL_INTERVAL)),
        f => f,
    };
    let watcher = Watcher {
        client,
        name,
        follow,
        feed: None,
        // Following notifications, the first read waits for the watch to
        // be in place (the feed's first item), or a change in between
        // would be missed.
        read_due: matches!(follow, Follow::Poll(_)),
        retry: None,
        backoff: Backoff::new(Duration::from_millis(50), Duration::from_secs(2)),
    };
    futures::stream::unfold(watcher, |mut w| async move {
        let item = w.next().await;
        Some((item, w))
    })
}

struct Watcher {
    client: LockClient,
    name: LockName,
    follow: Follow,
    /// The store's change feed, once opened (never for polling).
    feed: Option<ChangeFeed>,
    /// A read is owed: the first one, one after a change, or one that
    /// failed.
    read_due: bool,
    /// Wait this long before the next read or watch: the last one failed.
    retry: Option<Duration>,
    backoff: Backoff,
}

impl Watcher {
    async fn next(&mut self) -> Result<LockState> {
        loop {
            if let Some(pause) = self.retry.take() {
                tokio::time::sleep(pause).await;
            }
            if self.read_due {
                return match self.client.backend().inspect(&self.name).await {
                    Ok(state) => {
                        self.read_due = false;
                        self.backoff.reset();
                        Ok(state)
                    }
                    Err(e) => {
                        self.retry = Some(self.backoff.next_delay());
                        Err(e)
                    }
                };
            }
            let poll = match self.follow {
                Follow::Poll(every) => Some(every),
                Follow::Notifications if self.feed.is_none() => {
                    match self.client.backend().changes(&self.name) {
                        Some(feed) => {
                            self.feed = Some(feed);
                            None
                        }
                        None => {
                            // The store cannot notify: poll, from now.
                            self.follow = Follow::Poll(DEFAULT_POLL_INTERVAL);
                            self.read_due = true;
                            continue;
                        }
                    }
                }
                Follow::Notifications => None,
            };
            if let Some(every) = poll {
                tokio::time::sleep(every).await;
                self.read_due = true;
                continue;
            }
            let feed = self.feed.as_mut().expect("opened above");
            match feed.next().await {
                // The watch is in place (the first item) or something
                // changed: read.
                Some(Ok(())) => self.read_due = true,
                // The feed broke, or could not be set up (no connection or
                // session to spare, a trigger missing): read anyway after
                // the pause, and try a new feed after that, so that the
                // caller gets states (every pause, at most 2 s) while no
                // feed can be had.
                Some(Err(e)) => {
                    tracing::debug!(lock = %self.name, error = %e, "the store's change feed broke");
                    self.feed = None;
                    self.read_due = true;
                    self.retry = Some(self.backoff.next_delay());
                    return Err(e);
                }
                None => {
                    self.feed = None;
                    self.read_due = true;
                    self.retry = Some(self.backoff.next_delay());
                }
            }
        }
    }
}
