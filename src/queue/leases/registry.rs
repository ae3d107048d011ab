//! The queues that have leases, each with when the reaper should look at it
//! next: learned from this proxy's pops and from the reaper's scan of the
//! lease keys, forgotten when a reap finds nothing leased. Apart from them,
//! the queues the proxy knows of, whose sizes the queue gauges sum: learned
//! the same way, forgotten once a sample finds one empty (nothing ready,
//! leased, delayed or dead). Each keeps its last sample, and whether this
//! proxy changed it since, so that the reaper samples only the few that
//! may differ (see [`Registry::to_sample`]) and the gauges of the others
//! keep their last values.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::queue::pop::Popped;

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
    /// The database of its queues.
    pub db: i64,
    inner: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    due: foldhash::HashMap<Bytes, Instant>,
    bytes: usize,
    known: foldhash::HashMap<Bytes, Known>,
    known_bytes: usize,
}

/// Bytes a known queue costs besides its name and its sample's strings.
const KNOWN_OVERHEAD: usize = 160;

/// A queue the gauges sum.
struct Known {
    /// This proxy changed the queue since its last sample (or it has none
    /// yet): when it first did, and when it last did.
    changed: Option<(Instant, Instant)>,
    /// The last sample and when it was asked for.
    last: Option<(Instant, Sample)>,
    /// Bytes charged for it, name included.
    cost: usize,
}

/// One queue's sizes, as `info.lua` reported them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// The pattern of its rule, whose gauges it adds to.
    pub pattern: String,
    /// Its dead-letter list: a list several queues share is counted once.
    pub dead_list: Bytes,
    pub ready: i64,
    pub leased: i64,
    pub delayed: i64,
    pub dead: i64,
    /// Age of its oldest lease when sampled, -1 without leases.
    pub oldest_ms: i64,
}

impl Sample {
    fn is_empty(&self) -> bool {
        self.ready <= 0 && self.leased == 0 && self.dead == 0 && self.delayed == 0
    }
}

/// One rule's gauges: its known queues' last samples summed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sizes {
    pub ready: i64,
    pub leased: i64,
    pub delayed: i64,
    pub dead: i64,
    /// The oldest lease's age now: its age when sampled plus the time
    /// since (a lease only ages until something ends it, and what ends it
    /// through this proxy or its reaper makes the queue sampled again).
    pub oldest_ms: i64,
}

impl Registry {
    /// The registry of database `db`'s queues.
    pub fn in_db(db: i64) -> Registry {
        Registry {
            db,
            ..Registry::default()
        }
    }

    /// A queue this proxy changed (a pop, a NACK, a delayed push) may have
    /// leases or messages due from `at` on.
    pub fn note(&self, name: &Bytes, at: Instant) {
        self.due_from(name, at, true);
    }

    /// A queue found to have leases or delayed messages by the scan: like
    /// [`Registry::note`], but not a change of this proxy's.
    pub fn found(&self, name: &Bytes, at: Instant) {
        self.due_from(name, at, false);
    }

