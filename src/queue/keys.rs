//! The key layout of a queue. Every auxiliary key of queue `Q` is named
//! `ackq:{TAG}:Q:<suffix>`, where TAG is chosen so that the key hashes to
//! the same cluster slot as `Q` itself:
//!
//! - `Q` has a hash tag (`{...}` with something inside): TAG is that tag;
//! - otherwise, if `Q` has no `}`: TAG is `Q` itself;
//! - otherwise: TAG is the smallest decimal number whose slot equals `Q`'s.
//!
//! TAG never contains `}`, so the name can be read back (the reaper does).
//!
//! | key | type | holds |
//! |---|---|---|
//! | `Q` | list | ready messages, raw payloads (the client's own list) |
//! | `…:leases` | zset | lease token → deadline (ms, Redis time), plain pops |
//! | `…:mleases` | zset | the same for move pops (RPOPLPUSH, LMOVE, …) |
//! | `…:msgs` | hash | token (`i`+sha1(ack id), longer for duplicates) → msgpack record |
//! | `…:ids` | zset | lexical index: duplicate tokens, `d`+sha1(dest,payload)+`|`+token |
//! | `…:retry` | hash | `i`+sha1(ack id) → copies back in the list, their deliveries, cancelled copies |
//! | dead letter | list | raw payloads past max deliveries |
//!
//! The default dead-letter list is `{Q}:dead` for a queue without a hash tag
//! (`{jobs}:dead`), `Q:dead` for one with a tag (`{user1}jobs:dead`), and
//! `{TAG}:Q:dead` in the rare third case. (Queues `jobs` and `{jobs}` would
//! share `{jobs}:dead`; configure one explicitly if both exist.) A
//! configured name may use `$queue` for the queue's name.

/// Keys a script takes per queue, in this order.
pub const QUEUE_GROUP: usize = 7;

pub struct QueueKeys {
    pub queue: Vec<u8>,
    pub leases: Vec<u8>,
    pub mleases: Vec<u8>,
    pub msgs: Vec<u8>,
    pub ids: Vec<u8>,
    pub retry: Vec<u8>,
    pub dead: Vec<u8>,
}

impl QueueKeys {
    pub fn new(queue: &[u8], dead_letter: Option<&str>) -> QueueKeys {
        let tag = slot_tag(queue);
        let mut base = b"ackq:{".to_vec();
        base.extend_from_slice(&tag);
        base.extend_from_slice(b"}:");
        base.extend_from_slice(queue);
        base.push(b':');
        let aux = |suffix: &str| [&base[..], suffix.as_bytes()].concat();
        let dead = match dead_letter {
            Some(template) => replace_queue(template.as_bytes(), queue),
            None if hash_tag(queue).is_some() => [queue, b":dead"].concat(),
            None if tag == queue => [b"{", queue, b"}:dead"].concat(),
            None => [b"{", &tag[..], b"}:", queue, b":dead"].concat(),
        };
        QueueKeys {
            queue: queue.to_vec(),
            leases: aux("leases"),
            mleases: aux("mleases"),
            msgs: aux("msgs"),
            ids: aux("ids"),
            retry: aux("retry"),
            dead,
        }
    }

    pub fn all(&self) -> [&[u8]; QUEUE_GROUP] {
        [
            &self.queue,
            &self.leases,
            &self.mleases,
            &self.msgs,
            &self.ids,
            &self.retry,
            &self.dead,
        ]
    }
}

fn replace_queue(template: &[u8], queue: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(template.len() + queue.len());
    let mut i = 0;
    while i < template.len() {
        if template[i..].starts_with(b"$queue") {
            out.extend_from_slice(queue);
            i += 6;
        } else {
            out.push(template[i]);
            i += 1;
        }
    }
    out
}

/// The part of the key Redis Cluster hashes, if a `{...}` tag decides it.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let close = key[open + 1..].iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &key[open + 1..open + 1 + close])
}

/// A tag without `}` that hashes to the slot of `queue`.
fn slot_tag(queue: &[u8]) -> Vec<u8> {
    if let Some(tag) = hash_tag(queue) {
        return tag.to_vec();
    }
    if !queue.contains(&b'}') {
        return queue.to_vec();
    }
    let slot = key_slot(queue);
    (0u32..)
        .map(|n| n.to_string().into_bytes())
        .find(|t| crc16(t) % 16384 == slot)
        .expect("every slot has a decimal tag")
}

/// Redis Cluster's hash slot of a key.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) % 16384
}

/// CRC16-CCITT (XMODEM), as Redis Cluster uses.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_redis() {
        // Values from the Redis Cluster specification and CLUSTER KEYSLOT.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
    }

    #[test]
    fn every_key_shares_the_queue_slot() {
        let names: &[&[u8]] = &[
            b"jobs",
            b"{user1}jobs",
            b"a{b",
            b"{}x",
            b"x}y",
            b"a{}b{c}",
            b"\x00\xff{\x01}",
            b"}}}",
        ];
        for name in names {
            let k = QueueKeys::new(name, None);
            for key in k.all() {
                assert_eq!(key_slot(key), key_slot(name), "{:?} vs {:?}", key, name);
            }
        }
    }

    #[test]
    fn names_are_readable_and_distinct() {
        let k = QueueKeys::new(b"jobs", None);
        assert_eq!(k.leases, b"ackq:{jobs}:jobs:leases");
        assert_eq!(k.dead, b"{jobs}:dead");
        let t = QueueKeys::new(b"{jobs}", None);
        assert_eq!(t.leases, b"ackq:{jobs}:{jobs}:leases");
        assert_ne!(k.leases, t.leases);
        assert_eq!(t.dead, b"{jobs}:dead");
        let c = QueueKeys::new(b"jobs", Some("dlq:$queue"));
        assert_eq!(c.dead, b"dlq:jobs");
    }
}
