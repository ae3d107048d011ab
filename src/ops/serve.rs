//! The operations server's accept loop and its limits. Every connection
//! costs the process a file descriptor, the same budget the proxy's Redis
//! clients draw on, so this server holds a bounded number of them, each
//! for a bounded time: a flood of half-sent requests can cost it at most
//! `ops_max_connections` descriptors, for [`HEADER_TIMEOUT`] at a time.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// A request's head (request line and headers) must arrive within this
/// time of the connection being ready for it, also between requests of a
/// kept-alive connection.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The body, then the answer, within this time of the head: a listing of
/// a large keyspace takes well under a second.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// No route takes a body; the actions' are empty.
pub const MAX_BODY: usize = 64 * 1024;
/// A request head larger than this is refused (431): the read buffer of
/// each connection stays this small.
const MAX_HEAD: usize = 32 * 1024;
/// Kept-alive connections are closed after this long, between requests,
/// and whatever they are doing [`HEADER_TIMEOUT`] later: a client that
/// never reads its answer cannot hold a slot for good.
const MAX_AGE: Duration = Duration::from_secs(60);
/// Pause after a failed accept (out of descriptors, usually), so that the
/// loop does not spin while the proxy's clients need the CPU.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub request_timeout: Duration,
    pub max_body: usize,
    pub max_age: Duration,
}

impl Limits {
    pub fn new(max_connections: usize) -> Limits {
        Limits {
            max_connections,
            header_timeout: HEADER_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
            max_body: MAX_BODY,
            max_age: MAX_AGE,
        }
    }
}

/// Serves `app` on `listener` until `stop` turns true.
pub async fn run(listener: TcpListener, app: Router, limits: Limits, stop: watch::Receiver<bool>) {
    let app = app.layer(middleware::from_fn(move |req: Request, next: Next| {
        bounded(limits, req, next)
    }));
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEAD);
    let mut stopped = stop.clone();
    loop {
        let accepted = tokio::select! {
            _ = stopped.wait_for(|s| *s) => return,
            r = listener.accept() => r,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                tracing::debug!("operations server: accept failed: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // Over the cap: closed now rather than left in the backlog, where
        // it would wait for a slot while its peer sends more.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(
                max = limits.max_connections,
                "operations server: connection refused, all slots in use"
            );
            drop(tcp);
            continue;
        };
        let conn = http.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(app.clone()));
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = tokio::time::sleep(limits.max_age) => {}
                _ = stop.wait_for(|s| *s) => {}
            }
            // Finishes the request in progress, if any, then closes.
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(limits.header_timeout, conn).await;
        });
    }
}

/// Reads the body (at most `max_body` bytes) before the handler runs, and
/// bounds both by `request_timeout`: a body sent a byte at a time, or a
/// handler stuck on a Redis that stopped answering, frees the slot.
async fn bounded(limits: Limits, req: Request, next: Next) -> Response {
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > limits.max_body as u64) {
        return refuse(StatusCode::PAYLOAD_TOO_LARGE, "request body too large");
    }
    let deadline = tokio::time::Instant::now() + limits.request_timeout;
    let (parts, body) = req.into_parts();
    let limited = http_body_util::Limited::new(body, limits.max_body);
    let body =
        match tokio::time::timeout_at(deadline, http_body_util::BodyExt::collect(limited)).await {
            Ok(Ok(collected)) => collected.to_bytes(),
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                return refuse(StatusCode::PAYLOAD_TOO_LARGE, "request body too large")
            }
            Ok(Err(_)) => return refuse(StatusCode::BAD_REQUEST, "request body unreadable"),
            Err(_) => return refuse(StatusCode::REQUEST_TIMEOUT, "request body too slow"),
        };
    let req = Request::from_parts(parts, Body::from(body));
    match tokio::time::timeout_at(deadline, next.run(req)).await {
        Ok(response) => response,
        Err(_) => refuse(StatusCode::SERVICE_UNAVAILABLE, "request took too long"),
    }
}

/// An answer after which the connection closes: what is left of the
/// request is not read.
fn refuse(status: StatusCode, why: &str) -> Response {
    (status, [(header::CONNECTION, "close")], format!("{why}\n")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::{get, post};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// A server with short limits on a free loopback port.
    async fn server(limits: Limits) -> (u16, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let app = Router::new()
            .route("/", get(|| async { "hello" }))
            .route("/echo", post(|body: String| async move { body }))
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    "late"
                }),
            );
        let (tx, rx) = watch::channel(false);
        tokio::spawn(run(listener, app, limits, rx));
        (port, tx)
    }

    fn short() -> Limits {
        Limits {
            max_connections: 2,
            header_timeout: Duration::from_millis(300),
            request_timeout: Duration::from_millis(300),
            max_body: 16,
            max_age: Duration::from_secs(60),
        }
    }

    /// Everything until the server closes, at most 5 s.
    async fn exchange(port: u16, request: &[u8]) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let _ = s.write_all(request).await;
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        assert!(
            read.is_ok(),
            "still open: {}",
            String::from_utf8_lossy(&out)
        );
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn bodies_are_bounded_in_size_and_time() {
        let (port, _stop) = server(short()).await;
        let ok = exchange(
            port,
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
        )
        .await;
        assert!(
            ok.starts_with("HTTP/1.1 200") && ok.ends_with("hello"),
            "{ok}"
        );
        let big = exchange(
            port,
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 17\r\n\r\n",
        )
        .await;
        assert!(big.starts_with("HTTP/1.1 413"), "{big}");
        // Chunked, so the length shows only as it arrives.
        let chunked = exchange(
            port,
            b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
              11\r\n0123456789abcdefg\r\n0\r\n\r\n",
        )
        .await;
        assert!(chunked.starts_with("HTTP/1.1 413"), "{chunked}");
        let slow = exchange(
            port,
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhe",
        )
        .await;
        assert!(slow.starts_with("HTTP/1.1 408"), "{slow}");
        let stuck = exchange(port, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(stuck.starts_with("HTTP/1.1 503"), "{stuck}");
    }

    #[tokio::test]
    async fn connections_over_the_cap_are_closed_and_half_sent_heads_time_out() {
        let (port, _stop) = server(short()).await;
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            s.write_all(b"GET / HT").await.unwrap();
            held.push(s);
        }
        // Both slots taken: the next connection gets nothing and is closed.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let refused = exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(refused, "");
        // The header timeout frees them.
        for mut s in held {
            let mut out = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut out)).await;
            assert!(read.is_ok(), "a half-sent head kept its connection");
        }
        let served = exchange(
            port,
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(served.ends_with("hello"), "{served}");
    }
}
