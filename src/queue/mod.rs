//! Queue interception: pops on configured queue keys become atomic
//! pop-and-lease scripts; ACK, NACK and QUEUE are answered here; blocking
//! pops wait in the proxy; a reaper returns expired leases.
//!
//! The session asks [`Queues::intercept`] about every pop, LREM, ACK, NACK
//! and QUEUE request and gets back what to do instead of forwarding it.

mod bounded;
mod commands;
mod dbs;
pub(crate) mod leases;
pub(crate) mod library;
pub mod limits;
mod pop;
pub(crate) mod rules;
mod serve;
pub(crate) mod signals;
mod unfit;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use crate::cluster::topology::Topology;
use crate::command::{Args, Kind, PopForm};
use crate::config::{self, AckPolicy, Config};
use crate::output::{ClientState, ReplyTransform};
use crate::upstream::shared::SharedUpstream;
use crate::upstream::Endpoint;
use bounded::ByteBoundedMap;
use commands::job::{self, Job};
pub use commands::HELP;
use dbs::Dbs;
use leases::{holder, owners, reaper};
use library::call::{Caller, ScriptReply};
use pop::stream::PopCalls;
use pop::waiters::Events;
use pop::{Parsed, Pop};
use rules::Rules;
pub use serve::{Conn, Left, Outcome, Place, Wait};
use signals::sink;

/// How the session can carry a queue operation out.
#[derive(Clone, Copy)]
pub struct How {
    /// RESP version of the client's replies.
    pub protocol: u8,
    /// Queued in the client's MULTI: one call, part of EXEC's reply.
    pub in_multi: bool,
    /// Several calls may carry it out ([`Intercept::Job`]); false where it
    /// must be one request on the client's own connection (during a pause).
    pub split: bool,
    /// A `CLIENT PAUSE` made through the proxy is in force: a blocking
    /// pop's first call goes on the proxy's own connection.
    pub paused: bool,
    /// The client connection, from [`owners::next_conn`]: leases on rules
    /// that track connections record it.
    pub conn: u64,
    /// The database the client selected: its queue calls run there.
    pub db: i64,
    /// A pop the client sent after it had the reply to its previous pop,
    /// and the first of its transaction: on `ack = "next-pop"` rules it
    /// acknowledges what the connection popped before. A pipelined pop, or
    /// a second one in one MULTI, leaves those leases alone.
    pub next: bool,
    /// Nothing the client sent after this request is read yet: a queue
    /// operation may then go as one of the proxy's scripts
    /// ([`Intercept::Scripted`]), whose second call (when the script leaves
    /// the work to the library) the client's next request waits for. A
    /// client's pipelined requests go as one call each instead, so that they
    /// do not wait for one another.
    pub alone: bool,
}

/// What the session does with a request that may concern a queue.
pub enum Intercept {
    /// Not a queue operation: forward it unchanged.
    Pass,
    /// Answer at once (argument errors, QUEUE HELP).
    Reply(Bytes),
    /// Refuse with this error: more than one call may do where the request
    /// must be one ([`job::above_one_call`]). Inside MULTI it is refused as
    /// Redis refuses a command while queuing: EXEC then fails.
    Refuse(Bytes),
    /// Send `request` instead and rewrite its reply.
    Rewrite {
        request: Bytes,
        transform: Box<dyn ReplyTransform>,
    },
    /// A blocking pop on a queue key, outside MULTI.
    Block(Pop),
    /// Several bounded script calls, awaited before the client's next
    /// request is handled.
    Job(job::Job),
    /// One of the proxy's scripts (see `library/script.rs`), sent on the
    /// shared connection like a [`Intercept::Rewrite`]; the client's next
    /// request waits until its reply is resolved, since `transform` may
    /// send a second call (see [`How::alone`]).
    Scripted {
        request: Bytes,
        transform: Box<dyn ReplyTransform>,
    },
}

/// Bytes of move-destination names remembered at most; past it the oldest
/// are forgotten. Forgetting one only means an LREM there no longer
/// acknowledges: the lease then expires and the stale copy is removed, so
/// at-least-once still holds.
const DESTINATIONS_BYTES: usize = 8 << 20;

