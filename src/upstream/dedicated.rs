//! A dedicated upstream connection, pinned to one client while it is in a
//! stateful mode (MULTI, WATCH, blocking commands, pub/sub, AUTH, ...).
//!
//! The session writes requests straight to the socket; a reader task pushes
//! replies into the client's reply stream as they arrive. Replies that answer
//! a request are matched to it through a queue of expectations, so the proxy
//! knows when the connection is idle and can rewrite replies where needed;
//! messages nobody asked for (pub/sub, MONITOR, RESP3 pushes) pass as they come.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::ready::Ready;
use super::Endpoint;
use crate::error::UpstreamError;
use crate::net::{ReadHalf, Stream, WriteHalf};
use crate::output::{ClientState, ReplyTransform, Transformed};
use crate::resp::ReplyScanner;

/// What the next reply that answers a request is for.
pub enum Expect {
    /// Forward as is.
    Raw,
    /// EXEC of a transaction whose queued commands include rewritten ones:
    /// element `i` of the EXEC reply is transformed by `transforms[i]`.
    Exec(Vec<Option<Box<dyn ReplyTransform>>>),
    /// The proxy's own `PING token` on a connection whose replies do not
    /// pair with requests (pub/sub, MONITOR): its reply, recognised by its
    /// exact bytes, is dropped, and everything before it has arrived.
    Sentinel(Vec<u8>, Vec<u8>),
    /// A request the queue interceptor rewrote: its reply is transformed.
    Transformed(Box<dyn ReplyTransform>),
    /// A request of the proxy's own: its reply is dropped.
    Drop,
    /// Requests written together that answer one of the client's: the
    /// transform gets their `left` replies, one after the other, and makes
    /// the client's one reply of them.
    Joined {
        left: u32,
        got: BytesMut,
        transform: Box<dyn ReplyTransform>,
    },
    /// HELLO or RESET, forwarded as is: the connection speaks this protocol
    /// from now on only if Redis accepted it.
    Protocol(u8),
    /// Forwarded as is; whether Redis accepted it is sent (AUTH, HELLO with
    /// AUTH, CONFIG SET: the session's state follows Redis's answer).
    Checked(Option<u8>, tokio::sync::oneshot::Sender<bool>),
    /// `SELECT db`, forwarded as is: the connection is in that database
    /// from now on only if Redis accepted it.
    Select(i64),
    /// In a cluster, a request a node may turn away while slots move or a
    /// primary fails over: see [`Routed`].
    Routed(Box<Routed>),
    /// Requests of the proxy's own written together: their `left` replies,
    /// one after the other, go to `tx` (none to the client).
    Gather {
        left: u32,
        got: BytesMut,
        tx: tokio::sync::oneshot::Sender<Bytes>,
    },
}

/// A request on a dedicated connection to a cluster node. Its reply is
/// forwarded as usual, unless the node turned it away (`MOVED`, `ASK`,
/// `TRYAGAIN`, `CLUSTERDOWN`, or `EXECABORT` for an EXEC): then its place
/// in the client's reply stream is held (`seq`) and it goes back to the
/// session (see [`Dedicated::on_bounce`]), which sends it again where it
/// belongs and fills that place. Replies after it wait; none is reordered.
pub struct Routed {
    pub request: Bytes,
    /// The held place, once it was turned away.
    pub seq: Option<u64>,
    /// When it was first turned away: retries end at the connect timeout.
    pub since: Option<std::time::Instant>,
    /// Times it was turned away.
    pub hops: u32,
    pub role: Role,
}

/// What a [`Routed`] request is to the client's transaction.
pub enum Role {
    Plain,
    /// Queued in the transaction numbered `tx` (see `Bounces`): a node
    /// that turns it away makes Redis abort the transaction's EXEC.
    Queued {
        tx: u64,
    },
    /// EXEC of transaction `tx`, with the requests it queued (for a
    /// replay), whether a WATCH guarded it, and the transforms of its
    /// elements (see [`Expect::Exec`]).
    Exec {
        tx: u64,
        frames: Vec<Bytes>,
        watched: bool,
        transforms: Vec<Option<Box<dyn ReplyTransform>>>,
    },
}

