#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub mod backend;
mod client;
mod error;
mod fenced;
mod inflight;
pub mod mem;
mod multi;
mod name;
mod rw;
mod scoped;
pub mod signal;
pub mod url;

pub use backend::{
    finish_on_drop, AcquireRequest, Acquired, Backend, Capabilities, Contender, DelayQueue,
    GrantMemory, LastGrant, LockKind, LockState, QuietGrants, StoreSession, HELD_WATCH_DELAY,
};
pub use client::{Lock, LockClient, LockGuard, Reentry};
pub use error::{Error, ErrorKind, Result};
pub use fenced::KeyWrite;
pub use multi::{MultiGuard, MultiLock};
pub use name::{LockName, MAX_NAME_LEN, MAX_SEGMENT_LEN, RESERVED_NESTED_SEGMENTS};
pub use rw::{RwLock, Semaphore};
pub use signal::{EntrySignals, LossReason, SessionLiveness};
