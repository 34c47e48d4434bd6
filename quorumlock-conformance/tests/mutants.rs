//! The suite must fail on broken backends: each mutant wraps the in-memory
//! backend and breaks one promise, and the cases that guard that promise
//! must panic.

use std::sync::Arc;

use async_trait::async_trait;
use quorumlock_conformance::{cases, Harness};
use quorumlock_core::backend::{
    AcquireRequest, Acquired, Backend, Capabilities, HeldEntry, KeyWrite, SessionLiveness,
    StoreSession,
};
use quorumlock_core::mem::MemBackend;
use quorumlock_core::LockState;
use quorumlock_core::{ErrorKind, LockKind, LockName, Result};

#[derive(Debug, Clone, Copy)]
enum Mutation {
    /// Grants a held lock to a second contender.
    NoExclusion,
    /// Hands out decreasing tokens.
    ReversedTokens,
    /// Leaves the entry of a cancelled acquire on the store.
    AbandonDoesNothing,
    /// Reports waiters newest first.
    InspectReversed,
    /// Takes every read hold as a write hold: readers never share.
    ReadersExclusive,
    /// Takes a semaphore permit as a read hold: no limit at all.
    SemaphoreUnbounded,
    /// Takes a semaphore permit as a mutex hold: a limit of one.
    SemaphoreAsMutex,
    /// Readers' and writers' tokens lag behind mutexes' (as a token taken
    /// at join time does, against one taken at grant time): each kind's
    /// tokens still increase, across kinds they go down.
    RwTokensLag,
    /// Offers no change feed: `observe` reads every 250 ms instead.
    NoChangeFeed,
    /// Loses every third notification of its change feed after the
    /// first (the watch in place).
    LosesNotifications,
}

/// How far [`Mutation::RwTokensLag`] puts read and write tokens back.
const RW_LAG: u64 = 3;

#[derive(Debug)]
struct Mutant {
    inner: MemBackend,
    mutation: Mutation,
}

#[derive(Debug)]
struct MutantSession {
    inner: Arc<dyn StoreSession>,
    mutation: Mutation,
}

#[async_trait]
impl Backend for Mutant {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn changes(&self, name: &LockName) -> Option<quorumlock_core::backend::ChangeFeed> {
        use futures::StreamExt;
        match self.mutation {
            Mutation::NoChangeFeed => None,
            Mutation::LosesNotifications => self.inner.changes(name).map(|feed| {
                feed.enumerate()
                    .filter_map(|(i, item)| futures::future::ready((i % 3 != 2).then_some(item)))
                    .boxed()
            }),
            _ => self.inner.changes(name),
        }
    }
    fn describe(&self) -> String {
        format!("mutant {:?} of {}", self.mutation, self.inner.describe())
    }
    async fn open_session(&self, l: Arc<SessionLiveness>) -> Result<Arc<dyn StoreSession>> {
        Ok(Arc::new(MutantSession {
            inner: self.inner.open_session(l).await?,
            mutation: self.mutation,
        }))
    }
    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        let mut s = self.inner.inspect(name).await?;
        if let Mutation::InspectReversed = self.mutation {
            s.waiters.reverse();
        }
        Ok(s)
    }
    async fn break_lock(&self, name: &LockName) -> Result<bool> {
        self.inner.break_lock(name).await
    }
    async fn request_revoke(&self, name: &LockName) -> Result<bool> {
        self.inner.request_revoke(name).await
    }
    async fn kill_session(&self, session: &str) -> Result<()> {
        self.inner.kill_session(session).await
    }
    async fn leftovers(&self) -> Result<Vec<String>> {
        self.inner.leftovers().await
    }
    fn requests_sent(&self) -> u64 {
        self.inner.requests_sent()
    }
    async fn fenced_write(&self, held: &[HeldEntry], write: &KeyWrite) -> Result<()> {
        self.inner.fenced_write(held, write).await
    }
    async fn read_key(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.inner.read_key(key).await
    }
    async fn list(&self, prefix: Option<&LockName>) -> Result<Vec<LockState>> {
        self.inner.list(prefix).await
    }
    async fn write_key(&self, write: &KeyWrite) -> Result<()> {
        self.inner.write_key(write).await
    }
}

