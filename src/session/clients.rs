//! The proxy's table of its own clients, and what clients see of it:
//! `CLIENT LIST`, `CLIENT INFO`, `CLIENT ID`, `CLIENT KILL`, `CLIENT
//! NO-EVICT`, `CLIENT UNBLOCK` and the clients section of `INFO`. Redis
//! knows only the proxy's upstream connections, shared by many clients (and
//! the proxy's own ones), so its answers would describe those; tools that
//! list or kill clients need the clients themselves, with the fields and
//! formats Redis gives.
//!
//! A client's id is the proxy's (the one `HELLO` reports too). Where Redis
//! must be told about a client (`CLIENT UNBLOCK`, `CLIENT TRACKING ...
//! REDIRECT`), the id is translated to that of the client's dedicated
//! upstream connection, which Redis knows. A client without one is, to
//! Redis, no client at all: for a redirect, its session is asked to open
//! one (see [`Registry::ask_upstream`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::{Session, Step, Stop};
use crate::auth::{State as Auth, Verdict};
use crate::command::{parse_i64, Args, Kind};
use crate::net::Stream;
use crate::output::{ClientState, ReplyTransform, Transformed};
use crate::upstream::dedicated::Watch;

/// Every client connected to the proxy, by id (Redis lists its clients in
/// the order they connected, which ids follow).
#[derive(Default)]
pub struct Registry {
    clients: Mutex<BTreeMap<u64, Arc<Entry>>>,
}

/// One client, as the table shows it.
pub struct Entry {
    id: u64,
    addr: String,
    laddr: String,
    fd: i64,
    created: Instant,
    /// Closing it ends the session (`CLIENT KILL`).
    out: Arc<ClientState>,
    state: Mutex<State>,
    /// Wakes the session out of a blocking pop for `CLIENT UNBLOCK`.
    unblock: tokio::sync::Notify,
    /// The session has something to do besides its client's bytes:
    /// `State::asks` may have requests, or its dedicated connection handed
    /// requests back (`session::bounce`). Read without the lock, by a
    /// session that polls for it each time it waits for its client.
    asking: AtomicBool,
    /// Wakes the waiting session for them. Not a `Notify`, whose every
    /// poll takes a lock: this costs a client's every request a few
    /// atomic operations.
    asked: futures_util::task::AtomicWaker,
}

/// What changes while the client is connected.
struct State {
    /// When the client last sent a command (Redis's `lastinteraction`).
    last: Instant,
    /// The last command's name and first argument, as sent (buffers
    /// reused: nothing is allocated per command); `None` before the first.
    cmd: Option<(Vec<u8>, Vec<u8>)>,
    name: Option<Bytes>,
    lib_name: Option<Bytes>,
    lib_ver: Option<Bytes>,
    db: i64,
    resp: u8,
    user: Bytes,
    /// Commands queued and their argument bytes, in MULTI.
    multi: Option<(u32, usize)>,
    /// The last command may block: while it waits (for its dedicated
    /// connection's reply, or parked) the client counts as blocked.
    blocking: bool,
    /// The last command's arguments' bytes.
    argv_mem: usize,
    monitor: bool,
    no_evict: bool,
    /// The client's dedicated connection, if it has one.
    upstream: Option<Watch>,
    /// Waiting in a blocking pop on a queue, which the proxy serves.
    parked: bool,
    /// `CLIENT UNBLOCK` asked to end that wait (with an error if `true`).
    unblock: Option<bool>,
    /// Other sessions waiting for this one's dedicated connection, which
    /// their `CLIENT TRACKING … REDIRECT` names to Redis.
    asks: Vec<Ask>,
}

/// A request for the session's dedicated connection (opened if it has
/// none): answered with the connection's address, `None` if it cannot
/// have one.
type Ask = tokio::sync::oneshot::Sender<Option<SocketAddr>>;

/// How long a `CLIENT TRACKING … REDIRECT` waits for the client it names to
/// answer an [`Ask`]: that client's session does when it next waits for its
/// client's bytes, which a command it is busy with (a blocking one) delays.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// See [`Client::asked`].
pub struct Asked(Arc<Entry>);

impl std::future::Future for Asked {
    type Output = Vec<Ask>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Vec<Ask>> {
        let entry = &self.0;
        entry.asked.register(cx.waker());
        if !entry.asking.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        // Cleared before the requests are taken: one added meanwhile sets
        // it again, and is taken now or at the next poll.
        entry.asking.store(false, Ordering::Relaxed);
        Poll::Ready(std::mem::take(&mut entry.state.lock().unwrap().asks))
    }
}

/// What the session knows of itself, copied into its entry.
pub struct Snapshot {
    pub name: Option<Bytes>,
    pub lib_name: Option<Bytes>,
    pub lib_ver: Option<Bytes>,
    pub db: i64,
    pub resp: u8,
    pub user: Bytes,
    pub upstream: Option<Watch>,
}

/// What a client unblocked with `CLIENT UNBLOCK id ERROR` gets.
const UNBLOCKED: &[u8] = b"-UNBLOCKED client unblocked via CLIENT UNBLOCK\r\n";

