use ackproxy::config::{Cli, Config, LogFormat};

fn main() {
    let cli = Cli::parse_args();
    let (config, warnings) = match Config::load_with_warnings(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ackproxy: {e}");
            std::process::exit(2);
        }
    };
    if cli.check_config {
        print_out(&config.summary());
        for w in &warnings {
            eprintln!("ackproxy: warning: {w}");
        }
        if config.upstream.is_none()
            && ackproxy::embedded::find_binary(&config.embedded.redis_server).is_none()
        {
            eprintln!(
                "ackproxy: {}",
                ackproxy::error::StartError::RedisServerMissing(
                    config.embedded.redis_server.clone()
                )
            );
            std::process::exit(2);
        }
        let tls = ackproxy::net::tls::acceptor(&config)
            .and_then(|_| ackproxy::net::tls::UpstreamTls::from_config(&config));
        if let Err(e) = tls {
            eprintln!("ackproxy: {e}");
            std::process::exit(2);
        }
        for addr in std::iter::once(&config.listen)
            .filter(|a| !a.is_empty())
            .chain(&config.tls_listen)
        {
            if let Err(e) = std::net::TcpListener::bind(addr) {
                eprintln!("ackproxy: cannot listen on {addr}: {e}");
                std::process::exit(2);
            }
        }
        print_out("configuration OK\n");
        return;
    }
    if config.queues.is_empty() {
        eprintln!(
            "ackproxy: no [[queue]] rules: every command passes through unchanged \
             (see config/ackproxy.toml for examples)"
        );
    }
    init_logging(config.log_format);
    for w in &warnings {
        tracing::warn!("{w}");
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
    let rt = rt.enable_all().build().expect("tokio runtime");
    if let Err(e) = rt.block_on(ackproxy::app::run_with_reload(config, Some(cli))) {
        eprintln!("ackproxy: {e}");
        std::process::exit(1);
    }
}

/// Writes `text` to stdout. A reader that has gone (`| head -1`) ends the
/// output, quietly: what is left to say is the exit status.
fn print_out(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => {
            eprintln!("ackproxy: cannot write to stdout: {e}");
            std::process::exit(2);
        }
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
        LogFormat::Json => builder.json().init(),
    }
}
