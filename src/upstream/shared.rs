//! A shared upstream connection: requests from many clients are written to
//! one Redis connection in the order they arrive, coalesced into few writes,
//! and each reply is routed back to its client by position.
//!
//! The shared connections clients use come in pairs, one *lane* for
//! requests that may write and one for read-only ones: Redis runs a
//! connection's requests in order, so a write held by a `CLIENT PAUSE
//! WRITE` made on Redis directly (a failover makes one) would hold every
//! request queued behind it on the same connection, whoever sent it.
//! Which lane a client's request takes is the session's decision
//! (`session::route::lane`), which keeps each client's requests in order.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::{Credentials, Endpoint};
use crate::error::UpstreamError;
use crate::net::Stream;
use crate::output::{ClientState, Reply, ReplyTransform, Resend, BIG_REPLY};
use crate::resp::ReplyScanner;

/// A batch of `count` complete requests from one client.
pub struct Request {
    pub bytes: Bytes,
    pub pending: Pending,
}

/// Where the replies to a batch go. Dropped unanswered (connection lost),
/// it answers each request with an error.
pub struct Pending {
    count: u32,
    target: Option<Target>,
    client: Arc<ClientState>,
    /// Set for a request sent to a cluster node: a redirection in reply
    /// goes to the router instead of the client.
    redirect: Option<Box<Redirect>>,
}

/// A request a cluster node may answer with a redirection (`MOVED`, `ASK`)
/// or a refusal to retry (`TRYAGAIN`, `CLUSTERDOWN`), and who handles it.
pub struct Redirect {
    /// The request alone, to send again.
    pub request: Bytes,
    /// The hash slot of its keys; `None`: it has none (any node serves it).
    pub slot: Option<u16>,
    /// Redirections followed so far: bounded by the router.
    pub hops: u8,
    /// `TRYAGAIN` and `CLUSTERDOWN` replies retried so far.
    pub retries: u8,
    /// The bytes sent were `ASKING` and then the request: the first reply
    /// is `ASKING`'s own and not the client's.
    pub asking: bool,
    pub handler: Arc<dyn Redirector>,
}

/// The cluster router, as the shared connections see it.
pub trait Redirector: Send + Sync {
    /// `reply` (one error line) answered `request`: send it again where it
    /// belongs, or answer it. Called from a connection's reader: must not
    /// wait.
    fn redirect(&self, request: Request, redirect: Box<Redirect>, reply: Bytes);
    /// `request` was never sent: its node could not be reached (a primary
    /// that failed, say). Send it again once it may be, or answer it.
    fn unreachable(&self, request: Request, redirect: Box<Redirect>, error: UpstreamError);
}

/// A request that could not be sent: a cluster router may send it to
/// another node; otherwise it is answered with `error`.
fn unsent(request: Request, error: UpstreamError) {
    let Request { mut pending, .. } = request;
    match pending.redirect.take() {
        Some(redirect) => {
            let handler = redirect.handler.clone();
            let request = Request {
                bytes: redirect.request.clone(),
                pending,
            };
            handler.unreachable(request, redirect, error);
        }
        None => pending.deliver(Err(error)),
    }
}

/// Whether a reply is a cluster redirection or a refusal worth retrying.
fn is_cluster_retry(reply: &[u8]) -> bool {
    [&b"-MOVED "[..], b"-ASK ", b"-TRYAGAIN ", b"-CLUSTERDOWN "]
        .iter()
        .any(|p| reply.starts_with(p))
}

/// Where the replies to a request of a [`Router`] go.
pub enum Target {
    /// A slot in the client's ordered reply queue.
    Slot(u64),
    /// A request of the proxy's own, awaited by its sender.
    Call(oneshot::Sender<Reply>),
    /// A request of the proxy's own whose reply nobody needs.
    Discard,
}

