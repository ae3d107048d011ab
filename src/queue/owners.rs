//! Leases by client connection, for the rules that track them
//! (`ack = "next-pop"`, `requeue_on_disconnect`). Each client connection
//! has a name, unique across proxies and restarts, which the leases it takes
//! on such rules record (in the queue's `ids` index). A next-pop pop
//! acknowledges what its connection holds on the queue inside its own
//! script; when a connection closes, its leases on requeue_on_disconnect
//! queues end at once. For that the proxy remembers, per connection, the
//! queues it popped from under such rules, within a byte budget.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bytes::Bytes;

use super::call::{Call, Caller};
use super::library;
use super::pop::Pop;
use super::rules::Queue;
use super::value::Value;
use crate::config::AckPolicy;

/// A number for each client connection of this process.
pub fn next_conn() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Queues remembered per connection at most; a connection popping from
/// more (on requeue_on_disconnect rules) has its leases on the others
/// expire as usual when it closes.
const QUEUES_PER_CONN: usize = 16;
/// Bytes of queue names remembered for all connections together.
const NAMES_BYTES: usize = 8 << 20;
const ENTRY_OVERHEAD: usize = 64;

pub struct Owners {
    /// Random, so that connection names of two proxies (or of one proxy
    /// before and after a restart) never meet.
    instance: String,
    conns: Mutex<Conns>,
}

#[derive(Default)]
struct Conns {
    queues: HashMap<u64, Vec<Bytes>>,
    bytes: usize,
}

impl Default for Owners {
    fn default() -> Self {
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Owners {
            instance: format!("{random:016x}"),
            conns: Mutex::default(),
        }
    }
}

impl Owners {
    /// The name connection `conn` goes by in Redis (no `|` in it).
    pub fn owner(&self, conn: u64) -> Bytes {
        Bytes::from(format!("{}.{conn:x}", self.instance))
    }

    /// Connection `conn` pops from `queue`, whose rule requeues on
    /// disconnect.
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
    }

    /// Forgets connection `conn`; returns the queues it popped from.
    pub fn take(&self, conn: u64) -> Vec<Bytes> {
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
const MAX_CALLS: usize = 10_000;

/// Ends now the leases `owner` holds on `q`, in bounded calls. Returns how
/// many ended.
pub async fn requeue(caller: &Caller, q: &Queue, owner: &Bytes) -> i64 {
    let mut ended = 0;
    for _ in 0..MAX_CALLS {
        let call = Call::new(&library::DISOWN)
            .queue(q)
            .rule(q)
            .arg(owner.clone())
            .arg(DISOWN_PER_CALL.to_string());
        let Ok(v) = caller.run(&call).await else {
            // Redis is away: the leases expire as usual.
            return ended;
        };
        let items = v.array();
        ended += items.first().map(Value::int).unwrap_or(0);
        for pair in items.get(2..).unwrap_or_default().chunks(2) {
            let [token, dest] = pair else { break };
            super::commands::expire_move(caller, q, dest.bytes(), token.bytes()).await;
        }
        if items.get(1).map(Value::int) != Some(1) {
            break;
        }
    }
    ended
}

/// Acknowledges the leases `owner` holds on `q` (a next-pop rule), in
/// bounded calls.
pub async fn release(caller: &Caller, q: &Queue, owner: &Bytes) {
    for _ in 0..MAX_CALLS {
        let call = Call::new(&library::RELEASE)
            .queue(q)
            .rule(q)
            .arg(owner.clone())
            .arg(DISOWN_PER_CALL.to_string());
        match caller.run(&call).await {
            Ok(v) if v.array().get(1).map(Value::int) == Some(1) => {}
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
