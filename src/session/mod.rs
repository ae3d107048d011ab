//! One client connection: frame its requests, classify each, and send it to
//! the right place — the shared upstream, the client's dedicated upstream
//! connection, the queue interceptor, or an answer of the proxy's own —
//! while its writer task returns the replies in request order.

mod auth;
mod bounce;
mod buffers;
mod client_table;
mod decide;
mod handover;
mod meta;
pub mod mode;
mod pop_order;
pub mod route;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::sync::watch;

use crate::cluster::{self, topology::Topology};
use crate::command::{classify_writes, may_write, Args, Kind};
use crate::config::{Config, LimitsConfig};
use crate::error::UpstreamError;
use crate::net::{ReadHalf, Stream};
use crate::output::{self, ClientState, ReplyTransform};
use crate::queue::library::visible::View;
use crate::queue::{Left, Outcome, Queues};
use crate::resp::{RequestScanner, Scan};
use crate::telemetry::Route as Served;
use crate::upstream::dedicated::{Dedicated, Expect};
use crate::upstream::ready::Ready;
use crate::upstream::shared::SharedUpstream;
use crate::upstream::users::{Member, Users};
use crate::upstream::Endpoint;
use decide::Decision;
use mode::Mode;
use pop_order::PopOrder;
use route::{oversized, route, Facts, Lane, Pause, Route};

/// What every session shares.
pub struct Context {
    /// As at start-up; `limits` is read from [`Context::limits`] instead,
    /// which SIGHUP replaces.
    pub config: Arc<Config>,
    pub endpoint: Arc<Endpoint>,
    shared: Mutex<Vec<SharedUpstream>>,
    next_shared: AtomicUsize,
    /// Shared connections that speak RESP3, opened once a client needs one.
    shared_resp3: Mutex<Vec<SharedUpstream>>,
    /// Always there: SIGHUP may bring the first rule (see [`Queues::active`]).
    pub queues: Arc<Queues>,
    limits: std::sync::RwLock<Arc<LimitsConfig>>,
    pub shutdown: watch::Receiver<bool>,
    /// The last `CLIENT PAUSE` made through the proxy, while it may last.
    pause: Mutex<Option<Pause>>,
    /// Whether `pause` may hold one: read on every request without a lock.
    maybe_paused: std::sync::atomic::AtomicBool,
    /// `ACL DRYRUN` answers for queue operations.
    permissions: crate::auth::Permissions,
    /// Shared connections of logged-in users.
    users: Arc<Users>,
    /// Connections logged in as the proxy, ready for clients' own.
    ready: Ready,
    /// The proxy's own password for clients, if it asks for one.
    requirepass: Option<crate::auth::Password>,
    /// Every client connected, as `CLIENT LIST` shows them.
    pub clients: Arc<crate::clients::Registry>,
    /// With a Redis Cluster upstream: its nodes, and ready connections to
    /// each for clients' own.
    cluster: Option<Arc<Topology>>,
    node_ready: Mutex<std::collections::HashMap<String, Arc<Ready>>>,
    /// The proxies shown to cluster-aware clients (`cluster_announce`).
    announce: Option<cluster::announce::Announce>,
}

impl Context {
    pub fn new(
        config: Arc<Config>,
        endpoint: Arc<Endpoint>,
        queues: Arc<Queues>,
        shutdown: watch::Receiver<bool>,
        cluster: Option<Arc<Topology>>,
    ) -> Context {
        let shared = (0..config.shared_connections)
            .map(|_| match &cluster {
                Some(t) => cluster::Shared::handle(t.clone(), cluster::Flavor::Pair),
                None => SharedUpstream::spawn_pair(endpoint.clone()),
            })
            .collect();
        // A logged-in user's pool would be one more set of connections per
        // node: in a cluster such clients keep their own connection.
        let pools = if config.dedicated_per_client || cluster.is_some() {
            0
        } else {
            config.user_connections_max
        };
        let users = Users::new(endpoint.clone(), pools, config.dedicated_pool);
        let ready = Ready::start(
            endpoint.clone(),
            None,
            if cluster.is_some() {
                0
            } else {
                config.dedicated_pool
            },
        );
        let announce = (!config.cluster_announce.is_empty())
            .then(|| cluster::announce::Announce::new(&config.cluster_announce, &config.listen));
        let requirepass = config
            .client_password()
            .map(|p| crate::auth::Password::new(p.as_bytes()));
        Context {
            users,
            ready,
            requirepass,
            limits: std::sync::RwLock::new(Arc::new(config.limits.clone())),
            config,
            endpoint,
            shared: Mutex::new(shared),
            next_shared: AtomicUsize::new(0),
            shared_resp3: Mutex::new(Vec::new()),
            queues,
            shutdown,
            pause: Mutex::new(None),
            maybe_paused: std::sync::atomic::AtomicBool::new(false),
            permissions: Default::default(),
            clients: Default::default(),
            announce,
            cluster,
            node_ready: Mutex::new(Default::default()),
        }
    }

    /// Connections to the cluster node at `addr`, logged in as the proxy.
    fn ready_at(&self, topology: &Topology, addr: &str) -> Arc<Ready> {
        let mut ready = self.node_ready.lock().unwrap();
        ready
            .entry(addr.to_string())
            .or_insert_with(|| Arc::new(Ready::start(topology.endpoint(addr), None, 0)))
            .clone()
    }

    /// The `[limits]` in force: a connection takes them when it is accepted.
    pub fn limits(&self) -> Arc<LimitsConfig> {
        self.limits.read().unwrap().clone()
    }

