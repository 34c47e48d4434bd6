//! Putting off the watch of a held entry: most holds are shorter than
//! [`HELD_WATCH_DELAY`], and cost no watch request then.

use std::time::Duration;

/// How long after a grant a backend may wait before it starts watching the
/// held entry (see the [`super::StoreSession`] contract). Most locks are held for
/// less: their cycle then costs the store's two writes and nothing more.
/// A forced break or revoke request in the first moments of a hold is
/// reported up to this much later; session expiry is not affected (the
/// local deadline does not depend on watches).
pub const HELD_WATCH_DELAY: Duration = Duration::from_millis(20);

/// Items that come due a fixed delay after they were pushed: one timer
/// (the front's due time) serves them all, since they come due in push
/// order. A backend's watch task keeps its not-yet-watched held entries
/// in one.
#[derive(Debug)]
pub struct DelayQueue<T> {
    delay: Duration,
    items: std::collections::VecDeque<(tokio::time::Instant, T)>,
}

impl<T> DelayQueue<T> {
    /// An empty queue whose items come due `delay` after their push.
    pub fn new(delay: Duration) -> Self {
        DelayQueue {
            delay,
            items: std::collections::VecDeque::new(),
        }
    }

    /// Adds `item`, due `delay` from now.
    pub fn push(&mut self, item: T) {
        let due = tokio::time::Instant::now() + self.delay;
        self.items.push_back((due, item));
    }

    /// When the next item comes due; `None` if the queue is empty.
    pub fn next_due(&self) -> Option<tokio::time::Instant> {
        self.items.front().map(|(due, _)| *due)
    }

    /// Takes the next item if it is due by now.
    pub fn pop_due(&mut self) -> Option<T> {
        let now = tokio::time::Instant::now();
        match self.items.front() {
            Some((due, _)) if *due <= now => self.items.pop_front().map(|(_, item)| item),
            _ => None,
        }
    }

    /// Whether no item waits.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn delay_queue_gives_items_in_order_once_due() {
        let mut q = DelayQueue::new(Duration::from_millis(20));
        assert_eq!(q.next_due(), None);
        q.push(1);
        tokio::time::advance(Duration::from_millis(5)).await;
        q.push(2);
        assert_eq!(q.pop_due(), None, "nothing is due before its delay");
        let first = q.next_due().unwrap();
        tokio::time::sleep_until(first).await;
        assert_eq!(q.pop_due(), Some(1));
        assert_eq!(q.pop_due(), None, "the second is due 5 ms later");
        tokio::time::advance(Duration::from_millis(5)).await;
        assert_eq!(q.pop_due(), Some(2));
        assert!(q.is_empty());
    }
}
