//! Redis Cluster upstream: which node serves a request. The hash slot of a
//! key ([`slot`]), the slot owners as the cluster reports them ([`map`]),
//! and the MOVED and ASK redirections that correct them.

pub mod map;
pub mod slot;

pub use slot::{command_slot, key_slot, CommandSlot, SLOTS};
