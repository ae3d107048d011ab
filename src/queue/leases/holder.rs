//! Renewal of the leases that open connections hold on `hold =
//! "connection"` queues (see `owners` for how the proxy knows them).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::queue::dbs::Dbs;
use crate::queue::leases::owners::MAX_CALLS;
use crate::queue::library;
use crate::queue::library::call::Call;
use crate::queue::library::call::Caller;
use crate::queue::library::op::{int_at, Op};
use crate::queue::library::value::Value;
use crate::queue::rules::{Queue, Rules};

/// Leases renewed per hold call at most: a read and a write each.
const HOLD_PER_CALL: usize = 500;
/// Connections per hold call at most: a range read each.
const HOLD_OWNERS_PER_CALL: usize = 100;

/// Renews the leases that `owners`, connections still open, hold on `q` (a
/// held rule), in bounded calls (see `lua/hold.lua`). Returns how many.
pub async fn hold(caller: &Caller, q: &Queue, owners: &[Bytes]) -> i64 {
    let mut renewed = 0;
    let mut rest = owners;
    let mut after = Bytes::new();
    for _ in 0..MAX_CALLS {
        if rest.is_empty() {
            break;
        }
        let chunk = &rest[..rest.len().min(HOLD_OWNERS_PER_CALL)];
        let op = hold_op(q, HOLD_PER_CALL, after.clone(), chunk);
        let Ok(h) = caller.op(op).await else {
            // Redis is away: the leases run out as any other.
            return renewed;
        };
        renewed += h.renewed;
        match h.next {
            // The budget ran out at the next-th connection of the chunk.
            next @ 1.. if (next as usize) <= chunk.len() => {
                rest = &rest[next as usize - 1..];
                after = h.after;
            }
            _ => {
                rest = &rest[chunk.len()..];
                after = Bytes::new();
            }
        }
    }
    renewed
}

/// A held queue is looked at again this long after its last renewal at
/// the most, whatever its lease.
const HOLD_IDLE: Duration = Duration::from_secs(1);

/// Keeps the leases of open connections on held queues (`hold =
/// "connection"`) alive: every `lease_ms / 3` one bounded renewal per queue
/// and database for all the connections of this proxy that popped there,
/// on the proxy's own connection in that database, so a lease has two
/// thirds of `lease_ms` to spare when a renewal is late. A connection that
/// closes is forgotten first (its leases then end at once, see
/// `Queues::closed`); a proxy that stops renewing (stopped, killed) leaves
/// the leases to run out `lease_ms` later, as any other; a lease is never
/// renewed past `max_hold_ms` from its delivery.
pub struct Holder {
    pub rules: Arc<Rules>,
    pub dbs: Arc<Dbs>,
}

impl Holder {
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        // When each held queue was last renewed, by database and name.
        let mut last: HashMap<(i64, Bytes), Instant> = HashMap::new();
        let mut wait = HOLD_IDLE;
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(wait) => {}
                _ = self.dbs.noted().notified() => {}
            }
            let mut next = Instant::now() + HOLD_IDLE;
            // Queues no connection holds any more are dropped with this.
            let mut kept = HashMap::new();
            let others = self.dbs.others();
            for db in std::iter::once(self.dbs.zero()).chain(others.iter().map(|d| &**d)) {
                for (name, conns) in db.owners.by_queue() {
                    // Also under a rule a reload removed: its leases stay held.
                    let Some(q) = self.rules.resolve_leased(&name).filter(|q| q.rule.holds())
                    else {
                        continue;
                    };
                    let every = Duration::from_millis(q.rule.lease_ms / 3);
                    let key = (db.index, name);
                    let started = Instant::now();
                    let at = match last.get(&key) {
                        Some(at) if *at + every > started => *at,
                        _ => {
                            let owners: Vec<Bytes> =
                                conns.iter().map(|c| db.owners.owner(*c)).collect();
                            hold(&db.own, &q, &owners).await;
                            started
                        }
                    };
                    next = next.min(at + every);
                    kept.insert(key, at);
                }
            }
            last = kept;
            wait = next.saturating_duration_since(Instant::now());
        }
    }
}

pub struct Held {
    pub renewed: i64,
    /// 0: done; else the place (1-based) in `owners` of the connection the
    /// budget ran out at, and the lease to go on after.
    pub next: i64,
    pub after: Bytes,
}

/// `hold`: renews up to `limit` leases of `owners` (connections still
/// open), going on after the lease `after` of the first.
fn hold_op(q: &Queue, limit: usize, after: Bytes, owners: &[Bytes]) -> Op<Held> {
    let mut call = Call::new(&library::HOLD).queue_rule(q);
    call = call.arg(limit.to_string()).arg(after);
    call.argv.extend(owners.iter().cloned());
    Op::new(call, |v| {
        let after = v.array().get(2).map(Value::bytes).unwrap_or_default();
        Ok(Held {
            renewed: int_at(v, 0),
            next: int_at(v, 1),
            after: Bytes::copy_from_slice(after),
        })
    })
}