    fn due_from(&self, name: &Bytes, at: Instant, changed: bool) {
        let mut e = self.inner.lock().unwrap();
        let now = Instant::now();
        match e.known.get_mut(name) {
            Some(k) if changed => k.mark(now),
            Some(_) => {}
            None => {
                let cost = name.len() + KNOWN_OVERHEAD;
                if e.known_bytes + cost <= REGISTRY_BYTES {
                    e.known_bytes += cost;
                    let k = Known {
                        changed: Some((now, now)),
                        last: None,
                        cost,
                    };
                    e.known.insert(name.clone(), k);
                }
            }
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

    /// This proxy changed the queue (an ACK, a push, a reap that did
    /// something): if the gauges sum it, it is sampled again. Called once
    /// the change is made in Redis, so a sample asked for later sees it.
    pub fn changed(&self, name: &Bytes) {
        // Without metrics nothing is sampled: no lock on an ACK's path.
        if crate::telemetry::latency().is_none() {
            return;
        }
        if let Some(k) = self.inner.lock().unwrap().known.get_mut(name) {
            k.mark(Instant::now());
        }
    }

    /// Every known queue may belong to another rule now (a reload).
    pub fn all_changed(&self) {
        let now = Instant::now();
        for k in self.inner.lock().unwrap().known.values_mut() {
            k.mark(now);
        }
    }

    /// The known queues to sample now, at most `budget`: first those this
    /// proxy changed since their last sample, longest waiting first; then,
    /// at most `refresh` of them, those not sampled for `refresh_after`
    /// (changes made elsewhere: another proxy, a producer), oldest sample
    /// first. The others are not asked about: whatever the number of
    /// queues, an idle proxy samples at most `refresh` a round.
    pub fn to_sample(
        &self,
        now: Instant,
        budget: usize,
        refresh: usize,
        refresh_after: Duration,
    ) -> Vec<Bytes> {
        let e = self.inner.lock().unwrap();
        let mut changed: Vec<(Instant, &Bytes)> = Vec::new();
        let mut stale: Vec<(Instant, &Bytes)> = Vec::new();
        for (name, k) in &e.known {
            match (k.changed, &k.last) {
                (Some((first, _)), _) => changed.push((first, name)),
                (None, Some((at, _))) if now.saturating_duration_since(*at) >= refresh_after => {
                    stale.push((*at, name))
                }
                _ => {}
            }
        }
        let mut out = oldest(changed, budget);
        let left = budget.saturating_sub(out.len()).min(refresh);
        out.extend(oldest(stale, left));
        out
    }

    /// The sample of `name` asked for at `asked`. A queue found empty
    /// leaves the gauges until used again.
    pub fn sampled(&self, name: &Bytes, asked: Instant, sample: Sample) {
        let mut e = self.inner.lock().unwrap();
        let e = &mut *e;
        let Some(k) = e.known.get_mut(name) else {
            return;
        };
        // A change made after the sample was asked for may not be in it.
        let since = k.changed.filter(|&(_, last)| last > asked);
        if since.is_none() && sample.is_empty() {
            e.known_bytes -= k.cost;
            e.known.remove(name);
            return;
        }
        let cost = name.len() + KNOWN_OVERHEAD + sample.pattern.len() + sample.dead_list.len();
        e.known_bytes = e.known_bytes - k.cost + cost;
        k.cost = cost;
        k.changed = since;
        k.last = Some((asked, sample));
    }

    /// A queue no rule matches any more: out of the gauges.
    pub fn forget_known(&self, name: &Bytes) {
        let mut e = self.inner.lock().unwrap();
        if let Some(k) = e.known.remove(name) {
            e.known_bytes -= k.cost;
        }
    }

    /// Every rule's gauges from its known queues' last samples, by pattern.
    pub fn sizes(&self, now: Instant) -> HashMap<String, Sizes> {
        let e = self.inner.lock().unwrap();
        let mut sizes: HashMap<String, Sizes> = HashMap::new();
        let mut dead_lists: HashSet<(&str, &Bytes)> = HashSet::new();
        for (at, s) in e.known.values().filter_map(|k| k.last.as_ref()) {
            let sum = match sizes.get_mut(&s.pattern) {
                Some(sum) => sum,
                None => sizes.entry(s.pattern.clone()).or_default(),
            };
            sum.ready += s.ready.max(0);
            sum.leased += s.leased;
            sum.delayed += s.delayed;
            if dead_lists.insert((&s.pattern, &s.dead_list)) {
                sum.dead += s.dead;
            }
            if s.oldest_ms >= 0 {
                let since = now.saturating_duration_since(*at).as_millis() as i64;
                sum.oldest_ms = sum.oldest_ms.max(s.oldest_ms.saturating_add(since));
            }
        }
        sizes
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

impl Known {
    fn mark(&mut self, now: Instant) {
        self.changed = Some(match self.changed {
            Some((first, _)) => (first, now),
            None => (now, now),
        });
    }
}

/// The `n` names with the earliest instants, earliest first.
fn oldest(mut v: Vec<(Instant, &Bytes)>, n: usize) -> Vec<Bytes> {
    if n == 0 {
        return Vec::new();
    }
    if v.len() > n {
        v.select_nth_unstable_by_key(n - 1, |&(at, _)| at);
        v.truncate(n);
    }
    v.sort_unstable_by_key(|&(at, _)| at);
    v.into_iter().map(|(_, name)| name.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pattern: &str, dead_list: &str, ready: i64, oldest_ms: i64) -> Sample {
        Sample {
            pattern: pattern.into(),
            dead_list: Bytes::copy_from_slice(dead_list.as_bytes()),
            ready,
            leased: i64::from(oldest_ms >= 0),
            delayed: 0,
            dead: 3,
            oldest_ms,
        }
    }

    #[test]
    fn only_changed_queues_and_a_few_stale_ones_are_sampled_within_the_budget() {
        let r = Registry::default();
        let names: Vec<Bytes> = (0..10).map(|i| Bytes::from(format!("q{i}"))).collect();
        for n in &names {
            r.note(n, Instant::now());
            // Distinct instants: the order below is by them.
            std::thread::sleep(Duration::from_millis(1));
        }
        let t0 = Instant::now();
        // Changed ones first, those changed longest ago first, at most the budget.
        assert_eq!(r.to_sample(t0, 4, 2, Duration::from_secs(60)), names[..4]);
        for n in &names {
            r.sampled(n, Instant::now(), sample("q*", "dl", 1, -1));
        }
        // Nothing changed: nothing asked until a sample is old.
        assert!(r.to_sample(t0, 4, 2, Duration::from_secs(60)).is_empty());
        let later = Instant::now() + Duration::from_secs(61);
        assert_eq!(r.to_sample(later, 4, 2, Duration::from_secs(60)).len(), 2);
        // A change made after a sample was asked for: sampled again.
        let asked = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        r.note(&names[3], Instant::now());
        r.sampled(&names[3], asked, sample("q*", "dl", 1, -1));
        assert_eq!(
            r.to_sample(Instant::now(), 4, 0, Duration::from_secs(60)),
            [names[3].clone()]
        );
        // Found empty after its last change: no longer known.
        let empty = Sample {
            pattern: "q*".into(),
            ..Sample::default()
        };
        r.sampled(&names[3], Instant::now(), empty);
        assert_eq!(r.inner.lock().unwrap().known.len(), 9);
        assert!(r
            .to_sample(Instant::now(), 4, 0, Duration::from_secs(60))
            .is_empty());
        let sizes = r.sizes(Instant::now());
        assert_eq!(sizes["q*"].ready, 9);
        // One shared dead-letter list, counted once.
        assert_eq!(sizes["q*"].dead, 3);
    }

    #[test]
    fn the_oldest_lease_ages_between_samples() {
        let r = Registry::default();
        let (a, b) = (Bytes::from("a"), Bytes::from("b"));
        r.note(&a, Instant::now());
        r.note(&b, Instant::now());
        let asked = Instant::now();
        r.sampled(&a, asked, sample("p", "dl:a", 0, 1000));
        r.sampled(&b, asked, sample("p", "dl:b", 0, 400));
        let s = &r.sizes(asked + Duration::from_millis(2500))["p"];
        assert_eq!(s.oldest_ms, 3500);
        assert_eq!((s.leased, s.dead), (2, 6));
    }
}
