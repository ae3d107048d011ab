//! Queue benchmark: pop+ack pairs per second at 50 connections, in one run:
//!
//! (a) `RPOP q` + `ACK q id` through ackproxy;
//! (b) the same queue functions called straight against Redis with FCALL,
//!     with the KEYS/ARGV the proxy sends: its own `FCALL`s for one `RPOP`
//!     and one `ACK`, taken from Redis's `MONITOR`, sent again (the ACK's
//!     id changed to the message's);
//! (c) Redis Streams: `XREADGROUP … COUNT 1` + `XACK`.
//!
//! Run: `cargo bench --bench queue` (builds the `ackproxy` binary with the
//! bench profile, which inherits `release`; `ACKPROXY_BIN` overrides the
//! binary). `QUEUE_BENCH_SECS` (default 5) sets the measured time per mode,
//! `QUEUE_BENCH_CONNS` (default 50) the connections, `QUEUE_BENCH_THREADS`
//! (default 1) the load generator's threads. The table is printed
//! and appended to `bench/RESULTS.md` under "Queue".
//!
//! `QUEUE_BENCH_METRICS=1` measures instead what metrics cost: two proxies
//! on one Redis, one without and one with `--metrics`, interleaved over
//! `QUEUE_BENCH_ROUNDS` (default 3) rounds of (1) redis-benchmark GET and
//! SET, 50 clients, no pipelining, and (2) RPOP + ACK pairs as in (a), with
//! the proxy's CPU time per request (steadier than rates on a shared
//! machine). The table is printed, not recorded.

mod common;

use std::io::Write as _;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ackproxy::upstream::encode_command;
use common::{free_port, start_proxy, start_proxy_with, start_redis};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CONFIG: &str = r#"
[[queue]]
pattern = "bench*"
lease_ms = 600000
max_deliveries = 5
ack_id = "payload"
redeliver = "next"
pop_end = "right"
"#;

// ------------------------------------------------------------- processes

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // Fields after the comm: state is index 0; utime is field 14 overall → 11 here.
    let ut: f64 = f.get(11)?.parse().ok()?;
    let st: f64 = f.get(12)?.parse().ok()?;
    Some((ut + st) / 100.0) // USER_HZ is 100 on Linux
}

// ------------------------------------------------------------- RESP client

#[derive(Debug, Clone)]
#[allow(dead_code)] // read through Debug in panics
enum R {
    Simple,
    Err(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Arr(Vec<R>),
}

fn parse(b: &[u8]) -> Option<(R, usize)> {
    let end = b.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&b[1..end]).ok()?;
    let after = end + 2;
    Some(match b[0] {
        b'+' => (R::Simple, after),
        b'-' => (R::Err(line.to_string()), after),
        b':' => (R::Int(line.parse().ok()?), after),
        b'_' => (R::Nil, after),
        b'$' => {
            let n: i64 = line.parse().ok()?;
            if n < 0 {
                (R::Nil, after)
            } else {
                let n = n as usize;
                if b.len() < after + n + 2 {
                    return None;
                }
                (R::Bulk(b[after..after + n].to_vec()), after + n + 2)
            }
        }
        b'*' | b'%' | b'~' => {
            let n: i64 = line.parse().ok()?;
            if n < 0 {
                return Some((R::Nil, after));
            }
            let n = if b[0] == b'%' { n * 2 } else { n };
            let mut at = after;
            let mut items = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let (v, used) = parse(&b[at..])?;
                items.push(v);
                at += used;
            }
            (R::Arr(items), at)
        }
        other => panic!("unexpected reply byte {:?}", other as char),
    })
}

struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
    start: usize,
}

impl Conn {
    async fn connect(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        s.set_nodelay(true).unwrap();
        Conn {
            s,
            buf: Vec::with_capacity(16 * 1024),
            start: 0,
        }
    }

    async fn call(&mut self, req: &[u8]) -> R {
        self.s.write_all(req).await.unwrap();
        self.read().await
    }

