//! Blocking pops on queue keys: served at once from a list that has
//! elements, as Redis serves them, and parked only when it has none; parked
//! pops of one key never wait for another key's, however long one runs.

use std::time::{Duration, Instant};

use crate::common::*;

fn config(metrics: u16) -> String {
    format!(
        r#"
metrics = "127.0.0.1:{metrics}"

[[queue]]
pattern = "q*"
lease_ms = 600000
ack_id = "payload"
"#
    )
}

/// Elements of the long pop: its bounded calls take seconds together.
const BIG: usize = 200_000;

fn pair(key: &str, value: &str) -> Value {
    Value::bulks(&[key, value])
}

#[test]
fn a_long_parked_pop_holds_no_other_key() {
    let redis = Redis::start();
    let ops = free_port();
    let proxy = Proxy::start_with_config(redis.port, &config(ops), &[]);
    let mut direct = redis.client();
    let parked = || metric(ops, "ackproxy_parked_clients");

    // A pop parked on an empty queue, then woken by one push of BIG
    // elements: the dispatcher runs it, as many bounded calls.
    let mut big = proxy.client();
    big.set_read_timeout(Some(Duration::from_secs(300)));
    let count = BIG.to_string();
    big.send(&["BLMPOP", "0", "1", "qbig", "RIGHT", "COUNT", &count]);
    wait_until("the long pop to park", || parked() == 1.0);
    let values: Vec<String> = (0..BIG).map(|i| format!("m{i}")).collect();
    let mut push = vec!["RPUSH", "qbig"];
    push.extend(values.iter().map(String::as_str));
    assert_eq!(direct.cmd(&push), Value::Int(BIG as i64));
    let llen = |direct: &mut Client| match direct.cmd(&["LLEN", "qbig"]) {
        Value::Int(n) => n,
        other => panic!("LLEN: {other:?}"),
    };
    wait_until("the long pop to start taking", || {
        llen(&mut direct) < BIG as i64
    });

    // Another client's BRPOP on a queue that has a message is answered at
    // once, as Redis answers it.
    assert_eq!(direct.cmd(&["LPUSH", "qother", "o"]), Value::Int(1));
    let mut other = proxy.client();
    let t = Instant::now();
    let got = other.cmd(&["BRPOP", "qother", "1"]);
    let took = t.elapsed();
    assert_eq!(got, pair("qother", "o"));
    assert!(
        took < Duration::from_millis(300),
        "BRPOP qother took {took:?}"
    );

    // And one parked on an empty queue is woken by a push to it while the
    // long pop still runs.
    let mut third = proxy.client();
    third.send(&["BRPOP", "qthird", "10"]);
    wait_until("the second pop to park", || parked() == 2.0);
    let t = Instant::now();
    assert_eq!(direct.cmd(&["LPUSH", "qthird", "t"]), Value::Int(1));
    assert_eq!(third.read_value(), pair("qthird", "t"));
    let took = t.elapsed();
    assert!(
        took < Duration::from_millis(300),
        "BRPOP qthird took {took:?}"
    );

    // Both were answered while the long pop was still under way.
    assert!(
        llen(&mut direct) > 0,
        "the long pop ended before the others were tried: make it longer"
    );
    let Value::Array(reply) = big.read_value() else {
        panic!("BLMPOP gave no array");
    };
    assert_eq!(reply[0], Value::bulk("qbig"));
    let Value::Array(popped) = &reply[1] else {
        panic!("BLMPOP: {:?}", reply[1]);
    };
    assert_eq!(popped.len(), BIG);
    assert_eq!(popped[0], Value::bulk(&values[BIG - 1]));
    assert_eq!(llen(&mut direct), 0);
}

#[test]
fn a_blocking_pop_right_after_a_push_finds_the_message() {
    const ROUNDS: usize = 500;
    let redis = Redis::start();
    let ops = free_port();
    let proxy = Proxy::start_with_config(redis.port, &config(ops), &[]);
    let mut c = proxy.client();
    // Load beside it: other clients parked on their own keys, woken over
    // and over, keep the proxy's dispatcher busy.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy: Vec<_> = (0..4)
        .map(|i| {
            let stop = stop.clone();
            let (mut popper, mut pusher) = (proxy.client(), proxy.client());
            let key = format!("qbusy{i}");
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    popper.send(&["BRPOP", &key, "5"]);
                    pusher.cmd(&["LPUSH", &key, "x"]);
                    popper.read_value();
                }
            })
        })
        .collect();
    let mut nil_at = None;
    for i in 0..ROUNDS {
        let m = format!("m{i}");
        let mut both = Client::encode(&[b"LPUSH", b"q", m.as_bytes()]);
        both.extend(Client::encode(&[b"BRPOP", b"q", b"0.01"]));
        c.send_raw(&both);
        assert_eq!(c.read_value(), Value::Int(1));
        match c.read_value() {
            Value::Nil => {
                nil_at = Some(i);
                break;
            }
            v => assert_eq!(v, pair("q", &m), "round {i}"),
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in busy {
        t.join().unwrap();
    }
    assert_eq!(
        nil_at, None,
        "BRPOP q 0.01 right after LPUSH q answered nil (round shown, of {ROUNDS})"
    );
    let ids: Vec<String> = (0..ROUNDS).map(|i| format!("m{i}")).collect();
    let mut ack = vec!["ACK", "q"];
    ack.extend(ids.iter().map(String::as_str));
    assert_eq!(c.cmd(&ack), Value::Int(ROUNDS as i64));
}

/// `SWAPDB` sends no keyspace event: a pop parked on a queue that a swap
/// through the proxy fills is woken by the swap itself, not by the
/// once-a-second recheck.
#[test]
fn a_swapdb_through_the_proxy_wakes_the_pops_it_fills() {
    let redis = Redis::start();
    let ops = free_port();
    let proxy = Proxy::start_with_config(redis.port, &config(ops), &[]);
    let parked = || metric(ops, "ackproxy_parked_clients");
    let mut waiting = proxy.client();
    assert_eq!(waiting.cmd(&["SELECT", "1"]), Value::Simple("OK".into()));
    waiting.send(&["BRPOP", "qswap", "10"]);
    wait_until("the pop to park", || parked() == 1.0);
    // In database 0, where no pop waits: its event wakes nobody in 1.
    let mut direct = redis.client();
    assert_eq!(direct.cmd(&["LPUSH", "qswap", "s"]), Value::Int(1));
    let mut swapper = proxy.client();
    let t = Instant::now();
    assert_eq!(
        swapper.cmd(&["SWAPDB", "0", "1"]),
        Value::Simple("OK".into())
    );
    assert_eq!(waiting.read_value(), pair("qswap", "s"));
    let took = t.elapsed();
    assert!(took < Duration::from_millis(300), "woken after {took:?}");
}
