//! Connections opened and logged in ahead of need, for clients' dedicated
//! connections.
//!
//! A client's first stateful request (a blocking command, MULTI, SELECT,
//! ...) needs a connection of its own. Dialled then, the request would be
//! written only after a TCP connect (and a login round trip), while other
//! clients' requests go on at once on the shared connection: a `XADD` sent
//! right after another client's `XREAD BLOCK ... $` could reach Redis first,
//! and the reader would miss it, which never happens directly. A ready
//! connection is taken without waiting, so the request is written to Redis
//! before the session reads anything else.
//!
//! A ready connection is fresh: logged in as its pool's login, RESP2,
//! database 0, no name. What a client needs on top of that (its protocol,
//! name, library) is written in the same write as its first request (see
//! `Dedicated::prelude`). Connections are never given back: one a client
//! has used may hold state.
//!
//! Each pool keeps `size` connections, refilled in the background. One that
//! Redis closed while waiting (its `timeout`, `CLIENT KILL`, a restart) is
//! found by a peek at its socket, when taken and every second, and never
//! handed out. Ready connections belong to no client: no table of clients
//! lists them, and `ackproxy_upstream_connections{kind="pooled"}` counts them
//! apart from the `dedicated` ones clients use.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::{Credentials, Endpoint};
use crate::error::UpstreamError;
use crate::net::Stream;

/// How often waiting connections are checked, so that ones Redis closed
/// are replaced before a client needs them.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The longest wait between failed attempts to open one.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A pool of ready connections; dropping it closes them.
pub struct Ready {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: Arc<Endpoint>,
    /// `None`: the proxy's own, as they are at each connect (SIGHUP and
    /// `CONFIG SET requirepass` change them).
    login: Option<Credentials>,
    size: usize,
    /// Each with the credentials it logged in with and the generation of
    /// the primary's address it was opened to (see `topology`).
    conns: Mutex<Vec<(Credentials, u64, Stream)>>,
    /// A connection was taken, or the pool closed.
    wake: Notify,
    closed: AtomicBool,
}

impl Ready {
    /// Keeps `size` connections logged in as `login` (`None`: the proxy's
    /// credentials). Size 0 keeps none: every connection is opened when
    /// needed.
    pub fn start(endpoint: Arc<Endpoint>, login: Option<Credentials>, size: usize) -> Ready {
        let inner = Arc::new(Inner {
            endpoint,
            login,
            size,
            conns: Mutex::new(Vec::new()),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
        });
        if size > 0 {
            tokio::spawn(refill(inner.clone()));
        }
        Ready { inner }
    }

    /// A connection logged in as the pool's login, and the generation of
    /// the primary's address it was opened to: a ready one if one is still
    /// open to the current primary, else one opened now.
    pub async fn connect(&self) -> Result<(Stream, u64), UpstreamError> {
        if let Some(taken) = self.take() {
            return Ok(taken);
        }
        let credentials = self.inner.credentials();
        let generation = self.inner.endpoint.addr.generation();
        let stream = self.inner.endpoint.connect_as(&credentials).await?;
        Ok((stream, generation))
    }

    /// A ready connection that Redis has not closed, without waiting.
    pub fn take(&self) -> Option<(Stream, u64)> {
        let current = self.inner.credentials();
        let now = self.inner.endpoint.addr.generation();
        let mut conns = self.inner.conns.lock().unwrap();
        let mut found = None;
        while let Some((credentials, generation, stream)) = conns.pop() {
            gauge().decrement(1.0);
            if credentials == current && generation == now && is_open(&stream) {
                found = Some((stream, generation));
                break;
            }
        }
        drop(conns);
        self.inner.wake.notify_one();
        found
    }

    /// Completes when the primary is no longer the one of `generation`
    /// (see `topology`).
    pub fn moved_from(
        &self,
        generation: u64,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.inner.endpoint.addr.moved_from(generation)
    }

