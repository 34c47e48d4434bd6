//! One session key per client session, its renewal task, its mailbox
//! reader, and the lock protocol on top of the scripts.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use quorumlock_core::backend::{
    AcquireRequest, Acquired, Backoff, EntrySignals, SessionLiveness, StoreSession,
};
use quorumlock_core::{Error, ErrorKind, LossReason, Result};
use redis::aio::ConnectionManager;
use redis::Value;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::core::{manager, now_ms, RedisCore};
use crate::layout;
use crate::scripts;

/// How long a mailbox read blocks on the server before it is sent again
/// (each read is one request): a third of the TTL, like the renewals, so
/// that a dead mailbox connection is noticed about as soon as a dead
/// request connection; at least 1 s, at most 1 h.
fn mailbox_block(ttl: Duration) -> Duration {
    (ttl / 3).clamp(Duration::from_secs(1), Duration::from_secs(3600))
}

/// One session key, shared by every lock of one client.
pub(crate) struct RedisSession {
    core: Arc<RedisCore>,
    sid: String,
    liveness: Arc<SessionLiveness>,
    stop: CancellationToken,
    routes: Arc<Routes>,
    /// When the last renewal (or the open) that Redis confirmed was sent:
    /// the session's entry set lives on the server at least until two
    /// TTLs after it (see [`RedisSession::close`]).
    confirmed: Arc<Mutex<Instant>>,
}

/// Where the mailbox reader delivers messages for one of our entries:
/// grants wake its waiter, losses and revokes go to its signals.
#[derive(Default)]
struct Routes(Mutex<HashMap<String, Route>>);

struct Route {
    signals: EntrySignals,
    wake: Arc<Notify>,
    /// Once granted: the lock key and token, for the renewal's check.
    held: Option<(String, u64)>,
}

impl Routes {
    fn add(&self, id: &str, signals: EntrySignals) -> Arc<Notify> {
        let wake = Arc::new(Notify::new());
        let route = Route {
            signals,
            wake: wake.clone(),
            held: None,
        };
        self.0
            .lock()
            .expect("poisoned")
            .insert(id.to_string(), route);
        wake
    }

    fn remove(&self, id: &str) {
        self.0.lock().expect("poisoned").remove(id);
    }

    fn granted(&self, id: &str, key: &str, token: u64) {
        if let Some(r) = self.0.lock().expect("poisoned").get_mut(id) {
            r.held = Some((key.to_string(), token));
        }
    }

    /// (lock key, contender, token) of every held entry not finished with.
    fn held(&self) -> Vec<(String, String, u64)> {
        let routes = self.0.lock().expect("poisoned");
        routes
            .iter()
            .filter(|(_, r)| !r.signals.is_finished())
            .filter_map(|(id, r)| {
                let (key, token) = r.held.as_ref()?;
                Some((key.clone(), id.clone(), *token))
            })
            .collect()
    }

    /// Every contender this client owns: attempts not released or
    /// abandoned, waiting or held (the renewal removes the session's
    /// other entries).
    fn owned(&self) -> Vec<String> {
        self.0.lock().expect("poisoned").keys().cloned().collect()
    }

    /// The renewal found these held entries gone from the store.
    fn missing(&self, ids: &[String]) {
        let routes = self.0.lock().expect("poisoned");
        for id in ids {
            if let Some(r) = routes.get(id).filter(|r| !r.signals.is_finished()) {
                tracing::warn!(
                    contender = %id,
                    "a held entry is gone from Redis (a failover to a replica without it?)"
                );
                r.signals.lose(LossReason::EntryDeleted);
            }
        }
    }

    fn deliver(&self, msg: &str, liveness: &SessionLiveness) {
        if msg == "x" {
            liveness.lose(LossReason::SessionExpired);
            return;
        }
        let Some((what, id)) = msg.split_once(' ') else {
            tracing::warn!(msg, "unknown mailbox message");
            return;
        };
        let routes = self.0.lock().expect("poisoned");
        let Some(route) = routes.get(id) else {
            return; // released or abandoned meanwhile
        };
        match what {
            "g" => route.wake.notify_one(),
            "l" => route.signals.lose(LossReason::EntryDeleted),
            "r" => route.signals.request_revoke(),
            _ => tracing::warn!(msg, "unknown mailbox message"),
        }
    }
}

impl fmt::Debug for RedisSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSession")
            .field("sid", &self.sid)
            .finish()
    }
}

