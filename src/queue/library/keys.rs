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
//! | `…:msgs` | hash | token: the id key (`j`+ack id for an id of at most 40 bytes without `:`, else `i`+sha1(ack id)), longer for duplicates → lease record (see `lua/common.lua`) |
//! | `…:ids` | zset | lexical index: duplicate tokens, `d`+sha1(dest,payload)+`|`+token (move leases of older versions), `c`+id key while its retry entry holds skip marks (versions before the `o:` keys also kept `o`+connection+`|`+token here) |
//! | `…:o:<connection>` | zset | on rules that track connections: that connection's lease tokens, and `~`+id key for each lease of a next-pop rule that ran out while it held it; one key per connection, so that replacing its one entry does not walk every connection's |
//! | `…:retry` | hash | id key → copies back in the list, their deliveries, copies and cancelled copies per payload; `#cancelled` → their total |
//! | `…:delayed` | zset | sequence number + payload → when it is due (ms, Redis time) |
//! | `…:stats` | hash | the queue's totals (see `tally.rs`); expires [`STATS_TTL_MS`] after its last change |
//! | dead letter | list | raw payloads past max deliveries |
//! | `…:history` | hash | `h`+sha1(payload) → the history of that dead letter (copies, counts, times, reason), at most [`DEAD_HISTORY`] |
//! | `…:poison` | zset | id key → when the message was flagged as poison (an index, pruned as its messages go); expires [`STATS_TTL_MS`] after the last flag |
//!
//! The default dead-letter list is `{Q}:dead` for a queue without a hash tag
//! (`{jobs}:dead`), `Q:dead` for one with a tag (`{user1}jobs:dead`), and
//! `{TAG}:Q:dead` in the rare third case. (Queues `jobs` and `{jobs}` would
//! share `{jobs}:dead`; configure one explicitly if both exist.) A
//! configured name may use `$queue` for the queue's name.

/// What one key of a queue's group is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    /// The client's own list.
    Queue,
    /// `ackq:{TAG}:Q:<suffix>`.
    Aux(&'static str),
    /// The dead-letter list (configurable name).
    Dead,
}

/// The calling convention of every queue script, defined once: the keys of
/// a queue, in the order a script receives them as a group of consecutive
/// KEYS, each with the name the Lua side gives it (`group(i).<name>`, see
/// the prelude in `library/mod.rs`). Adding a key is one line here.
///
/// Every key costs every call: Redis's CPU per script call grows with the
/// number and length of its keys, more than with anything the scripts do
/// on the common paths, so indexes share a key where their members cannot
/// meet (see `ids`).
pub const GROUP: [(&str, Role); 11] = [
    ("q", Role::Queue),
    ("leases", Role::Aux("leases")),
    ("mleases", Role::Aux("mleases")),
    ("msgs", Role::Aux("msgs")),
    ("ids", Role::Aux("ids")),
    ("retry", Role::Aux("retry")),
    ("dead", Role::Dead),
    ("delayed", Role::Aux("delayed")),
    ("stats", Role::Aux("stats")),
    ("history", Role::Aux("history")),
    ("poison", Role::Aux("poison")),
];

/// Names in a queue's layout.
pub const QUEUE_GROUP: usize = GROUP.len();

/// What a function call takes per queue as KEYS: the queue, the prefix of
/// its aux keys (`ackq:{TAG}:Q:`, in the queue's slot like every aux key)
/// and the dead-letter list. The library makes each aux key's name from
/// the prefix when it first needs it (`group()`), and so do the scripts of
/// `lua/scripts/`: Redis turns every argument of a call into an object and
/// a Lua string, and ten keys per queue cost a pop or an ACK more than
/// some of its commands (two keys named in Lua rather than passed save a
/// pop about 2% of Redis's instructions).
pub const CALL_KEYS: usize = 3;

/// Aux key suffixes whose keys hold work for the reaper (leases that will
/// expire, delayed messages that will be due): it finds queues by them.
pub const REAPED_SUFFIXES: [&str; 3] = ["leases", "mleases", "delayed"];

/// A queue's totals outlive its messages (they are what `QUEUE INFO`
/// reports), but not for ever: queue names come and go, and a hash per name
/// ever used would grow Redis without bound. They expire this long after
/// their last change: 30 days.
pub const STATS_TTL_MS: u64 = 30 * 24 * 3600 * 1000;

/// Histories of dead letters kept per queue at most; past it one is dropped
/// at random (its payload stays in the dead-letter list, shown without
/// one).
pub const DEAD_HISTORY: u64 = 10_000;

use bytes::Bytes;

use crate::keyslot::key_slot;

pub struct QueueKeys {
    /// In [`GROUP`] order.
    names: [Bytes; QUEUE_GROUP],
    /// What a call takes (see [`CALL_KEYS`]).
    call: [Bytes; CALL_KEYS],
}

impl QueueKeys {
    pub fn new(queue: &[u8], dead_letter: Option<&str>) -> QueueKeys {
        let tag = slot_tag(queue);
        let base = aux_base(&tag, queue);
        let dead = match dead_letter {
            Some(template) => replace_queue(template.as_bytes(), queue),
            None if hash_tag(queue).is_some() => [queue, b":dead"].concat(),
            None if tag == queue => [b"{", queue, b"}:dead"].concat(),
            None => [b"{", &tag[..], b"}:", queue, b":dead"].concat(),
        };
        let names = GROUP.map(|(_, role)| match role {
            Role::Queue => Bytes::copy_from_slice(queue),
            Role::Aux(suffix) => Bytes::from([&base[..], suffix.as_bytes()].concat()),
            Role::Dead => Bytes::from(dead.clone()),
        });
        QueueKeys {
            call: [
                Bytes::copy_from_slice(queue),
                Bytes::from(base),
                Bytes::from(dead),
            ],
            names,
        }
    }

