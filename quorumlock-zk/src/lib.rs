#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod admin;
mod backend;
mod config;
mod contender;
mod core;
mod error;
mod fenced;
mod layout;
mod monitor;
mod session;
mod tls;

pub use backend::ZkBackend;
pub use config::{ZkConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PORT, DEFAULT_SESSION_TIMEOUT};
pub use fenced::MAX_VALUE_LEN;

/// URL schemes this backend serves.
pub const SCHEMES: &[&str] = quorumlock_core::backend::schemes::ZK;
