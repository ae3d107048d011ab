//! Queue semantics through the proxy: pop replies byte-identical to Redis,
//! leases, ACK/NACK/EXTEND, redelivery, dead letters, move forms, parked
//! blocking pops and their wake-up latency.

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::*;

// ---------------------------------------------------------------- helpers

/// Long leases: nothing expires while a test looks at it.
const STABLE_CONFIG: &str = r#"
[[queue]]
pattern = "q*"
lease_ms = 600000
max_deliveries = 3
ack_id = "payload"
redeliver = "next"
pop_end = "right"

[reaper]
interval_ms = 50
"#;

/// Short leases for the lifecycle tests.
const LIFECYCLE_CONFIG: &str = r#"
[[queue]]
pattern = "q*"
lease_ms = 200
max_deliveries = 3
ack_id = "payload"
redeliver = "next"
pop_end = "right"

[[queue]]
pattern = "l*"
lease_ms = 200
max_deliveries = 3
ack_id = "payload"
redeliver = "last"
pop_end = "right"

[[queue]]
pattern = "j*"
lease_ms = 200
max_deliveries = 3
ack_id = "json:id"
redeliver = "next"
pop_end = "right"

[[queue]]
pattern = "w*"
lease_ms = 600000
max_deliveries = 3
ack_id = "payload"
redeliver = "next"
pop_end = "right"

[reaper]
interval_ms = 50
"#;

/// Lease plus a comfortable margin for the reaper (interval 50 ms).
const EXPIRE_WAIT: Duration = Duration::from_millis(500);

fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).replace("\r\n", "\\r\\n")
}

fn as_str(v: &Value) -> String {
    match v {
        Value::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
        Value::Simple(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        Value::Error(e) => format!("-{e}"),
        Value::Nil => "(nil)".into(),
        other => format!("{other:?}"),
    }
}

fn as_int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        Value::Bulk(b) => String::from_utf8_lossy(b)
            .parse()
            .unwrap_or_else(|_| panic!("not an integer: {v:?}")),
        Value::Simple(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("not an integer: {v:?}")),
        Value::Other(raw) if raw.first() == Some(&b',') => {
            String::from_utf8_lossy(&raw[1..raw.len() - 2])
                .parse::<f64>()
                .unwrap() as i64
        }
        other => panic!("not an integer: {other:?}"),
    }
}

fn info_int(p: &Proxy, q: &str, field: &str) -> i64 {
    as_int(&queue_info_field(p, q, field))
}

/// The keys matching `pattern`, but the queues' totals (see
/// `is_queue_stats`).
fn keys(c: &mut Client, pattern: &str) -> Vec<String> {
    match c.cmd(&["KEYS", pattern]) {
        Value::Array(items) => {
            let mut k: Vec<String> = items
                .iter()
                .map(as_str)
                .filter(|k| !is_queue_stats(k))
                .collect();
            k.sort();
            k
        }
        other => panic!("KEYS: {other:?}"),
    }
}

/// Waits (bounded) until Redis holds no auxiliary `ackq:` key.
fn assert_no_aux_keys(direct: &mut Client, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let k = keys(direct, "ackq:*");
        if k.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "auxiliary keys left behind: {k:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

fn hello3(c: &mut Client) {
    let r = c.cmd(&["HELLO", "3"]);
    assert!(matches!(r, Value::Array(_)), "HELLO 3: {r:?}");
}

// ------------------------------------------------- byte-identity per form

struct Case {
    /// Commands run on both sides first (`{q}` queue key, `{q2}` second queue
    /// key, `{x}`/`{x2}` plain keys, `{d}` destination).
    setup: &'static [&'static str],
    cmd: &'static str,
    /// Expected leases on (key, count) after the command.
    leased: &'static [(&'static str, i64)],
}

const FILL: &str = "RPUSH {q} a b c d e";

fn cases() -> Vec<Case> {
    macro_rules! c {
        ([$($s:expr),*], $cmd:expr, [$(($k:expr, $n:expr)),*]) => {
            Case { setup: &[$($s),*], cmd: $cmd, leased: &[$(($k, $n)),*] }
        };
    }
    vec![
        // RPOP / LPOP
        c!([FILL], "RPOP {q}", [("{q}", 1)]),
        c!([FILL], "RPOP {q} 1", [("{q}", 1)]),
        c!([FILL], "RPOP {q} 2", [("{q}", 2)]),
        c!([FILL], "RPOP {q} 10", [("{q}", 5)]),
        c!([FILL], "RPOP {q} 0", [("{q}", 0)]),
        c!([FILL], "LPOP {q}", [("{q}", 1)]),
        c!([FILL], "LPOP {q} 3", [("{q}", 3)]),
        c!([FILL], "LPOP {q} 10", [("{q}", 5)]),
        c!([], "RPOP {q}", [("{q}", 0)]),
        c!([], "RPOP {q} 2", [("{q}", 0)]),
        c!([], "LPOP {q}", [("{q}", 0)]),
        c!([], "LPOP {q} 1", [("{q}", 0)]),
        // BRPOP / BLPOP, single and several keys
        c!([FILL], "BRPOP {q} 0", [("{q}", 1)]),
        c!([FILL], "BLPOP {q} 0", [("{q}", 1)]),
        c!([FILL], "BRPOP {q} 1.5", [("{q}", 1)]),
        c!([FILL], "BRPOP {x} {q} 0", [("{q}", 1)]),
        c!([FILL, "RPUSH {x} x1 x2"], "BRPOP {q} {x} 0", [("{q}", 1)]),
        c!([FILL, "RPUSH {x} x1 x2"], "BRPOP {x} {q} 0", [("{q}", 0)]),
        c!([FILL, "RPUSH {x} x1 x2"], "BLPOP {x} {q} 0", [("{q}", 0)]),
        c!([FILL], "BLPOP {x} {x2} {q} 0", [("{q}", 1)]),
        c!(
            ["RPUSH {q2} m n"],
            "BRPOP {q} {q2} 0",
            [("{q}", 0), ("{q2}", 1)]
        ),
        c!(
            ["RPUSH {q2} m n"],
            "BLPOP {x} {q} {q2} {x2} 0",
            [("{q}", 0), ("{q2}", 1)]
        ),
        c!([], "BRPOP {q} 0.1", [("{q}", 0)]),
        c!([], "BLPOP {x} {q} 0.1", [("{q}", 0)]),
        // move forms
        c!([FILL], "RPOPLPUSH {q} {d}", [("{q}", 1)]),
        c!([FILL, "RPUSH {d} z"], "RPOPLPUSH {q} {d}", [("{q}", 1)]),
        c!([], "RPOPLPUSH {q} {d}", [("{q}", 0)]),
        c!([FILL], "BRPOPLPUSH {q} {d} 0", [("{q}", 1)]),
        c!([], "BRPOPLPUSH {q} {d} 0.1", [("{q}", 0)]),
        c!(
            [FILL, "RPUSH {d} z"],
            "LMOVE {q} {d} LEFT RIGHT",
            [("{q}", 1)]
        ),
        c!(
            [FILL, "RPUSH {d} z"],
            "LMOVE {q} {d} RIGHT LEFT",
            [("{q}", 1)]
        ),
        c!(
            [FILL, "RPUSH {d} z"],
            "LMOVE {q} {d} LEFT LEFT",
            [("{q}", 1)]
        ),
        c!(
            [FILL, "RPUSH {d} z"],
            "LMOVE {q} {d} RIGHT RIGHT",
            [("{q}", 1)]
        ),
        c!([], "LMOVE {q} {d} LEFT RIGHT", [("{q}", 0)]),
        c!(
            [FILL, "RPUSH {d} z"],
            "BLMOVE {q} {d} RIGHT LEFT 0",
            [("{q}", 1)]
        ),
        c!([FILL], "BLMOVE {q} {d} LEFT RIGHT 0.5", [("{q}", 1)]),
        c!([], "BLMOVE {q} {d} RIGHT LEFT 0.1", [("{q}", 0)]),
        // LMPOP / BLMPOP
        c!([FILL], "LMPOP 1 {q} LEFT", [("{q}", 1)]),
        c!([FILL], "LMPOP 1 {q} RIGHT COUNT 3", [("{q}", 3)]),
        c!([FILL], "LMPOP 1 {q} LEFT COUNT 10", [("{q}", 5)]),
        c!([FILL], "LMPOP 2 {x} {q} RIGHT COUNT 2", [("{q}", 2)]),
        c!(
            [FILL, "RPUSH {x} x1 x2"],
            "LMPOP 2 {x} {q} LEFT",
            [("{q}", 0)]
        ),
        c!(
            [FILL, "RPUSH {x} x1 x2"],
            "LMPOP 2 {q} {x} LEFT COUNT 2",
            [("{q}", 2)]
        ),
        c!(
            ["RPUSH {q2} m n"],
            "LMPOP 3 {q} {x} {q2} RIGHT COUNT 5",
            [("{q}", 0), ("{q2}", 2)]
        ),
        c!([], "LMPOP 1 {q} LEFT", [("{q}", 0)]),
        c!([FILL], "BLMPOP 0 1 {q} LEFT", [("{q}", 1)]),
        c!([FILL], "BLMPOP 0 2 {x} {q} RIGHT COUNT 2", [("{q}", 2)]),
        c!([FILL], "BLMPOP 1.5 1 {q} RIGHT COUNT 9", [("{q}", 5)]),
        c!([], "BLMPOP 0.1 1 {q} LEFT", [("{q}", 0)]),
        c!([], "BLMPOP 0.1 2 {x} {q} LEFT COUNT 3", [("{q}", 0)]),
    ]
}

/// Argument errors and wrong types on queue keys.
fn error_cases() -> Vec<Case> {
    macro_rules! e {
        ([$($s:expr),*], $cmd:expr) => {
            Case { setup: &[$($s),*], cmd: $cmd, leased: &[("{q}", 0)] }
        };
    }
    vec![
        e!([FILL], "RPOP {q} -1"),
        e!([FILL], "RPOP {q} abc"),
        e!([FILL], "LPOP {q} 1 2"),
        e!([FILL], "BRPOP {q} -1"),
        e!([FILL], "BRPOP {q} abc"),
        e!([FILL], "BLPOP {q}"),
        e!([FILL], "LMOVE {q} {d} UP DOWN"),
        e!([FILL], "BLMOVE {q} {d} LEFT RIGHT -1"),
        e!([FILL], "LMPOP 0 {q} LEFT"),
        e!([FILL], "LMPOP 1 {q} MIDDLE"),
        e!([FILL], "LMPOP 2 {q} LEFT"),
        e!([FILL], "LMPOP 1 {q} LEFT COUNT 0"),
        e!([FILL], "BLMPOP 0 1 {q} LEFT COUNT -2"),
        e!(["SET {q} str"], "RPOP {q}"),
        e!(["SET {q} str"], "LPOP {q} 2"),
        e!(["SET {q} str"], "BRPOP {q} 0"),
        e!(["SET {q} str"], "RPOPLPUSH {q} {d}"),
        e!([FILL, "SET {d} str"], "RPOPLPUSH {q} {d}"),
        e!([FILL, "SET {d} str"], "LMOVE {q} {d} LEFT LEFT"),
        // An empty source moves nothing: the destination's type is not
        // looked at.
        e!(["SET {d} str"], "RPOPLPUSH {q} {d}"),
        e!(["SET {d} str"], "LMOVE {q} {d} LEFT RIGHT"),
        e!(["SET {d} str"], "BRPOPLPUSH {q} {d} 0.1"),
        e!(["SET {q} str"], "LMPOP 1 {q} LEFT"),
    ]
}

fn subst(s: &str, tag: &str) -> String {
    s.replace("{q2}", &format!("qb{tag}"))
        .replace("{q}", &format!("q{tag}"))
        .replace("{x2}", &format!("xb{tag}"))
        .replace("{x}", &format!("x{tag}"))
        .replace("{d}", &format!("d{tag}"))
}