/// Whether a cluster node's `reply` sends the request elsewhere or asks
/// for it later, rather than answers it.
pub fn is_redirection(reply: &[u8]) -> bool {
    const BOUNCES: [&[u8]; 4] = [b"-MOVED ", b"-ASK ", b"-TRYAGAIN", b"-CLUSTERDOWN"];
    BOUNCES.iter().any(|b| reply.starts_with(b))
}

/// Wakes the session a [`Routed`] request is handed back to.
pub type Doorbell = Box<dyn Fn() + Send + Sync>;

/// A [`Routed`] request a node turned away, and the node's reply.
pub struct Bounced {
    pub routed: Routed,
    pub reply: Bytes,
}

impl Routed {
    /// Whether `reply` turns the request away rather than answers it.
    fn turned_away(&self, reply: &[u8]) -> bool {
        is_redirection(reply)
            || (matches!(self.role, Role::Exec { .. }) && reply.starts_with(b"-EXECABORT"))
    }

    /// The reply as the client gets it, when it was not turned away.
    fn answer(&mut self, reply: Bytes) -> Bytes {
        match &mut self.role {
            Role::Exec { transforms, .. } if transforms.iter().any(Option::is_some) => {
                transform_exec(std::mem::take(transforms), reply)
            }
            _ => reply,
        }
    }
}

struct Shared {
    expect: Mutex<VecDeque<Expect>>,
    idle: Notify,
    dead: AtomicBool,
    /// The client's connection state lives on this connection: losing it
    /// must close the client, as losing Redis would.
    bound: AtomicBool,
    /// RESP version in force, as confirmed by Redis.
    protocol: AtomicU8,
    /// Channels and patterns subscribed, from Redis's confirmations.
    subscriptions: AtomicI64,
    /// The database selected, as confirmed by Redis.
    db: Arc<AtomicI64>,
    by_kind: ByKind,
    /// Set before a `SYNC` or `PSYNC` is written: once every paired reply
    /// before it has arrived, Redis's bytes go to the client as they come
    /// (an RDB payload is no RESP value), for the rest of the connection.
    relay: AtomicBool,
    /// Where [`Routed`] requests a node turned away go, and what wakes
    /// the session for them.
    bounce: std::sync::OnceLock<(tokio::sync::mpsc::UnboundedSender<Bounced>, Doorbell)>,
}

/// Channels, patterns and shard channels apart, as `CLIENT LIST` shows
/// them. A confirmation of a channel or pattern tells the total of both,
/// one of a shard channel the shard channels alone.
#[derive(Default)]
struct ByKind {
    channels: AtomicI64,
    patterns: AtomicI64,
    shard: AtomicI64,
}

impl ByKind {
    fn confirmed(&self, frame: &[u8], n: i64) {
        // The kind is the first element, after "*3\r\n$N\r\n".
        let Some(at) = frame[4..].windows(2).position(|w| w == b"\r\n") else {
            return;
        };
        let kind = frame[4 + at + 2..].to_ascii_lowercase();
        if kind.starts_with(b"p") {
            let channels = self.channels.load(Ordering::Acquire);
            self.patterns.store(n - channels, Ordering::Release);
        } else if kind.starts_with(b"ss") || kind.starts_with(b"sun") {
            self.shard.store(n, Ordering::Release);
        } else {
            let patterns = self.patterns.load(Ordering::Acquire);
            self.channels.store(n - patterns, Ordering::Release);
        }
    }

    fn clear(&self) {
        for n in [&self.channels, &self.patterns, &self.shard] {
            n.store(0, Ordering::Release);
        }
    }
}

/// See [`Dedicated::watch`].
#[derive(Clone)]
pub struct Watch {
    shared: Arc<Shared>,
    local: Option<std::net::SocketAddr>,
}

impl Watch {
    /// Channels, patterns and shard channels subscribed to, apart.
    pub fn subscriptions(&self) -> [i64; 3] {
        let k = &self.shared.by_kind;
        [&k.channels, &k.patterns, &k.shard].map(|n| n.load(Ordering::Acquire).max(0))
    }

    /// Some request sent on the connection has no reply yet.
    pub fn busy(&self) -> bool {
        !self.shared.expect.lock().unwrap().is_empty() && !self.shared.dead.load(Ordering::Acquire)
    }

