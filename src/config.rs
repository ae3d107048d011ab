//! Configuration: a TOML file, overridden by command-line flags, which clap
//! also reads from `ACKPROXY_*` environment variables.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;

use crate::glob::{check_glob, glob_match, is_glob};
use crate::resp::Limits;

#[derive(Parser, Debug, Default)]
#[command(
    name = "ackproxy",
    version = env!("ACKPROXY_VERSION"),
    about = "Redis proxy with at-least-once delivery for list queues",
    long_about = "Redis proxy with at-least-once delivery for list queues.\n\n\
        Settings come from the TOML file (--config), then from these flags, each of which \
        can also come from its ACKPROXY_* environment variable. A default shown is the one \
        in force when neither the flag nor the file sets the setting. SIGHUP reloads the \
        file's queue rules, [limits] and upstream credentials."
)]
pub struct Cli {
    /// TOML configuration file.
    #[arg(short, long, env = "ACKPROXY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Queue rules as TOML `[[queue]]` tables (or `queue = [{...}]`), in
    /// place of the file's rules.
    #[arg(long, env = "ACKPROXY_QUEUES", value_name = "TOML")]
    pub queues: Option<String>,
    /// Address to accept Redis clients on.
    #[arg(long, env = "ACKPROXY_LISTEN")]
    pub listen: Option<String>,
    /// Upstream Redis `host:port`.
    #[arg(long, env = "ACKPROXY_UPSTREAM")]
    pub upstream: Option<String>,
    /// How the upstream is found: direct (the `upstream` address) or
    /// sentinel (the primary the sentinels name, followed across failovers).
    #[arg(long, env = "ACKPROXY_UPSTREAM_MODE")]
    pub upstream_mode: Option<UpstreamMode>,
    /// The master name the sentinels monitor (`sentinel monitor <name> …`).
    #[arg(long, env = "ACKPROXY_SENTINEL_MASTER")]
    pub sentinel_master: Option<String>,
    /// Sentinel addresses, `host:port`, comma-separated.
    #[arg(long, env = "ACKPROXY_SENTINELS", value_delimiter = ',')]
    pub sentinels: Option<Vec<String>>,
    /// Every proxy of a group in front of the same Redis, `host:port` as
    /// clients reach them, comma-separated: this proxy then answers
    /// CLUSTER SLOTS/SHARDS/NODES as a cluster of them, so that
    /// cluster-aware clients spread over them.
    #[arg(long, env = "ACKPROXY_CLUSTER_ANNOUNCE", value_delimiter = ',')]
    pub cluster_announce: Option<Vec<String>>,
    /// User the proxy logs in to the sentinels as (default: `default`).
    #[arg(long, env = "ACKPROXY_SENTINEL_USER")]
    pub sentinel_user: Option<String>,
    /// Password the proxy logs in to the sentinels with.
    #[arg(long, env = "ACKPROXY_SENTINEL_PASSWORD", hide_env_values = true)]
    pub sentinel_password: Option<String>,
    /// Talk TLS to the sentinels.
    #[arg(long, env = "ACKPROXY_SENTINEL_TLS")]
    pub sentinel_tls: bool,
    /// CA certificates (PEM) the sentinels' certificates are verified
    /// against (default: upstream_tls_ca_cert_file).
    #[arg(long, env = "ACKPROXY_SENTINEL_TLS_CA_CERT_FILE")]
    pub sentinel_tls_ca_cert_file: Option<PathBuf>,
    /// Client certificate chain (PEM) presented to the sentinels (default:
    /// upstream_tls_cert_file).
    #[arg(long, env = "ACKPROXY_SENTINEL_TLS_CERT_FILE")]
    pub sentinel_tls_cert_file: Option<PathBuf>,
    /// Private key (PEM) of that certificate (default: upstream_tls_key_file).
    #[arg(long, env = "ACKPROXY_SENTINEL_TLS_KEY_FILE")]
    pub sentinel_tls_key_file: Option<PathBuf>,
    /// Name the sentinels' certificates must carry (default: each one's host).
    #[arg(long, env = "ACKPROXY_SENTINEL_TLS_SERVER_NAME")]
    pub sentinel_tls_server_name: Option<String>,
    /// Password the proxy's own upstream connections authenticate with.
    #[arg(long, env = "ACKPROXY_UPSTREAM_PASSWORD", hide_env_values = true)]
    pub upstream_password: Option<String>,
    /// Number of shared (multiplexed) upstream connection pairs (one for
    /// requests that may write, one for reads).
    #[arg(long, env = "ACKPROXY_SHARED_CONNECTIONS")]
    pub shared_connections: Option<usize>,
    /// Most shared connection pairs kept for logged-in users (one per user
    /// and password; 0: logged-in clients keep a connection of their own).
    #[arg(long, env = "ACKPROXY_USER_CONNECTIONS_MAX")]
    pub user_connections_max: Option<usize>,
    /// Upstream connections kept open and logged in ahead of need, for
    /// clients that need one of their own (per login: the proxy's, and
    /// each logged-in user's); 0: each is opened when needed.
    #[arg(long, env = "ACKPROXY_DEDICATED_POOL")]
    pub dedicated_pool: Option<usize>,
    /// Password clients must give (AUTH) while Redis itself needs no login.
    #[arg(long, env = "ACKPROXY_REQUIREPASS", hide_env_values = true)]
    pub requirepass: Option<String>,
    /// Give every client its own upstream connection (no multiplexing).
    #[arg(long, env = "ACKPROXY_DEDICATED_PER_CLIENT")]
    pub dedicated_per_client: bool,
    /// Worker threads (one batches best and leaves the other cores to Redis).
    #[arg(long, env = "ACKPROXY_THREADS", value_parser = parse_threads)]
    pub threads: Option<usize>,
    /// Operations address (`/metrics`, web view, JSON API), e.g. 127.0.0.1:7380.
    #[arg(long, env = "ACKPROXY_METRICS")]
    pub metrics: Option<String>,
    /// The private redis-server (no upstream) keeps an append-only file in
    /// --embedded-dir, so its data outlives restarts.
    #[arg(long, env = "ACKPROXY_EMBEDDED_PERSISTENCE")]
    pub embedded_persistence: bool,
    /// The private redis-server's directory.
    #[arg(long, env = "ACKPROXY_EMBEDDED_DIR")]
    pub embedded_dir: Option<PathBuf>,
    /// Allow a non-loopback operations address.
    #[arg(long, env = "ACKPROXY_OPS_PUBLIC")]
    pub ops_public: bool,
    /// Host names the operations server answers for besides IP addresses
    /// and localhost, comma-separated (on a public address: any while unset).
    #[arg(long, env = "ACKPROXY_OPS_ALLOWED_HOSTS", value_delimiter = ',')]
    pub ops_allowed_hosts: Option<Vec<String>>,
    /// Connections the operations server serves at once; more are closed.
    #[arg(long, env = "ACKPROXY_OPS_MAX_CONNECTIONS")]
    pub ops_max_connections: Option<usize>,
    /// Token the web view's REDRIVE and PURGE actions require
    /// (`Authorization: Bearer <token>`); without it they are refused.
    #[arg(long, env = "ACKPROXY_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Log format: human or json.
    #[arg(long, env = "ACKPROXY_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    /// Address to accept TLS clients on (as Redis's tls-port).
    #[arg(long, env = "ACKPROXY_TLS_LISTEN")]
    pub tls_listen: Option<String>,
    /// Certificate chain (PEM) the TLS listener presents.
    #[arg(long, env = "ACKPROXY_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key (PEM) of that certificate.
    #[arg(long, env = "ACKPROXY_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// CA certificates (PEM) client certificates are verified against.
    #[arg(long, env = "ACKPROXY_TLS_CA_CERT_FILE")]
    pub tls_ca_cert_file: Option<PathBuf>,
    /// Whether TLS clients must present a certificate: yes, no, optional.
    #[arg(long, env = "ACKPROXY_TLS_AUTH_CLIENTS")]
    pub tls_auth_clients: Option<AuthClients>,
    /// Talk TLS to the upstream Redis.
    #[arg(long, env = "ACKPROXY_UPSTREAM_TLS")]
    pub upstream_tls: bool,
    /// CA certificates (PEM) the upstream's certificate is verified against.
    #[arg(long, env = "ACKPROXY_UPSTREAM_TLS_CA_CERT_FILE")]
    pub upstream_tls_ca_cert_file: Option<PathBuf>,
    /// Client certificate chain (PEM) presented to the upstream.
    #[arg(long, env = "ACKPROXY_UPSTREAM_TLS_CERT_FILE")]
    pub upstream_tls_cert_file: Option<PathBuf>,
    /// Private key (PEM) of that certificate.
    #[arg(long, env = "ACKPROXY_UPSTREAM_TLS_KEY_FILE")]
    pub upstream_tls_key_file: Option<PathBuf>,
    /// Name the upstream's certificate must carry (default: its host).
    #[arg(long, env = "ACKPROXY_UPSTREAM_TLS_SERVER_NAME")]
    pub upstream_tls_server_name: Option<String>,
    /// Validate the configuration, print a summary and exit.
    #[arg(long)]
    pub check_config: bool,
    #[command(subcommand)]
    pub generate: Option<Generate>,
}

/// Files made from the command-line definition, for packages.
#[derive(clap::Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum Generate {
    /// Writes the man page, ackproxy.1, and the shell completions into a
    /// directory.
    #[command(hide = true)]
    Generate {
        #[command(subcommand)]
        what: GenerateWhat,
    },
}

