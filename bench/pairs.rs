//! Queue pairs: how many pop + acknowledge pairs per second a closed-loop
//! worker pool gets from each way of doing at-least-once delivery on Redis,
//! and what each pair costs Redis, the proxy and the load generator in CPU.
//!
//! Modes, on 128-byte JSON messages `{"id":"<12 digits>","body":"xxx…"}`:
//!
//! - `seed`: the Lua recipe of seed 000 (`bench/seed000_pop.lua`,
//!   `bench/seed000_ack.lua`) called with EVALSHA straight on Redis;
//! - `seed-twem`: the same calls through twemproxy (`nutcracker`, one
//!   server connection), which is how a user would scale that recipe out;
//!   twemproxy routes EVALSHA by its first key, so the queue is also given
//!   as KEYS[1] (the scripts read only ARGV);
//! - `streams`: `XREADGROUP GROUP g c<n> COUNT 1 STREAMS s >` + `XACK`;
//! - `rpop`: `RPOP jobs` + `ACK jobs <id>` through ackproxy;
//! - `brpop`: `BRPOP jobs 1` + `ACK jobs <id>` through ackproxy;
//! - `brpoplpush`: `BRPOPLPUSH jobs doing:jobs 1` + `LREM doing:jobs 1 <msg>`
//!   through ackproxy, the classic reliable-queue loop, its LREM the ACK;
//! - `nextpop`: `RPOP np` alone through ackproxy, on a rule with
//!   `ack = "next-pop"` (each pop acknowledges the connection's previous one);
//! - `direct-rpop`: plain `RPOP jobs` on Redis, nothing acknowledged: the
//!   ceiling;
//! - `twem-rpop` and `twem-rpoplpush`: `RPOP`, and `RPOPLPUSH` + `LREM`,
//!   through twemproxy, no leases: what each loop's own commands cost Redis
//!   behind a proxy that batches as ackproxy does (twemproxy has no
//!   blocking commands).
//!
//! With those in the run it also prints what the leases add to each loop
//! in Redis: `rpop`'s Redis CPU per pair less `twem-rpop`'s, and
//! `brpoplpush`'s less `twem-rpoplpush`'s.
//!
//! Each mode drains a pre-filled queue (`PAIRS_MESSAGES`, default 200,000)
//! with `PAIRS_CONNS` (default 50) connections, one request in flight on
//! each; a worker stops at its first empty pop. The load generator is a
//! separate process (this binary re-run with `--generate`) on a
//! single-threaded runtime, so that its CPU time is measured apart from the
//! driver's. CPU is utime + stime from /proc/PID/stat over the run; Redis's
//! time per call comes from `INFO commandstats`, reset before each run.
//! `PAIRS_ROUNDS` (default 3) rounds, the modes interleaved in each, so
//! that a change in the machine's load hits every mode alike; the table
//! shows per-mode medians.
//!
//! The generator alone, against any proxy already running (a cluster-mode
//! one, say), on queues filled beforehand: `pairs --generate rpop <port>
//! <conns> [q0,q1,…]`; with a list, connection n works on queue n modulo
//! its length (the mode's own key otherwise); it prints `pairs=…
//! failures=… elapsed_s=…` and leaves checking the queues to its caller.
//!
//! Run: `cargo bench --bench pairs`. `ACKPROXY_BIN` overrides the proxy
//! binary, `PAIRS_MODES=seed,rpop` picks modes, `PAIRS_RECORD=1` appends the
//! result to `bench/RESULTS.md`. For what one feature costs Redis:
//! `PAIRS_RULE='requeue_on_disconnect = true'` adds TOML lines to the
//! `jobs` rule (the `rpop`, `brpop` and `brpoplpush` modes' queue), and
//! `PAIRS_METRICS=1` exports metrics (their sampling of the queues runs). Smoke test: `PAIRS_SMOKE=1` or
//! `cargo bench --bench pairs -- --smoke` (2,000 messages, one round, all
//! modes, exit status 1 if a mode failed or moved nothing).

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use common::{start_proxy_with, start_redis, Proc};

const SEED_POP: &str = include_str!("seed000_pop.lua");
const SEED_ACK: &str = include_str!("seed000_ack.lua");
/// The seed's `considerAsFailMaxTimeSpan` (ARGV[3]; ARGV[2] is unread, see
/// the script): longer than a run, so nothing is re-queued while it drains.
const SEED_TIMESPAN_MS: &str = "60000";

const CONFIG: &str = r#"[[queue]]
pattern = "jobs"
ack_id = "json:id"

[[queue]]
pattern = "np"
ack_id = "json:id"
ack = "next-pop"
"#;

const MSG_LEN: usize = 128;
/// Commands with fewer calls in a run are left out of the per-call column
/// (the proxy's own housekeeping, the driver's checks).
const MIN_CALLS: u64 = 1000;

type Res<T> = Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

// ------------------------------------------------------------------ modes

/// The modes, and `ALL_MODES` listing them in the same order.
macro_rules! modes {
    ($($m:ident),* $(,)?) => {
        #[derive(Clone, Copy, PartialEq, Eq)]
        enum Mode {
            $($m),*
        }

        const ALL_MODES: &[Mode] = &[$(Mode::$m),*];
    };
}