/// Where a client connected from and to.
pub struct Origin {
    addr: String,
    laddr: String,
    fd: i64,
}

impl Origin {
    /// Of the client connected on `stream`, from `peer`.
    pub fn of(stream: &Stream, peer: Option<std::net::SocketAddr>) -> Origin {
        use std::os::fd::AsRawFd;
        let tcp = match stream {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        };
        let fmt = |a: Option<std::net::SocketAddr>| {
            a.map_or_else(|| "?:0".to_string(), |a| a.to_string())
        };
        Origin {
            addr: fmt(peer),
            laddr: fmt(tcp.local_addr().ok()),
            fd: i64::from(tcp.as_raw_fd()),
        }
    }
}

/// A session's place in the table; leaving it (dropping this) removes the
/// client, as Redis forgets a client it frees.
pub struct Client {
    entry: Arc<Entry>,
    registry: Arc<Registry>,
}

impl Client {
    /// The id `CLIENT ID` gives this client.
    pub fn id(&self) -> u64 {
        self.entry.id
    }
}

impl Registry {
    /// Adds a client.
    pub fn register(self: &Arc<Self>, id: u64, origin: Origin, out: Arc<ClientState>) -> Client {
        let Origin { addr, laddr, fd } = origin;
        let now = Instant::now();
        let entry = Arc::new(Entry {
            id,
            addr,
            laddr,
            fd,
            created: now,
            out,
            state: Mutex::new(State {
                last: now,
                cmd: None,
                name: None,
                lib_name: None,
                lib_ver: None,
                db: 0,
                resp: 2,
                user: Bytes::from_static(b"default"),
                multi: None,
                blocking: false,
                argv_mem: 0,
                monitor: false,
                no_evict: false,
                upstream: None,
                parked: false,
                unblock: None,
                asks: Vec::new(),
            }),
            unblock: tokio::sync::Notify::new(),
            asking: AtomicBool::new(false),
            asked: futures_util::task::AtomicWaker::new(),
        });
        self.clients.lock().unwrap().insert(id, entry.clone());
        Client {
            entry,
            registry: self.clone(),
        }
    }

    fn all(&self) -> Vec<Arc<Entry>> {
        self.clients.lock().unwrap().values().cloned().collect()
    }

    fn get(&self, id: u64) -> Option<Arc<Entry>> {
        self.clients.lock().unwrap().get(&id).cloned()
    }

    /// The clients connected, and those parked in a blocking pop the
    /// proxy serves.
    fn counts(&self) -> (usize, usize) {
        let all = self.all();
        let parked = all
            .iter()
            .filter(|e| e.state.lock().unwrap().parked)
            .count();
        (all.len(), parked)
    }

    /// Closes a client at once, as Redis frees it: it leaves the table now,
    /// its session stops at its next step.
    fn kill(&self, entry: &Entry) {
        self.clients.lock().unwrap().remove(&entry.id);
        entry.out.kill();
    }

    /// Where the dedicated connection of client `id` comes from, if it
    /// has one.
    fn upstream(&self, id: u64) -> Option<SocketAddr> {
        let entry = self.get(id)?;
        let s = entry.state.lock().unwrap();
        s.upstream.as_ref()?.local_addr()
    }

    /// Where the dedicated connection of client `id` comes from, once its
    /// session has opened one if it had none (as for a request needing
    /// one); `None` if there is no such client, it cannot have one, or it
    /// does not answer in time.
    async fn ask_upstream(&self, id: u64) -> Option<SocketAddr> {
        let answer = {
            let entry = self.get(id)?;
            let (ask, answer) = tokio::sync::oneshot::channel();
            entry.state.lock().unwrap().asks.push(ask);
            entry.asking.store(true, Ordering::Release);
            entry.asked.wake();
            answer
        };
        // The entry is not kept meanwhile: a client that leaves drops the
        // request with it, which ends the wait at once.
        tokio::time::timeout(ASK_TIMEOUT, answer).await.ok()?.ok()?
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let mut clients = self.registry.clients.lock().unwrap();
        if clients
            .get(&self.entry.id)
            .is_some_and(|e| Arc::ptr_eq(e, &self.entry))
        {
            clients.remove(&self.entry.id);
        }
    }
}

impl Client {
    /// Notes a command the client sent, before it runs.
    pub fn command(&self, kind: Kind, args: Args<'_>) {
        let mut s = self.entry.state.lock().unwrap();
        s.last = Instant::now();
        let (name, sub) = s.cmd.get_or_insert_with(Default::default);
        for (buf, arg) in [(name, args.get(0)), (sub, args.get(1))] {
            buf.clear();
            // Longer ones are no command names: cut, they stay unknown.
            buf.extend_from_slice(&arg.unwrap_or_default()[..arg.map_or(0, |a| a.len().min(65))]);
        }
        s.blocking = match kind {
            Kind::Blocking => true,
            Kind::Pop(form) => form.is_blocking(),
            _ => false,
        };
        let argv_mem = args.iter().map(<[u8]>::len).sum::<usize>();
        s.argv_mem = argv_mem;
        match kind {
            Kind::Multi => s.multi = Some((0, 0)),
            Kind::EndTransaction | Kind::Reset => s.multi = None,
            Kind::Watch | Kind::Quit => {}
            _ => {
                if let Some((n, mem)) = &mut s.multi {
                    *n += 1;
                    // As Redis counts it: the arguments and a pointer to each.
                    *mem += argv_mem + 8 * args.len();
                }
            }
        }
        // RESET ends MONITOR; NO-EVICT stays, as in Redis.
        if kind == Kind::Reset {
            s.monitor = false;
        } else if kind == Kind::StickyUnpaired && args.is(0, "MONITOR") && s.multi.is_none() {
            s.monitor = true;
        }
    }

