//! Start-up and shutdown: upstream (or the embedded one), the operations
//! server (metrics, web view), queue machinery, the listener, and signals.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::{Cli, Config, QueueRule, UpstreamMode};
use crate::embedded::EmbeddedRedis;
use crate::error::StartError;
use crate::queue::Queues;
use crate::server;
use crate::session::Context;
use crate::upstream::sentinel::Sentinels;
use crate::upstream::topology::Address;
use crate::upstream::{Credentials, Endpoint};

/// Runs the proxy until SIGTERM or SIGINT.
pub async fn run(config: Config) -> Result<(), StartError> {
    run_with_reload(config, None).await
}

/// Like [`run`]; with the command line the configuration came from, SIGHUP
/// reloads the configuration from it (see [`reload_on_hangup`]).
pub async fn run_with_reload(config: Config, cli: Option<Cli>) -> Result<(), StartError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        crate::upstream::shared::stopping();
        tracing::info!("signal received, stopping");
        let _ = stop_tx.send(true);
    });
    let running = start_inner(config, stop_rx, cli).await?;
    running.await
}

/// Binds, starts everything, and returns the future that serves until
/// `stop` turns true, plus the bound address (through the log).
pub async fn start(
    config: Config,
    stop: watch::Receiver<bool>,
) -> Result<impl std::future::Future<Output = Result<(), StartError>>, StartError> {
    start_inner(config, stop, None).await
}

