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
mod queue;
mod session;

pub use backend::PostgresBackend;
pub use config::{
    PostgresConfig, SslMode, DEFAULT_PORT, DEFAULT_SCHEMA, DEFAULT_TIMEOUT, DEFAULT_TTL, MAX_TTL,
    MIN_TTL,
};
pub use fenced::check_held;
/// The client crate of [`check_held`]'s transaction and of
/// [`PostgresBackend::from_client`]'s configuration, re-exported: no second
/// dependency at the same version needed.
pub use tokio_postgres;

/// URL schemes this backend serves: `postgres` and `postgresql`.
pub const SCHEMES: &[&str] = quorumlock_core::backend::schemes::POSTGRES;
