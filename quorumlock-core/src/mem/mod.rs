//! The in-memory backend, `mem://[store][/namespace][?ttl=10s]`.
//!
//! Complete semantics in one process: sessions with a TTL that can be
//! expired on demand ([`Backend::kill_session`](crate::backend::Backend::kill_session)),
//! fencing tokens from one counter per store, FIFO queues, herd-free
//! wake-up (a release wakes the new head only), cooperative revoke and
//! forced break. Clients that name the same store (the URL host; empty
//! means `default`) share it. It is the zero-setup default, the reference
//! model of the conformance suite, and a test double for code that uses
//! locks.

mod backend;
mod config;
mod core;
mod session;
mod store;

pub use backend::MemBackend;
pub use config::MemConfig;

/// URL schemes this backend serves.
pub const SCHEMES: &[&str] = crate::backend::schemes::MEM;