pub struct Queues {
    rules: Arc<Rules>,
    /// An LREM on these lists may acknowledge a lease.
    /// Destination → the queue's name (not the resolved queue, which can be
    /// large and is cached apart, within its own bound).
    destinations: RwLock<ByteBoundedMap<Bytes>>,
    /// Each database's queues with leases, parked pops and connections.
    dbs: Arc<Dbs>,
    /// The proxy's own connection in database 0: [`Queues::admin`], the
    /// function library (one for every database).
    own: Caller,
    endpoint: Arc<Endpoint>,
    library: library::Loader,
    /// Where completion signals' acknowledgements go.
    sink: sink::Sink,
}

impl Queues {
    /// Sets up queue handling, also without rules: SIGHUP may add some.
    /// Until then nothing here touches Redis.
    pub async fn start(
        config: &Config,
        endpoint: Arc<Endpoint>,
        cluster: Option<Arc<Topology>>,
        stop: watch::Receiver<bool>,
    ) -> Queues {
        let rules = Arc::new(Rules::new(&config.queues));
        // The proxy's own traffic (wake-ups, reaping) gets its own shared
        // connection so that it never queues behind clients' pipelines
        // (in a cluster, one to each node, each call to its queue's node).
        let (shared, events) = match cluster {
            Some(t) => (
                crate::cluster::Shared::handle(t.clone(), crate::cluster::Flavor::Single),
                Events::Nodes(t),
            ),
            None => (
                SharedUpstream::spawn(endpoint.clone()),
                Events::One(endpoint.clone()),
            ),
        };
        let dbs = Arc::new(Dbs::new(
            shared,
            rules.clone(),
            endpoint.clone(),
            events,
            stop.clone(),
        ));
        let own = dbs.zero().own.clone();
        let reaper = reaper::Reaper {
            rules: rules.clone(),
            dbs: dbs.clone(),
            interval: Duration::from_millis(config.reaper.interval_ms.max(1)),
            batch: config.reaper.batch.max(1),
        };
        tokio::spawn(reaper.run(stop.clone()));
        let holder = holder::Holder {
            rules: rules.clone(),
            dbs: dbs.clone(),
        };
        tokio::spawn(holder.run(stop));
        let sink = sink::Sink::start(rules.clone(), dbs.clone());
        Queues {
            rules,
            destinations: RwLock::new(ByteBoundedMap::new(DESTINATIONS_BYTES)),
            dbs,
            own,
            endpoint,
            library: library::Loader::default(),
            sink,
        }
    }

    /// A client's script call (EVAL, EVALSHA, FCALL and their read-only
    /// forms): if its keys name a move destination of a queue, the script
    /// may move that queue's messages where the proxy cannot see it (a job
    /// finished, or a stalled one handed back, inside a framework's own
    /// script). Logged once per rule and counted: such a framework is
    /// better served by its own recovery (see config/frameworks/).
    pub fn script(&self, args: Args<'_>) {
        if self.rules.is_empty() {
            return;
        }
        let Some(n) = args.get(2).and_then(crate::command::parse_i64) else {
            return;
        };
        let n = usize::try_from(n)
            .unwrap_or(0)
            .min(args.len().saturating_sub(3));
        for key in (3..3 + n).filter_map(|i| args.get(i)) {
            let queue = self.destinations.read().unwrap().get(key).cloned();
            let Some(q) = queue.and_then(|name| self.rules.resolve_leased(&name)) else {
                continue;
            };
            unfit::note(&q.rule.pattern, unfit::Unfit::ScriptMoves, || {
                format!(
                    "a client's script names {:?}, the move destination of queue {:?}: what \
                     it moves there the proxy does not see, so a job it finishes is acknowledged \
                     only by the lease running out, and may run again",
                    String::from_utf8_lossy(key),
                    String::from_utf8_lossy(&q.name),
                )
            });
        }
    }

    /// The acknowledgements `args` makes once Redis accepts it, if it is a
    /// completion signal of some rule (cheap; no I/O).
    pub fn signal(&self, args: Args<'_>) -> Option<signals::Fired> {
        self.rules.signal(args)
    }

    /// A transform for a signalling request's reply: it fires `fired` in
    /// database `db` if Redis accepted the request.
    pub fn on_success(&self, db: i64, fired: signals::Fired) -> Box<dyn ReplyTransform> {
        self.sink.on_success(db, fired)
    }

    /// Loads the function library unless it is known to be in Redis: for
    /// calls that cannot be sent again if it is not (inside MULTI).
    pub async fn ensure_library(&self) {
        self.library
            .ensure(&self.endpoint, &self.own.shared, &self.own.client)
            .await;
    }

