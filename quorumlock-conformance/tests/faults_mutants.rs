//! The fault scenarios must fail on broken backends: each mutant wraps the
//! in-memory backend (behind its simulated link) and breaks one promise,
//! and the scenario that guards that promise must panic.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use quorumlock_conformance::faults::{explorer, mutants, scenarios, FaultTarget};
use quorumlock_core::backend::{
    AcquireRequest, Acquired, Backend, Capabilities, EntrySignals, HeldEntry, KeyWrite,
    SessionLiveness, StoreSession,
};
use quorumlock_core::LockState;
use quorumlock_core::{LockName, Result};

#[derive(Debug, Clone, Copy)]
enum Mutation {
    /// Computes the local deadline from twice the TTL and ignores the
    /// store's word that the session expired: a partitioned holder
    /// believes it holds after the store gave the lock away.
    LateDeadline,
    /// Leaves the entry of a cancelled or failed acquire on the store.
    AbandonDoesNothing,
    /// Every holder gets the same token: fencing cannot tell them apart.
    ConstantToken,
    /// A held lock is granted anyway, with its holder's token (Consul's
    /// grant-then-read with another holder's token, issue 15).
    ForeignToken,
    /// One grant in four answers as a lost reply: the entry stays, held
    /// by nobody, and the abandon of that attempt misses it (Consul's
    /// lost fast-path reply, issue 15; quorumlock_core's dropped abandon, issue
    /// 17).
    LostReplyOrphan,
    /// A fenced write skips its check: a paused holder's write to the
    /// store lands after it lost the lock.
    FencelessWrite,
    /// A campaign is granted at once while another candidate leads, with
    /// the leader's token: two leaders (elections only).
    EagerLeader,
    /// A lock's change feed says that its watch is in place, then nothing
    /// more: an observer never learns of a change (a watch that went deaf,
    /// a reconnect that does not read again).
    DeafFeed,
    /// A request for several permits at once takes one: its holder
    /// believes it holds all of them.
    ManyAsOne,
    /// An upgrade queues as a reader: its holder believes it writes while
    /// other readers hold.
    UpgradeAsRead,
}

#[derive(Debug)]
struct Mutant {
    inner: Arc<dyn Backend>,
    mutation: Mutation,
}

#[derive(Debug)]
struct MutantSession {
    inner: Arc<dyn StoreSession>,
    backend: Arc<dyn Backend>,
    mutation: Mutation,
    grants: std::sync::atomic::AtomicU64,
    orphans: std::sync::Mutex<Vec<uuid::Uuid>>,
}

impl MutantSession {
    fn new(inner: Arc<dyn StoreSession>, backend: Arc<dyn Backend>, mutation: Mutation) -> Self {
        MutantSession {
            inner,
            backend,
            mutation,
            grants: Default::default(),
            orphans: Default::default(),
        }
    }
}

fn target(mutation: Mutation) -> FaultTarget {
    FaultTarget::mem("mem://mutants?ttl=1s")
        .wrap_backends(move |inner| Arc::new(Mutant { inner, mutation }) as Arc<dyn Backend>)
}

