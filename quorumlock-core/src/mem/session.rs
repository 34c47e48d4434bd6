use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::core::MemCore;
use super::monitor::keepalive;
use super::store::{self, Standing};
use crate::backend::{entry_gone, AcquireRequest, Acquired, SessionLiveness, StoreSession};
use crate::{Error, ErrorKind, LossReason, Result};

/// One session on a `mem://` store, renewed at a third of its TTL.
pub(super) struct MemSession {
    backend: Arc<MemCore>,
    id: u64,
    stop: CancellationToken,
}

impl fmt::Debug for MemSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemSession").field("id", &self.id).finish()
    }
}

impl MemSession {
    pub(super) fn open(backend: Arc<MemCore>, liveness: Arc<SessionLiveness>) -> Self {
        let ttl = backend.config.ttl;
        let sent = Instant::now();
        let id = backend.store().state().open_session(ttl, &liveness);
        backend.count_request();
        liveness.confirm(sent, ttl);
        let stop = CancellationToken::new();
        tokio::spawn(keepalive(backend.clone(), id, ttl, liveness, stop.clone()));
        MemSession { backend, id, stop }
    }
}

#[async_trait]
impl StoreSession for MemSession {
    fn id(&self) -> String {
        store::session_id(self.id)
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired> {
        let key = self.backend.key(&req.name);
        self.backend.count_request();
        let (index, wake) = self.backend.store().state().enqueue(&key, self.id, req)?;
        loop {
            let standing = self.backend.store().state().standing(&key, index);
            match standing {
                Standing::Gone => {
                    return Err(Error::new(
                        ErrorKind::SessionLost,
                        "our entry vanished while waiting (session expired or entry deleted)",
                    ))
                }
                Standing::Holds => {
                    return Ok(Acquired {
                        token: index,
                        entry: store::entry_name(&key, index),
                    })
                }
                Standing::Refused => {
                    self.backend
                        .store()
                        .state()
                        .remove_contender(&key, req.contender);
                    return Err(crate::backend::refused_upgrade(&req.name));
                }
                Standing::Waits { .. } if !req.wait => {
                    self.backend
                        .store()
                        .state()
                        .remove_contender(&key, req.contender);
                    return Err(Error::new(
                        ErrorKind::WouldBlock,
                        format!("lock {} is held", req.name),
                    ));
                }
                Standing::Waits { ahead_expires } => {
                    // Woken by the store when we become head; also re-check
                    // when the session ahead would expire unrenewed.
                    tokio::select! {
                        _ = wake.notified() => {}
                        _ = tokio::time::sleep_until(ahead_expires + Duration::from_millis(1)) => {}
                    }
                    self.backend.count_request();
                }
            }
        }
    }

    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()> {
        let key = self.backend.key(&req.name);
        self.backend.count_request();
        let mut st = self.backend.store().state();
        let removed = if req.count > 1 {
            st.remove_contender(&key, req.contender)
        } else {
            st.remove_index(&key, held.token)
        };
        if removed == 0 {
            return Err(entry_gone(req));
        }
        Ok(())
    }

    async fn abandon(&self, req: &AcquireRequest) -> Result<()> {
        let key = self.backend.key(&req.name);
        self.backend.count_request();
        self.backend
            .store()
            .state()
            .remove_contender(&key, req.contender);
        Ok(())
    }

    async fn set_value(&self, req: &AcquireRequest, held: &Acquired, value: &[u8]) -> Result<()> {
        let key = self.backend.key(&req.name);
        self.backend.count_request();
        if self
            .backend
            .store()
            .state()
            .set_value(&key, held.token, value)
        {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::LockLost,
                format!("{} is no longer held by this entry", req.name),
            ))
        }
    }

    async fn close(&self) -> Result<()> {
        self.stop.cancel();
        self.backend.count_request();
        self.backend
            .store()
            .state()
            .end_session(self.id, LossReason::ClientClosed);
        Ok(())
    }
}

impl Drop for MemSession {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