    async fn read(&mut self) -> R {
        loop {
            if let Some((v, used)) =
                parse(&self.buf[self.start..]).filter(|_| self.start < self.buf.len())
            {
                self.start += used;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                }
                return v;
            }
            if self.buf.capacity() - self.buf.len() < 4096 {
                self.buf.reserve(16 * 1024);
            }
            let n = self.s.read_buf(&mut self.buf).await.unwrap();
            assert!(n > 0, "connection closed");
        }
    }
}

fn cmd(args: &[&[u8]]) -> Vec<u8> {
    encode_command(args)
}

// ------------------------------------------------------------- the modes

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Proxy,
    Scripts,
    Streams,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Proxy => "RPOP + ACK through ackproxy",
            Mode::Scripts => "queue functions via FCALL, direct",
            Mode::Streams => "XREADGROUP COUNT 1 + XACK, direct",
        }
    }
}

/// The proxy's function calls for `RPOP queue` and `ACK queue id`, as it
/// sends them to Redis: the arguments of each `FCALL`.
struct Calls {
    pop: Vec<Vec<u8>>,
    ack: Vec<Vec<u8>>,
}

impl Calls {
    /// One `RPOP` and its `ACK` through the proxy, with Redis's `MONITOR`
    /// watching: the last `FCALL` of each function is the proxy's call
    /// (the first may have found the library not loaded yet).
    fn capture(redis_port: u16, proxy_port: u16, queue: &str) -> Calls {
        let mut mon = std::net::TcpStream::connect(("127.0.0.1", redis_port)).unwrap();
        mon.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        mon.write_all(&cmd(&[b"MONITOR"])).unwrap();
        let mut lines = std::io::BufReader::new(mon);
        assert_eq!(read_line_reply(&mut lines).trim_end(), "+OK");
        let id = sync_cmd(proxy_port, &[b"RPOP", queue.as_bytes()]);
        let acked = sync_cmd(proxy_port, &[b"ACK", queue.as_bytes(), id.as_bytes()]);
        assert_eq!(acked.trim_end(), ":1", "the captured ACK");
        let (mut pop, mut ack) = (None, None);
        while ack.is_none() {
            let mut line = Vec::new();
            std::io::BufRead::read_until(&mut lines, b'\n', &mut line).unwrap();
            let args = monitor_args(&line);
            if args
                .first()
                .is_some_and(|a| a.eq_ignore_ascii_case(b"FCALL"))
            {
                match args.get(1) {
                    Some(f) if f.starts_with(b"ackq_pop") => pop = Some(args),
                    Some(f) if f.starts_with(b"ackq_ack") => ack = Some(args),
                    _ => {}
                }
            }
        }
        Calls {
            pop: pop.expect("the proxy's pop call"),
            ack: ack.unwrap(),
        }
    }

    fn pop_request(&self) -> Vec<u8> {
        encode_command(&self.pop.iter().map(Vec::as_slice).collect::<Vec<_>>())
    }

    /// The ACK call with `id` as its one id (the last argument).
    fn ack_request(&self, id: &[u8]) -> Vec<u8> {
        let mut args: Vec<&[u8]> = self.ack.iter().map(Vec::as_slice).collect();
        *args.last_mut().unwrap() = id;
        encode_command(&args)
    }
}

/// The arguments of a `MONITOR` line (`+<time> [<db> <client>] "a" "b" …`),
/// unescaped as Redis quotes them.
fn monitor_args(line: &[u8]) -> Vec<Vec<u8>> {
    let Some(start) = line.windows(2).position(|w| w == b"] ") else {
        return Vec::new();
    };
    let mut args = Vec::new();
    let mut at = start + 2;
    while at < line.len() && line[at] == b'"' {
        let mut arg = Vec::new();
        at += 1;
        while line[at] != b'"' {
            if line[at] == b'\\' {
                let (c, used) = match line[at + 1] {
                    b'n' => (b'\n', 2),
                    b'r' => (b'\r', 2),
                    b't' => (b'\t', 2),
                    b'a' => (7, 2),
                    b'b' => (8, 2),
                    b'x' => {
                        let hex = std::str::from_utf8(&line[at + 2..at + 4]).unwrap();
                        (u8::from_str_radix(hex, 16).unwrap(), 4)
                    }
                    c => (c, 2),
                };
                arg.push(c);
                at += used;
            } else {
                arg.push(line[at]);
                at += 1;
            }
        }
        args.push(arg);
        at += 2;
    }
    args
}