const ALL_KEYS: [&str; 5] = ["{q}", "{q2}", "{x}", "{x2}", "{d}"];

/// One command on a connection that may fail; never panics.
fn try_raw(c: &mut Client, args: &[&str]) -> Result<Vec<u8>, String> {
    use std::io::Write;
    let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
    let mut s: &std::net::TcpStream = c.stream();
    s.write_all(&Client::encode(&a))
        .map_err(|e| format!("write: {e}"))?;
    c.try_read_raw().map_err(|e| format!("no reply ({e})"))
}

/// Runs every case against the proxy (queue rules on `q*`) and a plain
/// Redis; returns a description of every difference.
fn run_identity(cases: &[Case], resp3: bool, label: &str) -> Vec<String> {
    let redis_q = Redis::start();
    let redis_plain = Redis::start();
    let proxy = Proxy::start_with_config(redis_q.port, STABLE_CONFIG, &[]);
    let connect = || {
        let mut c = proxy.client();
        c.set_read_timeout(Some(Duration::from_secs(10)));
        if resp3 {
            hello3(&mut c);
        }
        c
    };
    let mut px = connect();
    // Setup and list contents are read straight from the proxy's Redis.
    let mut behind = redis_q.client();
    let mut plain = redis_plain.client();
    if resp3 {
        hello3(&mut plain);
        hello3(&mut behind);
    }
    let proto = if resp3 { "RESP3" } else { "RESP2" };
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let tag = format!("{label}{i}");
        for s in case.setup {
            let s = subst(s, &tag);
            let args: Vec<&str> = s.split(' ').collect();
            let a = behind.raw(&args);
            let b = plain.raw(&args);
            assert_eq!(show(&a), show(&b), "setup {s}");
        }
        let cmd = subst(case.cmd, &tag);
        let args: Vec<&str> = cmd.split(' ').collect();
        let t = Instant::now();
        let got = try_raw(&mut px, &args);
        let took_proxy = t.elapsed();
        let t = Instant::now();
        let want = plain.raw(&args);
        let took_plain = t.elapsed();
        let got = match got {
            Ok(g) => g,
            Err(e) => {
                failures.push(format!(
                    "[{proto}] {cmd}\n    expected: {}\n    got:      {e}",
                    show(&want)
                ));
                px = connect();
                continue;
            }
        };
        if got != want {
            failures.push(format!(
                "[{proto}] {cmd}\n    expected: {}\n    got:      {}",
                show(&want),
                show(&got)
            ));
        }
        match try_raw(&mut px, &["PING"]) {
            Ok(r) if r == b"+PONG\r\n" => {}
            other => {
                failures.push(format!(
                    "[{proto}] PING after {cmd}: expected +PONG, got {:?}",
                    other.map(|r| show(&r))
                ));
                px = connect();
            }
        }
        // Blocking timeouts (0.1 s in these cases) must not end early, nor
        // much later than Redis's (which checks timeouts at `hz` 10, so may
        // itself be up to 100 ms late).
        if took_plain >= Duration::from_millis(95)
            && (took_proxy < Duration::from_millis(95)
                || took_proxy > took_plain + Duration::from_millis(150))
        {
            failures.push(format!(
                "[{proto}] {cmd}: timeout took {took_proxy:?} through the proxy, {took_plain:?} on Redis"
            ));
        }
        for k in ALL_KEYS {
            let key = subst(k, &tag);
            let a = behind.raw(&["TYPE", &key]);
            let b = plain.raw(&["TYPE", &key]);
            if a != b {
                failures.push(format!(
                    "[{proto}] after {cmd}: TYPE {key}: expected {} got {}",
                    show(&b),
                    show(&a)
                ));
                continue;
            }
            if a.starts_with(b"+list") {
                let a = lrange(&mut behind, &key);
                let b = lrange(&mut plain, &key);
                if a != b {
                    failures.push(format!(
                        "[{proto}] after {cmd}: LRANGE {key}: expected {b:?} got {a:?}"
                    ));
                }
            }
        }
        for (k, n) in case.leased {
            let key = subst(k, &tag);
            let reply = match try_raw(&mut connect(), &["QUEUE", "INFO", &key]) {
                Ok(r) => decode(&r).0,
                Err(e) => {
                    failures.push(format!("[{proto}] after {cmd}: QUEUE INFO {key}: {e}"));
                    continue;
                }
            };
            let leased = match &reply {
                Value::Array(items) if items.len() % 2 == 0 => {
                    fields(&reply).get("leased").map(as_int)
                }
                _ => None,
            };
            if leased != Some(*n) {
                failures.push(format!(
                    "[{proto}] after {cmd}: QUEUE INFO {key} leased: expected {n}, got {leased:?} (reply {reply:?})"
                ));
            }
            if let Some(l) = leased {
                if l > 0 {
                    let ls = queue_leases(&proxy, &key);
                    if ls.len() as i64 != l {
                        failures.push(format!(
                            "[{proto}] after {cmd}: QUEUE LEASES {key} has {} entries, INFO says {l}",
                            ls.len()
                        ));
                    }
                }
            }
        }
    }
    failures
}

fn report(failures: Vec<String>) {
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("{f}");
        }
        panic!(
            "{} differences from Redis:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}

#[test]
fn pop_forms_identical_resp2() {
    report(run_identity(&cases(), false, "r2_"));
}

#[test]
fn pop_forms_identical_resp3() {
    report(run_identity(&cases(), true, "r3_"));
}

#[test]
fn pop_errors_identical() {
    let mut f = run_identity(&error_cases(), false, "e2_");
    f.extend(run_identity(&error_cases(), true, "e3_"));
    report(f);
}

#[test]
fn leases_fields() {
    let (_redis, proxy) = Proxy::with_redis(STABLE_CONFIG);
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "qf", "m1"]);
    assert_eq!(c.cmd(&["RPOPLPUSH", "qf", "doing"]), Value::bulk("m1"));
    let ls = queue_leases(&proxy, "qf");
    assert_eq!(ls.len(), 1, "{ls:?}");
    let l = &ls[0];
    for f in [
        "id",
        "payload",
        "deliveries",
        "expires-in-ms",
        "destination",
    ] {
        assert!(l.contains_key(f), "lease has no {f:?}: {l:?}");
    }
    assert_eq!(as_str(&l["id"]), "m1");
    assert_eq!(as_str(&l["payload"]), "m1");
    assert_eq!(as_int(&l["deliveries"]), 1);
    let exp = as_int(&l["expires-in-ms"]);
    assert!(exp > 590_000 && exp <= 600_000, "expires-in-ms {exp}");
    assert_eq!(as_str(&l["destination"]), "doing");

    let i = queue_info(&proxy, "qf");
    for f in [
        "ready",
        "leased",
        "dead",
        "oldest-lease-age-ms",
        "requeued",
        "lease-ms",
        "max-deliveries",
        "dead-letter-key",
    ] {
        assert!(i.contains_key(f), "QUEUE INFO has no {f:?}: {i:?}");
    }
    assert_eq!(as_int(&i["ready"]), 0);
    assert_eq!(as_int(&i["leased"]), 1);
    assert_eq!(as_int(&i["dead"]), 0);
    assert_eq!(as_int(&i["lease-ms"]), 600_000);
    assert_eq!(as_int(&i["max-deliveries"]), 3);
    assert_eq!(as_str(&i["dead-letter-key"]), "{qf}:dead");
    assert!(as_int(&i["oldest-lease-age-ms"]) < 5_000);

    // COUNT limits the listing.
    c.cmd(&["LPUSH", "qf", "m2", "m3", "m4"]);
    assert_eq!(
        c.cmd(&["RPOP", "qf", "3"]),
        Value::bulks(&["m2", "m3", "m4"])
    );
    match c.cmd(&["QUEUE", "LEASES", "qf", "COUNT", "2"]) {
        Value::Array(items) => assert_eq!(items.len(), 2),
        other => panic!("QUEUE LEASES qf COUNT 2: {other:?}"),
    }
    assert_eq!(queue_leases(&proxy, "qf").len(), 4);

    // RESP3: maps.
    let mut c3 = proxy.client();
    hello3(&mut c3);
    let raw = c3.raw(&["QUEUE", "INFO", "qf"]);
    assert_eq!(
        raw[0],
        b'%',
        "QUEUE INFO in RESP3 should be a map: {}",
        show(&raw)
    );
    let raw = c3.raw(&["QUEUE", "LEASES", "qf"]);
    assert_eq!(raw[0], b'*', "QUEUE LEASES in RESP3: {}", show(&raw));
    let (v, _) = decode(&raw);
    let after_header = raw.iter().position(|&b| b == b'\n').unwrap() + 1;
    assert_eq!(
        raw[after_header],
        b'%',
        "each lease in RESP3 should be a map: {}",
        show(&raw)
    );
    match v {
        Value::Array(items) => assert_eq!(items.len(), 4),
        other => panic!("{other:?}"),
    }
}

// ------------------------------------------------------- synthetic commands

/// Every queue reply keeps the connection usable: the next command on the
/// same connection is answered.
#[test]
fn connection_survives_queue_replies() {
    let (_redis, proxy) = Proxy::with_redis(STABLE_CONFIG);
    let mut failures = Vec::new();
    for resp3 in [false, true] {
        let proto = if resp3 { "RESP3" } else { "RESP2" };
        let mut c = proxy.client();
        c.set_read_timeout(Some(Duration::from_secs(5)));
        if resp3 {
            hello3(&mut c);
        }
        let p = if resp3 { "qs3" } else { "qs2" };
        let steps: Vec<Vec<String>> = [
            "LPUSH {p} a b c d e f g h",
            "RPOP {p}",
            "RPOP {p} 2",
            "BRPOP {p} 0",
            "LMPOP 1 {p} LEFT COUNT 2",
            "BLMPOP 0 1 {p} RIGHT",
            "RPOPLPUSH {p} dst{p}",
            "LMOVE {p} dst{p} LEFT RIGHT",
            "QUEUE INFO {p}",
            "QUEUE LEASES {p}",
            "QUEUE LEASES {p} COUNT 1",
            "QUEUE HELP",
            "QUEUE EXTEND {p} a 1000",
            "NACK {p} a",
            "ACK {p} b c",
            "ACK {p} nope",
            "ACK plain x",
            "ACK {p}",
            "SET str{p} x",
            "RPOP str{p}",
            "LPOP str{p} 2",
        ]
        .iter()
        .map(|t| t.replace("{p}", p).split(' ').map(String::from).collect())
        .collect();
        // Each step on a fresh connection, so that one reply's effect on the
        // connection is not hidden by the replies before it.
        for step in &steps {
            c = proxy.client();
            c.set_read_timeout(Some(Duration::from_secs(5)));
            if resp3 {
                hello3(&mut c);
            }
            let args: Vec<&str> = step.iter().map(|s| s.as_str()).collect();
            let got = try_raw(&mut c, &args);
            let ping = try_raw(&mut c, &["PING"]);
            if got.is_err() || !matches!(&ping, Ok(r) if r == b"+PONG\r\n") {
                failures.push(format!(
                    "[{proto}] {}: reply {:?}, then PING got {:?}",
                    step.join(" "),
                    got.map(|r| show(&r)),
                    ping.map(|r| show(&r))
                ));
            }
        }
    }
    report(failures);
}

