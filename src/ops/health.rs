//! Probes for supervisors: `/healthz` says the process answers, `/readyz`
//! whether it can do its work now. Neither needs the admin token (a probe
//! has none), both go through the Host check like every route.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::api::Ops;
use crate::queue::Queues;

/// A Redis that takes longer than this to answer a PING is not one to send
/// clients to; probes themselves usually give up after a few seconds.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// Why the proxy is not ready; the probe's answer names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// No PONG on the proxy's own connection.
    Upstream(String),
    /// Queue rules are in force and the proxy's function library is not in
    /// Redis and could not be loaded, or Redis could not say.
    Library(String),
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::Upstream(why) => write!(f, "upstream: {why}"),
            NotReady::Library(why) => write!(f, "queue library: {why}"),
        }
    }
}

fn plain(status: StatusCode, text: String) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        text,
    )
        .into_response()
}

/// Answers while the process runs: nothing here waits on Redis, so a
/// supervisor does not restart the proxy for Redis's outage.
pub async fn healthz() -> Response {
    plain(StatusCode::OK, "ok\n".into())
}

pub async fn readyz(State(ops): State<Arc<Ops>>) -> Response {
    match tokio::time::timeout(READY_TIMEOUT, readiness(&ops.queues)).await {
        Ok(Ok(())) => plain(StatusCode::OK, "ready\n".into()),
        Ok(Err(e)) => plain(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")),
        Err(_) => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: upstream: no reply within {READY_TIMEOUT:?}\n"),
        ),
    }
}

async fn readiness(queues: &Queues) -> Result<(), NotReady> {
    match super::ask(queues, &[b"PING"]).await {
        Ok(redis::Value::SimpleString(s)) if s == "PONG" => {}
        Ok(other) => return Err(NotReady::Upstream(format!("PING answered {other:?}"))),
        Err(e) => return Err(NotReady::Upstream(e)),
    }
    if queues.active() {
        match library_loaded(queues).await {
            Ok(true) => {}
            Ok(false) => return Err(NotReady::Library("not loaded in Redis".into())),
            Err(e) => return Err(NotReady::Library(e)),
        }
    }
    Ok(())
}

/// Whether Redis holds the proxy's function library, loading it if it
/// does not: the proxy loads it when a queue operation first needs it, and
/// a proxy kept out of rotation until ready would never get that far.
pub async fn library_loaded(queues: &Queues) -> Result<bool, String> {
    if listed(queues).await? {
        return Ok(true);
    }
    queues.forget_library();
    queues.ensure_library().await;
    listed(queues).await
}

async fn listed(queues: &Queues) -> Result<bool, String> {
    let name = crate::queue::library::library().name.as_bytes();
    match super::ask(queues, &[b"FUNCTION", b"LIST", b"LIBRARYNAME", name]).await? {
        redis::Value::Array(found) => Ok(!found.is_empty()),
        other => Err(format!("FUNCTION LIST answered {other:?}")),
    }
}
