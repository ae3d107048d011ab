//! Blocking pops on queue keys wait here, in the proxy, once a first try
//! (an ordinary pop, see `Queues::blocking_pop`) found nothing: a Lua
//! script cannot block, and polling Redis for every parked client would load
//! it for nothing. Keyspace notifications say when a watched list changes
//! (also for pushes made straight to Redis); the dispatcher then retries the
//! pops of the clients parked on that key, first come first served.
//!
//! Each retry runs as a task of its own. The pops waiting on one key run
//! one at a time, oldest first, until one finds nothing; those of other keys
//! run beside them, so one client's long pop (a `BLMPOP` with a large COUNT
//! is many bounded calls) holds no client parked on another key. Where
//! notifications cannot be enabled, the dispatcher polls with backoff.
//!
//! Only keys that pops wait on are subscribed to, from the first pop parked
//! on one until [`LINGER`] after the last left: a subscription to the
//! rules' patterns would bring an event to parse for every push and pop on
//! every queue, parked or not (29% of the proxy's instructions per pop+ACK
//! pair on a busy queue).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot, watch};

use crate::cluster::topology::Topology;
use crate::error::{ControlCause, ControlError};
use crate::output::ClientState;
use crate::queue::leases::registry::Registry;
use crate::queue::library::call::{CallError, Caller};
use crate::queue::pop::call::Source;
use crate::queue::pop::Pop;
use crate::queue::rules::Rules;
use crate::upstream::shared::SharedUpstream;
use crate::upstream::{control, Endpoint};

/// Keyspace channels of database `db`: each database's queues have
/// waiters of their own.
fn channel_prefix(db: i64) -> Vec<u8> {
    format!("__keyspace@{db}__:").into_bytes()
}
/// Even with notifications, parked pops are retried this often, which
/// covers events lost while the notification connection was down.
const SAFETY_RECHECK: Duration = Duration::from_secs(1);
const POLL_MIN: Duration = Duration::from_millis(10);
const POLL_MAX: Duration = Duration::from_millis(500);
/// A key's subscription outlives its last parked pop by this much, so that
/// workers that park again after each job do not subscribe each time.
const LINGER: Duration = Duration::from_secs(30);
/// At most this many keys stay subscribed without a parked pop; past it
/// the one idle longest is unsubscribed at once.
const LINGER_MAX: usize = 1024;
/// Parked pops retried at once at most (a safety recheck wakes every key):
/// the others wait for one of them to end.
const MAX_RUNNING: usize = 256;

enum Msg {
    Park(Pop, oneshot::Sender<Bytes>),
    Wake(Bytes),
    WakeAll,
    /// Answered once every pop running when it came has finished.
    Sync(oneshot::Sender<()>),
    /// Notifications are (true) or are not (false) available.
    Notifications(bool),
}

/// Parked pops per key, from when a client hands one over until the
/// dispatcher lets it go.
type Waiting = Arc<Mutex<HashMap<Bytes, usize>>>;

#[derive(Clone)]
pub struct Waiters {
    tx: mpsc::UnboundedSender<Msg>,
    waiting: Waiting,
}

/// Where keyspace notifications come from.
#[derive(Clone)]
pub enum Events {
    /// The one Redis (or the primary of the moment, with Sentinel).
    One(Arc<Endpoint>),
    /// Each primary of a cluster, for the keys it serves: Redis Cluster
    /// publishes keyspace events on the node where they happen only.
    Nodes(Arc<Topology>),
}

