//! The message lifecycle beyond one lease: delayed delivery (`QUEUE PUSH
//! … DELAY|AT`), NACK with a delay and per-rule retry backoff, dead letters
//! with their history (`QUEUE DEAD`, `REDRIVE`, `PURGE`), the totals of
//! `QUEUE INFO`, the `next-pop` ack policy, requeue on disconnect and
//! shadow mode. Delays are short (100–300 ms); every wait is for a
//! condition, with a generous deadline, never for a fixed time.

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::*;

const CONFIG: &str = r#"
[[queue]]
pattern = "d*"
lease_ms = 600000
max_deliveries = 3
ack_id = "payload"

[[queue]]
pattern = "short*"
lease_ms = 100
max_deliveries = 100
ack_id = "payload"

[[queue]]
pattern = "left*"
lease_ms = 600000
ack_id = "payload"
pop_end = "left"

[[queue]]
pattern = "exp*"
lease_ms = 600000
max_deliveries = 100
ack_id = "payload"
retry_backoff = "exp"
retry_base_ms = 100
retry_max_ms = 400
retry_jitter = 0.0

[[queue]]
pattern = "jit*"
lease_ms = 600000
max_deliveries = 100
ack_id = "payload"
retry_backoff = "fixed"
retry_base_ms = 200
retry_jitter = 0.5

[[queue]]
pattern = "back*"
lease_ms = 100
max_deliveries = 100
ack_id = "payload"
retry_backoff = "fixed"
retry_base_ms = 300
retry_jitter = 0.0

[[queue]]
pattern = "hist*"
lease_ms = 100
max_deliveries = 3
ack_id = "json:id"

[[queue]]
pattern = "one*"
lease_ms = 600000
max_deliveries = 1
ack_id = "payload"

[[queue]]
pattern = "cap*"
lease_ms = 600000
max_deliveries = 1
ack_id = "payload"
dead_max = 2

[[queue]]
pattern = "np*"
# Long enough that a loaded machine runs a test's steps within one lease.
lease_ms = 1500
max_deliveries = 100
ack_id = "payload"
ack = "next-pop"

[[queue]]
pattern = "rq*"
lease_ms = 600000
max_deliveries = 100
ack_id = "payload"
requeue_on_disconnect = true

[[queue]]
pattern = "sh*"
lease_ms = 100
max_deliveries = 1
ack_id = "payload"
shadow = true

[[queue]]
pattern = "marks*"
lease_ms = 600000
max_deliveries = 100
ack_id = "json:id"

[reaper]
interval_ms = 20
"#;

/// How long a condition may take on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(10);

/// Polls `f` until it gives a value, failing after [`PATIENCE`].
fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Pops with `RPOP` until a message comes; returns it.
fn pop_eventually(c: &mut Client, q: &str) -> String {
    eventually(&format!("a message in {q}"), || match c.cmd(&["RPOP", q]) {
        Value::Nil => None,
        Value::Bulk(b) => Some(String::from_utf8_lossy(&b).into_owned()),
        other => panic!("RPOP {q}: {other:?}"),
    })
}

fn pop_all(c: &mut Client, q: &str) -> Vec<String> {
    match c.cmd(&["RPOP", q, "1000"]) {
        Value::Nil => vec![],
        Value::Array(items) => items.iter().map(as_str).collect(),
        other => panic!("RPOP {q} 1000: {other:?}"),
    }
}

fn start() -> (Redis, Proxy) {
    let (redis, proxy) = Proxy::with_redis(CONFIG);
    (redis, proxy)
}

/// A proxy with its metrics endpoint; returns the endpoint's port too.
fn start_with_metrics(config: &str) -> (Redis, Proxy, u16) {
    let redis = Redis::start();
    let metrics = free_port();
    let addr = format!("127.0.0.1:{metrics}");
    let proxy = Proxy::start_with_config(redis.port, config, &["--metrics", &addr]);
    (redis, proxy, metrics)
}

/// The value of a series of the metrics endpoint (0 while it is absent).
fn metric(port: u16, series: &str) -> f64 {
    crate::common::metric(port, series).max(0.0)
}

/// Waits until the proxy has `n` blocking pops parked.
fn wait_parked(metrics: u16, n: usize) {
    eventually(&format!("{n} parked pops"), || {
        (metric(metrics, "ackproxy_parked_clients") == n as f64).then_some(())
    });
}

// ------------------------------------------------------- delayed delivery

#[test]
fn a_delayed_message_is_not_poppable_before_its_time_and_is_after() {
    let (_redis, proxy) = start();
    let mut c = proxy.client();
    let pushed = Instant::now();
    assert_eq!(
        c.cmd(&["QUEUE", "PUSH", "d1", "later", "DELAY", "1000"]),
        Value::Int(1)
    );
    assert_eq!(c.cmd(&["RPOP", "d1"]), Value::Nil, "popped before its time");
    assert_eq!(queue_info_int(&proxy, "d1", "delayed"), 1);
    assert_eq!(queue_info_int(&proxy, "d1", "ready"), 0);
    assert_eq!(pop_eventually(&mut c, "d1"), "later");
    let waited = pushed.elapsed();
    // Due 1 s after Redis received the push, which was after `pushed`
    // (long enough that a loaded machine still checks it before).
    assert!(
        waited >= Duration::from_millis(990),
        "delivered after {waited:?}"
    );
    let i = queue_info(&proxy, "d1");
    assert_eq!(int(&i["delayed"]), 0);
    assert_eq!(int(&i["leased"]), 1);
    assert_eq!(int(&i["promoted"]), 1);
    assert_eq!(c.cmd(&["ACK", "d1", "later"]), Value::Int(1));
}

#[test]
fn a_parked_blocking_pop_is_woken_when_a_delayed_message_falls_due() {
    let (_redis, proxy, metrics) = start_with_metrics(CONFIG);
    let mut parked = proxy.client();
    parked.send(&["BRPOP", "d2", "0"]);
    // Parked before the push; nobody pushes afterwards.
    wait_parked(metrics, 1);
    let mut c = proxy.client();
    let pushed = Instant::now();
    assert_eq!(
        c.cmd(&["QUEUE", "PUSH", "d2", "wake", "DELAY", "200"]),
        Value::Int(1)
    );
    parked.set_read_timeout(Some(PATIENCE));
    assert_eq!(parked.read_value(), Value::bulks(&["d2", "wake"]));
    let waited = pushed.elapsed();
    assert!(
        waited >= Duration::from_millis(190),
        "woken after {waited:?}"
    );
    assert_eq!(queue_info_int(&proxy, "d2", "leased"), 1);
}

#[test]
fn at_takes_a_unix_time_and_a_past_one_pushes_now() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    let now_ms = |direct: &mut Client| -> i64 {
        let Value::Array(t) = direct.cmd(&["TIME"]) else {
            panic!("TIME")
        };
        let s: i64 = as_str(&t[0]).parse().unwrap();
        let us: i64 = as_str(&t[1]).parse().unwrap();
        s * 1000 + us / 1000
    };
    let mut direct = redis.client();
    let past = (now_ms(&mut direct) - 10_000).to_string();
    assert_eq!(
        c.cmd(&["QUEUE", "PUSH", "d3", "a", "b", "AT", &past]),
        Value::Int(2)
    );
    assert_eq!(queue_info_int(&proxy, "d3", "ready"), 2);
    assert_eq!(pop_all(&mut c, "d3"), vec!["a", "b"]);
    let due = now_ms(&mut direct) + 250;
    assert_eq!(
        c.cmd(&["QUEUE", "PUSH", "d3", "c", "AT", &due.to_string()]),
        Value::Int(1)
    );
    assert_eq!(c.cmd(&["RPOP", "d3"]), Value::Nil);
    assert_eq!(pop_eventually(&mut c, "d3"), "c");
    assert!(now_ms(&mut direct) >= due, "popped before its time");
}

#[test]
fn due_messages_enter_where_lpush_would_put_them_in_due_order() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "d4", "ready1"]);
    assert_eq!(
        c.cmd(&["QUEUE", "PUSH", "d4", "x1", "x2", "x3", "DELAY", "150"]),
        Value::Int(3)
    );
    assert_eq!(
        c.cmd(&["QUEUE", "PUSH", "d4", "y", "DELAY", "100"]),
        Value::Int(1)
    );
    eventually("the reaper to move them", || {
        (queue_info_int(&proxy, "d4", "delayed") == 0).then_some(())
    });
    c.cmd(&["LPUSH", "d4", "ready2"]);
    // The list as a legacy consumer sees it: nothing marks the promoted ones.
    let Value::Array(list) = redis.client().cmd(&["LRANGE", "d4", "0", "-1"]) else {
        panic!("LRANGE")
    };
    assert_eq!(
        list.iter().map(as_str).collect::<Vec<_>>(),
        vec!["ready2", "x3", "x2", "x1", "y", "ready1"]
    );
    assert_eq!(
        pop_all(&mut c, "d4"),
        vec!["ready1", "y", "x1", "x2", "x3", "ready2"]
    );
    // Consumers that pop from the left: producers push at the right.
    c.cmd(&["RPUSH", "left1", "r1"]);
    c.cmd(&["QUEUE", "PUSH", "left1", "z1", "z2", "DELAY", "100"]);
    eventually("left1 promoted", || {
        (queue_info_int(&proxy, "left1", "delayed") == 0).then_some(())
    });
    assert_eq!(
        c.cmd(&["LPOP", "left1", "10"]),
        Value::bulks(&["r1", "z1", "z2"])
    );
}

#[test]
fn pops_move_due_messages_in_without_the_reaper() {
    let redis = Redis::start();
    // A reaper that never comes round in this test: only pops promote.
    let config = CONFIG.replace("interval_ms = 20", "interval_ms = 600000");
    let proxy = Proxy::start_with_config(redis.port, &config, &[]);
    let mut c = proxy.client();
    c.cmd(&["QUEUE", "PUSH", "d5", "m", "DELAY", "100"]);
    assert_eq!(c.cmd(&["RPOP", "d5"]), Value::Nil);
    assert_eq!(pop_eventually(&mut c, "d5"), "m");
}

#[test]
fn many_delayed_messages_come_out_whole_and_in_order() {
    let (_redis, proxy) = start();
    let mut c = proxy.client();
    let payloads: Vec<String> = (0..450).map(|i| format!("m{i:03}")).collect();
    let mut args = vec!["QUEUE", "PUSH", "d6"];
    args.extend(payloads.iter().map(String::as_str));
    // Due late enough that a loaded machine counts them before.
    args.extend(["DELAY", "2000"]);
    assert_eq!(c.cmd(&args), Value::Int(450));
    // The same payload many times: every copy waits on its own.
    let mut dups = vec!["QUEUE", "PUSH", "d6"];
    dups.extend(std::iter::repeat_n("dup", 5));
    dups.extend(["DELAY", "2000"]);
    assert_eq!(c.cmd(&dups), Value::Int(5));
    assert_eq!(queue_info_int(&proxy, "d6", "delayed"), 455);
    eventually("all of them due", || {
        (queue_info_int(&proxy, "d6", "ready") == 455).then_some(())
    });
    let got = pop_all(&mut c, "d6");
    let mut want = payloads.clone();
    want.extend(std::iter::repeat_n("dup".to_string(), 5));
    assert_eq!(got, want);
}

