//! The background reaper: returns expired leases to their queues and moves
//! delayed messages into them when due, even when nobody pops, in bounded
//! batches. Several proxies may reap the same queue at once; every script
//! re-checks what it changes.
//!
//! It reaps only the queues that have leases or delayed messages: a
//! [`Registry`] learns them from this proxy's pops and pushes and from a
//! slow `SCAN` of their keys in Redis (for work left by another proxy, or
//! before a restart), and forgets a queue as soon as a reap finds nothing
//! left in it. A queue is reaped again when its next lease or delayed
//! message is due (Redis tells how far off that is), so an idle proxy sends
//! nothing, however many queue keys were ever used. A batch that came back
//! full is followed by the next one at once, so a backlog (a million
//! delayed messages due together) drains as fast as the bounded calls go.
//!
//! Each database that has queue state (see `queue/dbs.rs`) is reaped, scanned
//! and sampled on its own connection; the gauges sum every database.
//!
//! It also samples the queue gauges (ready, leased, delayed, dead, oldest
//! lease age per rule), every [`SAMPLE_EVERY`] while metrics are exported,
//! never on a client's request: one bounded `info.lua` call per queue that
//! this proxy changed since its last sample, at most [`SAMPLES_PER_ROUND`]
//! a round, plus a slow refresh of the others ([`REFRESHES_PER_ROUND`] a
//! round, each queue at most every [`REFRESH_AFTER`]) for changes made
//! elsewhere. So the cost per round is bounded whatever the number of
//! queues, and an idle proxy asks almost nothing; a queue not sampled keeps
//! its last values in the sums. A queue this proxy has not popped from and
//! whose leases the scan has not found (ready messages nobody took yet,
//! say) is not in the sums until it is.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

use std::collections::HashMap;

use crate::queue::dbs::{Db, Dbs};
use crate::queue::leases::clock;
use crate::queue::leases::registry::{Sample, Sizes, MAX_WAIT};
use crate::queue::library;
use crate::queue::library::call::Call;
use crate::queue::library::keys;
use crate::queue::library::op::{int_at, moves, Moves, Op};
use crate::queue::library::value::Value;
use crate::queue::rules::{Queue, Rules};

/// How often Redis is scanned for queues with leases this proxy does not
/// know of.
const DISCOVER_EVERY: Duration = Duration::from_secs(10);
const SCAN_ROUNDS: usize = 20;
/// How often the queue gauges are sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(2);
/// Queues sampled at most per round: `info.lua` calls of some tens of µs
/// of Redis each, so about 1% of a Redis core at most, however many
/// queues change; past it the gauges lag (the queues changed longest ago
/// are sampled first).
pub const SAMPLES_PER_ROUND: usize = 250;
/// Of those, queues sampled for changes this proxy did not make.
pub const REFRESHES_PER_ROUND: usize = 2;
/// A queue this proxy did not change is sampled again after this long at
/// the earliest.
const REFRESH_AFTER: Duration = Duration::from_secs(60);

pub struct Reaper {
    pub rules: Arc<Rules>,
    pub dbs: Arc<Dbs>,
    pub interval: Duration,
    pub batch: usize,
}

