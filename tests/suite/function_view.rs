//! The proxy's own function library is not part of what clients see of
//! Redis's functions. Once a queue operation has loaded it, a client's
//! `FUNCTION LIST`, `FUNCTION STATS`, `FUNCTION DUMP` and `FUNCTION DELETE`
//! (also inside `MULTI`, in RESP2 and RESP3, in both connection modes)
//! answer byte for byte as a Redis that never had it, and the script cache
//! (`SCRIPT FLUSH`, `number_of_cached_scripts`) is the client's alone.

use std::time::Duration;

use crate::common::*;

const CONFIG: &str = r#"
[[queue]]
pattern = "q:*"
lease_ms = 600000
"#;

/// Redis's own answer to a library's code: one function, so that its
/// replies do not depend on the order of a hash table (which differs
/// between two Redis processes).
const LIB1: &str =
    "#!lua name=lib1\nredis.register_function('f1', function(keys, args) return 1 end)";
const LIB2: &str = "#!lua name=lib2\nredis.register_function('f2', function(keys, args) return 2 end)\nredis.register_function{function_name='f3', callback=function(keys, args) return 3 end, flags={'no-writes'}}";

/// The pair, and a client straight to the Redis behind the proxy: what is
/// really there.
struct Viewed {
    pair: Pair,
    behind: Client,
}

impl std::ops::Deref for Viewed {
    type Target = Pair;

    fn deref(&self) -> &Pair {
        &self.pair
    }
}

impl std::ops::DerefMut for Viewed {
    fn deref_mut(&mut self) -> &mut Pair {
        &mut self.pair
    }
}

impl Viewed {
    /// A queue pop through the proxy (nothing to pop: nil, as directly),
    /// which goes as the proxy's script, and a `QUEUE INFO` through it
    /// alone, which calls the library and so loads it; checked in the
    /// Redis behind it, so that every comparison after it is made with the
    /// library there.
    fn pop_loads_library(&mut self) {
        self.same(&["RPOP", "q:1"]);
        let info = self.pair.proxied.cmd(&["QUEUE", "INFO", "q:1"]);
        assert!(!matches!(info, Value::Error(_)), "{info:?}");
        let ours = self
            .behind
            .cmd(&["FUNCTION", "LIST", "LIBRARYNAME", "ackproxy_*"]);
        assert!(
            matches!(&ours, Value::Array(libs) if libs.len() == 1),
            "the pop loaded the library: {ours:?}"
        );
    }

    fn library_name(&mut self) -> String {
        let libs = self
            .behind
            .cmd(&["FUNCTION", "LIST", "LIBRARYNAME", "ackproxy_*"]);
        let Value::Array(libs) = libs else {
            panic!("{libs:?}")
        };
        match field(&libs[0], "library_name") {
            Some(Value::Bulk(name)) => String::from_utf8(name).unwrap(),
            other => panic!("{other:?}"),
        }
    }
}

fn info_field(c: &mut Client, section: &str, name: &str) -> String {
    // A bulk string in RESP2, a verbatim one in RESP3: the lines are the same.
    let text = String::from_utf8(c.raw(&["INFO", section])).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("{name} in INFO {section}"))
        .to_string()
}