modes!(
    Seed,
    SeedTwem,
    Streams,
    Rpop,
    Brpop,
    Brpoplpush,
    NextPop,
    DirectRpop,
    TwemRpop,
    TwemRpoplpush,
);

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Seed => "seed",
            Mode::SeedTwem => "seed-twem",
            Mode::Streams => "streams",
            Mode::Rpop => "rpop",
            Mode::Brpop => "brpop",
            Mode::Brpoplpush => "brpoplpush",
            Mode::NextPop => "nextpop",
            Mode::DirectRpop => "direct-rpop",
            Mode::TwemRpop => "twem-rpop",
            Mode::TwemRpoplpush => "twem-rpoplpush",
        }
    }
    fn parse(s: &str) -> Option<Mode> {
        ALL_MODES.iter().copied().find(|m| m.name() == s.trim())
    }
    fn key(self) -> &'static str {
        match self {
            Mode::Streams => "s",
            Mode::NextPop => "np",
            _ => "jobs",
        }
    }
    fn via_proxy(self) -> bool {
        matches!(
            self,
            Mode::Rpop | Mode::Brpop | Mode::Brpoplpush | Mode::NextPop
        )
    }
}

// ------------------------------------------------------------------ RESP

/// One element of a reply, flattened in order, as (type byte, start, end):
/// an array is its header (`*`, the range holding the count) followed by
/// its elements; nil replies of any form are `_`. Ranges index the
/// connection's buffer, so reading a reply allocates nothing once the
/// vectors have grown.
#[derive(Clone, Copy)]
struct Tok(u8, usize, usize);

/// Parses one complete reply at `at` into `toks`; the end offset, or None
/// if more bytes are needed.
fn parse(buf: &[u8], at: usize, toks: &mut Vec<Tok>) -> Option<usize> {
    let nl = at + buf.get(at..)?.iter().position(|&b| b == b'\n')?;
    let (kind, line) = (buf[at], (at + 1, nl.saturating_sub(1)));
    let num = std::str::from_utf8(&buf[line.0..line.1])
        .ok()
        .and_then(|s| s.parse::<i64>().ok());
    let after = nl + 1;
    match (kind, num) {
        (b'$', Some(n)) if n >= 0 => {
            let end = after + n as usize;
            toks.push(Tok(kind, after, end));
            (buf.len() >= end + 2).then_some(end + 2)
        }
        (b'*', Some(n)) if n >= 0 => {
            toks.push(Tok(kind, line.0, line.1));
            (0..n).try_fold(after, |at, _| parse(buf, at, toks))
        }
        (b'$' | b'*' | b'_', _) => {
            toks.push(Tok(b'_', after, after));
            Some(after)
        }
        _ => {
            toks.push(Tok(kind, line.0, line.1));
            Some(after)
        }
    }
}

/// Appends the RESP encoding of a command.
fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    let _ = write!(out, "*{}\r\n", args.len());
    for a in args {
        let _ = write!(out, "${}\r\n", a.len());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// A command given as words separated by single spaces.
fn words(line: &str) -> Vec<u8> {
    let mut out = Vec::new();
    encode(
        &mut out,
        &line.split(' ').map(str::as_bytes).collect::<Vec<_>>(),
    );
    out
}

/// The value of the message's `"id":"…"` field.
fn json_id(msg: &[u8]) -> Option<&[u8]> {
    const KEY: &[u8] = b"\"id\":\"";
    let start = msg.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let len = msg[start..].iter().position(|&b| b == b'"')?;
    Some(&msg[start..start + len])
}

/// Message `i`, exactly [`MSG_LEN`] bytes.
fn message(i: usize) -> Vec<u8> {
    let mut m = format!("{{\"id\":\"{i:012}\",\"body\":\"").into_bytes();
    m.resize(MSG_LEN - 2, b'x');
    m.extend_from_slice(b"\"}");
    m
}

// ------------------------------------------------------------------ the driver's client

/// A blocking connection for filling, resetting and checking.
struct Blocking {
    s: std::net::TcpStream,
    buf: Vec<u8>,
    pos: usize,
    toks: Vec<Tok>,
}

impl Blocking {
    fn connect(port: u16) -> Res<Blocking> {
        let s = std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port))
            .map_err(|e| format!("connect to port {port}: {e}"))?;
        s.set_nodelay(true).map_err(err)?;
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(err)?;
        Ok(Blocking {
            s,
            buf: Vec::new(),
            pos: 0,
            toks: Vec::new(),
        })
    }

    /// Reads the next reply into `self.toks`; a Redis error is an Err.
    fn read(&mut self) -> Res<()> {
        loop {
            self.toks.clear();
            if let Some(end) = parse(&self.buf, self.pos, &mut self.toks) {
                self.pos = end;
                return match self.toks[0].0 {
                    b'-' => Err(self.text(0)),
                    _ => Ok(()),
                };
            }
            self.buf.drain(..self.pos);
            self.pos = 0;
            let len = self.buf.len();
            self.buf.resize(len + 64 * 1024, 0);
            let n = self.s.read(&mut self.buf[len..]).map_err(err)?;
            self.buf.truncate(len + n);
            if n == 0 {
                return Err("connection closed".into());
            }
        }
    }

    /// Writes commands already encoded and reads their `n` replies.
    fn send(&mut self, out: &[u8], n: usize) -> Res<()> {
        self.s.write_all(out).map_err(err)?;
        (0..n).try_for_each(|_| self.read())
    }

    fn call(&mut self, line: &str) -> Res<()> {
        self.send(&words(line), 1)
    }

    fn text(&self, i: usize) -> String {
        let t = self.toks[i];
        String::from_utf8_lossy(&self.buf[t.1..t.2]).into_owned()
    }

    fn int(&self, i: usize) -> Res<i64> {
        self.text(i)
            .parse()
            .map_err(|_| format!("not an integer: {}", self.text(i)))
    }
}