impl Reaper {
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut next_discovery = Instant::now();
        let mut next_sample = Instant::now();
        let sampled = crate::telemetry::latency().is_some();
        let mut reloaded = self.rules.subscribe();
        // Each database's SCAN cursor.
        let mut cursors: HashMap<i64, Bytes> = HashMap::new();
        let mut backlog = false;
        loop {
            if backlog {
                // Other tasks (and a stop) get their turn between batches.
                tokio::task::yield_now().await;
                if *stop.borrow() {
                    return;
                }
            } else {
                tokio::select! {
                    _ = stop.changed() => return,
                    _ = tokio::time::sleep(self.interval) => {}
                }
            }
            // Without rules (in force, or removed by a reload) no key is a
            // queue: Redis is not scanned.
            let others = self.dbs.others();
            let dbs = || std::iter::once(self.dbs.zero()).chain(others.iter().map(|d| &**d));
            if self.rules.any_leased() && Instant::now() >= next_discovery {
                for db in dbs() {
                    let cursor = cursors.remove(&db.index);
                    let cursor = self
                        .discover(db, cursor.unwrap_or(Bytes::from_static(b"0")))
                        .await;
                    cursors.insert(db.index, cursor);
                }
                next_discovery = Instant::now() + DISCOVER_EVERY;
            }
            backlog = false;
            if clock::stale() && dbs().any(|db| !db.registry.is_empty()) {
                self.measure_clock().await;
            }
            for db in dbs() {
                for name in db.registry.due(Instant::now()) {
                    // Also under a rule a reload removed: its leases end too.
                    match self.rules.resolve_leased(&name) {
                        Some(q) => backlog |= self.reap(db, &q).await,
                        None => db.registry.forget(&name),
                    }
                }
            }
            if reloaded.has_changed().unwrap_or(false) {
                reloaded.mark_unchanged();
                // A queue's rule, and so the gauges it adds to, may differ.
                for db in dbs() {
                    db.registry.all_changed();
                }
            }
            if sampled && Instant::now() >= next_sample {
                let mut sizes: HashMap<String, Sizes> = HashMap::new();
                let mut answered = true;
                for db in dbs() {
                    answered &= self.sample(db).await;
                    for (pattern, s) in db.registry.sizes(Instant::now()) {
                        let sum = sizes.entry(pattern).or_default();
                        sum.ready += s.ready;
                        sum.leased += s.leased;
                        sum.delayed += s.delayed;
                        sum.dead += s.dead;
                        sum.oldest_ms = sum.oldest_ms.max(s.oldest_ms);
                    }
                }
                for (pattern, rule) in crate::telemetry::rules() {
                    let s = sizes.remove(&pattern).unwrap_or_default();
                    rule.ready.set(s.ready as f64);
                    rule.leased.set(s.leased as f64);
                    rule.delayed.set(s.delayed as f64);
                    rule.dead.set(s.dead as f64);
                    rule.oldest_lease_age.set(s.oldest_ms as f64 / 1000.0);
                }
                // Gauges carried over an outage must not pass for fresh.
                if answered && !crate::upstream::shared::in_outage() {
                    crate::telemetry::queues_sampled();
                }
                next_sample = Instant::now() + SAMPLE_EVERY;
            }
        }
    }

    /// Samples the queues of `db` that [`Registry::to_sample`] picks, one
    /// `info.lua` call each. If Redis cannot be asked, the rest wait for
    /// the next round: false.
    async fn sample(&self, db: &Db) -> bool {
        let picked = db.registry.to_sample(
            Instant::now(),
            SAMPLES_PER_ROUND,
            REFRESHES_PER_ROUND,
            REFRESH_AFTER,
        );
        for name in picked {
            let Some(q) = self.rules.resolve(&name) else {
                db.registry.forget_known(&name);
                continue;
            };
            let asked = Instant::now();
            let Ok(i) = db.own.op(crate::queue::commands::info_op(&q, [0, 0])).await else {
                return false;
            };
            let sample = Sample {
                pattern: q.rule.pattern.clone(),
                dead_list: Bytes::copy_from_slice(q.keys.dead()),
                ready: i.ready,
                leased: i.leased,
                dead: i.dead,
                oldest_ms: i.oldest_lease_ms,
                delayed: i.delayed,
            };
            db.registry.sampled(&name, asked, sample);
        }
        true
    }

    /// Sets the proxy's idea of Redis's clock (see `clock.rs`), while some
    /// queue has leases, so ACKs can be timed.
    async fn measure_clock(&self) {
        let sent = clock::local_ms();
        let own = &self.dbs.zero().own;
        let reply = own
            .shared
            .call(
                Bytes::from_static(b"*1\r\n$4\r\nTIME\r\n"),
                own.client.clone(),
            )
            .await;
        let received = clock::local_ms();
        let redis_ms = reply
            .ok()
            .and_then(|b| crate::queue::library::value::decode(&b))
            .and_then(|v| clock::time_reply_ms(&v));
        if let Some(ms) = redis_ms {
            clock::note(ms, sent, received);
        }
    }

    /// One bounded reap of a queue; returns whether the batch was full
    /// (more may be waiting).
    async fn reap(&self, db: &Db, q: &Queue) -> bool {
        // The proxy's scripts run in database 0 only.
        let totals = match db.index {
            0 => q.take_unwritten(clock::redis_now_ms()),
            _ => [0, 0],
        };
        let op = reap(q, self.batch, totals);
        let Ok(r) = db.own.op(op).await else {
            q.unwritten_again(totals);
            // Redis is down or refused: try again later.
            db.registry
                .reschedule(&q.name, Instant::now() + self.interval.max(MAX_WAIT / 4));
            return false;
        };
        let (mut requeued, mut dead, left, promoted) = (r.requeued, r.dead, r.left, r.promoted);
        for (token, dest) in &r.moves {
            let ended = crate::queue::commands::expire_move(&db.own, q, dest, token).await;
            requeued += ended.requeued;
            dead += ended.dead;
        }
        let batch = self.batch as i64;
        let full = requeued + dead >= batch || promoted >= batch || r.moves.len() >= self.batch;
        if left == 0 {
            db.registry.forget(&q.name);
        } else {
            // A full batch may leave more: look again at once.
            let wait = match r.next_ms {
                Some(ms) if !full => Duration::from_millis(ms as u64).min(MAX_WAIT),
                _ => Duration::ZERO,
            };
            db.registry.reschedule(&q.name, Instant::now() + wait);
        }
        if requeued > 0 || dead > 0 || promoted > 0 {
            db.registry.changed(&q.name);
        }
        if requeued > 0 || promoted > 0 {
            // Parked pops on this queue have something to take (the list
            // push also notifies them; this covers a lost notification).
            db.waiters.wake(q.name.clone());
        }
        full && left > 0
    }

    /// One bounded SCAN pass of `db` for lease and delayed sets of queues
    /// matching a rule.
    async fn discover(&self, db: &Db, mut cursor: Bytes) -> Bytes {
        for _ in 0..SCAN_ROUNDS {
            let req = crate::upstream::encode_command(&[
                b"SCAN",
                &cursor,
                b"MATCH",
                keys::reaped_key_scan_pattern().as_bytes(),
                b"COUNT",
                b"1000",
            ]);
            let Ok(reply) = db
                .own
                .shared
                .call(Bytes::from(req), db.own.client.clone())
                .await
            else {
                return cursor;
            };
            let Some(v) = crate::queue::library::value::decode(&reply) else {
                return Bytes::from_static(b"0");
            };
            let items = v.array();
            cursor = Bytes::copy_from_slice(items.first().map(Value::bytes).unwrap_or(b"0"));
            for key in items.get(1).map(Value::array).unwrap_or_default() {
                if let Some(name) = keys::queue_of_reaped_key(key.bytes()) {
                    if self.rules.is_leased_queue(name) {
                        db.registry
                            .found(&Bytes::copy_from_slice(name), Instant::now());
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

pub struct Reaped {
    pub requeued: i64,
    pub dead: i64,
    /// Leases and delayed messages left.
    pub left: i64,
    /// Ms until the next deadline or due time; `None`: there is none.
    pub next_ms: Option<i64>,
    pub promoted: i64,
    /// Expired move leases, for `commands::expire_move`.
    pub moves: Moves,
}

/// `reap`: expired leases back to the queue (or dead-lettered), due
/// delayed messages in, in a batch of at most `batch` each.
/// `totals`: deliveries and ACKs this proxy's scripts made that the stats
/// hash does not count yet (see `Queue::totals_to_write`).
fn reap(q: &Queue, batch: usize, totals: [i64; 2]) -> Op<Reaped> {
    let mut call = Call::new(&library::REAP)
        .queue_rule(q)
        .arg(batch.to_string());
    if totals.iter().any(|n| *n > 0) {
        call = call.arg(totals[0].to_string()).arg(totals[1].to_string());
    }
    Op::new(call, |v| {
        let next = int_at(v, 3);
        Ok(Reaped {
            requeued: int_at(v, 0),
            dead: int_at(v, 1),
            left: int_at(v, 2),
            next_ms: (next >= 0).then_some(next),
            promoted: int_at(v, 4),
            moves: moves(v.array().get(5..).unwrap_or_default()),
        })
    })
}
