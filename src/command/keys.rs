//! Which arguments of a request are keys, found as Redis 7.0 finds them for
//! cluster routing (`getKeysFromCommand` in its db.c): the legacy key range
//! of `COMMAND` for most commands, and by reading the arguments for those
//! `COMMAND` marks `movablekeys`.

use super::table::{KeySpec, Table};
use super::Args;

/// Where a command's keys are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPos {
    /// The command has no keys (or, like `EVAL script 0`, none this time).
    Keyless,
    /// Argument indexes (0 is the command name), in argument order.
    At(Vec<usize>),
    /// A command Redis does not know, with an argument count it refuses, or
    /// with arguments in which no key can be found: Redis refuses it. Also a
    /// command with movable keys that is not read by hand here (a module's).
    Unknown,
}

/// Where the keys of `args` are, by `table` (Redis's command table) or,
/// without it, by a short list of common commands.
pub fn key_positions(args: Args<'_>, table: Option<&Table>) -> KeyPos {
    let Some(name) = args.get(0) else {
        return KeyPos::Unknown;
    };
    let spec = match table {
        Some(t) => t.key_spec(name, args.get(1)),
        None => builtin(name),
    };
    let Some(spec) = spec else {
        return KeyPos::Unknown;
    };
    let argc = args.len() as i64;
    let fits = if spec.arity >= 0 {
        argc == spec.arity
    } else {
        argc >= -spec.arity
    };
    if !fits {
        return KeyPos::Unknown;
    }
    if let Some(found) = movable(name, args) {
        return found;
    }
    if spec.movable {
        return KeyPos::Unknown;
    }
    legacy_range(spec, args.len())
}

/// `getKeysUsingLegacyRangeSpec`: first..=last by step, a negative last
/// counting from the end. A range running past the arguments gives no keys,
/// and Redis refuses such a request.
fn legacy_range(spec: KeySpec, argc: usize) -> KeyPos {
    if spec.first <= 0 {
        return KeyPos::Keyless;
    }
    let argc = argc as i64;
    let last = if spec.last >= 0 {
        spec.last
    } else {
        argc + spec.last
    };
    if spec.step <= 0 || last < spec.first || last >= argc {
        return KeyPos::Unknown;
    }
    KeyPos::At(
        (spec.first..=last)
            .step_by(spec.step as usize)
            .map(|i| i as usize)
            .collect(),
    )
}

/// The commands whose keys Redis 7.0 finds with a function of its own
/// (those `COMMAND` marks `movablekeys`); `None` for any other command.
fn movable(name: &[u8], args: Args<'_>) -> Option<KeyPos> {
    let mut buf = [0u8; 24];
    if name.len() > buf.len() {
        return None;
    }
    for (o, b) in buf.iter_mut().zip(name) {
        *o = b.to_ascii_lowercase();
    }
    let found = match &buf[..name.len()] {
        b"eval" | b"evalsha" | b"eval_ro" | b"evalsha_ro" | b"fcall" | b"fcall_ro" => {
            // Scripts may be called with no keys at all.
            match numbered(args, None, 2, 3) {
                KeyPos::Unknown if args.get(2).is_some_and(|n| atoi(n) == 0) => KeyPos::Keyless,
                found => found,
            }
        }
        b"zunionstore" | b"zinterstore" | b"zdiffstore" => numbered(args, Some(1), 2, 3),
        b"zunion" | b"zinter" | b"zdiff" | b"zintercard" | b"sintercard" | b"lmpop" | b"zmpop" => {
            numbered(args, None, 1, 2)
        }
        b"blmpop" | b"bzmpop" => numbered(args, None, 2, 3),
        b"xread" | b"xreadgroup" => xread(args),
        b"sort" => sort(args),
        b"sort_ro" => KeyPos::At(vec![1]),
        b"migrate" => migrate(args),
        b"georadius" | b"georadiusbymember" => georadius(args),
        _ => return None,
    };
    Some(found)
}

/// `genericGetKeys`: a count at `count`, then that many keys from `first`,
/// and a destination key at `store`. A count below 1 or beyond the
/// arguments gives no keys, and Redis refuses the request.
fn numbered(args: Args<'_>, store: Option<usize>, count: usize, first: usize) -> KeyPos {
    let Some(n) = args.get(count).map(atoi) else {
        return KeyPos::Unknown;
    };
    let room = args.len().saturating_sub(first) as i64;
    if n < 1 || n > room {
        return KeyPos::Unknown;
    }
    let mut keys = Vec::with_capacity(n as usize + 1);
    keys.extend(store);
    keys.extend(first..first + n as usize);
    KeyPos::At(keys)
}