    /// The connection's own address, by which Redis's `CLIENT LIST` names it.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.local
    }
}

pub struct Dedicated {
    /// The connection's own address: Redis's `CLIENT LIST` names the
    /// connection by it.
    local: Option<std::net::SocketAddr>,
    wr: WriteHalf,
    shared: Arc<Shared>,
    reader: JoinHandle<()>,
    /// Requests of the proxy's own not yet written, whose replies are
    /// dropped (see [`Dedicated::prelude`]), and how many.
    prelude: Vec<u8>,
    prelude_count: usize,
}

impl Dedicated {
    /// A connection opened without the proxy's credentials.
    pub async fn open_plain(
        endpoint: &Endpoint,
        out: Arc<ClientState>,
    ) -> Result<Dedicated, UpstreamError> {
        let moved = endpoint.addr.moved_from(endpoint.addr.generation());
        Ok(Dedicated::start(
            endpoint.connect_plain().await?,
            out,
            moved,
        ))
    }

    /// A connection logged in from `ready` (the proxy's login, or a
    /// user's that a client proved, see `users`): one of its ready ones
    /// if it has one.
    pub async fn open_ready(
        ready: &Ready,
        out: Arc<ClientState>,
    ) -> Result<Dedicated, UpstreamError> {
        let (stream, generation) = ready.connect().await?;
        let moved = ready.moved_from(generation);
        Ok(Dedicated::start(stream, out, moved))
    }

    /// `moved` completes when the primary the connection was opened to is
    /// no longer the primary (Sentinel): the connection is then lost to
    /// its client, as if Redis had closed it.
    fn start(
        stream: Stream,
        out: Arc<ClientState>,
        moved: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Dedicated {
        let local = match &stream {
            Stream::Plain(s) => s.local_addr().ok(),
            Stream::Tls(s) => s.get_ref().0.local_addr().ok(),
        };
        let (rd, wr) = stream.split();
        let shared = Arc::new(Shared {
            expect: Mutex::new(VecDeque::new()),
            idle: Notify::new(),
            dead: AtomicBool::new(false),
            bound: AtomicBool::new(false),
            protocol: AtomicU8::new(2),
            subscriptions: AtomicI64::new(0),
            db: Arc::new(AtomicI64::new(0)),
            by_kind: ByKind::default(),
            relay: AtomicBool::new(false),
            bounce: std::sync::OnceLock::new(),
        });
        let reader = tokio::spawn(read_loop(rd, shared.clone(), out, moved));
        crate::telemetry::upstream().dedicated.increment(1.0);
        Dedicated {
            local,
            wr,
            shared,
            reader,
            prelude: Vec::new(),
            prelude_count: 0,
        }
    }

    /// `count` requests of the proxy's own, whose replies are dropped,
    /// written with the next request in the same write: setting up a new
    /// connection for its client costs no round trip, and no write of its
    /// own before the client's request.
    pub fn prelude(&mut self, bytes: &[u8], count: usize) {
        self.prelude.extend_from_slice(bytes);
        self.prelude_count += count;
    }

    /// Writes the prelude now, not with the next request: for a connection
    /// that must be set up before its client sends anything on it (one
    /// another client names to Redis, whose pushes must come in the
    /// client's protocol).
    pub async fn write_prelude(&mut self) {
        if !self.prelude.is_empty() {
            self.send_dropped(&[], 0).await;
        }
    }

    /// Writes a request; `expect` is `None` for requests whose replies do not
    /// pair with them one to one. An error means nothing was sent; a write
    /// that fails later is answered by the reader, which sees the connection
    /// close (Redis may have replied before closing, as on a protocol error).
    pub async fn send(
        &mut self,
        bytes: &[u8],
        expect: Option<Expect>,
    ) -> Result<(), UpstreamError> {
        if self.is_dead() {
            return Err(UpstreamError::ConnectionLost);
        }
        {
            // The prelude goes with this write, its replies first.
            let prelude = std::mem::take(&mut self.prelude_count);
            let mut q = self.shared.expect.lock().unwrap();
            q.extend(std::iter::repeat_with(|| Expect::Drop).take(prelude));
            if let Some(e) = expect {
                q.push_back(e);
            }
        }
        if self.write(bytes).await.is_err() {
            // Stop writing; the reader still gets what Redis sent.
            let _ = self.wr.shutdown().await;
        }
        Ok(())
    }

    async fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if self.prelude.is_empty() {
            self.wr.write_all(bytes).await?;
        } else {
            let mut joined = std::mem::take(&mut self.prelude);
            joined.extend_from_slice(bytes);
            self.wr.write_all(&joined).await?;
        }
        self.wr.flush().await
    }