    /// New limits, from a reload, for the connections accepted from now on
    /// (and every client's next idle wait).
    pub fn set_limits(&self, limits: LimitsConfig) {
        *self.limits.write().unwrap() = Arc::new(limits);
    }

    fn pause(&self) -> Option<Pause> {
        if !self.maybe_paused.load(Ordering::Relaxed) {
            return None;
        }
        let mut p = self.pause.lock().unwrap();
        if p.is_some_and(|p| Instant::now() >= p.until) {
            *p = None;
        }
        if p.is_none() {
            self.maybe_paused.store(false, Ordering::Relaxed);
        }
        *p
    }

    /// Tracks CLIENT PAUSE and UNPAUSE as Redis will apply them: a new pause
    /// keeps the later end and the stricter mode.
    fn note_pause(&self, args: Args<'_>) {
        let mut p = self.pause.lock().unwrap();
        if args.is(1, "UNPAUSE") {
            if args.len() == 2 {
                *p = None;
            }
        } else if let Some(new) = route::parse_pause(args, Instant::now()) {
            *p = Some(match *p {
                Some(old) => Pause {
                    until: old.until.max(new.until),
                    all: old.all || new.all,
                },
                None => new,
            });
            self.maybe_paused.store(true, Ordering::Relaxed);
        }
    }

    /// A client keeps one shared connection for life, which keeps its
    /// requests in order.
    fn pick_shared(&self) -> SharedUpstream {
        let shared = self.shared.lock().unwrap();
        let i = self.next_shared.fetch_add(1, Ordering::Relaxed);
        shared[i % shared.len()].clone()
    }

    /// The RESP3 counterpart of `pick_shared`.
    fn pick_shared_resp3(&self) -> SharedUpstream {
        let mut shared = self.shared_resp3.lock().unwrap();
        if shared.is_empty() {
            *shared = (0..self.config.shared_connections.max(1))
                .map(|_| match &self.cluster {
                    Some(t) => cluster::Shared::handle(t.clone(), cluster::Flavor::Resp3),
                    None => SharedUpstream::spawn_resp3(self.endpoint.clone()),
                })
                .collect();
        }
        let i = self.next_shared.fetch_add(1, Ordering::Relaxed);
        shared[i % shared.len()].clone()
    }

    /// A shared connection not busy with big replies, opening one more if
    /// all are (up to a few times the configured number).
    fn uncongested_shared(&self) -> Option<SharedUpstream> {
        let mut shared = self.shared.lock().unwrap();
        if let Some(s) = shared.iter().find(|s| !s.is_congested()) {
            return Some(s.clone());
        }
        if shared.len() >= 4 * self.config.shared_connections.max(1) {
            return None;
        }
        let s = match &self.cluster {
            Some(t) => cluster::Shared::handle(t.clone(), cluster::Flavor::Pair),
            None => SharedUpstream::spawn_pair(self.endpoint.clone()),
        };
        shared.push(s.clone());
        Some(s)
    }
}

/// Like Redis's client-query-buffer-limit: a client whose unparsed input
/// grows past this is closed.
const QUERY_BUFFER_LIMIT: usize = 1024 * 1024 * 1024;

/// Redis's refusal of a command in RESP2 subscribed mode.
fn not_in_subscribed_context(name: &[u8]) -> Bytes {
    let name = String::from_utf8_lossy(name).to_ascii_lowercase();
    Bytes::from(format!(
        "-ERR Can't execute '{name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context\r\n"
    ))
}

/// Why a session stops reading.
enum Stop {
    /// The client closed its side or broke the connection.
    Gone,
    /// QUIT, a protocol error, or shutdown: flush the replies, then close.
    Finish,
}

/// What a step of [`Session::serve`] that may serve a request did.
enum Step {
    /// Not this step's request: the next one looks at it.
    Pass,
    /// Served; the session reads on.
    Served,
    /// Served, and the connection ends.
    Stop(Stop),
}

impl Step {
    fn stop(self) -> Option<Stop> {
        match self {
            Step::Stop(stop) => Some(stop),
            Step::Pass | Step::Served => None,
        }
    }
}

pub async fn run(stream: Stream, ctx: Arc<Context>, peer: Option<std::net::SocketAddr>) {
    let origin = crate::clients::Origin::of(&stream, peer);
    let (rd, wr) = stream.split();
    let shared = ctx.pick_shared();
    let limits = ctx.limits();
    let out = ClientState::for_client(
        limits.client_output_buffer_limit,
        limits.max_inflight_per_client,
        peer,
    );
    let writer = tokio::spawn(output::run_writer(wr, out.clone(), shared.clone()));
    let conn = crate::queue::leases::owners::next_conn();
    let mut session = Session {
        conn,
        client: ctx.clients.register(conn, origin, out.clone()),
        scanner: RequestScanner::new(limits.scanner_limits()),
        buf: BytesMut::new(),
        ranges: Vec::new(),
        rd,
        out,
        shared,
        lane: Lane::Writes,
        shared_resp3: None,
        meta: meta::Meta::default(),
        dedicated: None,
        dedicated_node: None,
        node_wanted: None,
        pinned: ctx.config.dedicated_per_client,
        bounces: ctx.cluster.as_ref().map(|_| bounce::Bounces::default()),
        mode: Mode::default(),
        auth: crate::auth::State::Open,
        member: None,
        started: Instant::now(),
        pop_order: PopOrder::default(),
        redirect_ids: None,
        relaying: false,
        held: None,
        ctx,
    };
    session.set_auth(crate::auth::State::at_connect(session.proxy_password()));
    // A client that must log in never uses the proxy's connections.
    session.pinned |= !session.shares();
    let clients = crate::telemetry::clients();
    clients.connections.increment(1.0);
    clients.connections_total.increment(1);
    let stop = session.read_loop().await;
    if let Stop::Finish = stop {
        if let Some(d) = &session.dedicated {
            d.idle().await;
        }
    }
    session.out.finish();
    let _ = writer.await;
    session.ctx.queues.closed(
        session.conn,
        *session.ctx.shutdown.borrow(),
        &session.shared,
    );
    clients.connections.decrement(1.0);
}

