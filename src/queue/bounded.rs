//! A map whose memory is bounded in bytes rather than in entries: the proxy
//! caches per-key state for keys chosen by clients, and a count limit alone
//! lets a few thousand huge key names pin hundreds of MB.

use std::collections::VecDeque;

use bytes::Bytes;

/// Bookkeeping charged per entry on top of the key and the value's own size:
/// the hash-table slot, the eviction-queue slot and the `Bytes` headers.
pub const ENTRY_OVERHEAD: usize = 96;

struct Entry<V> {
    value: V,
    /// Bytes charged for this entry, key and overhead included.
    cost: usize,
    /// Which insertion of the key this is, so a stale place in the eviction
    /// queue (left by a removal or a replacement) is recognised and skipped.
    generation: u64,
}

/// A map from byte keys that evicts its oldest insertions (FIFO) when a new
/// one would take it past its byte budget.
pub struct ByteBoundedMap<V> {
    map: foldhash::HashMap<Bytes, Entry<V>>,
    /// Keys in insertion order; may hold stale places for removed or replaced
    /// keys, which are skipped and compacted away.
    order: VecDeque<(Bytes, u64)>,
    budget: usize,
    used: usize,
    next_generation: u64,
}

impl<V> ByteBoundedMap<V> {
    pub fn new(budget: usize) -> Self {
        ByteBoundedMap {
            map: foldhash::HashMap::default(),
            order: VecDeque::new(),
            budget,
            used: 0,
            next_generation: 0,
        }
    }

    pub fn get(&self, key: &[u8]) -> Option<&V> {
        self.map.get(key).map(|e| &e.value)
    }

    pub fn contains_key(&self, key: &[u8]) -> bool {
        self.map.contains_key(key)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Bytes charged for the entries held now; never more than the budget.
    #[cfg(test)]
    fn bytes_used(&self) -> usize {
        self.used
    }

    /// What an entry is charged: its key, the fixed overhead and what the
    /// caller says the value holds.
    pub fn cost(key: &[u8], value_size: usize) -> usize {
        key.len()
            .saturating_add(ENTRY_OVERHEAD)
            .saturating_add(value_size)
    }

    /// Inserts `value`, charged `value_size` bytes besides its key, evicting
    /// the oldest entries as needed. An entry that alone exceeds the budget is
    /// not kept (and any previous value for the key is dropped); returns
    /// whether the value was kept.
    pub fn insert(&mut self, key: Bytes, value: V, value_size: usize) -> bool {
        self.remove(&key);
        let cost = Self::cost(&key, value_size);
        if cost > self.budget {
            return false;
        }
        while self.used + cost > self.budget {
            self.evict_oldest();
        }
        let generation = self.next_generation;
        self.next_generation += 1;
        self.order.push_back((key.clone(), generation));
        self.map.insert(
            key,
            Entry {
                value,
                cost,
                generation,
            },
        );
        self.used += cost;
        true
    }

    pub fn remove(&mut self, key: &[u8]) -> Option<V> {
        let entry = self.map.remove(key)?;
        self.used -= entry.cost;
        // Stale places are skipped at eviction; compacting once they are the
        // majority keeps the queue proportional to the live entries.
        if self.order.len() > 2 * self.map.len() + 16 {
            let map = &self.map;
            self.order
                .retain(|(k, g)| map.get(k).is_some_and(|e| e.generation == *g));
        }
        Some(entry.value)
    }

    pub fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
        self.used = 0;
    }