    /// The primary moved (Sentinel): the library is loaded there at once,
    /// when queues are configured, rather than by the first calls that
    /// find it missing.
    pub async fn after_switch(&self) {
        if !self.active() {
            return;
        }
        match library::load_on(&self.endpoint).await {
            Ok(()) => tracing::info!(primary = %self.endpoint.addr, "queue function library loaded on the new primary"),
            Err(e) => tracing::warn!("queue function library not loaded on the new primary ({e}); the first queue call there loads it"),
        }
    }

    /// A client's command may have removed the library from Redis.
    pub fn forget_library(&self) {
        self.library.forget();
    }

    /// Whether any queue rule is in force: without one, ACK, NACK and QUEUE
    /// are Redis's unknown commands.
    pub fn active(&self) -> bool {
        !self.rules.is_empty()
    }

    /// The rules in force now (a reload may have changed them).
    pub fn rules(&self) -> Vec<config::QueueRule> {
        self.rules.configured()
    }

    /// Puts new rules in force for the next pops, ACKs and reaps.
    pub fn replace_rules(&self, rules: &[config::QueueRule]) {
        self.rules.replace(rules);
        leases::handed::forget_all();
    }

    /// Whether the request needs interception (cheap; no I/O).
    pub fn concerns(&self, kind: Kind, args: Args<'_>) -> bool {
        if self.rules.is_empty() {
            // Leases taken under rules a reload removed still end.
            let ends = matches!(kind, Kind::Ack | Kind::Nack | Kind::Lrem);
            if !ends || !self.rules.any_leased() {
                return false;
            }
        }
        match kind {
            Kind::Pop(form) => pop::source_keys(form, args).any(|k| self.rules.is_queue(k)),
            Kind::Lrem => args.get(1).is_some_and(|d| {
                let destinations = self.destinations.read().unwrap();
                destinations
                    .get(d)
                    .and_then(|n| self.rules.resolve_leased(n))
                    .is_some_and(|q| q.rule.lrem_acks)
            }),
            Kind::Ack | Kind::Nack | Kind::Queue => true,
            _ => false,
        }
    }

    /// What to do instead of forwarding a request [`Queues::concerns`].
    pub fn intercept(&self, kind: Kind, args: Args<'_>, how: How) -> Intercept {
        let How {
            protocol,
            in_multi,
            split,
            conn,
            db,
            next,
            alone,
            ..
        } = how;
        let db = self.dbs.at(db);
        // Where a request cannot be split, it is one call, as in MULTI.
        let one_call = in_multi || !split;
        // A script of the proxy's own may go first (see `How::alone`).
        let scripted = alone && !one_call;
        match kind {
            Kind::Pop(form) => {
                if in_multi || (one_call && !form.is_blocking()) {
                    if let Some(refusal) = job::pop_above_one_call(form, args, &self.rules) {
                        return Intercept::Refuse(refusal);
                    }
                }
                self.pop(
                    form,
                    args,
                    protocol,
                    (in_multi, one_call, scripted),
                    (conn, next),
                    &db,
                )
            }
            Kind::Lrem => {
                let dest = args.get(1).unwrap_or_default();
                let name = self.destinations.read().unwrap().get(dest).cloned();
                match name.and_then(|n| self.rules.resolve_leased(&n)) {
                    Some(q) if q.rule.lrem_acks => commands::lrem(args, &q, &db.registry, scripted),
                    _ => Intercept::Pass,
                }
            }
            Kind::Ack => commands::ack(
                args,
                &self.rules,
                &db.registry,
                (one_call, scripted),
                || db.owners.owner(conn),
            ),
            Kind::Nack => commands::nack(args, &self.rules, &db.registry, one_call),
            Kind::Queue => commands::queue(
                args,
                &self.rules,
                &db.registry,
                commands::Shape {
                    protocol,
                    db: db.index,
                    one_call,
                },
            ),
            _ => Intercept::Pass,
        }
    }