async fn start_inner(
    mut config: Config,
    stop: watch::Receiver<bool>,
    reload: Option<Cli>,
) -> Result<impl std::future::Future<Output = Result<(), StartError>>, StartError> {
    // Listening from the start: SIGHUP's default action would end the
    // process. Reloads compare with the configuration as loaded, before a
    // private redis-server fills in `upstream`.
    let reload = match reload {
        Some(cli) => {
            use tokio::signal::unix::{signal, SignalKind};
            let hup = signal(SignalKind::hangup())
                .map_err(|e| StartError::Config(format!("cannot listen for SIGHUP: {e}")))?;
            Some((hup, cli, config.clone()))
        }
        None => None,
    };
    let sentinel = config.upstream_mode == UpstreamMode::Sentinel;
    let cluster_seeds =
        (config.upstream_mode == UpstreamMode::Cluster).then(|| config.cluster_seeds());
    let embedded = if config.runs_embedded() {
        let e = EmbeddedRedis::start(&config.embedded).await?;
        config.upstream = Some(e.addr.clone());
        Some(e)
    } else {
        None
    };
    let ops = crate::ops::prepare(&config).await?;
    // Also without an operations address: the rules' recent ack latencies
    // feed QUEUE INFO; the series themselves are then no-ops.
    crate::telemetry::register(&config.queues, config.metrics.is_some());
    // Bad TLS files stop the start before anything connects or listens.
    let tls_error = |e: crate::net::tls::TlsError| StartError::Config(e.to_string());
    let acceptor = crate::net::tls::acceptor(&config).map_err(tls_error)?;
    let upstream_tls = crate::net::tls::UpstreamTls::from_config(&config).map_err(tls_error)?;
    let sentinel_tls = crate::net::tls::UpstreamTls::for_sentinels(&config).map_err(tls_error)?;
    let addr = match &config.sentinel_master {
        Some(master) if sentinel => Address::following(master.clone()),
        _ => match &cluster_seeds {
            // The first seed answers the proxy's own questions (the command
            // table, whether clients must log in): every node of a cluster
            // has the same answers.
            Some(seeds) => Address::fixed(seeds[0].clone()),
            None => Address::fixed(config.upstream.clone().expect("upstream set above")),
        },
    };
    let endpoint = Arc::new(Endpoint {
        addr,
        credentials: std::sync::RwLock::new(Credentials {
            user: config.upstream_user.clone(),
            password: config.upstream_password.clone(),
        }),
        connect_timeout: config.connect_timeout(),
        tls: upstream_tls,
        opened: Default::default(),
        connected: Arc::new(tokio::sync::Notify::new()),
    });
    if sentinel {
        // The primary first: everything below talks to it.
        let sentinels = Sentinels::new(&config, endpoint.clone(), sentinel_tls);
        sentinels
            .start(config.connect_timeout() * 5, stop.clone())
            .await;
    }
    let cluster = match cluster_seeds {
        Some(seeds) => Some(
            crate::cluster::topology::Topology::start(endpoint.clone(), seeds, stop.clone())
                .await
                .map_err(|e| StartError::Cluster(format!("no slot map: {e}")))?,
        ),
        None => None,
    };
    // Routing follows Redis's own command table when it can be read, and
    // reads it again whenever a shared connection opens.
    crate::command::table::load(&endpoint).await;
    // Redis may have restarted (as another version, or now wanting a
    // password): each new shared connection has the command table and the
    // need to log in read again.
    let watched = endpoint.clone();
    tokio::spawn(async move {
        loop {
            watched.connected.notified().await;
            crate::command::table::load(&watched).await;
            crate::auth::probe(&watched).await;
        }
    });
    // Clients log in only if Redis wants them to; until it has said, they
    // must (see `auth::required`).
    let reached = crate::auth::probe(&endpoint).await.is_some();
    crate::telemetry::upstream_up(reached);
    let answered = (!reached).then(|| crate::auth::spawn_probe(endpoint.clone()));
    let mut listeners = Vec::new();
    if !config.listen.is_empty() {
        listeners.push(bind(&config.listen, None).await?);
    }
    if let Some(addr) = &config.tls_listen {
        listeners.push(bind(addr, acceptor).await?);
    }
    let config = Arc::new(config);
    let queues =
        Arc::new(Queues::start(&config, endpoint.clone(), cluster.clone(), stop.clone()).await);
    if endpoint.addr.follows_sentinels() {
        let (endpoint, queues) = (endpoint.clone(), queues.clone());
        tokio::spawn(async move {
            loop {
                endpoint.addr.moved_from(endpoint.addr.generation()).await;
                queues.after_switch().await;
            }
        });
    }
    let address = |tls: bool| {
        listeners
            .iter()
            .find(|l| l.tls.is_some() == tls)
            .and_then(|l| l.tcp.local_addr().ok())
            .map(|a| a.to_string())
            .unwrap_or_else(|| "off".into())
    };
    let (listen, tls_listen) = (address(false), address(true));
    let (upstream, upstream_tls) = (endpoint.addr.to_string(), endpoint.tls.is_some());
    let rules = config.queues.len();
    let ready = move || {
        tracing::info!(
            listen = %listen,
            tls_listen = %tls_listen,
            upstream = %upstream,
            upstream_tls,
            queue_rules = rules,
            "ackproxy ready"
        );
    };
    match answered {
        None => ready(),
        // Clients are served meanwhile (with the upstream's error), but a
        // proxy that cannot reach Redis is not ready, as /readyz says.
        Some(answered) => {
            tracing::info!(
                upstream = %endpoint.addr,
                "ackproxy listening, not ready: waiting for the upstream to answer"
            );
            tokio::spawn(async move {
                if answered.await.is_ok() {
                    ready();
                }
            });
        }
    }
    if let Some(ops) = ops {
        ops.spawn(&config, queues.clone(), stop.clone());
    }
    let ctx = Arc::new(Context::new(
        config,
        endpoint,
        queues,
        stop.clone(),
        cluster,
    ));
    if let Some((hup, cli, loaded)) = reload {
        tokio::spawn(reload_on_hangup(hup, cli, loaded, ctx.clone()));
    }
    Ok(async move {
        server::serve(listeners, ctx, stop).await;
        crate::upstream::shared::stopping();
        if let Some(e) = embedded {
            e.stop().await;
        }
        Ok(())
    })
}