    /// The client waits in a blocking pop the proxy serves (or no longer).
    pub fn parked(&self, parked: bool) {
        let mut s = self.entry.state.lock().unwrap();
        s.parked = parked;
        s.unblock = None;
    }

    /// What the session waits on while parked: resolves, to the reply
    /// the pop gets instead of its own, when `CLIENT UNBLOCK` names the
    /// client (`timeout` is the pop's reply when it times out).
    pub fn unblocked(&self, timeout: Bytes) -> impl std::future::Future<Output = Bytes> + 'static {
        let entry = self.entry.clone();
        async move {
            loop {
                entry.unblock.notified().await;
                // A wake-up left from an earlier wait asks nothing.
                let asked = entry.state.lock().unwrap().unblock.take();
                match asked {
                    Some(true) => return Bytes::from_static(UNBLOCKED),
                    Some(false) => return timeout,
                    None => {}
                }
            }
        }
    }

    /// What the session waits on, besides its client's bytes: resolves,
    /// to the requests for its dedicated connection, when some other
    /// session asks for it (see [`Registry::ask_upstream`]); it can be
    /// awaited again after that.
    pub fn asked(&self) -> Asked {
        Asked(self.entry.clone())
    }

    /// Wakes the session out of its wait for its client's bytes, as
    /// [`Registry::ask_upstream`] does, for whoever has a task for it.
    pub fn doorbell(&self) -> impl Fn() + Send + Sync + 'static {
        let entry = self.entry.clone();
        move || {
            entry.asking.store(true, Ordering::Release);
            entry.asked.wake();
        }
    }

    pub fn update(&self, snap: Snapshot) {
        let mut s = self.entry.state.lock().unwrap();
        s.name = snap.name;
        s.lib_name = snap.lib_name;
        s.lib_ver = snap.lib_ver;
        s.db = snap.db;
        s.resp = snap.resp;
        s.user = snap.user;
        s.upstream = snap.upstream;
    }
}

impl State {
    /// Channels, patterns and shard channels.
    fn subscriptions(&self) -> [i64; 3] {
        self.upstream.as_ref().map_or([0; 3], Watch::subscriptions)
    }

    /// Blocked, as Redis flags a client: in a blocking command still
    /// waiting for its reply.
    fn blocked(&self) -> bool {
        self.blocking && (self.parked || self.upstream.as_ref().is_some_and(Watch::busy))
    }
}

impl Entry {
    fn blocked(&self) -> bool {
        self.state.lock().unwrap().blocked()
    }

    fn pubsub(&self) -> bool {
        self.state.lock().unwrap().subscriptions() != [0; 3]
    }

    /// Redis's line for this client (`catClientInfoString`). `current` is
    /// the request being answered when the line is the asking client's
    /// own. Fields the proxy does not have the way Redis does are given
    /// plausible values in Redis's format: `qbuf`, `qbuf-free`, `argv-mem`
    /// (the request being answered for the asking client, an empty buffer
    /// for others), `rbs`, `rbp`, `obl`, `oll`, `omem`, `tot-mem` (Redis's
    /// sizes for a client with empty buffers) and `events`.
    fn line(&self, current: Option<&[u8]>, current_argv: usize, lib: bool) -> String {
        let s = self.state.lock().unwrap();
        let blocked = s.blocked();
        let now = Instant::now();
        let mut flags = String::new();
        if s.monitor {
            flags.push('O');
        }
        let [sub, psub, ssub] = s.subscriptions();
        if sub + psub + ssub > 0 {
            flags.push('P');
        }
        if s.multi.is_some() {
            flags.push('x');
        }
        if blocked {
            flags.push('b');
        }
        if s.no_evict {
            flags.push('e');
        }
        if flags.is_empty() {
            flags.push('N');
        }
        // A query buffer of Redis's starts at 16 KB plus its allocator's
        // slack: 20474 bytes, less what the request takes.
        let (qbuf, qbuf_free, argv_mem) = match current {
            Some(req) => (
                req.len(),
                20474usize.saturating_sub(req.len()),
                current_argv,
            ),
            // A blocked client's arguments stay in memory.
            None if blocked => (0, 0, s.argv_mem),
            None => (0, 0, 0),
        };
        let (multi, multi_mem) = match s.multi {
            Some((n, mem)) => (i64::from(n), mem),
            None => (-1, 0),
        };
        // Reply buffer of 16 KB, and some 790 bytes of client structure.
        let rbs = 16384;
        let tot_mem = 790 + rbs + qbuf + qbuf_free + argv_mem + multi_mem;
        fn text(v: &Option<Bytes>) -> std::borrow::Cow<'_, str> {
            v.as_deref()
                .map(String::from_utf8_lossy)
                .unwrap_or_default()
        }
        let mut line = format!(
            "id={} addr={} laddr={} fd={} name={} age={} idle={} flags={} db={} sub={} psub={} ssub={} multi={} qbuf={} qbuf-free={} argv-mem={} multi-mem={} rbs={} rbp=0 obl=0 oll=0 omem=0 tot-mem={} events=r cmd={} user={} redir=-1 resp={}",
            self.id,
            self.addr,
            self.laddr,
            self.fd,
            text(&s.name),
            now.duration_since(self.created).as_secs(),
            now.duration_since(s.last).as_secs(),
            flags,
            s.db,
            sub,
            psub,
            ssub,
            multi,
            qbuf,
            qbuf_free,
            argv_mem,
            multi_mem,
            rbs,
            tot_mem,
            s.cmd.as_ref().map_or_else(|| "NULL".to_string(), |(n, sub)| full_name(n, sub)),
            String::from_utf8_lossy(&s.user),
            s.resp,
        );
        if lib {
            line.push_str(&format!(
                " lib-name={} lib-ver={}",
                text(&s.lib_name),
                text(&s.lib_ver)
            ));
        }
        line
    }
}

