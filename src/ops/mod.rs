//! The operations server, on the `metrics` address: Prometheus text at
//! `/metrics` (rendered through the exporter's handle), a queue web view at
//! `/` (one static page, no build step), and its JSON API under `/api/`
//! (see [`api`]). Loopback-only unless `ops_public` is set.

mod api;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::Config;
use crate::error::StartError;
use crate::queue::Queues;
use crate::upstream::Endpoint;

const PAGE: &str = include_str!("page.html");

/// How often the exporter drains its histogram buckets; without it they
/// grow with every observation between scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The recorder installed and the address bound, before the queue
/// machinery exists; [`Prepared::spawn`] starts serving.
pub struct Prepared {
    listener: TcpListener,
    handle: PrometheusHandle,
}

/// Installs the metrics recorder and binds the operations address, so a
/// bad address fails start-up, and every series exists from the first
/// event on. `None` when no operations address is configured.
pub async fn prepare(config: &Config) -> Result<Option<Prepared>, StartError> {
    let Some(addr) = &config.metrics else {
        return Ok(None);
    };
    let addr: SocketAddr = addr
        .parse()
        .map_err(|e| StartError::Config(format!("metrics address {addr:?}: {e}")))?;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| StartError::Bind(addr.to_string(), e))?;
    let handle = crate::telemetry::builder()
        .install_recorder()
        .map_err(|e| StartError::Config(format!("metrics recorder: {e}")))?;
    Ok(Some(Prepared { listener, handle }))
}

impl Prepared {
    /// Serves until `stop` turns true.
    pub fn spawn(
        self,
        config: &Config,
        endpoint: Arc<Endpoint>,
        queues: Arc<Queues>,
        mut stop: watch::Receiver<bool>,
    ) {
        let state = Arc::new(api::Ops {
            handle: self.handle.clone(),
            queues,
            endpoint,
            admin_token: config.admin_token.clone(),
        });
        let app = router(state, config.ops_public);
        let handle = self.handle;
        let mut upkeep_stop = stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = upkeep_stop.changed() => return,
                    _ = tokio::time::sleep(UPKEEP_EVERY) => handle.run_upkeep(),
                }
            }
        });
        let listener = self.listener;
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, "operations server: http://{addr}/ (metrics at /metrics)");
        }
        tokio::spawn(async move {
            let server = axum::serve(listener, app);
            tokio::select! {
                r = server => if let Err(e) = r {
                    tracing::error!("operations server stopped: {e}");
                },
                _ = stop.wait_for(|s| *s) => {}
            }
        });
    }
}

fn router(state: Arc<api::Ops>, public: bool) -> Router {
    let app = Router::new()
        .route("/", get(page))
        .route("/metrics", get(metrics))
        .route("/api/queues", get(api::queues))
        .route("/api/queues/{key}", get(api::info))
        .route("/api/queues/{key}/leases", get(api::leases))
        .route("/api/queues/{key}/dead", get(api::dead))
        .route("/api/queues/{key}/redrive", post(api::redrive))
        .route("/api/queues/{key}/purge", post(api::purge))
        .with_state(state);
    if public {
        app
    } else {
        app.layer(middleware::from_fn(local_host_only))
    }
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            // Everything the page needs is inline or on this origin.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; frame-ancestors 'none'",
            ),
        ],
        PAGE,
    )
        .into_response()
}

async fn metrics(State(ops): State<Arc<api::Ops>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        {
            let mut text = ops.handle.render();
            crate::telemetry::render(&mut text);
            text
        },
    )
        .into_response()
}

/// On a loopback address, a request must name the host by IP address or
/// as `localhost`: a web page whose name an attacker re-points at 127.0.0.1
/// (DNS rebinding) sends its own name and cannot read the queues.
async fn local_host_only(headers: HeaderMap, req: Request, next: Next) -> Response {
    match headers.get(header::HOST) {
        Some(h) if !is_local_host(h) => (
            StatusCode::FORBIDDEN,
            "the operations server answers requests for an IP address or localhost only\n",
        )
            .into_response(),
        _ => next.run(req).await,
    }
}

fn is_local_host(h: &HeaderValue) -> bool {
    let Ok(h) = h.to_str() else {
        return false;
    };
    if h.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    let host = match h.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => h,
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_named_by_address_or_localhost_pass() {
        for ok in [
            "127.0.0.1:9121",
            "localhost",
            "LOCALHOST:80",
            "[::1]:9121",
            "::1",
        ] {
            assert!(is_local_host(&HeaderValue::from_static(ok)), "{ok}");
        }
        for bad in ["evil.example:9121", "evil.example", "127.0.0.1.nip.io:80"] {
            assert!(!is_local_host(&HeaderValue::from_static(bad)), "{bad}");
        }
    }
}