impl Waiters {
    pub fn start(
        rules: Arc<Rules>,
        events: Events,
        shared: SharedUpstream,
        registry: Arc<Registry>,
        stop: watch::Receiver<bool>,
        db: i64,
    ) -> Waiters {
        let (tx, rx) = mpsc::unbounded_channel();
        let (sub_tx, sub_rx) = mpsc::unbounded_channel();
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let waiting = Waiting::default();
        let survive_failover = match &events {
            Events::One(endpoint) => endpoint.addr.follows_sentinels(),
            // A failover moves some slots: pops on the others go on.
            Events::Nodes(_) => true,
        };
        match events {
            Events::One(endpoint) => {
                let listener = Listener {
                    endpoint,
                    prefix: channel_prefix(db),
                    changed: rules.subscribe(),
                    rules: rules.clone(),
                    keys: HashSet::new(),
                    dispatcher: tx.clone(),
                    subs: sub_rx,
                    stop: stop.clone(),
                };
                tokio::spawn(listener.run());
            }
            Events::Nodes(topology) => {
                let nodes = NodeListeners {
                    topology,
                    rules: rules.clone(),
                    prefix: channel_prefix(db),
                    dispatcher: tx.clone(),
                    stop: stop.clone(),
                };
                tokio::spawn(nodes.run(sub_rx));
            }
        }
        let dispatcher = Dispatcher {
            caller: Caller {
                shared,
                client: ClientState::new(0, usize::MAX),
                db,
            },
            registry,
            changed: rules.subscribe(),
            rules,
            epoch: 0,
            next_id: 0,
            parked: HashMap::new(),
            running: HashMap::new(),
            by_key: HashMap::new(),
            busy: HashSet::new(),
            wanted: HashSet::new(),
            syncs: Vec::new(),
            served: 0,
            done: done_tx,
            waiting: waiting.clone(),
            lingering: HashMap::new(),
            subs: sub_tx,
            notifications: false,
            counted_parked: 0,
            counted_polling: false,
            poll: POLL_MIN,
            survive_failover,
        };
        tokio::spawn(dispatcher.run(rx, done_rx));
        Waiters { tx, waiting }
    }

    /// Parks a blocking pop; the receiver gets its reply once it pops.
    pub fn park(&self, pop: Pop) -> oneshot::Receiver<Bytes> {
        {
            let mut waiting = self.waiting.lock().unwrap();
            for key in keys_of(&pop) {
                *waiting.entry(key).or_default() += 1;
            }
        }
        let (tx, rx) = oneshot::channel();
        let _ = self.tx.send(Msg::Park(pop, tx));
        rx
    }

    /// Whether a pop is parked on one of `pop`'s keys. A new pop there takes
    /// its place behind it, as in Redis, where a list that clients wait on
    /// is empty: what was pushed is theirs, first come first served.
    pub fn waiting_on(&self, pop: &Pop) -> bool {
        let waiting = self.waiting.lock().unwrap();
        !waiting.is_empty() && pop.sources.iter().any(|s| waiting.contains_key(s.key()))
    }

    /// Something may have been pushed to `key`.
    pub fn wake(&self, key: Bytes) {
        let _ = self.tx.send(Msg::Wake(key));
    }

    /// Anything may have changed (a `SWAPDB`): every parked pop looks again.
    pub fn wake_all(&self) {
        let _ = self.tx.send(Msg::WakeAll);
    }

