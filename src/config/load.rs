//! A configuration from the file, then the command line and environment.

use std::path::PathBuf;

use serde::Deserialize;

use super::check::Origin;
use super::cli::Cli;
use super::rule::QueueRule;
use super::settings::Config;

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
