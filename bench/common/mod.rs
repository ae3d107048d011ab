//! What the benchmark programs share: starting Redis and the proxy, a
//! blocking client, the slow log, and appending to `bench/RESULTS.md`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ackproxy::upstream::encode_command;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process, killed on drop.
pub struct Proc(pub Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A redis-server without persistence on a free port, data in `dir`.
pub fn start_redis(dir: &Path) -> (Proc, u16) {
    let port = free_port();
    let redis = Proc(
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server"),
    );
    wait_port(port);
    (redis, port)
}

/// The proxy `bin` in front of `redis_port`, with the configuration `toml`
/// (written into `dir`), on a free port.
pub fn start_proxy(bin: &str, redis_port: u16, toml: &str, dir: &Path) -> (Proc, u16) {
    start_proxy_with(bin, redis_port, toml, dir, &[])
}

/// [`start_proxy`] with extra command-line flags.
pub fn start_proxy_with(
    bin: &str,
    redis_port: u16,
    toml: &str,
    dir: &Path,
    extra: &[&str],
) -> (Proc, u16) {
    let cfg = dir.join("ackproxy.toml");
    std::fs::write(&cfg, toml).unwrap();
    let port = free_port();
    let proxy = Proc(
        Command::new(bin)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--upstream", &format!("127.0.0.1:{redis_port}")])
            .arg("--config")
            .arg(&cfg)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("ackproxy binary"),
    );
    wait_port(port);
    (proxy, port)
}

/// A blocking client that skips over replies, keeping only what is asked.
pub struct Conn(pub BufReader<TcpStream>);

impl Conn {
    pub fn connect(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_nodelay(true).unwrap();
        Conn(BufReader::with_capacity(1 << 20, s))
    }

    pub fn send(&mut self, args: &[&[u8]]) {
        self.0.get_mut().write_all(&encode_command(args)).unwrap();
    }

    pub fn line(&mut self) -> String {
        let mut l = String::new();
        self.0.read_line(&mut l).unwrap();
        l.trim_end().to_string()
    }

    /// Reads one reply; returns its first line, and the integers it holds
    /// (for SLOWLOG: each entry's duration), and its element count.
    pub fn read(&mut self, ints: &mut Vec<i64>) -> (String, usize) {
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

    pub fn cmd(&mut self, args: &[&[u8]]) -> (String, usize) {
        self.send(args);
        self.read(&mut Vec::new())
    }
}

/// The durations (µs) of the FCALL/EVAL/EVALSHA calls in the slow log, which is
/// then reset.
pub fn script_durations(direct: &mut Conn) -> Vec<i64> {
    direct.send(&[b"SLOWLOG", b"GET", b"1000000"]);
    let l = direct.line();
    let n: usize = l[1..].parse().unwrap();
    let mut out = Vec::new();
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
        let name = name.to_ascii_uppercase();
        if name.starts_with(b"EVAL") || name.starts_with(b"FCALL") {
            out.push(dur[0]);
        }
    }
    direct.cmd(&[b"SLOWLOG", b"RESET"]);
    out
}

/// The slowest function or script call in the slow log, µs, and how many were logged.
pub fn slowest_script(direct: &mut Conn) -> (i64, usize) {
    let d = script_durations(direct);
    (d.iter().copied().max().unwrap_or(0), d.len())
}

/// Appends a section to `bench/RESULTS.md`: a heading with the time, the
/// command that produced it, notes, the load average now, and the text.
pub fn append_results(title: &str, command: &str, notes: &str, text: &str) {
    let results = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/RESULTS.md");
    let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(results) else {
        return;
    };
    let when = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let _ = write!(
        f,
        "\n### {title}, {when}\n\nCommand: `{command}` ({notes}; load average before: {}).\n\n{text}",
        load.join(" ")
    );
}