// ------------------------------------------------------------------ the load generator

/// A connection of the generator.
struct Conn {
    s: tokio::net::TcpStream,
    buf: Vec<u8>,
    toks: Vec<Tok>,
}

impl Conn {
    async fn connect(port: u16) -> Res<Conn> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let s = tokio::net::TcpStream::connect(addr).await.map_err(err)?;
        s.set_nodelay(true).map_err(err)?;
        Ok(Conn {
            s,
            buf: Vec::with_capacity(4096),
            toks: Vec::new(),
        })
    }

    /// Sends a request and reads its reply into `self.toks`. Without
    /// pipelining the buffer holds exactly that reply afterwards.
    async fn call(&mut self, req: &[u8]) -> Res<()> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let io = async {
            self.s.write_all(req).await.map_err(err)?;
            self.buf.clear();
            loop {
                self.toks.clear();
                if parse(&self.buf, 0, &mut self.toks).is_some() {
                    return Ok(());
                }
                self.buf.reserve(4096);
                if self.s.read_buf(&mut self.buf).await.map_err(err)? == 0 {
                    return Err("connection closed".to_string());
                }
            }
        };
        // A stuck proxy must not hang the benchmark (BRPOP waits 1 s at most).
        let limit = Duration::from_secs(30);
        tokio::time::timeout(limit, io)
            .await
            .map_err(|_| "no reply in 30 s".to_string())?
    }

    fn kind(&self, i: usize) -> u8 {
        self.toks.get(i).map_or(0, |t| t.0)
    }
    fn bytes(&self, i: usize) -> &[u8] {
        self.toks.get(i).map_or(&[], |t| &self.buf[t.1..t.2])
    }
    fn reply(&self) -> String {
        String::from_utf8_lossy(&self.buf[..self.buf.len().min(160)]).into_owned()
    }
}

#[derive(Default)]
struct WorkerOut {
    pairs: u64,
    failures: u64,
    first_failure: Option<String>,
    last: Option<Instant>,
    latency_us: Vec<u32>,
}

impl WorkerOut {
    fn fail(&mut self, what: String) {
        self.failures += 1;
        self.first_failure.get_or_insert(what);
    }
}