#[derive(clap::Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum GenerateWhat {
    /// The man page, DIR/ackproxy.1.
    Man { dir: PathBuf },
    /// The completion script of SHELL, into DIR.
    Completions {
        shell: clap_complete::Shell,
        dir: PathBuf,
    },
}

fn parse_threads(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("threads must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("threads must be a whole number: {e}")),
    }
}

impl Cli {
    /// The command line and the `ACKPROXY_*` environment, as
    /// [`Parser::parse`] reads them, except that a bad value taken from an
    /// environment variable is reported as that variable: clap names the
    /// flag whichever gave the value.
    pub fn parse_args() -> Cli {
        use clap::FromArgMatches;
        let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        let parsed = Cli::definition()
            .try_get_matches_from(&args)
            .and_then(|m| Cli::from_arg_matches(&m));
        match parsed {
            Ok(cli) => cli,
            Err(mut e) => {
                name_env_source(&mut e, &args, |var| std::env::var_os(var));
                e.exit()
            }
        }
    }

    /// The command-line definition, each setting's help ending in its
    /// default. Not as clap's `default_value`: a flag with one would always
    /// be given, and override the configuration file.
    pub fn definition() -> clap::Command {
        use clap::CommandFactory;
        let d = Config::default();
        let log_format = match d.log_format {
            LogFormat::Human => "human",
            LogFormat::Json => "json",
        };
        let auth_clients = match d.tls_auth_clients {
            AuthClients::Yes => "yes",
            AuthClients::No => "no",
            AuthClients::Optional => "optional",
        };
        let defaults: [(&str, String); 11] = [
            ("listen", d.listen.clone()),
            ("upstream_mode", "direct".into()),
            ("upstream", "none: a private redis-server is started".into()),
            ("shared_connections", d.shared_connections.to_string()),
            ("user_connections_max", d.user_connections_max.to_string()),
            ("dedicated_pool", d.dedicated_pool.to_string()),
            ("threads", d.threads.unwrap_or(1).to_string()),
            ("metrics", "none: no operations server".into()),
            ("ops_max_connections", d.ops_max_connections.to_string()),
            ("log_format", log_format.into()),
            ("tls_auth_clients", auth_clients.into()),
        ];
        let mut cmd = Cli::command();
        for (id, default) in defaults {
            cmd = cmd.mut_arg(id, |a| {
                let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
                a.help(format!("{help} [default: {default}]"))
            });
        }
        cmd.mut_arg("embedded_dir", |a| {
            a.help(
                "The private redis-server's directory [default: a temporary one, removed at exit]",
            )
        })
    }
}

/// Makes a clap error about a bad value name the environment variable that
/// gave it. Clap says `--flag` either way; the value came from the variable
/// when the flag is not on the command line (which wins over it).
fn name_env_source(
    e: &mut clap::Error,
    args: &[std::ffi::OsString],
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
) {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    use clap::CommandFactory;
    if !matches!(
        e.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        return;
    }
    let (Some(ContextValue::String(shown)), Some(ContextValue::String(value))) = (
        e.get(ContextKind::InvalidArg),
        e.get(ContextKind::InvalidValue),
    ) else {
        return;
    };
    let mut cmd = Cli::command();
    // Arguments show as clap shows them only once it has filled them in.
    cmd.build();
    let Some(arg) = cmd.get_arguments().find(|a| a.to_string() == *shown) else {
        return;
    };
    let (Some(long), Some(var)) = (arg.get_long(), arg.get_env()) else {
        return;
    };
    let flag = format!("--{long}");
    let on_command_line = args.iter().skip(1).any(|a| {
        let a = a.to_string_lossy();
        a == flag || a.starts_with(&format!("{flag}="))
    });
    let var = var.to_string_lossy().into_owned();
    if on_command_line || env(&var).is_none_or(|v| v.to_string_lossy() != *value) {
        return;
    }
    e.insert(ContextKind::InvalidArg, ContextValue::String(var));
}

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

/// Where a message whose lease expired re-enters its list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Redeliver {
    /// At the end consumers pop from: it is the next message popped.
    #[default]
    Next,
    /// At the end producers push to: behind everything already waiting.
    Last,
}

/// The end of the list consumers pop from (`right` for LPUSH + BRPOP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum End {
    Left,
    #[default]
    Right,
}

/// What acknowledges a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum AckPolicy {
    /// `ACK queue id`, or `LREM` of the payload from a move destination.
    #[default]
    Explicit,
    /// Also: the next pop on the same connection from the same queue.
    NextPop,
}

/// How long a message whose lease ended without an ACK (expired, or
/// NACK without DELAY) waits before it is back in the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Backoff {
    /// Back at once.
    #[default]
    None,
    /// `retry_base_ms` every time.
    Fixed,
    /// `retry_base_ms` doubled for each delivery before: base, 2×base, 4×base, ….
    Exp,
}

/// How long a lease lasts while its worker is busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Hold {
    /// `lease_ms` from the pop (or from the last `QUEUE EXTEND`).
    #[default]
    Lease,
    /// As long as the connection that popped stays open (the proxy renews
    /// the lease), up to `max_hold_ms`; ended at once when it closes.
    Connection,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckId {
    /// The whole payload is the ack id.
    Payload,
    /// The ack id is this top-level field of a JSON object payload.
    JsonField(String),
}

