//! One Consul session: the [`StoreSession`] that the client layer talks
//! to. It opens the session, starts its renew task and its monitor, and
//! hands each request to the recipe of its kind (`mutex`, `rw`,
//! `semaphore`), after fencing off a removed attempt's late writes.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockcore::backend::{AcquireRequest, Acquired, SessionLiveness, StoreSession};
use lockcore::{Error, ErrorKind, LockKind, Result};
use serde_json::json;
use tokio::time::Instant;

use crate::core::{session_lost, Inner, Shared};
use crate::error::map;
use crate::layout::Keys;
use crate::{monitor, mutex, renew, rw, semaphore};

/// How long opening a session waits for the agent's answer. Long on
/// purpose: a waiter whose session was lost to a partition opens a new one
/// as soon as the partition heals, instead of failing the acquire.
const SESSION_CREATE_TIMEOUT: Duration = Duration::from_secs(60);

/// One Consul session (behavior `delete`, TTL renewed at TTL/2).
pub(crate) struct ConsulSession {
    s: Arc<Shared>,
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
        backend: Arc<Inner>,
        liveness: Arc<SessionLiveness>,
    ) -> Result<ConsulSession> {
        let cfg = &backend.config;
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
        let id = backend
            .api
            .session_create(&body, SESSION_CREATE_TIMEOUT)
            .await
            .map_err(|e| map(e, "creating a session"))?;
        liveness.confirm(sent, cfg.ttl);
        if sent.elapsed() > cfg.ttl / 4 {
            // A slow answer (a healed partition): the create's send time
            // is too old to vouch for the session; renew it now.
            let sent = Instant::now();
            match backend.api.session_renew(&id, SESSION_CREATE_TIMEOUT).await {
                Ok(true) => liveness.confirm(sent, cfg.ttl),
                Ok(false) => return Err(session_lost("the new Consul session is already gone")),
                Err(e) => {
                    let _ = backend.api.session_destroy(&id).await;
                    return Err(map(e, "renewing a new session"));
                }
            }
        }
        tracing::debug!(session = %id, ttl = ?cfg.ttl, "Consul session created");
        let s = Arc::new(Shared::new(backend, id, liveness));
        tokio::spawn(renew::keepalive(s.clone()));
        tokio::spawn(monitor::monitor(s.clone()));
        Ok(ConsulSession { s })
    }

    pub(crate) fn id_str(&self) -> &str {
        &self.s.id
    }
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
            LockKind::Read | LockKind::Write => rw::acquire_rw(&self.s, req).await,
            LockKind::Semaphore { permits } => semaphore::acquire_sem(&self.s, req, permits).await,
            _ => Err(Error::new(
                ErrorKind::Store,
                "the Consul backend does not know this lock kind",
            )),
        }
    }

    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()> {
        let keys = Keys::new(&self.s.backend.config, &req.name);
        // A write of this attempt may still land after the release.
        self.s.fence(&keys, req).await?;
        match req.kind {
            LockKind::Semaphore { .. } => semaphore::remove(&self.s, &keys).await,
            LockKind::Read | LockKind::Write => rw::release(&self.s, &keys, held).await,
            _ => mutex::release(&self.s, req, &keys, held).await,
        }
    }

    async fn abandon(&self, req: &AcquireRequest) -> Result<()> {
        let keys = Keys::new(&self.s.backend.config, &req.name);
        // A write of this attempt may still land after the removal.
        self.s.fence(&keys, req).await?;
        match req.kind {
            LockKind::Semaphore { .. } => semaphore::remove(&self.s, &keys).await,
            LockKind::Read | LockKind::Write => rw::abandon(&self.s, &keys, req).await,
            _ => mutex::abandon(&self.s, &keys).await,
        }
    }

    async fn close(&self) -> Result<()> {
        self.s.stop.cancel();
        self.s
            .backend
            .api
            .session_destroy(&self.s.id)
            .await
            .map_err(|e| map(e, "destroying the session"))
    }
}

impl Drop for ConsulSession {
    fn drop(&mut self) {
        self.s.stop.cancel();
    }
}
