//! After a quiet cycle, a repeat fast acquire of a mutex this session last
//! held alone leaves out its read: the cycle costs what the floor costs.
//! These tests show, on a real server, that it is used only then (a write
//! anywhere in between costs one request, a busy cluster none); and they
//! run the conformance cases that put someone else in line between our
//! cycles one at a time, so that the read is really left out: it never
//! grants then.
//!
//! Needs `QUORUMLOCK_TEST_CONSUL_URL`.

use std::sync::Arc;

use quorumlock_conformance::repeat::{reads_only_after_quiet_cycles, serially};
use quorumlock_conformance::Harness;

/// A harness whose clients use a one-hour session TTL, so that renewals
/// (one per TTL/2) do not fall inside the measured window.
fn harness() -> Option<Harness> {
    Harness::from_env("QUORUMLOCK_TEST_CONSUL_URL", |url| async move {
        Ok(Arc::new(quorumlock_consul::ConsulBackend::connect(&url).await?) as _)
    })
    .map(|h| h.with_option("ttl", "1h"))
}

/// A repeat acquire skips its read only while nothing else was written
/// since our last grant (its `.lock` lands two raft indexes after it), and
/// only after a cycle that found the cluster that quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeat_acquire_reads_only_after_other_writes() {
    let Some(h) = harness() else { return };
    serially(reads_only_after_quiet_cycles(&h)).await;
}

quorumlock_conformance::quiet_repeat_suite!(harness());