fn scenario(extra: &[&str], resp3: bool) {
    let a = Redis::start();
    let b = Redis::start();
    let proxy = Proxy::start_with_config(b.port, CONFIG, extra);
    let mut c = Viewed {
        pair: Pair::new(&a, &proxy),
        behind: b.client(),
    };
    if resp3 {
        // Its reply names the connection, which differs.
        c.each(&["HELLO", "3"]);
    }

    c.pop_loads_library();
    c.same(&["FUNCTION", "LIST"]);
    c.same(&["FUNCTION", "LIST", "WITHCODE"]);
    c.same(&["FUNCTION", "STATS"]);
    c.same(&["FUNCTION", "DUMP"]);

    c.same(&["FUNCTION", "LOAD", LIB1]);
    c.same(&["FUNCTION", "LIST"]);
    c.same(&["FUNCTION", "LIST", "WITHCODE", "LIBRARYNAME", "*"]);
    c.same(&["FUNCTION", "LIST", "LIBRARYNAME", "ackproxy*"]);
    c.same(&["FUNCTION", "STATS"]);
    let dump = c.same(&["FUNCTION", "DUMP"]);
    let ours = c.library_name();
    c.same(&["FUNCTION", "DELETE", &ours]);
    assert_eq!(c.library_name(), ours, "the library is still there");
    c.same(&["FCALL", "f1", "0"]);

    // The dump is the client's libraries alone: restored after a flush,
    // and next to the proxy's library again once a pop has loaded it.
    let Value::Bulk(payload) = decode(&dump).0 else {
        panic!("FUNCTION DUMP")
    };
    c.same(&["FUNCTION", "FLUSH"]);
    c.pop_loads_library();
    c.same(&["FUNCTION", "LIST"]);
    c.same_bin(&[b"FUNCTION", b"RESTORE", &payload]);
    c.same(&["FUNCTION", "LIST"]);
    c.same_bin(&[b"FUNCTION", b"RESTORE", &payload, b"REPLACE"]);
    c.same_bin(&[b"FUNCTION", b"RESTORE", &payload]);
    c.same_bin(&[b"FUNCTION", b"RESTORE", &payload, b"FLUSH"]);
    c.pop_loads_library();

    c.same(&["FUNCTION", "LOAD", LIB2]);
    c.same(&["FUNCTION", "STATS"]);
    c.same(&["FUNCTION", "DELETE", "lib2"]);

    // Inside a transaction, as elements of EXEC's reply.
    c.same(&["MULTI"]);
    c.same(&["FUNCTION", "LIST"]);
    c.same(&["FUNCTION", "STATS"]);
    c.same(&["FUNCTION", "DUMP"]);
    c.same(&["FUNCTION", "DELETE", &ours]);
    c.same(&["EXEC"]);

    // Pipelined with other requests: each reply in its place.
    let pipeline: Vec<u8> = [
        &["PING"][..],
        &["FUNCTION", "LIST"],
        &["FUNCTION", "STATS"],
        &["FUNCTION", "DUMP"],
        &["PING"],
    ]
    .iter()
    .flat_map(|args| {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        Client::encode(&a)
    })
    .collect();
    c.same_raw(&pipeline, 5);

    // The script cache holds what the client put there and nothing else,
    // whatever queue operations run.
    c.same(&["SCRIPT", "FLUSH"]);
    c.pop_loads_library();
    for c in [&mut c.pair.direct, &mut c.pair.proxied] {
        assert_eq!(info_field(c, "memory", "number_of_cached_scripts"), "0");
    }
    c.same(&["SCRIPT", "LOAD", "return 1"]);
    c.pop_loads_library();
    for c in [&mut c.pair.direct, &mut c.pair.proxied] {
        assert_eq!(info_field(c, "memory", "number_of_cached_scripts"), "1");
    }
    // The scripts are in the Redis behind, and their bytes are left out
    // of the memory Redis counts for the cache too. (used_memory_scripts
    // adds the functions' memory, which counts the library: see
    // docs/differences.md.)
    let behind = info_field(&mut c.behind, "memory", "number_of_cached_scripts");
    assert_ne!(behind, "1", "the proxy's scripts are cached behind it");
    let field = "used_memory_scripts_eval";
    let direct = info_field(&mut c.pair.direct, "memory", field);
    let proxied = info_field(&mut c.pair.proxied, "everything", field);
    assert_eq!(direct, proxied, "{field}");
}

#[test]
fn proxys_library_is_not_seen_multiplexed() {
    scenario(&[], false);
}

#[test]
fn proxys_library_is_not_seen_resp3() {
    scenario(&[], true);
}

