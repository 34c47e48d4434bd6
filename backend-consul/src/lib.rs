#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod api;
mod backend;
mod config;
mod error;
mod session;

pub use backend::{ConsulBackend, LOCK_FLAGS, QUEUE_FLAGS, REVOKE_FLAGS};
pub use config::{ConsulConfig, DEFAULT_LOCK_DELAY, DEFAULT_PORT, DEFAULT_TLS_PORT, DEFAULT_TTL};

/// URL schemes this backend serves: `consul` (HTTP) and `consuls` (HTTPS).
pub const SCHEMES: &[&str] = &["consul", "consuls"];