impl<'de> Deserialize<'de> for AckId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        AckId::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl AckId {
    pub fn parse(s: &str) -> Result<AckId, String> {
        if s == "payload" {
            Ok(AckId::Payload)
        } else if let Some(field) = s.strip_prefix("json:") {
            if field.is_empty() {
                Err("ack_id \"json:\" needs a field name".into())
            } else {
                Ok(AckId::JsonField(field.to_string()))
            }
        } else {
            Err(format!(
                "ack_id must be \"payload\" or \"json:<field>\", got {s:?}"
            ))
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueRule {
    /// Exact key name, or a glob pattern (`*`, `?`, `[...]`, as Redis KEYS).
    pub pattern: String,
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    #[serde(default = "default_max_deliveries")]
    pub max_deliveries: u32,
    /// Dead-letter list; `$queue` stands for the queue's name. Default: a
    /// list named after the queue in the queue's hash slot.
    #[serde(default)]
    pub dead_letter: Option<String>,
    #[serde(default = "default_ack_id")]
    pub ack_id: AckId,
    #[serde(default)]
    pub redeliver: Redeliver,
    #[serde(default)]
    pub pop_end: End,
    #[serde(default)]
    pub retry_backoff: Backoff,
    /// The first wait of a backoff, ms.
    #[serde(default = "default_retry_base_ms")]
    pub retry_base_ms: u64,
    /// No wait of a backoff is longer, ms.
    #[serde(default = "default_retry_max_ms")]
    pub retry_max_ms: u64,
    /// Up to this fraction of each wait is taken off at random, so that
    /// messages that failed together do not come back together.
    #[serde(default = "default_retry_jitter")]
    pub retry_jitter: f64,
    /// The dead-letter list holds at most this many messages (0: no limit);
    /// past it the oldest are dropped, and counted.
    #[serde(default)]
    pub dead_max: u64,
    #[serde(default)]
    pub ack: AckPolicy,
    /// When a client connection closes, the leases it took end at once
    /// rather than when they run out.
    #[serde(default)]
    pub requeue_on_disconnect: bool,
    /// Leases are recorded and reported, but a message whose lease ends
    /// without an ACK is not redelivered (only counted): what the workers
    /// would lose without enforcement.
    #[serde(default)]
    pub shadow: bool,
    /// `connection`: a lease lasts while the connection that took it is
    /// open, renewed by the proxy, for jobs of unknown length.
    #[serde(default)]
    pub hold: Hold,
    /// With `hold = "connection"`, no lease is held longer than this from
    /// its delivery (default [`DEFAULT_MAX_HOLD_MS`]).
    #[serde(default)]
    pub max_hold_ms: Option<u64>,
    /// A message is flagged as poison once this many of its deliveries,
    /// and every one so far, ended with its worker's connection closing
    /// (0: never).
    #[serde(default = "default_poison_after")]
    pub poison_after: u32,
}

/// How long a connection holds a lease at most, unless the rule says.
pub const DEFAULT_MAX_HOLD_MS: u64 = 3_600_000;
/// The shortest lease a held rule takes: the proxy renews held leases
/// every `lease_ms / 3`, and a shorter interval would cost Redis a call per
/// queue every few milliseconds.
pub const MIN_HELD_LEASE_MS: u64 = 300;
/// The longest duration the proxy accepts anywhere (30 days): leases of
/// `QUEUE EXTEND`, `NACK … DELAY`, `QUEUE PUSH … DELAY`, `max_hold_ms`.
pub const MAX_DURATION_MS: u64 = 30 * 24 * 3600 * 1000;

impl QueueRule {
    /// Whether each lease records the connection that took it.
    pub fn tracks_connections(&self) -> bool {
        self.ack == AckPolicy::NextPop || self.requeues_on_disconnect()
    }

    /// Whether the leases a connection holds end when it closes.
    pub fn requeues_on_disconnect(&self) -> bool {
        self.requeue_on_disconnect || self.holds()
    }

    /// Whether leases last while their connection is open.
    pub fn holds(&self) -> bool {
        self.hold == Hold::Connection
    }

    /// The longest a connection holds a lease (see [`QueueRule::holds`]).
    pub fn max_hold_ms(&self) -> u64 {
        self.max_hold_ms.unwrap_or(DEFAULT_MAX_HOLD_MS)
    }

    /// The dead-letter list named without `$queue`: the same list, whatever
    /// the queue.
    pub fn fixed_dead_letter(&self) -> Option<&str> {
        self.dead_letter
            .as_deref()
            .filter(|d| !d.contains("$queue"))
    }

    /// Whether every queue the rule matches sends its dead letters to one
    /// list: a glob with a fixed `dead_letter`. (A glob that happens to
    /// match a single key counts too: telling is not worth it.)
    pub fn shares_dead_letter(&self) -> bool {
        is_glob(self.pattern.as_bytes()) && self.fixed_dead_letter().is_some()
    }
}

fn default_lease_ms() -> u64 {
    30_000
}
fn default_retry_base_ms() -> u64 {
    1_000
}
fn default_retry_max_ms() -> u64 {
    300_000
}
fn default_retry_jitter() -> f64 {
    0.1
}
fn default_max_deliveries() -> u32 {
    5
}
fn default_poison_after() -> u32 {
    3
}
fn default_ack_id() -> AckId {
    AckId::Payload
}

impl Config {
    /// File (if any) first, then command-line and environment overrides.
    /// What is accepted but likely not meant is logged at warn.
    pub fn load(cli: &Cli) -> Result<Config, String> {
        let (cfg, warnings) = Config::load_with_warnings(cli)?;
        for w in warnings {
            tracing::warn!("{w}");
        }
        Ok(cfg)
    }

    /// As [`Config::load`], with the warnings returned rather than logged
    /// (at start-up they come before logging is set up).
    pub fn load_with_warnings(cli: &Cli) -> Result<(Config, Vec<String>), String> {
        let mut text = None;
        let mut cfg = match &cli.config {
            Some(path) => {
                let t = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                // Validated once the command line has had its say: a
                // setting may need another that only the command line gives.
                let cfg =
                    toml::from_str::<Config>(&t).map_err(|e| format!("{}: {e}", path.display()))?;
                text = Some(t);
                cfg
            }
            None => Config::default(),
        };
        let mut rules_text = None;
        if let Some(v) = &cli.queues {
            cfg.queues = queue_rules(v).map_err(|e| format!("{}: {e}", given_by("queues", v)))?;
            rules_text = Some(v.as_str());
        }
        if let Some(v) = &cli.listen {
            cfg.listen = v.clone();
        }
        if cli.embedded_persistence {
            cfg.embedded.persistence = true;
        }
        if let Some(v) = &cli.embedded_dir {
            cfg.embedded.dir = Some(v.clone());
        }
        if let Some(v) = &cli.upstream {
            cfg.upstream = Some(v.clone());
        }
        if let Some(v) = &cli.upstream_password {
            cfg.upstream_password = Some(v.clone());
        }
        if let Some(v) = cli.shared_connections {
            cfg.shared_connections = v;
        }
        if let Some(v) = cli.user_connections_max {
            cfg.user_connections_max = v;
        }
        if let Some(v) = cli.dedicated_pool {
            cfg.dedicated_pool = v;
        }
        if let Some(v) = &cli.requirepass {
            cfg.requirepass = Some(v.clone());
        }
        if cli.dedicated_per_client {
            cfg.dedicated_per_client = true;
        }
        if let Some(v) = cli.threads {
            cfg.threads = Some(v);
        }
        if let Some(v) = &cli.metrics {
            cfg.metrics = Some(v.clone());
        }
        if cli.ops_public {
            cfg.ops_public = true;
        }
        if let Some(v) = &cli.ops_allowed_hosts {
            cfg.ops_allowed_hosts.clone_from(v);
        }
        if let Some(v) = cli.ops_max_connections {
            cfg.ops_max_connections = v;
        }
        if let Some(v) = &cli.admin_token {
            cfg.admin_token = Some(v.clone());
        }
        if let Some(v) = cli.log_format {
            cfg.log_format = v;
        }
        let set = |to: &mut Option<PathBuf>, from: &Option<PathBuf>| {
            if from.is_some() {
                to.clone_from(from);
            }
        };
        if let Some(v) = &cli.tls_listen {
            cfg.tls_listen = Some(v.clone());
        }
        set(&mut cfg.tls_cert_file, &cli.tls_cert_file);
        set(&mut cfg.tls_key_file, &cli.tls_key_file);
        set(&mut cfg.tls_ca_cert_file, &cli.tls_ca_cert_file);
        if let Some(v) = cli.tls_auth_clients {
            cfg.tls_auth_clients = v;
        }
        if cli.upstream_tls {
            cfg.upstream_tls = true;
        }
        set(
            &mut cfg.upstream_tls_ca_cert_file,
            &cli.upstream_tls_ca_cert_file,
        );
        set(&mut cfg.upstream_tls_cert_file, &cli.upstream_tls_cert_file);
        set(&mut cfg.upstream_tls_key_file, &cli.upstream_tls_key_file);
        if let Some(v) = &cli.upstream_tls_server_name {
            cfg.upstream_tls_server_name = Some(v.clone());
        }
        if let Some(v) = cli.upstream_mode {
            cfg.upstream_mode = v;
        }
        if let Some(v) = &cli.sentinel_master {
            cfg.sentinel_master = Some(v.clone());
        }
        if let Some(v) = &cli.sentinels {
            cfg.sentinels.clone_from(v);
        }
        if let Some(v) = &cli.cluster_announce {
            cfg.cluster_announce.clone_from(v);
        }
        if let Some(v) = &cli.sentinel_user {
            cfg.sentinel_user = Some(v.clone());
        }
        if let Some(v) = &cli.sentinel_password {
            cfg.sentinel_password = Some(v.clone());
        }
        if cli.sentinel_tls {
            cfg.sentinel_tls = true;
        }
        set(
            &mut cfg.sentinel_tls_ca_cert_file,
            &cli.sentinel_tls_ca_cert_file,
        );
        set(&mut cfg.sentinel_tls_cert_file, &cli.sentinel_tls_cert_file);
        set(&mut cfg.sentinel_tls_key_file, &cli.sentinel_tls_key_file);
        if let Some(v) = &cli.sentinel_tls_server_name {
            cfg.sentinel_tls_server_name = Some(v.clone());
        }
        let path = cli.config.as_ref().map(|p| p.display().to_string());
        let rules_from = cli.queues.as_ref().map(|v| given_by("queues", v));
        let mut origin = Origin {
            file: path.as_deref(),
            text: text.as_deref(),
            given: Vec::new(),
            rules: rules_text.map(|t| (rules_from.as_deref().unwrap_or_default(), t)),
        };
        if let Some(v) = &cli.upstream {
            origin.given.push(("upstream", given_by("upstream", v)));
        }
        if let Some(v) = cli.threads {
            origin
                .given
                .push(("threads", given_by("threads", &v.to_string())));
        }
        let warnings = cfg.validate_at(&origin)?;
        Ok((cfg, warnings))
    }

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

    pub fn from_toml(text: &str) -> Result<Config, String> {
        Config::from_toml_with_warnings(text).map(|(cfg, _)| cfg)
    }

    /// As [`Config::from_toml`], with what [`Config::load`] would warn
    /// about; messages give lines of `text`.
    pub fn from_toml_with_warnings(text: &str) -> Result<(Config, Vec<String>), String> {
        let cfg: Config = toml::from_str(text).map_err(|e| e.to_string())?;
        let origin = Origin {
            text: Some(text),
            ..Origin::default()
        };
        let warnings = cfg.validate_at(&origin)?;
        Ok((cfg, warnings))
    }

    pub fn validate(&self) -> Result<(), String> {
        self.validate_at(&Origin::default()).map(drop)
    }

    /// Every check; errors and the warnings returned say where in `at` the
    /// setting concerned was written.
    fn validate_at(&self, at: &Origin) -> Result<Vec<String>, String> {
        use std::net::ToSocketAddrs;
        if !self.listen.is_empty() && self.listen.to_socket_addrs().is_err() {
            return Err(format!(
                "listen: {:?} is not a host:port address",
                self.listen
            ));
        }
        self.validate_tls()?;
        if let Some(m) = &self.metrics {
            let Ok(addr) = m.parse::<std::net::SocketAddr>() else {
                return Err(format!("metrics: {m:?} is not an ip:port address"));
            };
            // The queue API shows payloads and the view is unauthenticated:
            // reachable from other hosts only when asked for.
            if !addr.ip().is_loopback() && !self.ops_public {
                return Err(format!(
                    "metrics: {m} is not a loopback address; the operations server \
                     (metrics, web view, queue API with message payloads) would be \
                     reachable from other hosts. Set ops_public = true (--ops-public) \
                     to allow it"
                ));
            }
        }
        for host in &self.ops_allowed_hosts {
            // Compared with the name part of `Host`; addresses always pass.
            let plain = !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
            if !plain {
                return Err(format!(
                    "ops_allowed_hosts: {host:?} is not a host name (no port, scheme or path)"
                ));
            }
        }
        // Each is a file descriptor; far more than any host gives a process
        // is a mistake (and past 2^61 a panic in the connection cap).
        if !(1..=1_000_000).contains(&self.ops_max_connections) {
            return Err("ops_max_connections must be between 1 and 1000000".into());
        }
        if self.admin_token.as_deref() == Some("") {
            return Err("admin_token is empty; leave it out to disable the actions".into());
        }
        if self.shared_connections == 0 {
            return Err("shared_connections must be at least 1".into());
        }
        // Per login, so a few; each is a file descriptor here and a client
        // in Redis.
        if self.dedicated_pool > 1024 {
            return Err("dedicated_pool must be at most 1024".into());
        }
        if self.limits.max_inline_len == 0 || self.limits.max_bulk_len == 0 {
            return Err("limits must be positive".into());
        }
        for rule in &self.queues {
            if rule.pattern.is_empty() {
                return Err("a [[queue]] rule has an empty pattern".into());
            }
            if rule.lease_ms == 0 {
                return Err(format!(
                    "queue {:?}: lease_ms must be positive",
                    rule.pattern
                ));
            }
            if rule.max_deliveries == 0 {
                return Err(format!(
                    "queue {:?}: max_deliveries must be at least 1",
                    rule.pattern
                ));
            }
            if !(0.0..=1.0).contains(&rule.retry_jitter) {
                return Err(format!(
                    "queue {:?}: retry_jitter must be between 0 and 1",
                    rule.pattern
                ));
            }
            if rule.retry_backoff != Backoff::None
                && (rule.retry_base_ms == 0 || rule.retry_max_ms < rule.retry_base_ms)
            {
                return Err(format!(
                    "queue {:?}: retry_base_ms must be positive and retry_max_ms at least as large",
                    rule.pattern
                ));
            }
        }
        // A cluster's seeds, a list, are checked one by one below.
        if let Some(u) = self
            .upstream
            .as_ref()
            .filter(|_| self.upstream_mode != UpstreamMode::Cluster)
        {
            if let Err(why) = check_host_port(u) {
                return Err(at.setting("upstream", &format!("upstream: {why}, got {u:?}")));
            }
        }
        self.validate_sentinel()?;
        if self.threads == Some(0) {
            return Err(at.setting("threads", "threads must be at least 1"));
        }
        self.check_rules(at)
    }

    /// What the rules' fields cannot show alone: a pattern that cannot mean
    /// what it says, a dead-letter list that is the queue itself, two rules
    /// for one key. Ok: warnings, of rules that overlap by design.
    fn check_rules(&self, at: &Origin) -> Result<Vec<String>, String> {
        let rules = &self.queues;
        for (i, rule) in rules.iter().enumerate() {
            let p = &rule.pattern;
            if let Err(why) = check_glob(p) {
                return Err(format!(
                    "{}queue {p:?}: pattern: {why}",
                    at.rule(i, "pattern")
                ));
            }
            if let Some(dead) = &rule.dead_letter {
                if let Err(why) = check_dead_letter(p, dead) {
                    return Err(format!(
                        "{}queue {p:?}: dead_letter {dead:?}: {why}",
                        at.rule(i, "dead_letter")
                    ));
                }
            }
            if let Err((key, why)) = check_hold(rule) {
                return Err(format!("{}queue {p:?}: {key}: {why}", at.rule(i, key)));
            }
            if let Some(first) = rules[..i].iter().position(|r| r.pattern == *p) {
                return Err(format!(
                    "{}queue {p:?}: pattern: the rule {} has the same pattern, and only \
                     the first of the two would apply; merge them",
                    at.rule(i, "pattern"),
                    at.rule_place(first),
                ));
            }
        }
        let mut warnings = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            if let Some(dead) = rule
                .fixed_dead_letter()
                .filter(|_| rule.shares_dead_letter())
            {
                warnings.push(format!(
                    "{}queue {:?}: dead_letter {dead:?}: one list for every queue the glob \
                     matches, so QUEUE REDRIVE and QUEUE PURGE … DEAD refuse it (they cannot \
                     tell one queue's dead letters from another's); put $queue in the name to \
                     give each queue its own",
                    at.rule(i, "dead_letter"),
                    rule.pattern,
                ));
            }
            let fixed = rule.fixed_dead_letter();
            if let Some(first) = fixed.and_then(|d| {
                rules[..i]
                    .iter()
                    .position(|r| r.fixed_dead_letter() == Some(d))
            }) {
                warnings.push(format!(
                    "{}queue {:?}: dead_letter {:?}: also the dead-letter list of the rule {}, \
                     so QUEUE REDRIVE and QUEUE PURGE … DEAD refuse it for both; name a list \
                     of its own",
                    at.rule(i, "dead_letter"),
                    rule.pattern,
                    fixed.unwrap_or_default(),
                    at.rule_place(first),
                ));
            }
        }
        for (i, rule) in rules.iter().enumerate() {
            if rule.max_hold_ms.is_some() && !rule.holds() {
                warnings.push(format!(
                    "{}queue {:?}: max_hold_ms: has no effect without hold = \"connection\"",
                    at.rule(i, "max_hold_ms"),
                    rule.pattern,
                ));
            }
        }
        for (i, exact) in rules.iter().enumerate() {
            if is_glob(exact.pattern.as_bytes()) {
                continue;
            }
            for (j, glob) in rules.iter().enumerate() {
                if is_glob(glob.pattern.as_bytes())
                    && glob_match(glob.pattern.as_bytes(), exact.pattern.as_bytes())
                {
                    warnings.push(format!(
                        "{}queue {:?}: pattern: also matched by the glob {:?} of the rule {}; \
                         the exact rule applies to {:?} (an exact pattern wins over any glob)",
                        at.rule(i, "pattern"),
                        exact.pattern,
                        glob.pattern,
                        at.rule_place(j),
                        exact.pattern,
                    ));
                }
            }
        }
        Ok(warnings)
    }

    /// The sentinel settings: all of them in sentinel mode, none otherwise.
    fn validate_sentinel(&self) -> Result<(), String> {
        for p in &self.cluster_announce {
            if let Err(why) = check_host_port(p) {
                return Err(format!("cluster_announce: {why}, got {p:?}"));
            }
        }
        if self.upstream_mode == UpstreamMode::Cluster {
            return self.validate_cluster();
        }
        if self.upstream_mode == UpstreamMode::Direct {
            let any = self.sentinel_master.is_some()
                || !self.sentinels.is_empty()
                || self.sentinel_user.is_some()
                || self.sentinel_password.is_some()
                || self.sentinel_tls;
            if any {
                return Err("sentinel_* settings need upstream_mode = \"sentinel\"".into());
            }
            return Ok(());
        }
        if self.upstream.is_some() {
            return Err(
                "upstream and upstream_mode = \"sentinel\" exclude each other: \
                        the sentinels name the primary"
                    .into(),
            );
        }
        if self.sentinel_master.as_deref().is_none_or(str::is_empty) {
            return Err(
                "upstream_mode = \"sentinel\" needs sentinel_master, the name the \
                        sentinels monitor the primary under"
                    .into(),
            );
        }
        if self.sentinels.is_empty() {
            return Err(
                "upstream_mode = \"sentinel\" needs sentinels, their host:port addresses".into(),
            );
        }
        for s in &self.sentinels {
            if let Err(why) = check_host_port(s) {
                return Err(format!("sentinels: {why}, got {s:?}"));
            }
        }
        if self.sentinel_user.is_some() && self.sentinel_password.is_none() {
            return Err("sentinel_user needs sentinel_password".into());
        }
        Ok(())
    }

    /// Cluster mode: seeds to learn the cluster from, and every queue's keys
    /// in one hash slot.
    fn validate_cluster(&self) -> Result<(), String> {
        if self.sentinel_master.is_some() || !self.sentinels.is_empty() {
            return Err("sentinel_* settings need upstream_mode = \"sentinel\"".into());
        }
        let seeds = self.cluster_seeds();
        if seeds.is_empty() {
            return Err(
                "upstream_mode = \"cluster\" needs upstream, the host:port of one or more \
                 of the cluster's nodes (comma-separated)"
                    .into(),
            );
        }
        for s in &seeds {
            if let Err(why) = check_host_port(s) {
                return Err(format!("upstream: {why}, got {s:?}"));
            }
        }
        for rule in &self.queues {
            if let Some(template) = &rule.dead_letter {
                if !dead_letter_in_queue_slot(&rule.pattern, template) {
                    return Err(format!(
                        "queue {:?}: dead_letter {template:?} is not in the queue's hash slot \
                         for every queue the rule matches, and a Redis Cluster runs a queue's \
                         scripts on the node of that one slot. Leave dead_letter unset (the \
                         default list is always in the queue's slot), or give the list the \
                         queue's hash tag (for queue \"jobs\": \"{{jobs}}:dead\")",
                        rule.pattern
                    ));
                }
            }
        }
        Ok(())
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

    /// Which TLS settings go together. Whether the files can be read and
    /// hold what they should is checked when they are loaded (`net::tls`).
    fn validate_tls(&self) -> Result<(), String> {
        use std::net::ToSocketAddrs;
        match &self.tls_listen {
            Some(addr) => {
                if addr.to_socket_addrs().is_err() {
                    return Err(format!("tls_listen: {addr:?} is not a host:port address"));
                }
                if self.tls_cert_file.is_none() || self.tls_key_file.is_none() {
                    return Err("tls_listen needs tls_cert_file and tls_key_file".into());
                }
                if self.tls_auth_clients != AuthClients::No && self.tls_ca_cert_file.is_none() {
                    return Err(
                        "tls_auth_clients (default \"yes\") needs tls_ca_cert_file, the CA \
                         client certificates are checked against; set tls_auth_clients = \"no\" \
                         to accept clients without one"
                            .into(),
                    );
                }
            }
            None => {
                if self.listen.is_empty() {
                    return Err("listen is empty and tls_listen is not set: no listener".into());
                }
                if self.tls_cert_file.is_some()
                    || self.tls_key_file.is_some()
                    || self.tls_ca_cert_file.is_some()
                {
                    return Err("tls_cert_file, tls_key_file and tls_ca_cert_file \
                                need tls_listen"
                        .into());
                }
            }
        }
        if self.upstream_tls {
            if self.upstream.is_none() && self.upstream_mode == UpstreamMode::Direct {
                return Err("upstream_tls needs an upstream: the private redis-server \
                            speaks plain TCP"
                    .into());
            }
            if self.upstream_tls_ca_cert_file.is_none() {
                return Err("upstream_tls needs upstream_tls_ca_cert_file, the CA the \
                            upstream's certificate is checked against (the system's, e.g. \
                            /etc/ssl/certs/ca-certificates.crt, for a public one)"
                    .into());
            }
            if self.upstream_tls_cert_file.is_some() != self.upstream_tls_key_file.is_some() {
                return Err("upstream_tls_cert_file and upstream_tls_key_file go together".into());
            }
        } else if self.upstream_tls_ca_cert_file.is_some()
            || self.upstream_tls_cert_file.is_some()
            || self.upstream_tls_key_file.is_some()
            || self.upstream_tls_server_name.is_some()
        {
            return Err("upstream_tls_* settings need upstream_tls = true".into());
        }
        if self.sentinel_tls {
            if self.sentinel_tls_ca_cert_file.is_none() && self.upstream_tls_ca_cert_file.is_none()
            {
                return Err("sentinel_tls needs sentinel_tls_ca_cert_file (or \
                            upstream_tls_ca_cert_file), the CA the sentinels' certificates \
                            are checked against"
                    .into());
            }
            if self.sentinel_tls_cert_file.is_some() != self.sentinel_tls_key_file.is_some() {
                return Err("sentinel_tls_cert_file and sentinel_tls_key_file go together".into());
            }
        } else if self.sentinel_tls_ca_cert_file.is_some()
            || self.sentinel_tls_cert_file.is_some()
            || self.sentinel_tls_key_file.is_some()
            || self.sentinel_tls_server_name.is_some()
        {
            return Err("sentinel_tls_* settings need sentinel_tls = true".into());
        }
        Ok(())
    }

    /// Every setting and rule, as `--check-config` prints it.
    pub fn summary(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let on = |b: bool| if b { "yes" } else { "no" };
        let _ = writeln!(
            s,
            "listen              {}",
            if self.listen.is_empty() {
                "off (TLS only)"
            } else {
                &self.listen
            }
        );
        let file = |p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        match &self.tls_listen {
            Some(addr) => {
                let _ = writeln!(
                    s,
                    "tls listen          {addr}, certificate {}, key {}, client certificates {}",
                    file(&self.tls_cert_file),
                    file(&self.tls_key_file),
                    match self.tls_auth_clients {
                        AuthClients::Yes =>
                            format!("required (CA {})", file(&self.tls_ca_cert_file)),
                        AuthClients::Optional =>
                            format!("optional (CA {})", file(&self.tls_ca_cert_file)),
                        AuthClients::No => "not asked for".to_string(),
                    }
                );
            }
            None => {
                let _ = writeln!(s, "tls listen          off");
            }
        }
        match &self.upstream {
            Some(u) if self.upstream_mode == UpstreamMode::Cluster => {
                let _ = writeln!(s, "upstream            Redis Cluster, learnt from {u}");
            }
            Some(u) => {
                let _ = writeln!(s, "upstream            {u}");
            }
            None if self.upstream_mode == UpstreamMode::Sentinel => {
                let _ = writeln!(
                    s,
                    "upstream            the primary of sentinel master {:?}, from {} \
                     (login {}, tls {})",
                    self.sentinel_master.as_deref().unwrap_or_default(),
                    self.sentinels.join(", "),
                    match (&self.sentinel_user, &self.sentinel_password) {
                        (_, None) => "none".to_string(),
                        (Some(u), Some(_)) => format!("user {u}, password set"),
                        (None, Some(_)) => "password set (user default)".to_string(),
                    },
                    if self.sentinel_tls { "on" } else { "off" }
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    "upstream            private redis-server (`{}`, persistence {}{})",
                    self.embedded.redis_server,
                    on(self.embedded.persistence),
                    self.embedded
                        .dir
                        .as_ref()
                        .map(|d| format!(", dir {}", d.display()))
                        .unwrap_or_default()
                );
            }
        }
        if !self.cluster_announce.is_empty() {
            let _ = writeln!(
                s,
                "cluster announce    {} (CLUSTER SLOTS/SHARDS/NODES answered by the proxy)",
                self.cluster_announce.join(", ")
            );
        }
        if self.upstream_tls {
            let _ = writeln!(
                s,
                "upstream tls        on, CA {}, client certificate {}, server name {}",
                file(&self.upstream_tls_ca_cert_file),
                if self.upstream_tls_cert_file.is_some() {
                    file(&self.upstream_tls_cert_file)
                } else {
                    "none".to_string()
                },
                self.upstream_tls_server_name
                    .clone()
                    .unwrap_or_else(|| "the upstream's host".to_string())
            );
        } else {
            let _ = writeln!(s, "upstream tls        off");
        }
        let _ = writeln!(
            s,
            "upstream login      {}",
            match (&self.upstream_user, &self.upstream_password) {
                (_, None) => "none".to_string(),
                (Some(u), Some(_)) => format!("user {u}, password set"),
                (None, Some(_)) => "password set (user default)".to_string(),
            }
        );
        let _ = writeln!(
            s,
            "connections         {}",
            if self.dedicated_per_client {
                "one upstream connection per client".to_string()
            } else {
                format!(
                    "{} shared, dedicated when stateful ({} kept ready)",
                    self.shared_connections, self.dedicated_pool
                )
            }
        );
        let _ = writeln!(
            s,
            "client password     {}",
            if self.client_password().is_some() {
                "set (clients log in with AUTH while Redis needs no login)"
            } else {
                "none (as Redis)"
            }
        );
        let _ = writeln!(
            s,
            "user connections    {}",
            if self.user_connections_max == 0 || self.dedicated_per_client {
                "none: logged-in clients keep their own".to_string()
            } else {
                format!(
                    "up to {}, one shared per logged-in user and password",
                    self.user_connections_max
                )
            }
        );
        let _ = writeln!(s, "threads             {}", self.threads.unwrap_or(1));
        let _ = writeln!(
            s,
            "operations          {}",
            match &self.metrics {
                None => "off".to_string(),
                Some(m) => format!(
                    "http://{m}/ (metrics, web view, API), {}, hosts {}, \
                     at most {} connections",
                    if self.ops_public {
                        "public allowed"
                    } else {
                        "loopback only"
                    },
                    if !self.ops_allowed_hosts.is_empty() {
                        format!(
                            "IP addresses, localhost, {}",
                            self.ops_allowed_hosts.join(", ")
                        )
                    } else if m
                        .parse::<std::net::SocketAddr>()
                        .is_ok_and(|a| a.ip().is_loopback())
                    {
                        "IP addresses and localhost".to_string()
                    } else {
                        "any".to_string()
                    },
                    self.ops_max_connections
                ),
            }
        );
        let _ = writeln!(
            s,
            "admin token         {}",
            if self.admin_token.is_some() {
                "set"
            } else {
                "not set: REDRIVE and PURGE refused"
            }
        );
        let _ = writeln!(
            s,
            "log format          {}",
            match self.log_format {
                LogFormat::Human => "human",
                LogFormat::Json => "json",
            }
        );
        let _ = writeln!(s, "connect timeout     {} ms", self.connect_timeout_ms);
        let l = &self.limits;
        let _ = writeln!(
            s,
            "limits              bulk {} B, array {} args, inline {} B, {} clients, \
             output buffer {} B{}, {} requests in flight per client, idle timeout {}",
            l.max_bulk_len,
            l.max_array_len,
            l.max_inline_len,
            l.maxclients,
            l.client_output_buffer_limit,
            if l.client_output_buffer_limit == 0 {
                " (none)"
            } else {
                ""
            },
            l.max_inflight_per_client,
            if l.idle_timeout_secs == 0 {
                "never".to_string()
            } else {
                format!("{} s", l.idle_timeout_secs)
            }
        );
        let _ = writeln!(
            s,
            "reaper              every {} ms, {} leases per call",
            self.reaper.interval_ms, self.reaper.batch
        );
        if self.queues.is_empty() {
            let _ = writeln!(s, "queue rules         none: every command passes through");
        }
        for q in &self.queues {
            let retry = match q.retry_backoff {
                Backoff::None => "at once".to_string(),
                b => format!(
                    "{} backoff from {} ms up to {} ms, jitter {}",
                    if b == Backoff::Fixed {
                        "fixed"
                    } else {
                        "exponential"
                    },
                    q.retry_base_ms,
                    q.retry_max_ms,
                    q.retry_jitter
                ),
            };
            let _ = writeln!(
                s,
                "queue {:?}: lease {} ms, max deliveries {}, ack id {}, ack {}{}{}, \
                 redeliver {}, retries {retry}, consumers pop from the {}, dead letters {} ({})",
                q.pattern,
                q.lease_ms,
                q.max_deliveries,
                match &q.ack_id {
                    AckId::Payload => "the whole payload".to_string(),
                    AckId::JsonField(f) => format!("JSON field {f:?}"),
                },
                match q.ack {
                    AckPolicy::Explicit => "explicit",
                    AckPolicy::NextPop => "next-pop",
                },
                match (q.requeue_on_disconnect, q.shadow) {
                    (_, true) => ", shadow mode (nothing redelivered)",
                    (true, false) => ", requeued on disconnect",
                    (false, false) => "",
                },
                if q.holds() {
                    format!(
                        ", held while the connection is open (at most {} ms)",
                        q.max_hold_ms()
                    )
                } else {
                    String::new()
                },
                match q.redeliver {
                    Redeliver::Next => "next (popped next)",
                    Redeliver::Last => "last (behind the others)",
                },
                match q.pop_end {
                    End::Left => "left",
                    End::Right => "right",
                },
                q.dead_letter
                    .as_deref()
                    .map(|d| format!("in {d:?}"))
                    .unwrap_or_else(|| "in the default list (`{queue}:dead`)".to_string()),
                if q.dead_max == 0 {
                    "no limit".to_string()
                } else {
                    format!("at most {}", q.dead_max)
                }
            );
        }
        s
    }

    /// The proxy's password for clients, if one is set (empty is none).
    pub fn client_password(&self) -> Option<&str> {
        self.requirepass.as_deref().filter(|p| !p.is_empty())
    }

    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
}

/// Where a configuration was written, for messages to point at: the file
/// (name and text) and the settings the command line or the environment
/// gave instead.
#[derive(Default)]
struct Origin<'a> {
    file: Option<&'a str>,
    text: Option<&'a str>,
    /// Setting → the flag or variable that gave it.
    given: Vec<(&'static str, String)>,
    /// Where the queue rules came from instead of the file, and their text.
    rules: Option<(&'a str, &'a str)>,
}

impl Origin<'_> {
    /// Where the rules were written: this, or the flag or variable that
    /// gave them in place of the file's.
    fn of_rules(&self) -> Origin<'_> {
        match self.rules {
            Some((from, text)) => Origin {
                file: Some(from),
                text: Some(text),
                ..Origin::default()
            },
            None => Origin {
                file: self.file,
                text: self.text,
                ..Origin::default()
            },
        }
    }

    /// The line (from 1) setting `key`: at the top level, or in the
    /// `rule`-th `[[queue]]` table.
    fn line(&self, rule: Option<usize>, key: &str) -> Option<usize> {
        let text = self.text?;
        let doc = toml::de::DeTable::parse(text).ok()?;
        let doc = doc.get_ref();
        let value = match rule {
            None => doc.get(key)?,
            Some(i) => doc.get("queue")?.get_ref().get(i)?.get_ref().get(key)?,
        };
        Some(text[..value.span().start].matches('\n').count() + 1)
    }

    fn place(&self, line: Option<usize>) -> Option<String> {
        let line = line?;
        Some(match self.file {
            Some(f) => format!("{f}:{line}"),
            None => format!("line {line}"),
        })
    }

    /// `file:line: ` of a rule's `key` (its pattern's line without it), to
    /// start a message with; empty when unknown.
    fn rule(&self, i: usize, key: &str) -> String {
        let at = self.of_rules();
        at.place(at.line(Some(i), key).or(at.line(Some(i), "pattern")))
            .map(|p| format!("{p}: "))
            .unwrap_or_default()
    }

    /// A rule by where it is: `at file:line`, or by number.
    fn rule_place(&self, i: usize) -> String {
        let at = self.of_rules();
        at.place(at.line(Some(i), "pattern"))
            .map(|p| format!("at {p}"))
            .unwrap_or_else(|| format!("number {}", i + 1))
    }

    /// `message` about the top-level setting `key`, with where it was set.
    fn setting(&self, key: &str, message: &str) -> String {
        if let Some((_, by)) = self.given.iter().find(|(k, _)| *k == key) {
            return format!("{message} (from {by})");
        }
        match self.place(self.line(None, key)) {
            Some(p) => format!("{p}: {message}"),
            None => message.to_string(),
        }
    }
}

/// Which gave a setting the command line overrides with `value`: its
/// `ACKPROXY_*` variable when that holds the value and the flag is not on
/// the command line, else the flag.
fn given_by(long: &str, value: &str) -> String {
    let flag = format!("--{long}");
    let var = format!("ACKPROXY_{}", long.replace('-', "_").to_uppercase());
    let on_command_line = std::env::args()
        .skip(1)
        .any(|a| a == flag || a.starts_with(&format!("{flag}=")));
    if !on_command_line && std::env::var(&var).is_ok_and(|v| v == value) {
        var
    } else {
        flag
    }
}

/// Queue rules given as TOML text: `[[queue]]` tables, or `queue = [...]`.
fn queue_rules(text: &str) -> Result<Vec<QueueRule>, String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Rules {
        #[serde(default)]
        queue: Vec<QueueRule>,
    }
    toml::from_str::<Rules>(text)
        .map(|r| r.queue)
        .map_err(|e| e.to_string())
}