#[test]
fn proxys_library_is_not_seen_dedicated_per_client() {
    scenario(&["--dedicated-per-client"], false);
}

/// While a client's function runs, Redis refuses `FUNCTION LIST` but
/// answers `FUNCTION STATS`: the proxy's share is then the one it saw last
/// (nothing can load or remove a library while the script runs).
#[test]
fn function_stats_during_a_busy_script_leaves_the_library_out() {
    let (b, proxy) = Proxy::with_redis(CONFIG);
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["RPOP", "q:1"]), Value::Nil);
    c.cmd(&["CONFIG", "SET", "busy-reply-threshold", "50"]);
    let looping = "#!lua name=busy\nredis.register_function('spin', function(keys, args) local i = 0 while true do i = i + 1 end end)";
    assert_eq!(c.cmd(&["FUNCTION", "LOAD", looping]), Value::bulk("busy"),);
    // Seen once with the library there.
    let stats = c.cmd(&["FUNCTION", "STATS"]);
    let counts = |stats: &Value| {
        let lua = field(&field(stats, "engines").unwrap(), "LUA").unwrap();
        (
            field(&lua, "libraries_count").unwrap(),
            field(&lua, "functions_count").unwrap(),
        )
    };
    assert_eq!(counts(&stats), (Value::Int(1), Value::Int(1)));

    let mut spinner = proxy.client();
    spinner.send(&["FCALL", "spin", "0"]);
    wait_until("the function runs", || {
        let mut probe = b.client();
        matches!(probe.cmd(&["PING"]), Value::Error(e) if e.starts_with("BUSY"))
    });
    let stats = c.cmd(&["FUNCTION", "STATS"]);
    assert_eq!(counts(&stats), (Value::Int(1), Value::Int(1)), "{stats:?}");
    let running = field(&stats, "running_script").unwrap();
    assert_eq!(field(&running, "name"), Some(Value::bulk("spin")));
    assert_eq!(c.cmd(&["FUNCTION", "KILL"]), Value::Simple("OK".into()));
    spinner.set_read_timeout(Some(Duration::from_secs(30)));
    assert!(matches!(spinner.read_value(), Value::Error(_)));
}

/// What redis-cli shows after `typed` in an interactive session with the
/// server on `port`: its hint for the command line, read from a terminal
/// (redis-cli writes hints only there), through a pseudo-terminal made by
/// Python's `pty`.
fn redis_cli_hint(port: u16, typed: &str) -> String {
    const SCRIPT: &str = r#"
import os, pty, select, sys, time
port, typed = sys.argv[1], sys.argv[2]
pid, fd = pty.fork()
if pid == 0:
    os.environ["TERM"] = "xterm"
    os.execvp("redis-cli", ["redis-cli", "-p", port])
def read(seconds):
    out, end = b"", time.time() + seconds
    while time.time() < end:
        if select.select([fd], [], [], 0.1)[0]:
            try:
                d = os.read(fd, 65536)
            except OSError:
                break
            out += d
            if b"\x1b[6n" in d:
                os.write(fd, b"\x1b[1;200R")
    return out
read(2.0)
for ch in typed:
    os.write(fd, ch.encode())
    time.sleep(0.05)
sys.stdout.write(read(1.0).decode(errors="replace"))
os.kill(pid, 9)
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", SCRIPT, &port.to_string(), typed])
        .output()
        .expect("python3");
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    // The hint is the grey text after the last thing typed.
    shown
        .rsplit("\x1b[0;90;49m")
        .next()
        .filter(|_| shown.contains("\x1b[0;90;49m"))
        .and_then(|h| h.split("\x1b[0m").next())
        .unwrap_or("")
        .trim()
        .to_string()
}

