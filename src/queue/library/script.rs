//! The queue scripts sent with `EVALSHA` rather than as functions of the
//! library (`lua/scripts/`): `take.lua`, `take_owned.lua` and
//! `take_move.lua`, a pop's common case, `release.lua`, `release_owned.lua`
//! and `lrem_ack.lua`, an acknowledgement's.
//!
//! Redis keeps every function library in one Lua heap and steps that
//! heap's collector every 50 script calls; on a heap the size of the
//! library each step walks far more than it frees, and an `FCALL` carries
//! that share (about a tenth of a pop + ACK pair's Redis instructions,
//! `bench/scripts/redis_instructions.py`). A script of the `EVAL` cache
//! runs in a heap of its own, kept small. These are worth it: they need
//! few of the library's helpers (lease_core.lua's, made only when an id
//! needs them) and nothing kept between calls, and each take script and
//! `release.lua` leave what they do not do (due leases, marks, late ACKs,
//! a connection's several leases) untouched for the library's function,
//! which the proxy calls next; `lrem_ack.lua` does all the library's
//! `lrem` does. They write the leases the library writes, and answer as
//! its functions do where the proxy reads the answer as theirs. None
//! writes the queue's totals: the proxy counts what they did and passes
//! the count on with a later call (see `Queue::totals_to_write`).
//!
//! A script Redis does not have (a restart, `SCRIPT FLUSH`) answers
//! `NOSCRIPT`; the call goes again as `EVAL` with the text, which caches it
//! once more.

use std::sync::OnceLock;

use bytes::Bytes;

use crate::queue::leases::clock;
use crate::queue::library::keys::STATS_TTL_MS;
use crate::queue::rules::Queue;
use crate::upstream::encode_command;

pub struct Script {
    text: &'static str,
    sha: String,
}

impl Script {
    fn new(text: &'static str) -> Script {
        Script {
            text,
            sha: sha1_smol::Sha1::from(text).digest().to_string(),
        }
    }

    /// `EVALSHA` of the script on `keys` and `args`.
    pub fn evalsha(&self, keys: &[&[u8]], args: &[&[u8]]) -> Bytes {
        self.request(b"EVALSHA", self.sha.as_bytes(), keys, args)
    }

    fn request(&self, cmd: &[u8], script: &[u8], keys: &[&[u8]], args: &[&[u8]]) -> Bytes {
        let mut numkeys = itoa::Buffer::new();
        let mut all: Vec<&[u8]> = Vec::with_capacity(3 + keys.len() + args.len());
        all.extend([cmd, script, numkeys.format(keys.len()).as_bytes()]);
        all.extend_from_slice(keys);
        all.extend_from_slice(args);
        Bytes::from(encode_command(&all))
    }
}

/// `lua/scripts/release.lua`: an ACK of one lease this proxy handed out.
pub fn release() -> &'static Script {
    static RELEASE: OnceLock<Script> = OnceLock::new();
    RELEASE.get_or_init(|| Script::new(include_str!("../../../lua/scripts/release.lua")))
}

/// `lua/scripts/take.lua`: a pop of one value when nothing is due.
pub fn take() -> &'static Script {
    static TAKE: OnceLock<Script> = OnceLock::new();
    TAKE.get_or_init(|| with_core(include_str!("../../../lua/scripts/take.lua")))
}

/// `lua/scripts/take_owned.lua`: the same on a rule that tracks the
/// popping connection, a next-pop pop's acknowledgement included.
pub fn take_owned() -> &'static Script {
    static TAKE_OWNED: OnceLock<Script> = OnceLock::new();
    TAKE_OWNED.get_or_init(|| with_core(include_str!("../../../lua/scripts/take_owned.lua")))
}

/// `lua/scripts/take_move.lua`: a move pop of one value when nothing is
/// due.
pub fn take_move() -> &'static Script {
    static TAKE_MOVE: OnceLock<Script> = OnceLock::new();
    TAKE_MOVE.get_or_init(|| with_core(include_str!("../../../lua/scripts/take_move.lua")))
}

/// `lua/scripts/lrem_ack.lua`: LREM on a move destination.
pub fn lrem_ack() -> &'static Script {
    static LREM_ACK: OnceLock<Script> = OnceLock::new();
    LREM_ACK.get_or_init(|| with_core(include_str!("../../../lua/scripts/lrem_ack.lua")))
}

/// `lua/scripts/release_owned.lua`: the same on a rule that tracks the
/// connection, sent by the connection that popped.
pub fn release_owned() -> &'static Script {
    static RELEASE_OWNED: OnceLock<Script> = OnceLock::new();
    RELEASE_OWNED
        .get_or_init(|| Script::new(include_str!("../../../lua/scripts/release_owned.lua")))
}

