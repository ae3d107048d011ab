//! Start-up and shutdown: upstream (or the embedded one), metrics, queue
//! machinery, the listener, and signals.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::Config;
use crate::embedded::EmbeddedRedis;
use crate::error::StartError;
use crate::queue::Queues;
use crate::server;
use crate::session::Context;
use crate::upstream::Endpoint;

/// Runs the proxy until SIGTERM or SIGINT.
pub async fn run(config: Config) -> Result<(), StartError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("signal received, stopping");
        let _ = stop_tx.send(true);
    });
    let running = start(config, stop_rx).await?;
    running.await
}

/// Binds, starts everything, and returns the future that serves until
/// `stop` turns true, plus the bound address (through the log).
pub async fn start(
    mut config: Config,
    stop: watch::Receiver<bool>,
) -> Result<impl std::future::Future<Output = Result<(), StartError>>, StartError> {
    let embedded = match &config.upstream {
        Some(_) => None,
        None => {
            let e = EmbeddedRedis::start(&config.embedded).await?;
            config.upstream = Some(e.addr.clone());
            Some(e)
        }
    };
    if let Some(addr) = &config.metrics {
        let addr: SocketAddr = addr
            .parse()
            .map_err(|e| StartError::Config(format!("metrics address {addr:?}: {e}")))?;
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .install()
            .map_err(|e| StartError::Config(format!("metrics endpoint: {e}")))?;
        crate::telemetry::register(&config.queues);
    }
    let endpoint = Arc::new(Endpoint {
        addr: config.upstream.clone().expect("upstream set above"),
        user: config.upstream_user.clone(),
        password: config.upstream_password.clone(),
        connect_timeout: config.connect_timeout(),
        scripts: (!config.queues.is_empty()).then(crate::queue::scripts::preload),
        connected: Arc::new(tokio::sync::Notify::new()),
    });
    // Routing follows Redis's own command table when it can be read, and
    // reads it again whenever a shared connection opens.
    crate::command::table::load(&endpoint).await;
    crate::command::table::keep_fresh(endpoint.clone());
    let listener = TcpListener::bind(&config.listen)
        .await
        .map_err(|e| StartError::Bind(config.listen.clone(), e))?;
    let config = Arc::new(config);
    let queues = Queues::start(&config, endpoint.clone(), stop.clone())
        .await
        .map(Arc::new);
    tracing::info!(
        listen = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        upstream = %endpoint.addr,
        queue_rules = config.queues.len(),
        "ackproxy ready"
    );
    let ctx = Arc::new(Context::new(config, endpoint, queues, stop.clone()));
    Ok(async move {
        server::serve(listener, ctx, stop).await;
        if let Some(e) = embedded {
            e.stop().await;
        }
        Ok(())
    })
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