/// The result of a queue function's reply: `[m, events…, result…]`, or
/// the short form, one value (see `lua/common.lua`, `reply`).
fn script_result(reply: R) -> Vec<R> {
    match reply {
        R::Arr(mut items) => {
            let m = match items.first() {
                Some(R::Int(m)) => *m,
                _ => panic!("function reply {items:?}"),
            };
            let events = if m >= 0 { m } else { -m - 1 } as usize;
            items.drain(..1 + events);
            items
        }
        one => vec![one],
    }
}

async fn worker(
    mode: Mode,
    port: u16,
    i: usize,
    // The direct mode's calls.
    calls: Option<Arc<Calls>>,
    queue: String,
    count: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) {
    let mut c = Conn::connect(port).await;
    let calls = || calls.as_deref().expect("the direct mode has its calls");
    let consumer = format!("c{i}");
    let pop_req = match mode {
        Mode::Proxy => cmd(&[b"RPOP", queue.as_bytes()]),
        Mode::Scripts => calls().pop_request(),
        Mode::Streams => cmd(&[
            b"XREADGROUP",
            b"GROUP",
            b"g",
            consumer.as_bytes(),
            b"COUNT",
            b"1",
            b"STREAMS",
            queue.as_bytes(),
            b">",
        ]),
    };
    while !stop.load(Ordering::Relaxed) {
        let r = c.call(&pop_req).await;
        let (ack_req, want_ack) = match (mode, r) {
            (Mode::Proxy, R::Bulk(p)) => (cmd(&[b"ACK", queue.as_bytes(), &p]), 1),
            // `pop1`'s short reply is the payload; its flat one [status,
            // source, value…]. The payload is the id (`ack_id = "payload"`).
            (Mode::Scripts, r @ (R::Bulk(_) | R::Arr(_))) => match script_result(r).as_slice() {
                [R::Bulk(p)] | [_, _, R::Bulk(p), ..] => (calls().ack_request(p), 1),
                _ => panic!("{}: queue ran dry; pre-fill more", mode.label()),
            },
            (Mode::Streams, R::Arr(streams)) => {
                let R::Arr(s) = &streams[0] else {
                    panic!("{streams:?}")
                };
                let R::Arr(entries) = &s[1] else {
                    panic!("{s:?}")
                };
                let R::Arr(e) = &entries[0] else {
                    panic!("{entries:?}")
                };
                let R::Bulk(id) = &e[0] else { panic!("{e:?}") };
                (cmd(&[b"XACK", queue.as_bytes(), b"g", id]), 1)
            }
            (_, R::Nil) => panic!("{}: queue ran dry; pre-fill more", mode.label()),
            (_, R::Arr(a)) if a.is_empty() => {
                panic!("{}: queue ran dry; pre-fill more", mode.label())
            }
            (_, other) => panic!("{}: pop reply {other:?}", mode.label()),
        };
        match (mode, c.call(&ack_req).await) {
            (Mode::Scripts, r @ (R::Int(_) | R::Arr(_))) => {
                // `ack`'s short reply is the lease's start; its flat one
                // [released, late, starts…].
                match script_result(r).as_slice() {
                    [R::Int(_)] | [R::Int(1), ..] => {}
                    other => panic!("{}: ack reply {other:?}", mode.label()),
                }
            }
            (_, R::Int(n)) if n == want_ack => {}
            (_, other) => panic!("{}: ack reply {other:?}", mode.label()),
        }
        count.fetch_add(1, Ordering::Relaxed);
    }
}

struct Outcome {
    pairs_per_sec: f64,
    redis_cpu: Option<f64>,
    proxy_cpu: Option<f64>,
}

/// The processes whose CPU time a run measures.
struct Pids {
    redis: u32,
    proxy: Option<u32>,
}