    /// Returns once the pops in progress have finished (and, for a client
    /// that was no longer there to take its reply, been undone).
    pub async fn sync(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Sync(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

/// A pop's keys, each once, in its order.
fn keys_of(pop: &Pop) -> Vec<Bytes> {
    let mut keys: Vec<Bytes> = Vec::with_capacity(pop.sources.len());
    for s in &pop.sources {
        if !keys.contains(s.key()) {
            keys.push(s.key().clone());
        }
    }
    keys
}

/// A parked pop on `keys` waits no longer.
fn leave(waiting: &Waiting, keys: &[Bytes]) {
    let mut waiting = waiting.lock().unwrap();
    for key in keys {
        if let Some(n) = waiting.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                waiting.remove(key);
            }
        }
    }
}

struct Parked {
    pop: Pop,
    reply: oneshot::Sender<Bytes>,
    keys: Vec<Bytes>,
    /// The reload (see [`Dispatcher::epoch`]) its sources were last checked
    /// against; `None` before its first retry.
    epoch: Option<u64>,
}

enum Sub {
    Subscribe(Bytes),
    Unsubscribe(Bytes),
}

/// What a retry's task hands back: the pop, still parked, if it found
/// nothing; `None` once it was answered.
type Done = (u64, Option<Parked>);

struct Dispatcher {
    caller: Caller,
    registry: Arc<Registry>,
    rules: Arc<Rules>,
    changed: watch::Receiver<()>,
    /// Reloads seen: a pop's sources whose rule a reload removed are popped
    /// as the plain lists they now are.
    epoch: u64,
    next_id: u64,
    /// The parked pops not running now.
    parked: HashMap<u64, Parked>,
    /// The pops running now, with their keys.
    running: HashMap<u64, Vec<Bytes>>,
    /// Every parked pop of each key, running or not, oldest first.
    by_key: HashMap<Bytes, VecDeque<u64>>,
    /// The keys of the running pops: no other pop on them starts meanwhile.
    busy: HashSet<Bytes>,
    /// Keys whose pops are to be tried: woken since the pop first in line
    /// there last started.
    wanted: HashSet<Bytes>,
    /// Syncs, each waiting for the pops that were running when it came.
    syncs: Vec<(HashSet<u64>, oneshot::Sender<()>)>,
    /// Pops answered since the last poll.
    served: usize,
    done: mpsc::UnboundedSender<Done>,
    waiting: Waiting,
    /// Keys subscribed with no parked pop, since when. The keys subscribed
    /// are these and those of `by_key`.
    lingering: HashMap<Bytes, Instant>,
    subs: mpsc::UnboundedSender<Sub>,
    notifications: bool,
    /// What this database's dispatcher adds to the parked and polling
    /// gauges, which sum those of every database.
    counted_parked: usize,
    counted_polling: bool,
    poll: Duration,
    /// The primary may move (Sentinel): a pop that finds Redis unreachable
    /// or no longer the primary stays parked, and is tried again on the
    /// new one.
    survive_failover: bool,
}

impl Dispatcher {
    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Msg>,
        mut done: mpsc::UnboundedReceiver<Done>,
    ) {
        let mut last = Instant::now();
        loop {
            let recheck = if self.parked.is_empty() && self.running.is_empty() {
                Duration::from_secs(3600)
            } else if self.notifications {
                SAFETY_RECHECK
            } else {
                self.poll
            };
            let recheck_at = last + recheck;
            let sweep_at = self.lingering.values().min().map(|&t| t + LINGER);
            let msg = tokio::select! {
                m = rx.recv() => match m {
                    Some(m) => m,
                    None => return,
                },
                Some((id, back)) = done.recv() => {
                    self.finished(id, back);
                    self.pump();
                    continue;
                }
                _ = tokio::time::sleep_until(recheck_at.into()) => Msg::WakeAll,
                _ = sleep_until_some(sweep_at) => {
                    self.sweep(Instant::now());
                    continue;
                }
            };
            last = Instant::now();
            match msg {
                Msg::Park(pop, reply) => {
                    let keys = self.park(pop, reply);
                    self.poll = POLL_MIN;
                    // A push between the client's first try and now may
                    // have brought no wake-up for it.
                    self.want(&keys);
                    self.gauge();
                }
                Msg::Wake(key) => self.want(std::slice::from_ref(&key)),
                Msg::Sync(done) => {
                    if self.running.is_empty() {
                        let _ = done.send(());
                    } else {
                        self.syncs
                            .push((self.running.keys().copied().collect(), done));
                    }
                }
                Msg::WakeAll => {
                    if !self.notifications {
                        self.poll = if self.served > 0 {
                            POLL_MIN
                        } else {
                            (self.poll * 2).min(POLL_MAX)
                        };
                    }
                    self.served = 0;
                    let keys: Vec<Bytes> = self.by_key.keys().cloned().collect();
                    self.want(&keys);
                }
                Msg::Notifications(on) => {
                    // Counted on every report: the dispatcher starts out
                    // polling, while the gauge starts at 0.
                    if on == self.counted_polling {
                        // 1 while any database's pops poll.
                        static POLLING: std::sync::atomic::AtomicUsize =
                            std::sync::atomic::AtomicUsize::new(0);
                        use std::sync::atomic::Ordering::AcqRel;
                        let before = if on {
                            POLLING.fetch_sub(1, AcqRel)
                        } else {
                            POLLING.fetch_add(1, AcqRel)
                        };
                        let now = if on { before - 1 } else { before + 1 };
                        crate::telemetry::clients()
                            .polling
                            .set(if now > 0 { 1.0 } else { 0.0 });
                        self.counted_polling = !on;
                    }
                    self.notifications = on;
                }
            }
            self.pump();
        }
    }

