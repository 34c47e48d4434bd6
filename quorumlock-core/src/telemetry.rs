//! Metrics through the `metrics` facade (cargo feature `metrics`); without
//! the feature every function here is empty. Names and labels are
//! documented in the crate README ("Metrics").

use std::time::Duration;

use crate::{ErrorKind, LockKind, LossReason};

fn kind_label(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Exclusive => "mutex",
        LockKind::Read => "read",
        LockKind::Write => "write",
        LockKind::Upgradeable => "upgradeable",
        LockKind::Upgrade => "upgrade",
        LockKind::Semaphore { .. } => "semaphore",
        LockKind::Election => "election",
    }
}

fn reason_label(reason: LossReason) -> &'static str {
    match reason {
        LossReason::SessionExpired => "session_expired",
        LossReason::DeadlinePassed => "deadline_passed",
        LossReason::EntryDeleted => "entry_deleted",
        LossReason::ClientClosed => "client_closed",
        LossReason::SessionEnded => "session_ended",
        LossReason::HoldLimitReached => "hold_limit",
    }
}

/// An acquire call ended: `outcome` is `acquired` or the error kind.
pub(crate) fn acquire_ended(kind: LockKind, outcome: Result<(), ErrorKind>, took: Duration) {
    #[cfg(feature = "metrics")]
    {
        let outcome = match outcome {
            Ok(()) => "acquired",
            Err(k) => k.as_str(),
        };
        metrics::histogram!("quorumlock_acquire_seconds", "kind" => kind_label(kind), "outcome" => outcome)
            .record(took.as_secs_f64());
        if outcome == "acquired" {
            metrics::gauge!("quorumlock_holds", "kind" => kind_label(kind)).increment(1.0);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (kind_label(kind), outcome, took);
}

/// A hold ended (released or dropped), after `held`; `loss` if the lock
/// had been lost before.
pub(crate) fn hold_ended(kind: LockKind, held: Duration, loss: Option<LossReason>) {
    #[cfg(feature = "metrics")]
    {
        metrics::gauge!("quorumlock_holds", "kind" => kind_label(kind)).decrement(1.0);
        metrics::histogram!("quorumlock_hold_seconds", "kind" => kind_label(kind))
            .record(held.as_secs_f64());
        if let Some(reason) = loss {
            metrics::counter!("quorumlock_losses_total", "kind" => kind_label(kind), "reason" => reason_label(reason))
                .increment(1);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (kind_label(kind), held, loss.map(reason_label));
}

/// A call to the store session (`acquire`, `release`, `abandon`) ended.
pub(crate) fn store_call(op: &'static str, failed: Option<ErrorKind>) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("quorumlock_store_calls_total", "op" => op).increment(1);
        if let Some(k) = failed {
            metrics::counter!("quorumlock_store_failures_total", "op" => op, "kind" => k.as_str())
                .increment(1);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (op, failed);
}

/// A keepalive was confirmed `latency` after it was sent.
pub(crate) fn keepalive(latency: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("quorumlock_keepalive_seconds").record(latency.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = latency;
}
