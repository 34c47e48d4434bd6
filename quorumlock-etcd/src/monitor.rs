//! What watches a session and its held keys: the lease keepalive, and
//! the watch of each held key (through the shared [`crate::watch`] hub).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::GetOptions;
use quorumlock_core::backend::{Backoff, EntrySignals};
use quorumlock_core::{ErrorKind, LossReason};
use tokio::time::Instant;

use crate::core::SessionState;
use crate::error;
use crate::watch::{Sink, WatchEvent};

/// The keepalive loop: one `LeaseKeepAlive` stream, one request every
/// TTL/3 (every TTL/10 while the link is slow). Requests are not held back by slow answers: etcd answers them in
/// order, so each answer is matched with its request's send time, and an
/// answer with `ttl > 0` confirms the lease from that send time, however
/// late it comes. An answer with ttl 0 (or "lease not found") means the
/// lease is gone. A stream that breaks, or leaves a request unanswered for
/// a whole TTL, is replaced. `ttl` is the one etcd granted.
pub(crate) async fn keepalive(session: Arc<SessionState>, ttl: Duration) {
    let (core, id) = (&session.core, session.lease);
    let (liveness, stop) = (&session.liveness, &session.stop);
    let period = ttl / 3;
    let fast = ttl / 10;
    let retry = period.min(Duration::from_millis(300));
    let mut next = Instant::now() + period;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = liveness.lost() => return,
            _ = tokio::time::sleep_until(next) => {}
        }
        // Opening the stream sends the first keepalive and waits for its
        // answer; it fails with "lease not found" when the lease is gone.
        let sent = Instant::now();
        core.requests.fetch_add(1, Ordering::Relaxed);
        let mut lease = core.client.lease_client();
        let opened = tokio::select! {
            _ = stop.cancelled() => return,
            _ = liveness.lost() => return,
            r = tokio::time::timeout(ttl, lease.keep_alive(id)) => r,
        };
        let (mut keeper, mut answers) = match opened {
            Ok(Ok(s)) => {
                liveness.confirm(sent, ttl);
                s
            }
            Ok(Err(e)) => {
                let e = error::map(e, "lease keepalive");
                if e.kind() == ErrorKind::SessionLost {
                    tracing::warn!("etcd lease not found");
                    liveness.lose(LossReason::SessionExpired);
                    return;
                }
                tracing::debug!(error = %e, "opening the keepalive stream failed; retrying");
                next = Instant::now() + retry;
                continue;
            }
            Err(_) => {
                tracing::debug!("the keepalive stream did not open within the TTL; retrying");
                next = Instant::now();
                continue;
            }
        };
        let mut last_sent = sent;
        let mut last_rtt = sent.elapsed();
        let mut pending: VecDeque<Instant> = VecDeque::new();
        loop {
            let stale = pending.front().map(|s| *s + ttl);
            // A slow link (an answer took more than TTL/10, or one is
            // overdue by that much) renews every TTL/10 instead of TTL/3:
            // the deadline runs from the send time of the newest answered
            // request, so sending more often keeps it from falling behind
            // by the latency plus a whole period.
            let slow = last_rtt > fast || pending.front().is_some_and(|s| s.elapsed() > fast);
            let next = last_sent + if slow { fast } else { period };
            // Also wake when the oldest answer becomes overdue, to switch.
            let wake = match pending.front() {
                Some(f) if !slow => next.min(*f + fast),
                _ => next,
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = liveness.lost() => return,
                _ = tokio::time::sleep_until(wake) => {
                    let now = Instant::now();
                    if now < next {
                        continue;
                    }
                    core.requests.fetch_add(1, Ordering::Relaxed);
                    if keeper.keep_alive().await.is_err() {
                        break;
                    }
                    pending.push_back(now);
                    last_sent = now;
                }
                answer = answers.message() => match answer {
                    Ok(Some(r)) => {
                        let Some(sent) = pending.pop_front() else { continue };
                        last_rtt = sent.elapsed();
                        if r.ttl() > 0 {
                            liveness.confirm(sent, Duration::from_secs(r.ttl() as u64));
                        } else {
                            tracing::warn!("etcd lease expired");
                            liveness.lose(LossReason::SessionExpired);
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let e = error::map(e, "lease keepalive");
                        if e.kind() == ErrorKind::SessionLost {
                            liveness.lose(LossReason::SessionExpired);
                            return;
                        }
                        tracing::debug!(error = %e, "keepalive stream failed");
                        break;
                    }
                },
                _ = tokio::time::sleep_until(stale.unwrap_or(next)), if stale.is_some() => {
                    tracing::debug!("a keepalive went unanswered for a TTL; reopening the stream");
                    break;
                }
            }
        }
        next = Instant::now() + retry;
    }
}

/// A held entry as the watch task keeps it: what a delete or put on its
/// key means. A few hundred bytes per held lock.
pub(crate) struct WatchedEntry {
    /// The session that holds it.
    pub(crate) session: Arc<SessionState>,
    pub(crate) signals: EntrySignals,
    pub(crate) key: Box<str>,
    pub(crate) token: i64,
    /// For an election candidate: the value last seen on our key (as
    /// stored). A put that changes it is our own `proclaim`; a revoke
    /// request keeps the value (and the lease), and a proclaim never
    /// writes the value the key has (etcd compares it in the same txn), so
    /// only a put that keeps it is a revoke.
    pub(crate) value: Option<Arc<std::sync::Mutex<Seen>>>,
}

/// The value of a held election entry as last seen, and the revision it
/// was seen at.
pub(crate) struct Seen {
    pub(crate) value: Vec<u8>,
    pub(crate) rev: i64,
}