#[async_trait]
impl StoreSession for MutantSession {
    fn id(&self) -> String {
        self.inner.id()
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired> {
        match self.mutation {
            Mutation::NoExclusion => {
                let mut tried = req.clone();
                tried.wait = false;
                match self.inner.acquire(&tried).await {
                    Err(e) if e.kind() == ErrorKind::WouldBlock && req.wait => Ok(Acquired {
                        token: u64::MAX / 2,
                        entry: "phantom".into(),
                    }),
                    r => r,
                }
            }
            Mutation::ReversedTokens => {
                let mut a = self.inner.acquire(req).await?;
                a.token = u64::MAX - a.token;
                Ok(a)
            }
            Mutation::RwTokensLag => {
                let mut a = self.inner.acquire(req).await?;
                if matches!(req.kind, LockKind::Read | LockKind::Write) {
                    a.token = a.token.saturating_sub(RW_LAG);
                }
                Ok(a)
            }
            Mutation::ReadersExclusive
            | Mutation::SemaphoreUnbounded
            | Mutation::SemaphoreAsMutex => {
                let mut r = req.clone();
                r.kind = match (self.mutation, req.kind) {
                    (Mutation::ReadersExclusive, LockKind::Read) => LockKind::Write,
                    (Mutation::SemaphoreUnbounded, LockKind::Semaphore { .. }) => LockKind::Read,
                    (Mutation::SemaphoreAsMutex, LockKind::Semaphore { .. }) => {
                        LockKind::Semaphore { permits: 1 }
                    }
                    (_, k) => k,
                };
                self.inner.acquire(&r).await
            }
            Mutation::InspectReversed
            | Mutation::AbandonDoesNothing
            | Mutation::NoChangeFeed
            | Mutation::LosesNotifications => self.inner.acquire(req).await,
        }
    }
    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()> {
        if held.entry == "phantom" {
            return Ok(());
        }
        let mut h = held.clone();
        if let Mutation::ReversedTokens = self.mutation {
            h.token = u64::MAX - h.token;
        }
        if let (Mutation::RwTokensLag, LockKind::Read | LockKind::Write) = (self.mutation, req.kind)
        {
            h.token += RW_LAG;
        }
        self.inner.release(req, &h).await
    }
    async fn set_value(&self, req: &AcquireRequest, held: &Acquired, value: &[u8]) -> Result<()> {
        self.inner.set_value(req, held, value).await
    }
    async fn abandon(&self, req: &AcquireRequest) -> Result<()> {
        match self.mutation {
            Mutation::AbandonDoesNothing => Ok(()),
            _ => self.inner.abandon(req).await,
        }
    }
    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}

fn mutant(m: Mutation) -> Harness {
    let base = quorumlock_core::url::parse("mem://mutants?ttl=2s").unwrap();
    Harness::new("mutant", base, move |url| async move {
        Ok(Arc::new(Mutant {
            inner: MemBackend::connect(&url).await?,
            mutation: m,
        }) as Arc<dyn Backend>)
    })
}

macro_rules! must_fail {
    ($($test:ident: $mutation:ident => $case:ident;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[should_panic]
            async fn $test() {
                cases::$case(&mutant(Mutation::$mutation)).await;
            }
        )*
    };
}

must_fail! {
    no_exclusion_caught_by_contention: NoExclusion => exclusion_under_contention;
    reversed_tokens_caught_by_contention: ReversedTokens => exclusion_under_contention;
    reversed_tokens_caught_by_token_case: ReversedTokens => tokens_strictly_increase;
    reversed_tokens_caught_by_expiry_case: ReversedTokens => session_expiry_fires_loss_and_waiter_gets_larger_token;
    abandon_noop_caught_by_cancel_case: AbandonDoesNothing => cancelled_acquire_at_each_await_point_leaves_nothing;
    abandon_noop_caught_by_timeout_case: AbandonDoesNothing => timeout_bounds_and_no_leftover_waiter;
    reversed_inspect_caught_by_inspect_case: InspectReversed => inspect_reports_holder_and_waiters_in_order;
    exclusive_readers_caught_by_overlap_case: ReadersExclusive => rw_readers_overlap;
    unbounded_semaphore_caught_by_limit_case: SemaphoreUnbounded => semaphore_never_exceeds_permits;
    mutex_semaphore_caught_by_limit_case: SemaphoreAsMutex => semaphore_never_exceeds_permits;
    reversed_tokens_caught_by_kinds_case: ReversedTokens => tokens_increase_across_kinds;
    lagging_rw_tokens_caught_by_kinds_case: RwTokensLag => tokens_increase_across_kinds;
    polling_observe_caught_by_short_leaderships: NoChangeFeed => election_observe_sees_every_short_leadership;
    lost_notifications_caught_by_short_leaderships: LosesNotifications => election_observe_sees_every_short_leadership;
}

/// The unmutated wrapper passes, so the failures above come from the
/// mutations and not from the wrapper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrapper_without_effect_passes() {
    cases::exclusion_under_contention(&mutant(Mutation::InspectReversed)).await;
    cases::tokens_strictly_increase(&mutant(Mutation::AbandonDoesNothing)).await;
}