/// The name Redis shows for the command `name` (with first argument
/// `sub`, empty if none): lower case, with its subcommand (`client|list`)
/// where it is a container; `NULL` for one Redis does not know (where
/// Redis's table says so), as Redis shows a command it refused as unknown.
fn full_name(name: &[u8], sub: &[u8]) -> String {
    crate::command::table::with_current(|t| full_name_in(t, name, sub))
}

fn full_name_in(t: Option<&crate::command::table::Table>, name: &[u8], sub: &[u8]) -> String {
    let name = String::from_utf8_lossy(name).to_ascii_lowercase();
    let full = format!(
        "{name}|{}",
        String::from_utf8_lossy(sub).to_ascii_lowercase()
    );
    let container = CONTAINERS.contains(&name.as_str());
    let proxys = PROXY_COMMANDS.contains(&name.as_str());
    match t {
        Some(t) if !sub.is_empty() && t.knows(full.as_bytes()) => full,
        Some(t) if proxys || (!container || sub.is_empty()) && t.knows(name.as_bytes()) => name,
        Some(_) => "NULL".to_string(),
        None if container && !sub.is_empty() => full,
        None => name,
    }
}

/// Commands of the proxy's own, which Redis does not know.
const PROXY_COMMANDS: &[&str] = &["ack", "nack", "queue"];

const CONTAINERS: &[&str] = &[
    "acl", "client", "cluster", "command", "config", "function", "latency", "memory", "module",
    "object", "pubsub", "script", "slowlog", "xgroup", "xinfo",
];

/// Client types of `CLIENT LIST TYPE` and `CLIENT KILL TYPE`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Type {
    Normal,
    Replica,
    Master,
    PubSub,
}

fn client_type(name: &[u8]) -> Option<Type> {
    let name = name.to_ascii_lowercase();
    match &name[..] {
        b"normal" => Some(Type::Normal),
        b"slave" | b"replica" => Some(Type::Replica),
        b"master" => Some(Type::Master),
        b"pubsub" => Some(Type::PubSub),
        _ => None,
    }
}

impl Entry {
    /// The proxy has no replicas or masters among its clients.
    fn is(&self, t: Type) -> bool {
        match t {
            Type::Normal => !self.pubsub(),
            Type::PubSub => self.pubsub(),
            Type::Replica | Type::Master => false,
        }
    }
}

fn error(text: &str) -> Bytes {
    Bytes::from(format!("-{text}\r\n"))
}

const SYNTAX: &str = "ERR syntax error";

/// Redis's verbatim text reply: a bulk string in RESP2.
fn verbatim(text: &str, protocol: u8) -> Bytes {
    let mut out = BytesMut::new();
    if protocol >= 3 {
        out.extend_from_slice(format!("={}\r\ntxt:", text.len() + 4).as_bytes());
        out.extend_from_slice(text.as_bytes());
        out.extend_from_slice(b"\r\n");
    } else {
        crate::resp::reply::bulk(&mut out, text.as_bytes());
    }
    out.freeze()
}

/// Whether the request is one the table answers (with Redis's arity: a
/// request of the wrong length is left to Redis, which refuses it).
pub fn answers(args: Args<'_>) -> bool {
    if !args.is(0, "CLIENT") {
        return false;
    }
    let n = args.len();
    (n == 2 && (args.is(1, "ID") || args.is(1, "INFO")))
        || (n >= 2 && args.is(1, "LIST"))
        || (n >= 3 && args.is(1, "KILL"))
        || (n == 3 && args.is(1, "NO-EVICT"))
        || ((n == 3 || n == 4) && args.is(1, "UNBLOCK"))
}

/// Whether the request's reply is rewritten by [`info`] (cheap: asked of
/// every request that could join a shared batch).
pub fn concerns(args: Args<'_>) -> bool {
    args.is(0, "INFO")
}

