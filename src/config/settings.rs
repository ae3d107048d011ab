//! What a configuration is, and its defaults.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::duration;
use super::rule::QueueRule;
use crate::resp::Limits;

/// How the proxy finds the Redis it forwards to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum, Default)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamMode {
    /// The one address `upstream` (or the private redis-server).
    #[default]
    Direct,
    /// The primary the sentinels name for `sentinel_master`, followed
    /// across failovers.
    Sentinel,
    /// A Redis Cluster: `upstream` names one or more of its nodes
    /// (comma-separated), from which the proxy learns the rest.
    Cluster,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Human,
    Json,
}

/// Whether TLS clients must present a certificate, as Redis's
/// `tls-auth-clients`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum, Default)]
#[serde(rename_all = "lowercase")]
pub enum AuthClients {
    /// A certificate signed by the CA is required.
    #[default]
    Yes,
    /// None is asked for.
    No,
    /// None is required, but one that is presented must be signed by the CA.
    Optional,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Plain-text listener; empty: none (TLS only).
    pub listen: String,
    pub tls_listen: Option<String>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub tls_ca_cert_file: Option<PathBuf>,
    pub tls_auth_clients: AuthClients,
    pub upstream: Option<String>,
    pub upstream_password: Option<String>,
    pub upstream_user: Option<String>,
    pub upstream_tls: bool,
    pub upstream_tls_ca_cert_file: Option<PathBuf>,
    pub upstream_tls_cert_file: Option<PathBuf>,
    pub upstream_tls_key_file: Option<PathBuf>,
    pub upstream_tls_server_name: Option<String>,
    pub upstream_mode: UpstreamMode,
    /// With `upstream_mode = "sentinel"`: the master name the sentinels
    /// monitor, and where they are.
    pub sentinel_master: Option<String>,
    pub sentinels: Vec<String>,
    /// The proxies a cluster-aware client is shown (see the flag).
    pub cluster_announce: Vec<String>,
    /// The sentinels' own login and TLS, apart from the data nodes'.
    pub sentinel_user: Option<String>,
    pub sentinel_password: Option<String>,
    pub sentinel_tls: bool,
    pub sentinel_tls_ca_cert_file: Option<PathBuf>,
    pub sentinel_tls_cert_file: Option<PathBuf>,
    pub sentinel_tls_key_file: Option<PathBuf>,
    pub sentinel_tls_server_name: Option<String>,
    pub shared_connections: usize,
    /// Shared connection pairs of logged-in users kept at most.
    pub user_connections_max: usize,
    /// Ready connections kept for clients' own, per login.
    pub dedicated_pool: usize,
    /// The password of the `default` user as clients of the proxy see it,
    /// for a Redis that needs no login (empty: none, as in Redis).
    pub requirepass: Option<String>,
    pub dedicated_per_client: bool,
    pub threads: Option<usize>,
    /// The operations server's address: `/metrics`, the web view, the API.
    pub metrics: Option<String>,
    /// The operations server may listen on a non-loopback address.
    pub ops_public: bool,
    /// Names a request's `Host` may carry besides IP addresses and
    /// `localhost`. Empty: on a loopback address none, on a public one any.
    pub ops_allowed_hosts: Vec<String>,
    /// Connections the operations server serves at once; past it new ones
    /// are closed as soon as they are accepted.
    pub ops_max_connections: usize,
    /// Bearer token of the operations actions (REDRIVE, PURGE); none: off.
    pub admin_token: Option<String>,
    pub log_format: LogFormat,
    /// How long a request waits for a connection to a down upstream before
    /// it gets an error reply.
    #[serde(deserialize_with = "duration::millis")]
    pub connect_timeout_ms: u64,
    pub limits: LimitsConfig,
    pub embedded: EmbeddedConfig,
    pub reaper: ReaperConfig,
    #[serde(rename = "queue")]
    pub queues: Vec<QueueRule>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:6380".into(),
            tls_listen: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_ca_cert_file: None,
            tls_auth_clients: AuthClients::Yes,
            upstream: None,
            upstream_password: None,
            upstream_user: None,
            upstream_tls: false,
            upstream_tls_ca_cert_file: None,
            upstream_tls_cert_file: None,
            upstream_tls_key_file: None,
            upstream_tls_server_name: None,
            upstream_mode: UpstreamMode::Direct,
            sentinel_master: None,
            sentinels: Vec::new(),
            cluster_announce: Vec::new(),
            sentinel_user: None,
            sentinel_password: None,
            sentinel_tls: false,
            sentinel_tls_ca_cert_file: None,
            sentinel_tls_cert_file: None,
            sentinel_tls_key_file: None,
            sentinel_tls_server_name: None,
            shared_connections: 1,
            user_connections_max: 64,
            dedicated_pool: 2,
            requirepass: None,
            dedicated_per_client: false,
            threads: None,
            metrics: None,
            ops_public: false,
            ops_allowed_hosts: Vec::new(),
            ops_max_connections: 64,
            admin_token: None,
            log_format: LogFormat::Human,
            connect_timeout_ms: 1000,
            limits: LimitsConfig::default(),
            embedded: EmbeddedConfig::default(),
            reaper: ReaperConfig::default(),
            queues: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub max_bulk_len: usize,
    pub max_array_len: usize,
    pub max_inline_len: usize,
    pub maxclients: usize,
    /// Bytes of replies queued for one client before it is disconnected
    /// (0 = no limit).
    pub client_output_buffer_limit: usize,
    /// Requests of one client in flight before the proxy stops reading more.
    pub max_inflight_per_client: usize,
    /// Seconds a client may stay idle before it is closed (0 = never).
    #[serde(deserialize_with = "duration::secs")]
    pub idle_timeout_secs: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let l = Limits::default();
        LimitsConfig {
            max_bulk_len: l.max_bulk_len,
            max_array_len: l.max_array_len,
            max_inline_len: l.max_inline_len,
            maxclients: 10_000,
            client_output_buffer_limit: 256 * 1024 * 1024,
            max_inflight_per_client: 4096,
            idle_timeout_secs: 0,
        }
    }
}