    fn pop(
        &self,
        form: PopForm,
        args: Args<'_>,
        protocol: u8,
        (in_multi, one_call, scripted): (bool, bool, bool),
        (conn, next): (u64, bool),
        db: &dbs::Db,
    ) -> Intercept {
        let mut pop = match pop::parse(form, args, &self.rules, protocol) {
            Parsed::Pop(p) => p,
            Parsed::Invalid => {
                return Intercept::Rewrite {
                    request: pop::neutralised(args, &self.rules),
                    transform: Box::new(Verbatim),
                }
            }
        };
        for q in pop.queues() {
            if (q.rule.pop_end == config::End::Left) != pop.left {
                unfit::note(&q.rule.pattern, unfit::Unfit::PopEnd, || {
                    let (end, other) = if pop.left {
                        ("left", "right")
                    } else {
                        ("right", "left")
                    };
                    format!(
                        "queue {:?} is popped from the {end} but its rule has pop_end = \"{other}\": \
                         redelivered messages go in at the wrong end; set pop_end = \"{end}\"",
                        String::from_utf8_lossy(&q.name)
                    )
                });
            }
        }
        if let (Some((dest, _)), Some(q)) = (&pop.dest, pop.queues().next()) {
            let known = self.destinations.read().unwrap().contains_key(dest);
            if !known && self.rules.is_queue(dest) {
                unfit::note(&q.rule.pattern, unfit::Unfit::DestinationIsQueue, || {
                    format!(
                        "the move destination {:?} of queue {:?} matches a queue rule itself: \
                         the processing list is leased as a queue; narrow the rule's pattern",
                        String::from_utf8_lossy(dest),
                        String::from_utf8_lossy(&q.name)
                    )
                });
            }
            if !known {
                self.destinations.write().unwrap().insert(
                    dest.clone(),
                    q.name.clone(),
                    q.name.len(),
                );
            }
        }
        pop.next = next;
        if pop.queues().any(|q| q.rule.tracks_connections()) {
            pop.owner = db.owners.owner(conn);
            // Only a next-pop pop reads or leaves the lease a connection
            // holds; a pop elsewhere neither takes nor ends one there.
            if pop.queues().any(|q| q.rule.ack == AckPolicy::NextPop) {
                let (n, held) = db.owners.held.pop_made(conn);
                pop.ticket = Some(Box::new(pop::Ticket {
                    leases: db.owners.held.clone(),
                    conn,
                    n,
                    held,
                }));
            }
            for q in pop.queues().filter(|q| q.rule.requeues_on_disconnect()) {
                db.owners.note(conn, &q.name);
            }
        }
        let registry = db.registry.clone();
        if in_multi || (one_call && !form.is_blocking()) {
            let call = pop.single_call();
            return Intercept::Rewrite {
                request: call.request_in(db.index),
                transform: ScriptReply::boxed(call, db.index, move |v| {
                    let done = pop.popped(&v);
                    registry.record(&done);
                    done.reply.unwrap_or_else(|| pop.multi_empty_reply())
                }),
            };
        }
        if form.is_blocking() {
            return Intercept::Block(pop);
        }
        if pop.fits_one_call() {
            // Sent like any other command, so that a client's pipelined pops
            // do not wait for one another; the rare further calls follow
            // from the reply stream.
            let mut progress = pop::Progress::default();
            if let Some(call) = pop.next_call(&mut progress) {
                let take = match scripted {
                    true => pop.take_request(&call, &progress, db.index),
                    false => None,
                };
                if let Some(take) = take {
                    return Intercept::Scripted {
                        request: take.request.evalsha.clone(),
                        transform: PopCalls::boxed(pop, progress, call, registry).taking(take),
                    };
                }
                return Intercept::Rewrite {
                    request: call.request_in(db.index),
                    transform: PopCalls::boxed(pop, progress, call, registry),
                };
            }
        }
        Intercept::Job(Job::new(move |caller| async move {
            match pop.run(&caller).await {
                Ok(done) => {
                    registry.record(&done);
                    done.reply.unwrap_or_else(|| pop.multi_empty_reply())
                }
                Err(e) => e.to_reply(),
            }
        }))
    }

    /// Client connection `conn` closed. Unless the proxy is shutting down,
    /// the leases it took on requeue_on_disconnect and held queues end now
    /// (and are no longer renewed), in each database, on the connection its
    /// pops there went on (`shared` in database 0): behind them, so a pop
    /// still in flight has leased before they are looked for.
    pub fn closed(&self, conn: u64, shutting_down: bool, shared: &SharedUpstream) {
        self.requeue_closed(self.dbs.zero(), conn, shutting_down, shared);
        for db in self.dbs.others() {
            self.requeue_closed(&db, conn, shutting_down, &db.clients);
        }
    }