#[test]
fn synthetic_command_errors() {
    let (_redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    let nomatch = |k: &str| format!("-ERR no queue rule matches key '{k}'\r\n");
    let mut failures = Vec::new();
    let mut check = |c: &mut Client, args: &[&str], want: String| {
        let got = c.raw(args);
        if show(&got) != show(want.as_bytes()) {
            failures.push(format!(
                "{}\n    expected: {}\n    got:      {}",
                args.join(" "),
                show(want.as_bytes()),
                show(&got)
            ));
        }
    };
    check(&mut c, &["ACK", "plain", "x"], nomatch("plain"));
    check(&mut c, &["NACK", "plain", "x"], nomatch("plain"));
    check(&mut c, &["QUEUE", "INFO", "plain"], nomatch("plain"));
    check(&mut c, &["QUEUE", "LEASES", "plain"], nomatch("plain"));
    check(
        &mut c,
        &["QUEUE", "EXTEND", "plain", "x", "100"],
        nomatch("plain"),
    );
    check(
        &mut c,
        &["ACK", "q"],
        "-ERR wrong number of arguments for 'ack' command\r\n".into(),
    );
    check(
        &mut c,
        &["ACK"],
        "-ERR wrong number of arguments for 'ack' command\r\n".into(),
    );
    check(
        &mut c,
        &["ack", "q"],
        "-ERR wrong number of arguments for 'ack' command\r\n".into(),
    );
    check(
        &mut c,
        &["NACK", "q"],
        "-ERR wrong number of arguments for 'nack' command\r\n".into(),
    );
    check(&mut c, &["ACK", "q", "unknown"], ":0\r\n".into());
    check(&mut c, &["ACK", "q", "u1", "u2", "u3"], ":0\r\n".into());
    check(&mut c, &["NACK", "q", "unknown"], ":0\r\n".into());
    check(
        &mut c,
        &["QUEUE", "EXTEND", "q", "unknown", "1000"],
        ":0\r\n".into(),
    );
    // The connection still works after all that.
    check(&mut c, &["PING"], "+PONG\r\n".into());
    report(failures);

    match c.cmd(&["QUEUE", "HELP"]) {
        Value::Array(lines) => {
            assert!(!lines.is_empty());
            for l in &lines {
                assert!(
                    matches!(l, Value::Simple(_)),
                    "QUEUE HELP line is not a status: {l:?}"
                );
            }
        }
        other => panic!("QUEUE HELP: {other:?}"),
    }
}

// ------------------------------------------------------------- lifecycle

#[test]
fn unacked_message_is_redelivered() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "q", "m1"]);
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::bulk("m1"));
    let ls = queue_leases(&proxy, "q");
    assert_eq!(ls.len(), 1);
    assert_eq!(as_int(&ls[0]["deliveries"]), 1);
    assert_eq!(info_int(&proxy, "q", "ready"), 0);
    assert_eq!(info_int(&proxy, "q", "leased"), 1);
    // Still leased just before the deadline.
    thread::sleep(Duration::from_millis(100));
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::Nil);
    // Back in the list after the lease, nobody popping.
    thread::sleep(EXPIRE_WAIT);
    assert_eq!(lrange(&mut redis.client(), "q"), vec!["m1"]);
    assert_eq!(info_int(&proxy, "q", "ready"), 1);
    assert_eq!(info_int(&proxy, "q", "leased"), 0);
    assert!(info_int(&proxy, "q", "requeued") >= 1);
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::bulk("m1"));
    let ls = queue_leases(&proxy, "q");
    assert_eq!(ls.len(), 1);
    assert_eq!(as_int(&ls[0]["deliveries"]), 2);
    assert_eq!(c.cmd(&["ACK", "q", "m1"]), Value::Int(1));
    assert_no_aux_keys(&mut redis.client(), Duration::from_secs(2));
}

#[test]
fn acked_message_is_gone_without_aux_keys() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "q", "m1", "m2", "m3"]);
    assert_eq!(
        c.cmd(&["RPOP", "q", "3"]),
        Value::bulks(&["m1", "m2", "m3"])
    );
    assert_eq!(c.cmd(&["ACK", "q", "m1"]), Value::Int(1));
    assert_eq!(
        c.cmd(&["ACK", "q", "m1"]),
        Value::Int(0),
        "second ACK is idempotent"
    );
    assert_eq!(c.cmd(&["ACK", "q", "m2", "m3", "nope"]), Value::Int(2));
    assert_eq!(info_int(&proxy, "q", "leased"), 0);
    thread::sleep(EXPIRE_WAIT);
    assert_eq!(
        c.cmd(&["RPOP", "q"]),
        Value::Nil,
        "an acked message came back"
    );
    assert_eq!(info_int(&proxy, "q", "ready"), 0);
    assert_no_aux_keys(&mut redis.client(), Duration::from_secs(2));
    assert_eq!(
        keys(&mut redis.client(), "*"),
        Vec::<String>::new(),
        "keys left after everything was acked"
    );
}

/// The commands Redis ran while `f` did, as `MONITOR` shows them: the name
/// in upper case, and a function's name after `FCALL`.
fn commands_run(redis: &Redis, f: impl FnOnce()) -> Vec<String> {
    let mut monitor = redis.client();
    assert_eq!(monitor.cmd(&["MONITOR"]), Value::Simple("OK".into()));
    f();
    redis.client().cmd(&["ECHO", "commands-run-end"]);
    let mut out = Vec::new();
    loop {
        let Value::Simple(line) = monitor.read_value() else {
            panic!("MONITOR");
        };
        if line.contains("commands-run-end") {
            return out;
        }
        let Some(at) = line.find("] \"") else {
            continue;
        };
        let args: Vec<&str> = line[at + 3..].split("\" \"").collect();
        let name = args[0].trim_end_matches('"').to_uppercase();
        match (name.as_str(), args.get(1)) {
            ("FCALL", Some(f)) => out.push(format!("FCALL {}", f.trim_end_matches('"'))),
            _ => out.push(name),
        }
    }
}

fn acked_by_library(ran: &[String]) -> bool {
    called(ran, "ack")
}

/// Whether the commands `ran` include the library's function `op` (the
/// proxy's reaper calls others meanwhile, so each test names its own).
fn called(ran: &[String], op: &str) -> bool {
    let name = format!("FCALL ackq_{op}_");
    ran.iter().any(|c| c.starts_with(&name))
}

#[test]
fn an_ack_of_a_lease_handed_out_here_is_two_commands_in_redis() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    let (a, b) = (r#"{"id":"a","n":1}"#, r#"{"id":"b","n":2}"#);
    c.cmd(&["LPUSH", "jobs", a, b]);
    assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::bulk(a));
    let ran = commands_run(&redis, || {
        assert_eq!(c.cmd(&["ACK", "jobs", "a"]), Value::Int(1));
    });
    assert!(!acked_by_library(&ran), "{ran:?}");
    for cmd in ["ZREM", "HDEL"] {
        assert!(ran.iter().any(|c| c == cmd), "{cmd} in {ran:?}");
    }
    assert!(ran.iter().any(|c| c == "EVALSHA" || c == "EVAL"), "{ran:?}");
    // An id released already goes to the library, which knows it is none.
    let ran = commands_run(&redis, || {
        assert_eq!(c.cmd(&["ACK", "jobs", "a"]), Value::Int(0));
    });
    assert!(acked_by_library(&ran), "{ran:?}");
    // A Redis that lost the script is given its text again.
    assert_eq!(
        redis.client().cmd(&["SCRIPT", "FLUSH"]),
        Value::Simple("OK".into())
    );
    assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::bulk(b));
    assert_eq!(c.cmd(&["ACK", "jobs", "b"]), Value::Int(1));
    assert_eq!(info_int(&proxy, "jobs", "acks"), 2);
    assert_eq!(info_int(&proxy, "jobs", "leased"), 0);
    assert_no_aux_keys(&mut redis.client(), Duration::from_secs(2));
}

/// Queues `np*` acknowledged by the connection's next pop, JSON ids.
fn next_pop_config(lease_ms: u64) -> String {
    format!(
        "[[queue]]\npattern = \"np*\"\nlease_ms = {lease_ms}\nack_id = \"json:id\"\nack = \"next-pop\"\n"
    )
}

/// A next-pop worker's pop of one is one script, not the library's
/// function: it acknowledges the connection's earlier lease and leases the
/// next one as the library would, so that the library's own calls (a late
/// acknowledgement here) know it.
#[test]
fn a_next_pop_pop_of_one_is_one_script_in_redis() {
    let config = next_pop_config(200) + "\n[reaper]\ninterval_ms = 50\n";
    let (redis, proxy) = Proxy::with_redis(&config);
    let mut c = proxy.client();
    let (a, b, d) = (r#"{"id":"a"}"#, r#"{"id":"b"}"#, r#"{"id":"d"}"#);
    c.cmd(&["LPUSH", "np", a, b, d]);
    let ran = commands_run(&redis, || {
        assert_eq!(c.cmd(&["RPOP", "np"]), Value::bulk(a));
        assert_eq!(c.cmd(&["RPOP", "np"]), Value::bulk(b));
    });
    assert!(!called(&ran, "pop"), "{ran:?}");
    assert!(ran.iter().any(|c| c == "EVALSHA" || c == "EVAL"), "{ran:?}");
    assert_eq!(info_int(&proxy, "np", "acks"), 1);
    assert_eq!(info_int(&proxy, "np", "leased"), 1);
    // b's lease runs out and its message is back: the connection's next
    // pop calls that copy back (a late acknowledgement) and takes d.
    thread::sleep(EXPIRE_WAIT);
    let ran = commands_run(&redis, || {
        assert_eq!(c.cmd(&["RPOP", "np"]), Value::bulk(d));
    });
    assert!(called(&ran, "pop"), "{ran:?}");
    assert_eq!(info_int(&proxy, "np", "late-acks"), 1);
    assert_eq!(c.cmd(&["RPOP", "np"]), Value::Nil);
    assert_eq!(info_int(&proxy, "np", "acks"), 2);
    assert_eq!(info_int(&proxy, "np", "leased"), 0);
    assert_no_aux_keys(&mut redis.client(), Duration::from_secs(2));
}

/// The classic reliable queue, BRPOPLPUSH then LREM of the copy, is one
/// script each in Redis, not the library's functions, and leaves the
/// state the library leaves: a pipelined move pop (the library's) and a
/// scripted one are released alike, duplicates of one id included.
#[test]
fn a_move_pop_of_one_and_its_lrem_are_one_script_each_in_redis() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "w", "a", "b", "a"]);
    let ran = commands_run(&redis, || {
        assert_eq!(c.cmd(&["BRPOPLPUSH", "w", "doing", "1"]), Value::bulk("a"));
    });
    assert!(!called(&ran, "pop"), "{ran:?}");
    assert!(ran.iter().any(|c| c == "LMOVE"), "{ran:?}");
    // Pipelined behind a PING: the library's pop.
    let mut both = Client::encode(&[b"RPOPLPUSH", b"w", b"doing"]);
    both.extend(Client::encode(&[b"PING"]));
    c.send_raw(&both);
    assert_eq!(c.read_value(), Value::bulk("b"));
    assert_eq!(c.read_value(), Value::Simple("PONG".into()));
    assert_eq!(c.cmd(&["RPOPLPUSH", "w", "doing"]), Value::bulk("a"));
    assert_eq!(info_int(&proxy, "w", "leased"), 3);
    let ran = commands_run(&redis, || {
        assert_eq!(c.cmd(&["LREM", "doing", "0", "a"]), Value::Int(2));
    });
    assert!(!called(&ran, "lrem"), "{ran:?}");
    assert!(ran.iter().any(|c| c == "LREM"), "{ran:?}");
    assert_eq!(info_int(&proxy, "w", "leased"), 1);
    assert_eq!(c.cmd(&["LREM", "doing", "1", "b"]), Value::Int(1));
    assert_eq!(c.cmd(&["LREM", "doing", "1", "b"]), Value::Int(0));
    assert_eq!(info_int(&proxy, "w", "leased"), 0);
    assert_eq!(info_int(&proxy, "w", "acks"), 3);
    assert_eq!(c.cmd(&["LLEN", "doing"]), Value::Int(0));
    assert_no_aux_keys(&mut redis.client(), Duration::from_secs(2));
}