/// `INFO`, with the clients section telling of the proxy's clients:
/// `connected_clients` counts them, `blocked_clients` adds to Redis's count
/// (of connections blocked there, each a client's own: blocking commands and
/// commands held by a pause go on dedicated connections) the clients waiting
/// in a queue pop the proxy serves, which Redis does not see.
pub fn info(registry: &Arc<Registry>) -> Box<dyn ReplyTransform> {
    Box::new(InfoClients(registry.clone()))
}

struct InfoClients(Arc<Registry>);

impl ReplyTransform for InfoClients {
    fn apply(&mut self, reply: Bytes) -> Transformed {
        let (connected, parked) = self.0.counts();
        Transformed::Done(rewrite_info(&reply, connected, parked).unwrap_or(reply))
    }
}

/// An INFO reply (bulk or verbatim string) with `connected_clients`
/// replaced and `parked` added to `blocked_clients`; `None` when it has
/// neither (another section, an error).
fn rewrite_info(reply: &[u8], connected: usize, parked: usize) -> Option<Bytes> {
    let header_end = reply.iter().position(|&b| b == b'\n')? + 1;
    let (verbatim, body_start) = match reply.first()? {
        b'$' => (false, header_end),
        b'=' if reply.get(header_end..header_end + 4) == Some(b"txt:") => (true, header_end + 4),
        _ => return None,
    };
    let body = std::str::from_utf8(reply.get(body_start..reply.len().checked_sub(2)?)?).ok()?;
    let mut changed = false;
    let mut out = String::with_capacity(body.len());
    for line in body.split_inclusive("\r\n") {
        let value = |key: &str| line.strip_prefix(key).filter(|rest| rest.ends_with("\r\n"));
        if value("connected_clients:").is_some() {
            out.push_str(&format!("connected_clients:{connected}\r\n"));
            changed = true;
        } else if let Some(n) = value("blocked_clients:") {
            let n: usize = n.trim_end().parse().ok()?;
            out.push_str(&format!("blocked_clients:{}\r\n", n + parked));
            changed = true;
        } else {
            out.push_str(line);
        }
    }
    if !changed {
        return None;
    }
    let mut r = BytesMut::new();
    if verbatim {
        r.extend_from_slice(format!("={}\r\ntxt:", out.len() + 4).as_bytes());
    } else {
        r.extend_from_slice(format!("${}\r\n", out.len()).as_bytes());
    }
    r.extend_from_slice(out.as_bytes());
    r.extend_from_slice(b"\r\n");
    Some(r.freeze())
}

/// A `CLIENT KILL` filter, as Redis parses it.
#[derive(Default)]
struct Filter {
    addr: Option<Vec<u8>>,
    laddr: Option<Vec<u8>>,
    id: Option<u64>,
    kind: Option<Type>,
    user: Option<Vec<u8>>,
    skipme: bool,
}

impl Filter {
    fn matches(&self, e: &Entry) -> bool {
        if self.addr.as_deref().is_some_and(|a| a != e.addr.as_bytes())
            || self
                .laddr
                .as_deref()
                .is_some_and(|a| a != e.laddr.as_bytes())
            || self.id.is_some_and(|id| id != e.id)
            || self.kind.is_some_and(|t| !e.is(t))
        {
            return false;
        }
        match &self.user {
            Some(u) => e.state.lock().unwrap().user[..] == u[..],
            None => true,
        }
    }
}

impl Session {
    /// What the table shows of this session.
    pub(super) fn snapshot(&self) -> Snapshot {
        Snapshot {
            name: self.meta.name.clone(),
            lib_name: self.meta.lib_name.clone(),
            lib_ver: self.meta.lib_ver.clone(),
            db: self.db(),
            resp: self.protocol(),
            user: match &self.auth {
                Auth::User(u) => u.clone(),
                _ => Bytes::from_static(b"default"),
            },
            upstream: self.dedicated.as_ref().map(|d| d.watch()),
        }
    }

