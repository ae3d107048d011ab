//! Wake-up latency of a parked blocking pop: a client parks `BRPOP wl 0`
//! on an empty queue through the proxy, another pushes with `LPUSH wl m`
//! straight to Redis, and the time from the push's reply (and, as an upper
//! bound that does not depend on when this program reads that reply, from
//! just before the push is written) to the pop's reply is measured. The
//! target: p99 ≤ 5 ms.
//!
//! Run: `cargo bench --bench wake_latency`. `ACKPROXY_WAKE_SAMPLES` sets the
//! number of samples (default 1000), `ACKPROXY_BIN` the proxy binary,
//! `ACKPROXY_WAKE_RECORD=1` appends the figures to `bench/RESULTS.md`.

mod common;

use std::time::{Duration, Instant};

use common::{append_results, start_proxy, start_redis, Conn};

const TARGET_P99: Duration = Duration::from_millis(5);

fn main() {
    let samples: usize = std::env::var("ACKPROXY_WAKE_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
        .max(10);
    let bin = std::env::var("ACKPROXY_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_ackproxy").to_string());
    let config = "[[queue]]\npattern = \"wl\"\nlease_ms = 600000\nack_id = \"payload\"\n";
    let dir = std::env::temp_dir().join(format!("ackproxy-wake-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (_redis, redis_port) = start_redis(&dir);
    let (_proxy, port) = start_proxy(&bin, redis_port, config, &dir);
    let mut direct = Conn::connect(redis_port);
    let mut acker = Conn::connect(port);
    let mut waiter = Conn::connect(port);
    let (mut from_reply, mut from_write) = (Vec::new(), Vec::new());
    for i in 0..samples {
        let msg = format!("m{i}");
        waiter.send(&[b"BRPOP", b"wl", b"0"]);
        // Parked by then: the pop found the list empty and waits.
        std::thread::sleep(Duration::from_millis(5));
        let (woke, reply, written, pushed) = std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut ints = Vec::new();
                let reply = waiter.read(&mut ints);
                (Instant::now(), reply)
            });
            let written = Instant::now();
            direct.cmd(&[b"LPUSH", b"wl", msg.as_bytes()]);
            let pushed = Instant::now();
            let (woke, reply) = reader.join().unwrap();
            (woke, reply, written, pushed)
        });
        assert_eq!(reply, ("*2".to_string(), 2), "BRPOP's reply");
        from_reply.push(woke.saturating_duration_since(pushed));
        from_write.push(woke.saturating_duration_since(written));
        let (ack, _) = acker.cmd(&[b"ACK", b"wl", msg.as_bytes()]);
        assert_eq!(ack, ":1", "ACK wl {msg}");
    }
    let show = |mut v: Vec<Duration>| {
        v.sort();
        let at = |q: usize| v[(v.len() * q / 100).min(v.len() - 1)];
        (at(50), at(99), v[v.len() - 1])
    };
    let (p50, p99, max) = show(from_reply);
    let (w50, w99, wmax) = show(from_write);
    let text = format!(
        "| measured from | p50 | p99 | max |\n|---|---:|---:|---:|\n\
         | the LPUSH's reply | {p50:?} | {p99:?} | {max:?} |\n\
         | just before the LPUSH is written | {w50:?} | {w99:?} | {wmax:?} |\n\n\
         Target: p99 ≤ {TARGET_P99:?} ({}).\n",
        if p99 <= TARGET_P99 { "met" } else { "not met" }
    );
    println!("{samples} samples\n{text}");
    if std::env::var("ACKPROXY_WAKE_RECORD").as_deref() == Ok("1") {
        append_results(
            "Wake-up latency of a parked BRPOP",
            "cargo bench --bench wake_latency",
            &format!("{samples} samples, release build"),
            &text,
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