/// A queue's first take script, and one in 64 after, makes its lease set a
/// skiplist (Redis keeps a small sorted set as a listpack, searched from
/// one end at every ZADD and ZREM); the member that does it is never left
/// in the set, and the set goes with its last lease as before.
#[test]
fn a_take_now_and_then_makes_the_lease_set_a_skiplist() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    let mut direct = redis.client();
    c.cmd(&["LPUSH", "wsk", "a", "b"]);
    c.cmd(&["LPUSH", "wmv", "c", "d"]);
    assert_eq!(c.cmd(&["RPOP", "wsk"]), Value::bulk("a"));
    assert_eq!(c.cmd(&["RPOPLPUSH", "wmv", "mdoing"]), Value::bulk("c"));
    let (leases, mleases) = ("ackq:{wsk}:wsk:leases", "ackq:{wmv}:wmv:mleases");
    for z in [leases, mleases] {
        assert_eq!(
            direct.cmd(&["OBJECT", "ENCODING", z]),
            Value::bulk("skiplist"),
            "{z}"
        );
    }
    // The next takes are not a turn: the sets stay skiplists, and hold
    // the leases alone.
    assert_eq!(c.cmd(&["RPOP", "wsk"]), Value::bulk("b"));
    assert_eq!(c.cmd(&["RPOPLPUSH", "wmv", "mdoing"]), Value::bulk("d"));
    for z in [leases, mleases] {
        assert_eq!(
            direct.cmd(&["OBJECT", "ENCODING", z]),
            Value::bulk("skiplist"),
            "{z}"
        );
    }
    assert_eq!(
        direct.cmd(&["ZRANGE", leases, "0", "-1"]),
        Value::Array(vec![Value::bulk("ja"), Value::bulk("jb")])
    );
    assert_eq!(
        direct.cmd(&["ZRANGE", mleases, "0", "-1"]),
        Value::Array(vec![Value::bulk("jc"), Value::bulk("jd")])
    );
    assert_eq!(info_int(&proxy, "wsk", "leased"), 2);
    assert_eq!(c.cmd(&["ACK", "wsk", "a", "b"]), Value::Int(2));
    assert_eq!(c.cmd(&["LREM", "mdoing", "0", "c"]), Value::Int(1));
    assert_eq!(c.cmd(&["LREM", "mdoing", "0", "d"]), Value::Int(1));
    assert_no_aux_keys(&mut direct, Duration::from_secs(2));
}

/// A next-pop worker's next pop acknowledges the one lease its last pop
/// left it holding by that lease's token, which the proxy keeps: the
/// script does not read the connection's index for what else it holds. After pipelined pops the proxy knows nothing, and the
/// next pop acknowledges every lease they took.
#[test]
fn a_next_pop_names_the_one_lease_its_connection_holds() {
    let (redis, proxy) = Proxy::with_redis(&next_pop_config(60000));
    let mut c = proxy.client();
    let m = |id: &str| format!(r#"{{"id":"{id}"}}"#);
    let all: Vec<String> = ["a", "b", "d", "e", "f"].iter().map(|i| m(i)).collect();
    let mut push = vec!["LPUSH", "np"];
    push.extend(all.iter().map(String::as_str));
    c.cmd(&push);
    assert_eq!(c.cmd(&["RPOP", "np"]), Value::bulk(&all[0]));
    let ran = commands_run(&redis, || {
        assert_eq!(c.cmd(&["RPOP", "np"]), Value::bulk(&all[1]));
    });
    assert!(!ran.iter().any(|c| c == "ZRANGE"), "{ran:?}");
    assert!(!called(&ran, "pop"), "{ran:?}");
    assert_eq!(info_int(&proxy, "np", "acks"), 1);
    assert_eq!(info_int(&proxy, "np", "leased"), 1);
    // Two pops in one write: the first acknowledges b, the second nothing.
    let mut both = Client::encode(&[b"RPOP", b"np"]);
    both.extend(Client::encode(&[b"RPOP", b"np"]));
    c.send_raw(&both);
    assert_eq!(c.read_value(), Value::bulk(&all[2]));
    assert_eq!(c.read_value(), Value::bulk(&all[3]));
    assert_eq!(info_int(&proxy, "np", "acks"), 2);
    assert_eq!(info_int(&proxy, "np", "leased"), 2);
    let ran = commands_run(&redis, || {
        assert_eq!(c.cmd(&["RPOP", "np"]), Value::bulk(&all[4]));
    });
    assert!(ran.iter().any(|c| c == "ZRANGE"), "{ran:?}");
    assert_eq!(info_int(&proxy, "np", "acks"), 4);
    assert_eq!(info_int(&proxy, "np", "leased"), 1);
    assert_eq!(c.cmd(&["RPOP", "np"]), Value::Nil);
    assert_eq!(info_int(&proxy, "np", "acks"), 5);
    assert_eq!(info_int(&proxy, "np", "leased"), 0);
    assert_no_aux_keys(&mut redis.client(), Duration::from_secs(2));
}

/// A move lease is found by its payload's token, as an ACK finds a lease:
/// a move pop writes nothing in the queue's ids index but a duplicate's
/// token, an LREM releases the lease of that payload in that destination
/// only (not another message with the same id elsewhere), in the script
/// and in the library alike, and a lease an older version indexed under
/// its destination, with its older token, is still released by its LREM.
#[test]
fn move_leases_are_found_by_their_payload_without_a_destination_entry() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    let mut direct = redis.client();
    let (a1, a2) = (r#"{"id":"a","n":1}"#, r#"{"id":"a","n":2}"#);
    c.cmd(&["LPUSH", "jm", a1, a2]);
    assert_eq!(c.cmd(&["BRPOPLPUSH", "jm", "d1", "1"]), Value::bulk(a1));
    assert_eq!(c.cmd(&["RPOPLPUSH", "jm", "d2"]), Value::bulk(a2));
    let ids = keys(&mut direct, "ackq:*jm*:ids");
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(
        direct.cmd(&["ZRANGE", &ids[0], "0", "-1"]),
        Value::Array(vec![Value::bulk("ja:000000000001")])
    );
    assert_eq!(c.cmd(&["LREM", "d2", "1", a1]), Value::Int(0));
    assert_eq!(c.cmd(&["LPUSH", "d1", a2]), Value::Int(2));
    // a2's copy in d1 is none of a lease's: removed, nothing released.
    assert_eq!(c.cmd(&["LREM", "d1", "-1", a2]), Value::Int(1));
    assert_eq!(info_int(&proxy, "jm", "leased"), 2);
    assert_eq!(c.cmd(&["LREM", "d2", "0", a2]), Value::Int(1));
    assert_eq!(info_int(&proxy, "jm", "leased"), 1);
    let mut both = Client::encode(&[b"LREM", b"d1", b"1", a1.as_bytes()]);
    both.extend(Client::encode(&[b"PING"]));
    c.send_raw(&both);
    assert_eq!(c.read_value(), Value::Int(1));
    assert_eq!(c.read_value(), Value::Simple("PONG".into()));
    assert_eq!(info_int(&proxy, "jm", "leased"), 0);
    assert_eq!(info_int(&proxy, "jm", "acks"), 2);

    // A payload the proxy reads as id "x" but the library's decoder
    // refuses (so its id is the whole payload): its LREM releases its own
    // lease, not that of the message whose id is "x".
    let (x, x_tail) = (r#"{"id":"x"}"#, r#"{"id":"x"} tail"#);
    c.cmd(&["LPUSH", "jm", x, x_tail]);
    assert_eq!(c.cmd(&["RPOPLPUSH", "jm", "d1"]), Value::bulk(x));
    assert_eq!(c.cmd(&["RPOPLPUSH", "jm", "d1"]), Value::bulk(x_tail));
    assert_eq!(c.cmd(&["LREM", "d1", "1", x_tail]), Value::Int(1));
    assert_eq!(info_int(&proxy, "jm", "leased"), 1);
    assert_eq!(c.cmd(&["LREM", "d1", "1", x]), Value::Int(1));
    assert_eq!(info_int(&proxy, "jm", "leased"), 0);

    // An older version's move lease of {"id":"b"} in d3 (a destination the
    // proxy has seen a move pop to): a packed record under the token
    // 'i'..sha1(id) and an entry under its destination.
    let c1 = r#"{"id":"c"}"#;
    c.cmd(&["LPUSH", "jm", c1]);
    assert_eq!(c.cmd(&["RPOPLPUSH", "jm", "d3"]), Value::bulk(c1));
    assert_eq!(c.cmd(&["LREM", "d3", "1", c1]), Value::Int(1));
    let b = r#"{"id":"b"}"#;
    let prefix = ids[0].strip_suffix("ids").unwrap().to_string();
    direct.cmd(&[
        "EVAL",
        "local now = redis.call('TIME')[1] * 1000 \
         local token = 'i' .. redis.sha1hex('b') \
         redis.call('HSET', KEYS[1], token, cmsgpack.pack(ARGV[1], 'b', 1, 'd3', 'L', now, 0, 0, now, '')) \
         redis.call('ZADD', KEYS[2], now + 60000, token) \
         redis.call('ZADD', KEYS[3], 0, 'd' .. redis.sha1hex('d3' .. '\\0' .. ARGV[1]) .. '|' .. token) \
         redis.call('LPUSH', 'd3', ARGV[1])",
        "3",
        &format!("{prefix}msgs"),
        &format!("{prefix}mleases"),
        &ids[0],
        b,
    ]);
    assert_eq!(info_int(&proxy, "jm", "leased"), 1);
    assert_eq!(c.cmd(&["LREM", "d3", "1", b]), Value::Int(1));
    assert_eq!(info_int(&proxy, "jm", "leased"), 0);
    assert_no_aux_keys(&mut direct, Duration::from_secs(2));
}

/// On a rule that tracks connections (here requeue_on_disconnect), the
/// popping connection's ACK of its lease is a script, not the library's
/// function, and clears the lease's owner entry as the library would: the
/// connection then closes with nothing to requeue. Another connection's
/// ACK of such a lease is the library's.
#[test]
fn an_ack_by_the_connection_holding_a_tracked_lease_is_one_script_in_redis() {
    const CONFIG: &str = r#"
[[queue]]
pattern = "rq*"
ack_id = "json:id"
requeue_on_disconnect = true
"#;
    let (redis, proxy) = Proxy::with_redis(CONFIG);
    let mut c = proxy.client();
    let (a, b) = (r#"{"id":"a"}"#, r#"{"id":"b"}"#);
    c.cmd(&["LPUSH", "rq", a, b]);
    let ran = commands_run(&redis, || {
        assert_eq!(c.cmd(&["RPOP", "rq"]), Value::bulk(a));
        assert_eq!(c.cmd(&["ACK", "rq", "a"]), Value::Int(1));
    });
    assert!(!called(&ran, "pop") && !called(&ran, "ack"), "{ran:?}");
    for cmd in ["ZREM", "HDEL"] {
        assert!(ran.iter().any(|c| c == cmd), "{cmd} in {ran:?}");
    }
    assert_eq!(c.cmd(&["RPOP", "rq"]), Value::bulk(b));
    let mut other = proxy.client();
    let ran = commands_run(&redis, || {
        assert_eq!(other.cmd(&["ACK", "rq", "b"]), Value::Int(1));
    });
    assert!(acked_by_library(&ran), "{ran:?}");
    drop(c);
    thread::sleep(Duration::from_millis(300));
    assert_eq!(info_int(&proxy, "rq", "disconnects"), 0);
    assert_eq!(info_int(&proxy, "rq", "acks"), 2);
    assert_eq!(info_int(&proxy, "rq", "ready"), 0);
    assert_no_aux_keys(&mut redis.client(), Duration::from_secs(2));
}

#[test]
fn an_ack_through_another_proxy_or_of_a_redelivery_releases_the_lease() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let other = Proxy::start_with_config(redis.port, LIFECYCLE_CONFIG, &[]);
    let (mut c, mut o) = (proxy.client(), other.client());
    c.cmd(&["LPUSH", "q", "m1", "m2"]);
    // Popped here, acknowledged there: the library's way.
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::bulk("m1"));
    let ran = commands_run(&redis, || {
        assert_eq!(o.cmd(&["ACK", "q", "m1"]), Value::Int(1));
    });
    assert!(acked_by_library(&ran), "{ran:?}");
    // Redelivered after its lease ran out: its record is the long form,
    // and the short way still ends every trace of it.
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::bulk("m2"));
    thread::sleep(EXPIRE_WAIT);
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::bulk("m2"));
    let ran = commands_run(&redis, || {
        assert_eq!(c.cmd(&["ACK", "q", "m2"]), Value::Int(1));
    });
    assert!(!acked_by_library(&ran), "{ran:?}");
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::Nil);
    thread::sleep(EXPIRE_WAIT);
    assert_eq!(
        c.cmd(&["RPOP", "q"]),
        Value::Nil,
        "an acked message came back"
    );
    assert_no_aux_keys(&mut redis.client(), Duration::from_secs(2));
}

