//! Mutants of real stores' backends, for the scenarios and explorer
//! faults that only a real store can run (a cluster's links, a holder in
//! another process): each breaks one promise, and the fault that guards it
//! must catch it.
//!
//! - [`trusting_its_member`]: a client that trusts the member it talks
//!   to. Its holders believe their session alive whenever that member
//!   answers a read from its own copy (etcd: a serializable range;
//!   Consul: `?stale`), which a member cut from its leader still does,
//!   and never hear of a loss. [`follower_cut_from_leader`] must catch it
//!   (two holders at once).
//! - [`late_deadline`]: a client that takes each confirmation of its
//!   session for `factor` TTLs and never hears of a loss: a holder
//!   process paused past the TTL still says held when it resumes. The
//!   explorer's holder process must catch it.
//! - [`no_margin`]: a client whose local deadline keeps no margin (the
//!   whole TTL from a renewal's sending). Safe while the server's clock
//!   keeps time; the explorer's clock step (below TTL/5, which the margin
//!   covers) must catch it.
//! - [`deaf_to_entry_loss`]: a client that never hears that one of its
//!   entries is gone while its session lives (revokes and session losses
//!   still reach it). Only a failover makes such a loss that nothing else
//!   tells (a break's holder believes on, but the checker ends its hold at
//!   the break, and fencing refuses its writes); the explorer's failover
//!   must catch it.
//! - [`release_ignores_gone_entry`]: a client whose release says `Ok`
//!   when the store no longer has its entry (a break it has not heard
//!   of yet). The explorer's checker of release outcomes must catch it
//!   (a release `Ok` after a finished break of its hold).
//!
//! [`follower_cut_from_leader`]: super::scenarios::follower_cut_from_leader

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use async_trait::async_trait;
use quorumlock_core::backend::{
    AcquireRequest, Acquired, Backend, Capabilities, ChangeFeed, EntrySignals, HeldEntry, KeyWrite,
    SessionLiveness, StoreSession,
};
use quorumlock_core::url::Url;
use quorumlock_core::{LockName, LockState, Result};
use tokio::time::Instant;

use super::cluster::{answers_from_its_copy, StoreKind};

/// `inner`, connected through `url` (its first host is the member it
/// trusts), with the mutation of this module.
pub fn trusting_its_member(
    inner: Arc<dyn Backend>,
    url: &Url,
    kind: StoreKind,
) -> Arc<dyn Backend> {
    let member = (
        url.host_str()
            .expect("a host")
            .split(',')
            .next()
            .unwrap_or_default(),
        url.port().expect("a port"),
    )
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .expect("the member's address");
    Arc::new(Mutant {
        inner,
        mutation: Mutation::TrustsItsMember { member, kind },
    })
}

/// `inner`, its holders taking each confirmation of their session for
/// `factor` TTLs and never hearing of a loss.
pub fn late_deadline(inner: Arc<dyn Backend>, factor: u32) -> Arc<dyn Backend> {
    Arc::new(Mutant {
        inner,
        mutation: Mutation::LateDeadline { factor },
    })
}

/// `inner` without the margin of its local deadline: each confirmation
/// taken for the whole TTL from when its renewal was sent (not TTL less
/// TTL/5), losses the store reported passed on. Safe while the server's
/// clock keeps time; a forward step of the server's clock catches it.
pub fn no_margin(inner: Arc<dyn Backend>) -> Arc<dyn Backend> {
    Arc::new(Mutant {
        inner,
        mutation: Mutation::NoMargin,
    })
}

/// `inner`, its clients never hearing that an entry is gone (a break,
/// an entry a failover lost) while the session lives; revoke requests
/// and session losses still reach them.
pub fn deaf_to_entry_loss(inner: Arc<dyn Backend>) -> Arc<dyn Backend> {
    Arc::new(Mutant {
        inner,
        mutation: Mutation::DeafToEntryLoss,
    })
}

