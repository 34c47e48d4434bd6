//! The one retry backoff of the workspace: exponential with jitter (so
//! that clients that lost the store together do not retry in step), by
//! `backon`.

use std::time::Duration;

use backon::BackoffBuilder;

/// Exponential backoff from `min` to `max`, with jitter, without end;
/// [`reset`](Backoff::reset) after a success.
#[derive(Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    steps: backon::ExponentialBackoff,
}

impl Backoff {
    /// Delays from `min`, doubling, up to `max`, each with jitter.
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max,
            steps: Self::steps(min, max),
        }
    }

    fn steps(min: Duration, max: Duration) -> backon::ExponentialBackoff {
        backon::ExponentialBuilder::default()
            .with_min_delay(min)
            .with_max_delay(max)
            .with_jitter()
            .without_max_times()
            .build()
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        self.steps.next().unwrap_or(self.max)
    }

    /// Sleeps the next delay.
    ///
    /// # Cancel safety
    /// Dropping it only skips that delay.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_delay()).await;
    }

    /// Starts again from the shortest delay (after a success).
    pub fn reset(&mut self) {
        self.steps = Self::steps(self.min, self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_its_bound_with_jitter_and_resets() {
        let (min, max) = (Duration::from_millis(20), Duration::from_millis(500));
        let mut b = Backoff::new(min, max);
        let delays: Vec<Duration> = (0..12).map(|_| b.next_delay()).collect();
        assert!(
            delays.iter().all(|d| *d >= min && *d <= max * 2),
            "{delays:?}"
        );
        assert!(delays[8] >= max / 2, "{delays:?}");
        b.reset();
        assert!(b.next_delay() <= min * 2);
    }
}
