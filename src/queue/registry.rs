//! The queues that have leases, each with when the reaper should look at it
//! next: learned from this proxy's pops and from the reaper's scan of the
//! lease keys, forgotten when a reap finds nothing leased. Apart from them,
//! the queues the proxy knows of, whose sizes the reaper samples for the
//! queue gauges: learned the same way, forgotten once a sample finds one
//! empty (nothing ready, leased or dead).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::pop::Popped;

/// A queue with leases is looked at again at least this often, whatever its
/// next deadline: a lease shortened by `QUEUE EXTEND` on another proxy is
/// then reaped at most this late.
pub const MAX_WAIT: Duration = Duration::from_secs(2);
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
    known: HashSet<Bytes>,
    known_bytes: usize,
}

impl Registry {
    /// A queue may have leases due from `at` on.
    pub fn note(&self, name: &Bytes, at: Instant) {
        let mut e = self.inner.lock().unwrap();
        let cost = name.len() + ENTRY_OVERHEAD;
        if e.known_bytes + cost <= REGISTRY_BYTES && e.known.insert(name.clone()) {
            e.known_bytes += cost;
        }
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

    pub fn forget(&self, name: &Bytes) {
        let mut e = self.inner.lock().unwrap();
        if e.due.remove(name).is_some() {
            e.bytes -= name.len() + ENTRY_OVERHEAD;
        }
    }

    pub fn reschedule(&self, name: &Bytes, at: Instant) {
        if let Some(due) = self.inner.lock().unwrap().due.get_mut(name) {
            *due = at;
        }
    }

    /// The queues known to exist, for the gauges' sample.
    pub fn known(&self) -> Vec<Bytes> {
        self.inner.lock().unwrap().known.iter().cloned().collect()
    }

    /// A queue found empty by a sample: out of the gauges until used again.
    pub fn forget_known(&self, name: &Bytes) {
        let mut e = self.inner.lock().unwrap();
        if e.known.remove(name) {
            e.known_bytes -= name.len() + ENTRY_OVERHEAD;
        }
    }

    /// Queues due now.
    pub fn due(&self, now: Instant) -> Vec<Bytes> {
        let e = self.inner.lock().unwrap();
        e.due
            .iter()
            .filter(|(_, &at)| at <= now)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Up to `limit` of the queues known to have leases, in no particular
    /// order (the operations view lists them).
    pub fn names(&self, limit: usize) -> Vec<Bytes> {
        let e = self.inner.lock().unwrap();
        e.due.keys().take(limit).cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.inner.lock().unwrap().due.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