#[test]
fn push_errors_follow_redis() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    let err = |v: Value| match v {
        Value::Error(e) => e,
        other => panic!("expected an error, got {other:?}"),
    };
    assert_eq!(
        err(c.cmd(&["QUEUE", "PUSH", "d7"])),
        "ERR wrong number of arguments for 'queue|push' command"
    );
    assert_eq!(
        err(c.cmd(&["QUEUE", "PUSH", "plain", "x"])),
        "ERR no queue rule matches key 'plain'"
    );
    for bad in ["-1", "soon", "1.5", "99999999999999999999"] {
        assert_eq!(
            err(c.cmd(&["QUEUE", "PUSH", "d7", "x", "DELAY", bad])),
            "ERR value is not an integer or out of range",
            "DELAY {bad}"
        );
    }
    // The option needs a payload before it: these are two payloads.
    assert_eq!(c.cmd(&["QUEUE", "PUSH", "d7", "DELAY", "5"]), Value::Int(2));
    assert_eq!(pop_all(&mut c, "d7"), vec!["DELAY", "5"]);
    // DELAY 0 is now.
    assert_eq!(
        c.cmd(&["QUEUE", "PUSH", "d7", "z", "delay", "0"]),
        Value::Int(1)
    );
    assert_eq!(c.cmd(&["RPOP", "d7"]), Value::bulk("z"));
    let mut direct = redis.client();
    direct.cmd(&["SET", "d8", "string"]);
    assert_eq!(
        err(c.cmd(&["QUEUE", "PUSH", "d8", "x", "DELAY", "100"])),
        "WRONGTYPE Operation against a key holding the wrong kind of value"
    );
    assert_eq!(c.cmd(&["PING"]), Value::Simple("PONG".into()));
}

#[test]
fn a_long_delay_does_not_meet_the_lease() {
    // Lease 100 ms, delay 1.5 s: the message is not leased while it waits,
    // so it is neither redelivered early nor counted as a delivery.
    let (_redis, proxy) = start();
    let mut c = proxy.client();
    // Timed from before the push: Redis sets the due time after this, so
    // however slow the reply, the pop cannot come sooner than 1.5 s later.
    let pushed = Instant::now();
    c.cmd(&["QUEUE", "PUSH", "short1", "slow", "DELAY", "1500"]);
    assert_eq!(c.cmd(&["RPOP", "short1"]), Value::Nil);
    assert_eq!(queue_info_int(&proxy, "short1", "leased"), 0);
    assert_eq!(pop_eventually(&mut c, "short1"), "slow");
    assert!(pushed.elapsed() >= Duration::from_millis(1490));
    let i = queue_info(&proxy, "short1");
    assert_eq!(int(&i["deliveries"]), 1);
    assert_eq!(int(&i["expiries"]), 0);
    assert_eq!(c.cmd(&["ACK", "short1", "slow"]), Value::Int(1));
}

#[test]
fn totals_outlive_the_messages_but_expire() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    c.cmd(&["QUEUE", "PUSH", "d9", "m"]);
    assert_eq!(c.cmd(&["RPOP", "d9"]), Value::bulk("m"));
    assert_eq!(c.cmd(&["ACK", "d9", "m"]), Value::Int(1));
    let mut direct = redis.client();
    // The totals of pops and ACKs are written in batches: here by the
    // reaper's last look at the queue, with no QUEUE INFO to hurry it. A
    // look between the pop and the ACK (the key scan finds the lease)
    // writes the delivery alone; the ACK follows at the next look, at most
    // the reaper's longest wait (2 s) later. So the wait is for both.
    wait_until("the totals written and nothing else left", || {
        direct.cmd(&["KEYS", "*"]) == Value::bulks(&["ackq:{d9}:d9:stats"])
            && direct.cmd(&["HMGET", "ackq:{d9}:d9:stats", "deliveries", "acks"])
                == Value::bulks(&["1", "1"])
    });
    let ttl = int(&direct.cmd(&["PTTL", "ackq:{d9}:d9:stats"]));
    assert!(
        ttl > 29 * 24 * 3600 * 1000 && ttl <= 30 * 24 * 3600 * 1000,
        "PTTL {ttl}"
    );
    let i = queue_info(&proxy, "d9");
    assert_eq!(int(&i["deliveries"]), 1);
    assert_eq!(int(&i["acks"]), 1);
}

// ------------------------------------------------------ NACK and retries

/// Redis's clock, in ms.
fn redis_ms(direct: &mut Client) -> i64 {
    let Value::Array(t) = direct.cmd(&["TIME"]) else {
        panic!("TIME")
    };
    let s: i64 = as_str(&t[0]).parse().unwrap();
    let us: i64 = as_str(&t[1]).parse().unwrap();
    s * 1000 + us / 1000
}

/// How far in the future (ms, Redis time) the only delayed message of
/// queue `q` is due: read right after the NACK or expiry that put it there,
/// it is the wait it was given, less the few ms since.
fn due_in(direct: &mut Client, q: &str) -> i64 {
    let key = format!("ackq:{{{q}}}:{q}:delayed");
    let Value::Array(z) = direct.cmd(&["ZRANGE", &key, "0", "-1", "WITHSCORES"]) else {
        panic!("ZRANGE {key}")
    };
    assert_eq!(z.len(), 2, "one delayed message in {q}: {z:?}");
    let due: i64 = as_str(&z[1]).parse().unwrap();
    due - redis_ms(direct)
}

#[test]
fn nack_delay_is_honoured() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "d10", "m"]);
    assert_eq!(c.cmd(&["RPOP", "d10"]), Value::bulk("m"));
    let nacked = Instant::now();
    assert_eq!(c.cmd(&["NACK", "d10", "m", "DELAY", "250"]), Value::Int(1));
    assert_eq!(c.cmd(&["NACK", "d10", "m", "DELAY", "250"]), Value::Int(0));
    let wait = due_in(&mut redis.client(), "d10");
    assert!((150..=250).contains(&wait), "due in {wait} ms");
    assert_eq!(c.cmd(&["RPOP", "d10"]), Value::Nil, "back before its delay");
    let i = queue_info(&proxy, "d10");
    assert_eq!((int(&i["delayed"]), int(&i["leased"])), (1, 0));
    assert_eq!(pop_eventually(&mut c, "d10"), "m");
    assert!(nacked.elapsed() >= Duration::from_millis(240));
    let l = &queue_leases(&proxy, "d10")[0];
    assert_eq!(
        (int(&l["deliveries"]), int(&l["nacks"]), int(&l["expiries"])),
        (2, 1, 0),
        "{l:?}"
    );
    // DELAY 0 is at once, whatever the rule says.
    assert_eq!(c.cmd(&["NACK", "exp0", "none"]), Value::Int(0));
    c.cmd(&["LPUSH", "exp0", "e"]);
    c.cmd(&["RPOP", "exp0"]);
    assert_eq!(c.cmd(&["NACK", "exp0", "e", "DELAY", "0"]), Value::Int(1));
    assert_eq!(c.cmd(&["RPOP", "exp0"]), Value::bulk("e"));
    // Bad delays are refused, and nothing is nacked.
    assert_eq!(
        c.cmd(&["NACK", "exp0", "e", "DELAY", "-3"]),
        Value::Error("ERR value is not an integer or out of range".into())
    );
    assert_eq!(queue_info_int(&proxy, "exp0", "leased"), 1);
}

#[test]
fn exponential_backoff_grows_and_caps() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    let mut direct = redis.client();
    c.cmd(&["LPUSH", "exp1", "m"]);
    // base 100, doubled per delivery, capped at 400; no jitter.
    for want in [100, 200, 400, 400, 400] {
        assert_eq!(pop_eventually(&mut c, "exp1"), "m");
        assert_eq!(c.cmd(&["NACK", "exp1", "m"]), Value::Int(1));
        let wait = due_in(&mut direct, "exp1");
        assert!(
            wait <= want && wait > want - 80,
            "wait {wait} ms, expected {want}"
        );
    }
    assert_eq!(pop_eventually(&mut c, "exp1"), "m");
    assert_eq!(int(&queue_leases(&proxy, "exp1")[0]["deliveries"]), 6);
    assert_eq!(int(&queue_leases(&proxy, "exp1")[0]["nacks"]), 5);
    assert_eq!(c.cmd(&["ACK", "exp1", "m"]), Value::Int(1));
}

#[test]
fn jitter_shortens_waits_within_its_fraction() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    let mut direct = redis.client();
    c.cmd(&["LPUSH", "jit1", "m"]);
    let mut waits = Vec::new();
    for _ in 0..6 {
        assert_eq!(pop_eventually(&mut c, "jit1"), "m");
        assert_eq!(c.cmd(&["NACK", "jit1", "m"]), Value::Int(1));
        let wait = due_in(&mut direct, "jit1");
        // 200 ms less up to half of it.
        assert!((20..=200).contains(&wait), "wait {wait} ms");
        waits.push(wait);
    }
    waits.sort();
    assert!(
        waits[5] - waits[0] > 5,
        "six jittered waits all alike: {waits:?}"
    );
}

#[test]
fn expiries_and_nacks_are_counted_apart() {
    let (redis, proxy, metrics) = start_with_metrics(CONFIG);
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "short2", "m"]);
    assert_eq!(c.cmd(&["RPOP", "short2"]), Value::bulk("m"));
    // Lease 100 ms: it expires (a crash, not a rejection) and comes back.
    assert_eq!(pop_eventually(&mut c, "short2"), "m");
    assert_eq!(c.cmd(&["NACK", "short2", "m"]), Value::Int(1));
    assert_eq!(c.cmd(&["RPOP", "short2"]), Value::bulk("m"));
    let l = &queue_leases(&proxy, "short2")[0];
    assert_eq!(
        (int(&l["deliveries"]), int(&l["nacks"]), int(&l["expiries"])),
        (3, 1, 1),
        "{l:?}"
    );
    assert_eq!(c.cmd(&["ACK", "short2", "m"]), Value::Int(1));
    let i = queue_info(&proxy, "short2");
    let got: Vec<i64> = ["deliveries", "nacks", "expiries", "redeliveries", "acks"]
        .iter()
        .map(|f| int(&i[*f]))
        .collect();
    assert_eq!(got, vec![3, 1, 1, 2, 1], "{i:?}");
    let series = |name: &str| metric(metrics, &format!("{name}{{rule=\"short*\"}}"));
    assert_eq!(series("ackproxy_expiries_total"), 1.0);
    assert_eq!(series("ackproxy_nacks_total"), 1.0);
    assert_eq!(series("ackproxy_pops_total"), 3.0);
    assert_eq!(series("ackproxy_redeliveries_total"), 2.0);
    drop(redis);
}