/// C's `atoi`, which `genericGetKeys` reads the count with: leading blanks,
/// a sign, digits, and whatever follows ignored.
fn atoi(s: &[u8]) -> i64 {
    let mut i = 0;
    while i < s.len() && matches!(s[i], b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r') {
        i += 1;
    }
    let negative = s.get(i) == Some(&b'-');
    if matches!(s.get(i), Some(b'-' | b'+')) {
        i += 1;
    }
    let mut n: i64 = 0;
    while let Some(d) = s.get(i).filter(|d| d.is_ascii_digit()) {
        n = n.saturating_mul(10).saturating_add(i64::from(d - b'0'));
        i += 1;
    }
    if negative {
        -n
    } else {
        n
    }
}

/// `xreadGetKeys`: options up to STREAMS, then as many keys as IDs.
fn xread(args: Args<'_>) -> KeyPos {
    let mut streams = None;
    let mut i = 1;
    while let Some(a) = args.get(i) {
        if a.eq_ignore_ascii_case(b"block") || a.eq_ignore_ascii_case(b"count") {
            i += 1;
        } else if a.eq_ignore_ascii_case(b"group") {
            i += 2;
        } else if a.eq_ignore_ascii_case(b"noack") {
        } else if a.eq_ignore_ascii_case(b"streams") {
            streams = Some(i);
            break;
        } else {
            break;
        }
        i += 1;
    }
    let Some(at) = streams else {
        return KeyPos::Unknown;
    };
    let rest = args.len() - at - 1;
    if rest == 0 || !rest.is_multiple_of(2) {
        return KeyPos::Unknown;
    }
    KeyPos::At((at + 1..at + 1 + rest / 2).collect())
}

/// `sortGetKeys`: the sorted key, and the last STORE's destination. Options
/// are skipped with their arguments as Redis skips them (BY and GET one,
/// LIMIT two), so a pattern or offset named "store" is no keyword.
fn sort(args: Args<'_>) -> KeyPos {
    let mut store = None;
    let mut i = 2;
    while let Some(a) = args.get(i) {
        if a.eq_ignore_ascii_case(b"limit") {
            i += 2;
        } else if a.eq_ignore_ascii_case(b"store") && i + 1 < args.len() {
            // The destination itself is read as an option next, as Redis does.
            store = Some(i + 1);
        } else if a.eq_ignore_ascii_case(b"get") || a.eq_ignore_ascii_case(b"by") {
            i += 1;
        }
        i += 1;
    }
    KeyPos::At(std::iter::once(1).chain(store).collect())
}

/// `migrateGetKeys`: the key argument, or with an empty one, every argument
/// after KEYS.
fn migrate(args: Args<'_>) -> KeyPos {
    let (mut first, mut n) = (3, 1);
    let mut i = 6;
    while let Some(a) = args.get(i) {
        if a.eq_ignore_ascii_case(b"keys") {
            if args.get(3).is_some_and(|k| !k.is_empty()) {
                // A key and KEYS both: Redis refuses it.
                n = 0;
            } else {
                first = i + 1;
                n = args.len() - first;
            }
            break;
        }
        if a.eq_ignore_ascii_case(b"auth") {
            i += 1;
        } else if a.eq_ignore_ascii_case(b"auth2") {
            i += 2;
        }
        i += 1;
    }
    if n == 0 {
        return KeyPos::Unknown;
    }
    KeyPos::At((first..first + n).collect())
}

/// `georadiusGetKeys`: the key, and the last STORE or STOREDIST destination.
fn georadius(args: Args<'_>) -> KeyPos {
    let mut store = None;
    let mut i = 5;
    while let Some(a) = args.get(i) {
        if (a.eq_ignore_ascii_case(b"store") || a.eq_ignore_ascii_case(b"storedist"))
            && i + 1 < args.len()
        {
            store = Some(i + 1);
            i += 1;
        }
        i += 1;
    }
    KeyPos::At(std::iter::once(1).chain(store).collect())
}

