//! What a mem backend and its sessions share: the store, the request
//! counter, the keepalive switch, the keys of the namespace, and the
//! sessions this backend opened.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use tokio::sync::watch::Receiver;
use tokio::time::Instant;

use super::config::MemConfig;
use super::store::{self, MemStore};
use crate::backend::ChangeFeed;
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

    /// [`crate::backend::Backend::changes`]: the store's change counter
    /// of the lock; it also touches the store when a session owning one
    /// of its entries is due to expire, so the expiry is seen then.
    pub(super) fn changes(&self, name: &LockName) -> ChangeFeed {
        let store = self.store.clone();
        let key = self.key(name);
        futures::stream::unfold(
            (store, key, None),
            |(store, key, rx): (Arc<MemStore>, String, Option<Receiver<u64>>)| async move {
                let Some(mut rx) = rx else {
                    let rx = store.state().follow(&key);
                    return Some((Ok(()), (store, key, Some(rx))));
                };
                loop {
                    let due = store.state().next_expiry(&key);
                    tokio::select! {
                        changed = rx.changed() => {
                            changed.ok()?;
                            return Some((Ok(()), (store, key, Some(rx))));
                        }
                        _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                            drop(store.state());
                        }
                    }
                }
            },
        )
        .boxed()
    }

    /// The store key of a lock: namespace and name.
    pub(super) fn key(&self, name: &LockName) -> String {
        self.config.namespace.lock_key(name)
    }
}