#[test]
fn a_pop_of_one_with_nothing_due_is_the_take_script() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    let (a, b) = (r#"{"id":"a","n":1}"#, r#"{"id":"b","n":2}"#);
    c.cmd(&["LPUSH", "jobs", a, b]);
    let ran = commands_run(&redis, || {
        assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::bulk(a));
    });
    assert!(
        !ran.iter().any(|c| c.starts_with("FCALL ackq_pop")),
        "{ran:?}"
    );
    for cmd in ["RPOP", "HSETNX", "ZADD"] {
        assert!(ran.iter().any(|c| c == cmd), "{cmd} in {ran:?}");
    }
    // A Redis that lost the script is given its text again.
    assert_eq!(
        redis.client().cmd(&["SCRIPT", "FLUSH"]),
        Value::Simple("OK".into())
    );
    assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::bulk(b));
    assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::Nil);
    let ls = queue_leases(&proxy, "jobs");
    assert_eq!(ls.len(), 2);
    for l in &ls {
        assert_eq!(as_int(&l["deliveries"]), 1);
    }
    assert_eq!(info_int(&proxy, "jobs", "deliveries"), 2);
    assert_eq!(c.cmd(&["ACK", "jobs", "a", "b"]), Value::Int(2));
    // A blocking pop that finds a message takes it the same way.
    c.cmd(&["LPUSH", "jobs", a]);
    let ran = commands_run(&redis, || {
        assert_eq!(
            c.cmd(&["BRPOP", "jobs", "1"]),
            Value::Array(vec![Value::bulk("jobs"), Value::bulk(a)])
        );
    });
    assert!(
        !ran.iter().any(|c| c.starts_with("FCALL ackq_pop")),
        "{ran:?}"
    );
    assert!(ran.iter().any(|c| c == "HSETNX"), "{ran:?}");
    assert_eq!(c.cmd(&["ACK", "jobs", "a"]), Value::Int(1));
    assert_no_aux_keys(&mut redis.client(), Duration::from_secs(2));
}

/// A request the client sends while its pop of one is in flight, in a
/// write of its own, runs after the pop, also when the take script leaves
/// the pop to the library: a second call the reply stream sends.
#[test]
fn a_request_sent_during_a_pop_the_script_hands_on_waits_for_it() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "w1", "a", "b"]);
    assert_eq!(c.cmd(&["RPOP", "w1"]), Value::bulk("a"));
    // A NACKed message is back in the list, a retry entry with it: the
    // next pop is the library's.
    assert_eq!(c.cmd(&["NACK", "w1", "a"]), Value::Int(1));
    // Redis held by a script of another client's, so that the pop's calls
    // and the request behind it all wait in line there.
    let port = redis.port;
    let busy = thread::spawn(move || {
        let mut other = Client::connect(port);
        other.cmd(&[
            "EVAL",
            "local t = redis.call('TIME')[1] + 0 local u = 0 while redis.call('TIME')[1] + 0 < t + 1 do u = u + 1 end return 1",
            "0",
        ])
    });
    thread::sleep(Duration::from_millis(100));
    c.send_raw(&Client::encode(&[b"RPOP", b"w1"]));
    thread::sleep(Duration::from_millis(50));
    c.send_raw(&Client::encode(&[b"LLEN", b"w1"]));
    assert_eq!(c.read_raw(), b"$1\r\na\r\n");
    assert_eq!(c.read_raw(), b":1\r\n", "LLEN ran after the pop");
    assert_eq!(busy.join().unwrap(), Value::Int(1));
}

#[test]
fn what_the_take_script_leaves_the_library_does_in_the_list_order() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    // A numeric id (its text is read from the payload by the library), two
    // messages with one id in flight, then a plain one: in the order pushed.
    let (num, d1, d2, s) = (
        r#"{"id":12,"n":1}"#,
        r#"{"id":"d","n":2}"#,
        r#"{"id":"d","n":3}"#,
        r#"{"id":"s","n":4}"#,
    );
    c.cmd(&["LPUSH", "jobs", num, d1, d2, s]);
    for m in [num, d1, d2, s] {
        assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::bulk(m));
    }
    assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::Nil);
    let mut ids: Vec<String> = queue_leases(&proxy, "jobs")
        .iter()
        .map(|l| as_str(&l["id"]))
        .collect();
    ids.sort();
    assert_eq!(ids, ["12", "d", "d", "s"]);
    // A lease that ran out comes back through the library.
    thread::sleep(EXPIRE_WAIT);
    let ran = commands_run(&redis, || {
        assert!(matches!(c.cmd(&["RPOP", "jobs"]), Value::Bulk(_)));
    });
    assert!(
        ran.iter().any(|c| c.starts_with("FCALL ackq_pop1_")),
        "{ran:?}"
    );
    for _ in 0..3 {
        assert!(matches!(c.cmd(&["RPOP", "jobs"]), Value::Bulk(_)));
    }
    assert_eq!(c.cmd(&["ACK", "jobs", "12", "d", "d", "s"]), Value::Int(4));
    assert_eq!(info_int(&proxy, "jobs", "deliveries"), 8);
    assert_no_aux_keys(&mut redis.client(), Duration::from_secs(2));
}

#[test]
fn acks_made_the_short_way_reach_the_totals_in_batches() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    let n = 250;
    for i in 0..n {
        let m = format!("t{i}");
        c.cmd(&["LPUSH", "qt", &m]);
        assert_eq!(c.cmd(&["RPOP", "qt"]), Value::bulk(&m));
        assert_eq!(c.cmd(&["ACK", "qt", &m]), Value::Int(1));
    }
    // Exact through the proxy that made them; in Redis, all but the last
    // batch (written with an ACK at most 100 ACKs or a second later).
    assert_eq!(info_int(&proxy, "qt", "acks"), n);
    let written = as_int(&redis.client().cmd(&["HGET", "ackq:{qt}:qt:stats", "acks"]));
    assert!((n - 100..=n).contains(&written), "written: {written}");
    thread::sleep(Duration::from_millis(1100));
    c.cmd(&["LPUSH", "qt", "last"]);
    assert_eq!(c.cmd(&["RPOP", "qt"]), Value::bulk("last"));
    assert_eq!(c.cmd(&["ACK", "qt", "last"]), Value::Int(1));
    let written = as_int(&redis.client().cmd(&["HGET", "ackq:{qt}:qt:stats", "acks"]));
    assert_eq!(written, n, "a second later every earlier ACK is written");
    assert_eq!(info_int(&proxy, "qt", "acks"), n + 1);
}

#[test]
fn dead_letter_after_max_deliveries() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "q1", "poison"]);
    for n in 1..=3 {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            match c.cmd(&["RPOP", "q1"]) {
                Value::Bulk(b) => {
                    assert_eq!(b, b"poison");
                    break;
                }
                Value::Nil => {
                    assert!(Instant::now() < deadline, "delivery {n} never came");
                    thread::sleep(Duration::from_millis(20));
                }
                other => panic!("RPOP q1: {other:?}"),
            }
        }
        let ls = queue_leases(&proxy, "q1");
        assert_eq!(ls.len(), 1);
        assert_eq!(as_int(&ls[0]["deliveries"]), n);
    }
    thread::sleep(EXPIRE_WAIT);
    let mut direct = redis.client();
    assert_eq!(lrange(&mut direct, "{q1}:dead"), vec!["poison"]);
    assert_eq!(lrange(&mut direct, "q1"), Vec::<String>::new());
    assert_eq!(c.cmd(&["RPOP", "q1"]), Value::Nil);
    assert_eq!(info_int(&proxy, "q1", "dead"), 1);
    assert_eq!(info_int(&proxy, "q1", "leased"), 0);
    assert_eq!(
        as_str(&queue_info(&proxy, "q1")["dead-letter-key"]),
        "{q1}:dead"
    );
    // The dead letter, and its history beside it (see QUEUE DEAD).
    assert_eq!(
        keys(&mut direct, "*"),
        vec!["ackq:{q1}:q1:history".to_string(), "{q1}:dead".to_string()]
    );
}

#[test]
fn extend_keeps_the_lease() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "q", "job"]);
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::bulk("job"));
    thread::sleep(Duration::from_millis(100));
    assert_eq!(
        c.cmd(&["QUEUE", "EXTEND", "q", "job", "1500"]),
        Value::Int(1)
    );
    let ls = queue_leases(&proxy, "q");
    let exp = as_int(&ls[0]["expires-in-ms"]);
    assert!(
        exp > 1_000 && exp <= 1_500,
        "expires-in-ms after EXTEND: {exp}"
    );
    thread::sleep(EXPIRE_WAIT); // well past the original 200 ms deadline
    assert_eq!(info_int(&proxy, "q", "leased"), 1);
    assert_eq!(info_int(&proxy, "q", "ready"), 0);
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::Nil);
    assert_eq!(c.cmd(&["ACK", "q", "job"]), Value::Int(1));
    thread::sleep(Duration::from_millis(1200));
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::Nil);
    assert_no_aux_keys(&mut redis.client(), Duration::from_secs(2));
}

#[test]
fn nack_returns_the_message_at_once() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "q", "a", "b"]); // list: b a; RPOP pops a first
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::bulk("a"));
    assert_eq!(c.cmd(&["NACK", "q", "a"]), Value::Int(1));
    assert_eq!(c.cmd(&["NACK", "q", "a"]), Value::Int(0));
    assert_eq!(info_int(&proxy, "q", "leased"), 0);
    assert_eq!(info_int(&proxy, "q", "ready"), 2);
    // redeliver = "next": it is popped before b.
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::bulk("a"));
    let ls = queue_leases(&proxy, "q");
    assert_eq!(as_int(&ls[0]["deliveries"]), 2);
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::bulk("b"));
    assert_eq!(c.cmd(&["ACK", "q", "a", "b"]), Value::Int(2));
    assert_no_aux_keys(&mut redis.client(), Duration::from_secs(2));
}

#[test]
fn redeliver_next_and_last() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    for (q, want) in [("qn", ["a", "b", "c"]), ("ln", ["b", "c", "a"])] {
        c.cmd(&["LPUSH", q, "a"]);
        assert_eq!(c.cmd(&["RPOP", q]), Value::bulk("a"));
        c.cmd(&["LPUSH", q, "b", "c"]);
        thread::sleep(EXPIRE_WAIT);
        let got: Vec<String> = (0..3).map(|_| as_str(&c.cmd(&["RPOP", q]))).collect();
        assert_eq!(got, want, "pop order on {q} after a redelivery");
        assert_eq!(c.cmd(&["ACK", q, "a", "b", "c"]), Value::Int(3));
    }
    assert_no_aux_keys(&mut redis.client(), Duration::from_secs(2));
}

#[test]
fn json_ack_id() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    let m = r#"{"id":"7","body":"hello"}"#;
    c.cmd(&["LPUSH", "jobs", m]);
    assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::bulk(m));
    let ls = queue_leases(&proxy, "jobs");
    assert_eq!(as_str(&ls[0]["id"]), "7");
    assert_eq!(as_str(&ls[0]["payload"]), m);
    assert_eq!(
        c.cmd(&["ACK", "jobs", m]),
        Value::Int(0),
        "payload is not the id in json mode"
    );
    assert_eq!(c.cmd(&["ACK", "jobs", "7"]), Value::Int(1));
    thread::sleep(EXPIRE_WAIT);
    assert_eq!(c.cmd(&["RPOP", "jobs"]), Value::Nil);
    assert_no_aux_keys(&mut redis.client(), Duration::from_secs(2));
}