#[test]
fn an_expired_lease_waits_for_the_backoff_too() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    let mut direct = redis.client();
    c.cmd(&["LPUSH", "back1", "m"]);
    assert_eq!(c.cmd(&["RPOP", "back1"]), Value::bulk("m"));
    // Lease 100 ms, then 300 ms of backoff before it is back in the list.
    eventually("the expiry", || {
        (queue_info_int(&proxy, "back1", "expiries") == 1).then_some(())
    });
    let i = queue_info(&proxy, "back1");
    assert_eq!((int(&i["delayed"]), int(&i["ready"])), (1, 0), "{i:?}");
    let wait = due_in(&mut direct, "back1");
    assert!(wait <= 300, "due in {wait} ms");
    assert_eq!(pop_eventually(&mut c, "back1"), "m");
    let l = &queue_leases(&proxy, "back1")[0];
    assert_eq!((int(&l["deliveries"]), int(&l["expiries"])), (2, 1));
}

#[test]
fn a_late_ack_cancels_a_redelivery_waiting_for_its_backoff() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "exp2", "m"]);
    assert_eq!(c.cmd(&["RPOP", "exp2"]), Value::bulk("m"));
    assert_eq!(c.cmd(&["NACK", "exp2", "m", "DELAY", "200"]), Value::Int(1));
    assert_eq!(queue_info_int(&proxy, "exp2", "delayed"), 1);
    // The worker finished after all: the waiting copy is withdrawn.
    assert_eq!(c.cmd(&["ACK", "exp2", "m"]), Value::Int(1));
    let i = queue_info(&proxy, "exp2");
    assert_eq!((int(&i["delayed"]), int(&i["late-acks"])), (0, 1));
    // Past the delay, nothing comes back; nothing is left but the totals.
    c.cmd(&["QUEUE", "PUSH", "exp2", "marker", "DELAY", "300"]);
    assert_eq!(pop_eventually(&mut c, "exp2"), "marker");
    assert_eq!(c.cmd(&["RPOP", "exp2"]), Value::Nil);
    assert_eq!(c.cmd(&["ACK", "exp2", "marker"]), Value::Int(1));
    let Value::Array(left) = redis.client().cmd(&["KEYS", "*"]) else {
        panic!("KEYS")
    };
    assert_eq!(left, vec![Value::bulk("ackq:{exp2}:exp2:stats")]);
}

/// Leaves `body` (ack id `x`) in `q` as a copy a late ACK marked: its
/// lease ran out, and its ACK came in one call behind another late ACK,
/// which spent the call's list budget, so the copy is skipped rather than
/// taken out.
fn mark_late(c: &mut Client, direct: &mut Client, q: &str, body: &str) {
    let other = r#"{"id":"f"}"#;
    c.cmd(&["LPUSH", q, body, other]);
    assert_eq!(len_of(&c.cmd(&["RPOP", q, "2"])), 2);
    for id in ["x", "f"] {
        assert_eq!(c.cmd(&["QUEUE", "EXTEND", q, id, "1"]), Value::Int(1));
    }
    wait_until("both leases to run out", || {
        int(&direct.cmd(&["LLEN", q])) == 2
    });
    assert_eq!(c.cmd(&["ACK", q, "f", "x"]), Value::Int(2));
    assert_eq!(lrange(direct, q), vec![body.to_string()]);
    assert_eq!(info_int_of(c, q, "ready"), 0);
}

fn len_of(v: &Value) -> usize {
    match v {
        Value::Array(items) => items.len(),
        other => panic!("not an array: {other:?}"),
    }
}

fn info_int_of(c: &mut Client, q: &str, field: &str) -> i64 {
    int(&fields(&c.cmd(&["QUEUE", "INFO", q]))[field])
}

/// Redis's keys but the queues' totals.
fn keys_but_totals(direct: &mut Client) -> Vec<String> {
    let Value::Array(keys) = direct.cmd(&["KEYS", "*"]) else {
        panic!("KEYS")
    };
    let mut left: Vec<String> = keys.iter().map(as_str).collect();
    left.retain(|k| !crate::common::is_queue_stats(k));
    left
}

/// A producer reuses the id of a marked copy still in the list, and the
/// new message is redelivered: the mark stays with the copy it was made
/// for, so the new message comes back and the acknowledged one does not.
#[test]
fn a_skip_mark_stays_with_its_copy_when_the_id_is_reused() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    let mut direct = redis.client();
    let (old, new) = (r#"{"id":"x","v":1}"#, r#"{"id":"x","v":2}"#);
    mark_late(&mut c, &mut direct, "marks1", old);
    c.cmd(&["RPUSH", "marks1", new]);
    assert_eq!(c.cmd(&["RPOP", "marks1"]), Value::bulk(new));
    assert_eq!(
        c.cmd(&["QUEUE", "EXTEND", "marks1", "x", "1"]),
        Value::Int(1)
    );
    wait_until("the new message's lease to run out", || {
        int(&direct.cmd(&["LLEN", "marks1"])) == 2
    });
    assert_eq!(queue_info_int(&proxy, "marks1", "ready"), 1);
    assert_eq!(pop_all(&mut c, "marks1"), vec![new.to_string()]);
    assert_eq!(c.cmd(&["ACK", "marks1", "x"]), Value::Int(1));
    assert_eq!(c.cmd(&["RPOP", "marks1"]), Value::Nil);
    assert_eq!(keys_but_totals(&mut direct), Vec::<String>::new());
}

/// A list deleted with a marked copy in it: `QUEUE INFO` never reports
/// less than nothing ready, and the mark goes with the list, so the same
/// message pushed again is delivered.
#[test]
fn a_skip_mark_goes_with_its_deleted_list() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    let mut direct = redis.client();
    let body = r#"{"id":"x","v":1}"#;
    mark_late(&mut c, &mut direct, "marks2", body);
    direct.cmd(&["DEL", "marks2"]);
    assert_eq!(queue_info_int(&proxy, "marks2", "ready"), 0);
    assert_eq!(c.cmd(&["RPOP", "marks2"]), Value::Nil);
    c.cmd(&["LPUSH", "marks2", body]);
    assert_eq!(c.cmd(&["RPOP", "marks2"]), Value::bulk(body));
    assert_eq!(c.cmd(&["ACK", "marks2", "x"]), Value::Int(1));
    assert_eq!(keys_but_totals(&mut direct), Vec::<String>::new());
}

#[test]
fn nack_delay_of_a_move_lease_clears_the_destination_and_waits() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "d11", "job"]);
    assert_eq!(
        c.cmd(&["RPOPLPUSH", "d11", "d11:doing"]),
        Value::bulk("job")
    );
    assert_eq!(
        c.cmd(&["NACK", "d11", "job", "DELAY", "200"]),
        Value::Int(1)
    );
    let mut direct = redis.client();
    assert_eq!(direct.cmd(&["LLEN", "d11:doing"]), Value::Int(0));
    assert_eq!(queue_info_int(&proxy, "d11", "delayed"), 1);
    assert_eq!(c.cmd(&["RPOP", "d11"]), Value::Nil);
    assert_eq!(pop_eventually(&mut c, "d11"), "job");
    let l = &queue_leases(&proxy, "d11")[0];
    assert_eq!((int(&l["deliveries"]), int(&l["nacks"])), (2, 1));
}

// ---------------------------------------------------------- dead letters

fn dead(p: &Proxy, q: &str, count: Option<&str>) -> Vec<HashMap<String, Value>> {
    let mut args = vec!["QUEUE", "DEAD", q];
    if let Some(n) = count {
        args.extend(["COUNT", n]);
    }
    match p.client().cmd(&args) {
        Value::Array(items) => items.iter().map(fields).collect(),
        other => panic!("QUEUE DEAD {q}: {other:?}"),
    }
}

/// Pops and NACKs every message of `q` (a rule with max_deliveries 1):
/// each goes to the dead-letter list.
fn kill_all(c: &mut Client, q: &str) -> usize {
    let popped = pop_all(c, q);
    let mut args = vec!["NACK", q];
    args.extend(popped.iter().map(String::as_str));
    assert_eq!(c.cmd(&args), Value::Int(popped.len() as i64));
    popped.len()
}

#[test]
fn a_dead_letter_keeps_its_history() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    let mut direct = redis.client();
    let msg = r#"{"id":"j1","task":"resize"}"#;
    c.cmd(&["LPUSH", "hist1", msg]);
    let t0 = redis_ms(&mut direct);
    // Delivery 1 expires (lease 100 ms), 2 and 3 are rejected.
    assert_eq!(c.cmd(&["RPOP", "hist1"]), Value::bulk(msg));
    assert_eq!(pop_eventually(&mut c, "hist1"), msg);
    assert_eq!(c.cmd(&["NACK", "hist1", "j1"]), Value::Int(1));
    let before = redis_ms(&mut direct);
    assert_eq!(c.cmd(&["RPOP", "hist1"]), Value::bulk(msg));
    let last = redis_ms(&mut direct);
    assert_eq!(c.cmd(&["NACK", "hist1", "j1"]), Value::Int(1));
    let t1 = redis_ms(&mut direct);
    // The raw payload, readable by any Redis tool.
    assert_eq!(lrange(&mut direct, "{hist1}:dead"), vec![msg]);
    let d = dead(&proxy, "hist1", None);
    assert_eq!(d.len(), 1);
    let h = &d[0];
    assert_eq!(as_str(&h["payload"]), msg);
    assert_eq!(as_str(&h["id"]), "j1");
    let counts: Vec<i64> = ["deliveries", "nacks", "expiries"]
        .iter()
        .map(|f| int(&h[*f]))
        .collect();
    assert_eq!(counts, vec![3, 2, 1], "{h:?}");
    assert_eq!(as_str(&h["last-reason"]), "nacked");
    let (first, last_d, died) = (
        int(&h["first-delivery-ms"]),
        int(&h["last-delivery-ms"]),
        int(&h["dead-lettered-ms"]),
    );
    assert!(t0 <= first && first <= last_d, "{h:?}");
    assert!(
        (before..=last).contains(&last_d),
        "{h:?} ({before}..{last})"
    );
    assert!(last_d <= died && died <= t1, "{h:?}");
    let i = queue_info(&proxy, "hist1");
    assert_eq!((int(&i["dead"]), int(&i["dead-lettered"])), (1, 1));
    // A payload someone else put there has no history.
    direct.cmd(&["RPUSH", "{hist1}:dead", "stranger"]);
    let d = dead(&proxy, "hist1", None);
    assert_eq!(as_str(&d[1]["payload"]), "stranger");
    assert_eq!(d[1]["deliveries"], Value::Nil);
    assert_eq!(dead(&proxy, "hist1", Some("1")).len(), 1);
}

