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

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use ackproxy::upstream::encode_command;
use common::{start_proxy, start_redis};

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

/// A blocking client that skips over replies, keeping only what is asked.
struct Conn(BufReader<TcpStream>);

impl Conn {
    fn connect(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_nodelay(true).unwrap();
        Conn(BufReader::with_capacity(1 << 20, s))
    }

    fn send(&mut self, args: &[&[u8]]) {
        self.0.get_mut().write_all(&encode_command(args)).unwrap();
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.0.read_line(&mut l).unwrap();
        l.trim_end().to_string()
    }

    /// Reads one reply; returns its first line, and the integers it holds
    /// (for SLOWLOG: each entry's duration), and its element count.
    fn read(&mut self, ints: &mut Vec<i64>) -> (String, usize) {
        let l = self.line();
        let mut count = 0;
        match l.as_bytes().first() {
            Some(b'$') => {
                let n: i64 = l[1..].parse().unwrap();
                if n >= 0 {
                    let mut b = vec![0u8; n as usize + 2];
                    self.0.read_exact(&mut b).unwrap();
                }
            }
            Some(b'*') => {
                let n: i64 = l[1..].parse().unwrap();
                for _ in 0..n.max(0) {
                    self.read(ints);
                    count += 1;
                }
            }
            Some(b':') => ints.push(l[1..].parse().unwrap()),
            _ => {}
        }
        (l, count)
    }

    fn cmd(&mut self, args: &[&[u8]]) -> (String, usize) {
        self.send(args);
        self.read(&mut Vec::new())
    }
}

/// The slowest EVAL/EVALSHA in the slow log, µs, and how many were logged.
fn slowest_script(direct: &mut Conn) -> (i64, usize) {
    direct.send(&[b"SLOWLOG", b"GET", b"1000000"]);
    let l = direct.line();
    let n: usize = l[1..].parse().unwrap();
    let (mut max, mut count) = (0, 0);
    for _ in 0..n {
        // id, time, duration, args, client addr, client name
        let _entry = direct.line();
        let mut ints = Vec::new();
        direct.read(&mut ints);
        direct.read(&mut ints);
        let mut dur = Vec::new();
        direct.read(&mut dur);
        let args_head = direct.line();
        let nargs: usize = args_head[1..].parse().unwrap();
        let name_len = direct.line();
        let mut name = vec![0u8; name_len[1..].parse::<usize>().unwrap() + 2];
        direct.0.read_exact(&mut name).unwrap();
        for _ in 1..nargs {
            direct.read(&mut Vec::new());
        }
        direct.read(&mut Vec::new());
        direct.read(&mut Vec::new());
        if name.to_ascii_uppercase().starts_with(b"EVAL") {
            count += 1;
            max = max.max(dur[0]);
        }
    }
    direct.cmd(&[b"SLOWLOG", b"RESET"]);
    (max, count)
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
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
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
        "\nIdle afterwards (5,000 queue keys used, nothing leased): {idle_rate:.1} EVALSHA/s.\n"
    ));
    println!("{out}");
    let results = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/RESULTS.md");
    if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(results) {
        let when = Command::new("date")
            .args(["-u", "+%Y-%m-%d %H:%M UTC"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let _ = write!(
            f,
            "\n### Queue stress, {when}\n\nCommand: `cargo bench --bench queue_stress` \
             (1 KB payloads; SLOWLOG threshold 1 ms; load average before: {}).\n\n{out}",
            load.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