    /// The connection becomes a relay (see `Shared::relay`): from the
    /// request written next on, which must be the `SYNC` or `PSYNC`.
    pub fn start_relay(&self) {
        self.shared.relay.store(true, Ordering::Release);
    }

    /// The client's bytes, as they came, on a relayed connection.
    pub async fn relay(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.write(bytes).await
    }

    /// `count` requests of the proxy's own whose replies are dropped.
    pub async fn send_dropped(&mut self, bytes: &[u8], count: usize) {
        {
            let prelude = std::mem::take(&mut self.prelude_count);
            let mut q = self.shared.expect.lock().unwrap();
            q.extend(std::iter::repeat_with(|| Expect::Drop).take(prelude + count));
        }
        if self.write(bytes).await.is_err() {
            let _ = self.wr.shutdown().await;
        }
    }

    /// The protocol a HELLO sent with `send_dropped` or in the prelude
    /// switches to: the requests sent after it are answered in it.
    pub fn assume_protocol(&self, protocol: u8) {
        self.shared.protocol.store(protocol, Ordering::Release);
    }

    pub fn protocol(&self) -> u8 {
        self.shared.protocol.load(Ordering::Acquire)
    }

    /// The database selected, as of the last confirmation that arrived
    /// (exact once the connection is idle).
    pub fn db(&self) -> i64 {
        self.shared.db.load(Ordering::Acquire)
    }

    /// A `SELECT` whose reply cannot be told from the others (replies do
    /// not pair with requests): taken as accepted.
    pub fn assume_db(&self, db: i64) {
        self.shared.db.store(db, Ordering::Release);
    }

    /// The transform of a `SELECT db` queued in a transaction: if EXEC
    /// runs it and Redis accepts it, the connection is in that database.
    pub fn select_in_exec(&self, db: i64) -> Box<dyn ReplyTransform> {
        Box::new(SelectedInExec {
            db,
            cell: self.shared.db.clone(),
        })
    }

    /// Channels, patterns and shard channels the connection is subscribed
    /// to, as of the last confirmation that arrived.
    pub fn subscriptions(&self) -> i64 {
        self.shared.subscriptions.load(Ordering::Acquire)
    }

    /// A view of the connection's state for others to read while it
    /// changes (the table of clients).
    pub fn watch(&self) -> Watch {
        Watch {
            shared: self.shared.clone(),
            local: self.local,
        }
    }

    /// [`Routed`] requests a node turns away go to `tx`, each followed by
    /// a `ring`; without it they are answered as any request.
    pub fn on_bounce(&self, tx: tokio::sync::mpsc::UnboundedSender<Bounced>, ring: Doorbell) {
        let _ = self.shared.bounce.set((tx, ring));
    }

    pub fn is_bound(&self) -> bool {
        self.shared.bound.load(Ordering::Acquire)
    }

    /// Waits until everything Redis sends before the reply to a request
    /// sent now has arrived, also when replies do not pair with requests.
    pub async fn drain_unpaired(&mut self) {
        let token = b"ackproxy-drain".to_vec();
        let mut subscribed = format!("*2\r\n$4\r\npong\r\n${}\r\n", token.len()).into_bytes();
        subscribed.extend_from_slice(&token);
        subscribed.extend_from_slice(b"\r\n");
        let mut plain = format!("${}\r\n", token.len()).into_bytes();
        plain.extend_from_slice(&token);
        plain.extend_from_slice(b"\r\n");
        let ping = super::encode_command(&[b"PING", &token]);
        if self
            .send(&ping, Some(Expect::Sentinel(subscribed, plain)))
            .await
            .is_ok()
        {
            self.idle().await;
        }
    }

    pub fn is_dead(&self) -> bool {
        self.shared.dead.load(Ordering::Acquire)
    }

    pub fn set_bound(&self, bound: bool) {
        self.shared.bound.store(bound, Ordering::Release);
    }

