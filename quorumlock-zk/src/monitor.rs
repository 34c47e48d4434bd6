//! What watches a session and its held nodes: the keepalive, and the one
//! watch dispatcher per session (a deleted or broken node is a loss,
//! `__REVOKE__` data a revoke request; for an election's leader, also a
//! revoke request naming it in the election node's data).

use std::collections::HashSet;
use std::sync::Arc;

use quorumlock_core::backend::{Backoff, DelayQueue, HELD_WATCH_DELAY};
use quorumlock_core::LossReason;
use tokio::sync::mpsc;
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::core::{is_terminal, retry_backoff, SessionState, WatchedRead};
use crate::layout::{election_revoke_target, is_broken, is_revoke_mark};

/// What one watch future of the dispatcher ended with.
pub(crate) enum Step {
    /// `getData` with a watch on the holder's node answered.
    Armed(
        uuid::Uuid,
        Retry,
        std::result::Result<WatchedRead, zk::Error>,
    ),
    /// The watch on the holder's node fired.
    Fired(uuid::Uuid, zk::WatchedEvent),
    /// `getData` with a watch on an election leader's election node
    /// answered.
    DirArmed(
        uuid::Uuid,
        Retry,
        std::result::Result<WatchedRead, zk::Error>,
    ),
    /// The watch on an election leader's election node fired.
    DirFired(uuid::Uuid, zk::WatchedEvent),
    /// The entry of this election leader was released or lost: its watch
    /// on the election node is dropped.
    DirGone(uuid::Uuid),
    /// The entry was released (or the session closed) before the watch was
    /// set; or a request that needs no follow-up is done.
    Gone,
}

pub(crate) type StepFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Step> + Send>>;

/// The backoff of setting a watch again after failures; `None` for a
/// first attempt, sent at once.
pub(crate) type Retry = Option<Backoff>;

/// The backoff of the next attempt after one with `retry` failed.
fn again(retry: Retry) -> Retry {
    Some(retry.unwrap_or_else(retry_backoff))
}

/// Sets (or re-sets, after failures: `retry`) the watch on a held node.
pub(crate) fn arm(session: &Arc<SessionState>, key: uuid::Uuid, mut retry: Retry) -> StepFuture {
    let session = session.clone();
    Box::pin(async move {
        if let Some(b) = retry.as_mut() {
            b.wait().await;
        }
        let node = match session.held.lock().expect("poisoned").get(&key) {
            Some(h) if !h.signals.is_finished() => h.node.clone(),
            _ => return Step::Gone,
        };
        let Ok(c) = session.client() else {
            return Step::Gone;
        };
        session.send(1);
        let r = c.get_and_watch_data(&node).await;
        session.heard_read(&r);
        Step::Armed(key, retry, r)
    })
}

/// Sets (or re-sets) the watch on the election node of a held election
/// leader: the revoke request of an election is written there
/// (`layout::election_revoke_data`), not on the leader's node.
fn arm_dir(session: &Arc<SessionState>, key: uuid::Uuid, mut retry: Retry) -> StepFuture {
    let session = session.clone();
    Box::pin(async move {
        if let Some(b) = retry.as_mut() {
            b.wait().await;
        }
        let dir = match session.held.lock().expect("poisoned").get(&key) {
            Some(h) if !h.signals.is_finished() => match &h.revoke_dir {
                Some(d) => d.clone(),
                None => return Step::DirGone(key),
            },
            _ => return Step::DirGone(key),
        };
        let Ok(c) = session.client() else {
            return Step::DirGone(key);
        };
        session.send(1);
        let r = c.get_and_watch_data(&dir).await;
        session.heard_read(&r);
        Step::DirArmed(key, retry, r)
    })
}

/// Clears an election's revoke request from the election node `dir`,
/// unless it was written again since it was read (at `version`).
fn clear_revoke_mark(session: &Arc<SessionState>, dir: Box<str>, version: i32) -> StepFuture {
    let session = session.clone();
    Box::pin(async move {
        let Ok(c) = session.client() else {
            return Step::Gone;
        };
        let sent = session.send(1);
        let r = c.set_data(&dir, &[], Some(version)).await;
        session.heard(sent, &r);
        if let Err(e) = r {
            tracing::debug!(%dir, error = %e, "revoke request not cleared");
        }
        Step::Gone
    })
}