    fn requeue_closed(
        &self,
        db: &dbs::Db,
        conn: u64,
        shutting_down: bool,
        shared: &SharedUpstream,
    ) {
        let names = db.owners.take(conn);
        if names.is_empty() || shutting_down {
            return;
        }
        let queues: Vec<Arc<rules::Queue>> = names
            .iter()
            .filter_map(|n| self.rules.resolve_leased(n))
            .filter(|q| q.rule.requeues_on_disconnect())
            .collect();
        let caller = Caller {
            shared: shared.clone(),
            client: ClientState::new(0, usize::MAX),
            db: db.index,
        };
        let (owner, waiters) = (db.owners.owner(conn), db.waiters.clone());
        let registry = db.registry.clone();
        tokio::spawn(async move {
            // A parked pop of this connection still running leases first.
            waiters.sync().await;
            for q in &queues {
                if owners::requeue(&caller, q, &owner).await > 0 {
                    registry.changed(&q.name);
                    waiters.wake(q.name.clone());
                }
            }
        });
    }

    /// Runs `QUEUE <args>` as the proxy itself, on its own connection, and
    /// returns the RESP3 reply: the code path of a client's QUEUE command,
    /// without the client's ACL check (the operations server guards its
    /// actions itself).
    pub async fn admin(&self, args: &[&[u8]]) -> Bytes {
        let mut buf = Vec::new();
        let mut ranges = Vec::with_capacity(args.len() + 1);
        for a in std::iter::once(&b"QUEUE"[..]).chain(args.iter().copied()) {
            let start = buf.len();
            buf.extend_from_slice(a);
            ranges.push(start..buf.len());
        }
        let how = How {
            protocol: 3,
            in_multi: false,
            split: true,
            paused: false,
            // No client connection: nothing to acknowledge by next pop.
            conn: 0,
            db: 0,
            next: false,
            alone: true,
        };
        match self.intercept(Kind::Queue, Args::new(&buf, &ranges), how) {
            Intercept::Reply(b) | Intercept::Refuse(b) => b,
            Intercept::Rewrite {
                request,
                mut transform,
            }
            | Intercept::Scripted {
                request,
                mut transform,
            } => {
                let reply = self.own.shared.call(request, self.own.client.clone()).await;
                crate::output::resolve(
                    reply,
                    1,
                    Some(transform.as_mut()),
                    &self.own.shared,
                    &self.own.client,
                )
                .await
            }
            Intercept::Job(job) => job.run(self.own.clone()).await,
            Intercept::Pass | Intercept::Block(_) => {
                Bytes::from_static(b"-ERR ackproxy: not a QUEUE subcommand\r\n")
            }
        }
    }

    /// Sends one command on the proxy's own connection and returns its
    /// reply as Redis gave it (an error reply is `Ok` too): the operations
    /// server's SCAN, PING and SCRIPT EXISTS, which would otherwise open a
    /// connection per request.
    pub async fn own_command(&self, args: &[&[u8]]) -> crate::output::Reply {
        let request = Bytes::from(crate::upstream::encode_command(args));
        self.own.shared.call(request, self.own.client.clone()).await
    }

    /// The proxy's own scripts in Redis's script cache, for `INFO` to
    /// leave out (see `library/script.rs`): asked with `SCRIPT EXISTS` on
    /// the proxy's connection right before the client's `INFO`. A script a
    /// pop loads between the two shows for that one reply; a probe that
    /// fails (`BUSY`) hides nothing.
    pub async fn scripts_cached(&self) -> crate::clients::format::Hidden {
        let c = match self.own_command(&library::script::probe()).await {
            Ok(reply) => library::script::cached_in(&reply),
            Err(_) => Default::default(),
        };
        crate::clients::format::Hidden {
            scripts: c.scripts,
            bytes: c.bytes,
        }
    }

    /// The dead-letter list of queue `key`, if it is one.
    pub fn dead_letter_of(&self, key: &[u8]) -> Option<Bytes> {
        self.rules
            .resolve(key)
            .map(|q| Bytes::copy_from_slice(q.keys.dead()))
    }

    /// Where the web view reads a queue's messages from: its delayed set,
    /// and whether consumers pop from the list's left end.
    pub fn browse_of(&self, key: &[u8]) -> Option<(Bytes, bool)> {
        self.rules.resolve(key).map(|q| {
            (
                Bytes::copy_from_slice(q.keys.get("delayed")),
                q.rule.pop_end == crate::config::End::Left,
            )
        })
    }

    /// The pattern of the rule that makes `key` a queue.
    pub fn rule_of(&self, key: &[u8]) -> Option<String> {
        self.rules.resolve(key).map(|q| q.rule.pattern.clone())
    }

    /// Whether a rule's pattern names one key rather than a glob.
    pub fn is_exact(&self, pattern: &str) -> bool {
        self.rules.is_exact(pattern.as_bytes())
    }

