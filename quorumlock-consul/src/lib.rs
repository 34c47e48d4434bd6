#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod admin;
mod api;
mod backend;
mod config;
mod core;
mod error;
mod fenced;
mod layout;
mod monitor;
mod mutex;
mod rw;
mod semaphore;
mod session;

/// The `reqwest` crate [`ConsulBackend::from_client`] takes a client of:
/// build it as `quorumlock_consul::reqwest::Client::builder()`, at the
/// version this crate uses, with no dependency of your own, and with
/// `.redirect(reqwest::redirect::Policy::none())`: the default follows a
/// redirect to another host with the `X-Consul-Token` header.
pub use reqwest;

pub use backend::ConsulBackend;
pub use config::{ConsulConfig, DEFAULT_LOCK_DELAY, DEFAULT_PORT, DEFAULT_TLS_PORT, DEFAULT_TTL};
pub use layout::{
    FENCE_FLAGS, LOCK_FLAGS, QUEUE_FLAGS, READ_FLAGS, REVOKE_FLAGS, SEMAPHORE_FLAGS,
    UPGRADEABLE_FLAGS, UPGRADE_FLAGS, WRITE_FLAGS,
};

/// URL schemes this backend serves: `consul` (HTTP) and `consuls` (HTTPS).
pub const SCHEMES: &[&str] = quorumlock_core::backend::schemes::CONSUL;
