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
mod session;
mod watch;

/// The `etcd-client` crate [`EtcdBackend::from_client`] takes a client
/// of: build it as `quorumlock_etcd::etcd_client::Client::connect(..)`,
/// at the version this crate uses, with no dependency of your own.
pub use etcd_client;

pub use backend::EtcdBackend;
pub use config::{EtcdConfig, DEFAULT_PORT, DEFAULT_TIMEOUT, DEFAULT_TTL, MAX_TTL, MIN_TTL};

/// URL schemes this backend serves: `etcd` (plain) and `etcds` (TLS).
pub const SCHEMES: &[&str] = quorumlock_core::backend::schemes::ETCD;