/// `COMMAND INFO` and `COMMAND DOCS` answer for the proxy's commands in
/// Redis's shape, so redis-cli hints them, and every other entry is
/// Redis's byte for byte, in RESP2 and RESP3.
#[test]
fn the_proxys_commands_are_in_the_command_table() {
    let (b, proxy) = Proxy::with_redis(CONFIG);
    for resp3 in [false, true] {
        // Compared with the Redis behind the proxy: the order of a
        // container's subcommands is a hash table's, which differs between
        // two Redis processes.
        let mut c = Pair::new(&b, &proxy);
        if resp3 {
            c.each(&["HELLO", "3"]);
        }
        // Names Redis knows (or does not), alone: untouched.
        c.same(&["COMMAND", "INFO", "get", "lpush", "nosuch"]);
        c.same(&["COMMAND", "DOCS", "lpos", "object", "nosuch"]);
        c.same(&["COMMAND", "INFO", "object|freq"]);

        // Ours beside Redis's, in the order asked: Redis's entries as
        // Redis gives them, ours in their place.
        let theirs = c.direct.raw(&["COMMAND", "INFO", "get", "nosuch"]);
        let Value::Array(theirs) = decode(&theirs).0 else {
            panic!("COMMAND INFO")
        };
        let mixed = c
            .proxied
            .raw(&["COMMAND", "INFO", "get", "ACK", "nosuch", "queue|push"]);
        let Value::Array(mixed) = decode(&mixed).0 else {
            panic!("COMMAND INFO through the proxy")
        };
        assert_eq!(mixed.len(), 4);
        assert_eq!(mixed[0], theirs[0]);
        assert_eq!(mixed[2], theirs[1]);
        for (entry, name, arity, first_key) in
            [(&mixed[1], "ack", -3, 1), (&mixed[3], "queue|push", -4, 2)]
        {
            let Value::Array(fields) = entry else {
                panic!("{entry:?}")
            };
            assert_eq!(fields.len(), 10, "{entry:?}");
            assert_eq!(fields[0], Value::bulk(name));
            assert_eq!(fields[1], Value::Int(arity));
            assert_eq!(fields[3], Value::Int(first_key));
        }
        let docs = c
            .proxied
            .raw(&["COMMAND", "DOCS", "nack", "lpos", "nosuch"]);
        let text = String::from_utf8_lossy(&docs);
        let lpos = text.find("lpos").expect("lpos's docs");
        let nack = text.find("nack").expect("nack's docs");
        assert!(nack < lpos, "in the order asked: {text}");
        assert!(text.contains("DELAY") && !text.contains("nosuch"), "{text}");

        // The whole table: Redis's, then ours.
        let all = c.proxied.raw(&["COMMAND", "DOCS"]);
        let direct = c.direct.raw(&["COMMAND", "DOCS"]);
        assert!(all.len() > direct.len());
        for name in ["ack", "nack", "queue", "queue|extend"] {
            assert!(
                String::from_utf8_lossy(&all).contains(&format!("\r\n{name}\r\n")),
                "{name} not in COMMAND DOCS"
            );
        }
        let info = c.proxied.raw(&["COMMAND", "INFO"]);
        let Value::Array(entries) = decode(&info).0 else {
            panic!("COMMAND INFO")
        };
        let Value::Array(redis) = decode(&c.direct.raw(&["COMMAND", "INFO"])).0 else {
            panic!("COMMAND INFO")
        };
        assert_eq!(entries.len(), redis.len() + 3);
    }

    // redis-cli's hints come from COMMAND DOCS: the proxy's commands get
    // them through the proxy, and have none straight on Redis.
    assert_eq!(redis_cli_hint(proxy.port, "ACK "), "queue id [id ...]");
    assert_eq!(
        redis_cli_hint(proxy.port, "QUEUE PUSH "),
        "queue payload [payload ...] [DELAY ms|AT unix-time-milliseconds]"
    );
    assert_eq!(redis_cli_hint(b.port, "ACK "), "");
    assert_eq!(
        redis_cli_hint(proxy.port, "LPOS "),
        redis_cli_hint(b.port, "LPOS ")
    );
}