    /// Answers a `CLIENT` request of the table's (see [`answers`]);
    /// [`Step::Pass`] leaves the request to the usual path.
    pub(super) async fn client_table(&mut self, args: Args<'_>, frame: &Bytes) -> Step {
        if !answers(args) {
            return Step::Pass;
        }
        if !self.table_permitted(args).await {
            return Step::Served;
        }
        if self.pinned {
            self.settle().await;
        }
        self.client.update(self.snapshot());
        let registry = self.ctx.clients.clone();
        let lib = super::meta::redis_has_setinfo();
        let protocol = self.protocol();
        let me = self.conn;
        let argv: usize = args.iter().map(<[u8]>::len).sum();
        let line = |e: &Entry| {
            let current = (e.id == me).then_some(&frame[..]);
            e.line(current, argv, lib)
        };
        let reply = if args.is(1, "ID") {
            Bytes::from(format!(":{me}\r\n"))
        } else if args.is(1, "INFO") {
            verbatim(&(line(&self.client.entry) + "\n"), protocol)
        } else if args.is(1, "LIST") {
            let entries = if args.len() == 4 && args.is(2, "TYPE") {
                let Some(t) = client_type(args.get(3).unwrap_or_default()) else {
                    let t = String::from_utf8_lossy(args.get(3).unwrap_or_default());
                    return self
                        .table_reply(error(&format!("ERR Unknown client type '{t}'")))
                        .await;
                };
                registry.all().into_iter().filter(|e| e.is(t)).collect()
            } else if args.len() > 3 && args.is(2, "ID") {
                let mut found = Vec::new();
                for id in args.iter().skip(3) {
                    let Some(id) = parse_i64(id) else {
                        return self.table_reply(error("ERR Invalid client ID")).await;
                    };
                    found.extend(u64::try_from(id).ok().and_then(|id| registry.get(id)));
                }
                found
            } else if args.len() != 2 {
                return self.table_reply(error(SYNTAX)).await;
            } else {
                registry.all()
            };
            let text: String = entries.iter().map(|e| line(e) + "\n").collect();
            verbatim(&text, protocol)
        } else if args.is(1, "NO-EVICT") {
            let on = if args.is(2, "ON") {
                true
            } else if args.is(2, "OFF") {
                false
            } else {
                return self.table_reply(error(SYNTAX)).await;
            };
            self.client.entry.state.lock().unwrap().no_evict = on;
            Bytes::from_static(b"+OK\r\n")
        } else if args.is(1, "UNBLOCK") {
            return self.unblock(args).await;
        } else {
            return self.kill(args).await;
        };
        self.table_reply(reply).await
    }

    async fn table_reply(&mut self, reply: Bytes) -> Step {
        self.answer(reply).await;
        Step::Served
    }

    /// `CLIENT KILL`, in its old form (an address) or with filters.
    async fn kill(&mut self, args: Args<'_>) -> Step {
        let old_form = args.len() == 3;
        let mut filter = Filter::default();
        if old_form {
            filter.addr = args.get(2).map(<[u8]>::to_vec);
        } else {
            filter.skipme = true;
            let mut i = 2;
            while i < args.len() {
                let Some(value) = args.get(i + 1) else {
                    return self.table_reply(error(SYNTAX)).await;
                };
                if args.is(i, "ID") {
                    match parse_i64(value).filter(|&id| id >= 1) {
                        Some(id) => filter.id = Some(id as u64),
                        None => {
                            let e = error("ERR client-id should be greater than 0");
                            return self.table_reply(e).await;
                        }
                    }
                } else if args.is(i, "TYPE") {
                    match client_type(value) {
                        Some(t) => filter.kind = Some(t),
                        None => {
                            let t = String::from_utf8_lossy(value);
                            let e = error(&format!("ERR Unknown client type '{t}'"));
                            return self.table_reply(e).await;
                        }
                    }
                } else if args.is(i, "ADDR") {
                    filter.addr = Some(value.to_vec());
                } else if args.is(i, "LADDR") {
                    filter.laddr = Some(value.to_vec());
                } else if args.is(i, "USER") {
                    if !self.user_exists(value).await {
                        let u = String::from_utf8_lossy(value);
                        return self
                            .table_reply(error(&format!("ERR No such user '{u}'")))
                            .await;
                    }
                    filter.user = Some(value.to_vec());
                } else if args.is(i, "SKIPME") {
                    if value.eq_ignore_ascii_case(b"YES") {
                        filter.skipme = true;
                    } else if value.eq_ignore_ascii_case(b"NO") {
                        filter.skipme = false;
                    } else {
                        return self.table_reply(error(SYNTAX)).await;
                    }
                } else {
                    return self.table_reply(error(SYNTAX)).await;
                }
                i += 2;
            }
        }
        let registry = self.ctx.clients.clone();
        let mut killed = 0;
        let mut close_me = false;
        for e in registry.all() {
            if !filter.matches(&e) {
                continue;
            }
            if e.id == self.conn {
                if filter.skipme {
                    continue;
                }
                close_me = true;
            } else {
                registry.kill(&e);
            }
            killed += 1;
        }
        let reply = match (old_form, killed) {
            (true, 0) => error("ERR No such client"),
            (true, _) => Bytes::from_static(b"+OK\r\n"),
            (false, n) => Bytes::from(format!(":{n}\r\n")),
        };
        self.answer(reply).await;
        // As Redis: the reply is written, then the connection closes.
        if close_me {
            Step::Stop(Stop::Finish)
        } else {
            Step::Served
        }
    }

