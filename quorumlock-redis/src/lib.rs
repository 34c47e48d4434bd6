#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backend;
mod config;
mod core;
mod error;
mod layout;
mod scripts;
mod session;

pub use backend::RedisBackend;
pub use config::{RedisConfig, DEFAULT_PORT, DEFAULT_TIMEOUT, DEFAULT_TTL, MAX_TTL, MIN_TTL};

/// URL schemes this backend serves: `redis` (plain) and `rediss` (TLS).
pub const SCHEMES: &[&str] = quorumlock_core::backend::schemes::REDIS;