/// One worker: pop, take the id, acknowledge, until the first empty pop.
/// On `np` that empty pop is also what acknowledges the last message.
async fn worker(mode: Mode, mut c: Conn, n: usize, key: String) -> WorkerOut {
    let key = key.as_str();
    let sha = |s: &str| sha1_smol::Sha1::from(s).digest().to_string();
    let ack_sha = sha(SEED_ACK);
    let pop = words(&match mode {
        // ARGV[1] the queue, ARGV[2] unread (was the client's time), ARGV[3] the timespan.
        Mode::Seed => format!("EVALSHA {} 0 {key} 0 {SEED_TIMESPAN_MS}", sha(SEED_POP)),
        Mode::SeedTwem => format!(
            "EVALSHA {} 1 {key} {key} 0 {SEED_TIMESPAN_MS}",
            sha(SEED_POP)
        ),
        Mode::Streams => format!("XREADGROUP GROUP g c{n} COUNT 1 STREAMS {key} >"),
        Mode::Brpop => format!("BRPOP {key} 1"),
        Mode::Brpoplpush => format!("BRPOPLPUSH {key} doing:{key} 1"),
        // twemproxy has no blocking commands.
        Mode::TwemRpoplpush => format!("RPOPLPUSH {key} doing:{key}"),
        Mode::Rpop | Mode::NextPop | Mode::DirectRpop | Mode::TwemRpop => format!("RPOP {key}"),
    });
    let key = key.as_bytes();
    let mut out = WorkerOut::default();
    let mut ack = Vec::with_capacity(256);
    loop {
        let t = Instant::now();
        if let Err(e) = c.call(&pop).await {
            out.fail(format!("pop: {e}"));
            break;
        }
        // Where the message is in the reply: RPOP, EVALSHA: a bulk string;
        // BRPOP: [key, message]; XREADGROUP: [[s, [[entry id, [m, message]]]]].
        let msg = match (mode, c.kind(0)) {
            (_, b'_') => break,
            (Mode::Brpop, b'*') => 2,
            (Mode::Streams, b'*') => 8,
            (
                Mode::Seed
                | Mode::SeedTwem
                | Mode::Rpop
                | Mode::Brpoplpush
                | Mode::NextPop
                | Mode::DirectRpop
                | Mode::TwemRpop
                | Mode::TwemRpoplpush,
                b'$',
            ) => 0,
            _ => {
                out.fail(format!("pop reply {}", c.reply()));
                break;
            }
        };
        let Some(id) = json_id(c.bytes(msg)) else {
            out.fail(format!("no id in {}", c.reply()));
            continue;
        };
        ack.clear();
        match mode {
            Mode::Seed => encode(&mut ack, &[b"EVALSHA", ack_sha.as_bytes(), b"0", id, key]),
            Mode::SeedTwem => encode(
                &mut ack,
                &[b"EVALSHA", ack_sha.as_bytes(), b"1", key, id, key],
            ),
            Mode::Brpoplpush | Mode::TwemRpoplpush => {
                let doing = [b"doing:".as_slice(), key].concat();
                encode(&mut ack, &[b"LREM", &doing, b"1", c.bytes(msg)])
            }
            Mode::Streams => encode(&mut ack, &[b"XACK", key, b"g", c.bytes(5)]),
            Mode::Rpop | Mode::Brpop => encode(&mut ack, &[b"ACK", key, id]),
            Mode::NextPop | Mode::DirectRpop | Mode::TwemRpop => {}
        }
        if !ack.is_empty() {
            if let Err(e) = c.call(&ack).await {
                out.fail(format!("ack: {e}"));
                break;
            }
            // The seed's ACK script returns nothing; XACK and ACK the count.
            let ok = match mode {
                Mode::Seed | Mode::SeedTwem => c.kind(0) == b'_',
                _ => c.kind(0) == b':' && c.bytes(0) == b"1",
            };
            if !ok {
                out.fail(format!("ack reply {}", c.reply()));
                continue;
            }
        }
        let done = Instant::now();
        out.latency_us
            .push((done - t).as_micros().min(u32::MAX.into()) as u32);
        out.pairs += 1;
        out.last = Some(done);
    }
    out
}

/// `--generate <mode> <port> <conns> [queues]`: runs the workers and prints
/// the results as `key=value` words on one line of stdout.
fn generate(args: &[String]) -> Res<()> {
    let mode = args.first().and_then(|m| Mode::parse(m)).ok_or("no mode")?;
    let port: u16 = args.get(1).and_then(|p| p.parse().ok()).ok_or("no port")?;
    let conns: usize = args.get(2).and_then(|n| n.parse().ok()).ok_or("no conns")?;
    let queues: Vec<String> = match args.get(3) {
        Some(list) => list.split(',').map(str::to_string).collect(),
        None => vec![mode.key().to_string()],
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(err)?;
    let (t0, outs) = rt.block_on(async move {
        // All connected before the clock starts: the run is the traffic.
        let mut cs = Vec::with_capacity(conns);
        for _ in 0..conns {
            cs.push(Conn::connect(port).await?);
        }
        let t0 = Instant::now();
        let tasks: Vec<_> = cs
            .into_iter()
            .enumerate()
            .map(|(n, c)| tokio::spawn(worker(mode, c, n, queues[n % queues.len()].clone())))
            .collect();
        let mut outs = Vec::with_capacity(conns);
        for t in tasks {
            outs.push(t.await.map_err(err)?);
        }
        Ok::<_, String>((t0, outs))
    })?;
    let pairs: u64 = outs.iter().map(|o| o.pairs).sum();
    let failures: u64 = outs.iter().map(|o| o.failures).sum();
    if let Some(f) = outs.iter().find_map(|o| o.first_failure.as_ref()) {
        eprintln!("{}: first failure: {f}", mode.name());
    }
    // Up to the last pair's reply, not the final empty pop, which for BRPOP
    // would add its 1 s timeout.
    let last = outs.iter().filter_map(|o| o.last).max().unwrap_or(t0);
    let mut lat: Vec<u32> = outs.into_iter().flat_map(|o| o.latency_us).collect();
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get((lat.len() as f64 * p) as usize)
            .copied()
            .unwrap_or(0)
    };
    let secs = (last - t0).as_secs_f64();
    let (p50, p99) = (pct(0.50), pct(0.99));
    println!("pairs={pairs} failures={failures} elapsed_s={secs:.6} p50_us={p50} p99_us={p99}");
    Ok(())
}

// ------------------------------------------------------------------ processes

/// utime + stime of a process, µs.
fn cpu_us(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the parenthesised name: state is field 0, utime 11, stime 12.
    let f: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks * 10_000) // USER_HZ is 100
}

/// A child sent SIGTERM when dropped and given half a second to go; the
/// inner `Proc` then kills (SIGKILL) and reaps it if it is still there.
struct Guard(Proc);