/// `host:port`, as the upstream is connected to (resolved only then).
/// Whether the dead-letter list `template` (`$queue`: the queue's name) is
/// in the hash slot of each queue `pattern` matches. For a glob, checked on
/// names made from it, with and without a hash tag of their own: a list
/// that passes for all of them passes for any name.
fn dead_letter_in_queue_slot(pattern: &str, template: &str) -> bool {
    use crate::keyslot::key_slot;
    let names: Vec<String> = if is_glob(pattern.as_bytes()) {
        ["a", "jobs", "{t}x", "x{u}", "b}c", "{}d"]
            .iter()
            .map(|fill| {
                let mut name = String::new();
                let mut chars = pattern.chars();
                while let Some(c) = chars.next() {
                    match c {
                        '*' | '?' => name.push_str(fill),
                        '[' => {
                            // A class stands for one of its characters.
                            let class: String = chars.by_ref().take_while(|c| *c != ']').collect();
                            name.push(class.chars().find(|c| *c != '^').unwrap_or('a'));
                        }
                        '\\' => name.extend(chars.next()),
                        c => name.push(c),
                    }
                }
                name
            })
            .collect()
    } else {
        vec![pattern.to_string()]
    };
    names.iter().all(|q| {
        let dead = template.replace("$queue", q);
        key_slot(dead.as_bytes()) == key_slot(q.as_bytes())
    })
}

