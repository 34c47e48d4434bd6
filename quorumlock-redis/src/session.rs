//! [`RedisSession`]: one session key per client session (its keepalive
//! and mailbox reader are in `monitor.rs`), and the lock protocol on top
//! of the scripts: acquire, release, set a value, abandon, close.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use quorumlock_core::backend::{
    entry_gone, AcquireRequest, Acquired, Backoff, SessionLiveness, StoreSession,
};
use quorumlock_core::{Error, ErrorKind, Result};
use redis::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::core::{manager, now_ms, text, RedisCore, Routes, SessionState};
use crate::layout;
use crate::monitor;
use crate::scripts;

/// One session key, shared by every lock of one client.
pub(crate) struct RedisSession {
    state: Arc<SessionState>,
}

impl fmt::Debug for RedisSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSession")
            .field("sid", &self.state.sid)
            .finish()
    }
}

/// What the enqueue and check scripts answer.
#[derive(Debug, PartialEq, Eq)]
enum Standing {
    Gone,
    Refused,
    Fenced,
    Conflict(String),
    WouldBlock,
    Held { token: u64 },
    Wait { ahead_ms: Option<u64> },
}

fn standing(reply: Vec<Value>) -> Result<Standing> {
    let parts: Vec<String> = reply.iter().filter_map(text).collect();
    let num = |i: usize| parts.get(i).and_then(|s| s.parse::<i64>().ok());
    let s = match parts.first().map(String::as_str) {
        Some("gone") => Standing::Gone,
        Some("refused") => Standing::Refused,
        Some("fenced") => Standing::Fenced,
        Some("wouldblock") => Standing::WouldBlock,
        Some("conflict") => Standing::Conflict(format!(
            "{} with {} permits",
            parts.get(1).map_or("?", String::as_str),
            parts.get(2).map_or("?", String::as_str)
        )),
        Some("held") => match num(1) {
            Some(t) if t > 0 => Standing::Held { token: t as u64 },
            _ => return Err(garbage()),
        },
        Some("wait") => Standing::Wait {
            ahead_ms: num(2).filter(|&t| t > 0).map(|t| t as u64),
        },
        _ => return Err(garbage()),
    };
    Ok(s)
}

fn garbage() -> Error {
    Error::new(ErrorKind::Internal, "a lock script answered garbage")
}

impl RedisSession {
    /// Writes the session key (confirming it with the write's send time),
    /// opens the mailbox connection and starts the keepalive and the
    /// mailbox reader.
    pub(crate) async fn open(core: Arc<RedisCore>, liveness: Arc<SessionLiveness>) -> Result<Self> {
        let sid = uuid::Uuid::new_v4().simple().to_string();
        let ttl = core.config.ttl;
        let mailbox = manager(&core.client, &core.config, None).await?;
        let key = layout::session_key(&core.prefix, &sid);
        let sent = Instant::now();
        let ok: Option<String> = core
            .cmd(
                "open session",
                redis::cmd("SET")
                    .arg(&key)
                    .arg("1")
                    .arg("PX")
                    .arg(ttl.as_millis() as u64)
                    .arg("NX"),
            )
            .await?;
        if ok.is_none() {
            return Err(Error::new(
                ErrorKind::Internal,
                "a fresh random Redis session id was taken",
            ));
        }
        core.record_session(&sid);
        liveness.confirm(sent, ttl);
        let span = tracing::debug_span!("redis_session", sid = %sid);
        let state = Arc::new(SessionState {
            core,
            sid,
            liveness,
            stop: CancellationToken::new(),
            routes: Routes::default(),
            confirmed: Mutex::new(sent),
        });
        tokio::spawn(monitor::keepalive(state.clone()).instrument(span.clone()));
        tokio::spawn(monitor::read_mailbox(state.clone(), mailbox).instrument(span));
        tracing::debug!(sid = %state.sid, ?ttl, "redis session opened");
        Ok(RedisSession { state })
    }