    /// `CLIENT UNBLOCK id [TIMEOUT|ERROR]`: a client blocked in Redis, on
    /// its dedicated connection, is unblocked there.
    async fn unblock(&mut self, args: Args<'_>) -> Step {
        if args.len() == 4 && !(args.is(3, "TIMEOUT") || args.is(3, "ERROR")) {
            let e = error("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR");
            return self.table_reply(e).await;
        }
        let Some(id) = args.get(2).and_then(parse_i64) else {
            return self
                .table_reply(error("ERR value is not an integer or out of range"))
                .await;
        };
        let registry = self.ctx.clients.clone();
        let target = u64::try_from(id).ok().and_then(|id| registry.get(id));
        let Some(target) = target.filter(|e| e.blocked()) else {
            return self.table_reply(Bytes::from_static(b":0\r\n")).await;
        };
        let parked = {
            let mut s = target.state.lock().unwrap();
            if s.parked {
                s.unblock = Some(args.is(3, "ERROR"));
            }
            s.parked
        };
        if parked {
            target.unblock.notify_one();
            return self.table_reply(Bytes::from_static(b":1\r\n")).await;
        }
        let upstream = self.upstream_id(target.id).await;
        let Some(upstream) = upstream else {
            return self.table_reply(Bytes::from_static(b":0\r\n")).await;
        };
        let upstream = upstream.to_string();
        let mut words: Vec<&[u8]> = vec![b"CLIENT", b"UNBLOCK", upstream.as_bytes()];
        words.extend(args.get(3));
        let request = Bytes::from(crate::upstream::encode_command(&words));
        if self.pinned {
            self.settle().await;
        }
        self.send_shared(request, 1, true);
        Step::Served
    }

    /// The id Redis gives the dedicated connection of client `id`: found
    /// by its address in Redis's `CLIENT LIST` (asking Redis only when a
    /// request names a client, never on the request path).
    async fn upstream_id(&mut self, id: u64) -> Option<u64> {
        let addr = self.ctx.clients.upstream(id)?;
        self.redis_id(addr).await
    }

    /// The id Redis gives its client connected from `addr`.
    async fn redis_id(&mut self, addr: SocketAddr) -> Option<u64> {
        let request = Bytes::from_static(b"*2\r\n$6\r\nCLIENT\r\n$4\r\nLIST\r\n");
        let reply = self.shared.call(request, self.out.clone()).await.ok()?;
        let text = String::from_utf8_lossy(&reply);
        let wanted = format!("addr={addr}");
        text.lines()
            .find(|l| l.split(' ').any(|f| f == wanted))?
            .split(' ')
            .find_map(|f| f.strip_prefix("id="))?
            .parse()
            .ok()
    }

    /// `CLIENT TRACKING ... REDIRECT id` with the proxy's id replaced by
    /// Redis's id of that client's dedicated connection (0, which Redis
    /// never gives, for a client that has none); `None` when it has no
    /// REDIRECT.
    pub(super) async fn tracking_redirect(&mut self, args: Args<'_>) -> Option<Bytes> {
        if !(args.is(0, "CLIENT") && args.is(1, "TRACKING")) {
            return None;
        }
        let at = (3..args.len().saturating_sub(1)).find(|&i| args.is(i, "REDIRECT"))?;
        let id = parse_i64(args.get(at + 1)?)?;
        // A client naming itself (redis-py's `client_tracking_on(clientid=…)`
        // with its own id) gets the connection the request goes on anyway,
        // before it is named.
        if u64::try_from(id).is_ok_and(|id| id == self.client.id()) && self.ensure_dedicated().await
        {
            self.client.update(self.snapshot());
        }
        let upstream = match u64::try_from(id) {
            Ok(id) => {
                let mut found = self.upstream_id(id).await;
                if found.is_none() && id != self.client.id() {
                    // Another client without a (live) connection of its own:
                    // its session opens one to be named.
                    if let Some(addr) = self.ctx.clients.ask_upstream(id).await {
                        found = self.redis_id(addr).await;
                    }
                }
                found.map_or(0, |up| {
                    self.redirect_ids = Some((up, id));
                    up
                })
            }
            Err(_) => 0,
        }
        .to_string();
        let mut words: Vec<&[u8]> = args.iter().collect();
        words[at + 1] = upstream.as_bytes();
        Some(Bytes::from(crate::upstream::encode_command(&words)))
    }

    /// Answers other sessions' requests for the client's dedicated
    /// connection (see [`Registry::ask_upstream`]), opening it as a request
    /// needing it would, but sending nothing of the client's on it and
    /// leaving its other requests where they go. Its set-up (`HELLO 3`, a
    /// name) is written at once: Redis sends the redirected invalidations
    /// in the protocol the connection speaks.
    pub(super) async fn open_for_redirect(&mut self, asks: Vec<Ask>) {
        let addr = match self.open_dedicated(false).await {
            Ok(()) => {
                let d = self.dedicated.as_mut().expect("dedicated connection");
                d.write_prelude().await;
                let addr = d.watch().local_addr();
                self.client.update(self.snapshot());
                addr
            }
            Err(_) => None,
        };
        for ask in asks {
            // One that stopped waiting gets nothing.
            let _ = ask.send(addr);
        }
    }

    /// `CLIENT GETREDIR` and `CLIENT TRACKINGINFO` after a `CLIENT
    /// TRACKING … REDIRECT id`: Redis answers with its own id of the
    /// connection the proxy named in the client's place, and the client
    /// gets the id it gave back, also once that client is gone (the
    /// `broken_redirect` case). `None` for other requests.
    pub(super) fn redirect_view(&self, args: Args<'_>) -> Option<Box<dyn ReplyTransform>> {
        let (upstream, proxy) = self.redirect_ids?;
        if !(args.is(0, "CLIENT") && (args.is(1, "GETREDIR") || args.is(1, "TRACKINGINFO"))) {
            return None;
        }
        Some(Box::new(RedirectIds { upstream, proxy }))
    }