#[test]
fn redrive_brings_dead_letters_back_with_fresh_counts() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "one1", "a", "b"]);
    assert_eq!(kill_all(&mut c, "one1"), 2);
    assert_eq!(queue_info_int(&proxy, "one1", "dead"), 2);
    assert_eq!(
        c.cmd(&["QUEUE", "REDRIVE", "one1", "COUNT", "1"]),
        Value::Int(1)
    );
    assert_eq!(c.cmd(&["RPOP", "one1"]), Value::bulk("a"));
    let l = &queue_leases(&proxy, "one1")[0];
    assert_eq!((int(&l["deliveries"]), int(&l["nacks"])), (1, 0));
    assert_eq!(c.cmd(&["ACK", "one1", "a"]), Value::Int(1));
    assert_eq!(c.cmd(&["QUEUE", "REDRIVE", "one1"]), Value::Int(1));
    assert_eq!(c.cmd(&["QUEUE", "REDRIVE", "one1"]), Value::Int(0));
    assert_eq!(c.cmd(&["RPOP", "one1"]), Value::bulk("b"));
    assert_eq!(c.cmd(&["ACK", "one1", "b"]), Value::Int(1));
    let i = queue_info(&proxy, "one1");
    assert_eq!((int(&i["dead"]), int(&i["redriven"])), (0, 2));
    let Value::Array(left) = redis.client().cmd(&["KEYS", "*"]) else {
        panic!("KEYS")
    };
    assert_eq!(left, vec![Value::bulk("ackq:{one1}:one1:stats")]);
}

#[test]
fn redrive_of_many_is_whole_and_in_order() {
    let (_redis, proxy) = start();
    let mut c = proxy.client();
    let payloads: Vec<String> = (0..250).map(|i| format!("m{i:03}")).collect();
    let mut args = vec!["LPUSH", "one2"];
    args.extend(payloads.iter().map(String::as_str));
    c.cmd(&args);
    assert_eq!(kill_all(&mut c, "one2"), 250);
    assert_eq!(c.cmd(&["QUEUE", "REDRIVE", "one2"]), Value::Int(250));
    assert_eq!(pop_all(&mut c, "one2"), payloads);
}

#[test]
fn redrive_ends_while_messages_keep_dying() {
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    use std::sync::Arc;

    let (redis, proxy) = start();
    // Dead letters put there directly (no history: that is allowed).
    const DEAD: i64 = 20_000;
    let mut direct = redis.client();
    for chunk in (0..DEAD).collect::<Vec<_>>().chunks(1000) {
        let payloads: Vec<String> = chunk.iter().map(|i| format!("m{i}")).collect();
        let mut args = vec!["RPUSH", "{one5}:dead"];
        args.extend(payloads.iter().map(String::as_str));
        direct.cmd(&args);
    }
    assert_eq!(queue_info_int(&proxy, "one5", "dead"), DEAD);
    // Consumers reject every message (max_deliveries 1): each redriven one
    // dies again, behind the letters the REDRIVE is moving.
    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicI64::new(0));
    let consumers: Vec<_> = (0..2)
        .map(|_| {
            let (stop, killed) = (stop.clone(), killed.clone());
            let mut c = proxy.client();
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let popped = pop_all(&mut c, "one5");
                    if popped.is_empty() {
                        thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    let mut args = vec!["NACK", "one5"];
                    args.extend(popped.iter().map(String::as_str));
                    let n = int(&c.cmd(&args));
                    killed.fetch_add(n, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut c = proxy.client();
    c.set_read_timeout(Some(Duration::from_secs(10)));
    c.send(&["QUEUE", "REDRIVE", "one5"]);
    let moved = c.try_read_raw().map(|r| decode(&r).0);
    let killed_meanwhile = killed.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for t in consumers {
        t.join().unwrap();
    }
    let moved = int(&moved.expect("QUEUE REDRIVE answers within 10 s"));
    // What was dead when it started, and not one more.
    assert_eq!(moved, DEAD, "{killed_meanwhile} died again meanwhile");
    assert!(
        killed_meanwhile > 0,
        "no message died during the REDRIVE: the test proves nothing"
    );
}

#[test]
fn purge_dead_empties_the_dead_letters_and_their_history() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "one3", "a", "b", "c"]);
    kill_all(&mut c, "one3");
    assert_eq!(
        c.cmd(&["QUEUE", "PURGE", "one3", "READY"]),
        Value::Error("ERR syntax error".into())
    );
    assert_eq!(c.cmd(&["QUEUE", "PURGE", "one3", "dead"]), Value::Int(3));
    assert_eq!(c.cmd(&["QUEUE", "PURGE", "one3", "DEAD"]), Value::Int(0));
    assert!(dead(&proxy, "one3", None).is_empty());
    let Value::Array(left) = redis.client().cmd(&["KEYS", "*"]) else {
        panic!("KEYS")
    };
    assert_eq!(left, vec![Value::bulk("ackq:{one3}:one3:stats")]);
}

/// Rules whose queues share a dead-letter list (one glob with a fixed
/// name; two exact rules naming one list), and a glob with `$queue`.
const SHARED_DEAD: &str = r#"
[[queue]]
pattern = "mix:*"
lease_ms = 600000
max_deliveries = 1
ack_id = "payload"
dead_letter = "mixed-dead"

[[queue]]
pattern = "pair1"
lease_ms = 600000
max_deliveries = 1
ack_id = "payload"
dead_letter = "pairs-dead"

[[queue]]
pattern = "pair2"
lease_ms = 600000
max_deliveries = 1
ack_id = "payload"
dead_letter = "pairs-dead"

[[queue]]
pattern = "own:*"
lease_ms = 600000
max_deliveries = 1
ack_id = "payload"
dead_letter = "gone:$queue"
"#;

/// QUEUE REDRIVE and QUEUE PURGE … DEAD on a list other queues' dead
/// letters reach would take or delete theirs (a dead letter is its raw
/// payload, with nothing saying which queue it came from): refused, the
/// list left as it is. With `$queue` each queue has its own list.
#[test]
fn a_shared_dead_letter_list_is_neither_redriven_nor_purged_for_one_queue() {
    let (redis, proxy) = Proxy::with_redis(SHARED_DEAD);
    let mut c = proxy.client();
    let mut direct = redis.client();
    for q in ["mix:a", "mix:b", "pair1", "pair2", "own:a", "own:b"] {
        let payload = format!("{q}-m");
        c.cmd(&["LPUSH", q, &payload]);
        assert_eq!(kill_all(&mut c, q), 1, "{q}");
    }
    assert_eq!(lrange(&mut direct, "mixed-dead"), ["mix:a-m", "mix:b-m"]);
    assert_eq!(lrange(&mut direct, "pairs-dead"), ["pair1-m", "pair2-m"]);

    let refused = |sub: &str, list: &str, q: &str, why: &str| {
        format!(
            "ERR ackproxy: QUEUE {sub} refused: the dead-letter list '{list}' of '{q}' is \
             shared ({why}), and its dead letters do not say which queue they come from; give \
             each queue a list of its own: $queue in the rule's dead_letter stands for the \
             queue's name"
        )
    };
    let glob = "the rule 'mix:*' names it for every queue it matches";
    for (args, want) in [
        (
            vec!["QUEUE", "REDRIVE", "mix:a"],
            refused("REDRIVE", "mixed-dead", "mix:a", glob),
        ),
        (
            vec!["QUEUE", "REDRIVE", "mix:a", "COUNT", "1"],
            refused("REDRIVE", "mixed-dead", "mix:a", glob),
        ),
        (
            vec!["QUEUE", "PURGE", "mix:b", "DEAD"],
            refused("PURGE", "mixed-dead", "mix:b", glob),
        ),
        (
            vec!["QUEUE", "REDRIVE", "pair1"],
            refused(
                "REDRIVE",
                "pairs-dead",
                "pair1",
                "the queue 'pair2' has it too",
            ),
        ),
        (
            vec!["QUEUE", "PURGE", "pair2", "DEAD"],
            refused(
                "PURGE",
                "pairs-dead",
                "pair2",
                "the queue 'pair1' has it too",
            ),
        ),
        // Arguments are checked first, as for any queue.
        (
            vec!["QUEUE", "PURGE", "mix:a", "READY"],
            "ERR syntax error".into(),
        ),
    ] {
        assert_eq!(c.cmd(&args), Value::Error(want), "{args:?}");
    }
    // Nothing moved nor went.
    assert_eq!(lrange(&mut direct, "mixed-dead"), ["mix:a-m", "mix:b-m"]);
    assert_eq!(lrange(&mut direct, "pairs-dead"), ["pair1-m", "pair2-m"]);
    for q in ["mix:a", "mix:b", "pair1", "pair2"] {
        assert_eq!(direct.cmd(&["LLEN", q]), Value::Int(0), "{q}");
    }
    // Reading the list whole is still allowed.
    assert_eq!(dead(&proxy, "mix:a", None).len(), 2);

    // Each queue its own list: only its own dead letters move or go.
    assert_eq!(c.cmd(&["QUEUE", "REDRIVE", "own:a"]), Value::Int(1));
    assert_eq!(c.cmd(&["RPOP", "own:a"]), Value::bulk("own:a-m"));
    assert_eq!(c.cmd(&["QUEUE", "PURGE", "own:a", "DEAD"]), Value::Int(0));
    assert_eq!(lrange(&mut direct, "gone:own:b"), ["own:b-m"]);
    assert_eq!(c.cmd(&["QUEUE", "PURGE", "own:b", "DEAD"]), Value::Int(1));
    assert!(lrange(&mut direct, "gone:own:b").is_empty());
}

#[test]
fn the_dead_letter_cap_drops_the_oldest_and_counts_them() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "cap1", "a", "b", "c", "d"]);
    // One at a time, so the order they die in is known.
    for p in ["a", "b", "c", "d"] {
        assert_eq!(c.cmd(&["RPOP", "cap1"]), Value::bulk(p));
        assert_eq!(c.cmd(&["NACK", "cap1", p]), Value::Int(1));
    }
    let mut direct = redis.client();
    assert_eq!(lrange(&mut direct, "{cap1}:dead"), vec!["c", "d"]);
    let i = queue_info(&proxy, "cap1");
    assert_eq!(
        (
            int(&i["dead"]),
            int(&i["dead-lettered"]),
            int(&i["dead-dropped"])
        ),
        (2, 4, 2)
    );
    let d = dead(&proxy, "cap1", None);
    assert_eq!(d.len(), 2);
    assert!(d.iter().all(|h| int(&h["deliveries"]) == 1), "{d:?}");
    // Histories of the dropped ones went with them.
    assert_eq!(
        direct.cmd(&["HLEN", "ackq:{cap1}:cap1:history"]),
        Value::Int(2)
    );
}

