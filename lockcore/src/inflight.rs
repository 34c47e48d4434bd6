//! Store writes that must run to their end even if their caller is
//! dropped, and the writes of one acquire attempt still in flight.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
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
#[derive(Debug, Clone, Default)]
pub struct InFlightWrites(Arc<Counter>);

#[derive(Debug, Default)]
struct Counter {
    count: AtomicUsize,
    idle: Notify,
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
        self.0.count.fetch_add(1, Ordering::AcqRel);
        let ticket = Ticket(self.0.clone());
        finish_on_drop(async move {
            let r = write.await;
            drop(ticket);
            r
        })
        .await
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
    }
}