/// `inner`, its releases answering `Ok` when the store found the entry
/// gone ([`quorumlock_core::ErrorKind::LockLost`]).
pub fn release_ignores_gone_entry(inner: Arc<dyn Backend>) -> Arc<dyn Backend> {
    Arc::new(Mutant {
        inner,
        mutation: Mutation::ReleaseIgnoresGone,
    })
}

/// Opens a session of `inner` for [`late_deadline`]: `outer` (what the
/// client sees) takes each of the store's confirmations for `factor` TTLs
/// and never a loss.
pub async fn open_with_late_deadline(
    inner: &Arc<dyn Backend>,
    outer: Arc<SessionLiveness>,
    factor: u32,
) -> Result<Arc<dyn StoreSession>> {
    open_stretched(inner, outer, Stretch::Factor(factor)).await
}

/// How a mutant's session takes the store's confirmations.
#[derive(Debug, Clone, Copy)]
enum Stretch {
    /// For this many TTLs; no loss passed on.
    Factor(u32),
    /// For the whole TTL (no margin); losses other than a passed local
    /// deadline passed on.
    NoMargin,
}

async fn open_stretched(
    inner: &Arc<dyn Backend>,
    outer: Arc<SessionLiveness>,
    stretch: Stretch,
) -> Result<Arc<dyn StoreSession>> {
    let ttl = inner.capabilities().session_ttl;
    let inner_l = Arc::new(SessionLiveness::new());
    let session = inner.open_session(inner_l.clone()).await?;
    let forward = move |outer: &SessionLiveness| {
        // The deadline `inner_l` would have reached without a loss is not
        // readable after one, so a loss stops the confirmations.
        if let Some(d) = inner_l.deadline() {
            let sent = d - (ttl - SessionLiveness::margin(ttl));
            match stretch {
                Stretch::Factor(f) => outer.confirm(sent, ttl * f),
                Stretch::NoMargin => {
                    match inner_l.loss() {
                        Some(quorumlock_core::LossReason::DeadlinePassed) | None => {}
                        Some(reason) => outer.lose(reason),
                    }
                    // sent + 5/4 TTL - (5/4 TTL)/5 = sent + TTL.
                    outer.confirm(sent, ttl * 5 / 4);
                }
            }
        }
    };
    forward(&outer);
    let weak = Arc::downgrade(&outer);
    tokio::spawn(async move {
        while let Some(outer) = weak.upgrade() {
            forward(&outer);
            if outer.loss().is_some() {
                return;
            }
            drop(outer);
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    });
    Ok(session)
}

#[derive(Debug, Clone, Copy)]
enum Mutation {
    TrustsItsMember { member: SocketAddr, kind: StoreKind },
    LateDeadline { factor: u32 },
    NoMargin,
    DeafToEntryLoss,
    ReleaseIgnoresGone,
}

#[derive(Debug)]
struct Mutant {
    inner: Arc<dyn Backend>,
    mutation: Mutation,
}

#[async_trait]
impl Backend for Mutant {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn describe(&self) -> String {
        format!("{} mutated: {:?}", self.inner.describe(), self.mutation)
    }
    async fn open_session(&self, outer: Arc<SessionLiveness>) -> Result<Arc<dyn StoreSession>> {
        let (kind, member) = match self.mutation {
            Mutation::LateDeadline { factor } => {
                return open_with_late_deadline(&self.inner, outer, factor).await
            }
            Mutation::NoMargin => {
                return open_stretched(&self.inner, outer, Stretch::NoMargin).await
            }
            Mutation::DeafToEntryLoss => {
                return Ok(Arc::new(DeafSession {
                    inner: self.inner.open_session(outer).await?,
                    signals: Default::default(),
                }))
            }
            Mutation::ReleaseIgnoresGone => {
                return Ok(Arc::new(GoneIsReleased {
                    inner: self.inner.open_session(outer).await?,
                }))
            }
            Mutation::TrustsItsMember { member, kind } => (kind, member),
        };
        let ttl = self.inner.capabilities().session_ttl;
        let inner_l = Arc::new(SessionLiveness::new());
        let session = self.inner.open_session(inner_l.clone()).await?;
        let margin = SessionLiveness::margin(ttl);
        let weak = Arc::downgrade(&outer);
        // The store's confirmations are passed on, its losses are not, and
        // every answer of the member confirms too.
        let confirm = move |outer: &SessionLiveness, answered: Option<Instant>| {
            if let Some(d) = inner_l.deadline().filter(|_| inner_l.loss().is_none()) {
                outer.confirm(d - (ttl - margin), ttl);
            }
            if let Some(at) = answered {
                outer.confirm(at, ttl);
            }
        };
        confirm(&outer, None);
        tokio::spawn(async move {
            while let Some(outer) = weak.upgrade() {
                let asked = Instant::now();
                let answered =
                    tokio::task::spawn_blocking(move || answers_from_its_copy(kind, member))
                        .await
                        .unwrap_or(false);
                confirm(&outer, answered.then_some(asked));
                drop(outer);
                tokio::time::sleep(ttl / 5).await;
            }
        });
        Ok(session)
    }
    async fn inspect(&self, name: &LockName) -> Result<LockState> {
        self.inner.inspect(name).await
    }
    async fn break_lock(&self, name: &LockName) -> Result<bool> {
        self.inner.break_lock(name).await
    }
    async fn list(&self, prefix: Option<&LockName>) -> Result<Vec<LockState>> {
        self.inner.list(prefix).await
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
    async fn write_key(&self, write: &KeyWrite) -> Result<()> {
        self.inner.write_key(write).await
    }
    fn changes(&self, name: &LockName) -> Option<ChangeFeed> {
        self.inner.changes(name)
    }
}

/// A session whose entries' losses stay with the backend: each attempt
/// goes to the store with signals of its own, of which only a revoke
/// request is passed on (and the client's finish passed back).
#[derive(Debug)]
struct DeafSession {
    inner: Arc<dyn StoreSession>,
    /// The store's signals of each attempt, by contender.
    signals: std::sync::Mutex<std::collections::HashMap<uuid::Uuid, EntrySignals>>,
}

impl DeafSession {
    /// `req` with the store's signals of its attempt (new ones at its
    /// first call).
    fn to_store(&self, req: &AcquireRequest) -> AcquireRequest {
        let mut map = self.signals.lock().unwrap();
        let store = map.entry(req.contender).or_insert_with(|| {
            let (client, store) = (req.signals.clone(), EntrySignals::new());
            let relay = store.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = client.finished() => {}
                    () = async {
                        relay.revoke_requested().await;
                        client.request_revoke();
                        std::future::pending::<()>().await
                    } => {}
                }
                relay.finish();
            });
            store
        });
        AcquireRequest {
            signals: store.clone(),
            ..req.clone()
        }
    }
}