fn check_host_port(addr: &str) -> Result<(), String> {
    let expected = "expected host:port";
    if addr.contains("://") {
        return Err(format!("{expected} (not a URL)"));
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err(expected.into());
    };
    if host.is_empty() || !port.parse::<u16>().is_ok_and(|p| p != 0) {
        return Err(expected.into());
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err(format!(
            "{expected}, an IPv6 address in brackets ([::1]:6379)"
        ));
    }
    Ok(())
}

/// Whether a pattern is a glob, as the rules tell (`queue::rules`).
/// What a held rule needs: a lease the proxy can renew in time, and a
/// bound within the one on every duration. Err: the key at fault and why.
fn check_hold(rule: &QueueRule) -> Result<(), (&'static str, String)> {
    if !rule.holds() {
        return Ok(());
    }
    if rule.lease_ms < MIN_HELD_LEASE_MS {
        return Err((
            "lease_ms",
            format!(
                "must be at least {MIN_HELD_LEASE_MS} with hold = \"connection\" (the proxy \
                 renews held leases every lease_ms / 3), got {}",
                rule.lease_ms
            ),
        ));
    }
    let max = rule.max_hold_ms();
    if max < rule.lease_ms || max > MAX_DURATION_MS {
        return Err((
            "max_hold_ms",
            format!(
                "must be between lease_ms ({}) and {MAX_DURATION_MS} (30 days), got {max}",
                rule.lease_ms
            ),
        ));
    }
    Ok(())
}

