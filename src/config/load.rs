//! A configuration from the file, then the command line and environment.

use std::path::PathBuf;

use serde::Deserialize;

use super::check::Origin;
use super::cli::Cli;
use super::parse_error;
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
                let cfg = toml::from_str::<Config>(&t).map_err(|e| {
                    parse_error::describe(&e, &t, Some(&path.display().to_string()))
                })?;
                text = Some(t);
                cfg
            }
            None => Config::default(),
        };
        let mut rules_text = None;
        if let Some(v) = &cli.queues {
            cfg.queues = queue_rules(v, &given_by("queues", Some(v)))?;
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
        let rules_from = cli.queues.as_ref().map(|v| given_by("queues", Some(v)));
        let mut origin = Origin {
            file: path.as_deref(),
            text: text.as_deref(),
            given: Vec::new(),
            rules: rules_text.map(|t| (rules_from.as_deref().unwrap_or_default(), t)),
        };
        origin.given = given_settings(cli);
        let warnings = cfg.validate_at(&origin)?;
        Ok((cfg, warnings))
    }

    pub fn from_toml(text: &str) -> Result<Config, String> {
        Config::from_toml_with_warnings(text).map(|(cfg, _)| cfg)
    }

    /// As [`Config::from_toml`], with what [`Config::load`] would warn
    /// about; messages give lines of `text`.
    pub fn from_toml_with_warnings(text: &str) -> Result<(Config, Vec<String>), String> {
        let cfg: Config =
            toml::from_str(text).map_err(|e| parse_error::describe(&e, text, None))?;
        let origin = Origin {
            text: Some(text),
            ..Origin::default()
        };
        let warnings = cfg.validate_at(&origin)?;
        Ok((cfg, warnings))
    }
}

/// The settings the command line or the environment gave, each with the
/// flag or variable that gave it: a message about one names that, not the
/// file the value did not come from.
fn given_settings(cli: &Cli) -> Vec<(&'static str, String)> {
    let text = |v: &Option<String>| v.clone();
    let number = |v: Option<usize>| v.map(|n| n.to_string());
    let list = |v: &Option<Vec<String>>| v.as_ref().map(|v| v.join(","));
    let path = |v: &Option<PathBuf>| v.as_ref().map(|p| p.display().to_string());
    let values: Vec<(&'static str, Option<String>)> = vec![
        ("listen", text(&cli.listen)),
        ("tls_listen", text(&cli.tls_listen)),
        ("upstream", text(&cli.upstream)),
        ("upstream_password", text(&cli.upstream_password)),
        ("metrics", text(&cli.metrics)),
        ("threads", number(cli.threads)),
        ("shared_connections", number(cli.shared_connections)),
        ("user_connections_max", number(cli.user_connections_max)),
        ("dedicated_pool", number(cli.dedicated_pool)),
        ("ops_max_connections", number(cli.ops_max_connections)),
        ("ops_allowed_hosts", list(&cli.ops_allowed_hosts)),
        ("admin_token", text(&cli.admin_token)),
        ("requirepass", text(&cli.requirepass)),
        ("sentinel_master", text(&cli.sentinel_master)),
        ("sentinels", list(&cli.sentinels)),
        ("cluster_announce", list(&cli.cluster_announce)),
        ("sentinel_user", text(&cli.sentinel_user)),
        ("sentinel_password", text(&cli.sentinel_password)),
        ("embedded.dir", path(&cli.embedded_dir)),
        ("tls_cert_file", path(&cli.tls_cert_file)),
        ("tls_key_file", path(&cli.tls_key_file)),
        ("tls_ca_cert_file", path(&cli.tls_ca_cert_file)),
        (
            "upstream_tls_ca_cert_file",
            path(&cli.upstream_tls_ca_cert_file),
        ),
        ("upstream_tls_cert_file", path(&cli.upstream_tls_cert_file)),
        ("upstream_tls_key_file", path(&cli.upstream_tls_key_file)),
        (
            "upstream_tls_server_name",
            text(&cli.upstream_tls_server_name),
        ),
        (
            "sentinel_tls_ca_cert_file",
            path(&cli.sentinel_tls_ca_cert_file),
        ),
        ("sentinel_tls_cert_file", path(&cli.sentinel_tls_cert_file)),
        ("sentinel_tls_key_file", path(&cli.sentinel_tls_key_file)),
        (
            "sentinel_tls_server_name",
            text(&cli.sentinel_tls_server_name),
        ),
    ];
    let mut given: Vec<(&'static str, String)> = values
        .into_iter()
        .filter_map(|(key, v)| v.map(|v| (key, given_by(key, Some(&v)))))
        .collect();
    // Switches and choices: given when set, by whichever holds them.
    let set = [
        ("upstream_tls", cli.upstream_tls),
        ("sentinel_tls", cli.sentinel_tls),
        ("ops_public", cli.ops_public),
        ("dedicated_per_client", cli.dedicated_per_client),
        ("embedded.persistence", cli.embedded_persistence),
        ("upstream_mode", cli.upstream_mode.is_some()),
        ("tls_auth_clients", cli.tls_auth_clients.is_some()),
        ("log_format", cli.log_format.is_some()),
    ];
    given.extend(
        set.into_iter()
            .filter(|(_, set)| *set)
            .map(|(key, _)| (key, given_by(key, None))),
    );
    given
}

/// Which gave the setting `key` (`embedded.dir` for `--embedded-dir`) that
/// the command line overrides with `value`: its `ACKPROXY_*` variable when
/// that holds the value (or, without one, is set) and the flag is not on
/// the command line, else the flag.
fn given_by(key: &str, value: Option<&str>) -> String {
    let long = key.replace(['.', '_'], "-");
    let flag = format!("--{long}");
    let var = format!("ACKPROXY_{}", long.replace('-', "_").to_uppercase());
    let on_command_line = std::env::args()
        .skip(1)
        .any(|a| a == flag || a.starts_with(&format!("{flag}=")));
    let in_env = std::env::var(&var).is_ok_and(|v| value.is_none_or(|value| v == value));
    if !on_command_line && in_env {
        var
    } else {
        flag
    }
}

/// Queue rules given as TOML text (by `from`, a flag or variable):
/// `[[queue]]` tables, or `queue = [...]`.
fn queue_rules(text: &str, from: &str) -> Result<Vec<QueueRule>, String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Rules {
        #[serde(default)]
        queue: Vec<QueueRule>,
    }
    toml::from_str::<Rules>(text)
        .map(|r| r.queue)
        .map_err(|e| parse_error::describe(&e, text, Some(from)))
}