#[async_trait]
impl StoreSession for DeafSession {
    fn id(&self) -> String {
        self.inner.id()
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired> {
        self.inner.acquire(&self.to_store(req)).await
    }
    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()> {
        self.inner.release(&self.to_store(req), held).await
    }
    async fn abandon(&self, req: &AcquireRequest) -> Result<()> {
        self.inner.abandon(&self.to_store(req)).await
    }
    async fn set_value(&self, req: &AcquireRequest, held: &Acquired, value: &[u8]) -> Result<()> {
        self.inner.set_value(&self.to_store(req), held, value).await
    }
    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}

/// A session of [`release_ignores_gone_entry`].
#[derive(Debug)]
struct GoneIsReleased {
    inner: Arc<dyn StoreSession>,
}

#[async_trait]
impl StoreSession for GoneIsReleased {
    fn id(&self) -> String {
        self.inner.id()
    }
    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired> {
        self.inner.acquire(req).await
    }
    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()> {
        match self.inner.release(req, held).await {
            Err(e) if e.kind() == quorumlock_core::ErrorKind::LockLost => Ok(()),
            r => r,
        }
    }
    async fn abandon(&self, req: &AcquireRequest) -> Result<()> {
        self.inner.abandon(req).await
    }
    async fn set_value(&self, req: &AcquireRequest, held: &Acquired, value: &[u8]) -> Result<()> {
        self.inner.set_value(req, held, value).await
    }
    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}