struct Session {
    /// Names the connection for queue rules that track leases by connection,
    /// and is the client's id.
    conn: u64,
    /// The client's entry in the table of clients.
    client: crate::clients::Client,
    ctx: Arc<Context>,
    rd: ReadHalf,
    buf: BytesMut,
    /// The argument positions of the request being handled.
    ranges: Vec<std::ops::Range<usize>>,
    scanner: RequestScanner,
    out: Arc<ClientState>,
    shared: SharedUpstream,
    /// The lane of the shared pair the client's requests in flight there
    /// are on (meaningless while none is).
    lane: Lane,
    /// The client's shared connection for stateless requests in RESP3.
    shared_resp3: Option<SharedUpstream>,
    /// Name, library and protocol, as the client set them.
    meta: meta::Meta,
    dedicated: Option<Dedicated>,
    /// Redis's id of the connection the client's last `CLIENT TRACKING …
    /// REDIRECT id` named, and that `id` (the proxy's): see
    /// `redirect_view`.
    redirect_ids: Option<(u64, u64)>,
    /// In a cluster: the node the dedicated connection is to, and the one
    /// the next one opened should be to.
    dedicated_node: Option<String>,
    node_wanted: Option<String>,
    /// Requests go to the dedicated connection.
    pinned: bool,
    /// In a cluster: requests a node turned away, and the transaction
    /// state that sending them again needs.
    bounces: Option<bounce::Bounces>,
    mode: Mode,
    auth: crate::auth::State,
    /// The pool of the user the client logged in as: its stateless
    /// commands go on that connection rather than the proxy's.
    member: Option<Member>,
    /// When the client connected.
    started: Instant,
    pop_order: PopOrder,
    /// After `SYNC` or `PSYNC`: the client is a replica (or `redis-cli
    /// --rdb`), whose connection carries an RDB payload and then the
    /// replication stream, no RESP replies to requests; its bytes and
    /// Redis's are relayed as they come.
    relaying: bool,
    /// The client's next request waits for this: the reply of a queue
    /// script that may send a second call is resolved (see
    /// `queue::Intercept::Scripted`).
    held: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl Session {
    async fn read_loop(&mut self) -> Stop {
        // Made once, not at every read: each one made registers a waiter
        // in a Notify (the client's, and the shutdown watch's shared one),
        // which cost about 10% of a passthrough request's instructions.
        let out = self.out.clone();
        let closed = out.closed();
        tokio::pin!(closed);
        let mut shutdown = self.ctx.shutdown.clone();
        let stopping = shutdown.changed();
        tokio::pin!(stopping);
        let mut asked = self.client.asked();
        loop {
            if self.buf.is_empty() && self.buf.capacity() > 0 {
                // A waiting client holds no buffer.
                buffers::give(std::mem::take(&mut self.buf));
            }
            let idle = self.idle_timeout();
            tokio::select! {
                biased;
                _ = &mut closed => return Stop::Gone,
                _ = &mut stopping => return Stop::Finish,
                r = self.rd.readable() => if r.is_err() { return Stop::Gone },
                // After the client's bytes: a client that keeps sending
                // pays nothing for it, and another client's redirect
                // naming it waits until it pauses.
                asks = &mut asked => {
                    if !asks.is_empty() {
                        self.open_for_redirect(asks).await;
                    }
                    while let Some(b) = self.bounces.as_mut().and_then(bounce::Bounces::next) {
                        self.bounced(b).await;
                    }
                    continue;
                }
                _ = tokio::time::sleep(idle.unwrap_or(Duration::from_secs(86_400))), if idle.is_some() => {
                    if self.out.unwritten() == 0 {
                        return Stop::Gone;
                    }
                }
            }
            // The buffer is taken only once there is something to read,
            // so idle connections cost almost nothing.
            if self.buf.capacity() == 0 {
                self.buf = buffers::take();
            }
            crate::resp::grow(&mut self.buf, buffers::READ_SIZE);
            match self.rd.try_read_buf(&mut self.buf) {
                Ok(0) => return Stop::Gone,
                Ok(_) => {
                    self.out.received();
                    self.pop_order.read(self.out.unwritten() > 0);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => return Stop::Gone,
            }
            if self.buf.len() > QUERY_BUFFER_LIMIT {
                tracing::warn!(
                    client = %self.out.peer(),
                    "client query buffer limit reached, closing"
                );
                return Stop::Gone;
            }
            if let Some(stop) = self.process().await {
                return stop;
            }
            self.client.update(self.snapshot());
            if self.out.unwritten() >= self.out.inflight_limit() {
                self.out.below_inflight_limit().await;
            }
        }
    }

    /// What the client sent, to Redis as it is (see `relaying`).
    async fn relay(&mut self) -> Option<Stop> {
        let sent = match self.dedicated.as_mut() {
            Some(d) => d.relay(&self.buf).await.is_ok(),
            None => false,
        };
        self.buf.clear();
        (!sent).then_some(Stop::Gone)
    }

    /// Like Redis's `timeout`: idle clients are closed, but never ones
    /// waiting in a blocking command or subscribed.
    fn idle_timeout(&self) -> Option<Duration> {
        let secs = self.ctx.limits.read().unwrap().idle_timeout_secs;
        if secs == 0 || self.mode.unpaired || self.dedicated.as_ref().is_some_and(|d| !d.is_idle())
        {
            return None;
        }
        Some(Duration::from_secs(secs))
    }

    /// Handles every complete request in the buffer. Consecutive requests
    /// bound for the shared upstream leave as one batch.
    async fn process(&mut self) -> Option<Stop> {
        if let Some(resolved) = self.held.take() {
            // Sent or dropped: either way that reply is settled.
            let _ = resolved.await;
        }
        if self.relaying {
            return self.relay().await;
        }
        let mut pos = 0;
        let mut batch = 0u32;
        // Some request of the batch may write.
        let mut writes = false;
        loop {
            match self.scanner.scan(&self.buf[pos..]) {
                Scan::Incomplete => break,
                Scan::Skip(n) => {
                    if batch == 0 {
                        self.buf.advance(n);
                    } else {
                        // Redis ignores these bytes too.
                        pos += n;
                    }
                }
                Scan::Command(n) => {
                    if self.pinned {
                        self.maybe_unpin();
                    }
                    let args = Args::new(&self.buf[pos..pos + n], self.scanner.args());
                    let (kind, may_write) = classify_writes(args);
                    self.client.command(kind, args);
                    let decision = self.decide(kind, args, may_write);
                    if let Decision::Batch { writes: w } = decision {
                        writes |= w;
                        pos += n;
                        batch += 1;
                        continue;
                    }
                    if self.waits_for_reads(batch, writes) {
                        self.out.shared_drained().await;
                    }
                    self.flush_batch(pos, batch, writes);
                    (pos, batch, writes) = (0, 0, false);
                    // The argument positions outlive the scanner's next
                    // request: copied, into a list kept for the next one.
                    let mut ranges = std::mem::take(&mut self.ranges);
                    ranges.clear();
                    ranges.extend_from_slice(self.scanner.args());
                    let frame = self.buf.split_to(n).freeze();
                    let stop = self.serve(decision, kind, frame, &ranges).await;
                    self.ranges = ranges;
                    if let Some(stop) = stop {
                        return Some(stop);
                    }
                    if self.relaying {
                        return self.relay().await;
                    }
                }
                Scan::Inline { consumed, encoded } => {
                    if self.waits_for_reads(batch, writes) {
                        self.out.shared_drained().await;
                    }
                    self.flush_batch(pos, batch, writes);
                    (pos, batch, writes) = (0, 0, false);
                    self.buf.advance(consumed);
                    let ranges = self.scanner.args().to_vec();
                    let frame = Bytes::from(encoded);
                    let args = Args::new(&frame, &ranges);
                    let (kind, may_write) = classify_writes(args);
                    self.client.command(kind, args);
                    let decision = self.decide(kind, args, may_write);
                    if let Some(stop) = self.serve(decision, kind, frame, &ranges).await {
                        return Some(stop);
                    }
                }
                Scan::Error(e) => {
                    if self.waits_for_reads(batch, writes) {
                        self.out.shared_drained().await;
                    }
                    self.flush_batch(pos, batch, writes);
                    self.answer(Bytes::from(e.to_reply())).await;
                    return Some(Stop::Finish);
                }
            }
        }
        if self.waits_for_reads(batch, writes) {
            self.out.shared_drained().await;
        }
        self.flush_batch(pos, batch, writes);
        None
    }

    /// Whether `count` requests for the shared pair, which may write if
    /// `writes`, must wait until the client's reads in flight are answered
    /// (see [`route::lane`]). Checked here, so that the common path awaits
    /// nothing.
    fn waits_for_reads(&self, count: u32, writes: bool) -> bool {
        count > 0 && writes && self.lane == Lane::Reads && !self.out.shared_idle()
    }

    /// Sends the batch (after [`Session::waits_for_reads`]).
    fn flush_batch(&mut self, len: usize, count: u32, writes: bool) {
        if count == 0 {
            if len > 0 {
                self.buf.advance(len);
            }
            return;
        }
        let bytes = self.buf.split_to(len).freeze();
        self.send_shared(bytes, count, writes);
    }

    /// Stateless requests, on the connection of the client's user: its
    /// pool's, or the proxy's (its RESP3 pair for a client that speaks
    /// RESP3); `writes` if some of them may write (after
    /// [`Session::waits_for_reads`]).
    fn send_shared(&mut self, bytes: Bytes, count: u32, writes: bool) {
        if self.member.is_none() && self.meta.protocol != 3 {
            self.avoid_congestion();
        }
        let inflight = (!self.out.shared_idle()).then_some(self.lane);
        self.lane = route::lane(writes, inflight);
        debug_assert!(inflight != Some(Lane::Reads) || self.lane == Lane::Reads);
        if self.member.is_none() && self.meta.protocol == 3 {
            let shared = self.protocol_shared();
            match self.lane {
                Lane::Writes => shared.send(bytes, count, &self.out, None),
                Lane::Reads => shared.send_reads(bytes, count, &self.out),
            }
            return;
        }
        let shared = self.member.as_ref().map_or(&self.shared, |m| m.shared());
        match self.lane {
            Lane::Writes => shared.send(bytes, count, &self.out, None),
            Lane::Reads => shared.send_reads(bytes, count, &self.out),
        }
    }

    /// Before a request of the client's goes on the writes lane by another
    /// way than [`Session::send_shared`] (a queue operation, CONFIG SET
    /// requirepass): its reads in flight are answered first.
    pub(super) async fn enter_writes_lane(&mut self) {
        if self.waits_for_reads(1, true) {
            self.out.shared_drained().await;
        }
        self.lane = Lane::Writes;
    }

    /// Serves a request as [`Session::decide`] decided, unless it was
    /// batched.
    async fn serve(
        &mut self,
        decision: Decision,
        kind: Kind,
        frame: Bytes,
        ranges: &[std::ops::Range<usize>],
    ) -> Option<Stop> {
        let args = Args::of_frame(&frame, ranges);
        if kind == Kind::Multi {
            self.pop_order.transaction_opened();
        }
        if kind == Kind::Reset {
            self.reset_meta().await;
        }
        let mut decision = decision;
        match decision {
            Decision::Hello if self.hello(args, &frame).await => return None,
            Decision::ClientMeta if self.client_meta(args).await => {
                self.client.update(self.snapshot());
                return None;
            }
            // A login (HELLO … AUTH), or what Redis must answer.
            Decision::Hello | Decision::ClientMeta => decision = Decision::Forward,
            _ => {}
        }
        // A RESET logs out a client that needed no login when it connected
        // if a login is wanted now; a login may change the connection the
        // client's commands go on.
        if self.auth != crate::auth::State::Open || matches!(kind, Kind::Reset | Kind::Sticky) {
            match self.guard(kind, args, &frame).await {
                Step::Pass => {}
                served => return served.stop(),
            }
        }
        match decision {
            Decision::ClientTable => return self.client_table(args, &frame).await.stop(),
            Decision::Quit => {
                self.answer(Bytes::from_static(b"+OK\r\n")).await;
                return Some(Stop::Finish);
            }
            Decision::Reset => {
                self.mode = Mode::default();
                self.out
                    .answer(Bytes::from_static(b"+RESET\r\n"), Served::Proxy);
                return None;
            }
            Decision::Queue => match self.queue(kind, args).await {
                Step::Pass => decision = self.decide_unqueued(kind, args, may_write(args)),
                served => return served.stop(),
            },
            _ => {}
        }
        if kind == Kind::Urgent && args.is(0, "CLIENT") {
            self.ctx.note_pause(args);
        }
        if crate::queue::library::may_unload(args) {
            self.ctx.queues.forget_library();
        }
        if kind == Kind::Script {
            self.ctx.queues.script(args);
        }
        match decision {
            Decision::Requirepass(password) => {
                self.set_requirepass(kind, args, frame.clone(), password)
                    .await;
            }
            Decision::View(view) => self.viewed(kind, args, frame.clone(), view).await,
            Decision::Signal(fired) => self.signalled(kind, args, frame.clone(), fired).await,
            Decision::Info => {
                let hidden = match crate::clients::format::shows_memory(args) {
                    true => self.ctx.queues.scripts_cached().await,
                    false => Default::default(),
                };
                let view = View::Reply(crate::clients::format::info(&self.ctx.clients, hidden));
                self.viewed(kind, args, frame.clone(), view).await;
            }
            Decision::RedirectView(transform) => {
                self.viewed(kind, args, frame.clone(), View::Reply(transform))
                    .await;
            }
            Decision::TrackingRedirect { at, id } => {
                let request = self.tracking_redirect(args, at, id).await;
                self.send_dedicated(kind, args, &request, None, None).await;
            }
            Decision::Announce => match self
                .ctx
                .announce
                .as_ref()
                .filter(|_| !self.mode.multi)
                .and_then(|a| a.answer(args, self.protocol()))
            {
                Some(reply) => self.answer(reply).await,
                None => self.forward(kind, args, &frame).await,
            },
            _ => self.forward(kind, args, &frame).await,
        }
        None
    }

    /// Sends the request as it is, alone, where [`route`] says.
    async fn forward(&mut self, kind: Kind, args: Args<'_>, frame: &Bytes) {
        if route(kind, args, &self.facts()) != Route::Shared {
            self.send_dedicated(kind, args, frame, None, None).await;
        } else {
            let writes = may_write(args);
            if self.waits_for_reads(1, writes) {
                self.out.shared_drained().await;
            }
            self.send_shared(frame.clone(), 1, writes);
        }
    }

    /// Hands a request a queue rule concerns to `queue/`, which may let
    /// it pass.
    async fn queue(&mut self, kind: Kind, args: Args<'_>) -> Step {
        let queues = self.ctx.queues.clone();
        if !self.permitted(kind, args).await {
            return Step::Served;
        }
        let in_multi = self.pinned && self.mode.multi;
        if self.pinned && !in_multi {
            // Redis would run this after everything the client sent
            // before; that also settles the protocol and the
            // subscriptions it runs under.
            self.settle().await;
            if self.subscribed_resp2() {
                let reply = not_in_subscribed_context(args.get(0).unwrap_or_default());
                self.answer(reply).await;
                return Step::Served;
            }
        }
        let paused = self.ctx.pause().is_some();
        let how = crate::queue::How {
            protocol: self.protocol(),
            in_multi,
            // A pause would hold the calls of a job on the shared
            // connection: one call, on the client's own instead.
            split: !paused || self.mode.any(),
            paused,
            conn: self.conn,
            // Settled above (outside MULTI): the database the client's
            // earlier SELECTs left it in.
            db: self.db(),
            next: matches!(kind, Kind::Pop(_)) && self.pop_order.pop(in_multi),
            // The request was split off the front of what was read.
            alone: self.buf.is_empty(),
        };
        match queues.serve(kind, args, how, self).await {
            Outcome::Passed => Step::Pass,
            Outcome::Served => Step::Served,
            Outcome::Ended(Left::Gone) => Step::Stop(Stop::Gone),
            Outcome::Ended(Left::Shutdown) => Step::Stop(Stop::Finish),
        }
    }

    /// Has Redis discard the client's open transaction at EXEC
    /// (`EXECABORT`), as it does after a command it refused while queuing:
    /// for a request the proxy refused in its place.
    pub(super) async fn fail_transaction(&mut self) {
        // A request Redis refuses at queuing time (wrong arity) flags the
        // transaction; its reply is the proxy's to drop.
        if let Some(d) = &mut self.dedicated {
            d.send_dropped(b"*1\r\n$3\r\nGET\r\n", 1).await;
        }
    }

    /// Queues a reply of the proxy's own. Replies from the dedicated
    /// connection take their place in the stream only when they arrive, so
    /// those still due must arrive first.
    async fn answer(&mut self, bytes: Bytes) {
        self.answer_as(bytes, Served::Proxy).await;
    }

    async fn answer_as(&mut self, bytes: Bytes, served: Served) {
        if self.pinned {
            self.settle().await;
        }
        self.out.answer(bytes, served);
    }

    /// Moves the client off a shared connection busy with someone else's
    /// big replies, once nothing of its own is in flight there (its
    /// requests must run in order).
    fn avoid_congestion(&mut self) {
        if self.shared.is_congested() && self.out.shared_idle() {
            if let Some(s) = self.ctx.uncongested_shared() {
                self.shared = s;
            }
        }
    }

    fn facts(&self) -> Facts {
        let pause = self.ctx.pause();
        Facts {
            big_replies: self.out.has_big_replies(),
            pinned: self.pinned,
            pause,
            // The clock is read only when a pause needs it; otherwise any
            // instant will do, and this one costs nothing.
            now: if pause.is_some() {
                Instant::now()
            } else {
                self.started
            },
        }
    }

    /// Waits until everything sent on the dedicated connection has been
    /// answered, also when its replies do not pair with requests.
    async fn settle(&mut self) {
        let unpaired = self.mode.unpaired;
        if let Some(d) = &mut self.dedicated {
            if unpaired {
                d.drain_unpaired().await;
            } else {
                d.idle().await;
            }
        }
    }

    /// RESP version the client speaks: on its dedicated connection, as
    /// Redis confirmed it.
    fn protocol(&self) -> u8 {
        match &self.dedicated {
            Some(d) if self.pinned => d.protocol(),
            _ => self.meta.protocol,
        }
    }

    /// The database the client is in: its dedicated connection's, as Redis
    /// confirmed its SELECTs (exact once that connection is idle). A client
    /// that is not pinned is in database 0: a SELECT of another keeps it
    /// pinned until RESET, which selects 0 again.
    fn db(&self) -> i64 {
        match &self.dedicated {
            Some(d) if self.pinned => d.db(),
            _ => 0,
        }
    }

    /// The connection a queue operation of the client's goes on, if not
    /// the client's shared one: that of the database it is in.
    fn queue_shared(&self) -> Option<SharedUpstream> {
        match self.db() {
            0 => None,
            db => Some(self.ctx.queues.clients_in(db)),
        }
    }

    /// In RESP2 a subscribed connection accepts only the pub/sub commands.
    fn subscribed_resp2(&self) -> bool {
        self.dedicated
            .as_ref()
            .is_some_and(|d| d.protocol() == 2 && d.subscriptions() > 0)
    }

    /// A `FUNCTION` request whose reply must not show the proxy's own
    /// library: sent where it would have gone, with its reply rewritten
    /// (see `queue::visible`).
    async fn viewed(&mut self, kind: Kind, args: Args<'_>, frame: Bytes, view: View) {
        let routed = route(kind, args, &self.facts());
        let in_multi = self.pinned && self.mode.multi;
        match view {
            View::Request(request) if routed == Route::Shared => {
                self.enter_writes_lane().await;
                self.send_shared(request, 1, true)
            }
            View::Request(request) => {
                self.send_dedicated(kind, args, &request, None, None).await;
            }
            // Replies that do not pair with requests cannot be rewritten.
            _ if self.pinned && self.mode.unpaired => {
                self.send_dedicated(kind, args, &frame, None, None).await;
            }
            View::Reply(transform) if routed == Route::Shared => {
                self.send_shared_transformed(frame, 1, transform).await;
            }
            View::Reply(transform) if in_multi => {
                self.send_dedicated(kind, args, &frame, Some(transform), None)
                    .await;
            }
            View::Reply(transform) => {
                let expect = Expect::Transformed(transform);
                self.send_dedicated(kind, args, &frame, None, Some(expect))
                    .await;
            }
            View::Stats if in_multi => {
                // The probe cannot join the transaction (it would change
                // EXEC's reply, and abort it where it is refused): made
                // now, outside it.
                let probe = self
                    .ctx
                    .queues
                    .own_command(crate::queue::library::visible::PROBE)
                    .await;
                let hidden = match probe {
                    Ok(reply) => crate::queue::library::visible::observe(&reply),
                    Err(_) => crate::queue::library::visible::last_seen(),
                };
                let transform = crate::queue::library::visible::stats_with(hidden);
                self.send_dedicated(kind, args, &frame, Some(transform), None)
                    .await;
            }
            View::Stats => {
                // On the client's own connection (as every command Redis
                // serves while a script runs), behind the probe, in one
                // write.
                let mut joined = crate::queue::library::visible::probe().to_vec();
                joined.extend_from_slice(&frame);
                let expect = Expect::Joined {
                    left: 2,
                    got: BytesMut::new(),
                    transform: crate::queue::library::visible::stats_joined(),
                };
                self.send_dedicated(kind, args, &joined, None, Some(expect))
                    .await;
            }
        }
    }

    /// A job framework's completion signal (see `queue::signals`): sent
    /// where it would have gone, its reply left as Redis sent it; once that
    /// reply shows Redis accepted the write (inside MULTI: its element of
    /// EXEC's reply), the leases it names are acknowledged.
    async fn signalled(
        &mut self,
        kind: Kind,
        args: Args<'_>,
        frame: Bytes,
        fired: crate::queue::signals::Fired,
    ) {
        let on_success = self.ctx.queues.on_success(self.db(), fired);
        self.viewed(kind, args, frame, View::Reply(on_success))
            .await;
    }

    /// Like [`send_shared`](Self::send_shared), with the reply rewritten.
    async fn send_shared_transformed(
        &mut self,
        bytes: Bytes,
        count: u32,
        transform: Box<dyn ReplyTransform>,
    ) {
        // FUNCTION requests may write: the writes lane.
        self.enter_writes_lane().await;
        match &self.member {
            Some(m) => m.shared().send(bytes, count, &self.out, Some(transform)),
            // The reply is rewritten as it comes: in the client's protocol.
            None if self.meta.protocol == 3 => {
                self.protocol_shared()
                    .send(bytes, count, &self.out, Some(transform));
            }
            None => {
                self.avoid_congestion();
                self.shared.send(bytes, count, &self.out, Some(transform));
            }
        }
    }

    async fn ensure_dedicated(&mut self) -> bool {
        match self.open_dedicated(true).await {
            Ok(()) => true,
            Err(e) => {
                self.out
                    .answer(Bytes::from(e.to_reply()), Served::Dedicated);
                false
            }
        }
    }

    /// Opens the client's dedicated connection unless it has a live one.
    /// Without `login_anew`, only one the client is logged in on as it is
    /// now: never one where a login it made on a connection now gone would
    /// be lost.
    async fn open_dedicated(&mut self, login_anew: bool) -> Result<(), UpstreamError> {
        if self.dedicated.as_ref().is_some_and(|d| !d.is_dead()) {
            return Ok(());
        }
        // A client in a pool logs in again with the pool's credentials,
        // which it proved. A ready connection is taken without waiting, so
        // the request is written before any other client's next one.
        let pool_login = self.member.as_ref().and_then(Member::ready);
        let logged_in = self.auth == crate::auth::State::Open || pool_login.is_some();
        if !(logged_in || login_anew) {
            return Err(UpstreamError::Unavailable(
                "the client would have to log in again".into(),
            ));
        }
        let node = self.ctx.cluster.as_ref().and_then(|t| {
            self.node_wanted
                .take()
                .or_else(|| t.any())
                .map(|a| (t.clone(), a))
        });
        self.dedicated_node = node.as_ref().map(|(_, a)| a.clone());
        let opened = if let (Some((topology, addr)), true) =
            (&node, self.auth == crate::auth::State::Open)
        {
            let ready = self.ctx.ready_at(topology, addr);
            Dedicated::open_ready(&ready, self.out.clone()).await
        } else if let Some((topology, addr)) = &node {
            if self.dedicated.is_some() {
                self.set_auth(crate::auth::State::after_reset(self.proxy_password()));
            }
            Dedicated::open_plain(&topology.endpoint(addr), self.out.clone()).await
        } else if self.auth == crate::auth::State::Open {
            Dedicated::open_ready(&self.ctx.ready, self.out.clone()).await
        } else if let Some(ready) = pool_login {
            Dedicated::open_ready(&ready, self.out.clone()).await
        } else {
            if self.dedicated.is_some() || self.member.is_some() {
                // The connection the client logged in on is gone (or its
                // pool, which disconnects it); a new one starts as Redis
                // starts every connection.
                self.set_auth(crate::auth::State::after_reset(self.proxy_password()));
            }
            Dedicated::open_plain(&self.ctx.endpoint, self.out.clone()).await
        };
        // A dead one goes, whether another opens or not.
        self.dedicated = None;
        let d = opened?;
        if let Some(b) = &self.bounces {
            d.on_bounce(b.sender(), Box::new(self.client.doorbell()));
        }
        self.dedicated = Some(d);
        if logged_in {
            self.apply_meta();
        }
        Ok(())
    }

    /// Sends one request on the dedicated connection, updating the mode.
    /// `queued` is the transform of a rewritten request queued in MULTI;
    /// `expect` what to do with the reply of a request sent outside MULTI.
    async fn send_dedicated(
        &mut self,
        kind: Kind,
        args: Args<'_>,
        frame: &[u8],
        queued: Option<Box<dyn ReplyTransform>>,
        expect: Option<Expect>,
    ) {
        let replay_multi = self.choose_node(args).await;
        if !self.switch_to_dedicated().await {
            return;
        }
        if replay_multi {
            // The client has had MULTI's reply from the first node.
            if let Some(d) = self.dedicated.as_mut() {
                d.send_dropped(b"*1\r\n$5\r\nMULTI\r\n", 1).await;
            }
        }
        // The database a SELECT chooses, which queue operations follow.
        let select = (queued.is_none() && expect.is_none() && args.is(0, "SELECT"))
            .then(|| args.get(1).and_then(crate::command::parse_i64))
            .flatten();
        let mut queued = queued;
        let mut expect = expect;
        if let (Some(db), Some(d)) = (select, &self.dedicated) {
            if self.mode.unpaired {
                d.assume_db(db);
            } else if self.mode.multi {
                queued = Some(d.select_in_exec(db));
            } else {
                expect = Some(Expect::Select(db));
            }
        }
        let unpaired_before = self.mode.unpaired;
        if kind == Kind::EndTransaction && self.watch_lost_at_exec(args).await {
            return;
        }
        let (watched, queued_before) = (self.mode.watch, self.mode.queued());
        let exec = self.mode.apply(kind, args, queued);
        let protocol = if kind == Kind::Reset {
            Some(2)
        } else if args.is(0, "HELLO") {
            args.get(1).and_then(|v| match v {
                b"2" => Some(2),
                b"3" => Some(3),
                _ => None,
            })
        } else {
            None
        };
        let paired = !(unpaired_before || self.mode.unpaired);
        let d = self.dedicated.as_mut().expect("dedicated connection");
        let expect = if !paired {
            None
        } else if let Some(p) = protocol.filter(|_| expect.is_none()) {
            Some(Expect::Protocol(p))
        } else {
            Some(exec.or(expect).unwrap_or(Expect::Raw))
        };
        let expect = match &mut self.bounces {
            Some(b) if paired => b.route(
                kind,
                args,
                frame,
                expect,
                watched,
                queued_before,
                &self.mode,
            ),
            _ => expect,
        };
        // Where Redis closes the connection after this request (a protocol
        // error on an oversized request, SHUTDOWN), it would have closed the
        // client's own connection: the client goes too.
        let closes = oversized(args) || kind == Kind::Urgent && args.is(0, "SHUTDOWN");
        let bound = self.mode.any() || closes || (d.is_bound() && !d.is_idle());
        d.set_bound(bound);
        if kind == Kind::StickyUnpaired
            && !self.mode.multi
            && (args.is(0, "SYNC") || args.is(0, "PSYNC"))
        {
            d.start_relay();
            self.relaying = true;
        }
        // Counted (and stamped) before it is sent: its reply may be read
        // before the write returns.
        self.out.sent_dedicated(expect.is_some());
        if let Err(e) = d.send(frame, expect).await {
            self.out.ready(Bytes::from(e.to_reply()), 1);
        }
        if kind == Kind::Reset && unpaired_before {
            // Replies pair with requests again once everything sent before
            // RESET's reply (messages, skipped replies) has passed.
            d.drain_unpaired().await;
        }
        self.maybe_unpin();
    }

    /// In a cluster, a request with keys goes to their node: a dedicated
    /// connection to another node is given up for one to it, unless it
    /// holds state (subscriptions, WATCH, queued commands, a login of the
    /// client's own), where Redis Cluster would redirect the client
    /// instead. A MULTI with nothing queued yet moves with its first
    /// command: returns whether it must be sent again on the new one.
    async fn choose_node(&mut self, args: Args<'_>) -> bool {
        let Some(topology) = &self.ctx.cluster else {
            return false;
        };
        let slot = crate::command::table::with_current(|t| cluster::slot::command_slot(args, t));
        let cluster::slot::CommandSlot::Slot(slot) = slot else {
            return false;
        };
        let Some(want) = topology.owner(slot) else {
            return false;
        };
        let own_login = self.auth != crate::auth::State::Open;
        let mut replay_multi = false;
        if let Some(d) = &self.dedicated {
            let elsewhere = self.dedicated_node.as_deref() != Some(want.as_str());
            if !elsewhere || d.is_dead() || own_login {
                return false;
            }
            let fresh_multi = self.mode.multi
                && self.mode.queued() == 0
                && !self.mode.watch
                && !self.mode.sticky
                && !self.mode.unpaired;
            if fresh_multi {
                // Its MULTI answered, the connection holds nothing else.
                d.idle().await;
                replay_multi = true;
            } else if self.mode.any() || !d.is_idle() || d.is_bound() {
                return false;
            }
            self.dedicated = None;
        }
        self.node_wanted = Some(want);
        replay_multi
    }

    async fn switch_to_dedicated(&mut self) -> bool {
        if !self.ensure_dedicated().await {
            return false;
        }
        // Requests already sent on the shared connection run first (also
        // queue operations of a pinned client, which go there).
        self.out.shared_drained().await;
        self.pinned = true;
        true
    }

    /// Back to the shared connection once the client is in no stateful mode
    /// and its dedicated connection has answered everything.
    fn maybe_unpin(&mut self) {
        if self.ctx.config.dedicated_per_client || self.mode.any() || !self.shares() {
            return;
        }
        if self.dedicated.as_ref().is_none_or(|d| d.is_idle()) {
            self.pinned = false;
        }
    }
}
