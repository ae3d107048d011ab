//! Test harness: real redis-server processes on free loopback ports, the
//! ackproxy binary in front of them, and a small blocking RESP client that
//! returns replies as raw bytes (for byte-for-byte comparison) or as values.
//!
//! By concern: `process` (ports, temporary files, child processes),
//! `redis`, `sentinel` and `cluster` (the servers), `proxy` (ackproxy),
//! `resp` (the client and its values), `pair` (the proxy beside a Redis,
//! reply for reply), `queue` (reading queue replies), `wait` (polling),
//! `http` (HTTP and the metrics endpoint), `rng`. Everything is re-exported
//! here, as `crate::common::X`.
#![allow(dead_code)]

mod cluster;
mod http;
mod pair;
mod process;
mod proxy;
mod queue;
mod redis;
mod resp;
mod rng;
mod sentinel;
mod wait;

pub use cluster::*;
pub use http::*;
pub use pair::*;
pub use process::{
    assert_success, free_port, python, redis_py_installed, rss_kb, stop_child, TempFile,
};
pub use proxy::*;
pub use queue::*;
pub use redis::*;
pub use resp::*;
pub use rng::*;
pub use sentinel::*;
pub use wait::*;
