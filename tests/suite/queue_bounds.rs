//! The queue layer under careless and hostile input: every script call stays
//! bounded, nothing is lost whatever the duplicates and ids, late ACKs and
//! NACKs leave nothing behind, and the proxy's own state stays small.

use std::time::{Duration, Instant};

use crate::common::*;

const CONFIG: &str = r#"
[[queue]]
pattern = "tasks:*"
lease_ms = 600000
max_deliveries = 5
ack_id = "payload"

[[queue]]
pattern = "short:*"
lease_ms = 300
max_deliveries = 50
ack_id = "payload"

[[queue]]
pattern = "last:*"
lease_ms = 300
max_deliveries = 50
ack_id = "payload"
redeliver = "last"

[[queue]]
pattern = "jshort:*"
lease_ms = 300
max_deliveries = 50
ack_id = "json:id"

[[queue]]
pattern = "json:*"
lease_ms = 600000
max_deliveries = 5
ack_id = "json:id"

[reaper]
interval_ms = 20
"#;

fn len_of(v: &Value) -> usize {
    match v {
        Value::Array(a) => a.len(),
        other => panic!("expected an array, got {other:?}"),
    }
}

fn field(v: &Value, name: &str) -> Value {
    let Value::Array(items) = v else {
        panic!("expected a map, got {v:?}")
    };
    for pair in items.chunks(2) {
        if pair[0] == Value::bulk(name) {
            return pair[1].clone();
        }
    }
    panic!("no field {name} in {v:?}")
}

/// Pushes `n` copies of `payload` in pipelined batches.
fn push_many(c: &mut Client, key: &str, payloads: impl Iterator<Item = String>) {
    let mut batch: Vec<String> = Vec::new();
    let flush = |c: &mut Client, batch: &mut Vec<String>| {
        if batch.is_empty() {
            return;
        }
        let mut args: Vec<&str> = vec!["RPUSH", key];
        args.extend(batch.iter().map(String::as_str));
        assert!(matches!(c.cmd(&args), Value::Int(_)));
        batch.clear();
    };
    for p in payloads {
        batch.push(p);
        if batch.len() == 1000 {
            flush(c, &mut batch);
        }
    }
    flush(c, &mut batch);
}

fn wait_until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The auxiliary keys left, but the queues' totals (see `is_queue_stats`).
fn aux_keys(direct: &mut Client) -> Vec<Value> {
    match direct.cmd(&["KEYS", "ackq:*"]) {
        Value::Array(a) => a
            .into_iter()
            .filter(|k| !matches!(k, Value::Bulk(b) if is_queue_stats(&String::from_utf8_lossy(b))))
            .collect(),
        other => panic!("KEYS: {other:?}"),
    }
}

#[test]
fn any_number_of_identical_payloads_in_flight_are_all_leased() {
    let (redis, proxy) = Proxy::with_redis(CONFIG);
    let mut c = proxy.client();
    push_many(&mut c, "short:dup", (0..1100).map(|_| "dup".to_string()));
    let popped = c.cmd(&["LPOP", "short:dup", "1100"]);
    assert_eq!(len_of(&popped), 1100);
    let info = c.cmd(&["QUEUE", "INFO", "short:dup"]);
    assert_eq!(int(&field(&info, "leased")), 1100, "{info:?}");
    // Every lease comes back when it expires: none lost.
    let mut direct = redis.client();
    wait_until("all 1100 back in the list", Duration::from_secs(20), || {
        int(&direct.cmd(&["LLEN", "short:dup"])) == 1100
    });
    assert_eq!(
        int(&field(&c.cmd(&["QUEUE", "INFO", "short:dup"]), "leased")),
        0
    );
}

/// Reads MONITOR lines until `stop` is seen; returns, for each function
/// call of the proxy, the function's name and its arguments after it.
fn monitored_calls(mon: &mut Client, stop: &str) -> Vec<(String, Vec<String>)> {
    let mut calls = Vec::new();
    loop {
        let Value::Simple(line) = mon.read_value() else {
            panic!("MONITOR")
        };
        if line.contains(stop) {
            return calls;
        }
        let Some(at) = line.find("] ") else { continue };
        // "FCALL" "name" "numkeys" ... — the proxy's args hold no quotes.
        let args: Vec<String> = line[at + 2..]
            .split("\" \"")
            .map(|a| a.trim_matches('"').to_string())
            .collect();
        if args[0].eq_ignore_ascii_case("fcall") {
            calls.push((args[1].clone(), args[2..].to_vec()));
        }
    }
}