#[test]
fn lrem_on_destination_acks_move_forms() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "q", "task"]);
    assert_eq!(
        c.cmd(&["BRPOPLPUSH", "q", "doing", "0"]),
        Value::bulk("task")
    );
    assert_eq!(lrange(&mut c, "doing"), vec!["task"]);
    assert_eq!(info_int(&proxy, "q", "leased"), 1);
    assert_eq!(c.cmd(&["LREM", "doing", "1", "task"]), Value::Int(1));
    assert_eq!(
        info_int(&proxy, "q", "leased"),
        0,
        "LREM on the destination should release the lease"
    );
    thread::sleep(EXPIRE_WAIT);
    assert_eq!(
        c.cmd(&["RPOP", "q"]),
        Value::Nil,
        "message redelivered after LREM"
    );
    assert_eq!(lrange(&mut c, "doing"), Vec::<String>::new());
    let mut direct = redis.client();
    assert_no_aux_keys(&mut direct, Duration::from_secs(2));
    assert_eq!(keys(&mut direct, "*"), Vec::<String>::new());

    // LMOVE too.
    c.cmd(&["LPUSH", "q", "t2"]);
    assert_eq!(
        c.cmd(&["LMOVE", "q", "doing2", "RIGHT", "LEFT"]),
        Value::bulk("t2")
    );
    assert_eq!(c.cmd(&["LREM", "doing2", "0", "t2"]), Value::Int(1));
    assert_eq!(info_int(&proxy, "q", "leased"), 0);
    thread::sleep(EXPIRE_WAIT);
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::Nil);
    assert_no_aux_keys(&mut direct, Duration::from_secs(2));
}

#[test]
fn expired_move_lease_cleans_destination() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "q", "task"]);
    c.cmd(&["RPUSH", "doing", "other"]);
    assert_eq!(c.cmd(&["RPOPLPUSH", "q", "doing"]), Value::bulk("task"));
    assert_eq!(lrange(&mut c, "doing"), vec!["task", "other"]);
    thread::sleep(EXPIRE_WAIT);
    let mut direct = redis.client();
    assert_eq!(
        lrange(&mut direct, "doing"),
        vec!["other"],
        "stale copy left in the destination"
    );
    assert_eq!(lrange(&mut direct, "q"), vec!["task"]);
    assert_eq!(c.cmd(&["RPOPLPUSH", "q", "doing"]), Value::bulk("task"));
    let ls = queue_leases(&proxy, "q");
    assert_eq!(as_int(&ls[0]["deliveries"]), 2);
    assert_eq!(c.cmd(&["LREM", "doing", "1", "task"]), Value::Int(1));
    thread::sleep(EXPIRE_WAIT);
    assert_eq!(lrange(&mut direct, "doing"), vec!["other"]);
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::Nil);
    assert_no_aux_keys(&mut direct, Duration::from_secs(2));
}

#[test]
fn late_ack_prevents_redelivery() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "q", "a"]);
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::bulk("a"));
    c.cmd(&["LPUSH", "q", "b"]);
    thread::sleep(EXPIRE_WAIT);
    assert_eq!(info_int(&proxy, "q", "leased"), 0);
    assert_eq!(info_int(&proxy, "q", "ready"), 2, "a is back in the list");
    let late = c.cmd(&["ACK", "q", "a"]);
    println!("late ACK reply: {late:?}");
    assert!(matches!(late, Value::Int(_)), "late ACK: {late:?}");
    // a would be next (redeliver = next); the late ACK makes the pop skip it.
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::bulk("b"));
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::Nil);
    assert_eq!(c.cmd(&["ACK", "q", "b"]), Value::Int(1));
    thread::sleep(EXPIRE_WAIT);
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::Nil);
    let mut direct = redis.client();
    assert_no_aux_keys(&mut direct, Duration::from_secs(2));
    assert_eq!(keys(&mut direct, "*"), Vec::<String>::new());
}

#[test]
fn late_ack_prevents_redelivery_blocking_pop() {
    let (_redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "q", "a"]);
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::bulk("a"));
    thread::sleep(EXPIRE_WAIT);
    c.cmd(&["ACK", "q", "a"]);
    assert_eq!(
        c.cmd(&["BRPOP", "q", "0.3"]),
        Value::Nil,
        "a late-acked message was delivered"
    );
}

#[test]
fn identical_payloads_are_two_leases() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "q", "x", "x"]);
    assert_eq!(c.cmd(&["RPOP", "q", "2"]), Value::bulks(&["x", "x"]));
    assert_eq!(info_int(&proxy, "q", "leased"), 2);
    assert_eq!(queue_leases(&proxy, "q").len(), 2);
    thread::sleep(EXPIRE_WAIT);
    assert_eq!(info_int(&proxy, "q", "ready"), 2, "both copies come back");
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::bulk("x"));
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::bulk("x"));
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::Nil);
    let ls = queue_leases(&proxy, "q");
    assert_eq!(ls.len(), 2);
    for l in &ls {
        assert_eq!(as_int(&l["deliveries"]), 2);
    }
    assert_eq!(
        c.cmd(&["ACK", "q", "x"]),
        Value::Int(1),
        "one ACK releases one lease"
    );
    assert_eq!(info_int(&proxy, "q", "leased"), 1);
    assert_eq!(c.cmd(&["ACK", "q", "x"]), Value::Int(1));
    assert_eq!(c.cmd(&["ACK", "q", "x"]), Value::Int(0));
    thread::sleep(EXPIRE_WAIT);
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::Nil);
    assert_no_aux_keys(&mut redis.client(), Duration::from_secs(2));
}

#[test]
fn consumer_disconnect_redelivers() {
    let (_redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    {
        let mut c = proxy.client();
        c.cmd(&["LPUSH", "q", "m"]);
        assert_eq!(c.cmd(&["RPOP", "q"]), Value::bulk("m"));
    }
    thread::sleep(EXPIRE_WAIT);
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["BRPOP", "q", "1"]), Value::bulks(&["q", "m"]));
    assert_eq!(c.cmd(&["ACK", "q", "m"]), Value::Int(1));
}

// --------------------------------------------------------- parked clients

/// Waits until the proxy behind metrics endpoint `metrics` has `n` pops
/// parked: a client's pop is in the arrival order only once it is.
fn wait_parked(metrics: u16, n: usize) {
    wait_until(&format!("{n} parked pops"), || {
        metric(metrics, "ackproxy_parked_clients") == n as f64
    });
}

#[test]
fn parked_brpop_woken_by_direct_push() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    c.send(&["BRPOP", "w", "0"]);
    thread::sleep(Duration::from_millis(300));
    // Nothing yet.
    c.set_read_timeout(Some(Duration::from_millis(50)));
    let mut probe = [0u8; 1];
    let early = std::io::Read::read(&mut c.stream(), &mut probe);
    assert!(
        early.is_err(),
        "BRPOP on an empty queue answered early: {early:?} {probe:?}"
    );
    c.set_read_timeout(Some(Duration::from_secs(5)));
    let mut direct = redis.client();
    assert_eq!(direct.cmd(&["LPUSH", "w", "hello"]), Value::Int(1));
    let t = Instant::now();
    assert_eq!(c.read_raw(), b"*2\r\n$1\r\nw\r\n$5\r\nhello\r\n".to_vec());
    println!("woken after {:?}", t.elapsed());
    let mut p = proxy.client();
    assert_eq!(info_int(&proxy, "w", "leased"), 1);
    assert_eq!(p.cmd(&["ACK", "w", "hello"]), Value::Int(1));
}

#[test]
fn parked_forms_woken_by_direct_push() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut direct = redis.client();
    let forms: &[(&[&str], &[u8])] = &[
        (
            &["BLPOP", "xw", "w1", "0"],
            b"*2\r\n$2\r\nw1\r\n$1\r\nm\r\n",
        ),
        (&["BRPOPLPUSH", "w1", "dst", "0"], b"$1\r\nm\r\n"),
        (
            &["BLMOVE", "w1", "dst", "LEFT", "RIGHT", "0"],
            b"$1\r\nm\r\n",
        ),
        (
            &["BLMPOP", "0", "2", "xw", "w1", "RIGHT", "COUNT", "2"],
            b"*2\r\n$2\r\nw1\r\n*1\r\n$1\r\nm\r\n",
        ),
    ];
    for (cmd, want) in forms {
        let mut c = proxy.client();
        c.send(cmd);
        thread::sleep(Duration::from_millis(100));
        direct.cmd(&["LPUSH", "w1", "m"]);
        let got = c.read_raw();
        assert_eq!(show(&got), show(want), "{}", cmd.join(" "));
        let mut p = proxy.client();
        assert_eq!(info_int(&proxy, "w1", "leased"), 1, "{}", cmd.join(" "));
        assert_eq!(p.cmd(&["ACK", "w1", "m"]), Value::Int(1));
        direct.cmd(&["DEL", "dst"]);
    }
}

#[test]
fn parked_clients_served_in_arrival_order() {
    const N: usize = 50;
    let redis = Redis::start();
    let metrics = free_port();
    let addr = format!("127.0.0.1:{metrics}");
    let proxy = Proxy::start_with_config(redis.port, LIFECYCLE_CONFIG, &["--metrics", &addr]);
    let mut clients: Vec<Client> = (0..N).map(|_| proxy.client()).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        c.send(&["BRPOP", "wq", "0"]);
        wait_parked(metrics, i + 1);
    }
    let mut direct = redis.client();
    for i in 0..N {
        direct.cmd(&["LPUSH", "wq", &format!("m{i}")]);
    }
    let mut got = Vec::new();
    for (i, c) in clients.iter_mut().enumerate() {
        c.set_read_timeout(Some(Duration::from_secs(5)));
        let v = c.try_read_raw().map(|r| decode(&r).0);
        got.push(match v {
            Ok(Value::Array(items)) if items.len() == 2 => as_str(&items[1]),
            Ok(other) => panic!("client {i}: {other:?}"),
            Err(e) => panic!("client {i} got nothing: {e}"),
        });
    }
    let want: Vec<String> = (0..N).map(|i| format!("m{i}")).collect();
    assert_eq!(got, want, "client i should get the i-th message");
    // Exactly one message each: nothing more arrives, nothing is left.
    for (i, c) in clients.iter_mut().enumerate() {
        c.set_read_timeout(Some(Duration::from_millis(20)));
        let mut b = [0u8; 1];
        assert!(
            std::io::Read::read(&mut c.stream(), &mut b).is_err(),
            "client {i} got a second reply"
        );
    }
    let mut p = proxy.client();
    assert_eq!(info_int(&proxy, "wq", "leased"), N as i64);
    assert_eq!(info_int(&proxy, "wq", "ready"), 0);
    let mut ack = vec!["ACK", "wq"];
    ack.extend(want.iter().map(|s| s.as_str()));
    assert_eq!(p.cmd(&ack), Value::Int(N as i64));
}

/// One pop after another parks on the empty queue and is woken by a push
/// made straight to Redis, with the message pushed. (How fast: `cargo
/// bench --bench wake_latency`.)
#[test]
fn parked_pops_woken_one_after_another_by_direct_pushes() {
    const ROUNDS: usize = 50;
    let redis = Redis::start();
    let metrics = free_port();
    let addr = format!("127.0.0.1:{metrics}");
    let proxy = Proxy::start_with_config(redis.port, LIFECYCLE_CONFIG, &["--metrics", &addr]);
    let mut direct = redis.client();
    let mut acker = proxy.client();
    let mut waiter = proxy.client();
    waiter.set_read_timeout(Some(Duration::from_secs(10)));
    for i in 0..ROUNDS {
        let msg = format!("m{i}");
        waiter.send(&["BRPOP", "wl", "0"]);
        wait_parked(metrics, 1);
        direct.cmd(&["LPUSH", "wl", &msg]);
        let reply = waiter
            .try_read_raw()
            .unwrap_or_else(|e| panic!("round {i}: no reply to the parked pop: {e}"));
        assert_eq!(decode(&reply).0, Value::bulks(&["wl", &msg]), "round {i}");
        assert_eq!(acker.cmd(&["ACK", "wl", &msg]), Value::Int(1));
    }
}