/// Every script of the proxy's, in the order [`probe`] asks for them.
fn all() -> [&'static Script; 6] {
    [
        take(),
        release(),
        take_owned(),
        take_move(),
        lrem_ack(),
        release_owned(),
    ]
}

/// What a take script names `SKIPLIST_MARK`: a member longer than Redis
/// keeps in a listpack (`zset-max-listpack-value`, 64 bytes by default),
/// added to a lease set and removed in the same call. Redis keeps a small
/// sorted set as a listpack, which ZADD and ZREM search from one end; one
/// with a member that long becomes a skiplist, and stays one (until the
/// set empties, or a restart loads it). With 50 leases out that cuts what
/// a pop + ACK pair's ZADD and ZREM cost Redis in instructions to about a
/// third; with one or two a skiplist costs no more, but making one costs
/// more than it saves, so the proxy asks for it only now and then
/// ([`Queue::skiplist_turn`]).
/// Never left in a set: nothing else reads it.
const SKIPLIST_MARK: &str =
    "'~skiplist...............................................................'";

/// A take script with its lines `TAKE_TOKEN` and `TAKE_DEADLINE` made
/// `lua/scripts/token.lua` and `deadline.lua` (what they share), and every
/// `LEASE_CORE` placeholder
/// `lua/lease_core.lua`'s helpers where it asks for them: made by a call of
/// their own, so that a call needing none makes none.
fn with_core(text: &str) -> Script {
    let core = format!(
        "(function()\n{}\nreturn {{ ack_id = ack_id, id_key = id_key, claim = claim, \
         move_leases = move_leases, drop = drop }}\nend)()",
        super::LEASE_CORE
    );
    let token = concat!("\n", include_str!("../../../lua/scripts/token.lua"));
    let deadline = concat!("\n", include_str!("../../../lua/scripts/deadline.lua"));
    let text = text
        .replace("\nTAKE_TOKEN\n", token)
        .replace("\nTAKE_DEADLINE\n", deadline)
        .replace("SKIPLIST_MARK", SKIPLIST_MARK)
        .replace("LEASE_CORE", &core);
    Script::new(String::leak(text))
}

/// A script's call. Its `EVAL` form, the same with the script's text for
/// a Redis that lost it, is made from it only then: a pop's would copy the
/// take script's kilobytes at every call.
#[derive(Clone)]
pub struct Request {
    pub evalsha: Bytes,
    script: &'static Script,
}

impl Request {
    /// The call as `EVAL` with the script's text.
    pub fn eval(&self) -> Bytes {
        self.script.eval_of(&self.evalsha)
    }
}

impl Script {
    /// Its call on `keys` and `args` for queue `q`, with the totals the
    /// queue's last calls made if they are due to be written (see
    /// `Queue::totals_to_write`): the stats hash as one more key, and the
    /// deliveries, the ACKs and the hash's time to live as three more
    /// arguments, as each script's header states.
    pub fn call(&'static self, q: &Queue, keys: &[&[u8]], args: &[&[u8]]) -> Request {
        let Some([d, a]) = q.totals_to_write(clock::redis_now_ms()) else {
            return Request {
                evalsha: self.evalsha(keys, args),
                script: self,
            };
        };
        let (mut dn, mut an, mut ttl) = (
            itoa::Buffer::new(),
            itoa::Buffer::new(),
            itoa::Buffer::new(),
        );
        let keys = [keys, &[q.keys.get("stats")]].concat();
        let extra: [&[u8]; 3] = [
            dn.format(d).as_bytes(),
            an.format(a).as_bytes(),
            ttl.format(STATS_TTL_MS).as_bytes(),
        ];
        let args = [args, &extra].concat();
        Request {
            evalsha: self.evalsha(&keys, &args),
            script: self,
        }
    }