#[test]
fn big_counts_and_many_ids_are_split_into_bounded_script_calls() {
    use ackproxy::queue::limits::{library, CALL_KEYS, IDS_PER_CALL, POP_BATCH, RULE_ARGS};

    let (redis, proxy) = Proxy::with_redis(CONFIG);
    let mut direct = redis.client();
    let mut c = proxy.client();
    // Thousands of calls, each copied to MONITOR: slow on a loaded machine.
    c.set_read_timeout(Some(Duration::from_secs(300)));
    let payload = |i: usize| format!("{i:08}:{}", "x".repeat(1014));
    push_many(&mut direct, "tasks:big", (0..30_000).map(payload));
    let mut mon = redis.client();
    assert_eq!(mon.cmd(&["MONITOR"]), Value::Simple("OK".into()));

    // The reply is what Redis sends: every element, in pop order.
    let popped = c.cmd(&["RPOP", "tasks:big", "20000"]);
    let Value::Array(items) = popped else {
        panic!("RPOP with COUNT: {popped:?}")
    };
    assert_eq!(items.len(), 20_000);
    assert_eq!(items[0], Value::bulk(&payload(29_999)));
    assert_eq!(items[19_999], Value::bulk(&payload(10_000)));
    // More than is left: all of it, as Redis would.
    let rest = c.cmd(&["LPOP", "tasks:big", "1000000"]);
    assert_eq!(len_of(&rest), 10_000);
    assert_eq!(int(&direct.cmd(&["EXISTS", "tasks:big"])), 0);

    // ACK of 30,000 leased ids and of 100,000 unknown ones.
    let ids: Vec<String> = (0..30_000).map(payload).collect();
    let mut args: Vec<&str> = vec!["ACK", "tasks:big"];
    args.extend(ids.iter().map(String::as_str));
    assert_eq!(c.cmd(&args), Value::Int(30_000));
    let unknown: Vec<String> = (0..100_000).map(|i| format!("nope{i}")).collect();
    let mut args: Vec<&str> = vec!["ACK", "tasks:big"];
    args.extend(unknown.iter().map(String::as_str));
    assert_eq!(c.cmd(&args), Value::Int(0));
    assert!(aux_keys(&mut direct).is_empty());
    direct.cmd(&["ECHO", "end-of-test"]);

    // Every script call asked for a bounded amount of work.
    let calls = monitored_calls(&mut mon, "end-of-test");
    let (mut pops, mut acks) = (0, 0);
    for (sha, args) in &calls {
        let numkeys: usize = args[0].parse().unwrap();
        let argv = &args[1 + numkeys..];
        if sha == library::POP.name() || sha == library::POP1.name() {
            pops += 1;
            // pop1 takes the rule first and the count last (lua/pop1.lua).
            let at = if sha == library::POP.name() {
                2
            } else {
                RULE_ARGS + 1
            };
            let count: u64 = argv[at].parse().unwrap();
            assert!(count <= POP_BATCH, "a pop call for {count} elements");
            assert_eq!(numkeys, CALL_KEYS);
        } else if sha == library::ACK.name() {
            acks += 1;
            let n = argv.len() - RULE_ARGS;
            assert!(n <= IDS_PER_CALL, "an ACK call with {n} ids");
        }
    }
    assert!(pops >= 30_000 / POP_BATCH as usize, "{pops} pop calls");
    assert!(acks >= 130_000 / IDS_PER_CALL, "{acks} ACK calls");
}

