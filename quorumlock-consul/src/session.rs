//! One Consul session: the [`StoreSession`] that the client layer talks
//! to. It opens the session, starts its renew task and its monitor, and
//! hands each request to the recipe of its kind (`mutex`, `rw`,
//! `semaphore`), after fencing off a removed attempt's late writes.
//!
//! Semaphore permits: `consul lock -n` and Go's `api.Semaphore` count one
//! holder per Consul session (the contender key is `P/<session>`, `.lock`
//! lists holders by session), so one session holds at most one permit of
//! a semaphore. When several owners of one client want permits of one
//! semaphore at once, the second and later get a *permit session* of
//! their own: a further Consul session of this client (same TTL, checks
//! and name), renewed and watched like the main one, kept for reuse while
//! the main session lives and destroyed with it. `consul lock -n` thus
//! counts each of our permits as one holder. A permit session that is
//! lost (expired, or not renewed before its own local deadline) loses the
//! permits held through it; the main session's loss loses them all.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use async_trait::async_trait;
use quorumlock_core::backend::{
    removed_if_found, AcquireRequest, Acquired, Backoff, SessionLiveness, StoreSession,
};
use quorumlock_core::{Error, ErrorKind, LockKind, Result};
use serde_json::json;
use tokio::time::Instant;

use crate::core::{session_lost, ConsulCore, SessionState};
use crate::error::map;
use crate::layout::Keys;
use crate::{monitor, mutex, rw, semaphore};

/// How long opening a session waits for the agent's answer. Long on
/// purpose: a waiter whose session was lost to a partition opens a new one
/// as soon as the partition heals, instead of failing the acquire.
const SESSION_CREATE_TIMEOUT: Duration = Duration::from_secs(60);

/// One Consul session (behavior `delete`, TTL renewed at TTL/2), and the
/// permit sessions of its semaphore owners (see the module docs).
pub(crate) struct ConsulSession {
    s: Arc<SessionState>,
    permits: Arc<PermitSessions>,
}

/// The permit sessions of one client and what each is used for.
#[derive(Default)]
struct PermitSessions {
    /// Every permit session still alive, oldest first.
    all: StdMutex<Vec<Arc<SessionState>>>,
    /// Semaphore requests in flight or held: contender -> (semaphore
    /// keys, the session it uses, its signals). A request is forgotten
    /// only once removed (or removed by its acquire), so `close` finds
    /// here every semaphore whose `.lock` may name a session of ours.
    used: StdMutex<HashMap<uuid::Uuid, Use>>,
}

#[derive(Clone)]
struct Use {
    keys: Keys,
    session: Arc<SessionState>,
    signals: quorumlock_core::backend::EntrySignals,
}

impl fmt::Debug for ConsulSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsulSession")
            .field("id", &self.s.id)
            .finish()
    }
}

fn go_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

impl ConsulSession {
    /// Creates the session, confirms it with the send time of the create,
    /// and starts the renew task and the monitor.
    pub(crate) async fn open(
        core: Arc<ConsulCore>,
        liveness: Arc<SessionLiveness>,
    ) -> Result<ConsulSession> {
        let s = create(core, liveness).await?;
        Ok(ConsulSession {
            s,
            permits: Arc::default(),
        })
    }

    pub(crate) fn id_str(&self) -> &str {
        &self.s.id
    }