    /// A grant: in WAIT mode, counted only once the replicas acknowledged
    /// it.
    async fn granted(&self, key: &str, id: &str, token: u64) -> Result<Acquired> {
        self.state.core.replicated(key, id, token).await?;
        self.state.routes.granted(id, token);
        Ok(Acquired {
            token,
            entry: layout::entry_name(key, id),
        })
    }

    async fn check(&self, key: &str, id: &str) -> Result<Standing> {
        let mut inv = scripts::CHECK.prepare_invoke();
        inv.arg(&self.state.core.prefix)
            .arg(key)
            .arg(id)
            .arg(self.state.core.config.ttl.as_millis() as u64);
        standing(self.state.core.script("check entry", &inv).await?)
    }
}

#[async_trait]
impl StoreSession for RedisSession {
    fn id(&self) -> String {
        self.state.sid.clone()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired> {
        let key = self.state.core.lock_key(&req.name);
        let id = layout::request_id(req);
        // Routed before the entry exists, so no message for it is missed.
        let wake = self.state.routes.add(&id, &key, req.signals.clone());
        let (kind, permits) = layout::kind_code(req.kind);
        let mut inv = scripts::ENQUEUE.prepare_invoke();
        inv.arg(&self.state.core.prefix)
            .arg(&key)
            .arg(&self.state.sid)
            .arg(&id)
            .arg(kind)
            .arg(permits)
            .arg(if req.wait { "1" } else { "0" })
            .arg(now_ms())
            .arg(&req.value[..])
            .arg(self.state.core.config.ttl.as_millis() as u64)
            .arg(req.count.max(1));
        let core = self.state.core.clone();
        let reply = req
            .writes
            .run_judged(
                async move { core.script::<Vec<Value>>("enqueue", &inv).await },
                |r| matches!(r, Err(e) if e.kind() == ErrorKind::Connection),
            )
            .await?;
        let mut now = standing(reply)?;
        loop {
            match now {
                Standing::Held { token } => return self.granted(&key, &id, token).await,
                Standing::Gone => {
                    return Err(Error::new(
                        ErrorKind::SessionLost,
                        "our Redis session or entry is gone (expired, killed or broken)",
                    ))
                }
                Standing::Fenced => {
                    return Err(Error::new(
                        ErrorKind::Internal,
                        "this attempt was already abandoned",
                    ))
                }
                Standing::Conflict(what) => {
                    self.state.routes.remove(&id);
                    return Err(Error::new(
                        ErrorKind::Conflict,
                        format!("{} is in use as {what}, not {:?}", req.name, req.kind),
                    ));
                }
                Standing::Refused => {
                    self.state.routes.remove(&id);
                    return Err(quorumlock_core::backend::refused_upgrade(&req.name));
                }
                Standing::WouldBlock => {
                    self.state.routes.remove(&id);
                    return Err(Error::new(
                        ErrorKind::WouldBlock,
                        format!("lock {} is held", req.name),
                    ));
                }
                Standing::Wait { ahead_ms } => {
                    // Woken by the grant's message; also look again when a
                    // session ahead would expire unrenewed (Redis runs no
                    // script when a key expires).
                    let ttl = self.state.core.config.ttl;
                    let look = ahead_ms
                        .map_or(ttl, |ms| Duration::from_millis(ms + 20))
                        .min(ttl);
                    tokio::select! {
                        _ = wake.notified() => {}
                        _ = tokio::time::sleep(look) => {}
                        _ = self.state.liveness.lost() => {
                            return Err(Error::new(ErrorKind::SessionLost, "session lost while waiting"));
                        }
                    }
                    let mut retry =
                        Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
                    now = loop {
                        match self.check(&key, &id).await {
                            Err(e) if e.kind() == ErrorKind::Connection => {
                                tracing::debug!(error = %e, "checking our entry failed; again");
                                retry.wait().await;
                            }
                            r => break r?,
                        }
                    };
                }
            }
        }
    }

    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()> {
        let id = layout::request_id(req);
        self.state.routes.remove(&id);
        let mut inv = scripts::RELEASE.prepare_invoke();
        inv.arg(&self.state.core.prefix)
            .arg(self.state.core.lock_key(&req.name))
            .arg(&id)
            .arg(held.token)
            .arg(req.count.max(1));
        match self.state.core.script::<i64>("release", &inv).await? {
            1 => Ok(()),
            _ => Err(entry_gone(req)),
        }
    }

    async fn set_value(&self, req: &AcquireRequest, held: &Acquired, value: &[u8]) -> Result<()> {
        let id = layout::request_id(req);
        let mut inv = scripts::SET_VALUE.prepare_invoke();
        inv.arg(&self.state.core.prefix)
            .arg(self.state.core.lock_key(&req.name))
            .arg(&id)
            .arg(held.token)
            .arg(value);
        match self.state.core.script::<i64>("set value", &inv).await? {
            1 => Ok(()),
            _ => Err(entry_gone(req)),
        }
    }

    async fn abandon(&self, req: &AcquireRequest) -> Result<()> {
        let id = layout::request_id(req);
        self.state.routes.remove(&id);
        let fence = req.writes.outcome_unknown();
        let mut inv = scripts::ABANDON.prepare_invoke();
        inv.arg(&self.state.core.prefix)
            .arg(self.state.core.lock_key(&req.name))
            .arg(&id)
            .arg(if fence { "1" } else { "0" })
            .arg(&self.state.sid)
            .arg(req.count.max(1));
        self.state.core.script::<i64>("abandon", &inv).await?;
        Ok(())
    }

    /// Ends the session with the session-end script, which removes its
    /// entries and settles their queues. Redis removes no entry by itself
    /// (an expired session key leaves its entries until a script reads
    /// their queue, maybe never), so a try that fails retryably (a broken
    /// connection, `BUSY`, ...) is made again, with backoff, for as long
    /// as the script can still find the entries: until the session's
    /// entry set expires on the server, a TTL after the session key, so
    /// at least two TTLs after the send of the last renewal confirmed.
    /// On a link that stays down, `close` so returns after up to about
    /// two TTLs.
    async fn close(&self) -> Result<()> {
        self.state.stop.cancel();
        let ttl = self.state.core.config.ttl;
        let until = *self.state.confirmed.lock().expect("poisoned") + ttl * 2;
        let mut backoff = Backoff::new(
            Duration::from_millis(50),
            (ttl / 10).max(Duration::from_millis(50)),
        );
        loop {
            match self.state.core.end_session(&self.state.sid, false).await {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Connection => {
                    let delay = backoff.next_delay();
                    if Instant::now() + delay >= until {
                        tracing::warn!(
                            error = %e,
                            "could not end the session on Redis before its entry set expires: \
                             its entries stay until another client reads their queues"
                        );
                        return Err(e);
                    }
                    tracing::debug!(error = %e, "ending the session failed; trying again");
                    tokio::time::sleep(delay).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for RedisSession {
    fn drop(&mut self) {
        self.state.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn script_answers_parse() {
        assert_eq!(
            standing(vec![bulk("held"), Value::Int(7), Value::Int(3)]).unwrap(),
            Standing::Held { token: 7 }
        );
        assert_eq!(
            standing(vec![bulk("wait"), Value::Int(3), Value::Int(-1)]).unwrap(),
            Standing::Wait { ahead_ms: None }
        );
        assert_eq!(
            standing(vec![bulk("wait"), Value::Int(3), Value::Int(900)]).unwrap(),
            Standing::Wait {
                ahead_ms: Some(900)
            }
        );
        assert_eq!(standing(vec![bulk("gone")]).unwrap(), Standing::Gone);
        assert!(standing(vec![bulk("held"), Value::Int(0)]).is_err());
        assert!(standing(vec![]).is_err());
    }
}
