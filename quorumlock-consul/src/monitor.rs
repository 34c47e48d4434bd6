//! The session's two tasks: the keepalive (one renew every TTL/2, and
//! the destroy of a session given up locally) and the monitor of held
//! locks (one blocking query watches every held entry and signals a loss
//! or a revoke request).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use quorumlock_core::backend::{Backoff, HELD_WATCH_DELAY};
use quorumlock_core::LossReason;
use tokio::time::Instant;

use crate::api::{op, Block, KvEntry};
use crate::core::{SessionState, LONG_POLL};
use crate::layout::{rw_revoke, SemLock, SEMAPHORE_FLAGS};

/// How long a session given up locally is retried to be destroyed.
const ABANDONED_DESTROY_PATIENCE: Duration = Duration::from_secs(600);
/// The first and the longest pause between two tries to destroy a
/// session given up locally, or to remove a held lock the monitor gave
/// up on (jittered: see [`Backoff`]).
const CLEANUP_BACKOFF: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(5));

/// The one keepalive task: renews every TTL/2 (counted from the send time
/// of the last successful renew, so slow answers do not stretch the
/// period), confirms each success with its send time, declares the
/// session lost on a 404, retries transient failures quickly (the
/// client's local deadline fires if they last).
pub(crate) async fn keepalive(s: Arc<SessionState>) {
    let ttl = s.core.config.ttl;
    let longest = (ttl / 4).max(Duration::from_secs(2));
    let mut next = Instant::now() + ttl / 2;
    loop {
        tokio::select! {
            _ = s.stop.cancelled() => return,
            reason = s.liveness.lost() => {
                if reason == LossReason::DeadlinePassed {
                    destroy_abandoned(&s).await;
                }
                return;
            }
            _ = tokio::time::sleep_until(next) => {}
        }
        let sent = Instant::now();
        // Time left before the local deadline: one renew that hangs to its
        // timeout must leave room for another try before it (with TTL
        // 10 s, a 2.5 s timeout + 0.5 s pause after the renew at TTL/2 came
        // exactly at the deadline: a spurious loss). A quarter of it is
        // kept for that: a slow answer (a high latency) still has most of
        // the time.
        let left = s
            .liveness
            .deadline()
            .map(|d| d.saturating_duration_since(sent));
        let timeout = left.map_or(longest, |l| {
            longest.min(l * 3 / 4).max(Duration::from_millis(250))
        });
        match s.core.api.session_renew(&s.id, timeout).await {
            Ok(true) => {
                s.liveness.confirm(sent, ttl);
                next = sent + ttl / 2;
            }
            Ok(false) => {
                tracing::warn!(session = %s.id, "Consul says the session is gone");
                s.liveness.lose(LossReason::SessionExpired);
                return;
            }
            Err(e) => {
                tracing::debug!(session = %s.id, error = %e, "renewing the session failed; retrying");
                let now = Instant::now();
                let left = s
                    .liveness
                    .deadline()
                    .map_or(Duration::MAX, |d| d.saturating_duration_since(now));
                // A pace set by the local deadline, not a backoff: every
                // retry must still come before it, so the pause shrinks
                // as the deadline nears and never grows.
                let pause = Duration::from_millis(500)
                    .min(left / 4)
                    .max(Duration::from_millis(50));
                next = now + pause;
            }
        }
    }
}

/// A session given up locally (no renew confirmed before the deadline)
/// may still live on the servers, and hold its locks there until its TTL
/// runs out, or longer: after every server of a cluster was restarted,
/// Consul 1.8.7 kept such sessions for good in our tests. We gave it up,
/// so destroying it is safe: retry until the agent answers (at most
/// [`ABANDONED_DESTROY_PATIENCE`]) or the session is closed.
async fn destroy_abandoned(s: &SessionState) {
    let start = Instant::now();
    let mut backoff = Backoff::new(CLEANUP_BACKOFF.0, CLEANUP_BACKOFF.1);
    loop {
        match s.core.api.session_destroy(&s.id).await {
            Ok(()) => {
                tracing::debug!(session = %s.id, "destroyed the session given up locally");
                return;
            }
            Err(e) if start.elapsed() < ABANDONED_DESTROY_PATIENCE => {
                tracing::debug!(session = %s.id, error = %e, "destroying a lost session failed; retrying");
            }
            Err(e) => {
                tracing::warn!(session = %s.id, error = %e, "could not destroy a lost session; it ends by its TTL");
                return;
            }
        }
        tokio::select! {
            _ = s.stop.cancelled() => return,
            _ = backoff.wait() => {}
        }
    }
}