    pub fn is_idle(&self) -> bool {
        self.shared.expect.lock().unwrap().is_empty()
    }

    /// Waits until every paired request has its reply.
    pub async fn idle(&self) {
        loop {
            let n = self.shared.idle.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.is_idle() || self.is_dead() {
                return;
            }
            n.await;
        }
    }
}

impl Drop for Dedicated {
    fn drop(&mut self) {
        // Closing the socket also unblocks a blocking command in Redis, so
        // nothing is popped for a client that is gone.
        self.reader.abort();
        crate::telemetry::upstream().dedicated.decrement(1.0);
    }
}

async fn read_loop(
    mut rd: ReadHalf,
    shared: Arc<Shared>,
    out: Arc<ClientState>,
    moved: impl std::future::Future<Output = ()>,
) {
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut scanner = ReplyScanner::new();
    let mut relaying = false;
    tokio::pin!(moved);
    let failure = 'outer: loop {
        crate::resp::grow(&mut buf, 16 * 1024);
        let read = tokio::select! {
            r = rd.read_buf(&mut buf) => r,
            () = &mut moved => break UpstreamError::ConnectionLost,
        };
        match read {
            Ok(0) | Err(_) => break UpstreamError::ConnectionLost,
            Ok(_) => {}
        }
        // Replies forwarded as they are, gathered into one push.
        let mut raw_len = 0usize;
        let mut raw_count = 0u32;
        loop {
            if relaying
                || (shared.relay.load(Ordering::Acquire)
                    && shared.expect.lock().unwrap().is_empty())
            {
                // Everything from here on goes as it comes, scanned or not.
                relaying = true;
                raw_len = buf.len();
                break;
            }
            let len = match scanner.scan(&buf[raw_len..]) {
                Ok(Some(len)) => len,
                Ok(None) => break,
                Err(_) => break 'outer UpstreamError::BadReply,
            };
            let start = raw_len;
            let is_push = buf[start] == b'>';
            if let Some(n) = subscription_count(&buf[start..start + len]) {
                shared.subscriptions.store(n, Ordering::Release);
                shared.by_kind.confirmed(&buf[start..start + len], n);
            } else if &buf[start..start + len] == b"+RESET\r\n" {
                // Only RESET answers so; it ends subscriptions silently.
                shared.subscriptions.store(0, Ordering::Release);
                shared.by_kind.clear();
                shared.protocol.store(2, Ordering::Release);
                shared.db.store(0, Ordering::Release);
            }
            // A reply that is not the last of a joined expectation goes
            // into it; the expectation stays queued (the connection is not
            // idle) until the last one.
            let mut joined = false;
            let expect = if is_push {
                None
            } else {
                let mut q = shared.expect.lock().unwrap();
                match q.front_mut() {
                    Some(Expect::Sentinel(a, b)) => {
                        let frame = &buf[start..start + len];
                        if frame == &a[..] || frame == &b[..] {
                            q.pop_front()
                        } else {
                            None
                        }
                    }
                    Some(Expect::Joined { left, .. } | Expect::Gather { left, .. })
                        if *left > 1 =>
                    {
                        *left -= 1;
                        joined = true;
                        None
                    }
                    _ => q.pop_front(),
                }
            };
            if joined {
                if raw_len > 0 {
                    out.ready(buf.split_to(raw_len).freeze(), raw_count);
                    raw_len = 0;
                    raw_count = 0;
                }
                let reply = buf.split_to(len);
                if let Some(Expect::Joined { got, .. } | Expect::Gather { got, .. }) =
                    shared.expect.lock().unwrap().front_mut()
                {
                    got.extend_from_slice(&reply);
                }
                continue;
            }
            match expect {
                None => raw_len += len,
                Some(Expect::Raw) => {
                    raw_len += len;
                    raw_count += 1;
                }
                Some(Expect::Protocol(p)) => {
                    if buf[start] != b'-' {
                        shared.protocol.store(p, Ordering::Release);
                    }
                    raw_len += len;
                    raw_count += 1;
                }
                Some(Expect::Select(db)) => {
                    if buf[start] != b'-' {
                        shared.db.store(db, Ordering::Release);
                    }
                    raw_len += len;
                    raw_count += 1;
                }
                Some(Expect::Checked(p, tx)) => {
                    let ok = buf[start] != b'-';
                    if let (true, Some(p)) = (ok, p) {
                        shared.protocol.store(p, Ordering::Release);
                    }
                    let _ = tx.send(ok);
                    raw_len += len;
                    raw_count += 1;
                }
                Some(Expect::Gather { mut got, tx, .. }) => {
                    if raw_len > 0 {
                        out.ready(buf.split_to(raw_len).freeze(), raw_count);
                        raw_len = 0;
                        raw_count = 0;
                    }
                    got.extend_from_slice(&buf.split_to(len));
                    let _ = tx.send(got.freeze());
                }
                Some(Expect::Routed(mut r)) => {
                    let bounce = shared.bounce.get();
                    let away = bounce.is_some() && r.turned_away(&buf[start..start + len]);
                    if !away && r.seq.is_none() && !matches!(r.role, Role::Exec { .. }) {
                        raw_len += len;
                        raw_count += 1;
                        continue;
                    }
                    if raw_len > 0 {
                        out.ready(buf.split_to(raw_len).freeze(), raw_count);
                        raw_len = 0;
                        raw_count = 0;
                    }
                    let reply = buf.split_to(len).freeze();
                    match (away, r.seq) {
                        (true, _) => {
                            r.seq = Some(r.seq.unwrap_or_else(|| out.hold_dedicated()));
                            if let Some((tx, ring)) = bounce {
                                let _ = tx.send(Bounced { routed: *r, reply });
                                ring();
                            }
                        }
                        (false, Some(seq)) => {
                            let reply = r.answer(reply);
                            out.fill(seq, Ok(reply));
                        }
                        (false, None) => out.ready(r.answer(reply), 1),
                    }
                }
                Some(Expect::Sentinel(..) | Expect::Drop) => {
                    if raw_len > 0 {
                        out.ready(buf.split_to(raw_len).freeze(), raw_count);
                        raw_len = 0;
                        raw_count = 0;
                    }
                    let _ = buf.split_to(len);
                }
                Some(other) => {
                    if raw_len > 0 {
                        out.ready(buf.split_to(raw_len).freeze(), raw_count);
                        raw_len = 0;
                        raw_count = 0;
                    }
                    let reply = buf.split_to(len).freeze();
                    out.ready(transform(other, reply), 1);
                }
            }
        }
        if raw_len > 0 {
            out.ready(buf.split_to(raw_len).freeze(), raw_count);
        }
        if shared.expect.lock().unwrap().is_empty() {
            shared.idle.notify_waiters();
        }
    };
    shared.dead.store(true, Ordering::Release);
    let mut pending: Vec<Expect> = shared.expect.lock().unwrap().drain(..).collect();
    // Places held for requests sent again here are filled, also when the
    // client goes with the connection: the stream writes up to its end.
    pending.retain(|e| match e {
        Expect::Routed(r) if r.seq.is_some() => {
            out.fill(r.seq.unwrap_or_default(), Err(failure.clone()));
            false
        }
        _ => true,
    });
    if shared.bound.load(Ordering::Acquire) {
        // As if Redis had closed the client's own connection: what it sent
        // before closing is delivered, and nothing else.
        out.finish();
    } else {
        // One error per request of the client's; the proxy's own get none
        // (the client never sent them, and counts no reply for them).
        for e in pending {
            if !matches!(
                e,
                Expect::Drop | Expect::Sentinel(..) | Expect::Gather { .. }
            ) {
                out.ready(Bytes::from(failure.to_reply()), 1);
            }
        }
    }
    shared.idle.notify_waiters();
}

