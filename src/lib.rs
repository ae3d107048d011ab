//! ackproxy: a Redis-protocol proxy that gives plain Redis lists
//! at-least-once delivery.
//!
//! Request path: [`server`] accepts a client → [`session`] reads and frames
//! its requests ([`resp`]) → [`command`] classifies each one → passthrough, or
//! [`queue`] interception → [`upstream`] → the reply goes back in order.

pub mod app;
pub mod auth;
pub mod cluster;
pub mod command;
pub mod config;
pub mod embedded;
pub mod error;
pub mod glob;
pub mod keyslot;
pub mod net;
pub mod ops;
pub mod output;
pub mod queue;
pub mod resp;
pub mod server;
pub mod session;
pub mod telemetry;
pub mod timeout;
pub mod upstream;
