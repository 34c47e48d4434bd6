//! The session's keepalive: a renewal every third of the TTL, as a
//! network store's client would send, so that a paused renewal
//! ([`super::MemBackend::pause_keepalive`]) expires the session on the
//! store's own clock. Held entries need no watch: the store signals their
//! loss itself.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::core::MemCore;
use crate::backend::SessionLiveness;
use crate::LossReason;

/// Renews session `id` until `stop`, or until the session is lost.
pub(super) async fn keepalive(
    backend: Arc<MemCore>,
    id: u64,
    ttl: Duration,
    liveness: Arc<SessionLiveness>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = liveness.lost() => return,
            _ = tokio::time::sleep(ttl / 3) => {}
        }
        if backend.keepalive_paused() {
            continue;
        }
        let sent = Instant::now();
        backend.count_request();
        if backend.store().state().renew(id) {
            liveness.confirm(sent, ttl);
        } else {
            liveness.lose(LossReason::SessionExpired);
            return;
        }
    }
}