/// The monitor waits at least this long between two namespace reads, so
/// that a busy namespace costs a bounded request rate per client.
const MONITOR_MIN_GAP: Duration = Duration::from_millis(50);
/// The first pause after a failed monitor read; it doubles with each
/// further failure, up to an eighth of [`blind_budget`] (at most
/// [`MONITOR_MAX_BACKOFF`]), so that several reads are tried within it.
/// Each pause is jittered ([`Backoff`]: up to twice its step); the budget
/// itself is not: the pause ends when a held lock's budget runs out.
const MONITOR_FIRST_BACKOFF: Duration = Duration::from_millis(25);
const MONITOR_MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How long the check of our session after a loss may take: the loss is
/// reported then anyway (as `EntryDeleted`).
const SESSION_CHECK_TIMEOUT: Duration = Duration::from_millis(250);

/// How long the monitor may go without a successful read, once a read
/// failed, before it declares the held locks lost (`DeadlinePassed`).
/// A forced break keeps `.lock` for the breaker's lock-delay (its grace)
/// and then frees it: a holder that cannot see its entry must give up
/// well within that grace, so half of our `lock_delay` (the breaker is
/// assumed to use the same or a longer one). Without a lock-delay a
/// break frees the lock at once and the loss signal races the next
/// acquire whatever we do: then TTL/2, so that a leader election the
/// session survives does not lose its locks. Never more than TTL/2.
pub(crate) fn blind_budget(ttl: Duration, lock_delay: Duration) -> Duration {
    if lock_delay.is_zero() {
        ttl / 2
    } else {
        (lock_delay / 2).min(ttl / 2)
    }
}

/// The longest common prefix of the watched `.lock` keys: the narrowest
/// prefix one blocking query can watch them all under. For one held lock
/// it is `<ns>/<name>/.lock`, which also covers its `.lock.revoke`.
fn common_prefix<'a>(mut keys: impl Iterator<Item = &'a String>) -> String {
    let Some(first) = keys.next() else {
        return String::new();
    };
    let mut len = first.len();
    for k in keys {
        len = first
            .bytes()
            .zip(k.bytes())
            .take(len)
            .take_while(|(a, b)| a == b)
            .count();
    }
    while !first.is_char_boundary(len) {
        len -= 1;
    }
    first[..len].to_string()
}