/// A queue operation on this connection found the proxy's function library
/// gone (a `FUNCTION FLUSH` since it was loaded) and cannot be sent again
/// from here; it did nothing.
const LIBRARY_MISSING: &[u8] =
    b"-ERR ackproxy: the queue function library is not loaded in Redis; nothing was done, try again\r\n";

/// A queue operation on this connection needed a further call, which
/// cannot be sent from here (only operations of one call are).
const CUT_SHORT: &[u8] =
    b"-ERR ackproxy: the queue operation needed more than one call here; try again\r\n";

fn transform(expect: Expect, reply: Bytes) -> Bytes {
    match expect {
        Expect::Raw | Expect::Protocol(_) | Expect::Checked(..) | Expect::Select(_) => reply,
        Expect::Exec(ts) => transform_exec(ts, reply),
        Expect::Sentinel(..) | Expect::Drop | Expect::Gather { .. } => Bytes::new(),
        Expect::Routed(mut r) => r.answer(reply),
        Expect::Joined {
            mut got,
            transform: mut t,
            ..
        } => {
            got.extend_from_slice(&reply);
            match t.apply(got.freeze()) {
                Transformed::Done(b) => b,
                Transformed::Retry { .. } => Bytes::from_static(LIBRARY_MISSING),
                Transformed::Continue(_) => Bytes::from_static(CUT_SHORT),
            }
        }
        Expect::Transformed(mut t) => match t.apply(reply) {
            Transformed::Done(b) => b,
            Transformed::Retry { .. } => Bytes::from_static(LIBRARY_MISSING),
            // Only operations that fit one call are sent here.
            Transformed::Continue(_) => Bytes::from_static(CUT_SHORT),
        },
    }
}

