//! The operations server, on the `metrics` address: Prometheus text at
//! `/metrics` (rendered through the exporter's handle), a queue web view at
//! `/` (one static page, no build step), its JSON API under `/api/` (see
//! [`api`]), and probes at `/healthz` and `/readyz` (see [`health`]).
//! Loopback-only unless `ops_public` is set; served within the limits of
//! [`serve`].

mod api;
mod health;
mod login;
mod serve;
mod session;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
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
    pub fn spawn(self, config: &Config, queues: Arc<Queues>, stop: watch::Receiver<bool>) {
        let state = Arc::new(api::Ops {
            handle: self.handle.clone(),
            queues,
            admin_token: config.admin_token.clone(),
            listing: api::Listing::default(),
            sessions: session::Sessions::default(),
        });
        let listener = self.listener;
        // The bind address decides, not `ops_public`: a loopback address
        // can be reached by any page in a browser on this host.
        let loopback = listener.local_addr().map_or(true, |a| a.ip().is_loopback());
        let hosts = Arc::new(HostPolicy::new(loopback, &config.ops_allowed_hosts));
        let app = router(state, hosts);
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
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, "operations server: http://{addr}/ (metrics at /metrics)");
        }
        let limits = serve::Limits::new(config.ops_max_connections);
        tokio::spawn(serve::run(listener, app, limits, stop));
    }
}

fn router(state: Arc<api::Ops>, hosts: Arc<HostPolicy>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/metrics", get(metrics))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/api/queues", get(api::queues))
        .route("/api/queues/{key}", get(api::info))
        .route("/api/queues/{key}/leases", get(api::leases))
        .route("/api/queues/{key}/dead", get(api::dead))
        .route("/api/queues/{key}/ready", get(api::ready))
        .route("/api/queues/{key}/delayed", get(api::delayed))
        .route("/api/queues/{key}/redrive", post(api::redrive))
        .route("/api/queues/{key}/purge", post(api::purge))
        .route("/api/queues/{key}/dead/retry", post(api::retry_one))
        .route("/api/queues/{key}/dead/delete", post(api::delete_one))
        .route("/api/session", get(login::status))
        .route("/api/login", post(login::login))
        .route("/api/logout", post(login::logout))
        .with_state(state)
        .layer(middleware::from_fn(session::same_origin))
        .layer(middleware::from_fn_with_state(hosts, host_check))
}

/// One command on the proxy's own connection, its reply as a value; an
/// error reply, no reply or an unreadable one as its text.
async fn ask(queues: &Queues, args: &[&[u8]]) -> Result<redis::Value, String> {
    let reply = queues.own_command(args).await.map_err(|e| e.to_string())?;
    if let Some(rest) = reply.strip_prefix(b"-") {
        let line = rest.split(|&b| b == b'\r').next().unwrap_or_default();
        return Err(String::from_utf8_lossy(line).into_owned());
    }
    match redis::parse_redis_value(&reply) {
        Ok(redis::Value::ServerError(e)) => Err(e.to_string()),
        Ok(v) => Ok(v),
        Err(e) => Err(format!("unreadable reply: {e}")),
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

/// Which names a request's `Host` may carry. IP addresses and `localhost`
/// always pass: a page can only send them from its own origin, never by
/// re-pointing a name of its own at this server (DNS rebinding). Other
/// names pass when listed, or, without a list, on a public address, whose
/// clients are other hosts under names the proxy cannot know.
#[derive(Debug, Clone)]
pub struct HostPolicy {
    any_name: bool,
    /// Lower case, without a trailing dot.
    names: Vec<String>,
}

impl HostPolicy {
    pub fn new(loopback: bool, allowed: &[String]) -> HostPolicy {
        HostPolicy {
            any_name: !loopback && allowed.is_empty(),
            names: allowed.iter().map(|n| normal_name(n)).collect(),
        }
    }

    fn allows(&self, host: &HeaderValue) -> bool {
        if self.any_name {
            return true;
        }
        let Some(name) = host_name(host) else {
            return false;
        };
        name.eq_ignore_ascii_case("localhost")
            || name.parse::<std::net::IpAddr>().is_ok()
            || self.names.contains(&normal_name(name))
    }
}

fn normal_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// The host part of a `Host` value: without the port, an IPv6 address
/// without its brackets.
fn host_name(h: &HeaderValue) -> Option<&str> {
    let h = h.to_str().ok()?;
    if h.parse::<std::net::IpAddr>().is_ok() {
        return Some(h);
    }
    let host = match h.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => h,
    };
    Some(
        host.strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host),
    )
}

/// Refuses a request whose `Host` the policy does not allow. A request
/// without one (HTTP/1.0) passes: browsers always send it.
async fn host_check(State(hosts): State<Arc<HostPolicy>>, req: Request, next: Next) -> Response {
    match req.headers().get(header::HOST) {
        Some(h) if !hosts.allows(h) => (
            StatusCode::FORBIDDEN,
            "the operations server answers requests for an IP address, localhost \
             or a name in ops_allowed_hosts only\n",
        )
            .into_response(),
        _ => next.run(req).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_loopback_hosts_named_by_address_or_localhost_pass() {
        let policy = HostPolicy::new(true, &[]);
        for ok in [
            "127.0.0.1:7380",
            "localhost",
            "LOCALHOST:80",
            "[::1]:7380",
            "::1",
        ] {
            assert!(policy.allows(&HeaderValue::from_static(ok)), "{ok}");
        }
        for bad in [
            "evil.example:7380",
            "evil.example",
            "127.0.0.1.nip.io:80",
            "",
            ":80",
        ] {
            assert!(!policy.allows(&HeaderValue::from_static(bad)), "{bad}");
        }
        let bytes = HeaderValue::from_bytes(b"\xffevil").unwrap();
        assert!(!policy.allows(&bytes));
    }

    #[test]
    fn listed_names_pass_anywhere_and_any_name_only_unlisted_and_public() {
        let listed = ["Ops.Example.com.".to_string()];
        for loopback in [true, false] {
            let policy = HostPolicy::new(loopback, &listed);
            for ok in [
                "ops.example.com",
                "OPS.EXAMPLE.COM:443",
                "ops.example.com.",
                "10.0.0.5",
            ] {
                assert!(policy.allows(&HeaderValue::from_static(ok)), "{ok}");
            }
            for bad in [
                "example.com",
                "ops.example.com.evil.example",
                "evil.example",
            ] {
                assert!(!policy.allows(&HeaderValue::from_static(bad)), "{bad}");
            }
        }
        let public = HostPolicy::new(false, &[]);
        assert!(public.allows(&HeaderValue::from_static("anything.example")));
    }
}
