//! Test harness: real redis-server processes on free loopback ports, the
//! ackproxy binary in front of them, and a small blocking RESP client that
//! returns replies as raw bytes (for byte-for-byte comparison) or as values.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A loopback port nothing listens on, below Linux's ephemeral range
/// (32768–60999): a port the kernel hands out for `bind(0)` can be taken by
/// any outgoing connection between this call and the server's bind.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    // Each process starts elsewhere in 10000–31999; threads take turns.
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7919);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 10_000 + (start.wrapping_add(n) % 22_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

fn wait_for_ping(port: u16, what: &str, child: &mut Child) {
    wait_until_ready(port, what, child, || {
        let Ok(mut c) = Client::try_connect(port) else {
            return false;
        };
        c.send(&["PING"]);
        // A server still starting may accept and then close; one that
        // wants a login first is up too.
        c.try_read_raw()
            .is_ok_and(|r| r == b"+PONG\r\n" || r == b"-NOAUTH Authentication required.\r\n")
    });
}

/// Polls `ready` until it holds, failing if `child` exits first.
fn wait_until_ready(port: u16, what: &str, child: &mut Child, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if ready() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} on port {port} exited early: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "{what} on port {port} never became ready"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A redis-server child on a free port, killed on drop.
pub struct Redis {
    pub port: u16,
    child: Child,
    pub dir: PathBuf,
}

impl Redis {
    pub fn start() -> Redis {
        Redis::start_with(&[])
    }

    /// Extra `--name value` arguments are passed to redis-server as is.
    pub fn start_with(extra: &[&str]) -> Redis {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("ackproxy-test-redis-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Redis::start_on(port, dir, extra)
    }

    /// Start on a given port and dir (used to restart a server in place).
    pub fn start_on(port: u16, dir: PathBuf, extra: &[&str]) -> Redis {
        let mut redis = Redis::spawn(port, dir, extra);
        wait_for_ping(port, "redis-server", &mut redis.child);
        redis
    }

    /// A redis-server that does not answer a plain PING on `port` (one
    /// whose `extra` makes it speak TLS there): `ready` tells when it is up.
    pub fn start_when(port: u16, extra: &[&str], mut ready: impl FnMut() -> bool) -> Redis {
        let dir = std::env::temp_dir().join(format!("ackproxy-test-redis-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut redis = Redis::spawn(port, dir, extra);
        wait_until_ready(port, "redis-server", &mut redis.child, &mut ready);
        redis
    }

    /// `extra` comes after `--port`: a later `--port 0` turns plain TCP off.
    fn spawn(port: u16, dir: PathBuf, extra: &[&str]) -> Redis {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        Redis { port, child, dir }
    }

    pub fn client(&self) -> Client {
        Client::connect(self.port)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Ends a child by its PID: SIGTERM, then SIGKILL if it is still there
/// after `grace`.
pub fn stop_child(child: &mut Child, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    // A stopped process (SIGSTOP) handles SIGTERM only once continued.
    for signal in ["-CONT", "-TERM"] {
        let _ = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status();
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The master name the sentinels of a [`SentinelSet`] monitor.
pub const SENTINEL_MASTER: &str = "ackmaster";

/// A Sentinel-monitored Redis on free loopback ports: a primary, a replica
/// and three sentinels (`redis-server <conf> --sentinel`: no separate
/// redis-sentinel binary needed), quick to fail over (down after 1 s).
/// Every process is torn down by its PID, SIGTERM then SIGKILL.
pub struct SentinelSet {
    /// Data nodes: the primary and the replica at first.
    nodes: Vec<Redis>,
    sentinels: Vec<(u16, Child)>,
    dir: PathBuf,
}

impl SentinelSet {
    pub fn start() -> SentinelSet {
        let primary = free_port();
        let dir = std::env::temp_dir().join(format!("ackproxy-test-sentinel-{primary}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut set = SentinelSet {
            nodes: Vec::new(),
            sentinels: Vec::new(),
            dir,
        };
        set.start_node(primary, None);
        let replica = free_port();
        set.start_node(replica, Some(primary));
        wait_until("the replica in sync", || {
            let info = info(replica, "replication");
            info.contains("master_link_status:up")
        });
        for _ in 0..3 {
            let port = free_port();
            let conf = set.dir.join(format!("sentinel-{port}.conf"));
            let sdir = set.dir.join(format!("sentinel-{port}"));
            std::fs::create_dir_all(&sdir).unwrap();
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n\
                     sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {primary} 2\n\
                     sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n\
                     sentinel failover-timeout {SENTINEL_MASTER} 4000\n\
                     sentinel parallel-syncs {SENTINEL_MASTER} 1\n",
                    sdir.display()
                ),
            )
            .unwrap();
            let mut child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server must be installed (apt-get install redis-server)");
            wait_for_ping(port, "sentinel", &mut child);
            set.sentinels.push((port, child));
        }
        set.wait_settled(2);
        set
    }

    fn start_node(&mut self, port: u16, replica_of: Option<u16>) {
        let dir = self.dir.join(format!("node-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let of = replica_of.map(|p| p.to_string());
        let mut extra = vec![];
        if let Some(of) = &of {
            extra = vec!["--replicaof", "127.0.0.1", of.as_str()];
        }
        let mut redis = Redis::spawn(port, dir, &extra);
        wait_for_ping(port, "redis-server", &mut redis.child);
        self.nodes.push(redis);
    }

    /// The sentinels' `host:port` addresses, as a TOML array's elements.
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect()
    }

    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|(p, _)| *p).collect()
    }

    /// Waits until every sentinel knows the other two and `nodes` data
    /// nodes (the primary and its replicas) with a replica in sync.
    pub fn wait_settled(&self, nodes: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let settled = self.sentinels.iter().all(|(port, _)| {
                let Ok(mut c) = Client::try_connect(*port) else {
                    return false;
                };
                let master = c.cmd(&["SENTINEL", "MASTER", SENTINEL_MASTER]);
                let num = |name: &str| match field(&master, name) {
                    Some(Value::Bulk(b)) => String::from_utf8_lossy(&b).parse().unwrap_or(-1),
                    _ => -1,
                };
                let flags = match field(&master, "flags") {
                    Some(Value::Bulk(b)) => String::from_utf8_lossy(&b).into_owned(),
                    _ => String::new(),
                };
                flags == "master"
                    && num("num-other-sentinels") == 2
                    && num("num-slaves") >= nodes as i64 - 1
            });
            if settled {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels never settled on one primary and {nodes} nodes"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The primary's port, as the first sentinel that answers names it.
    pub fn primary(&self) -> u16 {
        for (port, _) in &self.sentinels {
            let Ok(mut c) = Client::try_connect(*port) else {
                continue;
            };
            if let Value::Array(a) =
                c.cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER])
            {
                if let Some(Value::Bulk(p)) = a.get(1) {
                    return String::from_utf8_lossy(p).parse().unwrap();
                }
            }
        }
        panic!("no sentinel names a primary");
    }

    /// SIGKILL of the primary, as a crash; returns its port.
    pub fn kill9_primary(&mut self) -> u16 {
        let primary = self.primary();
        let i = self.nodes.iter().position(|r| r.port == primary).unwrap();
        let mut node = self.nodes.remove(i);
        node.kill();
        primary
    }

    /// SIGSTOP of the primary: its connections stay open but nothing on
    /// them is answered, as behind a network partition. Returns its port.
    pub fn freeze_primary(&mut self) -> u16 {
        let primary = self.primary();
        let node = self.nodes.iter().find(|r| r.port == primary).unwrap();
        let status = Command::new("kill")
            .args(["-STOP", &node.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        primary
    }

    /// Waits until the sentinels name a primary other than `old`; returns it.
    pub fn wait_failover(&self, old: u16) -> u16 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let now = self.primary();
            if now != old {
                return now;
            }
            assert!(Instant::now() < deadline, "no failover from {old}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts a node afresh on `port` (no data) as a replica of the
    /// primary, so that writes can be acknowledged by a replica again.
    pub fn restart_as_replica(&mut self, port: u16) {
        let primary = self.primary();
        self.start_node(port, Some(primary));
        wait_until("the restarted replica in sync", || {
            info(port, "replication").contains("master_link_status:up")
        });
        // A candidate for the next failover once every sentinel sees it up.
        let want = Value::bulk(&port.to_string());
        wait_until("the sentinels seeing the restarted replica", || {
            self.sentinels.iter().all(|(sp, _)| {
                let Ok(mut c) = Client::try_connect(*sp) else {
                    return false;
                };
                let Ok(Value::Array(replicas)) =
                    c.try_cmd(&["SENTINEL", "REPLICAS", SENTINEL_MASTER])
                else {
                    return false;
                };
                replicas.iter().any(|r| {
                    field(r, "port") == Some(want.clone())
                        && field(r, "flags") == Some(Value::bulk("slave"))
                })
            })
        });
    }
}

impl Drop for SentinelSet {
    fn drop(&mut self) {
        let nodes = self.nodes.iter_mut().map(|r| &mut r.child);
        for child in self.sentinels.iter_mut().map(|(_, c)| c).chain(nodes) {
            stop_child(child, Duration::from_secs(3));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `INFO section` of the Redis on `port`, empty while it cannot be read.
pub fn info(port: u16, section: &str) -> String {
    let Ok(mut c) = Client::try_connect(port) else {
        return String::new();
    };
    match c.try_cmd(&["INFO", section]) {
        Ok(Value::Bulk(b)) => String::from_utf8_lossy(&b).into_owned(),
        _ => String::new(),
    }
}

/// The built ackproxy binary, killed on drop.
pub struct Proxy {
    pub port: u16,
    child: Child,
}

impl Proxy {
    /// ackproxy in front of `upstream_port` with extra command-line flags.
    pub fn start(upstream_port: u16, extra: &[&str]) -> Proxy {
        Proxy::start_on(free_port(), upstream_port, extra)
    }

    pub fn start_on(port: u16, upstream_port: u16, extra: &[&str]) -> Proxy {
        let (listen, upstream) = (
            format!("127.0.0.1:{port}"),
            format!("127.0.0.1:{upstream_port}"),
        );
        let mut args = vec!["--listen", &listen, "--upstream", &upstream];
        args.extend_from_slice(extra);
        let mut child = Proxy::spawn(&args);
        wait_for_ping(port, "ackproxy", &mut child);
        Proxy { port, child }
    }

    /// ackproxy with exactly these arguments, up once `ready` holds: for
    /// one that answers no plain PING on `port` (TLS only).
    pub fn start_when(port: u16, args: &[&str], ready: impl FnMut() -> bool) -> Proxy {
        let mut child = Proxy::spawn(args);
        wait_until_ready(port, "ackproxy", &mut child, ready);
        Proxy { port, child }
    }

    fn spawn(args: &[&str]) -> Child {
        Proxy::spawn_limited(args, None)
    }

    /// With `nofile`, the process may open that many descriptors at most.
    fn spawn_limited(args: &[&str], nofile: Option<u64>) -> Child {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ackproxy"));
        cmd.args(args)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null());
        if let Some(n) = nofile {
            use std::os::unix::process::CommandExt;
            // SAFETY: only setrlimit, async-signal-safe, between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        cmd.spawn().expect("ackproxy binary")
    }

    /// Like [`Proxy::start_with_config`], with the proxy's open-file limit
    /// at `nofile`: running out of descriptors without opening thousands.
    pub fn start_with_config_nofile(
        upstream_port: u16,
        toml: &str,
        extra: &[&str],
        nofile: u64,
    ) -> Proxy {
        let path = std::env::temp_dir().join(format!("ackproxy-test-{}.toml", free_port()));
        std::fs::write(&path, toml).unwrap();
        let port = free_port();
        let (listen, upstream) = (
            format!("127.0.0.1:{port}"),
            format!("127.0.0.1:{upstream_port}"),
        );
        let mut args = vec![
            "--listen",
            &listen,
            "--upstream",
            &upstream,
            "--config",
            path.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let mut child = Proxy::spawn_limited(&args, Some(nofile));
        wait_for_ping(port, "ackproxy", &mut child);
        Proxy { port, child }
    }

    /// ackproxy in front of `upstream_port` reading the configuration file
    /// `config` (which the test may rewrite), logging at `info` into `log`.
    pub fn start_logged(upstream_port: u16, config: &Path, log: &Path) -> Proxy {
        let port = free_port();
        let (listen, upstream) = (
            format!("127.0.0.1:{port}"),
            format!("127.0.0.1:{upstream_port}"),
        );
        let mut child = Command::new(env!("CARGO_BIN_EXE_ackproxy"))
            .args(["--listen", &listen, "--upstream", &upstream, "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("log file"))
            .spawn()
            .expect("ackproxy binary");
        wait_for_ping(port, "ackproxy", &mut child);
        Proxy { port, child }
    }

    /// SIGHUP: the proxy reloads its configuration.
    pub fn hangup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// ackproxy with a TOML config file written from `toml`.
    pub fn start_with_config(upstream_port: u16, toml: &str, extra: &[&str]) -> Proxy {
        let path = std::env::temp_dir().join(format!("ackproxy-test-{}.toml", free_port()));
        std::fs::write(&path, toml).unwrap();
        let mut args = vec!["--config", path.to_str().unwrap()];
        args.extend_from_slice(extra);
        Proxy::start(upstream_port, &args)
    }

    /// ackproxy with exactly `--listen` and these arguments, up once it
    /// answers PING (through its upstream): for one that finds Redis
    /// through the sentinels.
    pub fn start_args(args: &[&str]) -> Proxy {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut all = vec!["--listen", &listen];
        all.extend_from_slice(args);
        let mut child = Proxy::spawn(&all);
        wait_for_ping(port, "ackproxy", &mut child);
        Proxy { port, child }
    }

    pub fn client(&self) -> Client {
        Client::connect(self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, no clean-up: what a crash looks like.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for exit; returns whether it exited successfully.
    pub fn terminate(&mut self) -> bool {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A decoded reply, for assertions that do not need raw bytes.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Value>),
    /// Any RESP3-only type, kept raw.
    Other(Vec<u8>),
}

impl Value {
    pub fn bulk(s: &str) -> Value {
        Value::Bulk(s.as_bytes().to_vec())
    }
}

pub struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Client {
    pub fn connect(port: u16) -> Client {
        Client::try_connect(port).unwrap_or_else(|e| panic!("connect to {port}: {e}"))
    }

    /// The client's own address, as the proxy sees it.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.writer.local_addr().unwrap()
    }

    pub fn try_connect(port: u16) -> std::io::Result<Client> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Client {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
        })
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) {
        self.writer.set_read_timeout(t).unwrap();
    }

    pub fn stream(&self) -> &TcpStream {
        &self.writer
    }

    pub fn encode(args: &[&[u8]]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).unwrap();
    }

    pub fn send(&mut self, args: &[&str]) {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        self.send_raw(&Client::encode(&a));
    }

    pub fn send_bin(&mut self, args: &[&[u8]]) {
        self.send_raw(&Client::encode(args));
    }

    /// One reply, exactly as its bytes arrived.
    pub fn read_raw(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        self.read_raw_into(&mut out).expect("read reply");
        out
    }

    pub fn try_read_raw(&mut self) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.read_raw_into(&mut out)?;
        Ok(out)
    }

    fn read_line(&mut self, out: &mut Vec<u8>) -> std::io::Result<String> {
        let start = out.len();
        let n = self.reader.read_until(b'\n', out)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(String::from_utf8_lossy(&out[start + 1..out.len() - 2]).into_owned())
    }

    fn read_raw_into(&mut self, out: &mut Vec<u8>) -> std::io::Result<()> {
        let start = out.len();
        let line = self.read_line(out)?;
        match out[start] {
            b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Ok(()),
            b'$' | b'!' | b'=' => {
                let n: i64 = line.parse().unwrap();
                if n >= 0 {
                    let at = out.len();
                    out.resize(at + n as usize + 2, 0);
                    self.reader.read_exact(&mut out[at..])?;
                }
                Ok(())
            }
            b'*' | b'~' | b'>' | b'%' | b'|' => {
                let n: i64 = line.parse().unwrap();
                let per = if matches!(out[start], b'%' | b'|') {
                    2
                } else {
                    1
                };
                for _ in 0..(n.max(0) * per) {
                    self.read_raw_into(out)?;
                }
                if out[start] == b'|' {
                    self.read_raw_into(out)?;
                }
                Ok(())
            }
            other => panic!("unexpected reply byte {:?}", other as char),
        }
    }

    pub fn read_value(&mut self) -> Value {
        let raw = self.read_raw();
        decode(&raw).0
    }

    /// Send one command and read its reply as a value.
    pub fn cmd(&mut self, args: &[&str]) -> Value {
        self.send(args);
        self.read_value()
    }

    pub fn cmd_bin(&mut self, args: &[&[u8]]) -> Value {
        self.send_bin(args);
        self.read_value()
    }

    /// Like [`Client::cmd`], with a connection that may be closed under it
    /// (a proxy or a Redis going away) reported rather than a panic.
    pub fn try_cmd(&mut self, args: &[&str]) -> std::io::Result<Value> {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        (&self.writer).write_all(&Client::encode(&a))?;
        let raw = self.try_read_raw()?;
        Ok(decode(&raw).0)
    }

    /// Send one command and read its reply as raw bytes.
    pub fn raw(&mut self, args: &[&str]) -> Vec<u8> {
        self.send(args);
        self.read_raw()
    }
}

/// Decode one RESP2/RESP3 value from the start of `b`; returns it and its length.
pub fn decode(b: &[u8]) -> (Value, usize) {
    let end = b.windows(2).position(|w| w == b"\r\n").unwrap();
    let line = String::from_utf8_lossy(&b[1..end]).into_owned();
    let after = end + 2;
    match b[0] {
        b'+' => (Value::Simple(line), after),
        b'-' => (Value::Error(line), after),
        b':' => (Value::Int(line.parse().unwrap()), after),
        b'_' => (Value::Nil, after),
        b'$' => {
            let n: i64 = line.parse().unwrap();
            if n < 0 {
                (Value::Nil, after)
            } else {
                let n = n as usize;
                (Value::Bulk(b[after..after + n].to_vec()), after + n + 2)
            }
        }
        b'*' | b'~' | b'>' => {
            let n: i64 = line.parse().unwrap();
            if n < 0 {
                return (Value::Nil, after);
            }
            let mut at = after;
            let mut items = Vec::new();
            for _ in 0..n {
                let (v, used) = decode(&b[at..]);
                items.push(v);
                at += used;
            }
            (Value::Array(items), at)
        }
        b'%' => {
            let n: usize = line.parse().unwrap();
            let mut at = after;
            let mut items = Vec::new();
            for _ in 0..n * 2 {
                let (v, used) = decode(&b[at..]);
                items.push(v);
                at += used;
            }
            (Value::Array(items), at)
        }
        _ => (Value::Other(b.to_vec()), b.len()),
    }
}

/// The value after `name` in a field/value reply (a RESP2 flat array).
pub fn field(v: &Value, name: &str) -> Option<Value> {
    let Value::Array(items) = v else {
        return None;
    };
    items
        .chunks(2)
        .find(|pair| pair[0] == Value::bulk(name))
        .map(|pair| pair[1].clone())
}

/// Polls `done` until it holds, failing after `what` did not happen for
/// 20 seconds.
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One series of the proxy's Prometheus endpoint on `port`, -1 while it
/// cannot be read. A labelled series is named with its labels as the
/// endpoint writes them (see [`series`]).
pub fn metric(port: u16, name: &str) -> f64 {
    let Ok(reply) = http(port, "GET", "/metrics", &[], b"") else {
        return -1.0;
    };
    series_value(&reply.text(), name).unwrap_or(-1.0)
}

/// The endpoint's whole text, if it answers.
pub fn scrape(port: u16) -> Option<String> {
    http(port, "GET", "/metrics", &[], b"")
        .ok()
        .map(|r| r.text())
}

/// The value of one series in a scraped text.
pub fn series_value(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// A series name with labels, in the exporter's order and quoting:
/// `series("x_total", &[("rule", "jobs")])` is `x_total{rule="jobs"}`.
pub fn series(name: &str, labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return name.to_string();
    }
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    format!("{name}{{{}}}", labels.join(","))
}

/// Waits until the series has the value `want` (metrics change after the
/// reply that caused them, and gauges when sampled), then asserts it.
pub fn await_metric(port: u16, name: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = metric(port, name);
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: expected {want}, still {got}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A queue's totals (`ackq:{TAG}:Q:stats`): the one auxiliary key that
/// outlives the queue's messages, by design (it expires on its own).
pub fn is_queue_stats(key: &str) -> bool {
    key.starts_with("ackq:") && key.ends_with(":stats")
}

/// An HTTP response: status, headers (names lower-cased), body.
pub struct HttpReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpReply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One HTTP/1.1 request to 127.0.0.1:`port` on a connection of its own
/// (closed after the reply); `headers` may override `Host`.
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<HttpReply> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
    }
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    // Some servers keep the connection open whatever the request says:
    // the reply ends where its length or its last chunk says.
    let mut r = BufReader::new(s);
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP reply");
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(bad)?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(bad());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (n, v) = l.split_once(':').ok_or_else(bad)?;
        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let reply = HttpReply {
        status,
        headers,
        body: Vec::new(),
    };
    let mut body = Vec::new();
    if reply
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let size = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size, 16).map_err(|_| bad())?;
            if size == 0 {
                break;
            }
            let at = body.len();
            body.resize(at + size + 2, 0);
            r.read_exact(&mut body[at..])?;
            body.truncate(at + size);
        }
    } else if let Some(n) = reply.header("content-length") {
        body.resize(n.parse().map_err(|_| bad())?, 0);
        r.read_exact(&mut body)?;
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok(HttpReply { body, ..reply })
}

/// A small xorshift generator: test sequences replay from their seed.
pub struct Rng(pub u64);

impl Rng {
    /// Seeded from the clock; the seed is printed so a failure can be replayed.
    pub fn from_clock() -> Rng {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        println!("rng seed {seed}");
        Rng(seed | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform-ish in `0..n` (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A process's resident memory, in kB.
pub fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Everything a connection receives until the peer closes it.
pub fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            // Closing with unread input pending makes the kernel reset the
            // connection; Redis does the same.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return out,
            Err(e) => panic!(
                "connection not closed: {e} (got {:?})",
                String::from_utf8_lossy(&out)
            ),
        }
    }
}