fn run_mode(
    rt: &tokio::runtime::Runtime,
    mode: Mode,
    port: u16,
    (conns, secs): (usize, f64),
    calls: Option<&Arc<Calls>>,
    queue: &str,
    pids: Pids,
) -> Outcome {
    let (redis_pid, proxy_pid) = (pids.redis, pids.proxy);
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..conns)
        .map(|i| {
            rt.spawn(worker(
                mode,
                port,
                i,
                calls.cloned(),
                queue.to_string(),
                count.clone(),
                stop.clone(),
            ))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1)); // warm-up
    let c0 = count.load(Ordering::Relaxed);
    let r0 = cpu_seconds(redis_pid);
    let p0 = proxy_pid.and_then(cpu_seconds);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    let c1 = count.load(Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    let r1 = cpu_seconds(redis_pid);
    let p1 = proxy_pid.and_then(cpu_seconds);
    stop.store(true, Ordering::Relaxed);
    rt.block_on(async {
        for h in handles {
            h.await.expect("worker panicked");
        }
    });
    Outcome {
        pairs_per_sec: (c1 - c0) as f64 / elapsed,
        redis_cpu: r0.zip(r1).map(|(a, b)| (b - a) / elapsed),
        proxy_cpu: p0.zip(p1).map(|(a, b)| (b - a) / elapsed),
    }
}

fn prefill(redis_port: u16, list: &str, stream: bool, n: usize) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", redis_port)).unwrap();
    let mut reader = std::io::BufReader::new(s.try_clone().unwrap());
    let batch = 1000;
    let mut sent = 0;
    let mut out = Vec::new();
    let mut pending = 0usize;
    for start in (0..n).step_by(batch) {
        let ids: Vec<String> = (start..(start + batch).min(n))
            .map(|i| format!("msg-{list}-{i}"))
            .collect();
        if stream {
            for id in &ids {
                out.extend(cmd(&[b"XADD", list.as_bytes(), b"*", b"m", id.as_bytes()]));
                pending += 1;
            }
        } else {
            let mut args: Vec<&[u8]> = vec![b"LPUSH", list.as_bytes()];
            args.extend(ids.iter().map(|s| s.as_bytes()));
            out.extend(cmd(&args));
            pending += 1;
        }
        sent += ids.len();
        if out.len() > 256 * 1024 || sent == n {
            s.write_all(&out).unwrap();
            out.clear();
            for _ in 0..pending {
                read_line_reply(&mut reader);
            }
            pending = 0;
        }
    }
}

fn read_line_reply(r: &mut impl std::io::BufRead) -> String {
    let mut l = String::new();
    r.read_line(&mut l).unwrap();
    if let Some(len) = l.strip_prefix('$') {
        let n: i64 = len.trim().parse().unwrap();
        if n >= 0 {
            let mut b = vec![0u8; n as usize + 2];
            std::io::Read::read_exact(r, &mut b).unwrap();
            return String::from_utf8_lossy(&b[..n as usize]).into_owned();
        }
    }
    assert!(!l.starts_with('-'), "{l}");
    l
}

fn sync_cmd(port: u16, args: &[&[u8]]) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&cmd(args)).unwrap();
    read_line_reply(&mut std::io::BufReader::new(s))
}