    /// Whether Redis's ACL lets the client's user run the request; if not,
    /// the client has its refusal.
    async fn table_permitted(&mut self, args: Args<'_>) -> bool {
        let Auth::User(user) = &self.auth else {
            return true;
        };
        let user = user.clone();
        let name = format!(
            "client|{}",
            String::from_utf8_lossy(args.get(1).unwrap_or_default()).to_ascii_lowercase()
        );
        let command: Vec<Bytes> = args.iter().map(Bytes::copy_from_slice).collect();
        let verdict = match self.ctx.permissions.cached(&user, &name, &command) {
            Some(v) => v,
            None => {
                let request = crate::auth::dryrun_request(&user, &command);
                match self.shared.call(request, self.out.clone()).await {
                    Ok(reply) => {
                        let v = crate::auth::verdict(&reply, &name);
                        self.ctx
                            .permissions
                            .remember(&user, &name, &command, v.clone());
                        v
                    }
                    Err(e) => Verdict::Refused(Bytes::from(e.to_reply())),
                }
            }
        };
        match verdict {
            Verdict::Allowed => true,
            Verdict::Refused(reply) => {
                self.answer(reply).await;
                false
            }
        }
    }

    /// Whether Redis has the ACL user `name`.
    async fn user_exists(&mut self, name: &[u8]) -> bool {
        let request = Bytes::from(crate::upstream::encode_command(&[b"ACL", b"GETUSER", name]));
        match self.shared.call(request, self.out.clone()).await {
            // Redis's null, in either form, or an error.
            Ok(reply) => ![&b"$-1"[..], b"*-1", b"_", b"-"]
                .iter()
                .any(|p| reply.starts_with(p)),
            Err(_) => false,
        }
    }
}

/// Redis's id of a redirect target, in a reply, made the proxy's.
struct RedirectIds {
    upstream: u64,
    proxy: u64,
}

impl ReplyTransform for RedirectIds {
    fn apply(&mut self, reply: Bytes) -> Transformed {
        let from = format!(":{}\r\n", self.upstream);
        let to = format!(":{}\r\n", self.proxy);
        // GETREDIR: the id alone.
        if reply[..] == *from.as_bytes() {
            return Transformed::Done(Bytes::from(to));
        }
        // TRACKINGINFO: the `redirect` field, in RESP2 and RESP3 alike, ahead
        // of the prefixes (the only free text of the reply).
        let field = format!("$8\r\nredirect\r\n{from}");
        let Some(at) = reply
            .windows(field.len())
            .position(|w| w == field.as_bytes())
        else {
            return Transformed::Done(reply);
        };
        let value = at + field.len() - from.len();
        let mut out = BytesMut::with_capacity(reply.len() + to.len());
        out.extend_from_slice(&reply[..value]);
        out.extend_from_slice(to.as_bytes());
        out.extend_from_slice(&reply[at + field.len()..]);
        Transformed::Done(out.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::with_words;

    #[test]
    fn info_counts_are_replaced_in_both_protocols() {
        let body =
            "# Clients\r\nconnected_clients:7\r\ncluster_connections:0\r\nblocked_clients:2\r\n";
        let resp2 = format!("${}\r\n{body}\r\n", body.len());
        let out = rewrite_info(resp2.as_bytes(), 3, 1).unwrap();
        let want =
            "# Clients\r\nconnected_clients:3\r\ncluster_connections:0\r\nblocked_clients:3\r\n";
        assert_eq!(out, format!("${}\r\n{want}\r\n", want.len()).as_bytes());
        let resp3 = format!("={}\r\ntxt:{body}\r\n", body.len() + 4);
        let out = rewrite_info(resp3.as_bytes(), 3, 1).unwrap();
        assert_eq!(
            out,
            format!("={}\r\ntxt:{want}\r\n", want.len() + 4).as_bytes()
        );
        let other = "$12\r\n# Server\r\nx:1\r\n";
        assert_eq!(rewrite_info(other.as_bytes(), 3, 1), None);
        assert_eq!(rewrite_info(b"-ERR x\r\n", 3, 1), None);
    }

    #[test]
    fn full_names_have_their_subcommand_for_containers() {
        assert_eq!(full_name_in(None, b"CLIENT", b"List"), "client|list");
        assert_eq!(full_name_in(None, b"GET", b"k"), "get");
        assert_eq!(full_name_in(None, b"PING", b""), "ping");
    }

    #[test]
    fn table_requests_have_redis_arity() {
        let a = |w: &[&str]| with_words(w, answers);
        assert!(a(&["client", "list"]));
        assert!(a(&["CLIENT", "KILL", "1.2.3.4:5"]));
        assert!(!a(&["CLIENT", "KILL"]));
        assert!(!a(&["CLIENT", "ID", "x"]));
        assert!(!a(&["CLIENT", "NO-EVICT"]));
        assert!(!a(&["CLIENT", "UNBLOCK", "1", "TIMEOUT", "x"]));
    }
}