#[test]
fn parked_timeouts_follow_redis() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut c = proxy.client();
    for (cmd, want) in [
        (vec!["BRPOP", "w", "0.25"], &b"*-1\r\n"[..]),
        (vec!["BRPOPLPUSH", "w", "d", "0.25"], &b"*-1\r\n"[..]),
        (
            vec!["BLMOVE", "w", "d", "LEFT", "LEFT", "0.25"],
            &b"*-1\r\n"[..],
        ),
    ] {
        let plain = redis.client().raw(
            &cmd.iter()
                .map(|s| s.replace('w', "plainw"))
                .collect::<Vec<_>>()
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>(),
        );
        let t = Instant::now();
        let got = c.raw(&cmd);
        let took = t.elapsed();
        println!(
            "{}: {} after {took:?} (Redis: {})",
            cmd.join(" "),
            show(&got),
            show(&plain)
        );
        assert_eq!(show(&got), show(&plain), "{}", cmd.join(" "));
        assert_eq!(show(&got), show(want), "{}", cmd.join(" "));
        assert!(
            took >= Duration::from_millis(240) && took < Duration::from_millis(600),
            "{}: {took:?}",
            cmd.join(" ")
        );
    }
    let mut c3 = proxy.client();
    hello3(&mut c3);
    let t = Instant::now();
    assert_eq!(show(&c3.raw(&["BRPOP", "w", "0.2"])), "_\\r\\n");
    assert!(t.elapsed() >= Duration::from_millis(190));
    // A client that disconnects while parked does not take a message later.
    {
        let mut gone = proxy.client();
        gone.send(&["BRPOP", "w", "0"]);
        thread::sleep(Duration::from_millis(50));
    }
    thread::sleep(Duration::from_millis(50));
    redis.client().cmd(&["LPUSH", "w", "kept"]);
    thread::sleep(Duration::from_millis(100));
    assert_eq!(
        c.cmd(&["RPOP", "w"]),
        Value::bulk("kept"),
        "a disconnected parked client consumed the message"
    );
    assert_eq!(c.cmd(&["ACK", "w", "kept"]), Value::Int(1));
}

#[test]
fn parked_mixed_keys_woken_by_plain_key_push() {
    let (redis, proxy) = Proxy::with_redis(LIFECYCLE_CONFIG);
    let mut direct = redis.client();
    // A parked pop on a queue key and a plain key: a push to the plain key
    // answers it, as Redis would, and leases nothing.
    let mut c = proxy.client();
    c.set_read_timeout(Some(Duration::from_secs(5)));
    c.send(&["BRPOP", "wm", "plainkey", "0"]);
    thread::sleep(Duration::from_millis(100));
    direct.cmd(&["LPUSH", "plainkey", "p1"]);
    let got = c.try_read_raw().map(|r| show(&r));
    assert_eq!(
        got.ok().as_deref(),
        Some("*2\\r\\n$8\\r\\nplainkey\\r\\n$2\\r\\np1\\r\\n"),
        "BRPOP wm plainkey 0 after LPUSH plainkey p1"
    );
    assert_eq!(info_int(&proxy, "wm", "leased"), 0);
    // The same client, parked again, and a push through the proxy this time.
    c.send(&["BLPOP", "plainkey", "wm", "0"]);
    thread::sleep(Duration::from_millis(100));
    proxy.client().cmd(&["RPUSH", "wm", "q1"]);
    let got = c.try_read_raw().map(|r| show(&r));
    assert_eq!(
        got.ok().as_deref(),
        Some("*2\\r\\n$2\\r\\nwm\\r\\n$2\\r\\nq1\\r\\n"),
        "BLPOP plainkey wm 0 after RPUSH wm q1"
    );
    assert_eq!(info_int(&proxy, "wm", "leased"), 1);
}

// ------------------------------------------------------ other databases

/// Short leases, and a rule that requeues on disconnect, for queues in
/// databases other than 0.
const DB_CONFIG: &str = r#"
[[queue]]
pattern = "q*"
lease_ms = 200
max_deliveries = 3
ack_id = "payload"
redeliver = "next"
pop_end = "right"

[[queue]]
pattern = "w*"
lease_ms = 600000
max_deliveries = 3
ack_id = "payload"
redeliver = "next"
pop_end = "right"

[[queue]]
pattern = "r*"
lease_ms = 600000
max_deliveries = 100
ack_id = "payload"
requeue_on_disconnect = true

[reaper]
interval_ms = 50
"#;

fn select(c: &mut Client, db: &str) {
    assert_eq!(
        c.cmd(&["SELECT", db]),
        Value::Simple("OK".into()),
        "SELECT {db}"
    );
}

/// A client of the proxy in database `db`.
fn proxy_in(p: &Proxy, db: &str) -> Client {
    let mut c = p.client();
    select(&mut c, db);
    c
}

/// A client of Redis itself in database `db`.
fn redis_in(r: &Redis, db: &str) -> Client {
    let mut c = r.client();
    select(&mut c, db);
    c
}

fn info_in(p: &Proxy, db: &str, q: &str) -> HashMap<String, Value> {
    fields(&proxy_in(p, db).cmd(&["QUEUE", "INFO", q]))
}

fn info_int_in(p: &Proxy, db: &str, q: &str, field: &str) -> i64 {
    as_int(&info_in(p, db, q)[field])
}

#[test]
fn a_db1_worker_pops_and_acks_its_own_queue() {
    let (redis, proxy) = Proxy::with_redis(STABLE_CONFIG);
    let mut c = proxy_in(&proxy, "1");
    assert_eq!(c.cmd(&["LPUSH", "qdb", "m"]), Value::Int(1));
    // Not nil from database 0's (empty) list: the message of database 1.
    assert_eq!(c.cmd(&["RPOP", "qdb"]), Value::bulk("m"));
    assert_eq!(info_int_in(&proxy, "1", "qdb", "leased"), 1);
    assert_eq!(info_int(&proxy, "qdb", "leased"), 0);
    assert_eq!(c.cmd(&["ACK", "qdb", "m"]), Value::Int(1));
    assert_eq!(info_int_in(&proxy, "1", "qdb", "leased"), 0);
    // Nothing of it anywhere in database 0; nothing left in database 1.
    assert_eq!(keys(&mut redis.client(), "*"), Vec::<String>::new());
    assert_eq!(keys(&mut redis_in(&redis, "1"), "*"), Vec::<String>::new());
    // A SELECT pipelined with the pop, and the blocking forms.
    let mut p = proxy.client();
    p.send_raw(b"LPUSH qp a b c\r\nSELECT 2\r\nLPUSH qp x\r\nRPOP qp\r\nBRPOP qp 1\r\n");
    assert_eq!(p.read_value(), Value::Int(3));
    assert_eq!(p.read_value(), Value::Simple("OK".into()));
    assert_eq!(p.read_value(), Value::Int(1));
    assert_eq!(p.read_value(), Value::bulk("x"));
    assert_eq!(p.read_value(), Value::Nil);
    assert_eq!(p.cmd(&["ACK", "qp", "x"]), Value::Int(1));
    // A SELECT Redis refuses changes nothing; one a transaction runs does,
    // one it discards does not; RESET goes back to database 0.
    let out_of_range = p.cmd(&["SELECT", "99"]);
    assert!(matches!(out_of_range, Value::Error(_)), "{out_of_range:?}");
    p.cmd(&["LPUSH", "qp", "y"]);
    assert_eq!(p.cmd(&["RPOP", "qp"]), Value::bulk("y"));
    assert_eq!(p.cmd(&["ACK", "qp", "y"]), Value::Int(1));
    redis_in(&redis, "4").cmd(&["LPUSH", "qp", "four"]);
    p.send_raw(b"MULTI\r\nSELECT 4\r\nEXEC\r\nRPOP qp\r\n");
    assert_eq!(p.read_value(), Value::Simple("OK".into()));
    assert_eq!(p.read_value(), Value::Simple("QUEUED".into()));
    assert_eq!(
        p.read_value(),
        Value::Array(vec![Value::Simple("OK".into())])
    );
    assert_eq!(p.read_value(), Value::bulk("four"));
    assert_eq!(p.cmd(&["ACK", "qp", "four"]), Value::Int(1));
    p.send_raw(b"MULTI\r\nSELECT 5\r\nDISCARD\r\nLPUSH qp z\r\nRPOP qp\r\n");
    for _ in 0..3 {
        p.read_value();
    }
    assert_eq!(p.read_value(), Value::Int(1));
    assert_eq!(p.read_value(), Value::bulk("z"));
    assert_eq!(
        info_int_in(&proxy, "4", "qp", "leased"),
        1,
        "z leased in database 4"
    );
    assert_eq!(p.cmd(&["RESET"]), Value::Simple("RESET".into()));
    assert_eq!(p.cmd(&["RPOP", "qp"]), Value::bulk("a"));
    assert_eq!(info_int(&proxy, "qp", "leased"), 1);
}

/// A pop's and an ACK's call sent again behind a library load (Redis lost
/// the library) is the call of their database: the `_db_` function with the
/// database's number, so its counts are kept and written there, not in
/// database 0.
#[test]
fn calls_sent_again_behind_a_library_load_stay_in_their_database() {
    let (redis, proxy) = Proxy::with_redis(STABLE_CONFIG);
    let mut c = proxy_in(&proxy, "3");
    c.cmd(&["LPUSH", "qdb3", "m1"]);
    let flush = || {
        assert_eq!(
            redis.client().cmd(&["FUNCTION", "FLUSH"]),
            Value::Simple("OK".into())
        );
    };
    flush();
    assert_eq!(c.cmd(&["RPOP", "qdb3"]), Value::bulk("m1"));
    assert_eq!(info_int_in(&proxy, "3", "qdb3", "deliveries"), 1);
    assert_eq!(info_int(&proxy, "qdb3", "deliveries"), 0);
    flush();
    assert_eq!(c.cmd(&["ACK", "qdb3", "m1"]), Value::Int(1));
    assert_eq!(info_int_in(&proxy, "3", "qdb3", "acks"), 1);
    assert_eq!(info_int(&proxy, "qdb3", "acks"), 0);
    assert_eq!(info_int_in(&proxy, "3", "qdb3", "leased"), 0);
}

