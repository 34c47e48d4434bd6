//! The whole suite against the in-memory backend, the reference model.

use std::sync::Arc;

use quorumlock_conformance::Harness;
use quorumlock_core::backend::Backend;
use quorumlock_core::mem::MemBackend;

fn harness() -> Option<Harness> {
    let base = quorumlock_core::url::parse("mem://conformance?ttl=2s").unwrap();
    Some(Harness::new("mem", base, |url| async move {
        Ok(Arc::new(MemBackend::connect(&url).await?) as Arc<dyn Backend>)
    }))
}

quorumlock_conformance::suite!(harness());