/// What the enqueue and check scripts answer.
#[derive(Debug, PartialEq, Eq)]
enum Standing {
    Gone,
    Fenced,
    Conflict(String),
    WouldBlock,
    Held { token: u64 },
    Wait { ahead_ms: Option<u64> },
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

fn standing(reply: Vec<Value>) -> Result<Standing> {
    let parts: Vec<String> = reply.iter().filter_map(text).collect();
    let num = |i: usize| parts.get(i).and_then(|s| s.parse::<i64>().ok());
    let s = match parts.first().map(String::as_str) {
        Some("gone") => Standing::Gone,
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
    /// opens the mailbox connection and starts the renewal and mailbox
    /// tasks.
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
        let confirmed = Arc::new(Mutex::new(sent));
        let stop = CancellationToken::new();
        let routes = Arc::new(Routes::default());
        let span = tracing::debug_span!("redis_session", sid = %sid);
        tokio::spawn(
            renew(
                core.clone(),
                sid.clone(),
                routes.clone(),
                liveness.clone(),
                confirmed.clone(),
                stop.clone(),
            )
            .instrument(span.clone()),
        );
        tokio::spawn(
            read_mailbox(
                core.clone(),
                mailbox,
                sid.clone(),
                routes.clone(),
                liveness.clone(),
                stop.clone(),
            )
            .instrument(span),
        );
        tracing::debug!(sid = %sid, ?ttl, "redis session opened");
        Ok(RedisSession {
            core,
            sid,
            liveness,
            stop,
            routes,
            confirmed,
        })
    }

    /// A grant: in WAIT mode, counted only once the replicas acknowledged
    /// it.
    async fn granted(&self, key: &str, id: &str, token: u64) -> Result<Acquired> {
        self.core.replicated(key, id, token).await?;
        self.routes.granted(id, key, token);
        Ok(Acquired {
            token,
            entry: layout::entry_name(key, id),
        })
    }

    async fn check(&self, key: &str, id: &str) -> Result<Standing> {
        let mut inv = scripts::CHECK.prepare_invoke();
        inv.arg(&self.core.prefix).arg(key).arg(id);
        standing(self.core.script("check entry", &inv).await?)
    }
}

/// Renews the session every third of its TTL; confirms each renewal with
/// its send time, and reports the session lost when Redis no longer has
/// it, and a held entry lost when Redis no longer has that. A failed
/// renewal is tried again sooner; the local deadline ends the session if
/// none gets through. Each renewal also sends every contender the client
/// owns, its own number and that of the last renewal answered: the
/// script removes the session's entries the client no longer owns (see
/// [`scripts::RENEW`]).
async fn renew(
    core: Arc<RedisCore>,
    sid: String,
    routes: Arc<Routes>,
    liveness: Arc<SessionLiveness>,
    confirmed_at: Arc<Mutex<Instant>>,
    stop: CancellationToken,
) {
    let ttl = core.config.ttl;
    let mut pause = ttl / 3;
    // This renewal's number, and the last one answered (0: none yet).
    let (mut n, mut confirmed) = (0u64, 0u64);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = liveness.lost() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        n += 1;
        let held = routes.held();
        let mut inv = scripts::RENEW.prepare_invoke();
        inv.arg(&core.prefix)
            .arg(&sid)
            .arg(ttl.as_millis() as u64)
            .arg(n)
            .arg(confirmed)
            .arg(held.len());
        for (key, id, token) in held {
            inv.arg(key).arg(id).arg(token);
        }
        for id in routes.owned() {
            inv.arg(id);
        }
        let sent = Instant::now();
        match core.script::<Vec<Value>>("renew session", &inv).await {
            Ok(reply) if reply.first() == Some(&Value::Int(1)) => {
                liveness.confirm(sent, ttl);
                *confirmed_at.lock().expect("poisoned") = sent;
                confirmed = n;
                if let Some(Value::Int(removed @ 1..)) = reply.get(1) {
                    tracing::warn!(
                        removed,
                        "removed entries of this session that its client no longer owns \
                         (a request that landed late, or a release a failover lost)"
                    );
                }
                let gone: Vec<String> = reply.iter().skip(2).filter_map(text).collect();
                routes.missing(&gone);
                pause = ttl / 3;
            }
            Ok(_) => {
                tracing::info!("redis session key is gone");
                liveness.lose(LossReason::SessionExpired);
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "renewal failed; trying again");
                pause = ttl / 10;
            }
        }
    }
}

/// Blocks on the session's mailbox (its own connection: a blocking read
/// would hold up every request behind it on a shared one) and delivers
/// each message: the herd-free wake-up of one waiter, a forced break, a
/// revoke request, or the end of the session.
async fn read_mailbox(
    core: Arc<RedisCore>,
    mut conn: ConnectionManager,
    sid: String,
    routes: Arc<Routes>,
    liveness: Arc<SessionLiveness>,
    stop: CancellationToken,
) {
    let key = format!("{}/.mail", layout::session_key(&core.prefix, &sid));
    let block = mailbox_block(core.config.ttl);
    let bound = block + core.config.timeout;
    loop {
        core.requests.fetch_add(1, Ordering::Relaxed);
        let mut cmd = redis::cmd("BLPOP");
        cmd.arg(&key).arg(block.as_secs_f64());
        let read = tokio::time::timeout(
            bound,
            cmd.query_async::<Option<(String, String)>>(&mut conn),
        );
        let r = tokio::select! {
            _ = stop.cancelled() => return,
            _ = liveness.lost() => return,
            r = read => r,
        };
        match r {
            Ok(Ok(Some((_, msg)))) => routes.deliver(&msg, &liveness),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "mailbox read failed; reading again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(_) => tracing::debug!("mailbox read got no answer; reading again"),
        }
    }
}