    fn gauge(&mut self) {
        let now = self.parked.len() + self.running.len();
        let parked = &crate::telemetry::clients().parked;
        if now > self.counted_parked {
            parked.increment((now - self.counted_parked) as f64);
        } else if now < self.counted_parked {
            parked.decrement((self.counted_parked - now) as f64);
        }
        self.counted_parked = now;
    }

    /// Returns the pop's keys.
    fn park(&mut self, pop: Pop, reply: oneshot::Sender<Bytes>) -> Vec<Bytes> {
        let id = self.next_id;
        self.next_id += 1;
        let keys = keys_of(&pop);
        for key in &keys {
            if self.lingering.remove(key).is_none() && !self.by_key.contains_key(key) {
                let _ = self.subs.send(Sub::Subscribe(key.clone()));
            }
            self.by_key.entry(key.clone()).or_default().push_back(id);
        }
        self.parked.insert(
            id,
            Parked {
                pop,
                reply,
                keys: keys.clone(),
                epoch: None,
            },
        );
        keys
    }

    /// Something may have been pushed to these keys.
    fn want(&mut self, keys: &[Bytes]) {
        for key in keys {
            if self.by_key.contains_key(key) {
                self.wanted.insert(key.clone());
            }
        }
    }

    /// Starts the pop first in line on each wanted key whose keys no
    /// running pop reads.
    fn pump(&mut self) {
        if self.wanted.is_empty() {
            return;
        }
        let keys: Vec<Bytes> = self
            .wanted
            .iter()
            .filter(|k| !self.busy.contains(*k))
            .cloned()
            .collect();
        for key in keys {
            if self.running.len() >= MAX_RUNNING {
                break;
            }
            // An earlier start in this round may have taken it.
            if self.busy.contains(&key) || !self.wanted.contains(&key) {
                continue;
            }
            match self.first(&key) {
                None => {
                    self.wanted.remove(&key);
                }
                Some(id) => {
                    let free = self
                        .parked
                        .get(&id)
                        .is_some_and(|p| p.keys.iter().all(|k| !self.busy.contains(k)));
                    // Otherwise it stays wanted: tried when the pop
                    // holding one of its keys ends.
                    if free {
                        self.start(id);
                    }
                }
            }
        }
    }

    /// The pop first in line on `key`, dropping those whose client is gone.
    fn first(&mut self, key: &Bytes) -> Option<u64> {
        loop {
            let id = *self.by_key.get(key)?.front()?;
            match self.parked.get(&id) {
                Some(p) if p.reply.is_closed() => {
                    // Timed out or disconnected.
                    self.remove(id);
                }
                None if !self.running.contains_key(&id) => {
                    self.unlist(id, std::slice::from_ref(key));
                }
                _ => return Some(id),
            }
        }
    }

    /// Runs parked pop `id` in a task of its own.
    fn start(&mut self, id: u64) {
        let Some(mut p) = self.parked.remove(&id) else {
            return;
        };
        if self.changed.has_changed().unwrap_or(false) {
            self.changed.borrow_and_update();
            self.epoch += 1;
        }
        if p.epoch != Some(self.epoch) {
            // A reload removed the rule of a key it waits on: that key is a
            // plain list now, popped without a lease, as a pop made after
            // the reload would pop it. (A lease taken under a rule no
            // longer in force would be one nobody expects.)
            for s in &mut p.pop.sources {
                if let Source::Queue(q) = s {
                    if !self.rules.is_queue(&q.name) {
                        *s = Source::Plain(q.name.clone());
                    }
                }
            }
            p.epoch = Some(self.epoch);
        }
        for key in &p.keys {
            self.busy.insert(key.clone());
            // Its run looks at every key it waits on, so it answers the
            // wake-ups of the keys it is first on; those that come while it
            // runs are tried after it.
            if self.by_key.get(key).and_then(|q| q.front()) == Some(&id) {
                self.wanted.remove(key);
            }
        }
        self.running.insert(id, p.keys.clone());
        let (caller, registry, done, waiting) = (
            self.caller.clone(),
            self.registry.clone(),
            self.done.clone(),
            self.waiting.clone(),
        );
        let survive_failover = self.survive_failover;
        tokio::spawn(async move {
            let reply = match p.pop.run(&caller).await {
                Ok(popped) => {
                    registry.record(&popped);
                    popped.reply
                }
                // A lease this pop may have taken without hearing back
                // expires and is delivered again: at-least-once holds.
                Err(e) if survive_failover && during_failover(&e) => None,
                // WRONGTYPE and the like end the wait, as in Redis; so
                // does a Redis that cannot be reached, as for a plain
                // blocking pop on a connection that is gone.
                Err(e) => Some(e.to_reply()),
            };
            let back = match reply {
                None => Some(p),
                Some(reply) => {
                    // Before the client hears back: its next pop is not
                    // one behind this.
                    leave(&waiting, &p.keys);
                    // If the client just went away (or its timeout passed)
                    // its message stays leased and comes back when the
                    // lease expires; on next-pop rules, now, before this
                    // task counts as finished (see `sync`).
                    if p.reply.send(reply).is_err() {
                        crate::queue::leases::owners::undelivered(&caller, &p.pop).await;
                    }
                    None
                }
            };
            let _ = done.send((id, back));
        });
    }

