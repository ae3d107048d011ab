//! The integration suite, one binary: each module is one area of behaviour,
//! tested against real redis-server processes (see `common`). One binary
//! links the crate once instead of once per file.

mod bad_input;
mod blocking;
mod client_metadata;
mod client_table;
mod cluster;
mod cluster_harness;
mod cluster_keys;
mod common;
mod config_check;
mod control;
mod dashboard;
mod dedicated_pool;
mod differential;
mod fault;
mod frameworks;
mod function_view;
mod isolation;
mod logs;
mod long_jobs;
mod metrics;
mod node_clients;
mod ops;
mod packaging;
mod queue;
mod queue_bounds;
mod queue_lifecycle;
mod queue_model;
mod readme;
mod reload;
mod scanner_proptest;
mod security;
mod sentinel;
mod threads;
mod timeout_parse;
mod tls;
