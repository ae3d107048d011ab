//! The command line, whose flags also come from `ACKPROXY_*` variables.

use std::path::PathBuf;

use clap::Parser;

use super::settings::{AuthClients, Config, LogFormat, UpstreamMode};

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
    /// Validate the configuration (syntax, values, the settings that go
    /// together, the TLS files), print a summary and exit. Binds nothing:
    /// the file of a proxy that is running passes.
    #[arg(long)]
    pub check_config: bool,
    /// Also bind the listen, tls_listen and metrics addresses for a moment,
    /// and report each that cannot be bound (implies --check-config).
    #[arg(long)]
    pub check_bind: bool,
    #[command(subcommand)]
    pub generate: Option<Generate>,
}

/// Files made from the command-line definition, for packages.
#[derive(clap::Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum Generate {
    /// Writes the man page or a shell's completions, for packages:
    /// generate man DIR, generate completions SHELL DIR.
    ///
    /// Writes the man page, DIR/ackproxy.1, or the completion script of
    /// SHELL into DIR, made from these flags.
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
pub(super) fn name_env_source(
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