    /// A running pop ended: parked again if it found nothing.
    fn finished(&mut self, id: u64, back: Option<Parked>) {
        let keys = self.running.remove(&id).unwrap_or_default();
        for key in &keys {
            self.busy.remove(key);
        }
        match back {
            Some(p) => {
                self.parked.insert(id, p);
            }
            None => {
                self.served += 1;
                // (Its task took it out of `waiting`.)
                self.unlist(id, &keys);
                // The next in line there may find something too.
                self.want(&keys);
                self.gauge();
            }
        }
        let mut i = 0;
        while i < self.syncs.len() {
            self.syncs[i].0.remove(&id);
            if self.syncs[i].0.is_empty() {
                let (_, tx) = self.syncs.swap_remove(i);
                let _ = tx.send(());
            } else {
                i += 1;
            }
        }
    }

    /// `key` has no parked pop left: its subscription lingers.
    fn idle(&mut self, key: &Bytes) {
        if self.lingering.len() >= LINGER_MAX {
            let oldest = self.lingering.iter().min_by_key(|(_, &t)| t);
            if let Some(k) = oldest.map(|(k, _)| k.clone()) {
                self.unsubscribe(&k);
            }
        }
        self.lingering.insert(key.clone(), Instant::now());
    }

    /// Ends a lingering subscription.
    fn unsubscribe(&mut self, key: &Bytes) {
        if self.lingering.remove(key).is_some() {
            let _ = self.subs.send(Sub::Unsubscribe(key.clone()));
        }
    }

    /// Ends the subscriptions that lingered long enough.
    fn sweep(&mut self, now: Instant) {
        let done: Vec<Bytes> = self
            .lingering
            .iter()
            .filter(|(_, &t)| now >= t + LINGER)
            .map(|(k, _)| k.clone())
            .collect();
        for k in done {
            self.unsubscribe(&k);
        }
    }

    /// Lets parked pop `id` go unanswered (its client is gone).
    fn remove(&mut self, id: u64) {
        if let Some(p) = self.parked.remove(&id) {
            self.unlist(id, &p.keys);
            leave(&self.waiting, &p.keys);
            self.gauge();
        }
    }

    /// Takes `id` out of the lines of `keys`.
    fn unlist(&mut self, id: u64, keys: &[Bytes]) {
        for key in keys {
            if let Some(q) = self.by_key.get_mut(key) {
                q.retain(|&w| w != id);
                if q.is_empty() {
                    self.by_key.remove(key);
                    self.wanted.remove(key);
                    self.idle(key);
                }
            }
        }
    }
}

/// Backoff between attempts to get the subscription back.
const RESUBSCRIBE_MIN: Duration = Duration::from_millis(50);
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(5);

/// Keeps a subscription to keyspace notifications for the keys the
/// dispatcher asks for, turning each event into a wake-up for it. While
/// there is none, the dispatcher is told so, and polls.
struct Listener {
    endpoint: Arc<Endpoint>,
    /// The keyspace channels' prefix in this database.
    prefix: Vec<u8>,
    /// Without rules nothing is subscribed, and Redis's notification
    /// settings are left alone.
    rules: Arc<Rules>,
    changed: watch::Receiver<()>,
    /// Keys asked for: subscribed again after a reconnect.
    keys: HashSet<Bytes>,
    dispatcher: mpsc::UnboundedSender<Msg>,
    subs: mpsc::UnboundedReceiver<Sub>,
    stop: watch::Receiver<bool>,
}

