//! Leases by client connection, for the rules that track them
//! (`ack = "next-pop"`, `requeue_on_disconnect`, `hold = "connection"`).
//! Each client connection has a name, unique across proxies and restarts,
//! which the leases it takes on such rules record (in a sorted set per
//! connection and queue, `…:o:<connection>`). A next-pop pop acknowledges
//! what its connection holds on the queue inside its own script; when a connection closes, its leases on
//! requeue_on_disconnect and held queues end at once; while it is open, its
//! leases on held queues are renewed (`holder::Holder`). For that the proxy
//! remembers, per connection, the queues it popped from under such rules,
//! within a byte budget; and (`held.rs`) the one lease a next-pop pop
//! left it holding.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::Notify;

use crate::config::AckPolicy;
use crate::queue::leases::held::HeldLeases;
use crate::queue::library;
use crate::queue::library::call::Call;
use crate::queue::library::call::Caller;
use crate::queue::library::op::{int_at, moves, Moves, Op};
use crate::queue::pop::Pop;
use crate::queue::rules::Queue;

/// A number for each client connection of this process.
pub fn next_conn() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Queues remembered per connection at most; a connection popping from
/// more (on requeue_on_disconnect or held rules) has its leases on the
/// others expire as usual when it closes, and not renewed while it is open.
const QUEUES_PER_CONN: usize = 16;
/// Bytes of queue names remembered for all connections together.
const NAMES_BYTES: usize = 8 << 20;
const ENTRY_OVERHEAD: usize = 64;

pub struct Owners {
    /// Random, so that connection names of two proxies (or of one proxy
    /// before and after a restart) never meet.
    instance: String,
    conns: Mutex<Conns>,
    /// The one lease a next-pop pop left each connection holding.
    pub held: Arc<HeldLeases>,
    /// Told when a connection pops from a queue it had not: the holder
    /// learns of a held queue before its first lease runs out. One for
    /// every database (see `Dbs::noted`), which the holder waits on.
    noted: Arc<Notify>,
}

#[derive(Default)]
struct Conns {
    queues: HashMap<u64, Vec<Bytes>>,
    bytes: usize,
}

impl Default for Owners {
    fn default() -> Self {
        Owners::telling(Arc::new(Notify::new()))
    }
}

impl Owners {
    /// Owners whose new queues are told to `noted`.
    pub fn telling(noted: Arc<Notify>) -> Self {
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Owners {
            instance: format!("{random:016x}"),
            conns: Mutex::default(),
            held: Arc::default(),
            noted,
        }
    }

    /// The name connection `conn` goes by in Redis (no `|` in it).
    pub fn owner(&self, conn: u64) -> Bytes {
        Bytes::from(format!("{}.{conn:x}", self.instance))
    }

    /// Connection `conn` pops from `queue`, whose rule requeues on
    /// disconnect (held rules do too).
    pub fn note(&self, conn: u64, queue: &Bytes) {
        let mut c = self.conns.lock().unwrap();
        let cost = queue.len() + ENTRY_OVERHEAD;
        let Conns { queues, bytes } = &mut *c;
        let known = queues.get(&conn);
        if known.is_some_and(|q| q.contains(queue) || q.len() >= QUEUES_PER_CONN)
            || *bytes + cost > NAMES_BYTES
        {
            return;
        }
        *bytes += cost;
        queues.entry(conn).or_default().push(queue.clone());
        drop(c);
        self.noted.notify_one();
    }

    /// The open connections that popped from each queue remembered.
    pub(super) fn by_queue(&self) -> HashMap<Bytes, Vec<u64>> {
        let c = self.conns.lock().unwrap();
        let mut out: HashMap<Bytes, Vec<u64>> = HashMap::new();
        for (conn, names) in &c.queues {
            for name in names {
                out.entry(name.clone()).or_default().push(*conn);
            }
        }
        out
    }