#[async_trait]
impl Backend for Mutant {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn changes(&self, name: &LockName) -> Option<quorumlock_core::backend::ChangeFeed> {
        use futures::StreamExt;
        let feed = self.inner.changes(name)?;
        match self.mutation {
            Mutation::DeafFeed => Some(feed.take(1).chain(futures::stream::pending()).boxed()),
            _ => Some(feed),
        }
    }
    fn describe(&self) -> String {
        format!("mutant {:?} of {}", self.mutation, self.inner.describe())
    }
    async fn open_session(&self, outer: Arc<SessionLiveness>) -> Result<Arc<dyn StoreSession>> {
        if let Mutation::LateDeadline = self.mutation {
            let session = mutants::open_with_late_deadline(&self.inner, outer, 2).await?;
            return Ok(Arc::new(MutantSession::new(
                session,
                self.inner.clone(),
                self.mutation,
            )));
        }
        Ok(Arc::new(MutantSession::new(
            self.inner.open_session(outer).await?,
            self.inner.clone(),
            self.mutation,
        )))
    }
    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        self.inner.inspect(name).await
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
        match self.mutation {
            Mutation::FencelessWrite => self.inner.write_key(write).await,
            _ => self.inner.fenced_write(held, write).await,
        }
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
        if let Mutation::LateDeadline = self.mutation {
            // Deaf to the store: the entry's loss is never reported.
            let mut deaf = req.clone();
            deaf.signals = EntrySignals::new();
            return self.inner.acquire(&deaf).await;
        }
        let eager = matches!(self.mutation, Mutation::EagerLeader)
            && req.kind == quorumlock_core::LockKind::Election;
        if matches!(self.mutation, Mutation::ForeignToken) || eager {
            let mut first = req.clone();
            first.wait = false;
            match self.inner.acquire(&first).await {
                Err(e) if e.kind() == quorumlock_core::ErrorKind::WouldBlock && req.wait => {
                    let holder = self.backend.inspect(&req.name).await?;
                    if let Some(h) = holder.holders.first() {
                        return Ok(Acquired {
                            token: h.token,
                            entry: h.entry.clone(),
                        });
                    }
                    return self.inner.acquire(req).await;
                }
                r => return r,
            }
        }
        if matches!(self.mutation, Mutation::UpgradeAsRead)
            && req.kind == quorumlock_core::LockKind::Upgrade
        {
            let mut read = req.clone();
            read.kind = quorumlock_core::LockKind::Read;
            read.upgrades = None;
            return self.inner.acquire(&read).await;
        }
        if matches!(self.mutation, Mutation::ManyAsOne) && req.count > 1 {
            let mut one = req.clone();
            one.count = 1;
            return self.inner.acquire(&one).await;
        }
        let mut a = self.inner.acquire(req).await?;
        if let Mutation::ConstantToken = self.mutation {
            a.token = 1;
        }
        if let Mutation::LostReplyOrphan = self.mutation {
            if self
                .grants
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                % 4
                == 3
            {
                self.orphans.lock().unwrap().push(req.contender);
                return Err(quorumlock_core::Error::new(
                    quorumlock_core::ErrorKind::Connection,
                    "mutant: the grant's reply was lost",
                ));
            }
        }
        Ok(a)
    }
    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()> {
        if let Mutation::ConstantToken = self.mutation {
            // The real index is not known any more: remove by contender.
            return self.inner.abandon(req).await;
        }
        self.inner.release(req, held).await
    }
    async fn set_value(&self, req: &AcquireRequest, held: &Acquired, value: &[u8]) -> Result<()> {
        self.inner.set_value(req, held, value).await
    }
    async fn abandon(&self, req: &AcquireRequest) -> Result<()> {
        match self.mutation {
            Mutation::AbandonDoesNothing => Ok(()),
            Mutation::LostReplyOrphan if self.orphans.lock().unwrap().contains(&req.contender) => {
                Ok(())
            }
            _ => self.inner.abandon(req).await,
        }
    }
    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "two holders believed they held the lock at once")]
async fn late_deadline_is_caught_by_partitioned_holder() {
    scenarios::partitioned_holder(&target(Mutation::LateDeadline)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "two holders believed they held the lock at once")]
async fn late_deadline_is_caught_by_keepalive_failure() {
    scenarios::keepalive_delay_then_failure(&target(Mutation::LateDeadline)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "lock not free after the cancellations")]
async fn orphaned_entries_are_caught_by_cancellations() {
    scenarios::cancelled_acquires_under_contention(&target(Mutation::AbandonDoesNothing)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "two entries of one session")]
async fn orphaned_entries_are_caught_by_resets() {
    scenarios::reset_during_acquire(&target(Mutation::AbandonDoesNothing)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "stale write of the paused holder was accepted")]
async fn constant_tokens_are_caught_by_fencing() {
    scenarios::paused_holder_fenced(&target(Mutation::ConstantToken)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "fenced store write was not refused")]
async fn fenceless_writes_are_caught_by_the_paused_holder() {
    scenarios::paused_holder_fenced(&target(Mutation::FencelessWrite)).await;
}