    /// The session a semaphore request uses: the main one unless another
    /// request of ours on the same semaphore uses it, else a permit
    /// session that no request on it uses (a new one if none is free).
    async fn session_for(&self, req: &AcquireRequest, keys: &Keys) -> Result<Arc<SessionState>> {
        let prefix = keys.sem.prefix.as_str();
        let pick = |used: &HashMap<uuid::Uuid, Use>| -> Option<Arc<SessionState>> {
            let busy: Vec<&str> = used
                .values()
                .filter(|u| u.keys.sem.prefix == prefix)
                .map(|u| u.session.id.as_str())
                .collect();
            if !busy.contains(&self.s.id.as_str()) {
                return Some(self.s.clone());
            }
            let all = self.permits.all.lock().expect("poisoned");
            all.iter()
                .find(|p| p.liveness.is_alive() && !busy.contains(&p.id.as_str()))
                .cloned()
        };
        let record = |session: Arc<SessionState>| Use {
            keys: keys.clone(),
            session,
            signals: req.signals.clone(),
        };
        loop {
            {
                let mut used = self.permits.used.lock().expect("poisoned");
                if let Some(u) = used.get(&req.contender) {
                    return Ok(u.session.clone());
                }
                if let Some(s) = pick(&used) {
                    used.insert(req.contender, record(s.clone()));
                    return Ok(s);
                }
            }
            if !self.s.liveness.is_alive() {
                return Err(session_lost("the Consul session is lost"));
            }
            // Opened and registered by a task of its own: a dropped
            // acquire must not leave a session renewed by nobody's
            // account. Once registered, another owner may pick it first:
            // then look again.
            tokio::spawn(open_permit_session(self.s.clone(), self.permits.clone()))
                .await
                .map_err(|e| {
                    Error::new(
                        ErrorKind::Internal,
                        format!("opening a permit session: {e}"),
                    )
                })??;
        }
    }

    /// The session that request `req` (a semaphore's) used, if any.
    fn used_by(&self, req: &AcquireRequest) -> Option<Arc<SessionState>> {
        let used = self.permits.used.lock().expect("poisoned");
        used.get(&req.contender).map(|u| u.session.clone())
    }

    /// Forgets what request `req` used.
    fn forget(&self, req: &AcquireRequest) {
        self.permits
            .used
            .lock()
            .expect("poisoned")
            .remove(&req.contender);
    }
}

/// Opens a permit session for the client of `main`, starts its
/// watchdog and [`watch_permit_session`], and adds it to `permits`.
async fn open_permit_session(
    main: Arc<SessionState>,
    permits: Arc<PermitSessions>,
) -> Result<Arc<SessionState>> {
    let liveness = Arc::new(SessionLiveness::new());
    let p = create(main.core.clone(), liveness.clone()).await?;
    tracing::debug!(session = %p.id, main = %main.id, "Consul permit session created");
    tokio::spawn(liveness.watchdog());
    permits.all.lock().expect("poisoned").push(p.clone());
    tokio::spawn(watch_permit_session(main, p.clone(), permits));
    Ok(p)
}

/// Ends with the permit session `p`: when it is lost, every permit held
/// through it is lost; when the main session `main` stops or is lost
/// (every guard of the client reports that loss), `p` stops and is
/// destroyed, so its permits are free at once rather than after its TTL.
async fn watch_permit_session(
    main: Arc<SessionState>,
    p: Arc<SessionState>,
    permits: Arc<PermitSessions>,
) {
    tokio::select! {
        reason = p.liveness.lost() => {
            tracing::info!(session = %p.id, %reason, "Consul permit session lost");
            permits.all.lock().expect("poisoned").retain(|q| !Arc::ptr_eq(q, &p));
            let used = permits.used.lock().expect("poisoned");
            for u in used.values().filter(|u| Arc::ptr_eq(&u.session, &p)) {
                u.signals.lose(reason);
            }
            return;
        }
        _ = main.stop.cancelled() => {}
        _ = main.liveness.lost() => {}
    }
    p.stop.cancel();
    if let Err(e) = p.core.api.session_destroy(&p.id).await {
        tracing::debug!(session = %p.id, error = %e, "destroying a permit session failed; it ends by its TTL");
    }
}