/// The one task that watches every held node of a session: deletion by
/// someone else (or the `__BREAK__` mark) is a loss, `__REVOKE__` data is
/// a revoke request (Curator's `Revoker` protocol). Per held lock it keeps
/// only a map entry and one small pending future, not a task.
pub(crate) async fn watch_dispatcher(
    session: Arc<SessionState>,
    mut armed: mpsc::UnboundedReceiver<(uuid::Uuid, Option<WatchedRead>)>,
) {
    use futures::StreamExt;
    let mut pending = futures::stream::FuturesUnordered::<StepFuture>::new();
    // Fresh grants wait HELD_WATCH_DELAY before their watch is set: a short
    // hold costs no read. The read shows what happened meanwhile (a gone
    // node, a break or revoke mark), so nothing is missed. A grant that
    // created its lock node comes with that read done (sent with the
    // create anyway).
    let mut fresh = DelayQueue::new(HELD_WATCH_DELAY);
    // Election leaders whose election node is watched (or being watched).
    let mut dir_watched: HashSet<uuid::Uuid> = HashSet::new();
    // Reports a loss for `key` unless it was released or finished, and
    // forgets it.
    let lose = |key: &uuid::Uuid, why: &str| {
        let entry = session.held.lock().expect("poisoned").remove(key);
        if let Some(h) = entry {
            if !h.signals.is_finished() {
                tracing::info!(node = %h.node, why, "held lock node deleted");
                h.signals.lose(LossReason::EntryDeleted);
            }
        }
    };
    loop {
        let step = tokio::select! {
            _ = session.stop.cancelled() => return,
            _ = session.liveness.lost() => return,
            key = armed.recv() => match key {
                // Watched by the read behind its create already.
                Some((key, Some(read))) => Step::Armed(key, None, Ok(read)),
                Some((key, None)) => {
                    fresh.push(key);
                    continue;
                }
                None => return,
            },
            _ = tokio::time::sleep_until(fresh.next_due().unwrap_or_else(Instant::now)), if !fresh.is_empty() => {
                while let Some(key) = fresh.pop_due() {
                    pending.push(arm(&session, key, None));
                }
                continue;
            }
            Some(step) = pending.next(), if !pending.is_empty() => step,
        };
        match step {
            Step::Gone => {}
            Step::Armed(key, _, Ok((data, _, watcher))) => {
                let (signals, election) = match session.held.lock().expect("poisoned").get(&key) {
                    Some(h) if !h.signals.is_finished() => {
                        (h.signals.clone(), h.revoke_dir.is_some())
                    }
                    _ => continue, // released meanwhile: drop the watch
                };
                if is_broken(&data) {
                    lose(&key, "marked for a forced break");
                    continue;
                }
                // Leases keep their permit count after the marker.
                if is_revoke_mark(&data) && !signals.is_revoke_requested() {
                    tracing::info!(%key, "revoke requested");
                    signals.request_revoke();
                }
                if election && dir_watched.insert(key) {
                    pending.push(arm_dir(&session, key, None));
                }
                pending.push(Box::pin(async move {
                    Step::Fired(key, watcher.changed().await)
                }));
            }
            Step::DirArmed(key, _, Ok((data, stat, watcher))) => {
                let (signals, node, dir) = match session.held.lock().expect("poisoned").get(&key) {
                    Some(h) if !h.signals.is_finished() => {
                        (h.signals.clone(), h.node.clone(), h.revoke_dir.clone())
                    }
                    _ => {
                        dir_watched.remove(&key);
                        continue;
                    }
                };
                let Some(dir) = dir else {
                    dir_watched.remove(&key);
                    continue;
                };
                if let Some(target) = election_revoke_target(&data) {
                    let ours = node.rsplit('/').next() == Some(target);
                    if ours && !signals.is_revoke_requested() {
                        tracing::info!(%key, "revoke requested (election)");
                        signals.request_revoke();
                    }
                    // Ours, now heard; or another leader's, stale (we lead,
                    // so its leader is gone): cleared either way, unless
                    // written again meanwhile.
                    pending.push(clear_revoke_mark(&session, dir, stat.version));
                }
                pending.push(Box::pin(async move {
                    tokio::select! {
                        ev = watcher.changed() => Step::DirFired(key, ev),
                        _ = signals.finished() => Step::DirGone(key),
                        _ = signals.lost() => Step::DirGone(key),
                    }
                }));
            }
            Step::DirArmed(key, retry, Err(e)) => {
                if e == zk::Error::NoNode || is_terminal(&e) {
                    // No election node, so no node of ours either: the
                    // watch on that reports it; or the session is over.
                    dir_watched.remove(&key);
                } else {
                    pending.push(arm_dir(&session, key, again(retry)));
                }
            }
            Step::DirFired(key, ev) => match ev.event_type {
                zk::EventType::Session if ev.session_state.is_terminated() => {
                    dir_watched.remove(&key);
                }
                zk::EventType::NodeDeleted => {
                    dir_watched.remove(&key);
                }
                _ => pending.push(arm_dir(&session, key, None)), // data changed, or a reconnect
            },
            Step::DirGone(key) => {
                dir_watched.remove(&key);
            }
            Step::Armed(key, _, Err(zk::Error::NoNode)) => lose(&key, "NoNode"),
            Step::Armed(key, _, Err(e)) if is_terminal(&e) => {
                // The session is over: liveness reports it.
                session.held.lock().expect("poisoned").remove(&key);
            }
            // Connection trouble: the local deadline fires the loss if this
            // lasts; keep trying to re-arm the watch until then.
            Step::Armed(key, retry, Err(_)) => pending.push(arm(&session, key, again(retry))),
            Step::Fired(key, ev) => match ev.event_type {
                zk::EventType::NodeDeleted => lose(&key, "NodeDeleted"),
                zk::EventType::Session if ev.session_state.is_terminated() => {
                    session.held.lock().expect("poisoned").remove(&key);
                }
                _ => pending.push(arm(&session, key, None)), // data changed, or a reconnect
            },
        }
    }
}