    fn evict_oldest(&mut self) {
        while let Some((key, generation)) = self.order.pop_front() {
            if self
                .map
                .get(&key)
                .is_some_and(|e| e.generation == generation)
            {
                let entry = self.map.remove(&key).expect("entry just seen");
                self.used -= entry.cost;
                return;
            }
        }
        // Only reachable if the accounting were wrong; starting over keeps
        // the bound whatever happened.
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn holds_and_removes_entries() {
        let mut m = ByteBoundedMap::new(10_000);
        assert!(m.is_empty());
        assert!(m.insert(key("a"), 1, 10));
        assert!(m.insert(key("bb"), 2, 20));
        assert_eq!(m.get(b"a"), Some(&1));
        assert!(m.contains_key(b"bb"));
        assert!(!m.contains_key(b"c"));
        assert_eq!(m.len(), 2);
        assert_eq!(m.bytes_used(), 1 + 10 + 2 + 20 + 2 * ENTRY_OVERHEAD);
        assert_eq!(m.remove(b"a"), Some(1));
        assert_eq!(m.remove(b"a"), None);
        assert_eq!(m.len(), 1);
        assert_eq!(m.bytes_used(), 2 + 20 + ENTRY_OVERHEAD);
    }

    #[test]
    fn replacing_a_key_recharges_it() {
        let mut m = ByteBoundedMap::new(10_000);
        m.insert(key("a"), 1, 100);
        m.insert(key("a"), 2, 10);
        assert_eq!(m.get(b"a"), Some(&2));
        assert_eq!(m.len(), 1);
        assert_eq!(m.bytes_used(), 1 + 10 + ENTRY_OVERHEAD);
    }

    #[test]
    fn evicts_oldest_first_and_stays_within_budget() {
        let per = ByteBoundedMap::<u32>::cost(b"k0", 0);
        let mut m = ByteBoundedMap::new(3 * per);
        for i in 0..3 {
            assert!(m.insert(key(&format!("k{i}")), i, 0));
        }
        assert_eq!(m.bytes_used(), 3 * per);
        assert!(m.insert(key("k3"), 3, 0));
        assert!(!m.contains_key(b"k0"));
        assert!(m.contains_key(b"k1") && m.contains_key(b"k2") && m.contains_key(b"k3"));
        // An entry as big as two others pushes out the two oldest.
        assert!(m.insert(key("k4"), 4, per));
        assert!(!m.contains_key(b"k1") && !m.contains_key(b"k2"));
        assert!(m.contains_key(b"k3") && m.contains_key(b"k4"));
        assert!(m.bytes_used() <= m.budget);
    }

    #[test]
    fn a_reinserted_key_is_young_again() {
        let per = ByteBoundedMap::<u32>::cost(b"k0", 0);
        let mut m = ByteBoundedMap::new(2 * per);
        m.insert(key("k0"), 0, 0);
        m.insert(key("k1"), 1, 0);
        m.insert(key("k0"), 10, 0);
        m.insert(key("k2"), 2, 0);
        assert!(!m.contains_key(b"k1"));
        assert_eq!(m.get(b"k0"), Some(&10));
        assert!(m.contains_key(b"k2"));
    }

    #[test]
    fn an_entry_larger_than_the_budget_is_not_kept() {
        let mut m = ByteBoundedMap::new(1_000);
        assert!(m.insert(key("small"), 1, 0));
        assert!(!m.insert(Bytes::from(vec![b'x'; 2_000]), 2, 0));
        assert_eq!(m.len(), 1);
        assert!(!m.insert(key("small"), 3, usize::MAX));
        assert!(m.is_empty());
        assert_eq!(m.bytes_used(), 0);
    }

    #[test]
    fn churn_keeps_the_order_queue_small() {
        let mut m = ByteBoundedMap::new(1 << 20);
        for i in 0..10_000 {
            m.insert(key("same"), i, 0);
            m.insert(key(&format!("gone{i}")), i, 0);
            m.remove(format!("gone{i}").as_bytes());
        }
        assert_eq!(m.len(), 1);
        assert!(m.order.len() <= 2 * m.len() + 17, "{}", m.order.len());
        assert_eq!(m.get(b"same"), Some(&9_999));
    }

    #[test]
    fn many_huge_keys_stay_within_budget() {
        let budget = 1 << 20;
        let mut m = ByteBoundedMap::new(budget);
        for i in 0..500u32 {
            let mut k = vec![b'q'; 64 * 1024];
            k.extend_from_slice(&i.to_be_bytes());
            m.insert(Bytes::from(k), i, 1024);
            assert!(m.bytes_used() <= budget);
        }
        assert!(m.len() < 20);
        assert!(m.len() > 10);
    }
}