impl Pending {
    /// A request's reply goes to `target`, and its redirections (if any) to
    /// `redirect`'s handler. Counted as a shared request of `client` (see
    /// `ClientState::shared_drained`) until answered.
    pub fn new(
        target: Target,
        client: Arc<ClientState>,
        redirect: Option<Box<Redirect>>,
    ) -> Pending {
        client.shared_sent();
        let count = if redirect.as_ref().is_some_and(|r| r.asking) {
            2
        } else {
            1
        };
        Pending {
            count,
            target: Some(target),
            client,
            redirect,
        }
    }

    /// Sent again after a redirection: with `ASKING` first or not.
    pub fn resent(mut self, redirect: Box<Redirect>) -> Pending {
        self.count = if redirect.asking { 2 } else { 1 };
        self.redirect = Some(redirect);
        self
    }

    pub fn client(&self) -> &Arc<ClientState> {
        &self.client
    }

    /// Answers the request (an error from the router, say).
    pub fn answer(self, reply: Reply) {
        self.deliver(reply)
    }

    /// Hands over the first `count` replies of a batch of several.
    fn deliver_part(&mut self, bytes: Bytes, count: u32) {
        if let Some(Target::Slot(seq)) = &self.target {
            self.client.fill_part(*seq, bytes, count);
            self.count -= count;
        }
    }

    fn can_part(&self) -> bool {
        matches!(self.target, Some(Target::Slot(_))) && self.redirect.is_none()
    }

    /// The whole reply of a request sent to a cluster node: redirections go
    /// to the router.
    fn complete(mut self, reply: Bytes) {
        let Some(redirect) = self.redirect.take() else {
            return self.deliver(Ok(reply));
        };
        let reply = if redirect.asking {
            // ASKING's own `+OK` (or error) comes first.
            let mut scanner = ReplyScanner::new();
            match scanner.scan(&reply) {
                Ok(Some(n)) => reply.slice(n..),
                _ => reply,
            }
        } else {
            reply
        };
        if !is_cluster_retry(&reply) {
            return self.deliver(Ok(reply));
        }
        let handler = redirect.handler.clone();
        let request = Request {
            bytes: redirect.request.clone(),
            pending: self,
        };
        handler.redirect(request, redirect, reply);
    }

    fn deliver(mut self, reply: Reply) {
        match self.target.take() {
            Some(Target::Slot(seq)) => self.client.fill(seq, reply),
            Some(Target::Call(tx)) => {
                let _ = tx.send(reply);
            }
            Some(Target::Discard) | None => {}
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(Target::Slot(seq)) = self.target.take() {
            self.client.fill(seq, Err(UpstreamError::ConnectionLost));
        }
        self.client.shared_done();
    }
}

/// One connection's queue of requests.
#[derive(Clone)]
struct Lane {
    tx: mpsc::UnboundedSender<Request>,
    /// Big replies are arriving: requests sent now would wait behind them.
    congested: Arc<AtomicBool>,
}

/// The receiving end of a [`Lane`], for the task that serves it.
struct LaneRx {
    rx: mpsc::UnboundedReceiver<Request>,
    congested: Arc<AtomicBool>,
}

fn lane() -> (Lane, LaneRx) {
    let (tx, rx) = mpsc::unbounded_channel();
    let congested = Arc::new(AtomicBool::new(false));
    let lane = Lane {
        tx,
        congested: congested.clone(),
    };
    (lane, LaneRx { rx, congested })
}

/// Handle to a shared connection, or to a pair of them (see the module
/// documentation); cheap to clone. Everything goes on the writes lane
/// except what is sent with [`SharedUpstream::send_reads`].
#[derive(Clone)]
pub struct SharedUpstream {
    writes: Lane,
    reads: Option<Lane>,
    /// Set for a Redis Cluster: requests go to the nodes the router picks,
    /// and the lanes above are not used.
    router: Option<Arc<dyn Router>>,
}

/// Sends requests to the nodes of a cluster (`crate::cluster`), each to the
/// shared connection of the node that owns its keys.
pub trait Router: Send + Sync {
    /// `count` complete requests of `client`, in order; `reads` if none of
    /// them may write (see `session::route::lane`).
    fn send(&self, bytes: Bytes, count: u32, client: &Arc<ClientState>, to: To, reads: bool);
    fn is_congested(&self) -> bool;
}

/// Where the replies to requests handed to a [`Router`] go.
pub enum To {
    /// The client's next slots, one per request, the first transformed.
    Client(Option<Box<dyn ReplyTransform>>),
    /// One request of the proxy's own, awaited.
    Call(oneshot::Sender<Reply>),
    /// Requests of the proxy's own whose replies nobody needs.
    Discard,
}

impl SharedUpstream {
    /// One connection, for the proxy's own requests.
    pub fn spawn(endpoint: Arc<Endpoint>) -> SharedUpstream {
        let (writes, rx) = lane();
        tokio::spawn(manage(endpoint, rx, Setup::None));
        SharedUpstream {
            writes,
            reads: None,
            router: None,
        }
    }