    /// Up to `limit` queues of database 0 this proxy knows to have leases.
    pub fn leased(&self, limit: usize) -> Vec<Bytes> {
        self.dbs.zero().registry.names(limit)
    }

    /// Where clients' queue operations in database `db` go (other than 0,
    /// where each client's own shared connection serves).
    pub fn clients_in(&self, db: i64) -> SharedUpstream {
        self.dbs.at(db).clients.clone()
    }

    /// A blocking pop in database `db`, its first step: the call a
    /// non-blocking pop of its form makes, on the client's shared connection
    /// (`caller`; `None`: the proxy's own, where parked pops run), as Redis
    /// serves a blocking pop on a list that has elements at once. `Ok` with
    /// the client's reply, or `Err` with the pop to [`Queues::park`] when
    /// it found nothing (or pops parked before it have the first claim).
    /// One bounded call, not interrupted: a message it leased is the
    /// client's.
    pub async fn pop_now(&self, pop: Pop, caller: Option<Caller>, db: i64) -> Result<Bytes, Pop> {
        let db = self.dbs.at(db);
        if db.waiters.waiting_on(&pop) {
            // What is pushed there is for the pops parked first: this one
            // parks behind them. Asking for the next message finished the
            // last one: acknowledged now, not when the dispatcher gets to
            // this pop (which may be a long time).
            if pop.next {
                for q in pop
                    .queues()
                    .filter(|q| q.rule.ack == config::AckPolicy::NextPop)
                {
                    owners::release(&db.own, q, &pop.owner).await;
                }
            }
            return Err(pop);
        }
        // The call acknowledges the connection's earlier leases on next-pop
        // queues (if it is a next pop) before it pops, also when it finds
        // nothing.
        match pop.run(caller.as_ref().unwrap_or(&db.own)).await {
            Ok(done) => {
                db.registry.record(&done);
                match done.reply {
                    Some(reply) => Ok(reply),
                    None => Err(pop),
                }
            }
            Err(e) => Ok(e.to_reply()),
        }
    }

    /// A blocking pop in database `db` that [`Queues::pop_now`] found
    /// nothing for: it waits until it gets a message or its timeout
    /// (counted from `started`, when the client's pop began) passes.
    pub async fn park(&self, pop: Pop, db: i64, started: tokio::time::Instant) -> Bytes {
        let db = self.dbs.at(db);
        let timeout_reply = pop.timeout_reply();
        let next_pop = pop
            .queues()
            .any(|q| q.rule.ack == config::AckPolicy::NextPop);
        let deadline = match pop.timeout {
            crate::timeout::Timeout::Millis(ms) => started.checked_add(Duration::from_millis(ms)),
            crate::timeout::Timeout::Forever => None,
        };
        if deadline.is_some_and(|d| d <= tokio::time::Instant::now()) {
            return timeout_reply;
        }
        let mut rx = db.waiters.park(pop);
        let Some(deadline) = deadline else {
            return rx.await.unwrap_or_else(|_| {
                Bytes::from_static(b"-ERR ackproxy: blocking pop abandoned\r\n")
            });
        };
        match tokio::time::timeout_at(deadline, &mut rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Bytes::from_static(b"-ERR ackproxy: blocking pop abandoned\r\n"),
            Err(_) => {
                // A pop may be running for this client right now: its
                // reply, if already sent, is the answer (the message was
                // taken as the time ran out); otherwise it is undone by
                // the dispatcher, which on next-pop rules must happen
                // before this connection pops again.
                rx.close();
                if let Ok(reply) = rx.try_recv() {
                    return reply;
                }
                if next_pop {
                    db.waiters.sync().await;
                }
                timeout_reply
            }
        }
    }
}

/// The upstream's reply, unchanged.
struct Verbatim;

impl ReplyTransform for Verbatim {
    fn apply(&mut self, reply: Bytes) -> crate::output::Transformed {
        crate::output::Transformed::Done(reply)
    }
}

/// The reply transform of a queue operation in a database other than 0:
/// its further calls (a library load, a pop's next bounded call) go on
/// that database's connection, as its first did.
pub struct InDb {
    pub inner: Box<dyn ReplyTransform>,
    pub shared: SharedUpstream,
}

impl ReplyTransform for InDb {
    fn apply(&mut self, reply: Bytes) -> crate::output::Transformed {
        self.inner.apply(reply)
    }

    fn resend_on(&self) -> Option<&dyn crate::output::Resend> {
        Some(&self.shared)
    }
}