impl Seen {
    /// Takes in our key as a put event or a read shows it (its value and
    /// mod revision): whether a revoke was requested, i.e. it was written
    /// since the last time seen and kept the value. A repeated event
    /// (mod revision not past the last one) is none. After a gap (a read
    /// after a compaction), a proclaim and a revoke request that both came
    /// in it cannot be told apart: a changed value is taken for the
    /// proclaim.
    fn revoked_by(&mut self, value: &[u8], mod_rev: i64) -> bool {
        if mod_rev <= self.rev {
            return false;
        }
        self.rev = mod_rev;
        if value == self.value.as_slice() {
            return true;
        }
        self.value = value.to_vec();
        false
    }
}

impl WatchedEntry {
    pub(crate) fn copy(&self) -> WatchedEntry {
        WatchedEntry {
            session: self.session.clone(),
            signals: self.signals.clone(),
            key: self.key.clone(),
            token: self.token,
            value: self.value.clone(),
        }
    }

    /// Watches our key from revision `from`; `later`: after
    /// [`quorumlock_core::backend::HELD_WATCH_DELAY`], if still held then.
    pub(crate) fn subscribe(self, from: i64, later: bool) {
        let (session, key) = (self.session.clone(), self.key.as_bytes().to_vec());
        session.core.hub.subscribe(key, from, Arc::new(self), later);
    }

    /// etcd cancelled the watch (compaction past its start) or refused to
    /// create it: re-read the key after `first`, then watch again from
    /// there (a failed read is retried, backing off from twice `first` to
    /// 2 s, with jitter).
    pub(crate) async fn rewatch(self, first: Duration) {
        let most = Duration::from_secs(2);
        let mut backoff = Backoff::new((first * 2).min(most), most);
        let mut delay = first;
        loop {
            tokio::select! {
                _ = self.signals.finished() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = backoff.next_delay();
            let resp = match self
                .session
                .core
                .get("re-read held entry", self.key.as_bytes(), GetOptions::new())
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(error = %e, key = %self.key, "re-reading a held entry failed");
                    continue;
                }
            };
            match resp.kvs().first() {
                Some(kv) if kv.create_revision() == self.token => {
                    let revoked = match &self.value {
                        // An election leader's proclaims move the mod
                        // revision too.
                        Some(seen) => seen
                            .lock()
                            .expect("poisoned")
                            .revoked_by(kv.value(), kv.mod_revision()),
                        None => kv.mod_revision() > self.token,
                    };
                    if revoked {
                        self.signals.request_revoke();
                    }
                }
                _ => return self.deleted().await,
            }
            if self.signals.is_finished() {
                return;
            }
            let from = resp.header().map_or(0, |h| h.revision()) + 1;
            return self.subscribe(from, false);
        }
    }

    /// Our key is gone: a forced break, or our lease ended with it.
    pub(crate) async fn deleted(self) {
        let session = &self.session;
        if let Some(reason) = session.liveness.loss() {
            self.signals.lose(reason);
            return;
        }
        match session.core.lease_alive(session.lease).await {
            Ok(false) => {
                self.signals.lose(LossReason::SessionExpired);
                session.liveness.lose(LossReason::SessionExpired);
            }
            _ => self.signals.lose(LossReason::EntryDeleted),
        }
        tracing::debug!(key = %self.key, reason = ?self.signals.loss(), "held entry lost");
    }
}

impl Sink for WatchedEntry {
    fn event(&self, ev: WatchEvent) -> bool {
        if self.signals.is_finished() {
            return false; // our own release or abandon
        }
        match ev {
            WatchEvent::Created(_) => true,
            WatchEvent::Put(kv) => {
                let revoked = match &self.value {
                    // A put that changes the value is a proclaim.
                    Some(seen) => seen
                        .lock()
                        .expect("poisoned")
                        .revoked_by(kv.value(), kv.mod_revision()),
                    None => kv.mod_revision() > self.token,
                };
                if revoked {
                    tracing::debug!(key = %self.key, "revoke requested");
                    self.signals.request_revoke();
                }
                true
            }
            WatchEvent::Delete => {
                tokio::spawn(self.copy().deleted());
                false
            }
            WatchEvent::Lost => {
                tokio::spawn(self.copy().rewatch(Duration::from_millis(100)));
                false
            }
            WatchEvent::Refused => {
                // No watch on our key any more: re-read it and watch again,
                // later than after a compaction (the next create may be
                // refused as well).
                tokio::spawn(self.copy().rewatch(Duration::from_secs(1)));
                false
            }
        }
    }

    fn closed(&self) -> bool {
        self.signals.is_finished()
    }
}

#[cfg(test)]
mod tests {
    use super::Seen;

    #[test]
    fn a_put_that_keeps_the_value_is_a_revoke_request_and_a_change_is_not() {
        let mut seen = Seen {
            value: b"v0".to_vec(),
            rev: 10,
        };
        assert!(!seen.revoked_by(b"v1", 11), "a proclaim");
        assert!(seen.revoked_by(b"v1", 12), "a revoke request");
        assert!(!seen.revoked_by(b"v1", 12), "the same event again");
        assert!(!seen.revoked_by(b"v0", 13), "a proclaim back");
        // A read after a gap: the value and revision as they are now.
        assert!(!seen.revoked_by(b"v0", 13), "nothing since");
        assert!(seen.revoked_by(b"v0", 20), "kept value, later write");
        assert!(!seen.revoked_by(b"v2", 25), "a changed value is a proclaim");
        assert_eq!((seen.value.as_slice(), seen.rev), (&b"v2"[..], 25));
    }
}
