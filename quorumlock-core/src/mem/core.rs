//! What a mem backend and its sessions share: the store, the request
//! counter, the keepalive switch, the keys of the namespace, and the
//! sessions this backend opened.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::config::MemConfig;
use super::store::{self, MemStore};
use crate::LockName;

/// The backend-wide state of a [`super::MemBackend`], shared with its
/// sessions.
#[derive(Debug)]
pub(super) struct MemCore {
    pub(super) config: MemConfig,
    store: Arc<MemStore>,
    requests: AtomicU64,
    keepalive_paused: AtomicBool,
    /// Sessions opened by this backend, for `leftovers`.
    pub(super) opened: Mutex<Vec<u64>>,
}

impl MemCore {
    pub(super) fn new(config: MemConfig) -> Self {
        MemCore {
            store: store::store(&config.store),
            config,
            requests: AtomicU64::new(0),
            keepalive_paused: AtomicBool::new(false),
            opened: Mutex::new(Vec::new()),
        }
    }

    pub(super) fn pause_keepalive(&self, paused: bool) {
        self.keepalive_paused.store(paused, Ordering::Release);
    }

    pub(super) fn keepalive_paused(&self) -> bool {
        self.keepalive_paused.load(Ordering::Acquire)
    }

    pub(super) fn store(&self) -> &MemStore {
        &self.store
    }

    pub(super) fn count_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// The store key of a lock: namespace and name.
    pub(super) fn key(&self, name: &LockName) -> String {
        self.config.namespace.lock_key(name)
    }
}