#[test]
fn two_databases_with_the_same_queue_name_do_not_mix() {
    let (redis, proxy) = Proxy::with_redis(STABLE_CONFIG);
    let mut zero = proxy.client();
    let mut three = proxy_in(&proxy, "3");
    zero.cmd(&["LPUSH", "q", "z1", "z2"]);
    three.cmd(&["LPUSH", "q", "t1"]);
    assert_eq!(three.cmd(&["RPOP", "q"]), Value::bulk("t1"));
    assert_eq!(three.cmd(&["RPOP", "q"]), Value::Nil);
    assert_eq!(zero.cmd(&["RPOP", "q"]), Value::bulk("z1"));
    // The same payload leased in both: an ACK ends the lease of its own
    // database only.
    three.cmd(&["LPUSH", "q", "z2"]);
    assert_eq!(three.cmd(&["RPOP", "q"]), Value::bulk("z2"));
    assert_eq!(zero.cmd(&["RPOP", "q"]), Value::bulk("z2"));
    assert_eq!(three.cmd(&["ACK", "q", "z1"]), Value::Int(0));
    assert_eq!(three.cmd(&["ACK", "q", "z2"]), Value::Int(1));
    assert_eq!(three.cmd(&["ACK", "q", "z2"]), Value::Int(0));
    assert_eq!(three.cmd(&["ACK", "q", "t1"]), Value::Int(1));
    assert_eq!(info_int(&proxy, "q", "leased"), 2);
    assert_eq!(info_int_in(&proxy, "3", "q", "leased"), 0);
    assert_eq!(info_int_in(&proxy, "3", "q", "acks"), 2);
    assert_eq!(info_int(&proxy, "q", "acks"), 0);
    assert_eq!(zero.cmd(&["ACK", "q", "z1", "z2"]), Value::Int(2));
    // A pop larger than one call, and one after the library went missing:
    // their further calls stay in database 3.
    let many: Vec<String> = (0..120).map(|i| format!("m{i}")).collect();
    let mut push = vec!["LPUSH", "q"];
    push.extend(many.iter().map(String::as_str));
    zero.cmd(&push);
    three.cmd(&push);
    match three.cmd(&["RPOP", "q", "120"]) {
        Value::Array(items) => assert_eq!(items.len(), 120),
        other => panic!("RPOP q 120 in database 3: {other:?}"),
    }
    assert_eq!(info_int_in(&proxy, "3", "q", "leased"), 120);
    assert_eq!(info_int(&proxy, "q", "ready"), 120);
    assert_eq!(
        redis.client().cmd(&["FUNCTION", "FLUSH"]),
        Value::Simple("OK".into())
    );
    three.cmd(&["LPUSH", "q", "after"]);
    assert_eq!(three.cmd(&["RPOP", "q"]), Value::bulk("after"));
    assert_eq!(info_int_in(&proxy, "3", "q", "leased"), 121);
    assert_eq!(info_int(&proxy, "q", "ready"), 120);
}

#[test]
fn an_unacked_message_in_database_3_is_redelivered_there() {
    let (redis, proxy) = Proxy::with_redis(DB_CONFIG);
    let mut c = proxy_in(&proxy, "3");
    c.cmd(&["LPUSH", "q", "m1"]);
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::bulk("m1"));
    // The reaper returns it with nobody popping, in database 3.
    let mut direct = redis_in(&redis, "3");
    wait_until("m1 back in database 3's list", || {
        lrange(&mut direct, "q") == vec!["m1"]
    });
    assert!(info_int_in(&proxy, "3", "q", "requeued") >= 1);
    assert_eq!(c.cmd(&["RPOP", "q"]), Value::bulk("m1"));
    let ls = fields(&match c.cmd(&["QUEUE", "LEASES", "q"]) {
        Value::Array(items) => items[0].clone(),
        other => panic!("QUEUE LEASES: {other:?}"),
    });
    assert_eq!(as_int(&ls["deliveries"]), 2);
    assert_eq!(c.cmd(&["ACK", "q", "m1"]), Value::Int(1));
    assert_no_aux_keys(&mut direct, Duration::from_secs(2));
    assert_eq!(keys(&mut redis.client(), "*"), Vec::<String>::new());
}

#[test]
fn dead_letters_of_database_3_stay_there() {
    let (redis, proxy) = Proxy::with_redis(DB_CONFIG);
    let mut c = proxy_in(&proxy, "3");
    c.cmd(&["LPUSH", "q1", "poison"]);
    for _ in 0..3 {
        assert_eq!(c.cmd(&["RPOP", "q1"]), Value::bulk("poison"));
        assert_eq!(c.cmd(&["NACK", "q1", "poison"]), Value::Int(1));
    }
    let mut direct = redis_in(&redis, "3");
    assert_eq!(lrange(&mut direct, "{q1}:dead"), vec!["poison"]);
    assert_eq!(info_int_in(&proxy, "3", "q1", "dead"), 1);
    let dead = c.cmd(&["QUEUE", "DEAD", "q1"]);
    assert_eq!(
        as_str(
            &fields(&match dead {
                Value::Array(items) => items[0].clone(),
                other => panic!("QUEUE DEAD: {other:?}"),
            })["payload"]
        ),
        "poison"
    );
    assert_eq!(info_int(&proxy, "q1", "dead"), 0);
    assert_eq!(keys(&mut redis.client(), "*"), Vec::<String>::new());
    // Expiries past the maximum die in database 3 too, by the reaper.
    c.cmd(&["LPUSH", "q2", "slow"]);
    for n in 1..=3 {
        wait_until(&format!("delivery {n} of slow"), || {
            c.cmd(&["RPOP", "q2"]) == Value::bulk("slow")
        });
    }
    wait_until("slow dead in database 3", || {
        lrange(&mut direct, "{q2}:dead") == vec!["slow"]
    });
    assert_eq!(c.cmd(&["QUEUE", "REDRIVE", "q2"]), Value::Int(1));
    assert_eq!(lrange(&mut direct, "q2"), vec!["slow"]);
    assert_eq!(keys(&mut redis.client(), "*"), Vec::<String>::new());
}

#[test]
fn a_blocking_pop_in_database_3_is_woken_by_a_push_there() {
    let (redis, proxy) = Proxy::with_redis(DB_CONFIG);
    let mut c = proxy_in(&proxy, "3");
    c.send(&["BRPOP", "w", "0"]);
    // Parked (a first try found nothing), then a push to database 0's w,
    // which is another list.
    let mut zero = redis.client();
    thread::sleep(Duration::from_millis(300));
    assert_eq!(zero.cmd(&["LPUSH", "w", "zero"]), Value::Int(1));
    c.set_read_timeout(Some(Duration::from_millis(300)));
    let mut probe = [0u8; 1];
    let early = std::io::Read::read(&mut c.stream(), &mut probe);
    assert!(early.is_err(), "woken by database 0's push: {probe:?}");
    c.set_read_timeout(Some(Duration::from_secs(10)));
    assert_eq!(
        redis_in(&redis, "3").cmd(&["LPUSH", "w", "hi"]),
        Value::Int(1)
    );
    assert_eq!(c.read_value(), Value::bulks(&["w", "hi"]));
    assert_eq!(info_int_in(&proxy, "3", "w", "leased"), 1);
    assert_eq!(c.cmd(&["ACK", "w", "hi"]), Value::Int(1));
    assert_eq!(lrange(&mut zero, "w"), vec!["zero"]);
    // Two pops parked in two databases on the same key name: each push
    // wakes its own database's.
    let mut five = proxy_in(&proxy, "5");
    five.send(&["BLPOP", "w2", "0"]);
    c.send(&["BLPOP", "w2", "0"]);
    thread::sleep(Duration::from_millis(300));
    redis_in(&redis, "5").cmd(&["RPUSH", "w2", "for5"]);
    redis_in(&redis, "3").cmd(&["RPUSH", "w2", "for3"]);
    assert_eq!(five.read_value(), Value::bulks(&["w2", "for5"]));
    assert_eq!(c.read_value(), Value::bulks(&["w2", "for3"]));
}

#[test]
fn a_closed_connection_in_database_3_requeues_there() {
    let (redis, proxy) = Proxy::with_redis(DB_CONFIG);
    {
        let mut c = proxy_in(&proxy, "3");
        c.cmd(&["LPUSH", "rq", "a", "b"]);
        assert_eq!(c.cmd(&["RPOP", "rq"]), Value::bulk("a"));
        assert_eq!(info_int_in(&proxy, "3", "rq", "leased"), 1);
    }
    // Lease 10 minutes, yet a is back now.
    let mut direct = redis_in(&redis, "3");
    wait_until("a back in database 3's rq", || {
        lrange(&mut direct, "rq") == vec!["b", "a"]
    });
    let i = info_in(&proxy, "3", "rq");
    assert_eq!(
        (as_int(&i["leased"]), as_int(&i["disconnects"])),
        (0, 1),
        "{i:?}"
    );
    assert_eq!(keys(&mut redis.client(), "*"), Vec::<String>::new());
}

/// redis-py, with a `redis://host:port/1` URL as Celery- and RQ-style
/// settings give it, when it is installed.
#[test]
fn a_redis_py_worker_on_database_1_pops_and_acks_its_own_queue() {
    if !redis_py_installed() {
        return;
    }
    let (redis, proxy) = Proxy::with_redis(STABLE_CONFIG);
    let script = r#"
import sys, redis
proxy, upstream = sys.argv[1], sys.argv[2]
r = redis.Redis.from_url(f"redis://127.0.0.1:{proxy}/1", socket_timeout=30)
producer = redis.Redis.from_url(f"redis://127.0.0.1:{upstream}/1")
for i in range(5):
    producer.lpush("qjobs", f"m{i}")
got = []
for i in range(5):
    key, m = r.brpop("qjobs", timeout=5)
    assert key == b"qjobs", key
    got.append(m)
    assert r.execute_command("ACK", "qjobs", m) == 1
assert got == [f"m{i}".encode() for i in range(5)], got
assert r.rpop("qjobs") is None
producer.lpush("qjobs", "last")
assert r.rpop("qjobs") == b"last"
info = r.execute_command("QUEUE", "INFO", "qjobs")
info = dict(zip(info[::2], info[1::2])) if isinstance(info, list) else info
assert int(info[b"leased"]) == 1, info
assert r.execute_command("ACK", "qjobs", "last") == 1
left = [k for k in producer.keys("*") if not k.endswith(b":stats")]
assert left == [], left
assert redis.Redis(port=int(upstream)).keys("*") == []
"#;
    python(script, &[&proxy.port.to_string(), &redis.port.to_string()]);
}

/// A blocking pop served at once answers like an RPOP; one that finds
/// nothing parks, and what the client sends behind it (in writes of their
/// own) waits for its reply, as behind a blocked client in Redis. The
/// request counts once, however it was served, and its timeout runs from
/// when it was sent.
#[test]
fn requests_behind_a_blocking_pop_wait_for_its_reply() {
    let redis = Redis::start();
    let metrics = free_port();
    let addr = format!("127.0.0.1:{metrics}");
    let proxy = Proxy::start_with_config(redis.port, LIFECYCLE_CONFIG, &["--metrics", &addr]);
    let queued = || metric(metrics, "ackproxy_commands_total{route=\"queue\"}").max(0.0);
    let mut direct = redis.client();
    let mut c = proxy.client();
    // Served at once: one reply, one command.
    direct.cmd(&["LPUSH", "wb1", "first"]);
    let before = queued();
    assert_eq!(
        c.cmd(&["BRPOP", "wb1", "5"]),
        Value::bulks(&["wb1", "first"])
    );
    wait_until("one queue command counted", || queued() == before + 1.0);
    // Parks: PING and RPOP sent behind it (in writes of their own) wait.
    let before = queued();
    c.send(&["BRPOP", "wb1", "0"]);
    wait_parked(metrics, 1);
    c.send(&["PING"]);
    c.send(&["RPOP", "wb1"]);
    c.set_read_timeout(Some(Duration::from_millis(300)));
    let mut probe = [0u8; 1];
    assert!(
        std::io::Read::read(&mut c.stream(), &mut probe).is_err(),
        "a reply came while the pop was parked"
    );
    direct.cmd(&["LPUSH", "wb1", "second", "third"]);
    c.set_read_timeout(Some(Duration::from_secs(5)));
    assert_eq!(
        decode(&c.try_read_raw().unwrap()).0,
        Value::bulks(&["wb1", "second"])
    );
    assert_eq!(
        decode(&c.try_read_raw().unwrap()).0,
        Value::Simple("PONG".into())
    );
    assert_eq!(decode(&c.try_read_raw().unwrap()).0, Value::bulk("third"));
    wait_until("the parked pop and the RPOP counted once each", || {
        queued() == before + 2.0
    });
    assert_eq!(metric(metrics, "ackproxy_parked_clients"), 0.0);
    // A parked pop's timeout runs from when it was sent.
    let sent = Instant::now();
    assert_eq!(c.cmd(&["BRPOP", "wb1", "0.3"]), Value::Nil);
    let waited = sent.elapsed();
    assert!(
        waited >= Duration::from_millis(290) && waited < Duration::from_secs(3),
        "timed out after {waited:?}"
    );
}
