use clap::Parser;

use ackproxy::config::{Cli, Config, LogFormat};

fn main() {
    let cli = Cli::parse();
    let config = match Config::load(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ackproxy: {e}");
            std::process::exit(2);
        }
    };
    if cli.check_config {
        println!("configuration OK");
        println!("  listen: {}", config.listen);
        match &config.upstream {
            Some(u) => println!("  upstream: {u}"),
            None => println!(
                "  upstream: private redis-server ({})",
                config.embedded.redis_server
            ),
        }
        println!(
            "  connections: {}",
            if config.dedicated_per_client {
                "one upstream connection per client".to_string()
            } else {
                format!(
                    "{} shared, dedicated when stateful",
                    config.shared_connections
                )
            }
        );
        for q in &config.queues {
            println!(
                "  queue {:?}: lease {} ms, max deliveries {}, ack id {:?}",
                q.pattern, q.lease_ms, q.max_deliveries, q.ack_id
            );
        }
        return;
    }
    init_logging(config.log_format);
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

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
