//! Queue stress cases: requests a careless or hostile client may send (huge
//! COUNTs, ACKs of a million ids, thousands of duplicates, 64 KB queue
//! names, thousands of never-used queues, a key that is the worst case for
//! a glob rule). For each it reports the slowest script call Redis saw
//! (`SLOWLOG`, 1 KB payloads) and the proxy's RSS before and after.
//!
//! Run: `cargo bench --bench queue_stress` (`ACKPROXY_BIN` overrides the
//! proxy binary). The table is printed and appended to `bench/RESULTS.md`
//! under "Queue stress".

mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::{append_results, slowest_script, start_proxy, start_redis, Conn};

const CONFIG: &str = r#"
[[queue]]
pattern = "tasks:*"
lease_ms = 600000
max_deliveries = 5
ack_id = "payload"

[[queue]]
pattern = "*:jobs:*:pending"
lease_ms = 600000
ack_id = "payload"
"#;

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn payload(i: usize) -> Vec<u8> {
    let mut p = format!("{i:010}:").into_bytes();
    p.resize(1024, b'x');
    p
}

fn push(direct: &mut Conn, key: &[u8], from: usize, to: usize) {
    for start in (from..to).step_by(1000) {
        let ps: Vec<Vec<u8>> = (start..to.min(start + 1000)).map(payload).collect();
        let mut args: Vec<&[u8]> = vec![b"RPUSH", key];
        args.extend(ps.iter().map(Vec::as_slice));
        direct.cmd(&args);
    }
}

fn main() {
    let bin = std::env::var("ACKPROXY_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_ackproxy").to_string());
    let dir = std::env::temp_dir().join(format!("ackproxy-stress-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (_redis, redis_port) = start_redis(&dir);
    let (proxy, proxy_port) = start_proxy(&bin, redis_port, CONFIG, &dir);
    let pid = proxy.0.id();
    let mut direct = Conn::connect(redis_port);
    let mut c = Conn::connect(proxy_port);
    direct.cmd(&[b"CONFIG", b"SET", b"slowlog-log-slower-than", b"1000"]);
    direct.cmd(&[b"CONFIG", b"SET", b"slowlog-max-len", b"100000"]);
    direct.cmd(&[b"SLOWLOG", b"RESET"]);

    let mut rows: Vec<String> = Vec::new();
    let mut case = |name: &str, c: &mut Conn, direct: &mut Conn, f: &mut dyn FnMut(&mut Conn)| {
        let before = rss_kb(pid);
        let t = Instant::now();
        f(c);
        let took = t.elapsed();
        let (max, slow) = slowest_script(direct);
        let after = rss_kb(pid);
        let row = format!(
            "| {name} | {:.2} s | {} | {:.2} ms | {:.1} MB | {:.1} MB |",
            took.as_secs_f64(),
            slow,
            max as f64 / 1000.0,
            before as f64 / 1024.0,
            after as f64 / 1024.0
        );
        eprintln!("{row}");
        rows.push(row);
    };

    push(&mut direct, b"tasks:dup", 0, 0);
    let dups: Vec<&[u8]> = std::iter::repeat_n(&b"dup"[..], 1100).collect();
    let mut args: Vec<&[u8]> = vec![b"LPUSH", b"tasks:dup"];
    args.extend(dups);
    direct.cmd(&args);
    case(
        "LPOP of 1,100 identical payloads",
        &mut c,
        &mut direct,
        &mut |c| {
            let (_, n) = c.cmd(&[b"LPOP", b"tasks:dup", b"1100"]);
            assert_eq!(n, 1100);
        },
    );

    push(&mut direct, b"tasks:big", 0, 30_000);
    case(
        "RPOP q 20000 (30,000 ready)",
        &mut c,
        &mut direct,
        &mut |c| {
            let (_, n) = c.cmd(&[b"RPOP", b"tasks:big", b"20000"]);
            assert_eq!(n, 20_000);
        },
    );

    push(&mut direct, b"tasks:huge", 0, 200_000);
    case(
        "LPOP q 1000000 (200,000 ready)",
        &mut c,
        &mut direct,
        &mut |c| {
            let (_, n) = c.cmd(&[b"LPOP", b"tasks:huge", b"1000000"]);
            assert_eq!(n, 200_000);
        },
    );

    case("ACK of 200,000 leased ids", &mut c, &mut direct, &mut |c| {
        let ids: Vec<Vec<u8>> = (0..200_000).map(payload).collect();
        let mut args: Vec<&[u8]> = vec![b"ACK", b"tasks:huge"];
        args.extend(ids.iter().map(Vec::as_slice));
        let (r, _) = c.cmd(&args);
        assert_eq!(r, ":200000");
    });

    case(
        "ACK of 1,000,000 unknown ids",
        &mut c,
        &mut direct,
        &mut |c| {
            let ids: Vec<Vec<u8>> = (0..1_000_000)
                .map(|i| format!("nope{i}").into_bytes())
                .collect();
            let mut args: Vec<&[u8]> = vec![b"ACK", b"tasks:big"];
            args.extend(ids.iter().map(Vec::as_slice));
            let (r, _) = c.cmd(&args);
            assert_eq!(r, ":0");
        },
    );

    case(
        "500 ACKs on 64 KB queue names",
        &mut c,
        &mut direct,
        &mut |c| {
            let big = vec![b'n'; 64 * 1024];
            for i in 0..500 {
                let q = [format!("tasks:{i}:").as_bytes(), &big].concat();
                c.cmd(&[b"ACK", &q, b"x"]);
            }
        },
    );

    case(
        "5,000 RPOPs on queues that do not exist",
        &mut c,
        &mut direct,
        &mut |c| {
            for i in 0..5000 {
                c.cmd(&[b"RPOP", format!("tasks:k{i}").as_bytes()]);
            }
        },
    );

    case(
        "RPOP on a 60 KB key against `*:jobs:*:pending`",
        &mut c,
        &mut direct,
        &mut |c| {
            let key = ":jobs:".repeat(10_000);
            c.cmd(&[b"RPOP", key.as_bytes()]);
        },
    );

    // With nothing to do, how many script calls does the proxy make?
    std::thread::sleep(Duration::from_secs(1));
    let calls = |direct: &mut Conn| -> i64 {
        direct.send(&[b"INFO", b"commandstats"]);
        let l = direct.line();
        let n: usize = l[1..].parse().unwrap();
        let mut b = vec![0u8; n + 2];
        direct.0.read_exact(&mut b).unwrap();
        String::from_utf8_lossy(&b)
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_fcall:calls="))
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let before = calls(&mut direct);
    std::thread::sleep(Duration::from_secs(5));
    let idle_rate = (calls(&mut direct) - before) as f64 / 5.0;

    let mut out = String::new();
    out.push_str("| case | client's time | script calls ≥ 1 ms | slowest script call | proxy RSS before | after |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|\n");
    for r in &rows {
        out.push_str(r);
        out.push('\n');
    }
    out.push_str(&format!(
        "\nIdle afterwards (5,000 queue keys used, nothing leased): {idle_rate:.1} FCALL/s.\n"
    ));
    println!("{out}");
    append_results(
        "Queue stress",
        "cargo bench --bench queue_stress",
        "1 KB payloads; SLOWLOG threshold 1 ms",
        &out,
    );
    let _ = std::fs::remove_dir_all(&dir);
}
