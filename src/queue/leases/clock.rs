//! Redis's clock as the proxy knows it, for the ack latency: an ACK tells
//! when each lease it released started (Redis time), and the proxy takes
//! the age from its own clock set to Redis's. Reading Redis's clock inside
//! every ACK cost Redis more than the rest of an ACK's common path; an
//! offset measured once a second is exact enough for a latency histogram.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Redis's clock minus the proxy's, ms; 0 until measured.
static OFFSET_MS: AtomicI64 = AtomicI64::new(0);
/// The proxy's clock when the offset was last measured; 0: never.
static MEASURED_AT_MS: AtomicI64 = AtomicI64::new(0);

/// How old a measurement may get.
const FRESH_MS: i64 = 1000;

/// The proxy's clock, ms since the epoch.
pub fn local_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Redis's clock now, as far as the proxy knows it.
pub fn redis_now_ms() -> i64 {
    local_ms() + OFFSET_MS.load(Ordering::Relaxed)
}

/// Whether the offset should be measured again.
pub fn stale() -> bool {
    local_ms() - MEASURED_AT_MS.load(Ordering::Relaxed) >= FRESH_MS
}

/// Redis said its clock read `redis_ms` at some point between `sent` and
/// `received` (the proxy's clock).
pub fn note(redis_ms: i64, sent: i64, received: i64) {
    OFFSET_MS.store(redis_ms - (sent + received) / 2, Ordering::Relaxed);
    MEASURED_AT_MS.store(received, Ordering::Relaxed);
}

/// Redis's `TIME` reply (seconds, microseconds) in ms.
pub fn time_reply_ms(v: &crate::queue::library::value::Value) -> Option<i64> {
    let a = v.array();
    let secs: i64 = std::str::from_utf8(a.first()?.bytes()).ok()?.parse().ok()?;
    let micros: i64 = std::str::from_utf8(a.get(1)?.bytes()).ok()?.parse().ok()?;
    Some(secs * 1000 + micros / 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_is_taken_at_the_middle_of_the_round_trip() {
        note(10_500, 1_000, 2_000);
        assert_eq!(OFFSET_MS.load(Ordering::Relaxed), 9_000);
        assert!(redis_now_ms() - local_ms() == 9_000);
    }
}