/// Watches every held lock of the session with ONE blocking query
/// (`?recurse&consistent`) over the longest common prefix of their keys
/// (the lock's own `.lock` for one held lock, at most the namespace), and
/// dispatches what it sees: `.lock` gone or not ours at our token -> loss;
/// a revoke marker for our token -> revoke request.
///
/// An index from a read of a wider prefix is safe to block on with a
/// narrower one: the wider read saw every change up to it.
///
/// A failed read leaves the held locks unconfirmed: from then on each
/// read is an immediate (non-blocking) one, retried after a short pause
/// ([`MONITOR_FIRST_BACKOFF`], doubling, at most an eighth of the
/// [`blind_budget`], jittered), and a held lock not confirmed by a successful read
/// within the budget (counted from the first failure, or from its grant
/// if later) is declared lost: a forced break frees the lock only after
/// its grace, which the budget stays well within. All of it on the
/// priority lane of [`crate::api::Api`]: ordinary traffic of the client
/// never delays it.
pub(crate) async fn monitor(s: Arc<SessionState>) {
    let mut index: u64 = 0;
    // Since when the held locks are unconfirmed (a read failed since the
    // last successful one), and the pause before the next read.
    let mut unconfirmed: Option<Instant> = None;
    let cfg = &s.core.config;
    let budget = blind_budget(cfg.ttl, cfg.lock_delay);
    let max_backoff = (budget / 8).clamp(MONITOR_FIRST_BACKOFF, MONITOR_MAX_BACKOFF);
    let mut backoff = Backoff::new(MONITOR_FIRST_BACKOFF, max_backoff);
    loop {
        if let Some(since) = unconfirmed {
            if lose_unconfirmed(&s, since, budget) {
                unconfirmed = None;
                index = 0;
            }
        }
        // Only fresh grants to watch: wait until the oldest is
        // HELD_WATCH_DELAY old (it may be released before: a short hold
        // costs no monitor request; a break in between is seen late, far
        // below the lock-delay that guards it).
        let hold_off = {
            let mut w = s.watch.lock().expect("poisoned");
            w.entries.retain(|_, e| !e.signals.is_finished());
            if w.entries.is_empty() {
                unconfirmed = None;
            }
            if w.entries.values().all(|e| !e.checked) {
                w.entries.values().map(|e| e.since + HELD_WATCH_DELAY).min()
            } else {
                None
            }
        };
        if let Some(t) = hold_off.filter(|t| *t > Instant::now()) {
            tokio::select! {
                _ = s.stop.cancelled() => return,
                _ = s.liveness.lost() => return,
                _ = tokio::time::sleep_until(t) => {}
            }
            continue;
        }
        let query = {
            let mut w = s.watch.lock().expect("poisoned");
            w.entries.retain(|_, e| !e.signals.is_finished());
            let q = if w.entries.is_empty() {
                None
            } else {
                let covered: Vec<String> = w
                    .entries
                    .iter()
                    .flat_map(|(k, e)| {
                        std::iter::once(k.clone()).chain(e.sem.as_ref().map(|s| s.lock_key.clone()))
                    })
                    .collect();
                let prefix = common_prefix(covered.iter());
                let unchecked = w
                    .entries
                    .values()
                    .filter(|e| !e.checked)
                    .map(|e| e.token)
                    .min();
                let any_checked = w.entries.values().any(|e| e.checked);
                let q = match (index, unchecked) {
                    // Unconfirmed: read at once, do not block.
                    _ if unconfirmed.is_some() => 0,
                    // Nothing judged yet: changes before the oldest
                    // grant do not concern us; block from there.
                    (_, Some(t)) if !any_checked => t,
                    (0, Some(t)) => t,
                    (i, Some(t)) => i.min(t),
                    (i, None) => i,
                };
                Some((q, prefix))
            };
            w.inflight = q.clone();
            q
        };
        let deadline = unconfirmed.and_then(|since| next_deadline(&s, since, budget));
        let r = tokio::select! {
            biased;
            _ = s.stop.cancelled() => return,
            _ = s.liveness.lost() => return,
            _ = s.watch_changed.notified() => continue,
            // The budget ran out while this read is in flight: the top of
            // the loop declares the unconfirmed locks lost.
            _ = sleep_until_some(deadline) => {
                s.watch.lock().expect("poisoned").inflight = None;
                continue;
            }
            r = async {
                match &query {
                    Some((q, prefix)) => s.core.api.kv_watch(prefix, Block { index: *q, wait: LONG_POLL, consistent: true }).await,
                    None => std::future::pending().await,
                }
            } => r,
        };
        let prefix = query.map(|(_, p)| p).unwrap_or_default();
        s.watch.lock().expect("poisoned").inflight = None;
        let gap = match r {
            Ok((idx, entries)) => {
                unconfirmed = None;
                backoff.reset();
                index = idx;
                let watched = evaluate(&s, &prefix, idx, &entries, budget).await;
                MONITOR_MIN_GAP + Duration::from_micros(100 * watched as u64)
            }
            Err(e) => {
                let first = unconfirmed.is_none();
                let since = *unconfirmed.get_or_insert_with(Instant::now);
                if first {
                    backoff.reset();
                }
                tracing::debug!(session = %s.id, error = %e, unconfirmed_for = ?since.elapsed(),
                    "monitor read failed; retrying");
                backoff.next_delay()
            }
        };
        let deadline = unconfirmed.and_then(|since| next_deadline(&s, since, budget));
        tokio::select! {
            _ = s.stop.cancelled() => return,
            _ = tokio::time::sleep(gap) => {}
            _ = sleep_until_some(deadline) => {}
        }
    }
}

