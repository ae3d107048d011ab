//! The proxy's table of its own clients: every client connected, what it
//! is doing, and the requests other sessions leave for it. Redis knows
//! only the proxy's upstream connections, shared by many clients (and the
//! proxy's own ones), so its `CLIENT LIST` would describe those; the
//! session answers from this table instead (`session::client_table`), and
//! [`format`] writes its lines as Redis does.
//!
//! A client's id is the proxy's (the one `HELLO` reports too). Where Redis
//! must be told about a client (`CLIENT UNBLOCK`, `CLIENT TRACKING ...
//! REDIRECT`), the id is translated to that of the client's dedicated
//! upstream connection, which Redis knows. A client without one is, to
//! Redis, no client at all: for a redirect, its session is asked to open
//! one (see [`Registry::ask_upstream`]).

pub mod format;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::command::{Args, Kind};
use crate::net::Stream;
use crate::output::ClientState;
use crate::upstream::dedicated::Watch;

/// Every client connected to the proxy, by id (Redis lists its clients in
/// the order they connected, which ids follow).
#[derive(Default)]
pub struct Registry {
    pub(crate) clients: Mutex<BTreeMap<u64, Arc<Entry>>>,
}

/// One client, as the table shows it.
pub struct Entry {
    pub(crate) id: u64,
    pub(crate) addr: String,
    pub(crate) laddr: String,
    pub(crate) fd: i64,
    pub(crate) created: Instant,
    /// Closing it ends the session (`CLIENT KILL`).
    pub(crate) out: Arc<ClientState>,
    pub(crate) state: Mutex<State>,
    /// Wakes the session out of a blocking pop for `CLIENT UNBLOCK`.
    pub(crate) unblock: tokio::sync::Notify,
    /// The session has something to do besides its client's bytes:
    /// `State::asks` may have requests, or its dedicated connection handed
    /// requests back (`session::bounce`). Read without the lock, by a
    /// session that polls for it each time it waits for its client.
    pub(crate) asking: AtomicBool,
    /// Wakes the waiting session for them. Not a `Notify`, whose every
    /// poll takes a lock: this costs a client's every request a few
    /// atomic operations.
    pub(crate) asked: futures_util::task::AtomicWaker,
}

/// What changes while the client is connected.
pub(crate) struct State {
    /// When the client last sent a command (Redis's `lastinteraction`).
    pub(crate) last: Instant,
    /// The last command's name and first argument, as sent (buffers
    /// reused: nothing is allocated per command); `None` before the first.
    pub(crate) cmd: Option<(Vec<u8>, Vec<u8>)>,
    pub(crate) name: Option<Bytes>,
    pub(crate) lib_name: Option<Bytes>,
    pub(crate) lib_ver: Option<Bytes>,
    pub(crate) db: i64,
    pub(crate) resp: u8,
    pub(crate) user: Bytes,
    /// Commands queued and their argument bytes, in MULTI.
    pub(crate) multi: Option<(u32, usize)>,
    /// The last command may block: while it waits (for its dedicated
    /// connection's reply, or parked) the client counts as blocked.
    pub(crate) blocking: bool,
    /// The last command's arguments' bytes.
    pub(crate) argv_mem: usize,
    pub(crate) monitor: bool,
    pub(crate) no_evict: bool,
    /// The client's dedicated connection, if it has one.
    pub(crate) upstream: Option<Watch>,
    /// Waiting in a blocking pop on a queue, which the proxy serves.
    pub(crate) parked: bool,
    /// `CLIENT UNBLOCK` asked to end that wait (with an error if `true`).
    pub(crate) unblock: Option<bool>,
    /// Other sessions waiting for this one's dedicated connection, which
    /// their `CLIENT TRACKING … REDIRECT` names to Redis.
    pub(crate) asks: Vec<Ask>,
}

/// A request for the session's dedicated connection (opened if it has
/// none): answered with the connection's address, `None` if it cannot
/// have one.
pub(crate) type Ask = tokio::sync::oneshot::Sender<Option<SocketAddr>>;

/// How long a `CLIENT TRACKING … REDIRECT` waits for the client it names to
/// answer an [`Ask`]: that client's session does when it next waits for its
/// client's bytes, which a command it is busy with (a blocking one) delays.
pub(crate) const ASK_TIMEOUT: Duration = Duration::from_secs(5);

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
pub(crate) const UNBLOCKED: &[u8] = b"-UNBLOCKED client unblocked via CLIENT UNBLOCK\r\n";

/// Where a client connected from and to.
pub struct Origin {
    pub(crate) addr: String,
    pub(crate) laddr: String,
    pub(crate) fd: i64,
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
    pub(crate) entry: Arc<Entry>,
    pub(crate) registry: Arc<Registry>,
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

    pub(crate) fn all(&self) -> Vec<Arc<Entry>> {
        self.clients.lock().unwrap().values().cloned().collect()
    }

    pub(crate) fn get(&self, id: u64) -> Option<Arc<Entry>> {
        self.clients.lock().unwrap().get(&id).cloned()
    }

    /// The clients connected, and those parked in a blocking pop the
    /// proxy serves.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let all = self.all();
        let parked = all
            .iter()
            .filter(|e| e.state.lock().unwrap().parked)
            .count();
        (all.len(), parked)
    }

    /// Closes a client at once, as Redis frees it: it leaves the table now,
    /// its session stops at its next step.
    pub(crate) fn kill(&self, entry: &Entry) {
        self.clients.lock().unwrap().remove(&entry.id);
        entry.out.kill();
    }

    /// Where the dedicated connection of client `id` comes from, if it
    /// has one.
    pub(crate) fn upstream(&self, id: u64) -> Option<SocketAddr> {
        let entry = self.get(id)?;
        let s = entry.state.lock().unwrap();
        s.upstream.as_ref()?.local_addr()
    }

    /// Where the dedicated connection of client `id` comes from, once its
    /// session has opened one if it had none (as for a request needing
    /// one); `None` if there is no such client, it cannot have one, or it
    /// does not answer in time.
    pub(crate) async fn ask_upstream(&self, id: u64) -> Option<SocketAddr> {
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
    pub(crate) fn subscriptions(&self) -> [i64; 3] {
        self.upstream.as_ref().map_or([0; 3], Watch::subscriptions)
    }

    /// Blocked, as Redis flags a client: in a blocking command still
    /// waiting for its reply.
    pub(crate) fn blocked(&self) -> bool {
        self.blocking && (self.parked || self.upstream.as_ref().is_some_and(Watch::busy))
    }
}

impl Entry {
    pub(crate) fn blocked(&self) -> bool {
        self.state.lock().unwrap().blocked()
    }

    pub(crate) fn pubsub(&self) -> bool {
        self.state.lock().unwrap().subscriptions() != [0; 3]
    }
}

/// Client types of `CLIENT LIST TYPE` and `CLIENT KILL TYPE`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Type {
    Normal,
    Replica,
    Master,
    PubSub,
}

pub(crate) fn client_type(name: &[u8]) -> Option<Type> {
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
    pub(crate) fn is(&self, t: Type) -> bool {
        match t {
            Type::Normal => !self.pubsub(),
            Type::PubSub => self.pubsub(),
            Type::Replica | Type::Master => false,
        }
    }
}
