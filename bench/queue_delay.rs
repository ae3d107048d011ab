//! Delayed delivery at scale: 1,000,000 messages pushed through the proxy
//! with `QUEUE PUSH … AT t`, all due at the same moment, then moved into
//! the list by the reaper alone (nobody pops). Reports how long loading
//! took, the promotion rate from the due time until the delayed set is
//! empty, and the slowest script call Redis saw in each phase (`SLOWLOG`,
//! every call of 100 µs or more logged). The target: no script call over
//! 5 ms.
//!
//! The slow log measures wall time: on a machine whose cores are shared
//! with other busy processes, a call that waited for a core looks slow.
//! With `ACKPROXY_DELAY_RT=1` redis-server runs at real-time priority
//! (`chrt -f 1`), so that what is measured is the scripts; both runs are
//! worth recording.
//!
//! Run: `cargo bench --bench queue_delay`. `ACKPROXY_DELAY_N` sets the
//! number of messages, `ACKPROXY_DELAY_BATCH` the reaper's batch (default
//! 100, the proxy's default), `ACKPROXY_BIN` the proxy binary. The table is
//! printed and appended to `bench/RESULTS.md` under "Delayed delivery".

mod common;

use std::time::{Duration, Instant};

use common::{append_results, script_durations, start_proxy, start_redis, Conn};

/// Script calls slower than this fail the benchmark's target.
const TARGET_MS: f64 = 5.0;
/// Messages per QUEUE PUSH: one script call each (PUSH_PER_CALL).
const PER_PUSH: usize = 100;
/// Pushes in flight on the loading connection.
const PIPELINE: usize = 64;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// An integer reply (`:n`), or the integer field of a QUEUE INFO reply.
fn int_of(line: &str) -> i64 {
    line.trim_start_matches(':').parse().unwrap_or(-1)
}

fn redis_ms(direct: &mut Conn) -> i64 {
    direct.send(&[b"TIME"]);
    let _ = direct.line();
    let _ = direct.line();
    let secs: i64 = direct.line().parse().unwrap();
    let _ = direct.line();
    let micros: i64 = direct.line().parse().unwrap();
    secs * 1000 + micros / 1000
}

/// `ZCARD` of the delayed set and `LLEN` of the list, straight from Redis.
fn counts(direct: &mut Conn, queue: &str) -> (i64, i64) {
    let delayed = format!("ackq:{{{queue}}}:{queue}:delayed");
    let delayed = int_of(&direct.cmd(&[b"ZCARD", delayed.as_bytes()]).0);
    let ready = int_of(&direct.cmd(&[b"LLEN", queue.as_bytes()]).0);
    (delayed, ready)
}

/// The slow log's script calls of a phase: (how many, p50, p99, p99.9,
/// max, how many over the target), durations in ms.
struct Slow {
    n: usize,
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
    over: usize,
}