    pub fn all(&self) -> [&[u8]; QUEUE_GROUP] {
        std::array::from_fn(|i| &self.names[i][..])
    }

    /// The keys in [`GROUP`] order, cheap to clone.
    pub fn group(&self) -> &[Bytes; QUEUE_GROUP] {
        &self.names
    }

    /// What a function call takes for this queue (see [`CALL_KEYS`]).
    pub fn call_keys(&self) -> &[Bytes; CALL_KEYS] {
        &self.call
    }

    /// The key playing `name` in the group.
    pub fn get(&self, name: &str) -> &[u8] {
        let i = GROUP
            .iter()
            .position(|(n, _)| *n == name)
            .expect("a key of the group");
        &self.names[i]
    }

    pub fn queue(&self) -> &[u8] {
        self.get("q")
    }

    /// The prefix of the aux keys, `ackq:{TAG}:Q:`: the scripts of
    /// `lua/scripts/` take it, as the library's functions do, in place of
    /// the keys it names.
    pub fn prefix(&self) -> &[u8] {
        &self.call[1]
    }

    pub fn dead(&self) -> &[u8] {
        self.get("dead")
    }
}

/// `ackq:{TAG}:Q:`, the prefix of every aux key of queue Q.
fn aux_base(tag: &[u8], queue: &[u8]) -> Vec<u8> {
    [b"ackq:{", tag, b"}:", queue, b":"].concat()
}

/// A glob that matches the keys of [`REAPED_SUFFIXES`] of every queue (for
/// `SCAN`; it matches a few other aux keys too, which
/// [`queue_of_reaped_key`] sets aside).
pub fn reaped_key_scan_pattern() -> &'static str {
    "ackq:*e[sd]"
}

/// The queue an aux key belongs to, for the keys of [`REAPED_SUFFIXES`]:
/// `ackq:{TAG}:Q:leases`, …. TAG never contains `}`, so the first `}:` ends
/// it.
pub fn queue_of_reaped_key(key: &[u8]) -> Option<&[u8]> {
    let rest = key.strip_prefix(b"ackq:{")?;
    let close = rest.windows(2).position(|w| w == b"}:")?;
    let rest = &rest[close + 2..];
    REAPED_SUFFIXES.iter().find_map(|s| {
        rest.strip_suffix(s.as_bytes())
            .and_then(|r| r.strip_suffix(b":"))
    })
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
        .find(|t| key_slot(t) == slot)
        .expect("every slot has a decimal tag")
}

/// Ids at most this long without ':' are their own lease token
/// (`SHORT_ID` in `lua/lease_core.lua`).
const SHORT_ID: usize = 40;

/// The lease token of an ack id, as `id_key` in `lua/lease_core.lua` makes
/// it: 'j' and the id when it is short and has no ':', else 'i' and the
/// SHA1 of the id in hex.
pub fn id_key(id: &[u8]) -> Vec<u8> {
    if id.len() <= SHORT_ID && !id.contains(&b':') {
        return [&b"j"[..], id].concat();
    }
    let mut out = b"i".to_vec();
    out.extend_from_slice(sha1_smol::Sha1::from(id).digest().to_string().as_bytes());
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_id_key_is_the_librarys() {
        assert_eq!(id_key(b"abc"), b"jabc");
        let long = [b'x'; 41];
        let key = id_key(&long);
        assert_eq!(key.len(), 41);
        assert_eq!(key[0], b'i');
        assert_eq!(
            &id_key(b"a:b")[..],
            &[
                b"i".as_slice(),
                sha1_smol::Sha1::from("a:b").digest().to_string().as_bytes()
            ]
            .concat()[..]
        );
    }

    use super::*;

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
            for key in k.all().iter().chain(
                k.call_keys()
                    .iter()
                    .map(|b| &b[..])
                    .collect::<Vec<_>>()
                    .iter(),
            ) {
                assert_eq!(key_slot(key), key_slot(name), "{:?} vs {:?}", key, name);
            }
        }
    }

    #[test]
    fn names_are_readable_and_distinct() {
        let k = QueueKeys::new(b"jobs", None);
        assert_eq!(k.get("leases"), b"ackq:{jobs}:jobs:leases");
        assert_eq!(k.dead(), b"{jobs}:dead");
        let t = QueueKeys::new(b"{jobs}", None);
        assert_eq!(t.get("leases"), b"ackq:{jobs}:{jobs}:leases");
        assert_ne!(k.get("leases"), t.get("leases"));
        assert_eq!(t.dead(), b"{jobs}:dead");
        let c = QueueKeys::new(b"jobs", Some("dlq:$queue"));
        assert_eq!(c.dead(), b"dlq:jobs");
    }

    #[test]
    fn reaped_keys_name_their_queue() {
        for name in [&b"jobs"[..], b"{u1}q", b"x}y", b"a:leases"] {
            let k = QueueKeys::new(name, None);
            for s in REAPED_SUFFIXES {
                assert_eq!(queue_of_reaped_key(k.get(s)), Some(name));
                assert!(crate::glob::glob_match(
                    reaped_key_scan_pattern().as_bytes(),
                    k.get(s)
                ));
            }
        }
        assert_eq!(queue_of_reaped_key(b"other"), None);
        assert_eq!(queue_of_reaped_key(b"ackq:{jobs}:jobs:msgs"), None);
    }
}