impl Guard {
    fn pid(&self) -> u32 {
        self.0 .0.id()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let child = &mut self.0 .0;
        if let Ok(None) = child.try_wait() {
            // SAFETY: our own child, not reaped yet, so the pid is still its.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_millis(500);
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// twemproxy (`nutcracker`) in front of Redis with one server connection,
/// as `bench/scripts/run.sh` runs it for the passthrough comparison.
fn start_twemproxy(redis_port: u16, dir: &std::path::Path) -> Res<(Guard, u16)> {
    let port = common::free_port();
    let conf = dir.join("nutcracker.yml");
    std::fs::write(
        &conf,
        format!(
            "bench:\n  listen: 127.0.0.1:{port}\n  hash: fnv1a_64\n  distribution: ketama\n  \
             redis: true\n  server_connections: 1\n  servers:\n   - 127.0.0.1:{redis_port}:1\n"
        ),
    )
    .map_err(err)?;
    let child = Command::new("nutcracker")
        .arg("-c")
        .arg(&conf)
        .arg("-o")
        .arg(dir.join("nutcracker.log"))
        .args(["-a", "127.0.0.1", "-s", &common::free_port().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("nutcracker (apt-get install nutcracker): {e}"))?;
    let guard = Guard(Proc(child));
    common::wait_port(port);
    Ok((guard, port))
}

/// Redis's and the proxy's directory, removed however the run ends (declared
/// before them, so dropped after them).
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the generator to its end: its results, and its CPU µs, read from
/// /proc once it has exited but before it is reaped (a zombie's entry still
/// holds its times, and it no longer uses any).
fn run_generator(mode: Mode, port: u16, conns: usize) -> Res<(BTreeMap<String, f64>, u64)> {
    let exe = std::env::current_exe().map_err(err)?;
    let (port, conns) = (port.to_string(), conns.to_string());
    let child = Command::new(exe)
        .args(["--generate", mode.name(), &port, &conns])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("generator: {e}"))?;
    let mut gen = Guard(Proc(child));
    let child = &mut gen.0 .0;
    let mut text = String::new();
    if let Some(mut out) = child.stdout.take() {
        out.read_to_string(&mut text).map_err(err)?;
    }
    // SAFETY: a zeroed siginfo_t is valid; waitid on our own child with
    // WNOWAIT leaves it to `wait` below.
    let rc = unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        libc::waitid(
            libc::P_PID,
            child.id(),
            &mut info,
            libc::WEXITED | libc::WNOWAIT,
        )
    };
    let cpu = if rc == 0 { cpu_us(child.id()) } else { None };
    let status = child.wait().map_err(err)?;
    if !status.success() {
        return Err(format!("generator ({}) exited with {status}", mode.name()));
    }
    let fields = text
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect();
    Ok((fields, cpu.ok_or("no CPU time for the generator")?))
}

// ------------------------------------------------------------------ one run

struct Sample {
    pairs: f64,
    failures: f64,
    rate: f64,
    p50: f64,
    p99: f64,
    /// (command, µs per call), the costliest first.
    per_call: Vec<(String, f64)>,
    redis_us: f64,
    /// Reads and writes of client connections Redis made per pair (`INFO
    /// stats`): what a proxy's batching saves it in system calls.
    redis_reads: f64,
    redis_writes: f64,
    proxy_us: f64,
    gen_us: f64,
}

/// Fields drop in order: the proxy goes before the Redis it would
/// otherwise complain about losing.
struct Setup {
    proxy: Guard,
    twem: Guard,
    redis: Guard,
    redis_port: u16,
    proxy_port: u16,
    twem_port: u16,
    messages: usize,
    conns: usize,
}

/// Empties Redis and pushes the messages for `mode`, 1000 at a time.
fn prefill(r: &mut Blocking, mode: Mode, n: usize) -> Res<()> {
    r.call("FLUSHALL")?;
    let key = mode.key().as_bytes();
    let mut out = Vec::with_capacity(256 * 1024);
    for start in (0..n).step_by(1000) {
        let msgs: Vec<Vec<u8>> = (start..(start + 1000).min(n)).map(message).collect();
        out.clear();
        if mode == Mode::Streams {
            for m in &msgs {
                encode(&mut out, &[b"XADD", key, b"*", b"m", m]);
            }
            r.send(&out, msgs.len())?;
        } else {
            let mut args: Vec<&[u8]> = vec![b"LPUSH", key];
            args.extend(msgs.iter().map(|m| m.as_slice()));
            encode(&mut out, &args);
            r.send(&out, 1)?;
        }
    }
    if mode == Mode::Streams {
        r.call("XGROUP CREATE s g 0")?;
    }
    Ok(())
}

/// Messages left unacknowledged or undelivered after a run: there should be
/// none (the generator only sees that each ACK said 1).
fn leftovers(r: &mut Blocking, proxy_port: u16, mode: Mode) -> Res<i64> {
    let unacked = match mode {
        Mode::Seed | Mode::SeedTwem => {
            r.call("ZCARD jobsBACKUP")?;
            let leases = r.int(0)?;
            r.call("HLEN jobsCONTEXT")?;
            leases + r.int(0)?
        }
        Mode::Streams => {
            r.call("XPENDING s g")?;
            return r.int(1);
        }
        Mode::DirectRpop | Mode::TwemRpop | Mode::TwemRpoplpush => 0,
        _ => {
            // A flat field/value array in RESP2.
            let mut p = Blocking::connect(proxy_port)?;
            p.call(&format!("QUEUE INFO {}", mode.key()))?;
            let f: BTreeMap<String, String> = (1..p.toks.len().saturating_sub(1))
                .step_by(2)
                .map(|i| (p.text(i), p.text(i + 1)))
                .collect();
            let num = |k: &str| {
                let v = f.get(k).and_then(|v| v.parse::<i64>().ok());
                v.ok_or(format!("QUEUE INFO without {k}"))
            };
            num("leased")? + num("deliveries")? - num("acks")?
        }
    };
    r.call(&format!("LLEN {}", mode.key()))?;
    let mut left = unacked + r.int(0)?;
    if matches!(mode, Mode::Brpoplpush | Mode::TwemRpoplpush) {
        // What LREM did not remove from the processing list.
        r.call(&format!("LLEN doing:{}", mode.key()))?;
        left += r.int(0)?;
    }
    Ok(left)
}

fn run_one(s: &Setup, r: &mut Blocking, mode: Mode) -> Res<Sample> {
    prefill(r, mode, s.messages)?;
    r.call("CONFIG RESETSTAT")?;
    // The proxy in front, whichever it is.
    let (port, proxy_pid) = match mode {
        Mode::SeedTwem | Mode::TwemRpop | Mode::TwemRpoplpush => (s.twem_port, s.twem.pid()),
        m if m.via_proxy() => (s.proxy_port, s.proxy.pid()),
        _ => (s.redis_port, s.proxy.pid()),
    };
    let cpu = || {
        (
            cpu_us(s.redis.pid()).unwrap_or(0),
            cpu_us(proxy_pid).unwrap_or(0),
        )
    };
    let (r0, p0) = cpu();
    let (g, gen_cpu) = run_generator(mode, port, s.conns)?;
    r.call("INFO commandstats")?;
    let stats = r.text(0);
    let (r1, p1) = cpu();
    r.call("INFO stats")?;
    let io = r.text(0);
    let io_field = |k: &str| {
        io.lines()
            .find_map(|l| {
                l.strip_prefix(k)?
                    .strip_prefix(':')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(0.0)
    };

    let field = |k: &str| g.get(k).copied().unwrap_or(0.0);
    let pairs = field("pairs");
    let mut failures = field("failures");
    let left = leftovers(r, s.proxy_port, mode)?;
    if left != 0 || pairs != s.messages as f64 {
        eprintln!(
            "{}: {pairs} pairs of {}, {left} left over",
            mode.name(),
            s.messages
        );
        failures += 1.0;
    }
    // cmdstat_evalsha:calls=200000,usec=…,usec_per_call=12.34,…; commands
    // that scripts call are counted too (their time is also in evalsha's).
    let mut per_call: Vec<(String, f64, f64)> = stats
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let kv: BTreeMap<&str, &str> =
                rest.split(',').filter_map(|f| f.split_once('=')).collect();
            let calls: u64 = kv.get("calls")?.parse().ok()?;
            let usec: f64 = kv.get("usec")?.parse().ok()?;
            let per: f64 = kv.get("usec_per_call")?.parse().ok()?;
            (calls >= MIN_CALLS).then(|| (name.to_string(), usec, per))
        })
        .collect();
    per_call.sort_by(|a, b| b.1.total_cmp(&a.1));
    let per_pair = |us: u64| if pairs > 0.0 { us as f64 / pairs } else { 0.0 };
    Ok(Sample {
        pairs,
        failures,
        rate: pairs / field("elapsed_s").max(1e-9),
        p50: field("p50_us"),
        p99: field("p99_us"),
        per_call: per_call
            .into_iter()
            .map(|(name, _, per)| (name, per))
            .collect(),
        redis_us: per_pair(r1 - r0),
        redis_reads: io_field("total_reads_processed") / pairs.max(1.0),
        redis_writes: io_field("total_writes_processed") / pairs.max(1.0),
        proxy_us: per_pair(p1 - p0),
        gen_us: per_pair(gen_cpu),
    })
}

// ------------------------------------------------------------------ the report

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The table and the ratios, as markdown.
fn table(modes: &[Mode], samples: &BTreeMap<&str, Vec<Sample>>, rounds: usize) -> String {
    let mut t = String::from(
        "| mode | pairs/s | p50 µs | p99 µs | Redis µs per call | Redis CPU µs/pair \
         | Redis reads/pair | Redis writes/pair | proxy CPU µs/pair | generator CPU µs/pair \
         | failures |\n\
         |---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut rates = BTreeMap::new();
    let mut redis = BTreeMap::new();
    for m in modes {
        let v = &samples[m.name()];
        let med = |f: fn(&Sample) -> f64| median(v.iter().map(f).collect());
        rates.insert(m.name(), med(|s| s.rate));
        redis.insert(m.name(), med(|s| s.redis_us));
        // Per command, the median over the rounds that counted it.
        let mut calls: Vec<(&str, Vec<f64>)> = Vec::new();
        for (name, us) in v.iter().flat_map(|s| &s.per_call) {
            match calls.iter_mut().find(|c| c.0 == name.as_str()) {
                Some(c) => c.1.push(*us),
                None => calls.push((name.as_str(), vec![*us])),
            }
        }
        let calls: Vec<String> = calls
            .into_iter()
            .map(|(name, us)| format!("{name} {:.2}", median(us)))
            .collect();
        let twem = matches!(m, Mode::SeedTwem | Mode::TwemRpop | Mode::TwemRpoplpush);
        let proxy = match m.via_proxy() || twem {
            true => format!("{:.1}", med(|s| s.proxy_us)),
            false => "-".into(),
        };
        t.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.0} | {} | {:.1} | {:.2} | {:.2} | {proxy} | {:.1} | {} |\n",
            m.name(),
            rates[m.name()],
            med(|s| s.p50),
            med(|s| s.p99),
            calls.join(", "),
            med(|s| s.redis_us),
            med(|s| s.redis_reads),
            med(|s| s.redis_writes),
            med(|s| s.gen_us),
            v.iter().map(|s| s.failures).sum::<f64>(),
        ));
    }
    t.push('\n');
    for (a, b) in [
        ("rpop", "seed"),
        ("rpop", "seed-twem"),
        ("rpop", "streams"),
        ("brpop", "rpop"),
        ("brpoplpush", "rpop"),
        ("nextpop", "rpop"),
        ("rpop", "twem-rpop"),
        ("brpoplpush", "twem-rpoplpush"),
    ] {
        if let (Some(x), Some(y)) = (rates.get(a), rates.get(b)) {
            let cost = match (redis.get(a), redis.get(b)) {
                (Some(ra), Some(rb)) if *rb > 0.0 => {
                    format!(", Redis CPU per pair {:.2}×", ra / rb)
                }
                _ => String::new(),
            };
            t.push_str(&format!("- {a}/{b}: pairs/s {:.2}×{cost}\n", x / y));
        }
    }
    let added = |m: &str, direct: &str| Some(redis.get(m)? - redis.get(direct)?);
    if let (Some(plain), Some(moved)) = (
        added("rpop", "twem-rpop"),
        added("brpoplpush", "twem-rpoplpush"),
    ) {
        t.push_str(&format!(
            "- what the leases add in Redis per pair: rpop {plain:.1} µs, brpoplpush \
             {moved:.1} µs ({:.2}×)\n",
            moved / plain
        ));
    }
    t.push_str(&format!(
        "\nMedians of {rounds} round(s), the modes interleaved in each. pairs/s: pairs over the \
         time from the first request to the last pair's reply. Latency: pop sent to ACK reply \
         (nextpop, direct-rpop, twem-rpop: to the pop's reply). Redis µs per call: `INFO commandstats` for \
         commands with ≥ {MIN_CALLS} calls, costliest first; commands called from scripts count \
         too, and their time is part of the script's. CPU: utime+stime over the run (USER_HZ \
         100) divided by the pairs.\n"
    ));
    t
}