#[test]
fn dead_letter_commands_check_their_arguments() {
    let (_redis, proxy) = start();
    let mut c = proxy.client();
    for (args, want) in [
        (
            vec!["QUEUE", "DEAD"],
            "ERR wrong number of arguments for 'queue|dead' command",
        ),
        (
            vec!["QUEUE", "REDRIVE", "one4", "COUNT"],
            "ERR wrong number of arguments for 'queue|redrive' command",
        ),
        (
            vec!["QUEUE", "PURGE", "one4"],
            "ERR wrong number of arguments for 'queue|purge' command",
        ),
        (
            vec!["QUEUE", "DEAD", "one4", "COUNT", "0"],
            "ERR value is out of range, must be positive",
        ),
        (
            vec!["QUEUE", "REDRIVE", "one4", "LIMIT", "3"],
            "ERR syntax error",
        ),
        (
            vec!["QUEUE", "DEAD", "plain"],
            "ERR no queue rule matches key 'plain'",
        ),
    ] {
        assert_eq!(c.cmd(&args), Value::Error(want.into()), "{args:?}");
    }
}

// ------------------------------------------------- pages with OFFSET

/// `QUEUE <sub> q [args…]`: the listing, each entry as a map.
fn listed(c: &mut Client, sub: &str, q: &str, args: &[&str]) -> Vec<HashMap<String, Value>> {
    let mut all = vec!["QUEUE", sub, q];
    all.extend(args);
    match c.cmd(&all) {
        Value::Array(items) => items.iter().map(fields).collect(),
        other => panic!("{all:?}: {other:?}"),
    }
}

fn field_of(entries: &[HashMap<String, Value>], name: &str) -> Vec<String> {
    entries.iter().map(|e| as_str(&e[name])).collect()
}

/// The members of sorted set `key` with their scores, in Redis's order.
fn zrange(c: &mut Client, key: &str) -> Vec<(String, i64)> {
    let Value::Array(flat) = c.cmd(&["ZRANGE", key, "0", "-1", "WITHSCORES"]) else {
        panic!("ZRANGE {key}")
    };
    flat.chunks(2)
        .map(|p| (as_str(&p[0]), as_str(&p[1]).parse().unwrap()))
        .collect()
}

/// The ack ids of queue `q`'s leases as Redis holds them, soonest deadline
/// first: plain pops' before moves' on one deadline, each set's in its own
/// order. A short id's token is `j` and the id; marks are not leases.
fn leases_in_redis(direct: &mut Client, q: &str) -> Vec<String> {
    let mut all: Vec<(i64, u8, String)> = Vec::new();
    for (side, set) in ["leases", "mleases"].into_iter().enumerate() {
        for (member, score) in zrange(direct, &format!("ackq:{{{q}}}:{q}:{set}")) {
            if member == "~r" || member == "~d" {
                continue;
            }
            let id = member.strip_prefix('j').expect("a short id's token");
            all.push((score, side as u8, id.to_string()));
        }
    }
    // Stable: each set's own order stays within one deadline and side.
    all.sort_by_key(|(score, side, _)| (*score, *side));
    all.into_iter().map(|(_, _, id)| id).collect()
}

#[test]
fn leases_and_dead_letters_page_past_the_first_thousand() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    let mut direct = redis.client();
    let payloads: Vec<String> = (0..1200).map(|i| format!("m{i:04}")).collect();
    let mut push = vec!["LPUSH", "dpage"];
    push.extend(payloads.iter().map(String::as_str));
    assert_eq!(c.cmd(&push), Value::Int(1200));
    assert_eq!(pop_all(&mut c, "dpage").len(), 1000);
    // A delayed message puts its mark among the deadlines, and a NACKed
    // one the retry mark first: neither is a lease nor takes a place.
    assert_eq!(
        c.cmd(&["QUEUE", "PUSH", "dpage", "later", "DELAY", "600000"]),
        Value::Int(1)
    );
    assert_eq!(pop_all(&mut c, "dpage").len(), 200);
    assert_eq!(c.cmd(&["NACK", "dpage", "m0005"]), Value::Int(1));
    let set = "ackq:{dpage}:dpage:leases";
    assert_eq!(direct.cmd(&["ZSCORE", set, "~r"]), Value::bulk("0"));
    assert!(matches!(direct.cmd(&["ZSCORE", set, "~d"]), Value::Bulk(_)));
    let want = leases_in_redis(&mut direct, "dpage");
    assert_eq!(want.len(), 1199);

    // The whole listing, two pages of 1,000, is Redis's order.
    let first = listed(&mut c, "LEASES", "dpage", &["COUNT", "1000"]);
    let rest = listed(
        &mut c,
        "LEASES",
        "dpage",
        &["COUNT", "1000", "OFFSET", "1000"],
    );
    assert_eq!(rest.len(), 199);
    let whole: Vec<String> = field_of(&first, "id")
        .into_iter()
        .chain(field_of(&rest, "id"))
        .collect();
    assert_eq!(whole, want);
    // The 1,101st to the 1,150th, the options in either order.
    for args in [
        ["OFFSET", "1100", "COUNT", "50"],
        ["COUNT", "50", "OFFSET", "1100"],
    ] {
        let page = listed(&mut c, "LEASES", "dpage", &args);
        assert_eq!(field_of(&page, "id"), want[1100..1150], "{args:?}");
        assert_eq!(field_of(&page, "payload"), want[1100..1150]);
    }
    // Without OFFSET, the same as OFFSET 0; past the end, nothing.
    assert_eq!(
        field_of(&listed(&mut c, "LEASES", "dpage", &[]), "id"),
        want[..10]
    );
    assert_eq!(
        field_of(&listed(&mut c, "LEASES", "dpage", &["OFFSET", "0"]), "id"),
        want[..10]
    );
    assert_eq!(
        field_of(
            &listed(&mut c, "LEASES", "dpage", &["OFFSET", "1198"]),
            "id"
        ),
        want[1198..]
    );
    for far in ["1199", "5000", "9223372036854775807"] {
        assert!(listed(&mut c, "LEASES", "dpage", &["OFFSET", far]).is_empty());
    }

    // Dead letters, likewise, against the dead-letter list itself.
    let mut push = vec!["LPUSH", "onepage"];
    push.extend(payloads.iter().map(String::as_str));
    assert_eq!(c.cmd(&push), Value::Int(1200));
    assert_eq!(
        kill_all(&mut c, "onepage") + kill_all(&mut c, "onepage"),
        1200
    );
    let want = lrange(&mut direct, "{onepage}:dead");
    assert_eq!(want.len(), 1200);
    let first = listed(&mut c, "DEAD", "onepage", &["COUNT", "1000"]);
    let rest = listed(
        &mut c,
        "DEAD",
        "onepage",
        &["OFFSET", "1000", "COUNT", "1000"],
    );
    let whole: Vec<String> = field_of(&first, "payload")
        .into_iter()
        .chain(field_of(&rest, "payload"))
        .collect();
    assert_eq!(whole, want);
    for args in [
        ["OFFSET", "1100", "COUNT", "50"],
        ["COUNT", "50", "OFFSET", "1100"],
    ] {
        let page = listed(&mut c, "DEAD", "onepage", &args);
        assert_eq!(field_of(&page, "payload"), want[1100..1150], "{args:?}");
        // Each with its own history.
        assert_eq!(field_of(&page, "id"), want[1100..1150]);
        assert!(page.iter().all(|l| int(&l["deliveries"]) == 1));
    }
    assert_eq!(
        field_of(&listed(&mut c, "DEAD", "onepage", &[]), "payload"),
        want[..10]
    );
    assert_eq!(
        field_of(
            &listed(&mut c, "DEAD", "onepage", &["OFFSET", "1195"]),
            "payload"
        ),
        want[1195..]
    );
    for far in ["1200", "5000", "9223372036854775807"] {
        assert!(listed(&mut c, "DEAD", "onepage", &["OFFSET", far]).is_empty());
    }
}

#[test]
fn a_page_of_leases_merges_pops_and_moves_by_deadline() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    let mut direct = redis.client();
    let payloads: Vec<String> = (0..90).map(|i| format!("x{i:02}")).collect();
    let mut push = vec!["LPUSH", "dmix"];
    push.extend(payloads.iter().map(String::as_str));
    c.cmd(&push);
    // Interleaved, so that the two sets' deadlines interleave and tie.
    for (i, p) in payloads.iter().enumerate() {
        let got = if i % 3 == 0 {
            c.cmd(&["LMOVE", "dmix", "procx", "RIGHT", "LEFT"])
        } else {
            c.cmd(&["RPOP", "dmix"])
        };
        assert_eq!(got, Value::bulk(p));
    }
    let want = leases_in_redis(&mut direct, "dmix");
    assert_eq!(want.len(), 90);
    let whole = listed(&mut c, "LEASES", "dmix", &["COUNT", "1000"]);
    assert_eq!(field_of(&whole, "id"), want);
    let moved = whole
        .iter()
        .filter(|l| as_str(&l["destination"]) == "procx");
    assert_eq!(moved.count(), 30);
    for o in 0..=90 {
        let offset = o.to_string();
        let page = listed(&mut c, "LEASES", "dmix", &["COUNT", "7", "OFFSET", &offset]);
        assert_eq!(
            field_of(&page, "id"),
            want[o..(o + 7).min(90)],
            "OFFSET {o}"
        );
    }
}