    /// One connection, for queue calls in database `db` (not 0): it
    /// selects it as it opens, and again each time it opens.
    pub fn spawn_in(endpoint: Arc<Endpoint>, db: i64) -> SharedUpstream {
        let (writes, rx) = lane();
        tokio::spawn(manage(endpoint, rx, Setup::Select(db)));
        SharedUpstream {
            writes,
            reads: None,
            router: None,
        }
    }

    /// Like [`SharedUpstream::spawn_pair`], for the stateless requests of
    /// clients that speak RESP3: the connections switch to it as they open.
    pub fn spawn_resp3(endpoint: Arc<Endpoint>) -> SharedUpstream {
        let (writes, w) = lane();
        let (reads, r) = lane();
        tokio::spawn(manage(endpoint.clone(), w, Setup::Resp3));
        tokio::spawn(manage(endpoint, r, Setup::Resp3));
        SharedUpstream {
            writes,
            reads: Some(reads),
            router: None,
        }
    }

    /// A pair for clients: each of the two connections is opened when
    /// first used, and again after it fails.
    pub fn spawn_pair(endpoint: Arc<Endpoint>) -> SharedUpstream {
        let (writes, w) = lane();
        let (reads, r) = lane();
        tokio::spawn(manage(endpoint.clone(), w, Setup::None));
        tokio::spawn(manage(endpoint, r, Setup::None));
        SharedUpstream {
            writes,
            reads: Some(reads),
            router: None,
        }
    }

    /// A pair logged in with a client's credentials (see `users`): both
    /// opened together on first use and never opened again, since a new
    /// login could be refused (user deleted, password changed); when one
    /// ends, so does the other. The receiver hears when they are gone, or
    /// could not be opened.
    pub fn spawn_as(
        endpoint: Arc<Endpoint>,
        credentials: Credentials,
    ) -> (SharedUpstream, oneshot::Receiver<()>) {
        let (writes, w) = lane();
        let (reads, r) = lane();
        let (ended_tx, ended) = oneshot::channel();
        tokio::spawn(async move {
            manage_once(endpoint, credentials, w, r).await;
            let _ = ended_tx.send(());
        });
        let pair = SharedUpstream {
            writes,
            reads: Some(reads),
            router: None,
        };
        (pair, ended)
    }

    /// Requests go where `router` sends them.
    pub fn routed(router: Arc<dyn Router>) -> SharedUpstream {
        // Lanes nobody serves: a routed handle never sends on them.
        let (writes, _) = lane();
        SharedUpstream {
            writes,
            reads: None,
            router: Some(router),
        }
    }

    /// Queues a request prepared by a router on this (unrouted) connection:
    /// on the reads lane if `reads` and there is one.
    pub fn push(&self, request: Request, reads: bool) {
        debug_assert!(self.router.is_none());
        let lane = match &self.reads {
            Some(r) if reads => r,
            _ => &self.writes,
        };
        // A send error drops the request, which answers it with an error.
        let _ = lane.tx.send(request);
    }