    /// Connections waiting now.
    pub fn len(&self) -> usize {
        self.inner.conns.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Ready {
    fn drop(&mut self) {
        self.inner.closed.store(true, Ordering::Release);
        let closing = std::mem::take(&mut *self.inner.conns.lock().unwrap());
        gauge().decrement(closing.len() as f64);
        self.inner.wake.notify_one();
    }
}

impl Inner {
    fn credentials(&self) -> Credentials {
        match &self.login {
            Some(c) => c.clone(),
            None => self.endpoint.credentials.read().unwrap().clone(),
        }
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Lets go of connections Redis closed, that logged in with
    /// credentials no longer in force or that go to a former primary;
    /// returns how many are left.
    fn prune(&self) -> usize {
        let current = self.credentials();
        let now = self.endpoint.addr.generation();
        let mut conns = self.conns.lock().unwrap();
        let before = conns.len();
        conns.retain(|(credentials, generation, stream)| {
            *credentials == current && *generation == now && is_open(stream)
        });
        gauge().decrement((before - conns.len()) as f64);
        conns.len()
    }
}

async fn refill(inner: Arc<Inner>) {
    let mut backoff = Duration::from_millis(100);
    while !inner.is_closed() {
        if inner.prune() >= inner.size {
            let woken = inner.wake.notified();
            tokio::select! {
                _ = woken => {}
                _ = tokio::time::sleep(CHECK_EVERY) => {}
            }
            continue;
        }
        let credentials = inner.credentials();
        let generation = inner.endpoint.addr.generation();
        match inner.endpoint.connect_as(&credentials).await {
            Ok(stream) => {
                backoff = Duration::from_millis(100);
                let mut conns = inner.conns.lock().unwrap();
                if inner.is_closed() {
                    break;
                }
                conns.push((credentials, generation, stream));
                gauge().increment(1.0);
            }
            Err(e) if inner.login.is_some() => {
                // A user's login is never tried again (see `users`): Redis
                // may no longer accept it (a new password), and its pool
                // ends with its shared connection if Redis went away. Its
                // clients' own connections are opened when needed, and
                // refused as Redis refuses them.
                tracing::debug!(error = %e, "opening a ready connection of a user failed; no more are kept");
                break;
            }
            Err(e) => {
                tracing::debug!(error = %e, "opening a ready upstream connection failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

fn gauge() -> &'static metrics::Gauge {
    &crate::telemetry::upstream().pooled
}

/// Whether Redis has left the connection open and said nothing on it: a
/// peek at the socket, which sees a close that has arrived even if the
/// runtime has not noticed it yet.
fn is_open(stream: &Stream) -> bool {
    use std::os::fd::AsRawFd;
    let (fd, tls) = match stream {
        Stream::Plain(s) => (s.as_raw_fd(), false),
        Stream::Tls(s) => (s.get_ref().0.as_raw_fd(), true),
    };
    let mut byte = 0u8;
    // SAFETY: reads at most one byte into `byte`, and only peeks.
    let n = unsafe {
        libc::recv(
            fd,
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match n {
        0 => false,
        // Over TLS, Redis sends session tickets after the handshake; on
        // plain TCP it speaks unasked only to refuse the connection (too
        // many clients) before it closes it.
        n if n > 0 => tls,
        _ => {
            let e = std::io::Error::last_os_error();
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    async fn endpoint() -> (Arc<Endpoint>, TcpListener) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = Arc::new(Endpoint {
            addr: super::super::topology::Address::fixed(
                listener.local_addr().unwrap().to_string(),
            ),
            credentials: Default::default(),
            connect_timeout: Duration::from_secs(5),
            tls: None,
            opened: Default::default(),
            connected: Default::default(),
        });
        (endpoint, listener)
    }

    #[tokio::test]
    async fn a_connection_closed_while_waiting_is_never_taken() {
        let (endpoint, listener) = endpoint().await;
        let ready = Ready::start(endpoint, None, 2);
        let (mut first, _) = listener.accept().await.unwrap();
        let (second, _) = listener.accept().await.unwrap();
        // One closed by the server, one that spoke unasked.
        drop(second);
        first
            .write_all(b"-ERR max number of clients reached\r\n")
            .await
            .unwrap();
        // Both replaced.
        let (_third, _) = listener.accept().await.unwrap();
        let (_fourth, _) = listener.accept().await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while ready.len() < 2
            || ready
                .inner
                .conns
                .lock()
                .unwrap()
                .iter()
                .any(|(_, _, s)| !is_open(s))
        {
            assert!(tokio::time::Instant::now() < deadline, "not refilled");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (stream, _) = ready.take().expect("an open one");
        assert!(is_open(&stream));
    }

    #[tokio::test]
    async fn taken_connections_are_replaced_and_size_zero_keeps_none() {
        let (endpoint, listener) = endpoint().await;
        let none = Ready::start(endpoint.clone(), None, 0);
        assert!(none.take().is_none());
        let ready = Ready::start(endpoint, None, 1);
        let (_a, _) = listener.accept().await.unwrap();
        while ready.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let taken = ready.take().expect("ready");
        let (_b, _) = listener.accept().await.unwrap();
        drop(taken);
        drop(ready);
    }
}