/// Creates one Consul session, confirms `liveness` with the send time of
/// the create, and starts its renew task and its monitor.
async fn create(
    core: Arc<ConsulCore>,
    liveness: Arc<SessionLiveness>,
) -> Result<Arc<SessionState>> {
    let cfg = &core.config;
    let body = json!({
        "Name": format!("quorumlock:{}", cfg.namespace),
        "TTL": go_duration(cfg.ttl),
        "LockDelay": go_duration(cfg.lock_delay),
        "Behavior": "delete",
        // Both fields: Consul 1.8 takes `Checks: []` as "no node checks"
        // and otherwise defers to `NodeChecks`.
        "Checks": cfg.checks,
        "NodeChecks": cfg.checks,
    });
    let sent = Instant::now();
    let id = core
        .api
        .session_create(&body, SESSION_CREATE_TIMEOUT)
        .await
        .map_err(|e| map(e, "creating a session"))?;
    liveness.confirm(sent, cfg.ttl);
    if sent.elapsed() > cfg.ttl / 4 {
        // A slow answer (a healed partition): the create's send time
        // is too old to vouch for the session; renew it now.
        let sent = Instant::now();
        match core.api.session_renew(&id, SESSION_CREATE_TIMEOUT).await {
            Ok(true) => liveness.confirm(sent, cfg.ttl),
            Ok(false) => return Err(session_lost("the new Consul session is already gone")),
            Err(e) => {
                let _ = core.api.session_destroy(&id).await;
                return Err(map(e, "renewing a new session"));
            }
        }
    }
    tracing::debug!(session = %id, ttl = ?cfg.ttl, "Consul session created");
    let s = Arc::new(SessionState::new(core, id, liveness));
    tokio::spawn(monitor::keepalive(s.clone()));
    tokio::spawn(monitor::monitor(s.clone()));
    Ok(s)
}

