//! The background reaper: returns expired leases to their queues even when
//! nobody pops, in bounded batches. Several proxies may reap the same queue
//! at once; every script re-checks what it changes.
//!
//! It reaps only the queues that have leases: a [`Registry`] learns them from
//! this proxy's pops and from a slow `SCAN` of the lease keys in Redis (for
//! leases taken by another proxy, or before a restart), and forgets a queue
//! as soon as a reap finds nothing leased in it. A queue is reaped again when
//! its next lease is due (Redis tells how far off that is), so an idle proxy
//! sends nothing, however many queue keys were ever used.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

use super::call::{Call, Caller};
use super::keys;
use super::pop::Popped;
use super::rules::{Queue, Rules};
use super::scripts;
use super::value::Value;
use super::waiters::Waiters;

/// How often Redis is scanned for queues with leases this proxy does not
/// know of.
const DISCOVER_EVERY: Duration = Duration::from_secs(10);
const SCAN_ROUNDS: usize = 20;
/// A queue with leases is looked at again at least this often, whatever its
/// next deadline: a lease shortened by `QUEUE EXTEND` on another proxy is
/// then reaped at most this late.
const MAX_WAIT: Duration = Duration::from_secs(2);
/// Bytes of queue names the registry holds at most (names plus overhead);
/// past it, queues are found again by the next scan.
const REGISTRY_BYTES: usize = 16 << 20;
const ENTRY_OVERHEAD: usize = 64;

/// The queues that have leases, each with when to reap it next.
#[derive(Default)]
pub struct Registry {
    inner: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    due: HashMap<Bytes, Instant>,
    bytes: usize,
}

impl Registry {
    /// A queue may have leases due from `at` on.
    pub fn note(&self, name: &Bytes, at: Instant) {
        let mut e = self.inner.lock().unwrap();
        if let Some(due) = e.due.get_mut(name) {
            *due = (*due).min(at);
            return;
        }
        let cost = name.len() + ENTRY_OVERHEAD;
        if e.bytes + cost > REGISTRY_BYTES {
            return;
        }
        e.bytes += cost;
        e.due.insert(name.clone(), at);
    }

    /// After a pop: the queue it leased from has a lease due in `lease_ms`.
    pub fn record(&self, popped: &Popped) {
        if let (Some(q), true) = (&popped.queue, popped.count > 0) {
            let wait = Duration::from_millis(q.rule.lease_ms).min(MAX_WAIT);
            self.note(&q.name, Instant::now() + wait);
        }
    }

    /// A queue whose leases may be due now (EXTEND, NACK).
    pub fn touch(&self, name: &Bytes) {
        self.note(name, Instant::now());
    }

    fn forget(&self, name: &Bytes) {
        let mut e = self.inner.lock().unwrap();
        if e.due.remove(name).is_some() {
            e.bytes -= name.len() + ENTRY_OVERHEAD;
        }
    }

    fn reschedule(&self, name: &Bytes, at: Instant) {
        if let Some(due) = self.inner.lock().unwrap().due.get_mut(name) {
            *due = at;
        }
    }

    /// Queues due now.
    fn due(&self, now: Instant) -> Vec<Bytes> {
        let e = self.inner.lock().unwrap();
        e.due
            .iter()
            .filter(|(_, &at)| at <= now)
            .map(|(n, _)| n.clone())
            .collect()
    }

    pub fn len(&self) -> usize {
        self.inner.lock().unwrap().due.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub struct Reaper {
    pub rules: Arc<Rules>,
    pub registry: Arc<Registry>,
    pub caller: Caller,
    pub waiters: Waiters,
    pub interval: Duration,
    pub batch: usize,
}

impl Reaper {
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut next_discovery = Instant::now();
        let mut cursor = Bytes::from_static(b"0");
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
            if Instant::now() >= next_discovery {
                cursor = self.discover(cursor).await;
                next_discovery = Instant::now() + DISCOVER_EVERY;
            }
            for name in self.registry.due(Instant::now()) {
                match self.rules.resolve(&name) {
                    Some(q) => self.reap(&q).await,
                    None => self.registry.forget(&name),
                }
            }
        }
    }

