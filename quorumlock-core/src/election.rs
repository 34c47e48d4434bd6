//! Leader election, built once on the lock machinery: a candidate is an
//! entry of kind [`LockKind::Election`] carrying its value; the first
//! entry leads. Backends only lay the entries out as their store's own
//! election recipe does (etcd's `concurrency.Election`, Curator's
//! `LeaderLatch`), so that native candidates and ours form one election,
//! and rewrite a leader's value in place
//! ([`StoreSession::set_value`](crate::backend::StoreSession::set_value)).

use std::future::Future;
use std::time::Duration;

use futures::{Stream, StreamExt};

use crate::client::Mode;
use crate::{Follow, LockClient, LockGuard, LockKind, LockName, LossReason, Result};

/// A named election on a client; see [`LockClient::election`].
#[derive(Clone, Debug)]
pub struct Election {
    client: LockClient,
    name: LockName,
    follow: Follow,
}

/// The current leader of an election, as the store shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leader's value (its proposal; for native candidates what their
    /// tool wrote: `etcdctl elect`'s proposal, a `LeaderLatch`'s id).
    pub value: Vec<u8>,
    /// The leader's fencing token (its entry's create revision, czxid or
    /// index): a later leader always has a larger one.
    pub token: u64,
    /// The leader's store session.
    pub session: String,
}

impl Leader {
    /// [`Leader::value`] as text (invalid UTF-8 replaced), for display.
    pub fn value_text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.value)
    }
}

impl Election {
    pub(crate) fn new(client: LockClient, name: LockName) -> Self {
        Election {
            client,
            name,
            follow: Follow::Notifications,
        }
    }

    /// The election's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// Makes [`observe`](Self::observe) read the leader every `interval`
    /// instead of following the store's change notifications (the
    /// default): a leadership shorter than `interval` can then be missed.
    pub fn with_observe_interval(self, interval: Duration) -> Self {
        self.with_follow(Follow::Poll(interval))
    }

    /// How [`observe`](Self::observe) learns of changes (default
    /// [`Follow::Notifications`]).
    pub fn with_follow(mut self, follow: Follow) -> Self {
        self.follow = follow;
        self
    }

    /// Joins the election with `value` and waits until this candidate
    /// leads. Candidates lead in arrival order.
    ///
    /// # Cancel Safety
    /// Dropping the future at any await point withdraws the candidacy:
    /// nothing is left on the store once the background cleanup has run
    /// ([`LockClient::wait_idle`]).
    pub async fn campaign(&self, value: impl Into<Vec<u8>>) -> Result<LeaderGuard> {
        let value = value.into();
        self.campaign_in(Mode::Wait, value).await
    }

    /// As [`campaign`](Self::campaign), giving up after `timeout` with
    /// [`crate::ErrorKind::Timeout`] (which names the current leader).
    ///
    /// # Cancel Safety
    /// As [`campaign`](Self::campaign).
    pub async fn campaign_timeout(
        &self,
        value: impl Into<Vec<u8>>,
        timeout: Duration,
    ) -> Result<LeaderGuard> {
        let value = value.into();
        self.campaign_in(Mode::within(timeout), value).await
    }

    async fn campaign_in(&self, mode: Mode, value: Vec<u8>) -> Result<LeaderGuard> {
        let guard = self
            .client
            .acquire(&self.name, LockKind::Election, mode, Some(&value))
            .await?;
        Ok(LeaderGuard { guard, value })
    }

    /// The current leader, if any.
    ///
    /// # Cancel Safety
    /// Read-only; safe to drop.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        Ok(leader_of(self.client.backend().inspect(&self.name).await?))
    }

    /// The leader now, then every change of leader or of its value
    /// (`None`: nobody leads), in order. By default a read follows each
    /// change the store notifies ([`Follow::Notifications`]): nothing is
    /// read while nothing changes, and a leadership is seen if it lasts
    /// until the read after the change that began it (about a round trip
    /// later, more while the observer's process is busy); a shorter one
    /// may be merged into the next report.
    /// After a broken watch, the first read reports what changed
    /// meanwhile (the leadership in between, if any, is not seen). An
    /// error is yielded and the stream goes on.
    ///
    /// # Cancel Safety
    /// Read-only; drop the stream at any point.
    pub fn observe(&self) -> impl Stream<Item = Result<Option<Leader>>> + Send + 'static {
        let states = crate::watch::states(self.client.clone(), self.name.clone(), self.follow);
        states
            .scan(None::<Option<Leader>>, |last, state| {
                let item = match state {
                    Ok(state) => {
                        let now = leader_of(state);
                        if last.as_ref() == Some(&now) {
                            None
                        } else {
                            *last = Some(now.clone());
                            Some(Ok(now))
                        }
                    }
                    Err(e) => Some(Err(e)),
                };
                futures::future::ready(Some(item))
            })
            .filter_map(futures::future::ready)
    }
}

/// The leader a lock's state shows: its first holder.
fn leader_of(state: crate::LockState) -> Option<Leader> {
    state.holders.into_iter().next().map(|h| Leader {
        value: h.value,
        token: h.token,
        session: h.session,
    })
}

/// Leadership: held until [`resign`](Self::resign), drop, or loss.
#[derive(Debug)]
#[must_use = "leadership ends when the guard is dropped: keep it while you lead"]
pub struct LeaderGuard {
    guard: LockGuard,
    value: Vec<u8>,
}

impl LeaderGuard {
    /// The leader's fencing token.
    pub fn token(&self) -> u64 {
        self.guard.token()
    }

    /// The value this leader proclaims now.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// Whether this candidate still leads, as far as this client knows.
    pub fn is_leader(&self) -> bool {
        self.guard.is_held()
    }

    /// Resolves when leadership is lost (session expired, entry deleted,
    /// client closed); see [`LockGuard::lost`].
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        self.guard.lost()
    }

    /// The underlying hold, for fenced writes and the loss details.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// The underlying hold, to keep it past this guard (it releases, as
    /// any [`LockGuard`], on drop or [`LockGuard::release`]).
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }

    /// Changes the value observers see, keeping leadership and token. Only
    /// while still leading: else [`crate::ErrorKind::LockLost`] and nothing
    /// written.
    ///
    /// # Cancel Safety
    /// One store write: dropped, the value may or may not have changed.
    pub async fn proclaim(&mut self, value: impl Into<Vec<u8>>) -> Result<()> {
        let value = value.into();
        self.guard.set_value(value.clone()).await?;
        self.value = value;
        Ok(())
    }

    /// Steps down: our entry is removed and the next candidate leads.
    ///
    /// # Cancel Safety
    /// As [`LockGuard::release`]: dropped, the resignation goes on in the
    /// background.
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }
}

impl LockClient {
    /// A handle to the election `name`. Candidates queue as mutex
    /// contenders do; each store uses its native election layout (see the
    /// backend's README for which native tools share it).
    pub fn election(&self, name: impl AsRef<str>) -> Result<Election> {
        Ok(Election::new(self.clone(), LockName::new(name.as_ref())?))
    }
}
