//! The plain leases this proxy handed out on rules acknowledged by ACK
//! (not next-pop ones): when each was popped (Redis's clock, as the proxy
//! knows it), by queue and ack id. An ACK of one id it finds here goes as
//! `release.lua` (two commands in Redis, see `library/script.rs`; or
//! `release_owned.lua`, three, with the connection's name where the rule
//! tracks connections) and takes its latency from here; any other ACK, or
//! one the script finds no such lease for, goes to the library's `ack`,
//! which knows every case. So this is only a
//! hint: a wrong or missing entry costs an ACK the longer way, never a
//! wrong answer.
//!
//! Bounded: two generations of at most [`GENERATION`] entries each; when
//! the newer one fills it becomes the older and the older is dropped, so
//! entries of messages acknowledged elsewhere (or never) age out.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use crate::config::AckId;
use crate::queue::library::ack_id;

const GENERATION: usize = 1 << 16;
/// Longer ids (whole payloads, say) are not kept: hashing them on every
/// pop and ACK would cost the proxy more than the short way saves Redis.
const MAX_ID: usize = 256;

#[derive(Default)]
struct Generations {
    new: HashMap<u64, i64>,
    old: HashMap<u64, i64>,
}

static HANDED: Mutex<Option<Generations>> = Mutex::new(None);

fn key(queue: &[u8], id: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    queue.hash(&mut h);
    id.hash(&mut h);
    h.finish()
}

/// `payload` was popped from `queue` at `at_ms`.
pub fn handed(queue: &[u8], ack_id: &AckId, payload: &[u8], at_ms: i64) {
    let Some(id) = ack_id::of(ack_id, payload).filter(|id| id.len() <= MAX_ID) else {
        return;
    };
    let k = key(queue, id);
    let mut g = HANDED.lock().unwrap();
    let g = g.get_or_insert_with(Generations::default);
    if g.new.len() >= GENERATION {
        g.old = std::mem::take(&mut g.new);
    }
    g.new.insert(k, at_ms);
}

/// When the lease of `id` in `queue` was handed out, if this proxy did and
/// it was not acknowledged through it since; forgets it.
pub fn take(queue: &[u8], id: &[u8]) -> Option<i64> {
    if id.len() > MAX_ID {
        return None;
    }
    let k = key(queue, id);
    let mut g = HANDED.lock().unwrap();
    let g = g.as_mut()?;
    g.new.remove(&k).or_else(|| g.old.remove(&k))
}

/// Forgets every lease noted: the rules changed, and a lease handed out
/// under the old ones may not be plain under the new ones.
pub fn forget_all() {
    *HANDED.lock().unwrap() = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handed_lease_is_taken_once() {
        let rule = AckId::JsonField("id".into());
        handed(b"handed-test", &rule, br#"{"id":"7"}"#, 1234);
        assert_eq!(take(b"handed-test", b"7"), Some(1234));
        assert_eq!(take(b"handed-test", b"7"), None);
        assert_eq!(take(b"handed-test-other", b"7"), None);
        handed(b"handed-test", &AckId::Payload, b"whole", 99);
        assert_eq!(take(b"handed-test", b"whole"), Some(99));
        // Dotted paths go the library's way.
        handed(
            b"handed-test",
            &AckId::JsonField("a.b".into()),
            br#"{"a":{"b":"1"}}"#,
            5,
        );
        assert_eq!(take(b"handed-test", b"1"), None);
    }
}
