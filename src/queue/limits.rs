//! The bounds of one queue function call and the names of the functions,
//! for what checks the proxy from outside (the integration tests watch
//! `MONITOR` for the calls a large request becomes).

pub use super::commands::{IDS_PER_CALL, PUSH_PER_CALL, REDRIVE_PER_CALL};
pub use super::library::keys::{CALL_KEYS, DEAD_HISTORY};
pub use super::pop::{POP_BATCH, SOURCES_PER_CALL};
pub use super::rules::RULE_ARGS;

/// The library's functions, whose names (`.name()`) an `FCALL` carries.
pub mod library {
    pub use crate::queue::library::{ACK, NACK, POP, POP1, PUSH, REDRIVE};
}
