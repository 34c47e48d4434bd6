#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod admin;
mod backend;
mod config;
mod core;
mod error;
mod fenced;
mod layout;
mod monitor;
mod session;
mod watch;

pub use backend::EtcdBackend;
pub use config::{EtcdConfig, DEFAULT_PORT, DEFAULT_TIMEOUT, DEFAULT_TTL, MAX_TTL, MIN_TTL};

/// URL schemes this backend serves: `etcd` (plain) and `etcds` (TLS).
pub const SCHEMES: &[&str] = quorumlock_core::backend::schemes::ETCD;