/// The common commands' entries of Redis 7.0's table, for before it has
/// been read (or when Redis refuses `COMMAND`): name, arity, first key,
/// last key, step. `tests/suite/cluster_keys.rs` checks them against Redis.
pub const BUILTIN: &[(&str, i64, i64, i64, i64)] = &[
    ("append", 3, 1, 1, 1),
    ("bitcount", -2, 1, 1, 1),
    ("blmove", 6, 1, 2, 1),
    ("blpop", -3, 1, -2, 1),
    ("brpop", -3, 1, -2, 1),
    ("brpoplpush", 4, 1, 2, 1),
    ("bzpopmax", -3, 1, -2, 1),
    ("bzpopmin", -3, 1, -2, 1),
    ("copy", -3, 1, 2, 1),
    ("decr", 2, 1, 1, 1),
    ("decrby", 3, 1, 1, 1),
    ("del", -2, 1, -1, 1),
    ("exists", -2, 1, -1, 1),
    ("expire", -3, 1, 1, 1),
    ("get", 2, 1, 1, 1),
    ("getdel", 2, 1, 1, 1),
    ("getex", -2, 1, 1, 1),
    ("getset", 3, 1, 1, 1),
    ("hdel", -3, 1, 1, 1),
    ("hexists", 3, 1, 1, 1),
    ("hget", 3, 1, 1, 1),
    ("hgetall", 2, 1, 1, 1),
    ("hincrby", 4, 1, 1, 1),
    ("hkeys", 2, 1, 1, 1),
    ("hlen", 2, 1, 1, 1),
    ("hmget", -3, 1, 1, 1),
    ("hmset", -4, 1, 1, 1),
    ("hset", -4, 1, 1, 1),
    ("hvals", 2, 1, 1, 1),
    ("incr", 2, 1, 1, 1),
    ("incrby", 3, 1, 1, 1),
    ("lindex", 3, 1, 1, 1),
    ("llen", 2, 1, 1, 1),
    ("lmove", 5, 1, 2, 1),
    ("lpop", -2, 1, 1, 1),
    ("lpos", -3, 1, 1, 1),
    ("lpush", -3, 1, 1, 1),
    ("lrange", 4, 1, 1, 1),
    ("lrem", 4, 1, 1, 1),
    ("lset", 4, 1, 1, 1),
    ("ltrim", 4, 1, 1, 1),
    ("mget", -2, 1, -1, 1),
    ("mset", -3, 1, -1, 2),
    ("msetnx", -3, 1, -1, 2),
    ("persist", 2, 1, 1, 1),
    ("pexpire", -3, 1, 1, 1),
    ("pttl", 2, 1, 1, 1),
    ("publish", 3, 0, 0, 0),
    ("rename", 3, 1, 2, 1),
    ("rpop", -2, 1, 1, 1),
    ("rpoplpush", 3, 1, 2, 1),
    ("rpush", -3, 1, 1, 1),
    ("sadd", -3, 1, 1, 1),
    ("scard", 2, 1, 1, 1),
    ("set", -3, 1, 1, 1),
    ("setex", 4, 1, 1, 1),
    ("setnx", 3, 1, 1, 1),
    ("sismember", 3, 1, 1, 1),
    ("smembers", 2, 1, 1, 1),
    ("spublish", 3, 1, 1, 1),
    ("srem", -3, 1, 1, 1),
    ("ttl", 2, 1, 1, 1),
    ("type", 2, 1, 1, 1),
    ("unlink", -2, 1, -1, 1),
    ("xack", -4, 1, 1, 1),
    ("xadd", -5, 1, 1, 1),
    ("xlen", 2, 1, 1, 1),
    ("xrange", -4, 1, 1, 1),
    ("zadd", -4, 1, 1, 1),
    ("zcard", 2, 1, 1, 1),
    ("zincrby", 4, 1, 1, 1),
    ("zrange", -4, 1, 1, 1),
    ("zrangebyscore", -4, 1, 1, 1),
    ("zrem", -3, 1, 1, 1),
    ("zscore", 3, 1, 1, 1),
    // Commands with movable keys: read by hand, only the arity is used.
    ("blmpop", -5, 0, 0, 0),
    ("bzmpop", -5, 0, 0, 0),
    ("eval", -3, 0, 0, 0),
    ("eval_ro", -3, 0, 0, 0),
    ("evalsha", -3, 0, 0, 0),
    ("evalsha_ro", -3, 0, 0, 0),
    ("fcall", -3, 0, 0, 0),
    ("fcall_ro", -3, 0, 0, 0),
    ("lmpop", -4, 0, 0, 0),
    ("xread", -4, 0, 0, 0),
    ("xreadgroup", -7, 0, 0, 0),
    ("zmpop", -4, 0, 0, 0),
    // Without keys.
    ("echo", 2, 0, 0, 0),
    ("info", -1, 0, 0, 0),
    ("ping", -1, 0, 0, 0),
];