    /// Forgets connection `conn`; returns the queues it popped from.
    pub fn take(&self, conn: u64) -> Vec<Bytes> {
        self.held.forget(conn);
        let mut c = self.conns.lock().unwrap();
        let names = c.queues.remove(&conn).unwrap_or_default();
        c.bytes -= names
            .iter()
            .map(|n| n.len() + ENTRY_OVERHEAD)
            .sum::<usize>();
        names
    }
}

/// Leases ended per disown call.
const DISOWN_PER_CALL: usize = 100;
/// Calls per queue at most: a connection's leases are at most what it
/// popped, and a move lease whose destination cannot be cleared must not
/// keep this going.
pub(super) const MAX_CALLS: usize = 10_000;

/// Ends now the leases `owner` holds on `q`, in bounded calls. Returns how
/// many ended.
pub async fn requeue(caller: &Caller, q: &Queue, owner: &Bytes) -> i64 {
    let mut ended = 0;
    for _ in 0..MAX_CALLS {
        let op = disown(q, owner, DISOWN_PER_CALL, false);
        let Ok(d) = caller.op(op).await else {
            // Redis is away: the leases expire as usual.
            return ended;
        };
        ended += d.ended;
        for (token, dest) in &d.moves {
            crate::queue::commands::expire_move(caller, q, dest, token).await;
        }
        if !d.more {
            break;
        }
    }
    ended
}

/// Acknowledges the leases `owner` holds on `q` (a next-pop rule), in
/// bounded calls.
pub async fn release(caller: &Caller, q: &Queue, owner: &Bytes) {
    for _ in 0..MAX_CALLS {
        let op = disown(q, owner, DISOWN_PER_CALL, true);
        match caller.op(op).await {
            Ok(d) if d.more => {}
            // Done, or Redis is away: the leases then expire as usual.
            _ => return,
        }
    }
}

/// A parked pop whose client was gone (or whose timeout passed) when its
/// reply came. On next-pop rules the lease ends now: the connection's next
/// pop would otherwise acknowledge a message nobody received. (Its earlier
/// leases there were acknowledged when this pop began, so what it holds is
/// what this pop took.)
pub async fn undelivered(caller: &Caller, pop: &Pop) {
    if pop.owner.is_empty() {
        return;
    }
    for q in pop.queues().filter(|q| q.rule.ack == AckPolicy::NextPop) {
        requeue(caller, q, &pop.owner).await;
    }
}

pub struct Disowned {
    pub ended: i64,
    /// More may be left: call again.
    pub more: bool,
    /// Move leases only marked (disown only).
    pub moves: Moves,
}

/// `disown` (`release` false): ends now up to `limit` leases `owner` holds,
/// the messages back in the queue; `release` (true): acknowledges them
/// instead (next-pop rules).
fn disown(q: &Queue, owner: &Bytes, limit: usize, release: bool) -> Op<Disowned> {
    let function = if release {
        &library::RELEASE
    } else {
        &library::DISOWN
    };
    let call = Call::new(function).queue_rule(q).arg(owner.clone());
    Op::new(call.arg(limit.to_string()), |v| {
        Ok(Disowned {
            ended: int_at(v, 0),
            more: int_at(v, 1) == 1,
            moves: moves(v.array().get(2..).unwrap_or_default()),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_memory_is_bounded() {
        let (a, b) = (Owners::default(), Owners::default());
        assert_ne!(a.owner(1), b.owner(1));
        assert_ne!(a.owner(1), a.owner(2));
        assert!(!a.owner(7).contains(&b'|'));
        let big = Bytes::from(vec![b'q'; 64 * 1024]);
        for conn in 0..1000 {
            for i in 0..20u8 {
                let mut name = big.to_vec();
                name.push(i);
                a.note(conn, &Bytes::from(name));
            }
        }
        let c = a.conns.lock().unwrap();
        assert!(c.bytes <= NAMES_BYTES);
        assert!(c.queues.values().all(|q| q.len() <= QUEUES_PER_CONN));
        drop(c);
        let taken = a.take(0);
        assert_eq!(taken.len(), QUEUES_PER_CONN);
        assert!(a.take(0).is_empty());
    }
}