/// The one background task of a session: a `sync` every third of the
/// negotiated timeout, answered through the leader, confirms the local
/// deadline from its send time;
/// a terminal session state (expired, auth failed, closed) is a loss.
pub(crate) async fn keepalive(session: Arc<SessionState>) {
    let mut state = session.state.clone();
    let period = session.timeout / 3;
    let mut next = Instant::now() + period;
    loop {
        let s = state.peek_state();
        if s.is_terminated() {
            tracing::info!(session = %session.id, state = %s, "ZooKeeper session ended");
            session.liveness.lose(LossReason::SessionExpired);
            return;
        }
        tokio::select! {
            _ = session.stop.cancelled() => return,
            _ = session.liveness.lost() => {
                // Every guard has been told. End the session on the server
                // now: the library would otherwise keep it alive with its
                // own pings once the servers are back, and our nodes with
                // it, so waiters would wait until this client is dropped.
                tracing::info!(session = %session.id, "session lost locally; closing it");
                session.stop.cancel();
                session.client.lock().expect("poisoned").take();
                return;
            }
            _ = state.changed() => continue,
            _ = tokio::time::sleep_until(next) => {}
        }
        next = Instant::now() + period;
        let Ok(c) = session.client() else { return };
        session.core.count_keepalive();
        let sent = Instant::now();
        // A `sync`, not a read: the leader answers it (see `SessionState::heard`).
        let r = tokio::select! {
            r = c.sync("/") => r,
            _ = session.stop.cancelled() => return,
        };
        drop(c);
        session.heard(sent, &r);
        if let Err(e) = r {
            tracing::debug!(error = %e, "keepalive sync failed");
        }
    }
}