/// The names of the fields that differ between two values of a struct.
macro_rules! differing {
    ($a:expr, $b:expr; $($field:ident),+ $(,)?) => {{
        let mut names: Vec<&'static str> = Vec::new();
        $(
            if $a.$field != $b.$field {
                names.push(stringify!($field));
            }
        )+
        names
    }};
}

impl LimitsConfig {
    /// The limits `next` sets differently.
    pub fn changes(&self, next: &LimitsConfig) -> Vec<&'static str> {
        differing!(self, next;
            max_bulk_len, max_array_len, max_inline_len, maxclients,
            client_output_buffer_limit, max_inflight_per_client, idle_timeout_secs)
    }

    pub fn scanner_limits(&self) -> Limits {
        Limits {
            max_bulk_len: self.max_bulk_len,
            max_array_len: self.max_array_len,
            max_inline_len: self.max_inline_len,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddedConfig {
    /// redis-server binary to run when no upstream is configured.
    pub redis_server: String,
    /// Keep an append-only file in `dir` (off: nothing is written to disk).
    pub persistence: bool,
    pub dir: Option<PathBuf>,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        EmbeddedConfig {
            redis_server: "redis-server".into(),
            persistence: false,
            dir: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReaperConfig {
    /// How often each queue's expired leases are looked for.
    #[serde(deserialize_with = "duration::millis")]
    pub interval_ms: u64,
    /// Expired leases returned per script call.
    pub batch: usize,
}

impl Default for ReaperConfig {
    fn default() -> Self {
        ReaperConfig {
            interval_ms: 100,
            batch: 100,
        }
    }
}

impl Config {
    /// Settings `next` sets differently that only a restart applies: all
    /// but the queue rules, `[limits]` and the proxy's own credentials.
    pub fn restart_only_changes(&self, next: &Config) -> Vec<&'static str> {
        // Every field named, so that a new setting cannot be left out of
        // both this list and the reloaded ones unnoticed.
        let Config {
            listen: _,
            tls_listen: _,
            tls_cert_file: _,
            tls_key_file: _,
            tls_ca_cert_file: _,
            tls_auth_clients: _,
            upstream: _,
            upstream_password: _,
            upstream_user: _,
            upstream_tls: _,
            upstream_tls_ca_cert_file: _,
            upstream_tls_cert_file: _,
            upstream_tls_key_file: _,
            upstream_tls_server_name: _,
            upstream_mode: _,
            sentinel_master: _,
            sentinels: _,
            cluster_announce: _,
            sentinel_user: _,
            sentinel_password: _,
            sentinel_tls: _,
            sentinel_tls_ca_cert_file: _,
            sentinel_tls_cert_file: _,
            sentinel_tls_key_file: _,
            sentinel_tls_server_name: _,
            shared_connections: _,
            user_connections_max: _,
            dedicated_pool: _,
            requirepass: _,
            dedicated_per_client: _,
            threads: _,
            metrics: _,
            ops_public: _,
            ops_allowed_hosts: _,
            ops_max_connections: _,
            admin_token: _,
            log_format: _,
            connect_timeout_ms: _,
            limits: _,
            embedded: _,
            reaper: _,
            queues: _,
        } = next;
        differing!(self, next;
            listen, tls_listen, tls_cert_file, tls_key_file, tls_ca_cert_file,
            tls_auth_clients, upstream, upstream_tls, upstream_tls_ca_cert_file,
            upstream_tls_cert_file, upstream_tls_key_file, upstream_tls_server_name,
            upstream_mode, sentinel_master, sentinels, cluster_announce, sentinel_user,
            sentinel_password,
            sentinel_tls, sentinel_tls_ca_cert_file, sentinel_tls_cert_file,
            sentinel_tls_key_file, sentinel_tls_server_name,
            shared_connections, user_connections_max, dedicated_pool, requirepass,
            dedicated_per_client, threads, metrics, ops_public, ops_allowed_hosts,
            ops_max_connections, admin_token,
            log_format, connect_timeout_ms, embedded, reaper)
    }

    /// Whether the proxy runs its private redis-server: no upstream, and
    /// no sentinels to find one.
    pub fn runs_embedded(&self) -> bool {
        self.upstream.is_none() && self.upstream_mode == UpstreamMode::Direct
    }

    /// Every address the proxy listens on, by the setting that names it:
    /// what a start binds, and `--check-bind` tries.
    pub fn bound_addresses(&self) -> Vec<(&'static str, &str)> {
        let mut addrs = Vec::new();
        if !self.listen.is_empty() {
            addrs.push(("listen", self.listen.as_str()));
        }
        if let Some(a) = &self.tls_listen {
            addrs.push(("tls_listen", a.as_str()));
        }
        if let Some(a) = &self.metrics {
            addrs.push(("metrics", a.as_str()));
        }
        addrs
    }

    /// The nodes named by `upstream` in cluster mode.
    pub fn cluster_seeds(&self) -> Vec<String> {
        self.upstream
            .as_deref()
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// The proxy's password for clients, if one is set (empty is none).
    pub fn client_password(&self) -> Option<&str> {
        self.requirepass.as_deref().filter(|p| !p.is_empty())
    }

    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
}
