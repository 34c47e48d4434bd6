//! Several locks taken all-or-nothing, in one canonical order.
//!
//! Two programs that each hold one lock and wait for the other's deadlock
//! forever. [`MultiLock`] takes its names in one order (sorted by name,
//! duplicates removed) whatever order the caller gave, so two multi-locks
//! over overlapping sets never wait for each other in a cycle. A set may
//! mix kinds (mutexes, either side of a read-write lock, semaphore
//! permits): each name is taken once, as its kind, in the same order.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use futures::future::{select_all, FutureExt};
use tokio::time::Instant;

use crate::client::{abandon_bound, Mode};
use crate::{Error, ErrorKind, LockClient, LockGuard, LockKind, LockName, LossReason, Result};

/// A set of named locks acquired together ([`LockClient::multi_lock`],
/// [`LockClient::multi_lock_of`]).
#[derive(Clone)]
pub struct MultiLock {
    client: LockClient,
    /// In canonical order: sorted by name, no duplicates.
    members: Vec<(LockName, LockKind)>,
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.members.iter().map(|(n, k)| (n, k)))
            .finish()
    }
}

/// How long one attempt of the set may wait.
#[derive(Clone, Copy)]
enum Wait {
    Forever,
    Until(Instant),
    No,
}

impl LockClient {
    /// A handle to the mutexes `names`, to be held all at once.
    ///
    /// The names are taken in sorted order (duplicates count once), so two
    /// clients that ask for the same names in different orders cannot
    /// deadlock. Errors: [`ErrorKind::InvalidName`] for a bad name,
    /// [`ErrorKind::InvalidArgument`] for an empty set.
    pub fn multi_lock<I>(&self, names: I) -> Result<MultiLock>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        self.multi_lock_of(names.into_iter().map(|n| (n, LockKind::Exclusive)))
    }

    /// A handle to a set of locks of any kinds, to be held all at once:
    /// each name with what to take on it, a mutex
    /// ([`LockKind::Exclusive`]), the read or the write side of a
    /// read-write lock ([`LockKind::Read`], [`LockKind::Write`]), or a
    /// permit of a semaphore ([`LockKind::Semaphore`]).
    ///
    /// As [`multi_lock`](Self::multi_lock): taken in sorted order of the
    /// names, so sets over the same names in any order, of any kinds,
    /// cannot deadlock. A name given twice with one kind counts once;
    /// with two kinds it is [`ErrorKind::InvalidArgument`] (a read and a
    /// write of one lock would wait for each other), as is an election or
    /// an empty set or a semaphore of no permit; [`ErrorKind::InvalidName`]
    /// for a bad name. Nothing is written for a refused set. Fenced writes
    /// over the set ([`MultiGuard::fenced_put`]) need a mutex or a write
    /// side among its members and no semaphore permit (read sides are
    /// checked as the others: the write applies only while every member
    /// is still held).
    pub fn multi_lock_of<I, S>(&self, members: I) -> Result<MultiLock>
    where
        I: IntoIterator<Item = (S, LockKind)>,
        S: AsRef<str>,
    {
        let mut members = members
            .into_iter()
            .map(|(n, kind)| Ok((LockName::new(n.as_ref())?, kind)))
            .collect::<Result<Vec<_>>>()?;
        if members.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "a multi-lock needs at least one name",
            ));
        }
        for (name, kind) in &members {
            match kind {
                LockKind::Election => {
                    return Err(Error::new(
                        ErrorKind::InvalidArgument,
                        format!("a multi-lock cannot campaign in an election ({name})"),
                    ))
                }
                LockKind::Upgradeable | LockKind::Upgrade => {
                    return Err(Error::new(
                        ErrorKind::InvalidArgument,
                        format!(
                            "a multi-lock cannot take an upgradeable read or an upgrade ({name}): \
                             take the read or write side"
                        ),
                    ))
                }
                LockKind::Semaphore { permits: 0 } => {
                    return Err(Error::new(
                        ErrorKind::InvalidArgument,
                        format!("semaphore {name} needs at least one permit"),
                    ))
                }
                _ => {}
            }
        }
        members.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        members.dedup();
        if let Some(w) = members.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "a multi-lock takes {} once, not as {:?} and as {:?}",
                    w[0].0, w[0].1, w[1].1
                ),
            ));
        }
        Ok(MultiLock {
            client: self.clone(),
            members,
        })
    }
}

impl MultiLock {
    /// The names, in the order they are taken.
    pub fn names(&self) -> impl Iterator<Item = &LockName> {
        self.members.iter().map(|(n, _)| n)
    }

    /// Each name with what is taken on it, in the order they are taken.
    pub fn members(&self) -> impl Iterator<Item = (&LockName, LockKind)> {
        self.members.iter().map(|(n, k)| (n, *k))
    }

    /// Waits until every lock of the set is held.
    ///
    /// If a lock already taken is lost while a later one is awaited, all
    /// are given back and the set is taken again from the first name.
    ///
    /// # Cancel safety
    /// Dropping the future releases the locks taken so far and removes the
    /// pending entry, in the background ([`LockClient::wait_idle`]).
    pub async fn acquire(&self) -> Result<MultiGuard> {
        self.take(Wait::Forever).await
    }