/// One [`Listener`] per primary of a cluster, each subscribed to every key
/// asked for (a node publishes events only for the keys it serves, so a
/// key moved by a resharding is heard from its new node without
/// resubscribing). Notifications count as available while every node's
/// are.
struct NodeListeners {
    topology: Arc<Topology>,
    rules: Arc<Rules>,
    prefix: Vec<u8>,
    dispatcher: mpsc::UnboundedSender<Msg>,
    stop: watch::Receiver<bool>,
}

/// How often the set of primaries is compared with the listeners'.
const NODES_CHECK: Duration = Duration::from_secs(1);

impl NodeListeners {
    async fn run(self, mut subs: mpsc::UnboundedReceiver<Sub>) {
        let mut stop = self.stop.clone();
        let mut keys: HashSet<Bytes> = HashSet::new();
        // Per node: its listener's subscription requests, and whether its
        // notifications are on.
        let mut nodes: HashMap<String, (mpsc::UnboundedSender<Sub>, bool)> = HashMap::new();
        let (from_tx, mut from_rx) = mpsc::unbounded_channel::<(String, Msg)>();
        let mut all_on = false;
        let mut check = tokio::time::interval(NODES_CHECK);
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = check.tick() => {
                    let primaries = self.topology.primaries();
                    nodes.retain(|addr, _| primaries.contains(addr));
                    for addr in primaries {
                        if nodes.contains_key(&addr) {
                            continue;
                        }
                        let (sub_tx, sub_rx) = mpsc::unbounded_channel();
                        let (msg_tx, mut msg_rx) = mpsc::unbounded_channel();
                        let listener = Listener {
                            endpoint: self.topology.endpoint(&addr),
                            prefix: self.prefix.clone(),
                            changed: self.rules.subscribe(),
                            rules: self.rules.clone(),
                            keys: keys.clone(),
                            dispatcher: msg_tx,
                            subs: sub_rx,
                            stop: self.stop.clone(),
                        };
                        tokio::spawn(listener.run());
                        let (from, tag) = (from_tx.clone(), addr.clone());
                        tokio::spawn(async move {
                            while let Some(msg) = msg_rx.recv().await {
                                if from.send((tag.clone(), msg)).is_err() {
                                    return;
                                }
                            }
                        });
                        nodes.insert(addr, (sub_tx, false));
                    }
                }
                sub = subs.recv() => {
                    let Some(sub) = sub else { return };
                    match &sub {
                        Sub::Subscribe(k) => keys.insert(k.clone()),
                        Sub::Unsubscribe(k) => keys.remove(k),
                    };
                    for (tx, _) in nodes.values() {
                        let _ = tx.send(match &sub {
                            Sub::Subscribe(k) => Sub::Subscribe(k.clone()),
                            Sub::Unsubscribe(k) => Sub::Unsubscribe(k.clone()),
                        });
                    }
                }
                Some((addr, msg)) = from_rx.recv() => match msg {
                    Msg::Notifications(on) => {
                        if let Some(node) = nodes.get_mut(&addr) {
                            node.1 = on;
                        }
                    }
                    other => {
                        let _ = self.dispatcher.send(other);
                    }
                },
            }
            let on = !nodes.is_empty() && nodes.values().all(|(_, on)| *on);
            if on != all_on {
                all_on = on;
                let _ = self.dispatcher.send(Msg::Notifications(on));
            }
        }
    }
}

/// How a subscription that was made came to an end.
enum Ended {
    Stopped,
    Lost,
    /// The last rule went away.
    RulesChanged,
    /// The primary moved (Sentinel).
    Moved,
}