    /// `evalsha` (this script's [`Script::evalsha`]) as `EVAL` with the
    /// text: the SHA1's argument replaced, the rest as it is.
    fn eval_of(&self, evalsha: &[u8]) -> Bytes {
        // `*<n>\r\n$7\r\nEVALSHA\r\n$40\r\n<sha1>\r\n`, then the rest.
        let count_end = evalsha
            .iter()
            .position(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let rest = &evalsha[(count_end + 13 + 5 + 40 + 2).min(evalsha.len())..];
        let mut len = itoa::Buffer::new();
        let len = len.format(self.text.len());
        let mut out = Vec::with_capacity(count_end + 30 + self.text.len() + rest.len());
        out.extend_from_slice(&evalsha[..count_end]);
        out.extend_from_slice(b"$4\r\nEVAL\r\n$");
        out.extend_from_slice(len.as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(self.text.as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(rest);
        Bytes::from(out)
    }
}

/// Whether Redis answered that it does not have the script.
pub fn is_noscript(reply: &[u8]) -> bool {
    reply.starts_with(b"-NOSCRIPT")
}

/// The proxy's scripts as `SCRIPT EXISTS` asks for them: its reply tells
/// which of them Redis's script cache holds (see [`cached_in`]).
pub fn probe() -> Vec<&'static [u8]> {
    let mut args: Vec<&'static [u8]> = vec![b"SCRIPT", b"EXISTS"];
    args.extend(all().map(|s| s.sha.as_bytes()));
    args
}

/// What the proxy's scripts add to `INFO`'s script cache: how many are
/// cached, and the bytes Redis counts for them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cached {
    pub scripts: u64,
    pub bytes: u64,
}

/// The proxy's share of the script cache according to the reply to
/// [`probe`]; none when it is no such reply (a `BUSY`, an error).
pub fn cached_in(reply: &[u8]) -> Cached {
    let mut c = Cached::default();
    let Some((b'*', items)) = crate::resp::frame::items(reply) else {
        return c;
    };
    for (item, script) in items.into_iter().zip(all()) {
        if &reply[item] == b":1\r\n" {
            c.scripts += 1;
            c.bytes += counted_bytes(script.text.len());
        }
    }
    c
}

/// The bytes Redis 7.0 counts in `used_memory_scripts_eval` for one cached
/// script of `len` bytes, besides its share of the cache's hash table: 88
/// (its SHA1's string, its entry and record) and the allocation of its
/// text (jemalloc's size class of a string of that length and its header),
/// or 16 for a text short enough to be kept with its object. Measured
/// against redis-server: see `tests/suite/function_view.rs`.
fn counted_bytes(len: usize) -> u64 {
    const FIXED: u64 = 88;
    if len <= 44 {
        return FIXED + 16;
    }
    let header = match len {
        0..=255 => 3,
        256..=65_535 => 5,
        _ => 9,
    };
    FIXED + size_class((len + header + 1) as u64)
}

/// jemalloc's size class of an allocation of n bytes: multiples of 16 up
/// to 128, then four classes for every doubling.
fn size_class(n: u64) -> u64 {
    if n <= 8 {
        return 8;
    }
    if n <= 128 {
        return n.div_ceil(16) * 16;
    }
    let group = 1u64 << (63 - (n - 1).leading_zeros());
    let step = group / 4;
    n.div_ceil(step) * step
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_is_named_by_the_sha1_of_its_text() {
        let s = release();
        assert_eq!(s.sha.len(), 40);
        let req = s.evalsha(&[b"k1", b"k2"], &[b"id"]);
        let text = String::from_utf8_lossy(&req);
        assert!(text.starts_with("*6\r\n$7\r\nEVALSHA\r\n$40\r\n"), "{text}");
        assert!(
            text.ends_with("$1\r\n2\r\n$2\r\nk1\r\n$2\r\nk2\r\n$2\r\nid\r\n"),
            "{text}"
        );
        assert!(is_noscript(
            b"-NOSCRIPT No matching script. Please use EVAL.\r\n"
        ));
        assert!(!is_noscript(b"-ERR other\r\n"));
    }

    #[test]
    fn the_eval_form_is_the_call_with_the_text_for_the_sha1() {
        for s in all() {
            // Every placeholder made into what it stands for.
            assert!(!s.text.contains("\nTAKE_TOKEN\n"), "{}", s.text);
            assert!(!s.text.contains("\nTAKE_DEADLINE\n"), "{}", s.text);
            assert!(!s.text.contains(", SKIPLIST_MARK)"), "{}", s.text);
            assert!(!s.text.contains("= LEASE_CORE"), "{}", s.text);
            for (keys, args) in [
                (&[][..], &[][..]),
                (
                    &[&b"q"[..], b"ackq:{q}:q:leases"][..],
                    &[&b"R"[..], b"30000", b""][..],
                ),
            ] {
                let req = Request {
                    evalsha: s.evalsha(keys, args),
                    script: s,
                };
                assert_eq!(
                    req.eval(),
                    s.request(b"EVAL", s.text.as_bytes(), keys, args)
                );
            }
        }
    }

    #[test]
    fn size_classes_are_jemallocs() {
        let classes = [
            (9, 16),
            (63, 64),
            (113, 128),
            (129, 160),
            (1015, 1024),
            (1025, 1280),
        ];
        for (n, class) in classes {
            assert_eq!(size_class(n), class, "{n}");
        }
        assert_eq!(size_class(3015), 3072);
        assert_eq!(size_class(5015), 5120);
        // Measured on redis-server 7.0, one script alone in the cache
        // (whose table then has 4 slots of 8 bytes): scripts of 8, 59, 109
        // and 5009 bytes.
        assert_eq!(counted_bytes(8) + 32, 136);
        assert_eq!(counted_bytes(59) + 32, 184);
        assert_eq!(counted_bytes(109) + 32, 248);
        assert_eq!(counted_bytes(5009) + 32, 5240);
    }
}