// ------------------------------------------------------------------ driver

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn loadavg() -> String {
    let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

fn output(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.split_first() {
        Some((first, rest)) if first == "--generate" => generate(rest).map(|()| true),
        _ => drive(&args),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("pairs: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The whole benchmark; Ok(false) if a mode had failures or moved nothing.
/// Returns (rather than exits) so that the guards stop Redis and the proxy.
fn drive(args: &[String]) -> Res<bool> {
    let smoke = args.iter().any(|a| a == "--smoke") || std::env::var_os("PAIRS_SMOKE").is_some();
    let messages = if smoke {
        2_000
    } else {
        env_num("PAIRS_MESSAGES", 200_000)
    };
    let rounds = if smoke {
        1
    } else {
        env_num("PAIRS_ROUNDS", 3).max(1)
    };
    let conns = env_num("PAIRS_CONNS", 50).max(1);
    let record = !smoke && std::env::var("PAIRS_RECORD").is_ok_and(|v| v == "1");
    let modes: Vec<Mode> = match std::env::var("PAIRS_MODES") {
        Ok(list) if !smoke => list
            .split(',')
            .map(|m| Mode::parse(m).ok_or(format!("unknown mode {m:?}")))
            .collect::<Res<_>>()?,
        _ => ALL_MODES.to_vec(),
    };
    let bin = std::env::var("ACKPROXY_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_ackproxy").to_string());

    // The command as typed, as far as it can be told from here.
    let vars = [
        "PAIRS_SMOKE",
        "PAIRS_MESSAGES",
        "PAIRS_ROUNDS",
        "PAIRS_CONNS",
        "PAIRS_RULE",
        "PAIRS_METRICS",
    ];
    let mut command: String = [&vars[..], &["PAIRS_MODES", "PAIRS_RECORD", "ACKPROXY_BIN"]]
        .concat()
        .iter()
        .filter_map(|k| {
            let v = std::env::var(k).ok()?;
            Some(match v.contains(' ') {
                true => format!("{k}='{v}' "),
                false => format!("{k}={v} "),
            })
        })
        .collect();
    command.push_str("cargo bench --bench pairs");
    let user_args: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| *a != "--bench")
        .collect();
    if !user_args.is_empty() {
        command.push_str(&format!(" -- {}", user_args.join(" ")));
    }
    let load_before = loadavg();
    let version = output("redis-server", &["--version"]);

    let dir = TempDir(std::env::temp_dir().join(format!("ackproxy-pairs-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).map_err(err)?;
    let dir = &dir.0;
    let cfg = dir.join("check.toml");
    // The `jobs` rule is CONFIG's first table: extra lines go right after it.
    let extra_rule = std::env::var("PAIRS_RULE").unwrap_or_default();
    let config = CONFIG.replacen(
        "ack_id = \"json:id\"\n",
        &format!("ack_id = \"json:id\"\n{extra_rule}\n"),
        1,
    );
    std::fs::write(&cfg, &config).map_err(err)?;
    let check = Command::new(&bin)
        .arg("--check-config")
        .arg("--config")
        .arg(&cfg)
        .output();
    match check {
        Ok(o) if o.status.success() => {}
        Ok(o) => Err(format!(
            "{bin} --check-config: {}",
            String::from_utf8_lossy(&o.stderr)
        ))?,
        Err(e) => Err(format!("{bin}: {e}"))?,
    }
    let (redis, redis_port) = start_redis(dir);
    let redis = Guard(redis);
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let flags: Vec<&str> = match std::env::var("PAIRS_METRICS") {
        Ok(v) if v == "1" => vec!["--metrics", &metrics],
        _ => vec![],
    };
    let (proxy, proxy_port) = start_proxy_with(&bin, redis_port, &config, dir, &flags);
    let proxy = Guard(proxy);
    let (twem, twem_port) = start_twemproxy(redis_port, dir)?;
    let setup = Setup {
        redis,
        proxy,
        twem,
        redis_port,
        proxy_port,
        twem_port,
        messages,
        conns,
    };
    let mut r = Blocking::connect(redis_port)?;
    for script in [SEED_POP, SEED_ACK] {
        let mut load = Vec::new();
        encode(&mut load, &[b"SCRIPT", b"LOAD", script.as_bytes()]);
        r.send(&load, 1)?;
    }

    let names: Vec<&str> = modes.iter().map(|m| m.name()).collect();
    eprintln!(
        "{messages} messages, {conns} connections, {rounds} round(s): {}",
        names.join(", ")
    );
    let mut samples: BTreeMap<&str, Vec<Sample>> = BTreeMap::new();
    for round in 1..=rounds {
        for &mode in &modes {
            let s = run_one(&setup, &mut r, mode)?;
            eprintln!(
                "round {round} {:<11} {:>7.0} pairs/s, p50 {:>5.0} µs, p99 {:>6.0} µs, CPU µs/pair: \
                 redis {:.1}, proxy {:.1}, generator {:.1}, failures {}; Redis reads/pair {:.2}, \
                 writes/pair {:.2}",
                mode.name(),
                s.rate,
                s.p50,
                s.p99,
                s.redis_us,
                s.proxy_us,
                s.gen_us,
                s.failures,
                s.redis_reads,
                s.redis_writes
            );
            samples.entry(mode.name()).or_default().push(s);
        }
    }
    drop((r, setup));

    let ok = samples
        .values()
        .flatten()
        .all(|s| s.failures == 0.0 && s.pairs > 0.0);
    let when = output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let block = format!(
        "### Queue pairs, {when}\n\n\
         Command: `{command}` ({messages} messages of {MSG_LEN} B per mode and round, {conns} \
         connections with one request in flight each, the generator on one thread; {version}).\n\
         Load average before: {load_before}; after: {}.\n\n{}",
        loadavg(),
        table(&modes, &samples, rounds)
    );
    println!("\n{block}");
    if record {
        append_results(&block).map_err(|e| format!("bench/RESULTS.md: {e}"))?;
        eprintln!("appended to bench/RESULTS.md");
    }
    if !ok {
        eprintln!("pairs: a mode had failures or moved nothing");
    }
    Ok(ok)
}

/// Adds `block` at the end of the "Queue pairs" section of bench/RESULTS.md,
/// which the first run creates at the end of the file.
fn append_results(block: &str) -> std::io::Result<()> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/RESULTS.md");
    let mut text = std::fs::read_to_string(&path)?;
    let heading = "\n## Queue pairs (bench/pairs.rs)\n";
    if !text.contains(heading) {
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(heading);
    }
    let start = text.find(heading).map_or(text.len(), |i| i + heading.len());
    let end = text[start..]
        .find("\n## ")
        .map_or(text.len(), |i| start + i + 1);
    let mut run = format!("\n{block}");
    if end < text.len() {
        run.push('\n');
    }
    text.insert_str(end, &run);
    std::fs::write(&path, text)
}