#[async_trait]
impl StoreSession for ConsulSession {
    fn id(&self) -> String {
        self.s.id.clone()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired> {
        match req.kind {
            // An election candidate is a `consul lock` contender on
            // `.lock` (the leader holds it; its value is in our record).
            LockKind::Exclusive | LockKind::Election => mutex::acquire(&self.s, req).await,
            LockKind::Read | LockKind::Write | LockKind::Upgradeable | LockKind::Upgrade => {
                rw::acquire_rw(&self.s, req).await
            }
            LockKind::Semaphore { permits } => {
                let keys = Keys::new(&self.s.core.config, &req.name);
                let s = self.session_for(req, &keys).await?;
                let r = semaphore::acquire_sem(&s, req, permits).await;
                if r.as_ref().is_err_and(|e| e.kind() == ErrorKind::WouldBlock) {
                    // Removed already; no abandon follows.
                    self.forget(req);
                }
                r
            }
            _ => Err(Error::new(
                ErrorKind::Store,
                "the Consul backend does not know this lock kind",
            )),
        }
    }

    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()> {
        let keys = Keys::new(&self.s.core.config, &req.name);
        if let LockKind::Semaphore { .. } = req.kind {
            return removed_if_found(req, self.remove_sem(req, &keys).await?);
        }
        // A write of this attempt may still land after the release.
        self.s.fence(&keys, req).await?;
        match req.kind {
            LockKind::Read | LockKind::Write | LockKind::Upgradeable | LockKind::Upgrade => {
                rw::release(&self.s, req, &keys, held).await
            }
            _ => mutex::release(&self.s, req, &keys, held).await,
        }
    }

    async fn set_value(&self, req: &AcquireRequest, held: &Acquired, value: &[u8]) -> Result<()> {
        if !matches!(req.kind, LockKind::Exclusive | LockKind::Election) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "only a mutex or an election entry has a value to change ({})",
                    req.name
                ),
            ));
        }
        let keys = Keys::new(&self.s.core.config, &req.name);
        mutex::set_value(&self.s, req, &keys, held, value).await
    }

    async fn abandon(&self, req: &AcquireRequest) -> Result<()> {
        let keys = Keys::new(&self.s.core.config, &req.name);
        if let LockKind::Semaphore { .. } = req.kind {
            return self.remove_sem(req, &keys).await.map(drop);
        }
        // A write of this attempt may still land after the removal.
        self.s.fence(&keys, req).await?;
        match req.kind {
            LockKind::Read | LockKind::Write | LockKind::Upgradeable | LockKind::Upgrade => {
                rw::abandon(&self.s, &keys, req).await
            }
            _ => mutex::abandon(&self.s, &keys).await,
        }
    }

    /// Ends the client's sessions (the permit sessions, then the main
    /// one), then takes them out of the `.lock` of every semaphore a
    /// request of ours used and did not remove (a guard still held at
    /// the close, an acquire cut off by it): that key is locked by no
    /// session, so without this it would name the dead sessions until
    /// the semaphore's next writer prunes them ([`semaphore::prune_ended`],
    /// after the destroys, so no late write of ours can land after it).
    /// While such a semaphore is left, a retryable failure (a cut link,
    /// no leader) is tried again, with backoff, for up to two TTLs; on a
    /// link that stays down, `close` so returns after about two TTLs,
    /// the sessions expire by their TTL, and their semaphores' `.lock`
    /// names them until next used. With none left, a failed destroy is
    /// not retried (as before): whatever the sessions locked goes with
    /// them when they expire.
    async fn close(&self) -> Result<()> {
        let ttl = self.s.core.config.ttl;
        let give_up = Instant::now() + ttl * 2;
        let mut sessions = std::mem::take(&mut *self.permits.all.lock().expect("poisoned"));
        let mut semaphores: Vec<Keys> = Vec::new();
        for u in self.permits.used.lock().expect("poisoned").values() {
            // A permit session lost by itself left `all` but may still
            // be named in `.lock`: ended (again) and pruned too.
            if !sessions.iter().any(|p| p.id == u.session.id) && u.session.id != self.s.id {
                sessions.push(u.session.clone());
            }
            if !semaphores.iter().any(|k| k.sem.prefix == u.keys.sem.prefix) {
                semaphores.push(u.keys.clone());
            }
        }
        sessions.push(self.s.clone());
        for p in &sessions {
            p.stop.cancel();
        }
        let mut ended = std::collections::BTreeSet::new();
        let mut backoff = Backoff::new(
            Duration::from_millis(50),
            (ttl / 10).max(Duration::from_millis(50)),
        );
        loop {
            let mut failure = None;
            for p in &sessions {
                if ended.contains(&p.id) {
                    continue;
                }
                match p.core.api.session_destroy(&p.id).await {
                    Ok(()) => {
                        ended.insert(p.id.clone());
                    }
                    Err(e) => {
                        tracing::debug!(session = %p.id, error = %e, "destroying a session failed");
                        failure.get_or_insert(map(e, "destroying the session"));
                    }
                }
            }
            if !ended.is_empty() {
                let all_ended = ended.len() == sessions.len();
                let mut left = Vec::new();
                for keys in semaphores.drain(..) {
                    match semaphore::prune_ended(&self.s, &keys, &ended).await {
                        Ok(()) if all_ended => {}
                        Ok(()) => left.push(keys),
                        Err(e) => {
                            failure.get_or_insert(e);
                            left.push(keys);
                        }
                    }
                }
                semaphores = left;
            }
            let Some(e) = failure else {
                return Ok(());
            };
            if semaphores.is_empty() {
                // Nothing that outlives the sessions: what they locked
                // goes with them when they expire, if not destroyed.
                tracing::debug!(error = %e, "ending the Consul sessions failed; they end by their TTL");
                return Err(e);
            }
            let delay = backoff.next_delay();
            if !e.is_retryable() || Instant::now() + delay >= give_up {
                tracing::warn!(
                    error = %e,
                    "could not end the Consul sessions and clear them from their semaphores: \
                     the sessions expire by their TTL, and a semaphore's .lock names them \
                     until the semaphore is used again"
                );
                return Err(e);
            }
            tracing::debug!(error = %e, "closing the session failed; trying again");
            tokio::time::sleep(delay).await;
        }
    }
}

impl ConsulSession {
    /// Releases or abandons a semaphore request on the session it used
    /// (fenced there first), then forgets it. A request with no session
    /// recorded wrote nothing (it is recorded before its first write, and
    /// forgotten only once removed): nothing to do, and above all not a
    /// removal on the main session, which another owner may be using.
    /// Whether `.lock` still named the request a holder (true for one
    /// with no session recorded: nothing to tell).
    async fn remove_sem(&self, req: &AcquireRequest, keys: &Keys) -> Result<bool> {
        let Some(s) = self.used_by(req) else {
            return Ok(true);
        };
        // A write of this attempt may still land after the removal.
        s.fence(keys, req).await?;
        let holding = semaphore::remove(&s, keys).await?;
        self.forget(req);
        Ok(holding)
    }
}

impl Drop for ConsulSession {
    fn drop(&mut self) {
        self.s.stop.cancel();
    }
}