/// An entry of [`BUILTIN`]; movable commands are marked so that the
/// missing range is never used for them.
fn builtin(name: &[u8]) -> Option<KeySpec> {
    let &(n, arity, first, last, step) = BUILTIN
        .iter()
        .find(|(n, ..)| n.as_bytes().eq_ignore_ascii_case(name))?;
    let movable = matches!(
        n,
        "blmpop"
            | "bzmpop"
            | "eval"
            | "eval_ro"
            | "evalsha"
            | "evalsha_ro"
            | "fcall"
            | "fcall_ro"
            | "lmpop"
            | "xread"
            | "xreadgroup"
            | "zmpop"
    );
    Some(KeySpec {
        arity,
        first,
        last,
        step,
        movable,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::with_words;

    fn keys(words: &[&str]) -> KeyPos {
        with_words(words, |a| key_positions(a, None))
    }

    #[test]
    fn builtin_list_covers_common_commands() {
        assert_eq!(keys(&["get", "k"]), KeyPos::At(vec![1]));
        assert_eq!(keys(&["GET"]), KeyPos::Unknown);
        assert_eq!(keys(&["get", "k", "x"]), KeyPos::Unknown);
        assert_eq!(keys(&["MSET", "a", "1", "b", "2"]), KeyPos::At(vec![1, 3]));
        assert_eq!(keys(&["BRPOP", "k1", "k2", "0"]), KeyPos::At(vec![1, 2]));
        assert_eq!(keys(&["PING"]), KeyPos::Keyless);
        assert_eq!(keys(&["PUBLISH", "c", "m"]), KeyPos::Keyless);
        assert_eq!(keys(&["nosuch", "k"]), KeyPos::Unknown);
        assert_eq!(keys(&[]), KeyPos::Unknown);
        // Unknown without Redis's table, whose subcommands it lacks.
        assert_eq!(keys(&["OBJECT", "ENCODING", "k"]), KeyPos::Unknown);
    }

    #[test]
    fn movable_keys_are_read_from_the_arguments() {
        assert_eq!(
            keys(&["EVAL", "s", "2", "a", "b", "x"]),
            KeyPos::At(vec![3, 4])
        );
        assert_eq!(keys(&["fcall", "f", "0"]), KeyPos::Keyless);
        assert_eq!(keys(&["fcall", "f", "0", "x"]), KeyPos::Keyless);
        assert_eq!(keys(&["EVAL", "s", "3", "a", "b"]), KeyPos::Unknown);
        assert_eq!(keys(&["EVAL", "s", "-1", "a"]), KeyPos::Unknown);
        // Redis reads the count with atoi.
        assert_eq!(keys(&["EVAL", "s", "1x", "a"]), KeyPos::At(vec![3]));
        assert_eq!(
            keys(&["LMPOP", "2", "a", "b", "LEFT"]),
            KeyPos::At(vec![2, 3])
        );
        assert_eq!(keys(&["LMPOP", "0", "a", "LEFT"]), KeyPos::Unknown);
        assert_eq!(
            keys(&["BLMPOP", "0", "1", "a", "LEFT"]),
            KeyPos::At(vec![3])
        );
        assert_eq!(
            keys(&["XREAD", "COUNT", "2", "STREAMS", "a", "b", "0", "0"]),
            KeyPos::At(vec![4, 5])
        );
        assert_eq!(keys(&["XREAD", "STREAMS", "a", "b", "0"]), KeyPos::Unknown);
        assert_eq!(
            keys(&["XREADGROUP", "GROUP", "streams", "c", "STREAMS", "s", ">"]),
            KeyPos::At(vec![5])
        );
    }

    #[test]
    fn movable_keys_with_options() {
        let at = |v: &[usize]| KeyPos::At(v.to_vec());
        let with = |words: &[&str]| {
            with_words(words, |a| {
                movable(a.get(0).unwrap(), a).expect("a movable-key command")
            })
        };
        assert_eq!(
            with(&["SORT", "k", "BY", "store", "STORE", "d"]),
            at(&[1, 5])
        );
        assert_eq!(
            with(&["SORT", "k", "STORE", "d1", "LIMIT", "0", "1", "STORE", "d2"]),
            at(&[1, 8])
        );
        assert_eq!(with(&["SORT", "k", "STORE"]), at(&[1]));
        assert_eq!(with(&["SORT_RO", "k", "GET", "#"]), at(&[1]));
        assert_eq!(with(&["MIGRATE", "h", "1", "k", "0", "100"]), at(&[3]));
        assert_eq!(
            with(&["MIGRATE", "h", "1", "", "0", "100", "AUTH", "keys", "KEYS", "a", "b"]),
            at(&[9, 10])
        );
        assert_eq!(
            with(&["MIGRATE", "h", "1", "k", "0", "100", "KEYS", "a"]),
            KeyPos::Unknown
        );
        assert_eq!(
            with(&[
                "GEORADIUS",
                "k",
                "0",
                "0",
                "1",
                "km",
                "STORE",
                "a",
                "STOREDIST",
                "b"
            ]),
            at(&[1, 9])
        );
        assert_eq!(
            with(&["ZUNIONSTORE", "d", "2", "a", "b", "WEIGHTS", "1", "2"]),
            at(&[1, 3, 4])
        );
    }

    #[test]
    fn atoi_reads_like_c() {
        assert_eq!(atoi(b" 12x"), 12);
        assert_eq!(atoi(b"-3"), -3);
        assert_eq!(atoi(b"+4"), 4);
        assert_eq!(atoi(b"x1"), 0);
        assert_eq!(atoi(b""), 0);
        assert_eq!(atoi(b"99999999999999999999999"), i64::MAX);
    }
}
