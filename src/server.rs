//! The listeners: accept clients (plain and TLS ones side by side, as
//! Redis's `port` and `tls-port`), enforce maxclients, and on shutdown stop
//! accepting and wait for sessions to finish their in-flight replies.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio_rustls::TlsAcceptor;

use crate::net::{tls, Stream};
use crate::session::{self, Context};

/// How long shutdown waits for sessions to write their last replies.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client has to complete its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// One listening socket; with an acceptor, its clients speak TLS.
pub struct Listener {
    pub tcp: TcpListener,
    pub tls: Option<TlsAcceptor>,
}

pub async fn serve(
    listeners: Vec<Listener>,
    ctx: Arc<Context>,
    mut shutdown: watch::Receiver<bool>,
) {
    let active = Arc::new(AtomicUsize::new(0));
    let all_done = Arc::new(Notify::new());
    let mut next = 0usize;
    loop {
        let (accepted, tls) = tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            r = accept_any(&listeners, &mut next) => r,
        };
        let stream = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Usually out of file descriptors: wait for some to close.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        if active.load(Ordering::Acquire) >= ctx.limits().maxclients {
            crate::telemetry::clients().rejected.increment(1);
            let stop = shutdown.clone();
            tokio::spawn(async move {
                let stream = match tls {
                    None => Some(Stream::Plain(stream)),
                    Some(acceptor) => tls_handshake(stream, acceptor, stop).await,
                };
                if let Some(mut stream) = stream {
                    let _ = stream
                        .write_all(b"-ERR max number of clients reached\r\n")
                        .await;
                    let _ = stream.flush().await;
                }
            });
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let (ctx, active, all_done) = (ctx.clone(), active.clone(), all_done.clone());
        let done = move || {
            if active.fetch_sub(1, Ordering::AcqRel) == 1 {
                all_done.notify_waiters();
            }
        };
        let peer = stream.peer_addr().ok();
        match tls {
            None => tokio::spawn(async move {
                session::run(Stream::Plain(stream), ctx, peer).await;
                done();
            }),
            // The handshake runs in the client's task, not in the accept
            // loop: a slow or silent client holds up no one else. A future
            // of its own, so that plain clients' tasks do not carry its
            // state.
            Some(acceptor) => {
                let stop = shutdown.clone();
                tokio::spawn(async move {
                    if let Some(stream) = tls_handshake(stream, acceptor, stop).await {
                        session::run(stream, ctx, peer).await;
                    }
                    done();
                })
            }
        };
    }
    drop(listeners);
    tracing::info!(
        "shutting down: waiting for {} clients",
        active.load(Ordering::Acquire)
    );
    let drained = async {
        loop {
            let n = all_done.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if active.load(Ordering::Acquire) == 0 {
                return;
            }
            n.await;
        }
    };
    if tokio::time::timeout(DRAIN_TIMEOUT, drained).await.is_err() {
        tracing::warn!("shutdown: clients still busy after {DRAIN_TIMEOUT:?}, closing them");
    }
}

/// The next connection on any listener, with the listener's TLS settings.
/// Listeners are asked in turn, starting after the one that gave the last
/// connection, so a flood on one does not starve the other.
async fn accept_any(
    listeners: &[Listener],
    next: &mut usize,
) -> (std::io::Result<TcpStream>, Option<TlsAcceptor>) {
    std::future::poll_fn(|cx| {
        for k in 0..listeners.len() {
            let i = (*next + k) % listeners.len();
            if let Poll::Ready(r) = listeners[i].tcp.poll_accept(cx) {
                *next = i + 1;
                return Poll::Ready((r.map(|(s, _)| s), listeners[i].tls.clone()));
            }
        }
        Poll::Pending
    })
    .await
}

/// The client's stream after its TLS handshake; `None` if that failed,
/// timed out, or the proxy is stopping.
async fn tls_handshake(
    tcp: TcpStream,
    acceptor: TlsAcceptor,
    mut shutdown: watch::Receiver<bool>,
) -> Option<Stream> {
    let client = tcp
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let failed = |why: String, refused: bool| {
        crate::telemetry::clients().tls_failures.increment(1);
        // A client the proxy refused (its certificate, its TLS versions, or
        // no TLS at all) only sees its connection closed: the reason is for
        // the operator to read. One that went away or said nothing says
        // nothing worth a warning.
        if refused {
            tracing::warn!(client = %client, "TLS handshake refused: {why}");
        } else {
            tracing::debug!(client = %client, "TLS handshake failed: {why}");
        }
        None
    };
    tokio::select! {
        r = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls::accept(&acceptor, tcp)) => match r {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(e)) => match tls::refusal(&e) {
                Some(why) => failed(why, true),
                None => failed(e.to_string(), false),
            },
            Err(_) => failed(format!("no handshake within {HANDSHAKE_TIMEOUT:?}"), false),
        },
        _ = shutdown.changed() => None,
    }
}