#[test]
fn numeric_json_ids_are_taken_as_written() {
    let (redis, proxy) = Proxy::with_redis(CONFIG);
    let mut c = proxy.client();
    let msgs = [
        (r#"{"id":1234567890123456789,"n":1}"#, "1234567890123456789"),
        (r#"{"id":1234567890123456788,"n":2}"#, "1234567890123456788"),
        (r#"{"n":3, "id" : -42 }"#, "-42"),
        (r#"{"id":1.50e3,"x":[1,{"id":9}]}"#, "1.50e3"),
        (r#"{"x":{"id":7},"id":"a\"b"}"#, "a\"b"),
        (
            r#"{"i\u0064":99999999999999999999}"#,
            "99999999999999999999",
        ),
    ];
    for (m, _) in &msgs {
        c.cmd(&["LPUSH", "json:ids", m]);
    }
    assert_eq!(len_of(&c.cmd(&["RPOP", "json:ids", "10"])), msgs.len());
    let leases = c.cmd(&["QUEUE", "LEASES", "json:ids", "COUNT", "10"]);
    let Value::Array(leases) = leases else {
        panic!("{leases:?}")
    };
    let mut ids: Vec<Value> = leases.iter().map(|l| field(l, "id")).collect();
    ids.sort_by_key(|v| format!("{v:?}"));
    let mut want: Vec<Value> = msgs.iter().map(|(_, id)| Value::bulk(id)).collect();
    want.sort_by_key(|v| format!("{v:?}"));
    assert_eq!(ids, want);
    // Two ids one apart are two ids.
    assert_eq!(
        c.cmd(&["ACK", "json:ids", "1234567890123456789"]),
        Value::Int(1)
    );
    assert_eq!(
        c.cmd(&["ACK", "json:ids", "1234567890123456789"]),
        Value::Int(0)
    );
    for (_, id) in &msgs[1..] {
        assert_eq!(c.cmd(&["ACK", "json:ids", id]), Value::Int(1), "id {id}");
    }
    assert!(aux_keys(&mut redis.client()).is_empty());
}

#[test]
fn late_acks_never_hide_a_real_message_and_leave_nothing_behind() {
    let (redis, proxy) = Proxy::with_redis(CONFIG);
    let mut c = proxy.client();
    let mut direct = redis.client();
    let names: Vec<String> = (0..150).map(|i| format!("m{i}")).collect();
    push_many(&mut c, "short:late", names.iter().cloned());
    assert_eq!(len_of(&c.cmd(&["RPOP", "short:late", "150"])), 150);
    wait_until("the leases to expire", Duration::from_secs(10), || {
        int(&direct.cmd(&["LLEN", "short:late"])) == 150
    });
    for n in &names {
        assert_eq!(
            c.cmd(&["ACK", "short:late", n]),
            Value::Int(1),
            "late ACK {n}"
        );
    }
    // The late-acked copies are gone: nothing is ready, nothing is kept.
    let info = c.cmd(&["QUEUE", "INFO", "short:late"]);
    assert_eq!(int(&field(&info, "ready")), 0, "{info:?}");
    assert!(
        aux_keys(&mut direct).is_empty(),
        "{:?}",
        aux_keys(&mut direct)
    );
    c.cmd(&["LPUSH", "short:late", "real"]);
    assert_eq!(c.cmd(&["RPOP", "short:late"]), Value::bulk("real"));
}

#[test]
fn a_pop_longer_than_its_lease_never_returns_its_own_redeliveries() {
    let (_redis, proxy) = Proxy::with_redis(CONFIG);
    let mut c = proxy.client();
    const N: usize = 100_000;
    push_many(&mut c, "short:long", (0..N).map(|i| format!("m{i}")));
    // 2,000 bounded calls: far longer than the rule's 300 ms lease.
    let Value::Array(got) = c.cmd(&["RPOP", "short:long", &N.to_string()]) else {
        panic!("RPOP with a count answers an array")
    };
    let names = bulk_strings(&got, "popped");
    let mut seen = std::collections::HashSet::new();
    for n in &names {
        assert!(seen.insert(n), "{n} twice in one reply of {}", names.len());
    }
    assert!(!names.is_empty());
    // What the reply holds is acknowledged; everything else is still
    // there, in the list or coming back to it.
    for chunk in names.chunks(1000) {
        let mut args = vec!["ACK", "short:long"];
        args.extend(chunk.iter().map(String::as_str));
        c.cmd(&args);
    }
    wait_until("the rest back in the list", Duration::from_secs(60), || {
        let info = c.cmd(&["QUEUE", "INFO", "short:long"]);
        int(&field(&info, "ready")) as usize == N - got.len() && int(&field(&info, "leased")) == 0
    });
}

/// A copy of `payload` whose lease ran out is back in `q`; `take` makes it
/// disappear behind the proxy's back; the first worker's ACK comes late;
/// then a producer pushes `next`, with the same id.
fn late_ack_of_a_vanished_copy(q: &str, payload: &str, id: &str, next: &str, take: &[&str]) {
    let (redis, proxy) = Proxy::with_redis(CONFIG);
    let mut c = proxy.client();
    let mut direct = redis.client();
    c.cmd(&["LPUSH", q, payload]);
    assert_eq!(c.cmd(&["RPOP", q]), Value::bulk(payload));
    wait_until("the lease to run out", Duration::from_secs(10), || {
        int(&direct.cmd(&["LLEN", q])) == 1
    });
    direct.cmd(take);
    assert_eq!(int(&direct.cmd(&["LLEN", q])), 0);
    c.cmd(&["ACK", q, id]);
    c.cmd(&["LPUSH", q, next]);
    assert_eq!(
        c.cmd(&["RPOP", q]),
        Value::bulk(next),
        "the new message with id {id} was taken for the vanished copy"
    );
    assert_eq!(c.cmd(&["ACK", q, id]), Value::Int(1));
}

#[test]
fn a_late_ack_cancels_only_the_copy_it_was_made_for() {
    // Popped straight from Redis by a worker not yet behind the proxy.
    late_ack_of_a_vanished_copy("short:v1", "m1", "m1", "m1", &["RPOP", "short:v1"]);
    // The queue deleted.
    late_ack_of_a_vanished_copy("short:v2", "m1", "m1", "m1", &["DEL", "short:v2"]);
    // A new message that reuses the id, with another body.
    late_ack_of_a_vanished_copy(
        "jshort:v3",
        r#"{"id":"7","v":1}"#,
        "7",
        r#"{"id":"7","v":2}"#,
        &["RPOP", "jshort:v3"],
    );
}

#[test]
fn late_acks_of_buried_copies_are_skipped_however_many() {
    let (redis, proxy) = Proxy::with_redis(CONFIG);
    let mut c = proxy.client();
    let mut direct = redis.client();
    // Copies go back behind everything ("last"), then 3,000 newer messages
    // bury them deeper than a late ACK looks: they are cancelled instead.
    let names: Vec<String> = (0..150).map(|i| format!("m{i}")).collect();
    push_many(&mut c, "last:late", names.iter().cloned());
    assert_eq!(len_of(&c.cmd(&["RPOP", "last:late", "150"])), 150);
    wait_until("the leases to expire", Duration::from_secs(10), || {
        int(&direct.cmd(&["LLEN", "last:late"])) == 150
    });
    // Producers push at the left, where the copies went back.
    for i in 0..3000 {
        direct.send(&["LPUSH", "last:late", &format!("new{i}")]);
    }
    for _ in 0..3000 {
        direct.read_raw();
    }
    for n in &names {
        assert_eq!(
            c.cmd(&["ACK", "last:late", n]),
            Value::Int(1),
            "late ACK {n}"
        );
    }
    let info = c.cmd(&["QUEUE", "INFO", "last:late"]);
    assert_eq!(int(&field(&info, "ready")), 3000, "{info:?}");
    // The 150 cancelled copies sit at the pop end: one RPOP skips them all
    // (more than one script call's worth) and returns a real message.
    assert_eq!(c.cmd(&["RPOP", "last:late"]), Value::bulk("new0"));
    // A pop of many ends after half a lease (300 ms here) with what it
    // has: on a loaded machine it may take more than one to get them all.
    let mut rest = 0;
    for _ in 0..50 {
        rest += len_of(&c.cmd(&["RPOP", "last:late", "5000"]));
        if rest >= 2999 {
            break;
        }
    }
    assert_eq!(rest, 2999);
    let all: Vec<String> = (1..3000).map(|i| format!("new{i}")).collect();
    let mut args: Vec<&str> = vec!["ACK", "last:late", "new0"];
    args.extend(all.iter().map(String::as_str));
    assert_eq!(c.cmd(&args), Value::Int(3000));
    assert!(
        aux_keys(&mut direct).is_empty(),
        "{:?}",
        aux_keys(&mut direct)
    );
}

#[test]
fn nack_of_a_move_lease_returns_the_message_at_once() {
    let (_redis, proxy) = Proxy::with_redis(CONFIG);
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "tasks:x", "t1"]);
    assert_eq!(c.cmd(&["RPOPLPUSH", "tasks:x", "dst"]), Value::bulk("t1"));
    assert_eq!(c.cmd(&["NACK", "tasks:x", "t1"]), Value::Int(1));
    assert_eq!(c.cmd(&["LLEN", "dst"]), Value::Int(0));
    assert_eq!(c.cmd(&["RPOP", "tasks:x"]), Value::bulk("t1"));
    let leases = c.cmd(&["QUEUE", "LEASES", "tasks:x"]);
    let Value::Array(l) = &leases else {
        panic!("{leases:?}")
    };
    assert_eq!(l.len(), 1, "{leases:?}");
    assert_eq!(field(&l[0], "deliveries"), Value::Int(2));
    assert!(int(&field(&l[0], "expires-in-ms")) > 0, "{leases:?}");
}

#[test]
fn extend_refuses_absurd_leases() {
    let (_redis, proxy) = Proxy::with_redis(CONFIG);
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "tasks:e", "e1"]);
    c.cmd(&["RPOP", "tasks:e"]);
    for ms in ["9223372036854775807", "0", "-5", "2592000001"] {
        let r = c.cmd(&["QUEUE", "EXTEND", "tasks:e", "e1", ms]);
        assert!(
            matches!(&r, Value::Error(e) if e.starts_with("ERR value is out of range")),
            "EXTEND {ms}: {r:?}"
        );
    }
    assert_eq!(
        c.cmd(&["QUEUE", "EXTEND", "tasks:e", "e1", "2592000000"]),
        Value::Int(1)
    );
}

#[test]
fn delays_are_held_to_the_extend_bound() {
    let (_redis, proxy) = Proxy::with_redis(CONFIG);
    let mut c = proxy.client();
    let too_long = "ERR value is out of range, must be at most 2592000000";
    c.cmd(&["LPUSH", "tasks:n", "n1"]);
    c.cmd(&["RPOP", "tasks:n"]);
    // 2^52 ms is the year 144,737; one ms past 30 days is already too long.
    for ms in ["4503599627370496", "2592000001"] {
        assert_eq!(
            c.cmd(&["NACK", "tasks:n", "n1", "DELAY", ms]),
            Value::Error(too_long.into()),
            "NACK DELAY {ms}"
        );
        assert_eq!(
            c.cmd(&["QUEUE", "PUSH", "tasks:n", "p", "DELAY", ms]),
            Value::Error(too_long.into()),
            "QUEUE PUSH DELAY {ms}"
        );
    }
    // Nothing was nacked, nor pushed.
    let info = c.cmd(&["QUEUE", "INFO", "tasks:n"]);
    assert_eq!(
        (int(&field(&info, "leased")), int(&field(&info, "delayed"))),
        (1, 0)
    );
    // AT is a time on Redis's clock: only held to the year 3000.
    assert_eq!(
        c.cmd(&["QUEUE", "PUSH", "tasks:n", "p", "AT", "32503680000001"]),
        Value::Error("ERR value is out of range, must be at most 32503680000000".into())
    );
    assert_eq!(
        c.cmd(&["QUEUE", "PUSH", "tasks:n", "p", "AT", "32503680000000"]),
        Value::Int(1)
    );
    // 30 days itself is allowed, as for QUEUE EXTEND.
    assert_eq!(
        c.cmd(&["QUEUE", "PUSH", "tasks:n", "p", "DELAY", "2592000000"]),
        Value::Int(1)
    );
    assert_eq!(
        c.cmd(&["NACK", "tasks:n", "n1", "DELAY", "2592000000"]),
        Value::Int(1)
    );
    let info = c.cmd(&["QUEUE", "INFO", "tasks:n"]);
    assert_eq!(
        (int(&field(&info, "leased")), int(&field(&info, "delayed"))),
        (0, 3)
    );
}

#[test]
fn parked_queue_pops_answer_when_redis_is_down() {
    let (mut redis, proxy) = Proxy::with_redis(CONFIG);
    let mut parked = proxy.client();
    parked.send(&["BRPOP", "tasks:down", "0"]);
    let mut mover = proxy.client();
    mover.send(&["BLMOVE", "tasks:down2", "d", "LEFT", "LEFT", "0"]);
    std::thread::sleep(Duration::from_millis(200));
    redis.kill();
    for c in [&mut parked, &mut mover] {
        c.set_read_timeout(Some(Duration::from_secs(5)));
        let r = c.try_read_raw().expect("a reply while Redis is down");
        assert!(
            r.starts_with(b"-ERR upstream"),
            "{}",
            String::from_utf8_lossy(&r)
        );
    }
    // A new blocking pop on a queue gets its error at once, as plain ones do.
    let mut late = proxy.client();
    late.set_read_timeout(Some(Duration::from_secs(5)));
    late.send(&["BRPOP", "tasks:down", "0"]);
    let r = late.try_read_raw().expect("a reply while Redis is down");
    assert!(
        r.starts_with(b"-ERR upstream"),
        "{}",
        String::from_utf8_lossy(&r)
    );
}

fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[test]
fn long_queue_names_do_not_grow_the_proxy() {
    let (_redis, proxy) = Proxy::with_redis(CONFIG);
    let mut c = proxy.client();
    let big = "n".repeat(64 * 1024);
    for i in 0..500 {
        let q = format!("tasks:{i}:{big}");
        assert_eq!(c.cmd(&["ACK", &q, "x"]), Value::Int(0));
        // Move pops remember destinations: long ones too.
        let d = format!("dst:{i}:{big}");
        assert_eq!(c.cmd(&["RPOPLPUSH", &q, &d]), Value::Nil);
    }
    let rss = rss_kb(proxy.pid());
    assert!(
        rss < 100 * 1024,
        "proxy RSS {rss} kB after 500 64 KB queue names"
    );
}

fn fcall_calls(direct: &mut Client) -> i64 {
    let Value::Bulk(info) = direct.cmd(&["INFO", "commandstats"]) else {
        panic!("INFO")
    };
    let info = String::from_utf8_lossy(&info).into_owned();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_fcall:calls="))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn an_idle_proxy_sends_nothing_however_many_queues_were_used() {
    let (redis, proxy) = Proxy::with_redis(CONFIG);
    let mut c = proxy.client();
    for i in 0..5000 {
        c.send(&["RPOP", &format!("tasks:k{i}")]);
    }
    for _ in 0..5000 {
        assert_eq!(c.read_value(), Value::Nil);
    }
    // One queue with a lease that is acked: known to the reaper, then not.
    c.cmd(&["LPUSH", "short:one", "a"]);
    c.cmd(&["RPOP", "short:one"]);
    c.cmd(&["ACK", "short:one", "a"]);
    let mut direct = redis.client();
    std::thread::sleep(Duration::from_millis(500));
    let before = fcall_calls(&mut direct);
    std::thread::sleep(Duration::from_secs(2));
    let after = fcall_calls(&mut direct);
    assert!(
        after - before <= 4,
        "{} FCALL in 2 s with no traffic",
        after - before
    );
}

#[test]
fn pushes_nacks_and_redrives_of_many_are_split_into_bounded_script_calls() {
    use ackproxy::queue::limits::{
        library, CALL_KEYS, IDS_PER_CALL, PUSH_PER_CALL, REDRIVE_PER_CALL, RULE_ARGS,
    };

    let config = format!("{CONFIG}\n[[queue]]\npattern = \"once:*\"\nmax_deliveries = 1\n");
    let (redis, proxy) = Proxy::with_redis(&config);
    let mut direct = redis.client();
    let mut c = proxy.client();
    let mut mon = redis.client();
    assert_eq!(mon.cmd(&["MONITOR"]), Value::Simple("OK".into()));

    let names: Vec<String> = (0..3000).map(|i| format!("m{i}")).collect();
    let mut push: Vec<&str> = vec!["QUEUE", "PUSH", "once:q"];
    push.extend(names.iter().map(String::as_str));
    push.extend(["DELAY", "0"]);
    assert_eq!(c.cmd(&push), Value::Int(3000));
    assert_eq!(len_of(&c.cmd(&["LPOP", "once:q", "3000"])), 3000);
    // Past max deliveries: every NACK sends its message to the dead letters.
    let mut nack: Vec<&str> = vec!["NACK", "once:q"];
    nack.extend(names.iter().map(String::as_str));
    nack.extend(["DELAY", "10"]);
    assert_eq!(c.cmd(&nack), Value::Int(3000));
    assert_eq!(int(&direct.cmd(&["LLEN", "{once:q}:dead"])), 3000);
    assert_eq!(
        c.cmd(&["QUEUE", "REDRIVE", "once:q", "COUNT", "2500"]),
        Value::Int(2500)
    );
    assert_eq!(int(&direct.cmd(&["LLEN", "once:q"])), 2500);
    direct.cmd(&["ECHO", "end-of-test"]);

    let calls = monitored_calls(&mut mon, "end-of-test");
    let (mut pushes, mut nacks, mut redrives) = (0, 0, 0);
    for (sha, args) in &calls {
        let numkeys: usize = args[0].parse().unwrap();
        let argv = &args[1 + numkeys..];
        if sha == library::PUSH.name() {
            pushes += 1;
            assert_eq!(numkeys, CALL_KEYS);
            let n = argv.len() - RULE_ARGS - 2;
            assert!(n <= PUSH_PER_CALL, "a push of {n} messages");
        } else if sha == library::NACK.name() {
            nacks += 1;
            let n = argv.len() - RULE_ARGS - 1;
            assert!(n <= IDS_PER_CALL, "a NACK of {n} ids");
        } else if sha == library::REDRIVE.name() {
            redrives += 1;
            let n: i64 = argv[RULE_ARGS].parse().unwrap();
            assert!(n <= REDRIVE_PER_CALL, "a redrive of {n}");
        }
    }
    assert!(pushes >= 3000 / PUSH_PER_CALL, "{pushes} push calls");
    assert!(nacks >= 3000 / IDS_PER_CALL, "{nacks} NACK calls");
    assert!(
        redrives >= 2500 / REDRIVE_PER_CALL as usize,
        "{redrives} redrive calls"
    );
}

#[test]
fn dead_letter_histories_stay_within_their_bound() {
    use ackproxy::queue::limits::DEAD_HISTORY;

    let config = format!("{CONFIG}\n[[queue]]\npattern = \"once:*\"\nmax_deliveries = 1\n");
    let (redis, proxy) = Proxy::with_redis(&config);
    let mut direct = redis.client();
    let mut c = proxy.client();
    let n = DEAD_HISTORY as usize + 50;
    push_many(&mut direct, "once:h", (0..n).map(|i| format!("m{i}")));
    assert_eq!(len_of(&c.cmd(&["RPOP", "once:h", &n.to_string()])), n);
    let ids: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
    let mut nack: Vec<&str> = vec!["NACK", "once:h"];
    nack.extend(ids.iter().map(String::as_str));
    assert_eq!(c.cmd(&nack), Value::Int(n as i64));
    // Every payload stays a dead letter; only so many histories are kept.
    assert_eq!(int(&direct.cmd(&["LLEN", "{once:h}:dead"])), n as i64);
    assert_eq!(
        int(&direct.cmd(&["HLEN", "ackq:{once:h}:once:h:history"])),
        DEAD_HISTORY as i64
    );
    let shown = c.cmd(&["QUEUE", "DEAD", "once:h", "COUNT", "1000"]);
    assert_eq!(len_of(&shown), 1000);
}

/// The refusal of a request that must be one script call but asks for more
/// than one call takes.
fn above_one_call(reply: &Value, bound: u64) {
    let Value::Error(e) = reply else {
        panic!("expected the refusal, got {reply:?}")
    };
    assert!(
        e.starts_with("ERR ackproxy: ") && e.contains(&format!("above {bound}")),
        "{e}"
    );
}

#[test]
fn inside_multi_a_queue_operation_above_the_bound_of_one_call_is_refused() {
    use ackproxy::queue::limits::{
        IDS_PER_CALL, POP_BATCH, PUSH_PER_CALL, REDRIVE_PER_CALL, SOURCES_PER_CALL,
    };

    let (redis, proxy) = Proxy::with_redis(CONFIG);
    let mut direct = redis.client();
    let mut c = proxy.client();
    const N: usize = 400_000;
    push_many(
        &mut direct,
        "tasks:multi",
        (0..N).map(|i| format!("{i:08}")),
    );

    // Another client of Redis, directly, keeps being served meanwhile.
    let port = redis.port;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pinger = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut other = Client::connect(port);
            let mut slowest = Duration::ZERO;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                assert_eq!(other.cmd(&["PING"]), Value::Simple("PONG".into()));
                slowest = slowest.max(t.elapsed());
                std::thread::sleep(Duration::from_millis(5));
            }
            slowest
        })
    };
    assert_eq!(c.cmd(&["MULTI"]), Value::Simple("OK".into()));
    let queued = c.cmd(&["RPOP", "tasks:multi", &N.to_string()]);
    let exec = c.cmd(&["EXEC"]);
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let slowest = pinger.join().unwrap();
    assert!(slowest < Duration::from_secs(1), "a PING took {slowest:?}");
    above_one_call(&queued, POP_BATCH);
    assert_eq!(
        exec,
        Value::Error("EXECABORT Transaction discarded because of previous errors.".into())
    );
    assert_eq!(int(&direct.cmd(&["LLEN", "tasks:multi"])), N as i64);

    // At the bound, inside MULTI, a pop is one call as before.
    let at = POP_BATCH.to_string();
    assert_eq!(c.cmd(&["MULTI"]), Value::Simple("OK".into()));
    assert_eq!(
        c.cmd(&["RPOP", "tasks:multi", &at]),
        Value::Simple("QUEUED".into())
    );
    assert_eq!(
        c.cmd(&["LMPOP", "1", "tasks:multi", "LEFT", "COUNT", &at]),
        Value::Simple("QUEUED".into())
    );
    let Value::Array(replies) = c.cmd(&["EXEC"]) else {
        panic!("EXEC")
    };
    assert_eq!(
        replies[0],
        Value::Array(
            (N - POP_BATCH as usize..N)
                .rev()
                .map(|i| Value::bulk(&format!("{i:08}")))
                .collect()
        )
    );
    assert_eq!(
        replies[1],
        Value::Array(vec![
            Value::bulk("tasks:multi"),
            Value::Array(
                (0..POP_BATCH)
                    .map(|i| Value::bulk(&format!("{i:08}")))
                    .collect()
            ),
        ])
    );

    // Every operation that is split outside MULTI, one past its bound.
    let ids: Vec<String> = (0..=IDS_PER_CALL).map(|i| format!("{i:08}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let messages: Vec<String> = (0..=PUSH_PER_CALL).map(|i| format!("p{i}")).collect();
    let messages: Vec<&str> = messages.iter().map(String::as_str).collect();
    let keys: Vec<String> = (0..=SOURCES_PER_CALL)
        .map(|i| format!("tasks:k{i}"))
        .collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let over = (POP_BATCH + 1).to_string();
    let redrive_over = (REDRIVE_PER_CALL + 1).to_string();
    let nkeys = keys.len().to_string();
    let cases: Vec<(Vec<&str>, u64)> = vec![
        (vec!["LPOP", "tasks:multi", &over], POP_BATCH),
        (
            [
                &["LMPOP", "1", "tasks:multi", "LEFT", "COUNT"][..],
                &[&over],
            ]
            .concat(),
            POP_BATCH,
        ),
        (
            [
                &["BLMPOP", "0", "1", "tasks:multi", "RIGHT", "COUNT"][..],
                &[&over],
            ]
            .concat(),
            POP_BATCH,
        ),
        (
            [&["BRPOP"][..], &keys, &["0"]].concat(),
            SOURCES_PER_CALL as u64,
        ),
        (
            [&["LMPOP", &nkeys][..], &keys, &["LEFT"]].concat(),
            SOURCES_PER_CALL as u64,
        ),
        (
            [&["ACK", "tasks:multi"][..], &ids].concat(),
            IDS_PER_CALL as u64,
        ),
        (
            [&["NACK", "tasks:multi"][..], &ids].concat(),
            IDS_PER_CALL as u64,
        ),
        (
            [&["QUEUE", "PUSH", "tasks:multi"][..], &messages].concat(),
            PUSH_PER_CALL as u64,
        ),
        (
            vec!["QUEUE", "REDRIVE", "tasks:multi", "COUNT", &redrive_over],
            REDRIVE_PER_CALL as u64,
        ),
        (
            vec!["QUEUE", "REDRIVE", "tasks:multi"],
            REDRIVE_PER_CALL as u64,
        ),
    ];
    for (cmd, bound) in &cases {
        assert_eq!(c.cmd(&["MULTI"]), Value::Simple("OK".into()));
        assert_eq!(c.cmd(&["SET", "tx", "1"]), Value::Simple("QUEUED".into()));
        let reply = c.cmd(cmd);
        if cmd == &["QUEUE", "REDRIVE", "tasks:multi"] {
            let Value::Error(e) = &reply else {
                panic!("{reply:?}")
            };
            assert!(e.contains(&format!("at most {bound}")), "{e}");
        } else {
            above_one_call(&reply, *bound);
        }
        assert_eq!(
            c.cmd(&["EXEC"]),
            Value::Error("EXECABORT Transaction discarded because of previous errors.".into()),
            "{}",
            cmd[0]
        );
        assert_eq!(direct.cmd(&["EXISTS", "tx"]), Value::Int(0), "{}", cmd[0]);
    }
    // At their bounds they are queued and run.
    let at_ids = &ids[..IDS_PER_CALL];
    let at_messages = &messages[..PUSH_PER_CALL];
    assert_eq!(c.cmd(&["MULTI"]), Value::Simple("OK".into()));
    for cmd in [
        [&["ACK", "tasks:multi"][..], at_ids].concat(),
        [&["QUEUE", "PUSH", "tasks:multi"][..], at_messages].concat(),
        [&["BRPOP"][..], &keys[..SOURCES_PER_CALL], &["0"]].concat(),
    ] {
        assert_eq!(c.cmd(&cmd), Value::Simple("QUEUED".into()), "{}", cmd[0]);
    }
    assert_eq!(
        c.cmd(&["EXEC"]),
        Value::Array(vec![
            Value::Int(IDS_PER_CALL as i64),
            Value::Int(PUSH_PER_CALL as i64),
            Value::Nil,
        ])
    );

    // During a client pause made through the proxy a request is one call
    // too: the same bound, refused at once.
    let mut admin = proxy.client();
    assert_eq!(
        admin.cmd(&["CLIENT", "PAUSE", "10000", "WRITE"]),
        Value::Simple("OK".into())
    );
    above_one_call(&c.cmd(&["RPOP", "tasks:multi", &over]), POP_BATCH);
    above_one_call(
        &c.cmd(&[&["ACK", "tasks:multi"][..], &ids].concat()),
        IDS_PER_CALL as u64,
    );
    assert_eq!(
        admin.cmd(&["CLIENT", "UNPAUSE"]),
        Value::Simple("OK".into())
    );
    assert_eq!(
        int(&direct.cmd(&["LLEN", "tasks:multi"])),
        (N - 100 + PUSH_PER_CALL) as i64
    );
}