#[test]
fn offset_is_read_as_redis_reads_an_option() {
    let (redis, proxy) = start();
    let mut c = proxy.client();
    // Redis's own text for a count that is not a number of 0 or more.
    let bad = redis.client().cmd(&["LPOP", "k", "-1"]);
    assert_eq!(
        bad,
        Value::Error("ERR value is out of range, must be positive".into())
    );
    assert_eq!(redis.client().cmd(&["LPOP", "k", "abc"]), bad);
    for (sub, q) in [("LEASES", "d1"), ("DEAD", "one1")] {
        let arity = Value::Error(format!(
            "ERR wrong number of arguments for 'queue|{}' command",
            sub.to_ascii_lowercase()
        ));
        let syntax = Value::Error("ERR syntax error".into());
        for (args, want) in [
            (vec!["OFFSET", "-1"], &bad),
            (vec!["OFFSET", "abc"], &bad),
            (vec!["OFFSET", "1.5"], &bad),
            (vec!["COUNT", "5", "OFFSET", "-1"], &bad),
            (vec!["OFFSET", "-1", "COUNT", "0"], &bad),
            // A missing value: as for COUNT.
            (vec!["COUNT"], &arity),
            (vec!["OFFSET"], &arity),
            (vec!["COUNT", "5", "OFFSET"], &arity),
            (vec!["OFFSET", "1", "OFFSET", "2"], &syntax),
            (vec!["COUNT", "1", "COUNT", "2"], &syntax),
            (vec!["OFFSET", "1", "LIMIT", "2"], &syntax),
            (vec!["LIMIT", "2", "OFFSET", "x"], &syntax),
        ] {
            let mut all = vec!["QUEUE", sub, q];
            all.extend(&args);
            assert_eq!(&c.cmd(&all), want, "{all:?}");
        }
        for ok in [vec!["OFFSET", "0"], vec!["offset", "3", "count", "2"]] {
            let mut all = vec!["QUEUE", sub, q];
            all.extend(&ok);
            assert_eq!(c.cmd(&all), Value::Array(vec![]), "{all:?}");
        }
    }
}

// ------------------------------------------------------ INFO and HELP

#[test]
fn info_reports_counts_and_totals_in_both_protocols() {
    let (_redis, proxy) = start();
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "one5", "a", "b", "c", "d"]);
    c.cmd(&["QUEUE", "PUSH", "one5", "later", "DELAY", "600000"]);
    assert_eq!(c.cmd(&["RPOP", "one5"]), Value::bulk("a"));
    assert_eq!(c.cmd(&["ACK", "one5", "a"]), Value::Int(1));
    assert_eq!(c.cmd(&["RPOP", "one5"]), Value::bulk("b"));
    assert_eq!(c.cmd(&["NACK", "one5", "b"]), Value::Int(1));
    assert_eq!(c.cmd(&["RPOP", "one5"]), Value::bulk("c"));
    let i = queue_info(&proxy, "one5");
    let want: &[(&str, i64)] = &[
        ("ready", 1),
        ("leased", 1),
        ("delayed", 1),
        ("dead", 1),
        ("deliveries", 3),
        ("acks", 1),
        ("nacks", 1),
        ("expiries", 0),
        ("late-acks", 0),
        ("dead-lettered", 1),
        ("redriven", 0),
        ("redeliveries", 0),
        ("promoted", 0),
        ("dead-dropped", 0),
    ];
    for (f, n) in want {
        assert_eq!(int(&i[*f]), *n, "{f}: {i:?}");
    }
    assert!(int(&i["oldest-lease-age-ms"]) >= 0);
    // RESP2: a flat array, as XINFO; RESP3: a map with the same fields.
    let raw2 = c.raw(&["QUEUE", "INFO", "one5"]);
    assert_eq!(raw2[0], b'*');
    let mut c3 = proxy.client();
    assert!(matches!(c3.cmd(&["HELLO", "3"]), Value::Array(_)));
    let raw3 = c3.raw(&["QUEUE", "INFO", "one5"]);
    assert_eq!(raw3[0], b'%');
    let (v3, _) = decode(&raw3);
    let mut k3: Vec<String> = fields(&v3).into_keys().collect();
    let mut k2: Vec<String> = i.into_keys().collect();
    k3.sort();
    k2.sort();
    assert_eq!(k2, k3);
}

#[test]
fn help_lists_every_subcommand() {
    let (_redis, proxy) = start();
    let Value::Array(lines) = proxy.client().cmd(&["QUEUE", "HELP"]) else {
        panic!("QUEUE HELP")
    };
    let text: Vec<String> = lines.iter().map(as_str).collect();
    for sub in [
        "PUSH", "EXTEND", "INFO", "LEASES", "DEAD", "REDRIVE", "PURGE", "HELP",
    ] {
        assert!(
            text.iter()
                .any(|l| l.starts_with(&format!("{sub} ")) || l == sub),
            "QUEUE HELP does not list {sub}: {text:#?}"
        );
    }
    assert!(text.iter().any(|l| l.contains("NACK")));
}

// ------------------------------------------------ ack policies by connection

#[test]
fn next_pop_acknowledges_the_previous_message_of_the_connection() {
    let (redis, proxy) = start();
    let mut w = proxy.client();
    let mut other = proxy.client();
    w.cmd(&["LPUSH", "np1", "a", "b", "c", "d", "e"]);
    assert_eq!(w.cmd(&["RPOP", "np1"]), Value::bulk("a"));
    assert_eq!(queue_info_int(&proxy, "np1", "leased"), 1);
    // Another connection's pop acknowledges nothing of this one's.
    assert_eq!(other.cmd(&["RPOP", "np1"]), Value::bulk("b"));
    assert_eq!(queue_info_int(&proxy, "np1", "leased"), 2);
    // The worker pops again: it has finished a.
    assert_eq!(w.cmd(&["RPOP", "np1"]), Value::bulk("c"));
    let i = queue_info(&proxy, "np1");
    assert_eq!((int(&i["leased"]), int(&i["acks"])), (2, 1), "{i:?}");
    let held: Vec<String> = queue_leases(&proxy, "np1")
        .iter()
        .map(|l| as_str(&l["payload"]))
        .collect();
    assert!(held.contains(&"b".to_string()) && held.contains(&"c".to_string()));
    // A pop with COUNT: all of them are acknowledged by the next pop, also
    // one that finds nothing.
    assert_eq!(w.cmd(&["RPOP", "np1", "5"]), Value::bulks(&["d", "e"]));
    assert_eq!(queue_info_int(&proxy, "np1", "leased"), 3);
    assert_eq!(w.cmd(&["RPOP", "np1"]), Value::Nil);
    assert_eq!(other.cmd(&["RPOP", "np1"]), Value::Nil);
    let i = queue_info(&proxy, "np1");
    assert_eq!((int(&i["leased"]), int(&i["acks"])), (0, 5), "{i:?}");
    // Explicit ACKs still work; nothing is left.
    let Value::Array(left) = redis.client().cmd(&["KEYS", "*"]) else {
        panic!("KEYS")
    };
    assert_eq!(left, vec![Value::bulk("ackq:{np1}:np1:stats")]);
}

#[test]
fn next_pop_through_a_parked_blocking_pop() {
    let (_redis, proxy, metrics) = start_with_metrics(CONFIG);
    let mut w = proxy.client();
    w.cmd(&["LPUSH", "np2", "a"]);
    assert_eq!(w.cmd(&["BRPOP", "np2", "0"]), Value::bulks(&["np2", "a"]));
    // Waiting for the next job means a is done, before anything arrives.
    w.send(&["BRPOP", "np2", "0"]);
    wait_parked(metrics, 1);
    let i = queue_info(&proxy, "np2");
    assert_eq!((int(&i["leased"]), int(&i["acks"])), (0, 1), "{i:?}");
    proxy.client().cmd(&["LPUSH", "np2", "b"]);
    assert_eq!(w.read_value(), Value::bulks(&["np2", "b"]));
    assert_eq!(queue_info_int(&proxy, "np2", "leased"), 1);
}

#[test]
fn a_pipelined_or_transacted_pop_is_not_a_next_pop() {
    let (_redis, proxy) = start();
    let mut w = proxy.client();
    w.cmd(&["LPUSH", "np8", "a", "b", "c", "d", "e", "f"]);
    // Two pops in one write: the second was sent before the worker had
    // the first message, so it has not finished it.
    let mut both = Client::encode(&[b"RPOP", b"np8"]);
    both.extend(Client::encode(&[b"RPOP", b"np8"]));
    w.send_raw(&both);
    assert_eq!(w.read_value(), Value::bulk("a"));
    assert_eq!(w.read_value(), Value::bulk("b"));
    assert_eq!(
        queue_info_int(&proxy, "np8", "acks"),
        0,
        "a pipelined pop acked a"
    );
    // Two pops in one transaction: neither finishes the other.
    assert_eq!(w.cmd(&["MULTI"]), Value::Simple("OK".into()));
    w.cmd(&["RPOP", "np8"]);
    w.cmd(&["RPOP", "np8"]);
    assert_eq!(w.cmd(&["EXEC"]), Value::bulks(&["c", "d"]));
    // Its first pop finished what the worker had before (a and b), the
    // second left c alone.
    assert_eq!(
        queue_info_int(&proxy, "np8", "acks"),
        2,
        "a pop in MULTI acked c"
    );
    // A pop sent after the replies: the worker is done with c and d.
    assert_eq!(w.cmd(&["RPOP", "np8"]), Value::bulk("e"));
    assert_eq!(queue_info_int(&proxy, "np8", "acks"), 4);
}

#[test]
fn next_pop_acknowledges_when_it_parks_behind_other_waiting_workers() {
    let (_redis, proxy, metrics) = start_with_metrics(CONFIG);
    let mut busy = proxy.client();
    busy.cmd(&["LPUSH", "np7", "b"]);
    assert_eq!(busy.cmd(&["RPOP", "np7"]), Value::bulk("b"));
    // An idle worker waits on the empty queue first.
    let mut idle = proxy.client();
    idle.send(&["BRPOP", "np7", "0"]);
    wait_parked(metrics, 1);
    // busy asks for its next job and waits behind idle: b is acknowledged
    // at once, not when busy's turn comes.
    busy.send(&["BRPOP", "np7", "0"]);
    wait_parked(metrics, 2);
    eventually("b acknowledged", || {
        (queue_info_int(&proxy, "np7", "acks") == 1).then_some(())
    });
    assert_eq!(queue_info_int(&proxy, "np7", "leased"), 0);
}

#[test]
fn a_next_pop_blocking_pop_that_times_out_has_acknowledged() {
    let (_redis, proxy) = start();
    let mut w = proxy.client();
    w.cmd(&["LPUSH", "np6", "a"]);
    assert_eq!(w.cmd(&["RPOP", "np6"]), Value::bulk("a"));
    assert_eq!(w.cmd(&["BRPOP", "np6", "0.1"]), Value::Nil);
    let i = queue_info(&proxy, "np6");
    assert_eq!((int(&i["leased"]), int(&i["acks"])), (0, 1), "{i:?}");
}

#[test]
fn a_killed_next_pop_worker_gets_its_message_redelivered() {
    let (_redis, proxy) = start();
    let mut w = proxy.client();
    w.cmd(&["LPUSH", "np3", "job"]);
    assert_eq!(w.cmd(&["RPOP", "np3"]), Value::bulk("job"));
    // The worker dies mid-job: it never pops again, so nothing acknowledges.
    drop(w);
    let mut w2 = proxy.client();
    assert_eq!(pop_eventually(&mut w2, "np3"), "job");
    let l = &queue_leases(&proxy, "np3")[0];
    assert_eq!((int(&l["deliveries"]), int(&l["expiries"])), (2, 1));
    assert_eq!(queue_info_int(&proxy, "np3", "acks"), 0);
}

