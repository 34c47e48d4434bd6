//! Cancel safety: dropped acquires leave nothing behind.

use super::*;

/// Polls `fut` `polls` times, letting I/O progress between polls.
async fn poll_n<F: Future>(fut: std::pin::Pin<&mut F>, polls: usize) -> Option<F::Output> {
    let mut fut = fut;
    for _ in 0..polls {
        if let std::task::Poll::Ready(v) = futures::poll!(fut.as_mut()) {
            return Some(v);
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    None
}

/// Dropping a waiting acquire at any await point leaves no waiter.
pub async fn cancelled_acquire_at_each_await_point_leaves_nothing(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let (a, b) = (case.client().await, case.client().await);
    let g = acquire(f, &a, "cancel").await;
    let lock = handle(f, &b, "cancel");
    for polls in 0..10 {
        let mut fut = Box::pin(lock.acquire());
        assert!(
            poll_n(fut.as_mut(), polls).await.is_none(),
            "acquired a held lock"
        );
        drop(fut);
    }
    for i in 0..6u64 {
        let _ = tokio::time::timeout(Duration::from_millis(i * 7), lock.acquire()).await;
    }
    tokio::time::timeout(SOON, b.wait_idle())
        .await
        .expect("cleanup stuck");
    let state = a.inspect("cancel").await.unwrap();
    assert!(
        state.waiters.is_empty(),
        "cancelled acquires left waiters: {state:?}"
    );
    assert_eq!(state.holders.len(), 1);
    g.release().await.unwrap();
    // The local queue is not stuck either.
    let g = lock
        .try_acquire()
        .await
        .expect("lock free after cancellations");
    g.release().await.unwrap();
    case.finish().await;
}

/// Dropping an acquire of a free lock midway never leaves a phantom holder.
pub async fn cancelled_acquire_of_free_lock_leaves_no_holder(h: &Harness) {
    let case = h.case();
    let f = h.flavor();
    let (a, b) = (case.client().await, case.client().await);
    let lock = handle(f, &b, "phantom");
    for polls in 0..10 {
        let mut fut = Box::pin(lock.acquire());
        if let Some(r) = poll_n(fut.as_mut(), polls).await {
            drop(r.expect("acquire of a free lock"));
        }
        drop(fut);
        tokio::time::timeout(SOON, b.wait_idle())
            .await
            .expect("cleanup stuck");
        let state = a.inspect("phantom").await.unwrap();
        assert!(state.is_free(), "after {polls} polls: {state:?}");
    }
    let g = handle(f, &a, "phantom").try_acquire().await.expect("free");
    g.release().await.unwrap();
    case.finish().await;
}
