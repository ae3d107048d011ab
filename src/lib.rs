//! ackproxy: a Redis-protocol proxy that gives plain Redis lists
//! at-least-once delivery.
//!
//! Request path: [`server`] accepts a client → [`session`] reads and frames
//! its requests ([`resp`]) → [`command`] classifies each one → passthrough, or
//! [`queue`] interception → [`upstream`] → the reply goes back in order.

pub mod app;
pub mod auth;
mod clients;
pub mod cluster;
pub mod command;
pub mod config;
pub mod embedded;
pub mod error;
mod glob;
mod keyslot;
pub mod net;
mod ops;
mod output;
pub mod queue;
pub mod resp;
mod server;
mod session;
mod telemetry;
pub mod timeout;
pub mod upstream;
