#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod availability;
pub mod backend;
mod client;
mod election;
mod error;
mod fenced;
mod inflight;
pub mod mem;
mod multi;
mod name;
mod queue;
mod rw;
mod scoped;
mod signal;
mod telemetry;
pub mod tls;
pub mod url;
mod watch;

pub use availability::{default_value, ClientOptions, DEFAULT_UNAVAILABLE_AFTER};
pub use client::{Lock, LockClient, LockGuard, Reentry, Upgraded};
pub use election::{Election, Leader, LeaderGuard};
pub use error::{Error, ErrorKind, Result};
pub use multi::{MultiGuard, MultiLock};
pub use name::{LockName, MAX_NAME_LEN, MAX_SEGMENT_LEN, RESERVED_NESTED_SEGMENTS};
pub use queue::{Contender, LockKind, LockState};
pub use rw::{RwLock, Semaphore};
pub use signal::LossReason;
pub use watch::{Follow, DEFAULT_POLL_INTERVAL, MIN_POLL_INTERVAL};
