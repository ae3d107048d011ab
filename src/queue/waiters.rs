//! Blocking pops on queue keys wait here, in the proxy: a Lua script cannot
//! block, and polling Redis for every parked client would load it for
//! nothing. Keyspace notifications say when a watched list changes (also for
//! pushes made straight to Redis); one dispatcher then retries the pops of
//! the clients parked on that key, first come first served. Where
//! notifications cannot be enabled, the dispatcher polls with backoff.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};

use super::call::Caller;
use super::pop::{Pop, Source};
use super::registry::Registry;
use super::rules::Rules;
use super::value;
use crate::output::ClientState;
use crate::resp::ReplyScanner;
use crate::upstream::shared::SharedUpstream;
use crate::upstream::{encode_command, Endpoint};

/// Keyspace channels of database 0, where the queues live.
const CHANNEL_PREFIX: &[u8] = b"__keyspace@0__:";
/// Even with notifications, parked pops are retried this often, which
/// covers events lost while the notification connection was down.
const SAFETY_RECHECK: Duration = Duration::from_secs(1);
const POLL_MIN: Duration = Duration::from_millis(10);
const POLL_MAX: Duration = Duration::from_millis(500);

enum Msg {
    Park(Pop, oneshot::Sender<Bytes>),
    Wake(Bytes),
    WakeAll,
    /// Answered once every pop started before it has finished.
    Sync(oneshot::Sender<()>),
    /// Notifications are (true) or are not (false) available.
    Notifications(bool),
}

#[derive(Clone)]
pub struct Waiters {
    tx: mpsc::UnboundedSender<Msg>,
}

impl Waiters {
    pub fn start(
        rules: Arc<Rules>,
        endpoint: Arc<Endpoint>,
        shared: SharedUpstream,
        registry: Arc<Registry>,
        stop: watch::Receiver<bool>,
    ) -> Waiters {
        let (tx, rx) = mpsc::unbounded_channel();
        let (sub_tx, sub_rx) = mpsc::unbounded_channel();
        let patterns: Vec<String> = rules.patterns().map(str::to_string).collect();
        tokio::spawn(listen(endpoint, patterns, tx.clone(), sub_rx, stop));
        let dispatcher = Dispatcher {
            caller: Caller {
                shared,
                client: ClientState::new(0, usize::MAX),
            },
            registry,
            next_id: 0,
            parked: HashMap::new(),
            by_key: HashMap::new(),
            plain_subscribed: HashSet::new(),
            subs: sub_tx,
            notifications: false,
            poll: POLL_MIN,
        };
        tokio::spawn(dispatcher.run(rx));
        Waiters { tx }
    }

    /// Parks a blocking pop; the receiver gets its reply once it pops.
    pub fn park(&self, pop: Pop) -> oneshot::Receiver<Bytes> {
        let (tx, rx) = oneshot::channel();
        let _ = self.tx.send(Msg::Park(pop, tx));
        rx
    }