fn slow(direct: &mut Conn) -> Slow {
    let mut d = script_durations(direct);
    d.sort_unstable();
    let at = |q: f64| -> f64 {
        if d.is_empty() {
            return 0.0;
        }
        d[((d.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0
    };
    Slow {
        n: d.len(),
        p50: at(0.5),
        p99: at(0.99),
        p999: at(0.999),
        max: at(1.0),
        over: d
            .iter()
            .filter(|&&us| us as f64 > TARGET_MS * 1000.0)
            .count(),
    }
}

/// A section of `INFO`, as text.
fn info(direct: &mut Conn, section: &str) -> String {
    use std::io::Read;
    direct.send(&[b"INFO", section.as_bytes()]);
    let head = direct.line();
    let len: usize = head[1..].parse().unwrap();
    let mut body = vec![0u8; len + 2];
    direct.0.read_exact(&mut body).unwrap();
    String::from_utf8_lossy(&body).into_owned()
}

/// Redis's CPU time so far (user + system, s) and its FCALL calls: what a
/// phase cost Redis, whatever else shares the machine (the slow log
/// measures wall time, which a busy machine stretches).
fn cpu_and_calls(direct: &mut Conn) -> (f64, i64) {
    let cpu = info(direct, "cpu");
    let field = |name: &str| -> f64 {
        cpu.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.parse().ok())
            .unwrap_or(0.0)
    };
    let stats = info(direct, "commandstats");
    let calls = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_fcall:calls="))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (field("used_cpu_user") + field("used_cpu_sys"), calls)
}

/// Mean Redis CPU per script call between two [`cpu_and_calls`], µs.
fn per_call_us(before: (f64, i64), after: (f64, i64)) -> f64 {
    (after.0 - before.0) * 1e6 / (after.1 - before.1).max(1) as f64
}

fn main() {
    let n = env_or("ACKPROXY_DELAY_N", 1_000_000);
    let batch = env_or("ACKPROXY_DELAY_BATCH", 100);
    let bin = std::env::var("ACKPROXY_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_ackproxy").to_string());
    let config = format!(
        "[[queue]]\npattern = \"delay:*\"\nlease_ms = 600000\nack_id = \"payload\"\n\n\
         [reaper]\ninterval_ms = 100\nbatch = {batch}\n"
    );
    let dir = std::env::temp_dir().join(format!("ackproxy-delay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (redis, redis_port) = start_redis(&dir);
    let realtime = std::env::var("ACKPROXY_DELAY_RT").as_deref() == Ok("1");
    if realtime {
        let ok = std::process::Command::new("chrt")
            .args(["-f", "-p", "1", &redis.0.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "chrt -f -p 1 failed: run without ACKPROXY_DELAY_RT");
    }
    let (_proxy, proxy_port) = start_proxy(&bin, redis_port, &config, &dir);
    let mut direct = Conn::connect(redis_port);
    let mut c = Conn::connect(proxy_port);
    direct.cmd(&[b"CONFIG", b"SET", b"slowlog-log-slower-than", b"100"]);
    direct.cmd(&[b"CONFIG", b"SET", b"slowlog-max-len", b"1000000"]);
    direct.cmd(&[b"SLOWLOG", b"RESET"]);

    let queue = "delay:q";
    // Loading takes a few seconds on this machine; the margin keeps the due
    // time after the last push, so the promotion is measured on its own.
    let margin_ms = env_or("ACKPROXY_DELAY_MARGIN_MS", 60_000) as i64;
    let due = redis_ms(&mut direct) + margin_ms;
    let due_arg = due.to_string();
    let cpu_before_load = cpu_and_calls(&mut direct);
    let t = Instant::now();
    let mut in_flight = 0;
    for start in (0..n).step_by(PER_PUSH) {
        let payloads: Vec<Vec<u8>> = (start..n.min(start + PER_PUSH))
            .map(|i| format!("job:{i:08}:{}", "x".repeat(20)).into_bytes())
            .collect();
        let mut args: Vec<&[u8]> = vec![b"QUEUE", b"PUSH", queue.as_bytes()];
        args.extend(payloads.iter().map(Vec::as_slice));
        args.extend([&b"AT"[..], due_arg.as_bytes()]);
        c.send(&args);
        in_flight += 1;
        if in_flight == PIPELINE {
            for _ in 0..in_flight {
                let (r, _) = c.read(&mut Vec::new());
                assert!(r.starts_with(':'), "QUEUE PUSH: {r}");
            }
            in_flight = 0;
        }
    }
    for _ in 0..in_flight {
        let (r, _) = c.read(&mut Vec::new());
        assert!(r.starts_with(':'), "QUEUE PUSH: {r}");
    }
    let load = t.elapsed();
    let loaded_at = redis_ms(&mut direct);
    let load_cpu = per_call_us(cpu_before_load, cpu_and_calls(&mut direct));
    let (delayed, ready) = counts(&mut direct, queue);
    assert_eq!((delayed, ready), (n as i64, 0), "after loading");
    assert!(
        loaded_at < due,
        "loading took past the due time: raise ACKPROXY_DELAY_MARGIN_MS"
    );
    let load_slow = slow(&mut direct);
    eprintln!(
        "loaded {n} delayed messages in {:.2} s; slowest push call {:.2} ms",
        load.as_secs_f64(),
        load_slow.max
    );

    // Until the due time nothing moves.
    let wait = Duration::from_millis((due - redis_ms(&mut direct)).max(0) as u64);
    std::thread::sleep(wait);
    let (before, _) = counts(&mut direct, queue);
    let cpu_before = cpu_and_calls(&mut direct);
    let t = Instant::now();
    let deadline = t + Duration::from_secs(600);
    let mut first_seen: Option<Duration> = None;
    loop {
        let (delayed, ready) = counts(&mut direct, queue);
        if ready > 0 && first_seen.is_none() {
            first_seen = Some(t.elapsed());
        }
        if delayed == 0 {
            assert_eq!(ready, n as i64, "every message in the list");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "promotion stalled: {delayed} left"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = t.elapsed();
    let cpu_after = cpu_and_calls(&mut direct);
    let promote_cpu = per_call_us(cpu_before, cpu_after);
    let promote_calls = cpu_after.1 - cpu_before.1;
    let promote_slow = slow(&mut direct);
    let rate = n as f64 / took.as_secs_f64();
    let verdict = if load_slow.over + promote_slow.over == 0 {
        "met"
    } else {
        "MISSED"
    };
    eprintln!(
        "promoted {n} in {:.2} s ({rate:.0}/s); slowest call {:.2} ms; target {verdict}",
        took.as_secs_f64(),
        promote_slow.max
    );

    let mut out = String::new();
    out.push_str(
        "| phase | messages | time | rate | Redis CPU per script call | script calls ≥ 0.1 ms: n, p50 / p99 / p99.9 / max | calls over 5 ms |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
    let slow_cells = |s: &Slow| {
        format!(
            "{}: {:.2} / {:.2} / {:.2} / **{:.2} ms** | {}",
            s.n, s.p50, s.p99, s.p999, s.max, s.over
        )
    };
    out.push_str(&format!(
        "| load: `QUEUE PUSH {queue} <100 payloads> AT t`, 64 in flight | {n} | {:.2} s | {:.0}/s | {load_cpu:.0} µs | {} |\n",
        load.as_secs_f64(),
        n as f64 / load.as_secs_f64(),
        slow_cells(&load_slow)
    ));
    out.push_str(&format!(
        "| promotion by the reaper (batch {batch}, {promote_calls} calls), from the due time | {n} | {:.2} s | **{rate:.0}/s** | {promote_cpu:.0} µs | {} |\n",
        took.as_secs_f64(),
        slow_cells(&promote_slow)
    ));
    out.push_str(&format!(
        "\n{before} messages still delayed at the due time; the first reached the list {:.0} ms after it. \
         redis-server {}. Target (no script call over {TARGET_MS} ms): **{verdict}**.\n",
        first_seen.unwrap_or_default().as_secs_f64() * 1000.0,
        if realtime {
            "at real-time priority (`chrt -f 1`): the slow log measures the scripts"
        } else {
            "at normal priority: the slow log includes time spent waiting for a core"
        }
    ));
    println!("{out}");
    append_results(
        "Delayed delivery",
        if realtime {
            "ACKPROXY_DELAY_RT=1 cargo bench --bench queue_delay"
        } else {
            "cargo bench --bench queue_delay"
        },
        &format!(
            "{n} messages of 38 bytes, one due time, nobody popping; SLOWLOG threshold 100 µs"
        ),
        &out,
    );
    let _ = std::fs::remove_dir_all(&dir);
}
