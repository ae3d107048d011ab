//! Redis Cluster upstream: clients see one Redis, each request goes to the
//! node that serves it. The hash slot of a key ([`slot`]), the slot owners
//! as the cluster reports them ([`map`]) and kept fresh ([`topology`]), the
//! shared connections that route by slot and follow redirections
//! ([`router`]), and the requests that are not one node's ([`fanout`]).
//! Apart from these, [`announce`] shows a group of proxies to
//! cluster-aware clients as a cluster, whatever their upstream.

pub mod announce;
pub mod fanout;
pub mod map;
pub mod router;
pub mod slot;
pub mod topology;

pub use router::{Flavor, Shared};
pub use slot::{command_slot, key_slot, CommandSlot, SLOTS};
