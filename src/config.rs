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
    /// Operations address (`/metrics`, web view, JSON API), e.g. 127.0.0.1:9121.
    #[arg(long, env = "ACKPROXY_METRICS")]
    pub metrics: Option<String>,
    /// Allow a non-loopback operations address.
    #[arg(long, env = "ACKPROXY_OPS_PUBLIC")]
    pub ops_public: bool,
    /// Token the web view's REDRIVE and PURGE actions require
    /// (`Authorization: Bearer <token>`); without it they are refused.
    #[arg(long, env = "ACKPROXY_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
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
    /// The operations server's address: `/metrics`, the web view, the API.
    pub metrics: Option<String>,
    /// The operations server may listen on a non-loopback address.
    pub ops_public: bool,
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
            upstream: None,
            upstream_password: None,
            upstream_user: None,
            shared_connections: 1,
            dedicated_per_client: false,
            threads: None,
            metrics: None,
            ops_public: false,
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
}

fn default_lease_ms() -> u64 {
    30_000
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
        if cli.ops_public {
            cfg.ops_public = true;
        }
        if let Some(v) = &cli.admin_token {
            cfg.admin_token = Some(v.clone());
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
        if self.admin_token.as_deref() == Some("") {
            return Err("admin_token is empty; leave it out to disable the actions".into());
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
            "operations          {}",
            match &self.metrics {
                None => "off".to_string(),
                Some(m) => format!(
                    "http://{m}/ (metrics, web view, API), {}",
                    if self.ops_public {
                        "public allowed"
                    } else {
                        "loopback only"
                    }
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
            let _ = writeln!(
                s,
                "queue {:?}: lease {} ms, max deliveries {}, ack id {}, redeliver {}, \
                 consumers pop from the {}, dead letters {}",
                q.pattern,
                q.lease_ms,
                q.max_deliveries,
                match &q.ack_id {
                    AckId::Payload => "the whole payload".to_string(),
                    AckId::JsonField(f) => format!("JSON field {f:?}"),
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
                    .unwrap_or_else(|| "in the default list (`{queue}:dead`)".to_string())
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
        let public = Config::from_toml("metrics = \"0.0.0.0:9121\"").unwrap_err();
        assert!(public.contains("ops_public"), "{public}");
        assert!(Config::from_toml("metrics = \"[::1]:9121\"").is_ok());
        assert!(Config::from_toml("metrics = \"0.0.0.0:9121\"\nops_public = true").is_ok());
        assert!(Config::from_toml("listen = \"127.0.0.1:7000\"").is_ok());
    }

    #[test]
    fn summary_says_the_admin_token_is_set_never_its_value() {
        let cfg = Config::from_toml("metrics = \"127.0.0.1:9121\"\nadmin_token = \"s3cret-t0ken\"")
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
    }
}
