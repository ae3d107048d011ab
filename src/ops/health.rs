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
    /// Queue rules are in force and Redis lacks the proxy's scripts, or
    /// could not say whether it has them.
    Scripts(String),
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::Upstream(why) => write!(f, "upstream: {why}"),
            NotReady::Scripts(why) => write!(f, "queue scripts: {why}"),
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
        match scripts_loaded(queues).await {
            Ok(true) => {}
            Ok(false) => return Err(NotReady::Scripts("not loaded in Redis".into())),
            Err(e) => return Err(NotReady::Scripts(e)),
        }
    }
    Ok(())
}

/// Whether Redis holds the proxy's queue scripts. The pop script stands
/// for all of them: they are loaded together.
pub async fn scripts_loaded(queues: &Queues) -> Result<bool, String> {
    let sha = crate::queue::scripts::POP.sha();
    match super::ask(queues, &[b"SCRIPT", b"EXISTS", sha.as_bytes()]).await? {
        redis::Value::Array(found) => Ok(found.first() == Some(&redis::Value::Int(1))),
        other => Err(format!("SCRIPT EXISTS answered {other:?}")),
    }
}
