use std::io::Write;

use ackproxy::config::{Cli, Config, Generate, GenerateWhat, LogFormat};
use tracing::Level;

mod man;

fn main() {
    let cli = Cli::parse_args();
    if let Some(Generate::Generate { what }) = &cli.generate {
        if let Err(e) = generate(what) {
            fatal(LogFormat::Human, &e, 1);
        }
        return;
    }
    let (config, warnings) = match Config::load_with_warnings(&cli) {
        Ok(c) => c,
        Err(e) => fatal(requested_log_format(&cli), &e, 2),
    };
    let format = config.log_format;
    if cli.check_config || cli.check_bind {
        check(&config, &warnings, cli.check_bind);
        return;
    }
    init_logging(format);
    for w in &warnings {
        tracing::warn!("{w}");
    }
    if config.queues.is_empty() {
        tracing::warn!(
            "no [[queue]] rules: every command passes through unchanged \
             (see config/ackproxy.toml for examples)"
        );
    }
    // One thread by default: it batches best (clients' requests gather into
    // one upstream write) and leaves the other cores to Redis; see
    // bench/RESULTS.md for the measurements behind this.
    let threads = config.threads.unwrap_or(1).max(1);
    let mut rt = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    let rt = match rt.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => fatal(format, &format!("cannot start the runtime: {e}"), 1),
    };
    if let Err(e) = rt.block_on(ackproxy::app::run_with_reload(config, Some(cli))) {
        fatal(format, &e.to_string(), 1);
    }
}

/// `ackproxy generate …`: the man page or a shell's completions, made from
/// the command-line definition, for packages to install.
fn generate(what: &GenerateWhat) -> Result<(), String> {
    // The proxy as a user runs it: without the packagers' subcommand,
    // which the man page's synopsis and the completions would otherwise
    // offer.
    let full = Cli::definition();
    let mut cmd = full
        .get_arguments()
        .fold(clap::Command::new("ackproxy"), |c, a| c.arg(a.clone()))
        .version(env!("ACKPROXY_VERSION"))
        .about(full.get_about().map(|a| a.to_string()).unwrap_or_default())
        .long_about(
            full.get_long_about()
                .map(|a| a.to_string())
                .unwrap_or_default(),
        );
    let dir = match what {
        GenerateWhat::Man { dir } | GenerateWhat::Completions { dir, .. } => dir,
    };
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let written = match what {
        GenerateWhat::Man { .. } => {
            let path = dir.join("ackproxy.1");
            let page = man::page(cmd).map_err(|e| format!("man page: {e}"))?;
            std::fs::write(&path, page).map_err(|e| format!("{}: {e}", path.display()))?;
            path
        }
        GenerateWhat::Completions { shell, .. } => {
            clap_complete::generate_to(*shell, &mut cmd, "ackproxy", dir)
                .map_err(|e| format!("{}: {e}", dir.display()))?
        }
    };
    print_out(LogFormat::Human, &format!("{}\n", written.display()));
    Ok(())
}

/// `--check-config`: the summary on stdout, then whatever would stop the
/// start. Exits 2 on the first problem of the configuration itself. With
/// `bind` (`--check-bind`), also every address that cannot be bound, all of
/// them before the exit: nothing else binds, so that the file of a proxy
/// already running (on those very addresses) passes the plain check.
fn check(config: &Config, warnings: &[String], bind: bool) {
    let format = config.log_format;
    print_out(format, &config.summary());
    for w in warnings {
        say(format, Level::WARN, w);
    }
    if config.runs_embedded()
        && ackproxy::embedded::find_binary(&config.embedded.redis_server).is_none()
    {
        let missing =
            ackproxy::error::StartError::RedisServerMissing(config.embedded.redis_server.clone());
        fatal(format, &missing.to_string(), 2);
    }
    let tls = ackproxy::net::tls::acceptor(config)
        .and_then(|_| ackproxy::net::tls::UpstreamTls::from_config(config))
        .and_then(|_| ackproxy::net::tls::UpstreamTls::for_sentinels(config));
    if let Err(e) = tls {
        fatal(format, &e.to_string(), 2);
    }
    if bind {
        // Held until all are tried: two settings naming one address cannot
        // both be bound at start-up either.
        let mut held = Vec::new();
        let mut failed = 0;
        for (key, addr) in config.bound_addresses() {
            match std::net::TcpListener::bind(addr) {
                Ok(l) => held.push(l),
                Err(e) => {
                    failed += 1;
                    say(
                        format,
                        Level::ERROR,
                        &format!("{key}: cannot bind {addr}: {e}"),
                    );
                }
            }
        }
        if failed > 0 {
            std::process::exit(2);
        }
        let bound: Vec<String> = config
            .bound_addresses()
            .iter()
            .map(|(key, addr)| format!("{key} {addr}"))
            .collect();
        print_out(
            format,
            &format!("addresses free      {}\n", bound.join(", ")),
        );
    }
    print_out(format, "configuration OK\n");
}

/// Writes `text` to stdout. A reader that has gone (`| head -1`) ends the
/// output, quietly: what is left to say is the exit status.
fn print_out(format: LogFormat, text: &str) {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => fatal(format, &format!("cannot write to stdout: {e}"), 2),
    }
}

/// A line on stderr outside the log proper (before it is set up, or with
/// none, as for `--check-config`): plain text for a person, a log line as
/// the others in JSON.
fn say(format: LogFormat, level: Level, message: &str) {
    match format {
        LogFormat::Human => {
            let warning = if level == Level::WARN {
                "warning: "
            } else {
                ""
            };
            // A closed stderr is not worth a panic.
            let _ = writeln!(std::io::stderr(), "ackproxy: {warning}{message}");
        }
        LogFormat::Json => {
            // Its own subscriber: RUST_LOG does not silence why the process
            // ends, and this works before and after `init_logging`.
            let json = tracing_subscriber::fmt()
                .json()
                .with_max_level(Level::TRACE)
                .with_writer(std::io::stderr)
                .finish();
            tracing::subscriber::with_default(json, || {
                if level == Level::WARN {
                    tracing::warn!("{message}");
                } else {
                    tracing::error!("{message}");
                }
            });
        }
    }
}

fn fatal(format: LogFormat, message: &str, code: i32) -> ! {
    say(format, Level::ERROR, message);
    std::process::exit(code)
}

/// The log format asked for where the configuration does not load: on the
/// command line, or in the file as far as it can be read.
fn requested_log_format(cli: &Cli) -> LogFormat {
    if let Some(f) = cli.log_format {
        return f;
    }
    let Some(text) = cli
        .config
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
    else {
        return LogFormat::Human;
    };
    let (doc, _) = toml::de::DeTable::parse_recoverable(&text);
    match doc
        .get_ref()
        .get("log_format")
        .map(|v| v.get_ref().as_str())
    {
        Some(Some("json")) => LogFormat::Json,
        _ => LogFormat::Human,
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    // Colour codes only where a person reads them, never in a log file.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => {
            builder.json().init();
            // A panic's message too is a JSON line.
            std::panic::set_hook(Box::new(|info| {
                say(LogFormat::Json, Level::ERROR, &format!("panic: {info}"));
            }));
        }
    }
}