/// Notes the database of a `SELECT` that a transaction ran, from its
/// element of EXEC's reply; the element passes unchanged.
struct SelectedInExec {
    db: i64,
    cell: Arc<AtomicI64>,
}

impl ReplyTransform for SelectedInExec {
    fn apply(&mut self, reply: Bytes) -> Transformed {
        if reply.first() != Some(&b'-') {
            self.cell.store(self.db, Ordering::Release);
        }
        Transformed::Done(reply)
    }
}

/// The subscription count a (P|S)(UN)SUBSCRIBE confirmation reports.
fn subscription_count(frame: &[u8]) -> Option<i64> {
    if !(frame.starts_with(b"*3\r\n$") || frame.starts_with(b">3\r\n$")) || frame.len() > 4096 {
        return None;
    }
    let kind_len_end = 4 + frame[4..].windows(2).position(|w| w == b"\r\n")?;
    let kind_len: usize = std::str::from_utf8(&frame[5..kind_len_end])
        .ok()?
        .parse()
        .ok()?;
    let kind = frame.get(kind_len_end + 2..kind_len_end + 2 + kind_len)?;
    const KINDS: &[&[u8]] = &[
        b"subscribe",
        b"psubscribe",
        b"ssubscribe",
        b"unsubscribe",
        b"punsubscribe",
        b"sunsubscribe",
    ];
    if !KINDS.iter().any(|k| k.eq_ignore_ascii_case(kind)) {
        return None;
    }
    let body = frame.strip_suffix(b"\r\n")?;
    let colon = body.iter().rposition(|&b| b == b':')?;
    if body[..colon].last() != Some(&b'\n') {
        return None;
    }
    crate::resp::parse_i64(&body[colon + 1..])
}

/// Rewrites the elements of an EXEC reply that answer rewritten requests.
/// Anything but an array (EXECABORT, a nil for a failed WATCH) passes as is.
pub fn transform_exec(mut ts: Vec<Option<Box<dyn ReplyTransform>>>, reply: Bytes) -> Bytes {
    if reply.first() != Some(&b'*') || ts.iter().all(Option::is_none) {
        return reply;
    }
    let Some(header_end) = reply.windows(2).position(|w| w == b"\r\n") else {
        return reply;
    };
    let mut out = BytesMut::with_capacity(reply.len());
    out.extend_from_slice(&reply[..header_end + 2]);
    let mut at = header_end + 2;
    let mut i = 0;
    while at < reply.len() {
        let mut scanner = ReplyScanner::new();
        let Ok(Some(len)) = scanner.scan(&reply[at..]) else {
            return reply;
        };
        let element = reply.slice(at..at + len);
        match ts.get_mut(i).and_then(Option::take) {
            Some(mut t) => match t.apply(element) {
                Transformed::Done(b) => out.extend_from_slice(&b),
                Transformed::Retry { .. } => out.extend_from_slice(LIBRARY_MISSING),
                Transformed::Continue(_) => out.extend_from_slice(CUT_SHORT),
            },
            None => out.extend_from_slice(&element),
        }
        at += len;
        i += 1;
    }
    out.freeze()
}
