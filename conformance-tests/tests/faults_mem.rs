//! The fault scenarios against the in-memory backend (simulated links),
//! with a 1 s session TTL so that each runs in a few seconds.

use conformance_tests::faults::FaultTarget;

fn target() -> Option<FaultTarget> {
    Some(FaultTarget::mem("mem://faults?ttl=1s"))
}

conformance_tests::fault_suite!(target());
