//! The renew task: keeps the session alive (one renew every TTL/2) and
//! destroys it once given up locally.

use std::sync::Arc;
use std::time::Duration;

use quorumlock_core::LossReason;
use tokio::time::Instant;

use crate::core::SessionState;

/// How long a session given up locally is retried to be destroyed.
const ABANDONED_DESTROY_PATIENCE: Duration = Duration::from_secs(600);

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
    let mut pause = Duration::from_millis(500);
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
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}
