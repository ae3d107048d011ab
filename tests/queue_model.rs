//! Random interleavings of queue operations checked against a model: pushes
//! (LPUSH and QUEUE PUSH) with duplicate payloads, every pop form with
//! counts up to 10× the per-call bound, ACK (timely, late and unknown), NACK
//! (also DELAY 0), EXTEND and lease expiry (forced with `QUEUE EXTEND id 1`). After every step the proxy's view
//! (`QUEUE INFO`) and every reply must match the model: every message in
//! exactly one place, none lost, none invented; at the end, once everything
//! is acknowledged, no auxiliary key remains. (Move pops take part; what
//! their destination holds is the client's own list and is checked by the
//! queue tests, not here.)
//!
//! `ACKPROXY_MODEL_SEED` replays one sequence; `ACKPROXY_MODEL_CASES` sets
//! how many sequences run (default 6).

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;

const CONFIG: &str = r#"
[[queue]]
pattern = "mq"
lease_ms = 600000
max_deliveries = 1000000
ack_id = "payload"
redeliver = "next"
pop_end = "right"

[reaper]
interval_ms = 10
batch = 100
"#;

/// Elements one pop script call takes at most (`queue::pop::POP_BATCH`).
const BOUND: u64 = 50;

type Bag = BTreeMap<String, i64>;

fn add(b: &mut Bag, p: &str, n: i64) {
    let e = b.entry(p.to_string()).or_insert(0);
    *e += n;
    assert!(*e >= 0, "model went negative for {p}");
    if *e == 0 {
        b.remove(p);
    }
}

fn total(b: &Bag) -> i64 {
    b.values().sum()
}

#[derive(Default)]
struct Model {
    ready: Bag,
    leased: Bag,
    /// Copies of a payload back in the list after their lease ended, not
    /// popped since: an ACK of that payload then is a late ACK.
    requeued: Bag,
    acked: i64,
    pushed: i64,
}

impl Model {
    fn popped(&mut self, p: &str) {
        assert!(
            self.ready.contains_key(p),
            "popped {p:?}, which the model does not have ready: {:?}",
            self.ready
        );
        add(&mut self.ready, p, -1);
        if self.requeued.contains_key(p) {
            add(&mut self.requeued, p, -1);
        }
        add(&mut self.leased, p, 1);
    }

    /// A lease of `p` ended without an ACK: back to the list.
    fn returned(&mut self, p: &str) {
        add(&mut self.leased, p, -1);
        add(&mut self.ready, p, 1);
        add(&mut self.requeued, p, 1);
    }
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => panic!("expected an integer, got {other:?}"),
    }
}

fn bulks(v: &Value) -> Vec<String> {
    match v {
        Value::Nil => vec![],
        Value::Bulk(b) => vec![String::from_utf8_lossy(b).into_owned()],
        Value::Array(a) => a
            .iter()
            .map(|x| match x {
                Value::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
                other => panic!("element {other:?}"),
            })
            .collect(),
        other => panic!("pop reply {other:?}"),
    }
}

/// The values of a reply that names its key: `[key, value]` or
/// `[key, [values]]`, or nil.
fn keyed_values(r: Value) -> Vec<String> {
    match r {
        Value::Nil => vec![],
        Value::Array(kv) => bulks(&kv[1]),
        other => panic!("pop reply {other:?}"),
    }
}

/// Sends `words` followed by `count`; returns the request and the values.
fn keyed(c: &mut Client, words: &[&str], count: u64) -> (Vec<String>, Vec<String>) {
    let a: Vec<String> = words
        .iter()
        .map(|s| s.to_string())
        .chain([count.to_string()])
        .collect();
    let r = c.cmd(&a.iter().map(String::as_str).collect::<Vec<_>>());
    (a, keyed_values(r))
}

fn info(c: &mut Client, field: &str) -> i64 {
    let Value::Array(items) = c.cmd(&["QUEUE", "INFO", "mq"]) else {
        panic!("QUEUE INFO")
    };
    for pair in items.chunks(2) {
        if pair[0] == Value::bulk(field) {
            return int(&pair[1]);
        }
    }
    panic!("no {field}")
}