fn main() {
    // `cargo bench` passes --bench; nothing else to parse.
    let secs: f64 = std::env::var("QUEUE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let conns: usize = std::env::var("QUEUE_BENCH_CONNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let bin = std::env::var("ACKPROXY_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_ackproxy").to_string());

    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load_before = load_before.split(' ').take(3).collect::<Vec<_>>().join(" ");
    let dir = std::env::temp_dir().join(format!("ackproxy-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    if std::env::var_os("QUEUE_BENCH_METRICS").is_some() {
        metrics_cost(&bin, &dir, (conns, secs), &load_before);
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let (redis, redis_port) = start_redis(&dir);
    let (proxy, proxy_port) = start_proxy(&bin, redis_port, CONFIG, &dir);

    // Enough for ~150k pairs/s over the measured time plus warm-up.
    let fill = ((secs + 2.0) * 150_000.0) as usize;
    let t = Instant::now();
    prefill(redis_port, "bench_a", false, fill);
    prefill(redis_port, "bench_b", false, fill);
    prefill(redis_port, "stream_c", true, fill);
    sync_cmd(redis_port, &[b"XGROUP", b"CREATE", b"stream_c", b"g", b"0"]);
    eprintln!("pre-filled {fill} messages per mode in {:?}", t.elapsed());
    // Through the proxy, which also loads the library the direct mode calls.
    let calls = Arc::new(Calls::capture(redis_port, proxy_port, "bench_b"));

    let threads: usize = std::env::var("QUEUE_BENCH_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap();
    let redis_pid = redis.0.id();
    let proxy_pid = proxy.0.id();
    let runs = [
        (Mode::Proxy, proxy_port, "bench_a", Some(proxy_pid)),
        (Mode::Scripts, redis_port, "bench_b", None),
        (Mode::Streams, redis_port, "stream_c", None),
    ];
    let mut results = Vec::new();
    for (mode, port, queue, ppid) in runs {
        let pids = Pids {
            redis: redis_pid,
            proxy: ppid,
        };
        let o = run_mode(&rt, mode, port, (conns, secs), Some(&calls), queue, pids);
        eprintln!("{}: {:.0} pairs/s", mode.label(), o.pairs_per_sec);
        results.push((mode, o));
    }

    let direct = results[1].1.pairs_per_sec;
    let streams = results[2].1.pairs_per_sec;
    let pct = |x: Option<f64>| {
        x.map(|v| format!("{:.0}%", v * 100.0))
            .unwrap_or_else(|| "-".into())
    };
    let mut table = String::new();
    // CPU time per pair depends much less on other load than pairs/s does.
    let per_pair = |x: Option<f64>, rate: f64| {
        x.map(|v| format!("{:.1}", v * 1e6 / rate))
            .unwrap_or_else(|| "-".into())
    };
    table.push_str("| mode | pop+ack pairs/s | vs scripts direct | vs Streams | Redis CPU | Redis CPU µs/pair | proxy CPU | proxy CPU µs/pair |\n");
    table.push_str("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (mode, o) in &results {
        table.push_str(&format!(
            "| {} | {:.0} | {:.2}× | {:.2}× | {} | {} | {} | {} |\n",
            mode.label(),
            o.pairs_per_sec,
            o.pairs_per_sec / direct,
            o.pairs_per_sec / streams,
            pct(o.redis_cpu),
            per_pair(o.redis_cpu, o.pairs_per_sec),
            pct(o.proxy_cpu),
            per_pair(o.proxy_cpu, o.pairs_per_sec),
        ));
    }
    println!("\n{table}");

    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let redis_version = Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let when = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let section = format!(
        "\n### Queue run, {when}\n\n\
         Command: `cargo build --release && cargo bench --bench queue` \
         ({conns} connections, one request in flight per connection, {secs} s measured per mode after 1 s warm-up, \
         load generator on {threads} thread(s) of the same {cores}-core machine, load average before the run {load_before}; \
         {redis_version}).\n\
         Pairs: (a) `RPOP q` + `ACK q id` through ackproxy; (b) the proxy's pop and ACK functions sent with FCALL \
         straight to Redis with the same KEYS/ARGV; (c) `XREADGROUP GROUP g c COUNT 1 STREAMS s >` + `XACK`. \
         CPU is utime+stime over the measured interval (100% = one core).\n\n{table}"
    );
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/RESULTS.md");
    let mut text =
        std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmark results\n".to_string());
    let heading = "\n## Queue\n";
    if !text.contains(heading) {
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(heading);
        text.push_str(
            "\nPop+ack pairs per second (`bench/queue_bench.rs`). Target: (a) ≥ 0.9× (b).\n",
        );
    }
    // The new run goes at the end of the Queue section, before any later section.
    let start = text.find(heading).unwrap() + heading.len();
    let end = text[start..]
        .find("\n## ")
        .map(|i| start + i + 1)
        .unwrap_or(text.len());
    let mut run = section;
    if end < text.len() {
        run.push('\n');
    }
    text.insert_str(end, &run);
    std::fs::write(&path, text).unwrap();
    eprintln!("appended to {}", path.display());

    drop(proxy);
    drop(redis);
    let _ = std::fs::remove_dir_all(&dir);
}

/// redis-benchmark's requests per second for `test` against `port`.
fn redis_benchmark(port: u16, test: &str, n: usize) -> f64 {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-c", "50"])
        .args(["-n", &n.to_string(), "-r", "100000", "-t", test, "--csv"])
        .output()
        .expect("redis-benchmark (bash tests/setup-bench-deps.sh installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or_default().replace('"', "");
    last.split(',')
        .nth(1)
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("redis-benchmark gave no result: {text}"))
}

/// Metrics off against metrics on, interleaved in one run.
fn metrics_cost(bin: &str, dir: &std::path::Path, (conns, secs): (usize, f64), load: &str) {
    let rounds: usize = std::env::var("QUEUE_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let n = 200_000;
    let (redis, redis_port) = start_redis(dir);
    let (off, off_port) = start_proxy(bin, redis_port, CONFIG, dir);
    let metrics = format!("127.0.0.1:{}", free_port());
    let (on, on_port) = start_proxy_with(bin, redis_port, CONFIG, dir, &["--metrics", &metrics]);
    let fill = ((secs + 2.0) * 60_000.0) as usize * rounds;
    prefill(redis_port, "bench_off", false, fill);
    prefill(redis_port, "bench_on", false, fill);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // Per target: every round's figure, for the median. Rates depend on
    // whatever else the machine runs; the proxy's CPU time per request
    // much less, so both are kept.
    let mut get = [Vec::new(), Vec::new()];
    let mut set = [Vec::new(), Vec::new()];
    let mut pairs = [Vec::new(), Vec::new()];
    let mut get_us = [Vec::new(), Vec::new()];
    let mut set_us = [Vec::new(), Vec::new()];
    let mut pair_us = [Vec::new(), Vec::new()];
    // The proxy's CPU µs per request over one redis-benchmark run.
    let timed = |pid: u32, port: u16, test: &str| {
        let before = cpu_seconds(pid).unwrap_or(0.0);
        let rps = redis_benchmark(port, test, n);
        let us = (cpu_seconds(pid).unwrap_or(0.0) - before) * 1e6 / n as f64;
        (rps, us)
    };
    let targets = [
        (off_port, "bench_off", off.0.id()),
        (on_port, "bench_on", on.0.id()),
    ];
    for round in 0..rounds {
        for (i, &(port, queue, pid)) in targets.iter().enumerate() {
            let (rps, us) = timed(pid, port, "get");
            get[i].push(rps);
            get_us[i].push(us);
            let (rps, us) = timed(pid, port, "set");
            set[i].push(rps);
            set_us[i].push(us);
            let pids = Pids {
                redis: redis.0.id(),
                proxy: Some(pid),
            };
            let o = run_mode(&rt, Mode::Proxy, port, (conns, secs), None, queue, pids);
            pairs[i].push(o.pairs_per_sec);
            pair_us[i].push(o.proxy_cpu.unwrap_or(0.0) * 1e6 / o.pairs_per_sec);
            eprintln!(
                "round {round} metrics {}: GET {:.0}, SET {:.0}, pairs {:.0}",
                if i == 0 { "off" } else { "on" },
                get[i][round],
                set[i][round],
                pairs[i][round]
            );
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    println!(
        "\n{rounds} rounds interleaved, medians; load average before {load}\n\n\
         | test | metrics off | metrics on | on / off |\n|---|---:|---:|---:|"
    );
    for (name, v) in [
        ("GET, P1, 50 clients (rps)", &mut get),
        ("SET, P1, 50 clients (rps)", &mut set),
        ("RPOP + ACK pairs/s", &mut pairs),
        ("GET: proxy CPU µs per request", &mut get_us),
        ("SET: proxy CPU µs per request", &mut set_us),
        ("RPOP + ACK: proxy CPU µs per pair", &mut pair_us),
    ] {
        let (a, b) = (median(&mut v[0]), median(&mut v[1]));
        let digits = if a < 100.0 { 2 } else { 0 };
        println!("| {name} | {a:.digits$} | {b:.digits$} | {:.3} |", b / a);
    }
    drop((on, off, redis));
}