    async fn reap(&self, q: &Queue) {
        let call = Call::new(&scripts::REAP)
            .queue(q)
            .rule(q)
            .arg(self.batch.to_string());
        let Ok(v) = self.caller.run(&call).await else {
            // Redis is down or refused: try again later.
            self.registry
                .reschedule(&q.name, Instant::now() + self.interval.max(MAX_WAIT / 4));
            return;
        };
        let items = v.array();
        let int = |i: usize| items.get(i).map(Value::int).unwrap_or(0);
        let (mut requeued, mut dead, left, next_ms) = (int(0), int(1), int(2), int(3));
        let moves = items.get(4..).unwrap_or_default();
        for pair in moves.chunks(2) {
            let [token, dest] = pair else { break };
            let (a, b) = expire_move(&self.caller, q, dest.bytes(), token.bytes()).await;
            requeued += a;
            dead += b;
        }
        if left == 0 {
            self.registry.forget(&q.name);
        } else {
            // A full batch may leave more expired ones: look again at once.
            let full = requeued + dead >= self.batch as i64 || moves.len() / 2 >= self.batch;
            let wait = if full || next_ms < 0 {
                Duration::ZERO
            } else {
                Duration::from_millis(next_ms as u64).min(MAX_WAIT)
            };
            self.registry.reschedule(&q.name, Instant::now() + wait);
        }
        let queue = q.rule.pattern.clone();
        if requeued > 0 {
            metrics::counter!("ackproxy_redeliveries_total", "rule" => queue.clone())
                .increment(requeued as u64);
            self.waiters.wake(q.name.clone());
        }
        if dead > 0 {
            metrics::counter!("ackproxy_dead_letters_total", "rule" => queue)
                .increment(dead as u64);
        }
    }

    /// One bounded SCAN pass for lease sets of queues matching a rule.
    async fn discover(&self, mut cursor: Bytes) -> Bytes {
        for _ in 0..SCAN_ROUNDS {
            let req = crate::upstream::encode_command(&[
                b"SCAN",
                &cursor,
                b"MATCH",
                keys::lease_key_scan_pattern().as_bytes(),
                b"COUNT",
                b"1000",
            ]);
            let Ok(reply) = self
                .caller
                .shared
                .call(Bytes::from(req), self.caller.client.clone())
                .await
            else {
                return cursor;
            };
            let Some(v) = super::value::decode(&reply) else {
                return Bytes::from_static(b"0");
            };
            let items = v.array();
            cursor = Bytes::copy_from_slice(items.first().map(Value::bytes).unwrap_or(b"0"));
            for key in items.get(1).map(Value::array).unwrap_or_default() {
                if let Some(name) = keys::queue_of_lease_key(key.bytes()) {
                    if self.rules.is_queue(name) {
                        self.registry
                            .note(&Bytes::copy_from_slice(name), Instant::now());
                    }
                }
            }
            if &cursor[..] == b"0" {
                break;
            }
        }
        cursor
    }
}

/// Ends one expired (or nacked) move lease, removing its stale copy from
/// `dest` first. Returns (requeued, dead-lettered).
pub async fn expire_move(caller: &Caller, q: &Queue, dest: &[u8], token: &[u8]) -> (i64, i64) {
    let call = Call::new(&scripts::EXPIRE_MOVE)
        .queue(q)
        .key(Bytes::copy_from_slice(dest))
        .rule(q)
        .arg(Bytes::copy_from_slice(token));
    match caller.run(&call).await {
        Ok(v) => (
            v.array().first().map(Value::int).unwrap_or(0),
            v.array().get(1).map(Value::int).unwrap_or(0),
        ),
        Err(_) => (0, 0),
    }
}
