//! The result row of a scenario, and the chaos settings from the
//! environment.

use std::io::Write as _;
use std::time::Duration;

/// What one scenario run did and found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Row {
    /// The store (`mem`, `etcd`, ...).
    pub backend: String,
    /// The scenario.
    pub scenario: String,
    /// Lock acquisitions completed.
    pub cycles: u64,
    /// Faults injected (link mode changes, kills, breaks, cancellations).
    pub faults: u64,
    /// Pairs of holders that both believed they held the lock at once.
    pub overlaps: usize,
    /// Writes the fenced register rejected as stale.
    pub stale_rejected: usize,
    /// Accepted writes made after a newer holder was confirmed.
    pub stale_accepted: usize,
    /// Longest time from a fault to the holder's loss signal.
    pub max_loss_delay: Option<Duration>,
    /// Entries and sessions of ours left on the store at the end.
    pub leaked: usize,
    /// Other scenario-specific violations (duplicate entries, a waiter
    /// granted while cut off, ...); see `notes`.
    pub violations: usize,
    /// Scenario-specific findings (empty when all is well).
    pub notes: String,
}

impl Row {
    /// A row for `scenario` on `backend`, all counters zero.
    pub fn new(backend: &str, scenario: &str) -> Row {
        Row {
            backend: backend.to_string(),
            scenario: scenario.to_string(),
            ..Row::default()
        }
    }

    /// Keeps the longest loss-detection delay.
    pub fn loss_delay(&mut self, d: Duration) {
        self.max_loss_delay = Some(self.max_loss_delay.map_or(d, |m| m.max(d)));
    }

    /// Counts a scenario-specific violation and says what it was.
    pub fn violation(&mut self, s: impl AsRef<str>) {
        self.violations += 1;
        self.note(s);
    }

    /// Adds a note.
    pub fn note(&mut self, s: impl AsRef<str>) {
        const MAX: usize = 400;
        if !self.notes.is_empty() {
            self.notes.push_str("; ");
        }
        let s = s.as_ref();
        match s.char_indices().nth(MAX) {
            Some((cut, _)) => {
                self.notes.push_str(&s[..cut]);
                self.notes.push_str("...");
            }
            None => self.notes.push_str(s),
        }
    }

    /// Header of [`tsv`](Self::tsv).
    pub const HEADER: &'static str =
        "backend\tscenario\tcycles\tfaults\toverlaps\tstale_rejected\tstale_accepted\tmax_loss_ms\tleaked\tresult\tnotes";

    /// Whether the safety properties held.
    pub fn safe(&self) -> bool {
        self.overlaps == 0 && self.stale_accepted == 0 && self.leaked == 0 && self.violations == 0
    }

    /// One tab-separated line (no newline).
    pub fn tsv(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            self.backend,
            self.scenario,
            self.cycles,
            self.faults,
            self.overlaps,
            self.stale_rejected,
            self.stale_accepted,
            self.max_loss_delay
                .map_or("-".to_string(), |d| d.as_millis().to_string()),
            self.leaked,
            if self.safe() { "ok" } else { "FAIL" },
            self.notes.replace(['\t', '\n'], " "),
        )
    }

    /// Appends the row to `$QUORUMLOCK_CHAOS_RESULTS` if set, and prints it.
    /// A mutant's row ([`FaultTarget::as_mutant`]) is only printed: its
    /// violation is what its test asserts.
    ///
    /// [`FaultTarget::as_mutant`]: super::FaultTarget::as_mutant
    pub fn record(&self) {
        eprintln!("fault row: {}", self.tsv());
        if self.backend.ends_with(super::MUTANT_SUFFIX) {
            return;
        }
        let Some(path) = std::env::var_os("QUORUMLOCK_CHAOS_RESULTS") else {
            return;
        };
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("opening {path:?}: {e}"));
        writeln!(f, "{}", self.tsv()).expect("appending a result row");
    }

    /// Records the row, then asserts zero overlaps, zero stale writes
    /// accepted and zero leaked entries.
    pub fn finish(self) -> Row {
        self.record();
        assert_eq!(
            self.overlaps, 0,
            "{}: two holders believed they held the lock at once: {}",
            self.scenario, self.notes
        );
        assert_eq!(
            self.stale_accepted, 0,
            "{}: stale writes accepted: {}",
            self.scenario, self.notes
        );
        assert_eq!(
            self.leaked, 0,
            "{}: entries or sessions leaked: {}",
            self.scenario, self.notes
        );
        assert_eq!(self.violations, 0, "{}: {}", self.scenario, self.notes);
        self
    }
}

/// How long each scenario repeats its rounds: `QUORUMLOCK_CHAOS_SECONDS`
/// (unset or 0: a single round).
pub fn chaos_budget() -> Duration {
    std::env::var("QUORUMLOCK_CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .map_or(Duration::ZERO, Duration::from_secs_f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tsv_and_safety() {
        let mut r = Row::new("mem", "x");
        r.cycles = 3;
        r.loss_delay(Duration::from_millis(40));
        r.loss_delay(Duration::from_millis(10));
        assert_eq!(r.max_loss_delay, Some(Duration::from_millis(40)));
        assert!(r.safe());
        assert_eq!(r.tsv(), "mem\tx\t3\t0\t0\t0\t0\t40\t0\tok\t");
        assert_eq!(r.tsv().split('\t').count(), Row::HEADER.split('\t').count());
        r.leaked = 1;
        r.note("a\tb");
        assert!(!r.safe());
        assert!(r.tsv().ends_with("FAIL\ta b"));
    }
}
