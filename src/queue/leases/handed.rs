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
    let Some(id) = id_of(ack_id, payload) else {
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

/// The ack id of `payload` as the library gives it (`ack_id` in
/// `lua/common.lua`) in the cases worth keeping: the whole payload, or a
/// top-level field of a JSON object whose value is a string without
/// escapes or a number (its text as written). `None` for the rest
/// (dotted paths, escapes, what is not an object): their ACKs go the
/// library's way.
fn id_of<'a>(ack_id: &AckId, payload: &'a [u8]) -> Option<&'a [u8]> {
    let id = match ack_id {
        AckId::Payload => payload,
        AckId::JsonField(f) if !f.contains('.') => json_field(payload, f.as_bytes())?,
        AckId::JsonField(_) => return None,
    };
    (id.len() <= MAX_ID).then_some(id)
}

fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && matches!(s[i], b' ' | b'\t' | b'\r' | b'\n') {
        i += 1;
    }
    i
}

/// The index after the JSON string that starts at `i` (a `"`).
fn string_end(s: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    while i < s.len() {
        match s[i] {
            b'"' => return Some(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    None
}

/// The index after the JSON value that starts at `i`.
fn value_end(s: &[u8], i: usize) -> Option<usize> {
    match s.get(i)? {
        b'"' => string_end(s, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < s.len() {
                match s[j] {
                    b'"' => {
                        j = string_end(s, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let n = s[i..]
                .iter()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'+' | b'.'))
                .count();
            (n > 0).then_some(i + n)
        }
    }
}

/// The value of `field` at the top level of the JSON object `s`: a
/// string's bytes (none with escapes), a number's text. The last
/// occurrence wins, as in the library's decoder.
fn json_field<'a>(s: &'a [u8], field: &[u8]) -> Option<&'a [u8]> {
    let mut i = skip_ws(s, 0);
    if s.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(s, i + 1);
    let mut found = None;
    while s.get(i) == Some(&b'"') {
        let kend = string_end(s, i)?;
        let key = &s[i + 1..kend - 1];
        i = skip_ws(s, kend);
        if s.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(s, i + 1);
        let vend = value_end(s, i)?;
        if key == field {
            let v = &s[i..vend];
            found = match v.first() {
                Some(b'"') if !v.contains(&b'\\') => Some(&v[1..v.len() - 1]),
                Some(c) if c.is_ascii_digit() || *c == b'-' => Some(v),
                _ => None,
            };
        }
        i = skip_ws(s, vend);
        match s.get(i) {
            Some(b',') => i = skip_ws(s, i + 1),
            Some(b'}') => return found,
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(s: &str) -> Option<String> {
        json_field(s.as_bytes(), b"id").map(|v| String::from_utf8_lossy(v).into_owned())
    }

    #[test]
    fn a_top_level_field_is_found_as_the_library_finds_it() {
        assert_eq!(field(r#"{"id":"a1","body":"x"}"#).as_deref(), Some("a1"));
        assert_eq!(
            field(r#" { "body" : {"id":"inner"} , "id" : 12 } "#).as_deref(),
            Some("12")
        );
        assert_eq!(field(r#"{"id":"a","id":"b"}"#).as_deref(), Some("b"));
        assert_eq!(
            field(r#"{"x":[1,{"id":"n"}],"id":-1.5e3}"#).as_deref(),
            Some("-1.5e3")
        );
        // Escapes, other types, no such field, not an object, cut short.
        assert_eq!(field(r#"{"id":"a\"b"}"#), None);
        assert_eq!(field(r#"{"id":true}"#), None);
        assert_eq!(field(r#"{"other":"a"}"#), None);
        assert_eq!(field(r#"["id","a"]"#), None);
        assert_eq!(field(r#"{"id":"a""#), None);
        assert_eq!(field("plain text"), None);
    }

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