    /// Whether either connection is busy with big replies.
    pub fn is_congested(&self) -> bool {
        if let Some(router) = &self.router {
            return router.is_congested();
        }
        self.writes.congested.load(Ordering::Relaxed)
            || self
                .reads
                .as_ref()
                .is_some_and(|r| r.congested.load(Ordering::Relaxed))
    }

    fn enqueue(lane: &Lane, bytes: Bytes, count: u32, target: Target, client: Arc<ClientState>) {
        client.shared_sent();
        let req = Request {
            bytes,
            pending: Pending {
                count,
                target: Some(target),
                client,
                redirect: None,
            },
        };
        // A send error drops the request, which answers it with an error.
        let _ = lane.tx.send(req);
    }

    /// Sends `count` requests whose replies fill the client's next slot.
    pub fn send(
        &self,
        bytes: Bytes,
        count: u32,
        client: &Arc<ClientState>,
        transform: Option<Box<dyn ReplyTransform>>,
    ) {
        if let Some(router) = &self.router {
            return router.send(bytes, count, client, To::Client(transform), false);
        }
        let seq = client.reserve(count, transform);
        Self::enqueue(
            &self.writes,
            bytes,
            count,
            Target::Slot(seq),
            client.clone(),
        );
    }

    /// Like [`send`](Self::send), for requests none of which may write:
    /// on the reads lane, where no write held by a pause is ahead of them.
    pub fn send_reads(&self, bytes: Bytes, count: u32, client: &Arc<ClientState>) {
        if let Some(router) = &self.router {
            return router.send(bytes, count, client, To::Client(None), true);
        }
        let seq = client.reserve(count, None);
        let lane = self.reads.as_ref().unwrap_or(&self.writes);
        Self::enqueue(lane, bytes, count, Target::Slot(seq), client.clone());
    }

    /// Requests of the proxy's own, right behind what the client sent
    /// last; their replies are dropped.
    pub fn send_discarded(&self, bytes: Bytes, count: u32, client: &Arc<ClientState>) {
        if bytes.is_empty() {
            return;
        }
        if let Some(router) = &self.router {
            return router.send(bytes, count, client, To::Discard, false);
        }
        Self::enqueue(&self.writes, bytes, count, Target::Discard, client.clone());
    }