/// The unmutated wrapper passes: the failures above come from the
/// mutations, not from the wrapping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_wrapper_passes() {
    let t = FaultTarget::mem("mem://mutants?ttl=1s").wrap_backends(|b| b);
    scenarios::partitioned_holder(&t).await;
    scenarios::paused_holder_fenced(&t).await;
}

/// The explorer finds each mutant within 32 schedules of fixed seeds.
async fn explorer_catches(mutation: Mutation) {
    let t = target(mutation);
    let shape = explorer::Shape {
        run_for: Duration::from_secs(6),
        ..explorer::Shape::default()
    };
    let mut found = Vec::new();
    // Most are caught by the first seed or two. LateDeadline needs a
    // blackhole longer than the TTL on a holder while another client
    // waits: with 4 s schedules it was caught by seed 3, 4, 10, 20 or 24
    // and missed in one run of four within 12 (the same before this
    // session's merges); with 6 s schedules by seed 1, 1, 1, 3 and 10.
    // Up to 32 schedules.
    for seed in 1..=32u64 {
        let o = explorer::explore(&t, seed, shape, None).await;
        if !o.violations.is_empty() {
            found = o.violations;
            eprintln!("{mutation:?} caught by seed {seed}: {}", found[0]);
            break;
        }
    }
    assert!(!found.is_empty(), "the explorer missed {mutation:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorer_catches_late_deadline() {
    explorer_catches(Mutation::LateDeadline).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorer_catches_orphaned_entries() {
    explorer_catches(Mutation::AbandonDoesNothing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorer_catches_constant_tokens() {
    explorer_catches(Mutation::ConstantToken).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorer_catches_a_grant_with_a_foreign_token() {
    explorer_catches(Mutation::ForeignToken).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorer_catches_a_lost_reply_orphan() {
    explorer_catches(Mutation::LostReplyOrphan).await;
}

/// Only the explorer's campaigns meet this mutant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorer_catches_two_leaders() {
    explorer_catches(Mutation::EagerLeader).await;
}

/// Only the explorer's observer of the election meets this mutant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorer_catches_a_deaf_change_feed() {
    explorer_catches(Mutation::DeafFeed).await;
}

/// Only the explorer's requests for several permits at once meet this
/// mutant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorer_catches_permits_taken_one_for_many() {
    explorer_catches(Mutation::ManyAsOne).await;
}

/// Only upgrades of upgradeable read holds meet this mutant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorer_catches_an_upgrade_beside_readers() {
    explorer_catches(Mutation::UpgradeAsRead).await;
}

/// Only the explorer's fenced writes to the store meet this mutant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorer_catches_a_fenceless_write() {
    explorer_catches(Mutation::FencelessWrite).await;
}

/// The explorer passes the unmutated wrapper on the same seeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorer_passes_the_identity_wrapper() {
    let t = FaultTarget::mem("mem://mutants?ttl=1s").wrap_backends(|b| b);
    let shape = explorer::Shape {
        run_for: Duration::from_secs(6),
        ..explorer::Shape::default()
    };
    for seed in 1..=2u64 {
        let o = explorer::explore(&t, seed, shape, None).await;
        assert!(o.violations.is_empty(), "seed {seed}: {:#?}", o.violations);
    }
}

/// A schedule whose clients cannot connect (a store that refuses every
/// connect, as a cluster member being killed does) is a violation of that
/// schedule, reported with why, not a panic that loses the whole row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorer_reports_a_client_that_cannot_connect() {
    let base = quorumlock_core::url::parse("mem://127.0.0.1:9/refusing").expect("URL");
    let t = FaultTarget::new("refusing", base, |_| async {
        Err(quorumlock_core::Error::new(
            quorumlock_core::ErrorKind::Unavailable,
            "refused (test)",
        ))
    });
    let o = explorer::explore(&t, 1, explorer::Shape::default(), None).await;
    assert_eq!(o.ops, 0);
    assert_eq!(o.violations.len(), 1, "{:#?}", o.violations);
    assert!(
        o.violations[0].contains("refused (test)"),
        "{}",
        o.violations[0]
    );
}
