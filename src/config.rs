//! Configuration: a TOML file, overridden by command-line flags, which clap
//! also reads from `ACKPROXY_*` environment variables.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;

use crate::resp::Limits;

#[derive(Parser, Debug, Default)]
#[command(
    name = "ackproxy",
    version,
    about = "Redis proxy with at-least-once delivery for list queues"
)]
pub struct Cli {
    /// TOML configuration file.
    #[arg(short, long, env = "ACKPROXY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to accept Redis clients on.
    #[arg(long, env = "ACKPROXY_LISTEN")]
    pub listen: Option<String>,
    /// Upstream Redis `host:port`. Without it a private redis-server is started.
    #[arg(long, env = "ACKPROXY_UPSTREAM")]
    pub upstream: Option<String>,
    /// Password the proxy's own upstream connections authenticate with.
    #[arg(long, env = "ACKPROXY_UPSTREAM_PASSWORD", hide_env_values = true)]
    pub upstream_password: Option<String>,
    /// Number of shared (multiplexed) upstream connections.
    #[arg(long, env = "ACKPROXY_SHARED_CONNECTIONS")]
    pub shared_connections: Option<usize>,
    /// Give every client its own upstream connection (no multiplexing).
    #[arg(long, env = "ACKPROXY_DEDICATED_PER_CLIENT")]
    pub dedicated_per_client: bool,
    /// Worker threads (default 1: best batching, leaves cores to Redis).
    #[arg(long, env = "ACKPROXY_THREADS")]
    pub threads: Option<usize>,
    /// Prometheus endpoint address, e.g. 127.0.0.1:9121.
    #[arg(long, env = "ACKPROXY_METRICS")]
    pub metrics: Option<String>,
    /// Log format: human or json.
    #[arg(long, env = "ACKPROXY_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    /// Validate the configuration, print a summary and exit.
    #[arg(long)]
    pub check_config: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Human,
    Json,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub listen: String,
    pub upstream: Option<String>,
    pub upstream_password: Option<String>,
    pub upstream_user: Option<String>,
    pub shared_connections: usize,
    pub dedicated_per_client: bool,
    pub threads: Option<usize>,
    pub metrics: Option<String>,
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
            upstream: None,
            upstream_password: None,
            upstream_user: None,
            shared_connections: 1,
            dedicated_per_client: false,
            threads: None,
            metrics: None,
            log_format: LogFormat::Human,
            connect_timeout_ms: 1000,
            limits: LimitsConfig::default(),
            embedded: EmbeddedConfig::default(),
            reaper: ReaperConfig::default(),
            queues: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
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

impl LimitsConfig {
    pub fn scanner_limits(&self) -> Limits {
        Limits {
            max_bulk_len: self.max_bulk_len,
            max_array_len: self.max_array_len,
            max_inline_len: self.max_inline_len,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
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

#[derive(Debug, Clone, Deserialize)]
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

#[derive(Debug, Clone, Deserialize)]
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
}

impl QueueRule {
    /// Whether each lease records the connection that took it.
    pub fn tracks_connections(&self) -> bool {
        self.ack == AckPolicy::NextPop || self.requeue_on_disconnect
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
fn default_ack_id() -> AckId {
    AckId::Payload
}

impl Config {
    /// File (if any) first, then command-line and environment overrides.
    pub fn load(cli: &Cli) -> Result<Config, String> {
        let mut cfg = match &cli.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                Config::from_toml(&text).map_err(|e| format!("{}: {e}", path.display()))?
            }
            None => Config::default(),
        };
        if let Some(v) = &cli.listen {
            cfg.listen = v.clone();
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
        if cli.dedicated_per_client {
            cfg.dedicated_per_client = true;
        }
        if let Some(v) = cli.threads {
            cfg.threads = Some(v);
        }
        if let Some(v) = &cli.metrics {
            cfg.metrics = Some(v.clone());
        }
        if let Some(v) = cli.log_format {
            cfg.log_format = v;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn from_toml(text: &str) -> Result<Config, String> {
        let cfg: Config = toml::from_str(text).map_err(|e| e.to_string())?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), String> {
        use std::net::ToSocketAddrs;
        if self.listen.to_socket_addrs().is_err() {
            return Err(format!(
                "listen: {:?} is not a host:port address",
                self.listen
            ));
        }
        if let Some(m) = &self.metrics {
            if m.parse::<std::net::SocketAddr>().is_err() {
                return Err(format!("metrics: {m:?} is not an ip:port address"));
            }
        }
        if self.shared_connections == 0 {
            return Err("shared_connections must be at least 1".into());
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
        Ok(())
    }

    /// Every setting and rule, as `--check-config` prints it.
    pub fn summary(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let on = |b: bool| if b { "yes" } else { "no" };
        let _ = writeln!(s, "listen              {}", self.listen);
        match &self.upstream {
            Some(u) => {
                let _ = writeln!(s, "upstream            {u}");
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
                    "{} shared, dedicated when stateful",
                    self.shared_connections
                )
            }
        );
        let _ = writeln!(s, "threads             {}", self.threads.unwrap_or(1));
        let _ = writeln!(
            s,
            "metrics             {}",
            self.metrics.as_deref().unwrap_or("off")
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
                "queue {:?}: lease {} ms, max deliveries {}, ack id {}, ack {}{}, \
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

    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
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
        assert!(Config::from_toml("listen = \"127.0.0.1:7000\"").is_ok());
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
    fn retry_policies_are_checked() {
        let rule = |extra: &str| Config::from_toml(&format!("[[queue]]\npattern = \"q\"\n{extra}"));
        assert!(rule("retry_backoff = \"exp\"\nretry_base_ms = 100\nretry_max_ms = 800\n").is_ok());
        assert!(rule("retry_backoff = \"fixed\"\nretry_base_ms = 0\n").is_err());
        assert!(rule("retry_backoff = \"exp\"\nretry_base_ms = 100\nretry_max_ms = 50\n").is_err());
        assert!(rule("retry_jitter = 1.5\n").is_err());
        assert!(rule("retry_backoff = \"linear\"\n").is_err());
    }
}
