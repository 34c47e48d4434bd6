#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod admin;
mod backend;
mod config;
mod core;
mod error;
mod fenced;
mod layout;
mod monitor;
mod scripts;
mod session;

/// The `redis` crate [`RedisBackend::from_client`] takes a client of:
/// build it as `quorumlock_redis::redis::Client::open(..)`, at the
/// version this crate uses, with no dependency of your own.
pub use redis;

pub use backend::RedisBackend;
pub use config::{RedisConfig, DEFAULT_PORT, DEFAULT_TIMEOUT, DEFAULT_TTL, MAX_TTL, MIN_TTL};

/// URL schemes this backend serves: `redis` (plain) and `rediss` (TLS).
pub const SCHEMES: &[&str] = quorumlock_core::backend::schemes::REDIS;