/// Sleeps until `t`, or for ever.
async fn sleep_until_some(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// When the first held lock unconfirmed since `since` runs out of
/// `budget` (counted from `since`, or from its grant if later).
fn next_deadline(s: &SessionState, since: Instant, budget: Duration) -> Option<Instant> {
    let w = s.watch.lock().expect("poisoned");
    w.entries
        .values()
        .map(|e| e.since.max(since) + budget)
        .min()
}

/// Declares lost (`DeadlinePassed`) every held lock unconfirmed since
/// `since` for `budget` (or since its grant if later), and removes them
/// from the store as a release would: the session may well live on
/// (renewals are separate), and the locks would stay held until the
/// guards are released. `true` if nothing is watched any more.
fn lose_unconfirmed(s: &Arc<SessionState>, since: Instant, budget: Duration) -> bool {
    let now = Instant::now();
    let (lost, empty): (Vec<(String, u64)>, bool) = {
        let mut w = s.watch.lock().expect("poisoned");
        let overdue: Vec<String> = w
            .entries
            .iter()
            .filter(|(_, e)| e.since.max(since) + budget <= now)
            .map(|(k, _)| k.clone())
            .collect();
        let lost = overdue
            .into_iter()
            .filter_map(|k| {
                let e = w.entries.remove(&k)?;
                e.signals.lose(LossReason::DeadlinePassed);
                let at = e.sem.as_ref().map_or(e.token, |s| s.contender_index);
                Some((k, at))
            })
            .collect();
        (lost, w.entries.is_empty())
    };
    if !lost.is_empty() {
        tracing::warn!(session = %s.id, locks = lost.len(), ?budget,
            "cannot confirm the held locks with the store; declaring them lost");
        tokio::spawn(remove_given_up(s.clone(), lost));
    }
    empty
}

/// Removes held locks that the monitor gave up on, as a release would:
/// `.lock` only at the token we held (so never a newer lock of this
/// session), with our queue key and any revoke marker, in one txn; retried
/// until it is done, the lock changed, or the session ends.
async fn remove_given_up(s: Arc<SessionState>, lost: Vec<(String, u64)>) {
    for (lock_key, token) in lost {
        let ops = match lock_key.strip_suffix("/.lock") {
            None if !lock_key.contains("/.rw/") => {
                // A semaphore contender key `P/<session>`: its holder
                // entry in `.lock` is pruned once the key is gone.
                let (base, sid) = lock_key.rsplit_once('/').unwrap_or(("", &lock_key));
                vec![
                    op::check_index(&lock_key, token),
                    op::delete_cas(&lock_key, token),
                    op::delete(&format!("{base}/.revoke/{sid}")),
                ]
            }
            // `check-index` first: `delete-cas` of a missing key succeeds,
            // and the queue key may be a newer acquire's of this session.
            Some(base) => vec![
                op::check_index(&lock_key, token),
                op::delete_cas(&lock_key, token),
                op::delete(&format!("{base}/.queue/{}", s.id)),
                op::delete(&format!("{base}/.lock.revoke")),
            ],
            None => vec![
                op::check_index(&lock_key, token),
                op::delete_cas(&lock_key, token),
                op::delete(&rw_revoke(&lock_key)),
            ],
        };
        let mut backoff = Backoff::new(CLEANUP_BACKOFF.0, CLEANUP_BACKOFF.1);
        loop {
            match s.core.api.txn(ops.clone()).await {
                Ok(_) => break, // done, or `.lock` is no longer ours at `token`
                Err(e) => {
                    tracing::debug!(lock = %lock_key, error = %e, "removing a given-up lock failed; retrying");
                }
            }
            tokio::select! {
                _ = s.stop.cancelled() => return,
                _ = s.liveness.lost() => return,
                _ = backoff.wait() => {}
            }
        }
    }
}

/// Judges every watched lock under `prefix` against a read of it at index
/// `idx`; returns how many locks are watched.
async fn evaluate(
    s: &SessionState,
    prefix: &str,
    idx: u64,
    entries: &[KvEntry],
    budget: Duration,
) -> usize {
    let by_key: HashMap<&str, &KvEntry> = entries.iter().map(|e| (e.key.as_str(), e)).collect();
    let mut lost = Vec::new();
    let watched = {
        let mut w = s.watch.lock().expect("poisoned");
        for (key, e) in w.entries.iter_mut() {
            if e.token > idx
                || !key.starts_with(prefix)
                || e.sem
                    .as_ref()
                    .is_some_and(|s| !s.lock_key.starts_with(prefix))
            {
                continue; // granted after this read, or not covered by it
            }
            e.checked = true;
            let ours = match &e.sem {
                // Unchanged, or rewritten by our own proclaim (even one
                // whose answer was lost): still this grant.
                None => match by_key.get(key.as_str()) {
                    Some(l) if l.is_grant(s.id.as_str(), e.token) => {
                        e.at = e.at.max(l.modify_index);
                        true
                    }
                    _ => false,
                },
                Some(sw) => {
                    by_key.get(key.as_str()).is_some_and(|c| {
                        c.holder() == Some(s.id.as_str()) && c.modify_index == sw.contender_index
                    }) && by_key.get(sw.lock_key.as_str()).is_some_and(|l| {
                        l.flags == SEMAPHORE_FLAGS
                            && SemLock::decode(l)
                                .is_some_and(|st| st.holders.contains_key(s.id.as_str()))
                    })
                }
            };
            if !ours {
                lost.push((key.clone(), e.token));
                continue;
            }
            if let Some(r) = by_key.get(e.revoke_key.as_str()) {
                let want = e.sem.as_ref().map_or(e.token, |s| s.contender_index);
                if r.holder() == Some(s.id.as_str())
                    && r.record().and_then(|r| r.token) == Some(want)
                    && !e.signals.is_revoke_requested()
                {
                    tracing::debug!(lock = %key, "revoke requested");
                    e.signals.request_revoke();
                }
            }
        }
        w.entries.len()
    };
    if lost.is_empty() {
        return watched;
    }
    // Gone because the session is gone, or deleted behind our back? Asked
    // on the priority lane, and not for long: the loss must be reported
    // within a break's grace, whatever else the client is doing.
    let ask = SESSION_CHECK_TIMEOUT.min(budget / 4);
    let reason = match s.core.api.session_exists_now(&s.id, ask).await {
        Ok(false) => {
            s.liveness.lose(LossReason::SessionExpired);
            LossReason::SessionExpired
        }
        _ => LossReason::EntryDeleted,
    };
    let mut w = s.watch.lock().expect("poisoned");
    for (key, token) in lost {
        if w.entries.get(&key).is_some_and(|e| e.token == token) {
            let e = w.entries.remove(&key).expect("checked above");
            tracing::info!(lock = %key, token, %reason, "held lock lost");
            e.signals.lose(reason);
        }
    }
    w.entries.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_of_lock_keys() {
        let k = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(common_prefix(k(&[]).iter()), "");
        assert_eq!(common_prefix(k(&["ns/a/.lock"]).iter()), "ns/a/.lock");
        assert_eq!(
            common_prefix(k(&["ns/bulk/l1/.lock", "ns/bulk/l10/.lock", "ns/bulk/l2/.lock"]).iter()),
            "ns/bulk/l"
        );
        assert_eq!(common_prefix(k(&["a/.lock", "b/.lock"]).iter()), "");
    }
}
