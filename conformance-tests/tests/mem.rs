//! The whole suite against the in-memory backend, the reference model.

use std::sync::Arc;

use conformance_tests::Harness;
use lockcore::backend::Backend;
use lockcore::mem::MemBackend;

fn harness() -> Option<Harness> {
    let base = lockcore::url::parse("mem://conformance?ttl=2s").unwrap();
    Some(Harness::new("mem", base, |url| async move {
        Ok(Arc::new(MemBackend::connect(&url).await?) as Arc<dyn Backend>)
    }))
}

conformance_tests::suite!(harness());
