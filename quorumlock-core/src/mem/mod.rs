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
//!
//! # Code layout
//!
//! The backend template of every store crate (`docs/backend-template.md`
//! in the repository), inside this crate.
//!
//! ## Files
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | the exports: `MemBackend`, `MemConfig`, `SCHEMES` (a store crate's `lib.rs`) |
//! | `backend.rs` | `MemBackend`: `connect(url)`, `from_config(config)`, and `impl Backend`, each method a delegation |
//! | `admin.rs` | inspect, list, break, revoke, kill a session, leftovers, on `MemCore` |
//! | `session.rs` | `MemSession`: acquire, release, abandon, close |
//! | `fenced.rs` | fenced writes and plain key reads and writes |
//! | `monitor.rs` | the session's keepalive (held entries need no watch: the store signals their loss itself) |
//! | `core.rs` | `MemCore`: the configuration, the store, the request counter, the keepalive switch, the sessions this backend opened |
//! | `store.rs` | the store itself (this backend's extra file): sessions with deadlines, queues, the token counter, the key-value map, shared by every client that names the store |
//! | `config.rs` | `MemConfig`: the URL |
//!
//! No `layout.rs` (a lock's key is the namespace's [`Namespace::lock_key`](crate::backend::Namespace::lock_key),
//! nothing else is named on the store) and no `error.rs` (nothing to map:
//! the store's answers are this crate's errors); no `from_client` (no
//! client crate).
//!
//! ## State
//!
//! `MemCore` is the backend-wide state, shared by the backend and every
//! session it opened (through an `Arc`). A session's own state is
//! `MemSession` itself (its id and the keepalive's stop switch): no task
//! other than its keepalive shares it, so there is no `SessionState`.
//!
//! ## Import order
//!
//! `backend.rs` -> {`admin.rs`, `session.rs`, `fenced.rs`} -> `monitor.rs`
//! -> `core.rs` -> {`store.rs`, `config.rs`}.

mod admin;
mod backend;
mod config;
mod core;
mod fenced;
mod monitor;
mod session;
mod store;

pub use backend::MemBackend;
pub use config::MemConfig;

/// URL schemes this backend serves.
pub const SCHEMES: &[&str] = crate::backend::schemes::MEM;