fn check(c: &mut Client, m: &Model, step: &str) {
    // Forced expiries are handled by the reaper within a few intervals.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (ready, leased) = (info(c, "ready"), info(c, "leased"));
        if (ready, leased) == (total(&m.ready), total(&m.leased)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after {step}: proxy says ready {ready} leased {leased}, model {} {}",
            total(&m.ready),
            total(&m.leased)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        m.pushed,
        total(&m.ready) + total(&m.leased) + m.acked,
        "after {step}: model bookkeeping"
    );
}

/// The model in database `db`: the client and the direct connection
/// select it first.
fn run(seed: u64, db: &str) {
    let redis = Redis::start();
    let proxy = Proxy::start_with_config(redis.port, CONFIG, &[]);
    let mut c = proxy.client();
    let mut direct = redis.client();
    for conn in [&mut c, &mut direct] {
        assert_eq!(conn.cmd(&["SELECT", db]), Value::Simple("OK".into()));
    }
    let mut rng = Rng(seed | 1);
    let mut m = Model::default();
    // Few distinct payloads: duplicates in flight all the time.
    let payload = |rng: &mut Rng| format!("p{}", rng.below(12));
    let any_leased = |m: &Model, rng: &mut Rng| -> Option<String> {
        let keys: Vec<&String> = m.leased.keys().collect();
        (!keys.is_empty()).then(|| keys[rng.below(keys.len() as u64) as usize].clone())
    };
    for step in 0..120 {
        let op = rng.below(10);
        let label = match op {
            0 | 1 => {
                let big = rng.below(4) == 0;
                let n = 1 + rng.below(if big { 300 } else { 8 });
                let ps: Vec<String> = (0..n).map(|_| payload(&mut rng)).collect();
                // QUEUE PUSH (due now) puts them where LPUSH would.
                let queue_push = rng.below(2) == 0;
                let mut args = if queue_push {
                    vec!["QUEUE", "PUSH", "mq"]
                } else {
                    vec!["LPUSH", "mq"]
                };
                args.extend(ps.iter().map(String::as_str));
                if queue_push && rng.below(2) == 0 {
                    args.extend(["DELAY", "0"]);
                }
                let r = c.cmd(&args);
                if queue_push {
                    assert_eq!(r, Value::Int(n as i64), "{args:?}");
                }
                for p in &ps {
                    add(&mut m.ready, p, 1);
                }
                m.pushed += n as i64;
                format!("{} {n}", args[0])
            }
            2 | 3 => {
                let count = 1 + rng.below(BOUND * 10);
                let form = rng.below(6);
                let ready = total(&m.ready);
                let (args, got): (Vec<String>, Vec<String>) = match form {
                    0 | 4 => {
                        let verb = if form == 0 { "RPOP" } else { "LPOP" };
                        let a = vec![verb.into(), "mq".into(), count.to_string()];
                        let r = c.cmd(&a.iter().map(String::as_str).collect::<Vec<_>>());
                        (a, bulks(&r))
                    }
                    1 => keyed(&mut c, &["LMPOP", "1", "mq", "RIGHT", "COUNT"], count),
                    2 => keyed(
                        &mut c,
                        &["BLMPOP", "0.05", "1", "mq", "RIGHT", "COUNT"],
                        count,
                    ),
                    _ => {
                        let verb = if form == 3 { "BRPOP" } else { "BLPOP" };
                        let a: Vec<String> =
                            [verb, "mq", "0.05"].iter().map(|s| s.to_string()).collect();
                        let r = c.cmd(&a.iter().map(String::as_str).collect::<Vec<_>>());
                        (a, keyed_values(r))
                    }
                };
                let want = if form == 3 || form == 5 {
                    1
                } else {
                    count as i64
                };
                assert_eq!(
                    got.len() as i64,
                    want.min(ready),
                    "{args:?} with {ready} ready (seed {seed})"
                );
                for p in &got {
                    m.popped(p);
                }
                format!("{args:?} -> {}", got.len())
            }
            4 => {
                let forms: [&[&str]; 4] = [
                    &["RPOPLPUSH", "mq", "mdst"],
                    &["LMOVE", "mq", "mdst", "LEFT", "RIGHT"],
                    &["BRPOPLPUSH", "mq", "mdst", "0.05"],
                    &["BLMOVE", "mq", "mdst", "RIGHT", "LEFT", "0.05"],
                ];
                let args = forms[rng.below(4) as usize];
                let got = bulks(&c.cmd(args));
                assert_eq!(got.len() as i64, total(&m.ready).min(1), "{args:?}");
                for p in &got {
                    m.popped(p);
                }
                format!("{args:?} -> {got:?}")
            }
            5 | 6 => {
                // ACK a few ids: leased ones, late ones and unknown ones.
                let big = rng.below(4) == 0;
                let n = 1 + rng.below(if big { 200 } else { 5 });
                let ids: Vec<String> = (0..n)
                    .map(|_| {
                        if rng.below(5) == 0 {
                            format!("unknown{}", rng.below(3))
                        } else {
                            payload(&mut rng)
                        }
                    })
                    .collect();
                let mut expect = 0;
                for id in &ids {
                    // One lease of that payload, else one requeued copy.
                    if m.leased.contains_key(id) {
                        add(&mut m.leased, id, -1);
                        m.acked += 1;
                        expect += 1;
                    } else if m.requeued.contains_key(id) {
                        add(&mut m.requeued, id, -1);
                        add(&mut m.ready, id, -1);
                        m.acked += 1;
                        expect += 1;
                    }
                }
                let mut args = vec!["ACK", "mq"];
                args.extend(ids.iter().map(String::as_str));
                assert_eq!(int(&c.cmd(&args)), expect, "ACK {ids:?} (seed {seed})");
                format!("ACK {n}")
            }
            7 => {
                let Some(p) = any_leased(&m, &mut rng) else {
                    continue;
                };
                // DELAY 0 is at once, as a NACK under this rule's policy.
                let mut args = vec!["NACK", "mq", p.as_str()];
                if rng.below(2) == 0 {
                    args.extend(["DELAY", "0"]);
                }
                assert_eq!(c.cmd(&args), Value::Int(1));
                m.returned(&p);
                format!("{args:?}")
            }
            _ => {
                // Expiry: every lease of that payload ends in 1 ms.
                let Some(p) = any_leased(&m, &mut rng) else {
                    continue;
                };
                let n = m.leased[&p];
                let r = int(&c.cmd(&["QUEUE", "EXTEND", "mq", &p, "1"]));
                assert_eq!(r, n.min(100), "EXTEND {p}");
                for _ in 0..r {
                    m.returned(&p);
                }
                format!("expire {r} x {p}")
            }
        };
        check(&mut c, &m, &format!("step {step}: {label} (seed {seed})"));
    }

    // Drain: acknowledge every lease, pop and acknowledge everything ready.
    for (p, n) in m.leased.clone() {
        for _ in 0..n {
            assert_eq!(c.cmd(&["ACK", "mq", &p]), Value::Int(1));
            m.acked += 1;
        }
    }
    m.leased.clear();
    loop {
        let got = bulks(&c.cmd(&["RPOP", "mq", "1000"]));
        if got.is_empty() {
            break;
        }
        for p in got {
            assert_eq!(c.cmd(&["ACK", "mq", &p]), Value::Int(1));
            m.acked += 1;
        }
    }
    assert_eq!(m.acked, m.pushed, "every message acknowledged exactly once");
    direct.cmd(&["DEL", "mdst"]);
    let left: Vec<String> = bulks(&direct.cmd(&["KEYS", "*"]))
        .into_iter()
        .filter(|k| !is_queue_stats(k))
        .collect();
    assert!(left.is_empty(), "keys left (seed {seed}): {left:?}");
    // Nothing of it in another database.
    let elsewhere = bulks(&redis.client().cmd(&["KEYS", "*"]));
    assert!(
        db == "0" || elsewhere.is_empty(),
        "database 0 holds keys of database {db}'s queue (seed {seed}): {elsewhere:?}"
    );
}

#[test]
fn random_interleavings_match_the_model() {
    interleavings("0");
}

#[test]
fn random_interleavings_match_the_model_in_database_3() {
    interleavings("3");
}

fn interleavings(db: &str) {
    if let Ok(seed) = std::env::var("ACKPROXY_MODEL_SEED") {
        run(seed.parse().expect("a number"), db);
        return;
    }
    let cases: u64 = std::env::var("ACKPROXY_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    for i in 0..cases {
        let seed = base.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        println!("seed {seed}");
        run(seed, db);
    }
}
