#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backend;
mod config;
mod core;
mod error;
mod fenced;
mod layout;
mod monitor;
mod session;
mod tls;

pub use backend::ZkBackend;
pub use config::{ZkConfig, DEFAULT_PORT};

/// URL schemes this backend serves.
pub const SCHEMES: &[&str] = lockcore::backend::schemes::ZK;
