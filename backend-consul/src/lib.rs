#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod api;
mod backend;
mod config;
mod error;
mod fenced;
mod semaphore;
mod session;

pub use backend::{
    ConsulBackend, FENCE_FLAGS, LOCK_FLAGS, QUEUE_FLAGS, READ_FLAGS, REVOKE_FLAGS, WRITE_FLAGS,
};
pub use config::{ConsulConfig, DEFAULT_LOCK_DELAY, DEFAULT_PORT, DEFAULT_TLS_PORT, DEFAULT_TTL};
pub use semaphore::SEMAPHORE_FLAGS;

/// URL schemes this backend serves: `consul` (HTTP) and `consuls` (HTTPS).
pub const SCHEMES: &[&str] = lockcore::backend::schemes::CONSUL;