async fn bind(
    addr: &str,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> Result<server::Listener, StartError> {
    let tcp = TcpListener::bind(addr)
        .await
        .map_err(|e| StartError::Bind(addr.to_string(), e))?;
    Ok(server::Listener { tcp, tls })
}

/// SIGHUP: the configuration file is read again (the command line still
/// overrides it). The queue rules, `[limits]` and the proxy's own
/// credentials (when changed in the file) take effect without dropping a
/// client; any other setting that changed waits for a restart, and says so.
/// A file that does not load changes nothing.
async fn reload_on_hangup(
    mut hup: tokio::signal::unix::Signal,
    cli: Cli,
    mut current: Config,
    ctx: Arc<Context>,
) {
    while hup.recv().await.is_some() {
        match Config::load(&cli) {
            Ok(next) => {
                apply(&mut current, next, &ctx).await;
                crate::telemetry::config_loaded(true);
            }
            Err(e) => {
                crate::telemetry::config_loaded(false);
                let file = cli
                    .config
                    .as_ref()
                    .map_or("(no file)".into(), |p| p.display().to_string());
                tracing::warn!(
                    "SIGHUP: configuration not reloaded from {file}, every setting stays as it was: {e}"
                );
            }
        }
    }
}

/// Puts what can change at run time of `next` in force; `current` becomes
/// what is in force.
async fn apply(current: &mut Config, next: Config, ctx: &Context) {
    for name in current.restart_only_changes(&next) {
        tracing::warn!("SIGHUP: {name} changed in the file; it takes effect at restart");
    }
    let rules = RuleChanges::between(&current.queues, &next.queues);
    if current.queues != next.queues {
        ctx.queues.replace_rules(&next.queues);
        crate::telemetry::register_rules(&rules.added);
    }
    let limits = current.limits.changes(&next.limits);
    if !limits.is_empty() {
        ctx.set_limits(next.limits.clone());
    }
    // The proxy's credentials only when the file's changed since the last
    // load: a password changed since through the proxy (`CONFIG SET
    // requirepass`, which it follows) is newer than an unchanged file.
    if next.upstream_user != current.upstream_user
        || next.upstream_password != current.upstream_password
    {
        let credentials = Credentials {
            user: next.upstream_user.clone(),
            password: next.upstream_password.clone(),
        };
        crate::auth::set_credentials(&ctx.endpoint, credentials);
    }
    crate::auth::probe(&ctx.endpoint).await;
    let limits = if limits.is_empty() {
        "limits unchanged".to_string()
    } else {
        format!("limits changed ({})", limits.join(", "))
    };
    tracing::info!(
        "configuration reloaded: {} queue rules ({} added, {} changed, {} removed), {limits}",
        next.queues.len(),
        rules.added.len(),
        rules.changed,
        rules.removed,
    );
    current.queues = next.queues;
    current.limits = next.limits;
    current.upstream_user = next.upstream_user;
    current.upstream_password = next.upstream_password;
}

/// How a reload changes the rules, rule by pattern.
struct RuleChanges {
    added: Vec<QueueRule>,
    changed: usize,
    removed: usize,
}

impl RuleChanges {
    fn between(old: &[QueueRule], new: &[QueueRule]) -> RuleChanges {
        let find = |rules: &[QueueRule], pattern: &str| -> Option<QueueRule> {
            rules.iter().find(|r| r.pattern == pattern).cloned()
        };
        let mut added = Vec::new();
        let mut changed = 0;
        for r in new {
            match find(old, &r.pattern) {
                None if find(&added, &r.pattern).is_none() => added.push(r.clone()),
                Some(o) if o != *r => changed += 1,
                _ => {}
            }
        }
        let removed = old
            .iter()
            .filter(|r| find(new, &r.pattern).is_none())
            .count();
        RuleChanges {
            added,
            changed,
            removed,
        }
    }
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
