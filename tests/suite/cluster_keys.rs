//! Key positions and hash slots against a real redis-server: the keys
//! `key_positions` finds are those `COMMAND GETKEYS` names, and slots are
//! those `CLUSTER KEYSLOT` answers.

use crate::common::{bulk_strings, Client, Redis, Rng, Value};
use ackproxy::cluster::{command_slot, key_slot, CommandSlot};
use ackproxy::command::keys::{key_positions, KeyPos, BUILTIN};
use ackproxy::command::table::{KeySpec, Table};
use ackproxy::command::Args;

/// Redis's command table, as the proxy reads it.
fn table(c: &mut Client) -> (Table, redis::Value) {
    let raw = c.raw(&["COMMAND"]);
    let reply = redis::parse_redis_value(&raw).expect("a COMMAND reply");
    (Table::from_reply(&reply).expect("a command table"), reply)
}

fn with_args<T>(words: &[&str], f: impl FnOnce(Args<'_>) -> T) -> T {
    let mut buf = Vec::new();
    let mut ranges = Vec::new();
    for w in words {
        let start = buf.len();
        buf.extend_from_slice(w.as_bytes());
        ranges.push(start..buf.len());
    }
    f(Args::new(&buf, &ranges))
}

/// What `COMMAND GETKEYS` says of `words`, as a [`KeyPos`]-like answer:
/// the key names (sorted), `Keyless`, or `Unknown` for a refusal.
#[derive(Debug, PartialEq)]
enum Said {
    Keys(Vec<String>),
    Keyless,
    Unknown(String),
}

fn getkeys(c: &mut Client, words: &[&str]) -> Said {
    let mut cmd = vec!["COMMAND", "GETKEYS"];
    cmd.extend_from_slice(words);
    match c.cmd(&cmd) {
        Value::Array(keys) if keys.is_empty() => Said::Keyless,
        Value::Array(keys) => {
            let mut names = bulk_strings(&keys, &format!("GETKEYS {words:?}"));
            names.sort();
            Said::Keys(names)
        }
        Value::Error(e) if e.contains("has no key arguments") => Said::Keyless,
        Value::Error(e) => Said::Unknown(e),
        other => panic!("GETKEYS {words:?}: {other:?}"),
    }
}

fn ours(words: &[&str], table: Option<&Table>) -> KeyPos {
    with_args(words, |a| key_positions(a, table))
}

/// `ours` in `Said` terms, checking that positions come in argument order.
fn said(words: &[&str], found: &KeyPos) -> Said {
    match found {
        KeyPos::Keyless => Said::Keyless,
        KeyPos::Unknown => Said::Unknown(String::new()),
        KeyPos::At(positions) => {
            assert!(
                positions.windows(2).all(|w| w[0] < w[1]),
                "{words:?}: positions out of order: {positions:?}"
            );
            let mut names: Vec<String> = positions.iter().map(|&i| words[i].to_string()).collect();
            names.sort();
            Said::Keys(names)
        }
    }
}

fn same(a: &Said, b: &Said) -> bool {
    match (a, b) {
        (Said::Unknown(_), Said::Unknown(_)) => true,
        _ => a == b,
    }
}

/// Requests of every shape of key arguments, each compared with GETKEYS.
const CORPUS: &[&[&str]] = &[
    // One key, fixed ranges, steps.
    &["GET", "k"],
    &["SET", "k", "v"],
    &["SET", "k", "v", "GET"],
    &["SET", "k", "v", "EX", "10", "NX"],
    &["GETEX", "k", "PERSIST"],
    &["EXPIRE", "k", "10"],
    &["APPEND", "k", "v"],
    &["INCR", "k"],
    &["BITFIELD", "k", "GET", "u8", "0"],
    &["BITFIELD_RO", "k", "GET", "u8", "0"],
    &["MSET", "a", "1", "b", "2", "c", "3"],
    &["MSET", "a", "1", "b"],
    &["MSETNX", "a", "1", "b", "2"],
    &["MGET", "a", "b", "c"],
    &["DEL", "a", "b", "c"],
    &["UNLINK", "a"],
    &["EXISTS", "a", "b"],
    &["TOUCH", "a", "b"],
    &["WATCH", "a", "b"],
    &["LPUSH", "l", "x", "y"],
    &["RPUSH", "l", "x"],
    &["LPOP", "l"],
    &["RPOP", "l", "2"],
    &["LRANGE", "l", "0", "-1"],
    &["BRPOP", "k1", "k2", "0"],
    &["BLPOP", "k1", "0"],
    &["BZPOPMIN", "z1", "z2", "1.5"],
    &["BRPOPLPUSH", "src", "dst", "0"],
    &["RPOPLPUSH", "src", "dst"],
    &["LMOVE", "src", "dst", "LEFT", "RIGHT"],
    &["BLMOVE", "src", "dst", "LEFT", "RIGHT", "0"],
    &["RENAME", "old", "new"],
    &["RENAMENX", "old", "new"],
    &["COPY", "src", "dst"],
    &["COPY", "src", "dst", "DB", "1", "REPLACE"],
    &["SMOVE", "src", "dst", "m"],
    &["SINTER", "s1", "s2", "s3"],
    &["SUNIONSTORE", "d", "s1", "s2"],
    &["HSET", "h", "f", "v", "f2", "v2"],
    &["HGETALL", "h"],
    &["ZADD", "z", "1", "m"],
    &["ZRANGESTORE", "dst", "src", "0", "-1"],
    &["BITOP", "AND", "dest", "k1", "k2"],
    &["PFCOUNT", "h1", "h2"],
    &["PFMERGE", "d", "h1", "h2"],
    &["LCS", "k1", "k2"],
    &["XADD", "s", "*", "f", "v"],
    &["XACK", "s", "g", "1-0"],
    &["XCLAIM", "s", "g", "c", "0", "1-0"],
    &[
        "GEOSEARCHSTORE",
        "dst",
        "src",
        "FROMMEMBER",
        "m",
        "BYRADIUS",
        "1",
        "km",
    ],
    &["GEORADIUS_RO", "g", "0", "0", "10", "km"],
    // Subcommands.
    &["OBJECT", "ENCODING", "k"],
    &["OBJECT", "FREQ", "k"],
    &["XINFO", "STREAM", "s"],
    &["XINFO", "STREAM", "s", "FULL"],
    &["XINFO", "GROUPS", "s"],
    &["XINFO", "CONSUMERS", "s", "g"],
    &["MEMORY", "USAGE", "k"],
    &["MEMORY", "USAGE", "k", "SAMPLES", "5"],
    &["XGROUP", "CREATE", "s", "g", "$", "MKSTREAM"],
    &["XGROUP", "DESTROY", "s", "g"],
    // Movable keys: a count of keys.
    &["ZUNIONSTORE", "d", "2", "z1", "z2", "WEIGHTS", "1", "2"],
    &["ZINTERSTORE", "d", "1", "z1"],
    &["ZDIFFSTORE", "d", "2", "z1", "z2"],
    &["ZUNION", "2", "z1", "z2", "WITHSCORES"],
    &["ZINTER", "3", "z1", "z2", "z3"],
    &["ZDIFF", "1", "z1"],
    &["ZINTERCARD", "2", "z1", "z2", "LIMIT", "5"],
    &["SINTERCARD", "2", "s1", "s2"],
    &["LMPOP", "2", "l1", "l2", "LEFT", "COUNT", "2"],
    &["LMPOP", "3", "l1", "l2", "LEFT"],
    &["ZMPOP", "1", "z1", "MIN"],
    &["BLMPOP", "0", "2", "l1", "l2", "RIGHT"],
    &["BZMPOP", "1.5", "1", "z1", "MAX", "COUNT", "3"],
    &["EVAL", "return 1", "2", "k1", "k2", "a1"],
    &["EVAL", "return 1", "0"],
    &["EVAL", "return 1", "0", "a1"],
    &["EVAL", "return 1", "abc", "k"],
    &[
        "EVALSHA",
        "0123456789012345678901234567890123456789",
        "1",
        "k1",
    ],
    &["EVAL_RO", "return 1", "1", "k1", "a"],
    &[
        "EVALSHA_RO",
        "0123456789012345678901234567890123456789",
        "0",
        "a",
        "b",
    ],
    &[
        "EVALSHA_RO",
        "0123456789012345678901234567890123456789",
        "2",
        "k1",
        "k2",
    ],
    &["FCALL", "f", "2", "k1", "k2"],
    &["FCALL_RO", "f", "1", "k1", "x"],
    &["FCALL", "f", "0"],
    // Movable keys: keywords.
    &["XREAD", "COUNT", "2", "STREAMS", "s1", "s2", "0", "0"],
    &["XREAD", "BLOCK", "0", "STREAMS", "s1", "$"],
    &[
        "XREADGROUP",
        "GROUP",
        "g",
        "c",
        "COUNT",
        "1",
        "NOACK",
        "STREAMS",
        "s1",
        "s2",
        ">",
        ">",
    ],
    &[
        "XREADGROUP",
        "GROUP",
        "streams",
        "streams",
        "STREAMS",
        "streams2",
        ">",
    ],
    &["SORT", "k"],
    &[
        "SORT", "k", "BY", "w_*", "LIMIT", "0", "10", "GET", "o_*", "STORE", "dst",
    ],
    &["SORT", "k", "STORE", "d1", "STORE", "d2"],
    &["SORT", "k", "BY", "store", "GET", "store"],
    &["SORT", "k", "STORE"],
    &["SORT_RO", "k", "BY", "w_*", "GET", "#"],
    &["MIGRATE", "127.0.0.1", "6379", "k", "0", "1000"],
    &[
        "MIGRATE",
        "127.0.0.1",
        "6379",
        "k",
        "0",
        "1000",
        "COPY",
        "REPLACE",
    ],
    &[
        "MIGRATE",
        "127.0.0.1",
        "6379",
        "",
        "0",
        "1000",
        "COPY",
        "REPLACE",
        "KEYS",
        "a",
        "b",
        "c",
    ],
    &[
        "MIGRATE",
        "127.0.0.1",
        "6379",
        "",
        "0",
        "1000",
        "AUTH",
        "keys",
        "KEYS",
        "a",
    ],
    &[
        "MIGRATE",
        "127.0.0.1",
        "6379",
        "",
        "0",
        "1000",
        "AUTH2",
        "u",
        "keys",
        "KEYS",
        "a",
        "b",
    ],
    &[
        "MIGRATE",
        "127.0.0.1",
        "6379",
        "k",
        "0",
        "1000",
        "KEYS",
        "a",
    ],
    &["GEORADIUS", "g", "0", "0", "10", "km"],
    &["GEORADIUS", "g", "0", "0", "10", "km", "STORE", "d"],
    &[
        "GEORADIUS",
        "g",
        "0",
        "0",
        "10",
        "km",
        "WITHDIST",
        "STOREDIST",
        "d2",
    ],
    &["GEORADIUSBYMEMBER", "g", "m", "10", "km", "STORE", "d"],
    &["GEORADIUSBYMEMBER", "g", "m", "10", "km", "STORE"],
    // Without keys.
    &["PING", "x"],
    &["ECHO", "x"],
    &["INFO", "server"],
    &["PUBLISH", "c", "m"],
    &["CLIENT", "LIST"],
    &["CONFIG", "GET", "x"],
    &["OBJECT", "HELP"],
    &["SCRIPT", "FLUSH"],
    &["FUNCTION", "LIST"],
    // Refused.
    &["NOSUCH", "k"],
    &["GET"],
    &["GET", "a", "b"],
    &["BLPOP", "k"],
    &["OBJECT", "NOSUCH", "k"],
    &["XINFO", "STREAM"],
    &["ZUNION", "0", "z1"],
    &["ZUNIONSTORE", "d", "3", "z1", "z2"],
    &["LMPOP", "4", "l1", "l2", "LEFT"],
    &["BLMPOP", "0", "0", "l1", "LEFT"],
    &["XREAD", "COUNT", "1", "s1", "0"],
    &["XREADGROUP", "GROUP", "g", "c", "STREAMS"],
];

/// Requests whose routing keys (`getKeysFromCommand`) differ from what
/// GETKEYS answers (key specs): what the proxy must find, and why.
const ROUTED_UNLIKE_GETKEYS: &[(&[&str], &[usize], &str)] = &[
    // Sharded channels are no keys to GETKEYS, but their slot routes them.
    (&["SPUBLISH", "ch", "m"], &[1], "sharded channel"),
    (&["SSUBSCRIBE", "c1", "c2"], &[1, 2], "sharded channels"),
    (&["SUNSUBSCRIBE", "c1"], &[1], "sharded channel"),
    // GETKEYS names both destinations; GEORADIUS stores into the last.
    (
        &[
            "GEORADIUSBYMEMBER",
            "g",
            "m",
            "10",
            "km",
            "STORE",
            "d1",
            "STOREDIST",
            "d2",
        ],
        &[1, 8],
        "the last destination",
    ),
];

/// Requests GETKEYS finds keys of, or none, but Redis refuses: GETKEYS
/// answers "no key arguments" before checking the arity, an empty list for
/// a script whose key count does not fit, and the first half of the streams
/// of an XREAD whose streams and IDs do not pair up.
const REFUSED_UNLIKE_GETKEYS: &[&[&str]] = &[
    &["XREAD", "STREAMS", "s1", "s2", "0"],
    &["OBJECT"],
    &["ECHO"],
    &["EVAL", "return 1", "3", "k"],
    &["EVAL", "return 1", "-1", "k"],
    &["FCALL", "f", "2", "k"],
];

#[test]
fn key_positions_agree_with_command_getkeys() {
    let redis = Redis::start();
    let mut c = redis.client();
    let (table, reply) = table(&mut c);
    assert!(CORPUS.len() >= 80, "{} requests", CORPUS.len());
    let mut failures = Vec::new();
    for words in CORPUS {
        let found = ours(words, Some(&table));
        let want = getkeys(&mut c, words);
        let got = said(words, &found);
        if !same(&got, &want) {
            failures.push(format!("{words:?}: found {found:?}, GETKEYS says {want:?}"));
        }
        // Without Redis's table, the built-in list agrees where it answers.
        let bare = ours(words, None);
        if bare != KeyPos::Unknown && bare != found {
            failures.push(format!(
                "{words:?}: without the table {bare:?}, with {found:?}"
            ));
        }
    }
    for (words, want, why) in ROUTED_UNLIKE_GETKEYS {
        let found = ours(words, Some(&table));
        if found != KeyPos::At(want.to_vec()) {
            failures.push(format!("{words:?} ({why}): found {found:?}, want {want:?}"));
        }
    }
    for words in REFUSED_UNLIKE_GETKEYS {
        let found = ours(words, Some(&table));
        if found != KeyPos::Unknown {
            failures.push(format!("{words:?}: found {found:?}, Redis refuses it"));
        }
        // Redis itself refuses it.
        let reply = c.cmd(words);
        assert!(matches!(reply, Value::Error(_)), "{words:?}: {reply:?}");
    }
    // Every command whose keys move with its arguments has a request in
    // the corpus whose keys are found: a command added to Redis with
    // movable keys and not read by hand fails here.
    for name in movable_commands(&reply) {
        let covered = CORPUS.iter().any(|words| {
            words[0].eq_ignore_ascii_case(&name)
                && matches!(ours(words, Some(&table)), KeyPos::At(_))
        });
        if !covered {
            failures.push(format!("{name}: movable keys, no request of it found keys"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The names of the commands and subcommands `COMMAND` marks movablekeys.
fn movable_commands(reply: &redis::Value) -> Vec<String> {
    fn text(v: &redis::Value) -> Option<String> {
        match v {
            redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            redis::Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        }
    }
    fn walk(entries: &[redis::Value], out: &mut Vec<String>) {
        for entry in entries {
            let redis::Value::Array(fields) = entry else {
                panic!("a COMMAND entry: {entry:?}");
            };
            let name = text(&fields[0]).unwrap();
            if let redis::Value::Array(flags) = &fields[2] {
                if flags
                    .iter()
                    .any(|f| text(f).as_deref() == Some("movablekeys"))
                {
                    out.push(name);
                }
            }
            if let Some(redis::Value::Array(subs)) = fields.get(9) {
                walk(subs, out);
            }
        }
    }
    let redis::Value::Array(entries) = reply else {
        panic!("COMMAND: {reply:?}");
    };
    let mut out = Vec::new();
    walk(entries, &mut out);
    assert!(out.len() >= 20, "movable commands: {out:?}");
    out
}

#[test]
fn builtin_list_matches_redis() {
    let redis = Redis::start();
    let (table, reply) = table(&mut redis.client());
    let movable = movable_commands(&reply);
    for &(name, arity, first, last, step) in BUILTIN {
        let want = KeySpec {
            arity,
            first,
            last,
            step,
            movable: movable.iter().any(|m| m == name),
        };
        assert_eq!(table.key_spec(name.as_bytes(), None), Some(want), "{name}");
    }
}

/// A single-node cluster owning every slot: CLUSTER KEYSLOT, and CROSSSLOT
/// refusals, from Redis itself.
fn one_node_cluster() -> Redis {
    let port = crate::common::cluster_port();
    let dir = std::env::temp_dir().join(format!("ackproxy-test-redis-{port}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let redis = Redis::start_on(port, dir, &["--cluster-enabled", "yes"]);
    let mut c = redis.client();
    assert_eq!(
        c.cmd(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]),
        Value::Simple("OK".into())
    );
    crate::common::wait_until("the one-node cluster up", || {
        crate::common::cluster_info(port).contains("cluster_state:ok")
    });
    redis
}

fn random_key(rng: &mut Rng) -> Vec<u8> {
    let len = rng.below(12) as usize;
    let alphabet = b"ab{}xyz0123{}";
    let mut key: Vec<u8> = (0..len)
        .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize])
        .collect();
    // Now and then a byte outside ASCII.
    if rng.below(4) == 0 {
        key.push(rng.below(256) as u8);
    }
    key
}

#[test]
fn slots_agree_with_cluster_keyslot() {
    let redis = one_node_cluster();
    let mut c = redis.client();
    let mut rng = Rng::from_clock();
    for _ in 0..2000 {
        let key = random_key(&mut rng);
        let want = c.cmd_bin(&[b"CLUSTER", b"KEYSLOT", &key]);
        assert_eq!(
            want,
            Value::Int(i64::from(key_slot(&key))),
            "key {:?}",
            String::from_utf8_lossy(&key)
        );
    }
    for key in ["foo", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap"] {
        assert_eq!(
            c.cmd(&["CLUSTER", "KEYSLOT", key]),
            Value::Int(i64::from(key_slot(key.as_bytes()))),
            "{key}"
        );
    }
}

#[test]
fn cross_slot_requests_are_those_redis_refuses() {
    let redis = one_node_cluster();
    let mut c = redis.client();
    let (table, _) = table(&mut c);
    let mut rng = Rng::from_clock();
    let (mut cross, mut single) = (0, 0);
    for _ in 0..500 {
        let n = 1 + rng.below(3) as usize;
        let keys: Vec<Vec<u8>> = (0..n).map(|_| random_key(&mut rng)).collect();
        let mut words: Vec<&[u8]> = vec![b"MGET"];
        words.extend(keys.iter().map(|k| k.as_slice()));
        let mut buf = Vec::new();
        let mut ranges = Vec::new();
        for w in &words {
            let start = buf.len();
            buf.extend_from_slice(w);
            ranges.push(start..buf.len());
        }
        let slot = command_slot(Args::new(&buf, &ranges), Some(&table));
        match c.cmd_bin(&words) {
            Value::Error(e) if e.starts_with("CROSSSLOT") => {
                assert_eq!(slot, CommandSlot::CrossSlot, "{keys:?}");
                cross += 1;
            }
            Value::Array(_) => {
                assert_eq!(slot, CommandSlot::Slot(key_slot(&keys[0])), "{keys:?}");
                single += 1;
            }
            other => panic!("MGET {keys:?}: {other:?}"),
        }
    }
    assert!(cross > 0 && single > 0, "{cross} cross-slot, {single} not");
}
