//! The session's keepalive (its row renewed every TTL/3, the held entries
//! checked in the same statement) and the listener of its channel (the
//! wake-ups of its waiters, the loss of its entries, revoke requests, the
//! session's kill), on a connection of its own.

use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::types::{ToSql, Type};

use futures::StreamExt;
use quorumlock_core::backend::Backoff;
use quorumlock_core::{LossReason, Result};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::{AsyncMessage, Client};
use uuid::Uuid;

use crate::core::{SessionState, Work};
use crate::error;
use crate::layout;

/// Renews the session every third of its TTL (a tenth after a failure);
/// confirms each renewal with its send time; reports the session lost when
/// its row is gone or expired, and a held entry lost when the renewal
/// finds it gone (a message its listener missed), a revoke request when
/// it finds one.
pub(crate) async fn keepalive(state: Arc<SessionState>) {
    let ttl = state.core.config.ttl;
    let mut pause = ttl / 3;
    loop {
        tokio::select! {
            _ = state.stop.cancelled() => return,
            _ = state.liveness.lost() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        let held = state.held();
        let sent = Instant::now();
        match renew(&state, held).await {
            Ok((1, gone, revoked)) => {
                state.liveness.confirm(sent, ttl);
                for c in &gone {
                    state.entry_gone(c);
                }
                for c in &revoked {
                    state.revoke_requested(c);
                }
                pause = ttl / 3;
            }
            Ok(_) => {
                tracing::info!("the PostgreSQL session row is gone or expired");
                state.liveness.lose(LossReason::SessionExpired);
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "renewal failed; trying again");
                pause = ttl / 10;
            }
        }
    }
}

/// One renewal: on the listener's connection while there is one (a
/// renewal that gets no answer there makes the listener reconnect), else
/// on a pooled one. Whether the session lives, its held entries that are
/// gone, and those with a revoke request.
async fn renew(state: &Arc<SessionState>, held: Vec<Uuid>) -> Result<(i32, Vec<Uuid>, Vec<Uuid>)> {
    let what = "renew session";
    let core = &state.core;
    let listener = state.listener.lock().expect("poisoned").clone();
    if let Some((client, reader)) = listener.filter(|(c, _)| !c.is_closed()) {
        core.count();
        let params: [(&(dyn ToSql + Sync), Type); 2] =
            [(&state.id, Type::UUID), (&held, Type::UUID_ARRAY)];
        let q = client.query_typed_one(&core.sql.renew, &params);
        // Up to half the TTL, not just the request timeout: the deadline
        // rests on the send time, so a slow answer is as good, and a slow
        // link (latency, a loaded host) must not fail every renewal.
        let bound = core.config.timeout.max(core.config.ttl / 2);
        let r = match tokio::time::timeout(bound, q).await {
            Ok(Ok(row)) => (|| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))()
                .map_err(|e| error::map(e, what)),
            Ok(Err(e)) => Err(error::map(e, what)),
            Err(_) => Err(error::timed_out(what, bound)),
        };
        if r.is_err() {
            reader.abort();
        }
        return r;
    }
    let (c, id) = (core.clone(), state.id);
    let work: Work<(i32, Vec<Uuid>, Vec<Uuid>)> = Box::new(move |client| {
        Box::pin(async move {
            let row = client
                .query_typed_one(
                    &c.sql.renew,
                    &[(&id, Type::UUID), (&held, Type::UUID_ARRAY)],
                )
                .await?;
            Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
        })
    });
    core.run(what, work).await
}

/// A connection that listens on the session's channel: the client, and
/// the task that reads its messages and delivers them (it ends with the
/// connection).
pub(crate) async fn listen(state: &Arc<SessionState>) -> Result<(Arc<Client>, JoinHandle<()>)> {
    let core = &state.core;
    let what = "connecting the session's listener";
    let (client, mut connection) = core.open(what).await?;
    let s = state.clone();
    let reader = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(m) = messages.next().await {
            match m {
                Ok(AsyncMessage::Notification(n)) => deliver(&s, n.payload()),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "the listener's connection failed");
                    break;
                }
            }
        }
    });
    core.count();
    // The connection's settings and the LISTEN in one round trip.
    let sql = format!(
        "{}; LISTEN \"{}\"",
        core.settings,
        layout::channel(&state.id)
    );
    match tokio::time::timeout(core.config.timeout, client.batch_execute(&sql)).await {
        Ok(Ok(())) => {
            let client = Arc::new(client);
            *state.listener.lock().expect("poisoned") =
                Some((client.clone(), reader.abort_handle()));
            Ok((client, reader))
        }
        Ok(Err(e)) => {
            reader.abort();
            Err(error::map(e, "LISTEN"))
        }
        Err(_) => {
            reader.abort();
            Err(error::timed_out("LISTEN", core.config.timeout))
        }
    }
}

/// Keeps the session's listener: when its connection ends, drops the
/// grants' tokens not yet taken, opens another connection (backing off
/// from 100 ms to 2 s), and wakes every waiter of the session to read its
/// standing again (a grant's message may have been missed; held entries
/// are checked by the next renewal).
pub(crate) async fn supervise(
    state: Arc<SessionState>,
    mut current: (Arc<Client>, JoinHandle<()>),
) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    loop {
        let ended = tokio::select! {
            _ = state.stop.cancelled() => false,
            _ = state.liveness.lost() => false,
            _ = &mut current.1 => true,
        };
        if !ended {
            current.1.abort();
            *state.listener.lock().expect("poisoned") = None;
            return;
        }
        *state.listener.lock().expect("poisoned") = None;
        state.forget_granted();
        current = loop {
            tokio::select! {
                _ = state.stop.cancelled() => return,
                _ = state.liveness.lost() => return,
                _ = backoff.wait() => {}
            }
            match listen(&state).await {
                Ok(l) => break l,
                Err(e) => tracing::debug!(error = %e, "reopening the listener failed"),
            }
        };
        backoff.reset();
        state.wake_all();
    }
}

/// One message of the session's channel: `g <contender> [<token>]`
/// (granted: wake its waiter, with the token when the step knew it),
/// `l <contender>` (broken), `r <contender>` (revoke requested), `x` (the
/// session was killed).
fn deliver(state: &SessionState, msg: &str) {
    if let Some((c, token)) = layout::grant_message(msg) {
        return state.granted(&c, token);
    }
    let (what, contender) = msg.split_once(' ').unwrap_or((msg, ""));
    let contender = Uuid::try_parse(contender).ok();
    match (what, contender) {
        ("l", Some(c)) => state.entry_gone(&c),
        ("r", Some(c)) => state.revoke_requested(&c),
        ("x", _) => state.liveness.lose(LossReason::SessionExpired),
        _ => tracing::warn!(msg, "unknown message on the session's channel"),
    }
}