#[test]
fn a_late_next_pop_calls_back_the_redelivery_as_a_late_ack_would() {
    let (redis, proxy) = start();
    let mut w = proxy.client();
    w.cmd(&["LPUSH", "np5", "slow"]);
    assert_eq!(w.cmd(&["RPOP", "np5"]), Value::bulk("slow"));
    // The worker is slower than its lease (1.5 s): the message is back.
    eventually("the expiry", || {
        let i = queue_info(&proxy, "np5");
        (int(&i["expiries"]) == 1 && int(&i["ready"]) == 1).then_some(())
    });
    // It finishes and pops again, before anyone took the copy: that pop
    // acknowledges late, and the copy is gone.
    assert_eq!(w.cmd(&["RPOP", "np5"]), Value::Nil);
    let i = queue_info(&proxy, "np5");
    let got: Vec<i64> = ["ready", "leased", "late-acks", "acks"]
        .iter()
        .map(|f| int(&i[*f]))
        .collect();
    assert_eq!(got, vec![0, 0, 1, 0], "{i:?}");
    let Value::Array(left) = redis.client().cmd(&["KEYS", "*"]) else {
        panic!("KEYS")
    };
    assert_eq!(left, vec![Value::bulk("ackq:{np5}:np5:stats")]);
    // Once the copy was popped again, the late pop is too late.
    w.cmd(&["LPUSH", "np5", "slow2"]);
    assert_eq!(w.cmd(&["RPOP", "np5"]), Value::bulk("slow2"));
    let mut other = proxy.client();
    assert_eq!(pop_eventually(&mut other, "np5"), "slow2");
    assert_eq!(w.cmd(&["RPOP", "np5"]), Value::Nil);
    assert_eq!(queue_info_int(&proxy, "np5", "leased"), 1);
    assert_eq!(queue_info_int(&proxy, "np5", "late-acks"), 1);
}

/// What next-pop does to a client that shares one connection among jobs
/// (a pool): the second job's pop acknowledges the first job's message
/// while it is still being worked on. If that work then fails, the message
/// is gone. next-pop is only safe with one worker per connection.
#[test]
fn next_pop_with_a_pooled_connection_acknowledges_too_early() {
    let (_redis, proxy) = start();
    let mut pooled = proxy.client();
    pooled.cmd(&["LPUSH", "np4", "job1", "job2"]);
    // Worker 1 borrows the connection, pops job1, returns the connection.
    assert_eq!(pooled.cmd(&["RPOP", "np4"]), Value::bulk("job1"));
    // Worker 2 borrows the same connection for its pop.
    assert_eq!(pooled.cmd(&["RPOP", "np4"]), Value::bulk("job2"));
    // job1 counts as done, although worker 1 is still on it.
    let i = queue_info(&proxy, "np4");
    assert_eq!((int(&i["leased"]), int(&i["acks"])), (1, 1));
    // Worker 1 crashes, worker 2 too: only job2 comes back (lease 1.5 s).
    let mut rescue = proxy.client();
    assert_eq!(pop_eventually(&mut rescue, "np4"), "job2");
    assert_eq!(rescue.cmd(&["RPOP", "np4"]), Value::Nil, "job1 is lost");
    assert_eq!(queue_info_int(&proxy, "np4", "ready"), 0);
}

#[test]
fn requeue_on_disconnect_returns_leases_at_once_and_only_when_on() {
    let (redis, proxy, metrics) = start_with_metrics(CONFIG);
    let mut on = proxy.client();
    let mut off = proxy.client();
    on.cmd(&["LPUSH", "rq1", "a", "b"]);
    off.cmd(&["LPUSH", "d12", "x"]);
    assert_eq!(on.cmd(&["RPOP", "rq1"]), Value::bulk("a"));
    assert_eq!(on.cmd(&["RPOP", "rq1"]), Value::bulk("b"));
    // An acknowledged one stays acknowledged.
    assert_eq!(on.cmd(&["ACK", "rq1", "b"]), Value::Int(1));
    assert_eq!(off.cmd(&["RPOP", "d12"]), Value::bulk("x"));
    // A move lease: its copy in the destination goes too.
    on.cmd(&["LPUSH", "rq2", "m"]);
    assert_eq!(
        on.cmd(&["BRPOPLPUSH", "rq2", "rq2:doing", "0"]),
        Value::bulk("m")
    );
    drop(off);
    drop(on);
    eventually("both connections closed", || {
        (metric(metrics, "ackproxy_connections_open") <= 0.0).then_some(())
    });
    // Lease 10 minutes, yet a is back now; so is m, without its copy.
    eventually("a back in rq1", || {
        (queue_info_int(&proxy, "rq1", "ready") == 1).then_some(())
    });
    eventually("m back in rq2", || {
        (queue_info_int(&proxy, "rq2", "ready") == 1).then_some(())
    });
    let mut direct = redis.client();
    assert_eq!(direct.cmd(&["LLEN", "rq2:doing"]), Value::Int(0));
    let i = queue_info(&proxy, "rq1");
    let got: Vec<i64> = ["leased", "disconnects", "expiries", "acks"]
        .iter()
        .map(|f| int(&i[*f]))
        .collect();
    assert_eq!(got, vec![0, 1, 0, 1], "{i:?}");
    assert_eq!(
        metric(metrics, "ackproxy_disconnect_requeues_total{rule=\"rq*\"}"),
        2.0
    );
    // Without the option the lease stays until it runs out.
    let i = queue_info(&proxy, "d12");
    assert_eq!((int(&i["leased"]), int(&i["ready"])), (1, 0), "{i:?}");
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["RPOP", "rq1"]), Value::bulk("a"));
    let l = &queue_leases(&proxy, "rq1")[0];
    assert_eq!((int(&l["deliveries"]), int(&l["expiries"])), (2, 1));
}