#[async_trait]
impl StoreSession for RedisSession {
    fn id(&self) -> String {
        self.sid.clone()
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired> {
        let key = self.core.lock_key(&req.name);
        let id = req.contender.simple().to_string();
        // Routed before the entry exists, so no message for it is missed.
        let wake = self.routes.add(&id, req.signals.clone());
        let (kind, permits) = layout::kind_code(req.kind);
        let mut inv = scripts::ENQUEUE.prepare_invoke();
        inv.arg(&self.core.prefix)
            .arg(&key)
            .arg(&self.sid)
            .arg(&id)
            .arg(kind)
            .arg(permits)
            .arg(if req.wait { "1" } else { "0" })
            .arg(now_ms())
            .arg(&req.value[..])
            .arg(self.core.config.ttl.as_millis() as u64);
        let core = self.core.clone();
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
                    self.routes.remove(&id);
                    return Err(Error::new(
                        ErrorKind::Conflict,
                        format!("{} is in use as {what}, not {:?}", req.name, req.kind),
                    ));
                }
                Standing::WouldBlock => {
                    self.routes.remove(&id);
                    return Err(Error::new(
                        ErrorKind::WouldBlock,
                        format!("lock {} is held", req.name),
                    ));
                }
                Standing::Wait { ahead_ms } => {
                    // Woken by the grant's message; also look again when a
                    // session ahead would expire unrenewed (Redis runs no
                    // script when a key expires).
                    let ttl = self.core.config.ttl;
                    let look = ahead_ms
                        .map_or(ttl, |ms| Duration::from_millis(ms + 20))
                        .min(ttl);
                    tokio::select! {
                        _ = wake.notified() => {}
                        _ = tokio::time::sleep(look) => {}
                        _ = self.liveness.lost() => {
                            return Err(Error::new(ErrorKind::SessionLost, "session lost while waiting"));
                        }
                    }
                    now = loop {
                        match self.check(&key, &id).await {
                            Err(e) if e.kind() == ErrorKind::Connection => {
                                tracing::debug!(error = %e, "checking our entry failed; again");
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                            r => break r?,
                        }
                    };
                }
            }
        }
    }

    async fn release(&self, req: &AcquireRequest, held: &Acquired) -> Result<()> {
        let id = req.contender.simple().to_string();
        self.routes.remove(&id);
        let mut inv = scripts::RELEASE.prepare_invoke();
        inv.arg(&self.core.prefix)
            .arg(self.core.lock_key(&req.name))
            .arg(&id)
            .arg(held.token);
        self.core.script::<i64>("release", &inv).await?;
        Ok(())
    }

    async fn set_value(&self, req: &AcquireRequest, held: &Acquired, value: &[u8]) -> Result<()> {
        let id = req.contender.simple().to_string();
        let mut inv = scripts::SET_VALUE.prepare_invoke();
        inv.arg(&self.core.prefix)
            .arg(self.core.lock_key(&req.name))
            .arg(&id)
            .arg(held.token)
            .arg(value);
        match self.core.script::<i64>("set value", &inv).await? {
            1 => Ok(()),
            _ => Err(Error::new(
                ErrorKind::LockLost,
                format!("{}: our entry is gone", req.name),
            )),
        }
    }

    async fn abandon(&self, req: &AcquireRequest) -> Result<()> {
        let id = req.contender.simple().to_string();
        self.routes.remove(&id);
        let fence = req.writes.outcome_unknown();
        let mut inv = scripts::ABANDON.prepare_invoke();
        inv.arg(&self.core.prefix)
            .arg(self.core.lock_key(&req.name))
            .arg(&id)
            .arg(if fence { "1" } else { "0" })
            .arg(&self.sid);
        self.core.script::<i64>("abandon", &inv).await?;
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
        self.stop.cancel();
        let ttl = self.core.config.ttl;
        let until = *self.confirmed.lock().expect("poisoned") + ttl * 2;
        let mut backoff = Backoff::new(
            Duration::from_millis(50),
            (ttl / 10).max(Duration::from_millis(50)),
        );
        loop {
            match self.core.end_session(&self.sid, false).await {
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
        self.stop.cancel();
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