    /// One request of the proxy's own, awaited.
    pub async fn call(&self, bytes: Bytes, client: Arc<ClientState>) -> Reply {
        let (tx, rx) = oneshot::channel();
        match &self.router {
            Some(router) => router.send(bytes, 1, &client, To::Call(tx), false),
            None => Self::enqueue(&self.writes, bytes, 1, Target::Call(tx), client),
        }
        rx.await.unwrap_or(Err(UpstreamError::ConnectionLost))
    }
}

impl Resend for SharedUpstream {
    fn resend(
        &self,
        before: Bytes,
        request: Bytes,
        client: Arc<ClientState>,
    ) -> Pin<Box<dyn Future<Output = Reply> + Send>> {
        self.send_discarded(before, 1, &client);
        let up = self.clone();
        Box::pin(async move { up.call(request, client).await })
    }
}

const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Complete replies of a batch still arriving are passed on once they add
/// up to this, so a client that reads can have more than its output limit
/// in flight, as with Redis.
const PART: usize = 256 * 1024;
const WRITE_BATCH: usize = 256 * 1024;

/// What a shared connection is switched to as it opens.
#[derive(Clone, Copy)]
enum Setup {
    None,
    Resp3,
    /// A database other than 0.
    Select(i64),
}

async fn manage(endpoint: Arc<Endpoint>, lane: LaneRx, setup: Setup) {
    let LaneRx { mut rx, congested } = lane;
    let mut backoff = Duration::from_millis(10);
    loop {
        // Connect only when there is something to send: an idle proxy keeps
        // no connection open and a restarted Redis is found on first use.
        let Some(first) = rx.recv().await else {
            return;
        };
        let primary = endpoint.addr.generation();
        match connect(&endpoint, setup).await {
            Ok(stream) => {
                backoff = Duration::from_millis(10);
                outage::ended();
                endpoint.note_opened();
                let m = crate::telemetry::upstream();
                m.connects.increment(1);
                m.shared.increment(1.0);
                crate::telemetry::upstream_up(true);
                // A failover closes it (what is in flight gets an error);
                // the next request opens one to the new primary.
                let result = tokio::select! {
                    r = run(stream, Some(first), &mut rx, &congested) => r,
                    _ = endpoint.addr.moved_from(primary) => Ok(()),
                };
                m.shared.decrement(1.0);
                congested.store(false, Ordering::Relaxed);
                if let Err(e) = result {
                    m.errors.increment(1);
                    outage::began(&format!("shared upstream connection failed: {e}"));
                }
            }
            Err(e) => {
                crate::telemetry::upstream().errors.increment(1);
                outage::began(&e.to_string());
                tracing::debug!("{e}; retrying in {backoff:?}");
                unsent(first, e.clone());
                // Until the next attempt every request fails at once rather
                // than waiting for a Redis that may be gone for long.
                let retry_at = tokio::time::Instant::now() + backoff;
                let moved = endpoint.addr.moved_from(primary);
                tokio::pin!(moved);
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep_until(retry_at) => break,
                        // A new primary: no reason to wait any longer.
                        () = &mut moved => break,
                        req = rx.recv() => match req {
                            Some(req) => unsent(req, e.clone()),
                            None => return,
                        },
                    }
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Opens a shared connection, switched as `setup` says.
async fn connect(endpoint: &Endpoint, setup: Setup) -> Result<Stream, UpstreamError> {
    let mut stream = endpoint.connect().await?;
    let (request, what) = match setup {
        Setup::None => return Ok(stream),
        Setup::Resp3 => (
            b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n".to_vec(),
            "HELLO 3".to_string(),
        ),
        Setup::Select(db) => {
            let n = db.to_string();
            (
                super::encode_command(&[b"SELECT", n.as_bytes()]),
                format!("SELECT {db}"),
            )
        }
    };
    let exchange = async {
        stream.write_all(&request).await?;
        stream.flush().await?;
        let mut buf = BytesMut::with_capacity(512);
        let mut scanner = ReplyScanner::new();
        loop {
            if stream.read_buf(&mut buf).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            match scanner.scan(&buf) {
                Ok(Some(n)) if n == buf.len() => return Ok::<_, std::io::Error>(buf),
                Ok(None) => {}
                _ => return Err(std::io::ErrorKind::InvalidData.into()),
            }
        }
    };
    let reply = tokio::time::timeout(endpoint.connect_timeout, exchange)
        .await
        .map_err(|_| endpoint.unavailable(format!("{what} timed out")))?
        .map_err(|e| endpoint.unavailable(format!("{what}: {e}")))?;
    if reply.first() == Some(&b'-') {
        let why = String::from_utf8_lossy(&reply);
        return Err(endpoint.unavailable(format!("{what}: {}", why.trim_end())));
    }
    Ok(stream)
}

/// The two connections of a pair with `credentials`, for as long as both
/// last. Requests that arrive afterwards are answered with an error when
/// the receivers are dropped.
async fn manage_once(
    endpoint: Arc<Endpoint>,
    credentials: Credentials,
    mut writes: LaneRx,
    mut reads: LaneRx,
) {
    let (first_write, first_read) = tokio::select! {
        r = writes.rx.recv() => (r, None),
        r = reads.rx.recv() => (None, r),
    };
    if first_write.is_none() && first_read.is_none() {
        return;
    }
    // Both logins now: one made later could be refused (a changed
    // password), which would disconnect the pool's clients where Redis
    // keeps their connections.
    let primary = endpoint.addr.generation();
    let connected = match endpoint.connect_as(&credentials).await {
        Ok(w) => endpoint.connect_as(&credentials).await.map(|r| (w, r)),
        Err(e) => Err(e),
    };
    // The password is not needed any more here.
    drop(credentials);
    match connected {
        Ok((w, r)) => {
            let m = crate::telemetry::upstream();
            m.connects.increment(2);
            m.user.increment(2.0);
            // After a failover the pool ends as when its connection is
            // lost: the user's login on the new primary is not the proxy's
            // to make.
            let result = tokio::select! {
                r = run(w, first_write, &mut writes.rx, &writes.congested) => r,
                r = run(r, first_read, &mut reads.rx, &reads.congested) => r,
                _ = endpoint.addr.moved_from(primary) => Err(UpstreamError::ConnectionLost),
            };
            m.user.decrement(2.0);
            if let Err(e) = result {
                m.errors.increment(1);
                tracing::info!("connection of a logged-in user ended: {e}");
            }
        }
        Err(e) => {
            crate::telemetry::upstream().errors.increment(1);
            tracing::info!("connection of a logged-in user could not open: {e}");
            if let Some(first) = first_write.or(first_read) {
                first.pending.deliver(Err(e));
            }
        }
    }
}

/// From now on the loss of the upstream is not logged: the proxy is
/// stopping (SIGTERM, SIGINT), and whatever Redis does then is no outage.
pub fn stopping() {
    outage::stopping();
}

/// Whether [`stopping`] was called.
pub fn is_stopping() -> bool {
    outage::is_stopping()
}

/// Redis could not be reached, as the proxy's own connections found (at
/// start-up, before any shared connection): the one line of the outage,
/// which the shared connections then do not repeat.
pub fn unreachable(why: &str) {
    outage::began(why);
}

/// Redis answers again, as the proxy's own connections found.
pub fn reachable() {
    crate::telemetry::upstream_up(true);
    outage::ended();
}

/// Whether an outage is on: what else fails for it (the command table,
/// keyspace notifications) is the same cause, logged once.
pub fn in_outage() -> bool {
    outage::is_on()
}

/// Whether the upstream is down, for the whole process: an outage is
/// logged once when it begins (whichever shared connection sees it first,
/// whatever the number of retries) and once when a shared connection is
/// made again, with its length.
mod outage {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    use std::time::Instant;

    static SINCE: Mutex<Option<Instant>> = Mutex::new(None);
    static STOPPING: AtomicBool = AtomicBool::new(false);

    /// The proxy is stopping: a private redis-server stopped with it, or
    /// one a service manager stops beside it, is going away on purpose.
    pub fn stopping() {
        STOPPING.store(true, Ordering::Relaxed);
    }

    pub fn is_stopping() -> bool {
        STOPPING.load(Ordering::Relaxed)
    }

    pub fn began(why: &str) {
        if is_stopping() {
            return;
        }
        crate::telemetry::upstream_up(false);
        let mut since = SINCE.lock().unwrap();
        if since.is_none() {
            *since = Some(Instant::now());
            tracing::warn!("upstream down: {why}");
        }
    }

    pub fn is_on() -> bool {
        SINCE.lock().unwrap().is_some()
    }

    pub fn ended() {
        if let Some(at) = SINCE.lock().unwrap().take() {
            crate::telemetry::upstream().reconnects.increment(1);
            tracing::info!(
                outage_ms = at.elapsed().as_millis() as u64,
                "upstream back up"
            );
        }
    }
}

/// Serves requests on one connection until it fails or the proxy stops.
async fn run(
    stream: Stream,
    mut first: Option<Request>,
    rx: &mut mpsc::UnboundedReceiver<Request>,
    congested: &AtomicBool,
) -> Result<(), UpstreamError> {
    let (mut rd, mut wr) = stream.split();
    // Filled before the bytes are written, so a reply always finds its entry.
    let inflight: Mutex<VecDeque<Pending>> = Mutex::new(VecDeque::new());

    let writer = async {
        let mut wbuf = BytesMut::with_capacity(64 * 1024);
        loop {
            let req = match first.take() {
                Some(r) => r,
                None => match rx.recv().await {
                    Some(r) => r,
                    None => return Ok(()),
                },
            };
            // The session that woke us was just scheduled; other clients
            // with requests ready run first, so one write carries them all
            // (fewer system calls here and in Redis).
            tokio::task::yield_now().await;
            {
                let mut q = inflight.lock().unwrap();
                wbuf.extend_from_slice(&req.bytes);
                q.push_back(req.pending);
                while wbuf.len() < WRITE_BATCH {
                    match rx.try_recv() {
                        Ok(r) => {
                            wbuf.extend_from_slice(&r.bytes);
                            q.push_back(r.pending);
                        }
                        Err(_) => break,
                    }
                }
            }
            wr.write_all(&wbuf)
                .await
                .map_err(|_| UpstreamError::ConnectionLost)?;
            wr.flush()
                .await
                .map_err(|_| UpstreamError::ConnectionLost)?;
            wbuf.clear();
            if wbuf.capacity() > 4 * WRITE_BATCH {
                wbuf = BytesMut::with_capacity(64 * 1024);
            }
        }
    };

    let reader = async {
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let mut scanner = ReplyScanner::new();
        // Bytes at the front of `buf` holding whole replies of the current batch.
        let mut done = 0usize;
        let mut replies = 0u32;
        loop {
            crate::resp::grow(&mut buf, 64 * 1024);
            let n = rd
                .read_buf(&mut buf)
                .await
                .map_err(|_| UpstreamError::ConnectionLost)?;
            if n == 0 {
                return Err::<(), _>(UpstreamError::ConnectionLost);
            }
            if buf.len() >= BIG_REPLY {
                // A big reply is coming in for the client at the head: its
                // next requests go elsewhere, and so do other clients' while
                // this connection is busy with it.
                if let Some(head) = inflight.lock().unwrap().front() {
                    head.client.mark_big_replies();
                }
                congested.store(true, Ordering::Relaxed);
            }
            loop {
                match scanner.scan(&buf[done..]) {
                    Ok(Some(len)) => {
                        done += len;
                        replies += 1;
                        let mut q = inflight.lock().unwrap();
                        let Some(head) = q.front() else {
                            return Err(UpstreamError::BadReply);
                        };
                        if !head.client.is_closed() && head.client.over_output_limit(done) {
                            // The batch alone passes the client's limit:
                            // cut it off now rather than after buffering it.
                            tracing::warn!(
                                client = %head.client.peer(),
                                queued = done,
                                "client output buffer limit reached, closing"
                            );
                            head.client.kill();
                        }
                        if head.client.is_closed() {
                            // Nobody will read these: do not hold a whole
                            // batch of them (possibly large) in memory.
                            let _ = buf.split_to(done);
                            done = 0;
                        }
                        if replies == head.count {
                            let pending = q.pop_front().unwrap();
                            drop(q);
                            let bytes = buf.split_to(done).freeze();
                            done = 0;
                            replies = 0;
                            pending.complete(bytes);
                        } else if done >= PART && head.can_part() {
                            let head = q.front_mut().unwrap();
                            head.deliver_part(buf.split_to(done).freeze(), replies);
                            done = 0;
                            replies = 0;
                        }
                    }
                    Ok(None) => break,
                    Err(_) => return Err(UpstreamError::BadReply),
                }
            }
            if congested.load(Ordering::Relaxed) {
                let q = inflight.lock().unwrap();
                if q.front().is_none_or(|h| !h.client.has_big_replies()) {
                    congested.store(false, Ordering::Relaxed);
                }
            }
        }
    };

    let result = tokio::select! {
        r = writer => r,
        r = reader => r,
    };
    // Whatever is still in flight is answered with an error when dropped.
    inflight.lock().unwrap().clear();
    result
}