/// A dead-letter list that is the queue itself: its dead letters would be
/// popped again at once, and never stay dead. `$queue` stands for the
/// queue's name.
pub fn check_dead_letter(pattern: &str, dead_letter: &str) -> Result<(), String> {
    let itself = "the dead-letter list is the queue itself: dead letters would be \
                  popped again at once; leave dead_letter out for the default \
                  (\"{queue}:dead\") or name another list";
    if !is_glob(pattern.as_bytes()) {
        if dead_letter.replace("$queue", pattern) == pattern {
            return Err(itself.into());
        }
    } else if dead_letter == "$queue" {
        return Err(itself.into());
    } else if !dead_letter.contains("$queue")
        && glob_match(pattern.as_bytes(), dead_letter.as_bytes())
    {
        // The one list all the queues' dead letters go to is one of them.
        return Err(format!(
            "for the queue {dead_letter:?}, which the pattern matches, {itself}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_parses() {
        let text = include_str!("../config/ackproxy.toml");
        let cfg = Config::from_toml(text).expect("example config is valid");
        assert!(!cfg.queues.is_empty());
        // The file says the values it shows are the defaults.
        let (l, d) = (&cfg.limits, LimitsConfig::default());
        assert_eq!(
            (
                l.max_bulk_len,
                l.max_array_len,
                l.max_inline_len,
                l.maxclients
            ),
            (
                d.max_bulk_len,
                d.max_array_len,
                d.max_inline_len,
                d.maxclients
            )
        );
        assert_eq!(
            (
                l.client_output_buffer_limit,
                l.max_inflight_per_client,
                l.idle_timeout_secs
            ),
            (
                d.client_output_buffer_limit,
                d.max_inflight_per_client,
                d.idle_timeout_secs
            )
        );
        assert_eq!(
            cfg.user_connections_max,
            Config::default().user_connections_max
        );
        assert_eq!(cfg.requirepass, None);
        let d = Config::default();
        assert_eq!(
            (&cfg.ops_allowed_hosts, cfg.ops_max_connections),
            (&d.ops_allowed_hosts, d.ops_max_connections)
        );
        let r = ReaperConfig::default();
        assert_eq!(
            (cfg.reaper.interval_ms, cfg.reaper.batch),
            (r.interval_ms, r.batch)
        );
    }

    #[test]
    fn unknown_keys_and_bad_ack_ids_are_rejected() {
        assert!(Config::from_toml("listn = \"x\"").is_err());
        let bad = "[[queue]]\npattern = \"q\"\nack_id = \"xml:id\"\n";
        let err = Config::from_toml(bad).unwrap_err();
        assert!(err.contains("ack_id"), "{err}");
    }

    #[test]
    fn bad_addresses_are_rejected() {
        assert!(Config::from_toml("listen = \"not-an-addr\"").is_err());
        assert!(Config::from_toml("metrics = \"nope\"").is_err());
        let public = Config::from_toml("metrics = \"0.0.0.0:7380\"").unwrap_err();
        assert!(public.contains("ops_public"), "{public}");
        assert!(Config::from_toml("metrics = \"[::1]:7380\"").is_ok());
        assert!(Config::from_toml("metrics = \"0.0.0.0:7380\"\nops_public = true").is_ok());
        assert!(Config::from_toml("listen = \"127.0.0.1:7000\"").is_ok());
    }

    #[test]
    fn operations_limits_and_host_names_are_checked() {
        let cfg = Config::from_toml(
            "metrics = \"0.0.0.0:7380\"\nops_public = true\n\
             ops_allowed_hosts = [\"ops.example.com\", \"ops-2.internal\"]\n\
             ops_max_connections = 8\n",
        )
        .unwrap();
        assert_eq!(cfg.ops_max_connections, 8);
        let s = cfg.summary();
        assert!(
            s.contains("hosts IP addresses, localhost, ops.example.com, ops-2.internal"),
            "{s}"
        );
        assert!(s.contains("at most 8 connections"), "{s}");
        let open = Config::from_toml("metrics = \"0.0.0.0:7380\"\nops_public = true\n").unwrap();
        assert!(open.summary().contains("hosts any"), "{}", open.summary());
        let local = Config::from_toml("metrics = \"127.0.0.1:7380\"\nops_public = true\n").unwrap();
        assert!(
            local
                .summary()
                .contains("hosts IP addresses and localhost,"),
            "{}",
            local.summary()
        );
        for bad in ["ops.example.com:443", "https://ops.example.com", "", "a b"] {
            let err = Config::from_toml(&format!("ops_allowed_hosts = [{bad:?}]")).unwrap_err();
            assert!(err.contains("ops_allowed_hosts"), "{bad}: {err}");
        }
        for bad in ["0", "1000001", "4611686018427387904"] {
            let err = Config::from_toml(&format!("ops_max_connections = {bad}")).unwrap_err();
            assert!(err.contains("ops_max_connections"), "{bad}: {err}");
        }
    }

    #[test]
    fn tls_settings_that_go_together() {
        let listener = "tls_listen = \"127.0.0.1:6381\"\n\
                        tls_cert_file = \"c.pem\"\ntls_key_file = \"k.pem\"\n";
        let err = |toml: &str| Config::from_toml(toml).unwrap_err();
        // As Redis: client certificates are required by default, so a CA is.
        assert!(err(listener).contains("tls_ca_cert_file"));
        let cfg = Config::from_toml(&format!("{listener}tls_auth_clients = \"no\"\n")).unwrap();
        assert_eq!(cfg.tls_auth_clients, AuthClients::No);
        let cfg = Config::from_toml(&format!(
            "{listener}tls_ca_cert_file = \"ca.pem\"\ntls_auth_clients = \"optional\"\n"
        ))
        .unwrap();
        assert_eq!(cfg.tls_auth_clients, AuthClients::Optional);
        assert!(err("tls_listen = \"127.0.0.1:6381\"\n").contains("tls_cert_file"));
        assert!(err("tls_cert_file = \"c.pem\"\n").contains("need tls_listen"));
        assert!(err("listen = \"\"\n").contains("no listener"));
        let tls_only = format!("listen = \"\"\n{listener}tls_auth_clients = \"no\"\n");
        assert!(Config::from_toml(&tls_only).is_ok());

        let upstream = "upstream = \"127.0.0.1:6379\"\nupstream_tls = true\n";
        assert!(err(upstream).contains("upstream_tls_ca_cert_file"));
        let with_ca = format!("{upstream}upstream_tls_ca_cert_file = \"ca.pem\"\n");
        assert!(Config::from_toml(&with_ca).is_ok());
        assert!(
            err(&format!("{with_ca}upstream_tls_cert_file = \"c.pem\"\n")).contains("go together")
        );
        // The private redis-server speaks plain text only.
        assert!(
            err("upstream_tls = true\nupstream_tls_ca_cert_file = \"ca.pem\"\n")
                .contains("needs an upstream")
        );
        assert!(err("upstream_tls_ca_cert_file = \"ca.pem\"\n").contains("upstream_tls = true"));
    }

    #[test]
    fn the_client_password_is_shown_as_set_only() {
        let cfg =
            Config::from_toml("requirepass = \"hunter2\"\nuser_connections_max = 3\n").unwrap();
        assert_eq!(cfg.client_password(), Some("hunter2"));
        let summary = cfg.summary();
        assert!(!summary.contains("hunter2"), "{summary}");
        assert!(summary.contains("client password     set"), "{summary}");
        assert!(summary.contains("up to 3"), "{summary}");
        let empty = Config::from_toml("requirepass = \"\"\n").unwrap();
        assert_eq!(empty.client_password(), None);
        assert_eq!(Config::default().user_connections_max, 64);
    }

    #[test]
    fn summary_says_the_admin_token_is_set_never_its_value() {
        let cfg = Config::from_toml("metrics = \"127.0.0.1:7380\"\nadmin_token = \"s3cret-t0ken\"")
            .unwrap();
        let s = cfg.summary();
        assert!(s.contains("admin token         set"), "{s}");
        assert!(s.contains("loopback only"), "{s}");
        assert!(!s.contains("s3cret-t0ken"), "{s}");
        assert!(Config::from_toml("admin_token = \"\"").is_err());
    }

    #[test]
    fn queue_rule_defaults() {
        let cfg = Config::from_toml("[[queue]]\npattern = \"jobs\"\n").unwrap();
        let q = &cfg.queues[0];
        assert_eq!(q.lease_ms, 30_000);
        assert_eq!(q.max_deliveries, 5);
        assert_eq!(q.ack_id, AckId::Payload);
        assert_eq!(q.redeliver, Redeliver::Next);
        assert_eq!(q.pop_end, End::Right);
        assert_eq!(q.retry_backoff, Backoff::None);
        assert_eq!(q.ack, AckPolicy::Explicit);
        assert!(!q.tracks_connections());
        let next = Config::from_toml("[[queue]]\npattern = \"q\"\nack = \"next-pop\"\n").unwrap();
        assert!(next.queues[0].tracks_connections());
        assert!(Config::from_toml("[[queue]]\npattern = \"q\"\nack = \"never\"\n").is_err());
    }

    #[test]
    fn held_rules_are_checked_where_they_are_written() {
        let rule = |extra: &str| {
            Config::from_toml_with_warnings(&format!("[[queue]]\npattern = \"q\"\n{extra}"))
        };
        let (cfg, warnings) = rule("hold = \"connection\"\nlease_ms = 1000\n").unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        let q = &cfg.queues[0];
        assert!(q.holds() && q.requeues_on_disconnect() && q.tracks_connections());
        assert!(!q.requeue_on_disconnect);
        assert_eq!(q.max_hold_ms(), DEFAULT_MAX_HOLD_MS);
        assert_eq!(q.poison_after, 3);
        let plain = &Config::from_toml("[[queue]]\npattern = \"q\"\n")
            .unwrap()
            .queues[0];
        assert!(!plain.holds() && !plain.requeues_on_disconnect());
        let e = rule("hold = \"connection\"\nlease_ms = 100\n").unwrap_err();
        assert!(
            e.starts_with("line 4: queue \"q\": lease_ms: must be at least 300"),
            "{e}"
        );
        let e = rule("hold = \"connection\"\nlease_ms = 1000\nmax_hold_ms = 500\n").unwrap_err();
        assert!(
            e.starts_with("line 5: queue \"q\": max_hold_ms: must be between lease_ms (1000)"),
            "{e}"
        );
        // The one bound on every duration; the default (an hour) below a
        // longer lease is named at the rule's pattern.
        let e = rule("hold = \"connection\"\nmax_hold_ms = 2592000001\n").unwrap_err();
        assert!(e.starts_with("line 4: queue \"q\": max_hold_ms:"), "{e}");
        assert!(
            e.contains("and 2592000000 (30 days), got 2592000001"),
            "{e}"
        );
        let e = rule("hold = \"connection\"\nlease_ms = 7200000\n").unwrap_err();
        assert!(e.starts_with("line 2: queue \"q\": max_hold_ms:"), "{e}");
        assert!(rule("hold = \"connection\"\nmax_hold_ms = 2592000000\n").is_ok());
        assert!(rule("hold = \"forever\"\n").is_err());
        // Accepted, but it says nothing without hold.
        let (_, warnings) = rule("max_hold_ms = 5000\n").unwrap();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with("line 3: queue \"q\": max_hold_ms: has no effect"),
            "{}",
            warnings[0]
        );
    }

    #[test]
    fn retry_policies_are_checked() {
        let rule = |extra: &str| Config::from_toml(&format!("[[queue]]\npattern = \"q\"\n{extra}"));
        assert!(rule("retry_backoff = \"exp\"\nretry_base_ms = 100\nretry_max_ms = 800\n").is_ok());
        assert!(rule("retry_backoff = \"fixed\"\nretry_base_ms = 0\n").is_err());
        assert!(rule("retry_backoff = \"exp\"\nretry_base_ms = 100\nretry_max_ms = 50\n").is_err());
        assert!(rule("retry_jitter = 1.5\n").is_err());
        assert!(rule("retry_backoff = \"linear\"\n").is_err());
    }

    fn dead_letter_rule(pattern: &str, dead: &str) -> Result<Config, String> {
        Config::from_toml(&format!(
            "[[queue]]\npattern = {pattern:?}\ndead_letter = {dead:?}\n"
        ))
    }

    #[test]
    fn a_dead_letter_list_that_is_the_queue_is_refused() {
        let err = dead_letter_rule("jobs", "jobs").unwrap_err();
        assert!(
            err.starts_with("line 3: queue \"jobs\": dead_letter"),
            "{err}"
        );
        assert!(err.contains("the queue itself"), "{err}");
        // `$queue` resolving to the queue's name, for an exact rule or any
        // queue of a glob.
        assert!(dead_letter_rule("jobs", "$queue").is_err());
        assert!(dead_letter_rule("tasks:*", "$queue").is_err());
        // One list for all the glob's queues that the glob matches: for
        // that queue it is itself.
        let err = dead_letter_rule("tasks:*", "tasks:dead").unwrap_err();
        assert!(err.contains("for the queue \"tasks:dead\""), "{err}");
        for (pattern, dead) in [
            ("jobs", "jobs:dead"),
            ("jobs", "$queue:dead"),
            ("jobs", "dlq:$queue"),
            ("tasks:*", "$queue:dead"),
            ("tasks:*", "dead:tasks"),
            ("tasks:*", "{tasks}:dead"),
        ] {
            assert!(dead_letter_rule(pattern, dead).is_ok(), "{pattern} {dead}");
        }
    }

    fn pattern_rule(pattern: &str) -> Result<Config, String> {
        Config::from_toml(&format!("# rules\n[[queue]]\npattern = {pattern:?}\n"))
    }

    #[test]
    fn an_unclosed_bracket_is_refused() {
        let err = pattern_rule("jobs[").unwrap_err();
        assert!(
            err.starts_with("line 3: queue \"jobs[\": pattern: "),
            "{err}"
        );
        assert!(err.contains("the [ at character 5 is not closed"), "{err}");
        assert!(err.contains("match no key"), "{err}");
        let err = pattern_rule("jobs[12").unwrap_err();
        assert!(err.contains("one class"), "{err}");
        // `]` ends the range `a-]`; `\]` is a literal `]`; `[]` is empty.
        for bad in ["x[^", "[a-]", "q[\\]", "q[]", "[]]", "a[\\"] {
            assert!(pattern_rule(bad).is_err(), "{bad}");
        }
        for good in [
            "jobs", "q[0-9]", "q[^0-9]x", "a\\[", "[\\]]", "[^]", "q[a-]]", "[z-a]", "a\\", "*",
        ] {
            assert!(pattern_rule(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn the_same_pattern_twice_is_refused() {
        let twice =
            "[[queue]]\npattern = \"jobs\"\n\n[[queue]]\npattern = \"jobs\"\nlease_ms = 5\n";
        let err = Config::from_toml(twice).unwrap_err();
        assert!(
            err.starts_with("line 5: queue \"jobs\": pattern: "),
            "{err}"
        );
        assert!(
            err.contains("the rule at line 2 has the same pattern"),
            "{err}"
        );
        let globs = "[[queue]]\npattern = \"t:*\"\n[[queue]]\npattern = \"t:*\"\n";
        assert!(Config::from_toml(globs).is_err());
    }

    #[test]
    fn an_exact_rule_a_glob_also_matches_is_warned_about() {
        let text = "[[queue]]\npattern = \"jobs*\"\n[[queue]]\npattern = \"jobs\"\n\
                    [[queue]]\npattern = \"other\"\n[[queue]]\npattern = \"jobs:*\"\n";
        let (cfg, warnings) = Config::from_toml_with_warnings(text).unwrap();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        let w = &warnings[0];
        assert!(w.starts_with("line 4: queue \"jobs\": pattern: "), "{w}");
        assert!(w.contains("glob \"jobs*\" of the rule at line 2"), "{w}");
        // The precedence the warning and the README state is the one the
        // rules follow: the exact rule, then the first glob in file order.
        let rules = crate::queue::rules::Rules::new(&cfg.queues);
        let rule_of = |key: &[u8]| rules.resolve(key).unwrap().rule.pattern.clone();
        assert_eq!(rule_of(b"jobs"), "jobs");
        assert_eq!(rule_of(b"jobs2"), "jobs*");
        assert_eq!(rule_of(b"jobs:a"), "jobs*");
        let (_, none) = Config::from_toml_with_warnings("[[queue]]\npattern = \"jobs\"\n").unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn a_shared_dead_letter_list_is_warned_about() {
        let text = "[[queue]]\npattern = \"t:*\"\ndead_letter = \"t-dead\"\n\
                    [[queue]]\npattern = \"a\"\ndead_letter = \"ab-dead\"\n\
                    [[queue]]\npattern = \"b\"\ndead_letter = \"ab-dead\"\n\
                    [[queue]]\npattern = \"u:*\"\ndead_letter = \"dead:$queue\"\n";
        let (_, warnings) = Config::from_toml_with_warnings(text).unwrap();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0].starts_with("line 3: queue \"t:*\": dead_letter \"t-dead\": one list"),
            "{}",
            warnings[0]
        );
        assert!(
            warnings[1].starts_with("line 9: queue \"b\": dead_letter \"ab-dead\": also")
                && warnings[1].contains("of the rule at line 5"),
            "{}",
            warnings[1]
        );
    }

    #[test]
    fn upstream_needs_host_and_port() {
        let err = Config::from_toml("upstream = \"nohost\"\n").unwrap_err();
        assert_eq!(err, "line 1: upstream: expected host:port, got \"nohost\"");
        for bad in [
            "nohost:",
            ":6379",
            "host:0",
            "host:port",
            "redis://h:6379",
            "::1",
        ] {
            assert!(
                Config::from_toml(&format!("upstream = {bad:?}")).is_err(),
                "{bad}"
            );
        }
        for good in ["127.0.0.1:6379", "redis.internal:6379", "[::1]:6379"] {
            assert!(
                Config::from_toml(&format!("upstream = {good:?}")).is_ok(),
                "{good}"
            );
        }
    }

    #[test]
    fn threads_must_be_at_least_one() {
        let err = Config::from_toml("listen = \"127.0.0.1:6380\"\nthreads = 0\n").unwrap_err();
        assert_eq!(err, "line 2: threads must be at least 1");
        assert!(Config::from_toml("threads = 2").is_ok());
        let e = Cli::try_parse_from(["ackproxy", "--threads", "0"]).unwrap_err();
        assert!(e.to_string().contains("threads must be at least 1"), "{e}");
        assert_eq!(
            Cli::try_parse_from(["ackproxy", "--threads", "4"])
                .unwrap()
                .threads,
            Some(4)
        );
    }

    #[test]
    fn a_bad_value_from_the_environment_names_the_variable() {
        use std::ffi::OsString;
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        let env = |var: &str| (var == "ACKPROXY_THREADS").then(|| OsString::from("x"));
        let error = || Cli::try_parse_from(["ackproxy", "--threads", "x"]).unwrap_err();
        // On the command line the flag wins over the variable: it is named.
        let mut e = error();
        name_env_source(&mut e, &args(&["ackproxy", "--threads=x"]), env);
        assert!(e.to_string().contains("'--threads <THREADS>'"), "{e}");
        // Only in the environment: the variable.
        let mut e = error();
        name_env_source(&mut e, &args(&["ackproxy", "--check-config"]), env);
        let text = e.to_string();
        assert!(text.contains("for 'ACKPROXY_THREADS'"), "{text}");
        assert!(!text.contains("--threads"), "{text}");
        // The variable holds something else: the flag gave the value.
        let mut e = error();
        name_env_source(&mut e, &args(&["ackproxy"]), |_| Some("2".into()));
        assert!(e.to_string().contains("'--threads <THREADS>'"), "{e}");
        // Values checked against a list (ValueEnum) too.
        let mut e = Cli::try_parse_from(["ackproxy", "--log-format", "xml"]).unwrap_err();
        name_env_source(&mut e, &args(&["ackproxy"]), |var| {
            (var == "ACKPROXY_LOG_FORMAT").then(|| "xml".into())
        });
        assert!(e.to_string().contains("'ACKPROXY_LOG_FORMAT'"), "{e}");
    }

    #[test]
    fn reload_names_what_changed() {
        let old = Config::from_toml("[limits]\nmaxclients = 10\n").unwrap();
        let new = Config::from_toml(
            "listen = \"127.0.0.1:7000\"\nupstream_password = \"p\"\n\
             [reaper]\nbatch = 5\n[limits]\nmaxclients = 20\nidle_timeout_secs = 3\n\
             [[queue]]\npattern = \"q\"\n",
        )
        .unwrap();
        // Credentials, limits and rules reload; the rest waits for a restart.
        assert_eq!(old.restart_only_changes(&new), ["listen", "reaper"]);
        assert_eq!(
            old.limits.changes(&new.limits),
            ["maxclients", "idle_timeout_secs"]
        );
        assert!(old.restart_only_changes(&old.clone()).is_empty());
    }
}