    /// Takes the set only if every lock is free now; else
    /// [`ErrorKind::WouldBlock`], and the names taken on the way are given
    /// back (confirmed within 100 ms, else in the background).
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<MultiGuard> {
        self.take(Wait::No).await
    }

    /// Waits at most `timeout` for the whole set; then
    /// [`ErrorKind::Timeout`], within `timeout` + 100 ms, and the names
    /// taken on the way are given back (confirmed by then, or in the
    /// background: [`LockClient::wait_idle`]).
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<MultiGuard> {
        let wait = Instant::now()
            .checked_add(timeout)
            .map_or(Wait::Forever, Wait::Until);
        self.take(wait).await
    }

    async fn take(&self, wait: Wait) -> Result<MultiGuard> {
        // The give-back of an attempt that did not get the whole set waits
        // no longer than a single lock's abandon would: past the deadline
        // (a try: now) plus the grace, the rest goes on in the background.
        let bound = || match wait {
            Wait::Forever => None,
            Wait::Until(deadline) => Some(abandon_bound(Some(deadline))),
            Wait::No => Some(abandon_bound(None)),
        };
        'attempt: loop {
            let mut guards: Vec<LockGuard> = Vec::with_capacity(self.members.len());
            for (name, kind) in &self.members {
                let mode = match wait {
                    Wait::Forever => Mode::Wait,
                    Wait::No => Mode::Try,
                    Wait::Until(deadline) => Mode::Until(deadline),
                };
                let next = self.client.acquire(name, *kind, mode, None).boxed();
                // A lock taken earlier may be lost while we wait: then the
                // set cannot be held, give all back and start over. The
                // wait's own error ends the acquire, whatever else happens
                // during the give-back.
                // `Err(reason)`: a lock taken earlier was lost first.
                let step: std::result::Result<Result<LockGuard>, LossReason> = if guards.is_empty()
                {
                    Ok(next.await)
                } else {
                    let lost = any_lost(&guards);
                    tokio::select! {
                        got = next => Ok(got),
                        reason = lost => Err(reason),
                    }
                };
                match step {
                    Ok(Ok(guard)) => guards.push(guard),
                    Ok(Err(e)) => {
                        give_back(guards, bound()).await;
                        return Err(e);
                    }
                    Err(reason) => {
                        tracing::debug!(%reason, "multi-lock: a lock of the set was lost while waiting; taking the set again");
                        give_back(guards, bound()).await;
                        continue 'attempt;
                    }
                }
            }
            if guards.iter().all(LockGuard::is_held) {
                return Ok(MultiGuard { guards });
            }
            // Lost between the last grant and here: nothing to hand out.
            give_back(guards, bound()).await;
        }
    }
}

/// Releases the locks of an attempt that did not get the whole set, and
/// waits for it until `bound` (none: until done), so that nothing is held
/// when the attempt's error returns if the store answers in time. Past the
/// bound, or dropped midway, the rest is released in the background
/// ([`LockClient::wait_idle`]); this client's next acquire of a name waits
/// for its removal.
async fn give_back(guards: Vec<LockGuard>, bound: Option<Instant>) {
    let all = async {
        for guard in guards.into_iter().rev() {
            // A loss here changes nothing: the set was not handed out.
            let _ = guard.release().await;
        }
    };
    match bound {
        None => all.await,
        Some(at) => {
            let _ = tokio::time::timeout_at(at, all).await;
        }
    }
}

fn any_lost(guards: &[LockGuard]) -> impl Future<Output = LossReason> + Send + 'static {
    let all = select_all(guards.iter().map(|g| g.lost().boxed()));
    async move { all.await.0 }
}

/// Proof that every lock of a [`MultiLock`] is held, with a fencing token
/// per name. Dropping it queues the release of all; loss of any one lock is
/// loss of the set.
#[must_use = "the locks are released when the guard is dropped: keep it while you need them"]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.guards.iter().map(|g| (g.name(), g.token())))
            .finish()
    }
}

impl MultiGuard {
    /// Each name with its fencing token, in canonical order.
    pub fn tokens(&self) -> impl Iterator<Item = (&LockName, u64)> {
        self.guards.iter().map(|g| (g.name(), g.token()))
    }

    /// The fencing token of `name`, if it is in the set.
    pub fn token(&self, name: &str) -> Option<u64> {
        self.guards
            .iter()
            .find(|g| g.name().as_str() == name)
            .map(LockGuard::token)
    }

    /// The guards of the set, in canonical order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Whether every lock of the set can still be assumed held.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Why the set was lost (the first lost lock's reason), if it was.
    pub fn loss(&self) -> Option<LossReason> {
        self.guards.iter().find_map(LockGuard::loss)
    }

    /// Resolves when any lock of the set is lost (see
    /// [`LockGuard::lost`]).
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        any_lost(&self.guards)
    }

    /// Releases every lock of the set, in reverse order, and confirms.
    /// Returns [`ErrorKind::LockLost`] if any was lost before the release;
    /// the others are released all the same.
    ///
    /// # Cancel safety
    /// If dropped, the releases not yet done continue in the background.
    pub async fn release(self) -> Result<()> {
        let mut first_err = None;
        for guard in self.guards.into_iter().rev() {
            if let Err(e) = guard.release().await {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}
