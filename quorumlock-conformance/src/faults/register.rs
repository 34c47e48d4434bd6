//! A fenced resource: a register that accepts a write only with a fencing
//! token at least as high as the highest it has seen.

use std::sync::Mutex;

use tokio::time::Instant;

/// One write attempt on a [`FencedRegister`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// Who wrote (a holder label).
    pub holder: String,
    /// The fencing token the writer presented.
    pub token: u64,
    /// When the write reached the register.
    pub at: Instant,
    /// Whether the register accepted it.
    pub accepted: bool,
}

/// A register guarded by fencing tokens, as a storage service that checks
/// them would be: a write carrying a token below the highest token seen
/// is rejected. Every attempt is recorded, in arrival order.
///
/// By construction it never accepts a token below one it has seen; what
/// it cannot know is whether a newer holder exists that has not written
/// yet. [`History::stale_accepted`](super::History::stale_accepted) checks
/// that against the lock history.
#[derive(Debug, Default)]
pub struct FencedRegister {
    inner: Mutex<RegInner>,
}

#[derive(Debug, Default)]
struct RegInner {
    highest: u64,
    value: Option<(u64, String)>,
    log: Vec<Write>,
}

/// A write refused because a higher token was seen first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleToken {
    /// The token presented.
    pub token: u64,
    /// The highest token seen when it arrived.
    pub highest: u64,
}

impl std::fmt::Display for StaleToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stale token {} (highest seen {})",
            self.token, self.highest
        )
    }
}

impl std::error::Error for StaleToken {}

impl FencedRegister {
    /// An empty register.
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes `holder` as the value if `token` is at least the highest
    /// token seen so far.
    pub fn write(&self, holder: &str, token: u64) -> Result<(), StaleToken> {
        let mut r = self.inner.lock().expect("register poisoned");
        let at = Instant::now();
        let accepted = token >= r.highest;
        r.log.push(Write {
            holder: holder.to_string(),
            token,
            at,
            accepted,
        });
        if accepted {
            r.highest = token;
            r.value = Some((token, holder.to_string()));
            Ok(())
        } else {
            Err(StaleToken {
                token,
                highest: r.highest,
            })
        }
    }

    /// The current value: the last accepted token and writer.
    pub fn value(&self) -> Option<(u64, String)> {
        self.inner.lock().expect("register poisoned").value.clone()
    }

    /// Every write attempt, in arrival order.
    pub fn log(&self) -> Vec<Write> {
        self.inner.lock().expect("register poisoned").log.clone()
    }

    /// Writes accepted.
    pub fn accepted(&self) -> usize {
        self.log().iter().filter(|w| w.accepted).count()
    }

    /// Stale writes rejected.
    pub fn rejected(&self) -> usize {
        self.log().iter().filter(|w| !w.accepted).count()
    }

    /// Rejected writes of one holder.
    pub fn rejected_of(&self, holder: &str) -> usize {
        self.log()
            .iter()
            .filter(|w| !w.accepted && w.holder == holder)
            .count()
    }

    /// Accepted writes whose token is below a token accepted earlier: the
    /// register's own invariant, zero unless the register is broken.
    pub fn regressions(&self) -> usize {
        let mut highest = 0;
        let mut bad = 0;
        for w in self.log().iter().filter(|w| w.accepted) {
            if w.token < highest {
                bad += 1;
            }
            highest = highest.max(w.token);
        }
        bad
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_equal_and_higher_rejects_lower() {
        let r = FencedRegister::new();
        assert!(r.write("a", 5).is_ok());
        assert!(r.write("a", 5).is_ok(), "the same holder writes again");
        assert!(r.write("b", 7).is_ok());
        let e = r.write("a", 5).unwrap_err();
        assert_eq!(
            e,
            StaleToken {
                token: 5,
                highest: 7
            }
        );
        assert!(r.write("a", 6).is_err(), "between the two is still stale");
        assert_eq!(r.value(), Some((7, "b".to_string())));
        assert_eq!((r.accepted(), r.rejected()), (3, 2));
        assert_eq!(r.rejected_of("a"), 2);
        assert_eq!(r.rejected_of("b"), 0);
        assert_eq!(r.regressions(), 0);
        let log = r.log();
        assert_eq!(log.len(), 5);
        assert!(log.windows(2).all(|w| w[0].at <= w[1].at));
        assert_eq!(
            log.iter().map(|w| w.accepted).collect::<Vec<_>>(),
            [true, true, true, false, false]
        );
    }
}