impl Listener {
    async fn run(mut self) {
        let mut backoff = RESUBSCRIBE_MIN;
        // A loss is logged once when it begins and once when it ends,
        // however many attempts there are in between: `said`, when it was
        // logged as its own cause; `declared`, when it was Redis's outage,
        // whose lines are the outage's.
        let (mut said, mut declared) = (false, false);
        loop {
            self.changed.borrow_and_update();
            if self.rules.is_empty() {
                // No queue to wait on: Redis's notification settings are
                // left alone until a rule comes.
                tokio::select! {
                    _ = self.stop.changed() => return,
                    _ = self.changed.changed() => continue,
                    sub = self.subs.recv() => match sub {
                        Some(sub) => self.note(sub),
                        None => return,
                    },
                }
                continue;
            }
            let primary = self.endpoint.addr.generation();
            let subscribed = self.subscription(said, declared).await;
            if subscribed.is_ok() {
                (said, declared) = (false, false);
            }
            let mut lost = false;
            let e = match subscribed {
                Ok(Ended::Stopped) => return,
                // Pops parked before the last rule went, on what are plain
                // lists now, are retried by the safety recheck.
                Ok(Ended::RulesChanged | Ended::Moved) => continue,
                Ok(Ended::Lost) => {
                    // It worked until now: try again at once.
                    backoff = RESUBSCRIBE_MIN;
                    lost = true;
                    ControlError::new(
                        "PSUBSCRIBE",
                        ControlCause::Unreachable("subscription connection closed".into()),
                    )
                }
                Err(e) => e,
            };
            let _ = self.dispatcher.send(Msg::Notifications(false));
            // Redis going away as the proxy stops is no outage.
            // One cause, one line: Redis out of reach is the outage's
            // ("upstream down", once, whoever sees it first); a closed
            // subscription is only that until subscribing again fails.
            if *self.stop.borrow() || lost {
                tracing::debug!("keyspace notifications unavailable ({e}); subscribing again");
            } else if matches!(e.cause, ControlCause::Unreachable(_)) {
                if !declared {
                    crate::upstream::shared::unreachable(&e.to_string());
                    declared = true;
                }
            } else if !said {
                tracing::warn!(
                    "keyspace notifications unavailable ({e}); parked pops poll until they are back"
                );
                said = true;
            }
            if !e.retryable() {
                // The same request would be refused the same way (a renamed
                // CONFIG, say): ask again only now and then.
                backoff = RESUBSCRIBE_MAX;
            }
            let retry = tokio::time::sleep(backoff);
            tokio::pin!(retry);
            let moved = self.endpoint.addr.moved_from(primary);
            tokio::pin!(moved);
            loop {
                tokio::select! {
                    _ = self.stop.changed() => return,
                    _ = &mut retry => break,
                    // A failover ended: the new primary is there now.
                    () = &mut moved => {
                        backoff = RESUBSCRIBE_MIN;
                        break;
                    }
                    // Kept up to date meanwhile, so that what the
                    // dispatcher asks for does not pile up here.
                    sub = self.subs.recv() => match sub {
                        Some(sub) => self.note(sub),
                        None => return,
                    },
                }
            }
            backoff = (backoff * 2).min(RESUBSCRIBE_MAX);
        }
    }

    /// Records a key asked for (or given up) while there is no subscription;
    /// the next one has it.
    fn note(&mut self, sub: Sub) {
        match sub {
            Sub::Subscribe(k) => self.keys.insert(k),
            Sub::Unsubscribe(k) => self.keys.remove(&k),
        };
    }

