//! Configuration: a TOML file, overridden by command-line flags, which clap
//! also reads from `ACKPROXY_*` environment variables.
//!
//! `settings.rs` holds what a configuration is and its defaults, `rule.rs`
//! a queue rule, `duration.rs` how durations are written, `cli.rs` the
//! command line, `load.rs` how file, flags and environment combine,
//! `parse_error.rs` what a file that does not deserialize is told,
//! `check.rs` what is refused or warned of (and where it was written),
//! `summary.rs` what `--check-config` prints.

mod check;
mod cli;
mod duration;
mod load;
mod parse_error;
mod rule;
mod settings;
mod summary;
#[cfg(test)]
mod tests;

pub use cli::{Cli, Generate, GenerateWhat};
pub use rule::*;
pub use settings::*;
