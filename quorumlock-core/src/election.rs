//! Leader election, built once on the lock machinery: a candidate is an
//! entry of kind [`LockKind::Election`] carrying its value; the first
//! entry leads. Backends only lay the entries out as their store's own
//! election recipe does (etcd's `concurrency.Election`, Curator's
//! `LeaderLatch`), so that native candidates and ours form one election,
//! and rewrite a leader's value in place
//! ([`StoreSession::set_value`](crate::backend::StoreSession::set_value)).

use std::future::Future;
use std::time::Duration;

use futures::Stream;

use crate::client::Mode;
use crate::{LockClient, LockGuard, LockKind, LockName, LossReason, Result};

/// How often [`Election::observe`] reads the election by default.
pub const DEFAULT_OBSERVE_INTERVAL: Duration = Duration::from_millis(250);

/// A named election on a client; see [`LockClient::election`].
#[derive(Clone, Debug)]
pub struct Election {
    client: LockClient,
    name: LockName,
    interval: Duration,
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
            interval: DEFAULT_OBSERVE_INTERVAL,
        }
    }

    /// The election's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// How often [`observe`](Self::observe) reads the leader (default
    /// [`DEFAULT_OBSERVE_INTERVAL`]).
    pub fn with_observe_interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(10));
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
        let state = self.client.backend().inspect(&self.name).await?;
        Ok(state.holders.into_iter().next().map(|h| Leader {
            value: h.value,
            token: h.token,
            session: h.session,
        }))
    }

    /// The leader now, then every change of leader or of its value
    /// (`None`: nobody leads). It reads the store every
    /// [`with_observe_interval`](Self::with_observe_interval), so a change
    /// shorter than that may be missed; an error is yielded and the stream
    /// goes on.
    ///
    /// # Cancel Safety
    /// Read-only; drop the stream at any point.
    pub fn observe(&self) -> impl Stream<Item = Result<Option<Leader>>> + Send + 'static {
        let election = self.clone();
        futures::stream::unfold(
            (election, None::<Option<Leader>>, true),
            |(e, last, first)| async move {
                if !first {
                    tokio::time::sleep(e.interval).await;
                }
                loop {
                    match e.leader().await {
                        Ok(now) if last.as_ref() == Some(&now) => {
                            tokio::time::sleep(e.interval).await;
                        }
                        Ok(now) => return Some((Ok(now.clone()), (e, Some(now), false))),
                        Err(err) => return Some((Err(err), (e, last, false))),
                    }
                }
            },
        )
    }
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