    /// One subscription: enable the events, subscribe, then forward events
    /// and subscription changes until the connection ends or the proxy
    /// stops.
    /// `said`: the loss was logged, and so is the return; `declared`: it
    /// was the upstream's outage, which ends here.
    async fn subscription(&mut self, said: bool, declared: bool) -> Result<Ended, ControlError> {
        let moved = self
            .endpoint
            .addr
            .moved_from(self.endpoint.addr.generation());
        tokio::pin!(moved);
        let mut conn = control::subscriber(&self.endpoint).await?;
        enable_notifications(&self.endpoint).await?;
        let keys: Vec<Vec<u8>> = self.keys.iter().map(|k| channel(&self.prefix, k)).collect();
        if !keys.is_empty() {
            control::request("SUBSCRIBE", conn.subscribe(&keys)).await?;
        }
        let _ = self.dispatcher.send(Msg::Notifications(true));
        if declared {
            crate::upstream::shared::reachable();
        }
        if said {
            tracing::info!("keyspace notifications back; parked pops wait for events again");
        }
        // Anything pushed while there was no subscription.
        let _ = self.dispatcher.send(Msg::WakeAll);
        let (mut sink, mut events) = conn.split();
        loop {
            tokio::select! {
                _ = self.stop.changed() => return Ok(Ended::Stopped),
                // A failover: subscribed again on the new primary, with
                // its notifications enabled there.
                () = &mut moved => return Ok(Ended::Moved),
                _ = self.changed.changed() => {
                    if self.rules.is_empty() {
                        return Ok(Ended::RulesChanged);
                    }
                }
                sub = self.subs.recv() => match sub {
                    Some(Sub::Subscribe(k)) => {
                        // Kept first: if this fails, the next subscription
                        // has it.
                        self.keys.insert(k.clone());
                        let done = control::request("SUBSCRIBE", sink.subscribe(channel(&self.prefix, &k)));
                        tolerate_refusal(done.await)?;
                        // A push between the pop that found nothing and
                        // now brought no event: pop again.
                        let _ = self.dispatcher.send(Msg::Wake(k));
                    }
                    Some(Sub::Unsubscribe(k)) => {
                        self.keys.remove(&k);
                        let done = control::request("UNSUBSCRIBE", sink.unsubscribe(channel(&self.prefix, &k)));
                        tolerate_refusal(done.await)?;
                    }
                    None => return Ok(Ended::Stopped),
                },
                event = events.next() => match event {
                    Some(event) => {
                        if let Some(key) = event_key(&self.prefix, &event) {
                            let _ = self.dispatcher.send(Msg::Wake(key));
                        }
                    }
                    None => return Ok(Ended::Lost),
                },
            }
        }
    }
}

/// A key's (un)subscription that Redis refuses (BUSY while a script runs)
/// leaves the other keys' subscriptions as they are: the safety recheck
/// covers that key. A broken connection still ends it.
fn tolerate_refusal(done: Result<(), ControlError>) -> Result<(), ControlError> {
    match done {
        Err(e) if matches!(e.cause, ControlCause::Refused { .. }) => {
            tracing::debug!("keyspace subscription unchanged: {e}");
            Ok(())
        }
        other => other,
    }
}

/// What a pop meets while the sentinels fail the primary over: no
/// connection, a lost one, or the previous primary turned replica.
fn during_failover(e: &CallError) -> bool {
    match e {
        CallError::Upstream(_) => true,
        CallError::Redis(reply) => {
            reply.starts_with(b"-READONLY")
                || reply.starts_with(b"-LOADING")
                || reply.starts_with(b"-MASTERDOWN")
        }
        CallError::Unexpected => false,
    }
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

fn channel(prefix: &[u8], key: &[u8]) -> Vec<u8> {
    let mut ch = prefix.to_vec();
    ch.extend_from_slice(key);
    ch
}

/// The key a keyspace event is about.
fn event_key(prefix: &[u8], event: &redis::Msg) -> Option<Bytes> {
    let channel: Vec<u8> = event.get_channel().ok()?;
    let name = channel.strip_prefix(prefix)?;
    Some(Bytes::copy_from_slice(name))
}

/// Makes Redis publish keyspace events for list commands (`l`) and for keys
/// renamed or restored into place (`g`), keeping whatever was set already.
async fn enable_notifications(endpoint: &Endpoint) -> Result<(), ControlError> {
    const GET: &str = "CONFIG GET notify-keyspace-events";
    const SET: &str = "CONFIG SET notify-keyspace-events";
    let mut admin = control::admin(endpoint).await?;
    let mut get = redis::cmd("CONFIG");
    get.arg("GET").arg("notify-keyspace-events");
    let flags = control::query::<Vec<String>>(&mut admin, GET, &get)
        .await?
        .into_iter()
        .nth(1)
        .ok_or_else(|| ControlError::new(GET, ControlCause::Unexpected("no value".into())))?;
    let has = |c: char| flags.contains(c) || (flags.contains('A') && "lg".contains(c));
    if has('K') && has('l') && has('g') {
        return Ok(());
    }
    let mut wanted = flags.clone();
    for c in ['K', 'l', 'g'] {
        if !has(c) {
            wanted.push(c);
        }
    }
    let mut set = redis::cmd("CONFIG");
    set.arg("SET").arg("notify-keyspace-events").arg(&wanted);
    control::query::<()>(&mut admin, SET, &set).await?;
    tracing::info!(flags = %wanted, "enabled keyspace notifications for parked pops");
    Ok(())
}
