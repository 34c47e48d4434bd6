//! Store writes that must run to their end even if their caller is
//! dropped, and the writes of one acquire attempt still in flight.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// Runs `fut` to its end even if the caller stops waiting: it is polled in
/// place, and if the returned future is dropped before `fut` is done, the
/// rest of `fut` runs on a spawned task. For a store write whose outcome
/// must be settled before anything else touches the same entry (a request
/// already sent may still be applied, and an abandon that overtakes it
/// would leave it behind), without paying a task per write.
///
/// # Cancel safety
/// That is its purpose: dropping the returned future never drops `fut`
/// midway (outside a runtime, where nothing can be spawned, it is dropped).
pub async fn finish_on_drop<F>(fut: F) -> F::Output
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    struct Finish<F: std::future::Future + Send + 'static>(Option<std::pin::Pin<Box<F>>>)
    where
        F::Output: Send + 'static;

    impl<F: std::future::Future + Send + 'static> Drop for Finish<F>
    where
        F::Output: Send + 'static,
    {
        fn drop(&mut self) {
            if let (Some(rest), Ok(rt)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
                rt.spawn(rest);
            }
        }
    }

    let mut running = Finish(Some(Box::pin(fut)));
    let out = std::future::poll_fn(|cx| {
        running
            .0
            .as_mut()
            .expect("not polled after its end")
            .as_mut()
            .poll(cx)
    })
    .await;
    running.0 = None;
    out
}

/// The store writes of one acquire attempt that are still in flight.
///
/// A write whose future is dropped may still be applied by the store, and
/// after a later request of ours: etcd serves the streams of one HTTP/2
/// connection concurrently, and a Consul request on a fresh connection can
/// overtake one on a connection that was dropped. An abandon that ran
/// first would leave the late write's entry behind, ownerless, in the
/// queue, where it blocks the lock until the session ends. So a backend
/// runs every write that creates an attempt's entry through
/// [`run`](Self::run), which finishes it in its own task whatever happens
/// to the caller, and the client layer waits for
/// [`settled`](Self::settled) before it abandons the attempt.
///
/// A request whose answer never comes (a dead link) keeps the abandon
/// waiting until the session's local deadline; the store then removes the
/// entry with the session.
///
/// A write can also end on our side without the store's answer (the
/// request's own timeout, or a transport error) and still be applied
/// later. [`run_judged`](Self::run_judged) records such an end: once
/// [`outcome_unknown`](Self::outcome_unknown) is true, the backend must
/// remove the attempt in a way that also stops a late copy of the write
/// from creating anything (e.g. a fence that every such write requires to
/// be absent).
#[derive(Debug, Clone, Default)]
pub struct InFlightWrites(Arc<Counter>);

#[derive(Debug, Default)]
struct Counter {
    count: AtomicUsize,
    idle: Notify,
    unknown: AtomicBool,
}

/// Counts one write down when its task ends, even by a panic.
struct Ticket(Arc<Counter>);

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl InFlightWrites {
    /// Runs `write` to its end ([`finish_on_drop`]) and returns its
    /// result.
    ///
    /// # Cancel safety
    /// Dropping the returned future does not stop the write; it is
    /// counted until it ends.
    pub async fn run<F>(&self, write: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.run_judged(write, |_| false).await
    }

    /// [`run`](Self::run), and if `unknown` says the write ended without
    /// the store's answer (it may still be applied), records that for
    /// [`outcome_unknown`](Self::outcome_unknown) before the write counts
    /// as ended.
    ///
    /// # Cancel safety
    /// As [`run`](Self::run): the judgement is made when the write ends,
    /// whether or not anyone still waits for it.
    pub async fn run_judged<F, J>(&self, write: F, unknown: J) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
        J: FnOnce(&F::Output) -> bool + Send + 'static,
    {
        self.0.count.fetch_add(1, Ordering::AcqRel);
        let ticket = Ticket(self.0.clone());
        finish_on_drop(async move {
            let r = write.await;
            if unknown(&r) {
                ticket.0.unknown.store(true, Ordering::Release);
            }
            drop(ticket);
            r
        })
        .await
    }

    /// Whether a write of the attempt ended without the store's answer
    /// (see [`run_judged`](Self::run_judged)): it may have been applied,
    /// or still be, after anything the attempt does next. Stays true.
    pub fn outcome_unknown(&self) -> bool {
        self.0.unknown.load(Ordering::Acquire)
    }

    /// How many writes are in flight.
    pub fn pending(&self) -> usize {
        self.0.count.load(Ordering::Acquire)
    }

    /// Resolves once no write is in flight.
    ///
    /// # Cancel safety
    /// Only waits; safe to drop.
    pub async fn settled(&self) {
        loop {
            let idle = self.0.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.pending() == 0 {
                return;
            }
            idle.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn finish_on_drop_runs_the_rest_after_the_caller_is_dropped() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let write = finish_on_drop(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            flag.store(true, Ordering::SeqCst);
            7
        });
        let cut = tokio::time::timeout(Duration::from_millis(10), write).await;
        assert!(cut.is_err(), "the caller gave up first");
        assert!(!done.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(done.load(Ordering::SeqCst), "the rest ran on its own");
        // Awaited to its end, it is just the future's output.
        assert_eq!(finish_on_drop(async { 7 }).await, 7);
    }

    #[tokio::test]
    async fn a_dropped_caller_does_not_stop_the_write() {
        let w = InFlightWrites::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let caller = tokio::spawn({
            let w = w.clone();
            async move {
                w.run(async move {
                    let _ = rx.await;
                })
                .await
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(w.pending(), 1);
        caller.abort();
        let _ = caller.await;
        // Still in flight after its caller is gone.
        assert_eq!(w.pending(), 1);
        let settled = tokio::spawn({
            let w = w.clone();
            async move { w.settled().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!settled.is_finished(), "settled before the write ended");
        tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), settled)
            .await
            .expect("settled after the write ended")
            .unwrap();
        assert_eq!(w.pending(), 0);
        assert!(!w.outcome_unknown());
    }

    #[tokio::test]
    async fn an_unanswered_write_is_recorded_before_it_counts_as_ended() {
        let w = InFlightWrites::default();
        assert_eq!(w.run_judged(async { 1 }, |r| *r != 1).await, 1);
        assert!(!w.outcome_unknown());
        let caller = tokio::spawn({
            let w = w.clone();
            async move {
                w.run_judged(
                    async {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Err::<(), ()>(())
                    },
                    |r| r.is_err(),
                )
                .await
            }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        caller.abort();
        let _ = caller.await;
        tokio::time::timeout(Duration::from_secs(5), w.settled())
            .await
            .unwrap();
        assert!(w.outcome_unknown(), "recorded although its caller was gone");
        w.run(async {}).await;
        assert!(w.outcome_unknown(), "stays recorded");
    }
}
