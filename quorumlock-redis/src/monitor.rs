//! What keeps a session and watches its entries: the keepalive (the
//! renewal task, every TTL/3) and the mailbox reader, which delivers the
//! messages the scripts leave in the session's mailbox (a waiter's grant,
//! a held entry's loss or revoke request, the end of the session).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use quorumlock_core::backend::Backoff;
use quorumlock_core::LossReason;
use redis::aio::ConnectionManager;
use redis::Value;
use tokio::time::Instant;

use crate::core::{text, SessionState};
use crate::layout;
use crate::scripts;

/// How long a mailbox read blocks on the server before it is sent again
/// (each read is one request): a third of the TTL, like the renewals, so
/// that a dead mailbox connection is noticed about as soon as a dead
/// request connection; at least 1 s, at most 1 h.
fn mailbox_block(ttl: Duration) -> Duration {
    (ttl / 3).clamp(Duration::from_secs(1), Duration::from_secs(3600))
}

/// Renews the session every third of its TTL; confirms each renewal with
/// its send time, and reports the session lost when Redis no longer has
/// it, and a held entry lost when Redis no longer has that. A failed
/// renewal is tried again sooner; the local deadline ends the session if
/// none gets through. Each renewal also sends every contender the client
/// owns, its own number and that of the last renewal answered: the
/// script removes the session's entries the client no longer owns (see
/// [`scripts::RENEW`]).
pub(crate) async fn keepalive(session: Arc<SessionState>) {
    let (core, sid, routes) = (&session.core, &session.sid, &session.routes);
    let (liveness, stop) = (&session.liveness, &session.stop);
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
            .arg(sid)
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
                *session.confirmed.lock().expect("poisoned") = sent;
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
pub(crate) async fn read_mailbox(session: Arc<SessionState>, mut conn: ConnectionManager) {
    let core = &session.core;
    let (liveness, stop) = (&session.liveness, &session.stop);
    let key = format!("{}/.mail", layout::session_key(&core.prefix, &session.sid));
    let block = mailbox_block(core.config.ttl);
    let bound = block + core.config.timeout;
    // After a failed read; from the shortest delay again once one is
    // answered.
    let mut retry = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
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
            Ok(Ok(answer)) => {
                retry.reset();
                if let Some((_, msg)) = answer {
                    deliver(&session, &msg);
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "mailbox read failed; reading again");
                retry.wait().await;
            }
            Err(_) => tracing::debug!("mailbox read got no answer; reading again"),
        }
    }
}

/// One mailbox message: `x` (the session was killed), or `g`, `l` or `r`
/// and a contender id (its grant, its loss, a revoke request for it).
fn deliver(session: &SessionState, msg: &str) {
    if msg == "x" {
        session.liveness.lose(LossReason::SessionExpired);
        return;
    }
    let Some((what, id)) = msg.split_once(' ') else {
        tracing::warn!(msg, "unknown mailbox message");
        return;
    };
    // No route: released or abandoned meanwhile.
    session.routes.with(id, |route| match what {
        "g" => route.wake.notify_one(),
        "l" => route.signals.lose(LossReason::EntryDeleted),
        "r" => route.signals.request_revoke(),
        _ => tracing::warn!(msg, "unknown mailbox message"),
    });
}