/// An ACK on a rule that tracks connections also drops the lease's entry in
/// the connection index: nothing of the message is left in Redis.
#[test]
fn ack_on_a_connection_tracking_rule_leaves_no_index_entry() {
    let (redis, proxy, _metrics) = start_with_metrics(CONFIG);
    let mut c = proxy.client();
    let mut direct = redis.client();
    c.cmd(&["LPUSH", "rq3", "a"]);
    assert_eq!(c.cmd(&["RPOP", "rq3"]), Value::bulk("a"));
    let ids = match direct.cmd(&["KEYS", "ackq:*rq3*:o:*"]) {
        Value::Array(keys) if keys.len() == 1 => as_str(&keys[0]),
        other => panic!("the connection's index on rq3: {other:?}"),
    };
    // While leased: the connection's entry.
    assert_eq!(direct.cmd(&["ZCARD", &ids]), Value::Int(1));
    assert_eq!(c.cmd(&["ACK", "rq3", "a"]), Value::Int(1));
    assert_eq!(direct.cmd(&["ZCARD", &ids]), Value::Int(0));
    let mut left = match direct.cmd(&["KEYS", "ackq:*rq3*"]) {
        Value::Array(keys) => keys.iter().map(as_str).collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    left.retain(|k| !crate::common::is_queue_stats(k));
    assert!(left.is_empty(), "left in Redis: {left:?}");
}

/// Older versions indexed a connection's leases in the queue's `ids` set:
/// such a lease, ended by an ACK from another connection, leaves nothing
/// of itself in Redis either.
#[test]
fn a_lease_an_older_version_indexed_by_connection_leaves_no_index_entry() {
    let (redis, proxy, _metrics) = start_with_metrics(CONFIG);
    let mut c = proxy.client();
    let mut direct = redis.client();
    direct.cmd(&[
        "EVAL",
        "local now = redis.call('TIME')[1] * 1000 \
         redis.call('HSET', KEYS[1] .. 'msgs', 'ja', '\\193o' .. now .. '|old.1||a') \
         redis.call('ZADD', KEYS[1] .. 'leases', now + 60000, 'ja') \
         redis.call('ZADD', KEYS[1] .. 'ids', 0, 'oold.1|ja')",
        "1",
        "ackq:{rq3}:rq3:",
    ]);
    assert_eq!(queue_info_int(&proxy, "rq3", "leased"), 1);
    assert_eq!(c.cmd(&["ACK", "rq3", "a"]), Value::Int(1));
    assert_eq!(queue_info_int(&proxy, "rq3", "leased"), 0);
    let mut left = match direct.cmd(&["KEYS", "ackq:*rq3*"]) {
        Value::Array(keys) => keys.iter().map(as_str).collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    left.retain(|k| !crate::common::is_queue_stats(k));
    assert!(left.is_empty(), "left in Redis: {left:?}");
}

// ------------------------------------------------------------ shadow mode

#[test]
fn shadow_mode_never_redelivers_but_reports_what_it_would_have() {
    let (redis, proxy, metrics) = start_with_metrics(CONFIG);
    let mut c = proxy.client();
    c.cmd(&["LPUSH", "sh1", "done", "rejected", "lost"]);
    // Acknowledged in time: as with enforcement.
    assert_eq!(c.cmd(&["RPOP", "sh1"]), Value::bulk("done"));
    assert_eq!(c.cmd(&["ACK", "sh1", "done"]), Value::Int(1));
    // A NACK and an expiry (lease 100 ms): recorded, reported, not returned.
    assert_eq!(c.cmd(&["RPOP", "sh1"]), Value::bulk("rejected"));
    assert_eq!(c.cmd(&["NACK", "sh1", "rejected"]), Value::Int(1));
    assert_eq!(c.cmd(&["RPOP", "sh1"]), Value::bulk("lost"));
    let l = queue_leases(&proxy, "sh1");
    assert_eq!(l.len(), 1);
    assert_eq!(as_str(&l[0]["payload"]), "lost");
    eventually("the expiry", || {
        (queue_info_int(&proxy, "sh1", "expiries") == 1).then_some(())
    });
    let i = queue_info(&proxy, "sh1");
    let got: Vec<i64> = [
        "ready",
        "leased",
        "delayed",
        "dead",
        "would-redeliver",
        "redeliveries",
        "nacks",
        "acks",
        "shadow",
    ]
    .iter()
    .map(|f| int(&i[*f]))
    .collect();
    assert_eq!(got, vec![0, 0, 0, 0, 2, 0, 1, 1, 1], "{i:?}");
    assert_eq!(c.cmd(&["RPOP", "sh1"]), Value::Nil);
    assert_eq!(
        metric(
            metrics,
            "ackproxy_shadow_would_redeliver_total{rule=\"sh*\"}"
        ),
        2.0
    );
    // max_deliveries is 1: with enforcement both would be dead letters.
    let Value::Array(left) = redis.client().cmd(&["KEYS", "*"]) else {
        panic!("KEYS")
    };
    assert_eq!(left, vec![Value::bulk("ackq:{sh1}:sh1:stats")]);
}

#[test]
fn delayed_copies_survive_a_restarted_sequence() {
    // The totals hash holds the delayed set's sequence counter; when it
    // expires the counter restarts, and a new member may meet one still
    // waiting. Neither may be lost.
    let (redis, proxy) = start();
    let mut c = proxy.client();
    let mut direct = redis.client();
    c.cmd(&["QUEUE", "PUSH", "d13", "a", "b", "DELAY", "100000"]);
    direct.cmd(&["DEL", "ackq:{d13}:d13:stats"]);
    c.cmd(&["QUEUE", "PUSH", "d13", "a", "b", "c", "DELAY", "100000"]);
    c.cmd(&["QUEUE", "PUSH", "d13", "a", "DELAY", "100000"]);
    assert_eq!(queue_info_int(&proxy, "d13", "delayed"), 6);
}

#[test]
fn new_queue_commands_need_the_users_rights() {
    let redis = Redis::start_with(&["--requirepass", "secret"]);
    let mut admin = redis.client();
    assert_eq!(admin.cmd(&["AUTH", "secret"]), Value::Simple("OK".into()));
    // May read the queue and its dead letters, not write them.
    let setuser = [
        "ACL",
        "SETUSER",
        "reader",
        "on",
        ">rpass",
        "~dacl",
        "%R~{dacl}:dead",
        "+lrange",
        "+rpop",
    ];
    assert_eq!(admin.cmd(&setuser), Value::Simple("OK".into()));
    let proxy = Proxy::start_with_config(redis.port, CONFIG, &["--upstream-password", "secret"]);
    let mut c = proxy.client();
    assert_eq!(
        c.cmd(&["AUTH", "reader", "rpass"]),
        Value::Simple("OK".into())
    );
    let refused = |sub: &str| {
        Value::Error(format!(
            "NOPERM this user has no permissions to run the 'queue|{sub}' command"
        ))
    };
    assert_eq!(c.cmd(&["QUEUE", "PUSH", "dacl", "x"]), refused("push"));
    assert_eq!(c.cmd(&["QUEUE", "REDRIVE", "dacl"]), refused("redrive"));
    assert_eq!(c.cmd(&["QUEUE", "PURGE", "dacl", "DEAD"]), refused("purge"));
    assert_eq!(c.cmd(&["QUEUE", "DEAD", "dacl"]), Value::Array(vec![]));
    assert_eq!(admin.cmd(&["EXISTS", "dacl"]), Value::Int(0));
}

// ---------------------------------------------------- completion signals

/// rq's one-queue pattern: a move pop into an intermediate list, an LREM
/// from it when the job starts (no ACK on this rule), the finish written to
/// a registry; and kombu's and Celery's: an HDEL of the delivery tag, a
/// result stored under the task id, both ids nested in the JSON message.
const SIGNALS: &str = r#"
[[queue]]
pattern = "rq:queue:default"
lease_ms = 600000
pop_end = "left"
lrem_acks = false
done = ["ZADD rq:finished:default", "ZADD rq:failed:default"]

[[queue]]
pattern = "rq:queue:*"
lease_ms = 600000
pop_end = "left"
done = ["ZADD rq:finished:*"]

[[queue]]
pattern = "celery"
lease_ms = 600000
ack_id = "json:headers.id"
done = ["SET celery-task-meta-*"]

[[queue]]
pattern = "kombu"
lease_ms = 600000
ack_id = "json:properties.delivery_tag"
done = ["HDEL unacked"]
"#;

fn leased(p: &Proxy, q: &str) -> i64 {
    queue_info_int(p, q, "leased")
}

fn wait_leased(p: &Proxy, q: &str, n: i64) {
    eventually(&format!("{n} leased in {q}"), || {
        (leased(p, q) == n).then_some(())
    });
}

#[test]
fn a_registry_write_acknowledges_and_an_lrem_at_job_start_does_not() {
    let (_redis, p) = Proxy::with_redis(SIGNALS);
    let mut c = p.client();
    let q = "rq:queue:default";
    c.cmd(&["RPUSH", q, "j1", "j2", "j3"]);
    for id in ["j1", "j2", "j3"] {
        let v = c.cmd(&["LMOVE", q, "rq:queue:default:intermediate", "LEFT", "RIGHT"]);
        assert_eq!(as_str(&v), id);
    }
    // rq's job process takes the job out of the intermediate list before it
    // runs it: on this rule that is no ACK.
    assert_eq!(
        c.cmd(&["LREM", "rq:queue:default:intermediate", "1", "j1"]),
        Value::Int(1)
    );
    assert_eq!(leased(&p, q), 3);
    // The finish, as rq writes it: in a transaction.
    assert_eq!(c.cmd(&["MULTI"]), Value::Simple("OK".into()));
    c.cmd(&["ZADD", "rq:finished:default", "1700000000", "j1"]);
    let exec = c.cmd(&["EXEC"]);
    assert_eq!(exec, Value::Array(vec![Value::Int(1)]));
    wait_leased(&p, q, 2);
    // A failure is an end too, outside a transaction.
    assert_eq!(
        c.cmd(&["ZADD", "rq:failed:default", "NX", "1", "j2"]),
        Value::Int(1)
    );
    wait_leased(&p, q, 1);
    // A write Redis refuses says nothing, nor one WATCH aborted.
    c.cmd(&["SET", "rq:finished:default", "x"]);
    let refused = c.cmd(&["ZADD", "rq:finished:default", "1", "j3"]);
    assert!(
        matches!(refused, Value::Error(ref e) if e.starts_with("WRONGTYPE")),
        "{refused:?}"
    );
    c.cmd(&["DEL", "rq:finished:default"]);
    let mut other = p.client();
    c.cmd(&["WATCH", "w"]);
    other.cmd(&["SET", "w", "changed"]);
    c.cmd(&["MULTI"]);
    c.cmd(&["ZADD", "rq:finished:default", "1", "j3"]);
    assert_eq!(c.cmd(&["EXEC"]), Value::Nil);
    // Given time, nothing of either was acknowledged.
    thread::sleep(Duration::from_millis(300));
    assert_eq!(leased(&p, q), 1);
    // The registry of another queue names another queue (a glob rule's
    // `*`), and acknowledges nothing here.
    c.cmd(&["RPUSH", "rq:queue:mail", "m1"]);
    assert_eq!(as_str(&c.cmd(&["LPOP", "rq:queue:mail"])), "m1");
    c.cmd(&["ZADD", "rq:finished:mail", "1", "j3", "2", "m1"]);
    wait_leased(&p, "rq:queue:mail", 0);
    assert_eq!(leased(&p, q), 1);
}

#[test]
fn ids_nested_in_json_are_acknowledged_by_a_result_and_by_a_tag() {
    let (_redis, p) = Proxy::with_redis(SIGNALS);
    let mut c = p.client();
    let task = r#"{"body":"e30=","headers":{"lang":"py","id":"5c1f-task"},"properties":{"delivery_tag":"d-1"}}"#;
    c.cmd(&["LPUSH", "celery", task]);
    let popped = c.cmd(&["BRPOP", "celery", "1"]);
    assert!(
        matches!(popped, Value::Array(ref a) if a.len() == 2),
        "{popped:?}"
    );
    wait_leased(&p, "celery", 1);
    // The result backend's write, inside the pipeline it comes in.
    c.send_raw(b"MULTI\r\nSETEX celery-task-meta-5c1f-task 86400 {}\r\nPUBLISH celery-task-meta-5c1f-task {}\r\nEXEC\r\n");
    for _ in 0..4 {
        c.read_value();
    }
    wait_leased(&p, "celery", 0);
    assert_eq!(
        c.cmd(&["SET", "celery-task-meta-none", "{}"]),
        Value::Simple("OK".into())
    );

    // A number keeps its digits (no float rounding).
    let tag = "12345678901234567891";
    c.cmd(&[
        "LPUSH",
        "kombu",
        &format!(r#"{{"properties":{{"delivery_tag":{tag}}}}}"#),
    ]);
    c.cmd(&["RPOP", "kombu"]);
    c.cmd(&["HSET", "unacked", "12345678901234567890", "x"]);
    c.cmd(&["HDEL", "unacked", "12345678901234567890"]);
    thread::sleep(Duration::from_millis(200));
    assert_eq!(leased(&p, "kombu"), 1);
    c.cmd(&["HDEL", "unacked", tag]);
    wait_leased(&p, "kombu", 0);
}

/// What a rule does not fit is counted (and logged once): a processing
/// list that is itself a queue, pops from the other end than `pop_end`, a
/// client's script that names a move destination; and signals' own
/// acknowledgements are counted.
#[test]
fn rules_that_do_not_fit_their_clients_are_counted() {
    let config = r#"
[[queue]]
pattern = "tasks:*"
lease_ms = 600000
ack_id = "payload"

[[queue]]
pattern = "rq:queue:default"
lease_ms = 600000
pop_end = "left"
done = ["ZADD rq:finished:default"]
"#;
    let (_redis, p, metrics) = start_with_metrics(config);
    let unfit = |rule: &str, reason: &str| {
        series(
            "ackproxy_rule_unfit_total",
            &[("rule", rule), ("reason", reason)],
        )
    };
    let mut c = p.client();
    c.cmd(&["LPUSH", "tasks:mail", "a", "b", "c"]);
    // The README's example before it was fixed: the processing list
    // matches the queue's own rule.
    assert_eq!(
        as_str(&c.cmd(&["BRPOPLPUSH", "tasks:mail", "tasks:mail:doing", "0"])),
        "a"
    );
    await_metric(metrics, &unfit("tasks:*", "destination_is_queue"), 1.0);
    // A left pop on a rule whose workers pop from the right.
    assert_eq!(as_str(&c.cmd(&["LPOP", "tasks:mail"])), "c");
    await_metric(metrics, &unfit("tasks:*", "pop_end"), 1.0);
    // A script that moves what the proxy put in the processing list.
    c.cmd(&[
        "EVAL",
        "return redis.call('LLEN', KEYS[1])",
        "1",
        "tasks:mail:doing",
    ]);
    await_metric(metrics, &unfit("tasks:*", "script_moves"), 1.0);
    // Fitting pops are not counted.
    c.cmd(&["RPUSH", "rq:queue:default", "j1"]);
    assert_eq!(as_str(&c.cmd(&["LPOP", "rq:queue:default"])), "j1");
    c.cmd(&["ZADD", "rq:finished:default", "1", "j1"]);
    await_metric(
        metrics,
        &series(
            "ackproxy_signal_acks_total",
            &[("rule", "rq:queue:default")],
        ),
        1.0,
    );
    assert_eq!(metric(metrics, &unfit("rq:queue:default", "pop_end")), 0.0);
}