    /// Something may have been pushed to `key`.
    pub fn wake(&self, key: Bytes) {
        let _ = self.tx.send(Msg::Wake(key));
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

struct Parked {
    pop: Pop,
    reply: oneshot::Sender<Bytes>,
}

enum Sub {
    Subscribe(Bytes),
    Unsubscribe(Bytes),
}

struct Dispatcher {
    caller: Caller,
    registry: Arc<Registry>,
    next_id: u64,
    parked: HashMap<u64, Parked>,
    by_key: HashMap<Bytes, VecDeque<u64>>,
    plain_subscribed: HashSet<Bytes>,
    subs: mpsc::UnboundedSender<Sub>,
    notifications: bool,
    poll: Duration,
}

impl Dispatcher {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        loop {
            let recheck = if self.parked.is_empty() {
                Duration::from_secs(3600)
            } else if self.notifications {
                SAFETY_RECHECK
            } else {
                self.poll
            };
            let msg = tokio::select! {
                m = rx.recv() => match m {
                    Some(m) => m,
                    None => return,
                },
                _ = tokio::time::sleep(recheck) => Msg::WakeAll,
            };
            match msg {
                Msg::Park(pop, reply) => {
                    let keys: Vec<Bytes> = pop.sources.iter().map(|s| s.key().clone()).collect();
                    self.park(pop, reply);
                    self.poll = POLL_MIN;
                    let served = self.wake(&keys).await;
                    metrics::gauge!("ackproxy_parked_clients").set(self.parked.len() as f64);
                    let _ = served;
                }
                Msg::Wake(key) => {
                    if self.by_key.contains_key(&key) {
                        self.wake(&[key]).await;
                    }
                }
                Msg::Sync(done) => {
                    let _ = done.send(());
                }
                Msg::WakeAll => {
                    let keys: Vec<Bytes> = self.by_key.keys().cloned().collect();
                    let served = self.wake(&keys).await;
                    if !self.notifications {
                        self.poll = if served > 0 {
                            POLL_MIN
                        } else {
                            (self.poll * 2).min(POLL_MAX)
                        };
                    }
                }
                Msg::Notifications(on) => {
                    if on != self.notifications {
                        metrics::gauge!("ackproxy_wakeup_polling").set(if on { 0.0 } else { 1.0 });
                    }
                    self.notifications = on;
                }
            }
        }
    }

    fn park(&mut self, pop: Pop, reply: oneshot::Sender<Bytes>) {
        let id = self.next_id;
        self.next_id += 1;
        for s in &pop.sources {
            let key = s.key().clone();
            if let Source::Plain(_) = s {
                if self.plain_subscribed.insert(key.clone()) {
                    let _ = self.subs.send(Sub::Subscribe(key.clone()));
                }
            }
            self.by_key.entry(key).or_default().push_back(id);
        }
        self.parked.insert(id, Parked { pop, reply });
    }

    fn remove(&mut self, id: u64) -> Option<Parked> {
        let p = self.parked.remove(&id)?;
        metrics::gauge!("ackproxy_parked_clients").set(self.parked.len() as f64);
        for s in &p.pop.sources {
            let key = s.key();
            if let Some(q) = self.by_key.get_mut(key) {
                q.retain(|&w| w != id);
                if q.is_empty() {
                    self.by_key.remove(key);
                    if self.plain_subscribed.remove(key) {
                        let _ = self.subs.send(Sub::Unsubscribe(key.clone()));
                    }
                }
            }
        }
        Some(p)
    }

    /// Serves the clients parked on `keys`, oldest first, until a pop finds
    /// nothing. Returns how many were served.
    async fn wake(&mut self, keys: &[Bytes]) -> usize {
        let mut served = 0;
        for key in keys {
            while let Some(&id) = self.by_key.get(key).and_then(|q| q.front()) {
                let Some(p) = self.parked.get(&id) else {
                    self.by_key.get_mut(key).map(VecDeque::pop_front);
                    continue;
                };
                if p.reply.is_closed() {
                    // Timed out or disconnected.
                    self.remove(id);
                    continue;
                }
                let reply = match p.pop.run(&self.caller).await {
                    Ok(done) => {
                        super::after_pop(&self.registry, &done);
                        match done.reply {
                            Some(bytes) => bytes,
                            None => break,
                        }
                    }
                    // WRONGTYPE and the like end the wait, as in Redis; so
                    // does a Redis that cannot be reached, as for a plain
                    // blocking pop on a connection that is gone.
                    Err(e) => e.to_reply(),
                };
                if let Some(p) = self.remove(id) {
                    served += 1;
                    // If the client just went away (or its timeout passed)
                    // its message stays leased and comes back when the
                    // lease expires; on next-pop rules, now.
                    if p.reply.send(reply).is_err() {
                        super::owners::undelivered(&self.caller, &p.pop).await;
                    }
                }
            }
        }
        served
    }
}

/// Keeps a subscription to keyspace notifications for the queue patterns
/// (and for plain keys that parked pops also wait on), turning each event
/// into a wake-up for the dispatcher.
async fn listen(
    endpoint: Arc<Endpoint>,
    patterns: Vec<String>,
    dispatcher: mpsc::UnboundedSender<Msg>,
    mut subs: mpsc::UnboundedReceiver<Sub>,
    mut stop: watch::Receiver<bool>,
) {
    let mut plain: HashSet<Bytes> = HashSet::new();
    let mut backoff = Duration::from_millis(50);
    loop {
        let result = async {
            let mut conn = endpoint.connect().await.map_err(|e| e.to_string())?;
            enable_notifications(&mut conn).await?;
            let mut req = Vec::new();
            for p in &patterns {
                let mut ch = CHANNEL_PREFIX.to_vec();
                ch.extend_from_slice(p.as_bytes());
                req.extend_from_slice(&encode_command(&[b"PSUBSCRIBE", &ch]));
            }
            for k in &plain {
                req.extend_from_slice(&encode_command(&[b"SUBSCRIBE", &channel(k)]));
            }
            conn.write_all(&req).await.map_err(|e| e.to_string())?;
            let _ = dispatcher.send(Msg::Notifications(true));
            // Anything pushed while the subscription was down.
            let _ = dispatcher.send(Msg::WakeAll);
            let mut buf = BytesMut::with_capacity(8192);
            let mut scanner = ReplyScanner::new();
            loop {
                tokio::select! {
                    _ = stop.changed() => return Ok(()),
                    sub = subs.recv() => {
                        let (verb, key): (&[u8], Bytes) = match sub {
                            Some(Sub::Subscribe(k)) => { plain.insert(k.clone()); (b"SUBSCRIBE", k) }
                            Some(Sub::Unsubscribe(k)) => { plain.remove(&k); (b"UNSUBSCRIBE", k) }
                            None => return Ok(()),
                        };
                        conn.write_all(&encode_command(&[verb, &channel(&key)])).await.map_err(|e| e.to_string())?;
                    }
                    r = conn.read_buf(&mut buf) => {
                        match r {
                            Ok(0) => return Err("connection closed".to_string()),
                            Err(e) => return Err(e.to_string()),
                            Ok(_) => {}
                        }
                        while let Ok(Some(len)) = scanner.scan(&buf) {
                            let frame = buf.split_to(len).freeze();
                            if let Some(key) = event_key(&frame) {
                                let _ = dispatcher.send(Msg::Wake(key));
                            }
                        }
                    }
                }
            }
        }
        .await;
        match result {
            Ok(()) => return,
            Err(e) => {
                let _ = dispatcher.send(Msg::Notifications(false));
                tracing::warn!("keyspace notifications unavailable ({e}); parked pops poll until they are back");
                tokio::select! {
                    _ = stop.changed() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

fn channel(key: &[u8]) -> Vec<u8> {
    let mut ch = CHANNEL_PREFIX.to_vec();
    ch.extend_from_slice(key);
    ch
}

/// The key of a `message`/`pmessage` keyspace event.
fn event_key(frame: &Bytes) -> Option<Bytes> {
    let v = value::decode(frame)?;
    let items = v.array();
    let channel = match items.first()?.bytes() {
        b"message" => items.get(1)?,
        b"pmessage" => items.get(2)?,
        _ => return None,
    };
    let name = channel.bytes().strip_prefix(CHANNEL_PREFIX)?;
    Some(Bytes::copy_from_slice(name))
}

/// Makes Redis publish keyspace events for list commands (`l`) and for keys
/// renamed or restored into place (`g`), keeping whatever was set already.
async fn enable_notifications(conn: &mut tokio::net::TcpStream) -> Result<(), String> {
    let current = request(conn, &[b"CONFIG", b"GET", b"notify-keyspace-events"]).await?;
    let flags = current
        .array()
        .get(1)
        .map(|v| String::from_utf8_lossy(v.bytes()).into_owned())
        .ok_or("CONFIG GET notify-keyspace-events failed")?;
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
    match request(
        conn,
        &[
            b"CONFIG",
            b"SET",
            b"notify-keyspace-events",
            wanted.as_bytes(),
        ],
    )
    .await?
    {
        value::Value::Str(s) if &s[..] == b"OK" => {
            tracing::info!(flags = %wanted, "enabled keyspace notifications for parked pops");
            Ok(())
        }
        other => Err(format!(
            "CONFIG SET notify-keyspace-events refused: {other:?}"
        )),
    }
}

async fn request(conn: &mut tokio::net::TcpStream, args: &[&[u8]]) -> Result<value::Value, String> {
    conn.write_all(&encode_command(args))
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = BytesMut::with_capacity(1024);
    let mut scanner = ReplyScanner::new();
    loop {
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read_buf(&mut buf))
            .await
            .map_err(|_| "timed out".to_string())?
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed".into());
        }
        if let Ok(Some(len)) = scanner.scan(&buf) {
            let frame = buf.split_to(len).freeze();
            if frame.first() == Some(&b'-') {
                return Err(String::from_utf8_lossy(&frame).trim_end().to_string());
            }
            return value::decode(&frame).ok_or_else(|| "bad reply".to_string());
        }
    }
}
