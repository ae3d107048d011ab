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

/// A file in the temporary directory, removed when dropped: the
/// configuration files and logs tests write would otherwise pile up in
/// /tmp, a few hundred per run.
pub struct TempFile(PathBuf);

impl TempFile {
    /// `<temp dir>/<prefix>-<free port>.<ext>`, holding `contents`.
    pub fn new(prefix: &str, ext: &str, contents: &str) -> TempFile {
        let path = std::env::temp_dir().join(format!("{prefix}-{}.{ext}", free_port()));
        std::fs::write(&path, contents).unwrap();
        TempFile(path)
    }

    /// The path as a command-line argument.
    pub fn as_arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl std::ops::Deref for TempFile {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
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
        wait_replica_in_sync(replica, "the replica in sync");
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
        wait_replica_in_sync(port, "the restarted replica in sync");
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

/// A free loopback port below 55000 for a cluster node, whose cluster bus
/// (port + 10000) is free too.
pub fn cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// `CLUSTER INFO` of the node on `port`, empty while it cannot be read.
pub fn cluster_info(port: u16) -> String {
    let Ok(mut c) = Client::try_connect(port) else {
        return String::new();
    };
    match c.try_cmd(&["CLUSTER", "INFO"]) {
        Ok(Value::Bulk(b)) => String::from_utf8_lossy(&b).into_owned(),
        _ => String::new(),
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    pub id: String,
    pub port: u16,
    /// Without `myself`, which differs from node to node.
    pub flags: Vec<String>,
    /// The primary's id, for a replica.
    pub primary: Option<String>,
    /// Slot ranges owned, inclusive; slots being migrated are not listed.
    pub slots: Vec<(u16, u16)>,
}

impl ClusterNode {
    pub fn is_primary(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }

    pub fn failed(&self) -> bool {
        self.flags.iter().any(|f| f == "fail" || f == "fail?")
    }

    pub fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }
}

/// `CLUSTER NODES` as the node on `port` sees the cluster, sorted by port;
/// empty while it cannot be read.
pub fn cluster_nodes(port: u16) -> Vec<ClusterNode> {
    let Ok(mut c) = Client::try_connect(port) else {
        return Vec::new();
    };
    let Ok(Value::Bulk(text)) = c.try_cmd(&["CLUSTER", "NODES"]) else {
        return Vec::new();
    };
    let mut nodes: Vec<ClusterNode> = String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            // <id> <ip:port@cport[,hostname]> <flags> <primary> <ping-sent>
            // <pong-recv> <config-epoch> <link-state> <slot> ...
            let addr = f.get(1)?;
            let port = addr.split('@').next()?.rsplit_once(':')?.1.parse().ok()?;
            let slots = f
                .iter()
                .skip(8)
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(ClusterNode {
                id: f[0].to_string(),
                port,
                flags: f
                    .get(2)?
                    .split(',')
                    .filter(|f| *f != "myself")
                    .map(String::from)
                    .collect(),
                primary: f.get(3).filter(|m| **m != "-").map(|m| m.to_string()),
                slots,
            })
        })
        .collect();
    nodes.sort_by_key(|n| n.port);
    nodes
}

/// A Redis Cluster on free loopback ports: `primaries` primaries sharing
/// the slots, each with `replicas` replicas, made with
/// `redis-cli --cluster create` and quick to fail over (node timeout 2 s).
/// Every process is torn down by its PID, SIGTERM then SIGKILL.
pub struct ClusterSet {
    /// The nodes not killed.
    nodes: Vec<Redis>,
    /// Per node killed with [`ClusterSet::kill9`], a slot it owned then.
    lost: Vec<(u16, u16)>,
    dir: PathBuf,
}

impl ClusterSet {
    pub fn start(primaries: usize, replicas: usize) -> ClusterSet {
        let first = cluster_port();
        let dir = std::env::temp_dir().join(format!("ackproxy-test-cluster-{first}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut set = ClusterSet {
            nodes: Vec::new(),
            lost: Vec::new(),
            dir,
        };
        let total = primaries * (1 + replicas);
        let mut port = first;
        for _ in 0..total {
            set.start_node(port);
            port = cluster_port();
        }
        let mut cli = Command::new("redis-cli");
        cli.arg("--cluster").arg("create");
        for p in set.ports() {
            cli.arg(format!("127.0.0.1:{p}"));
        }
        let out = cli
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli must be installed (apt-get install redis-tools)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        set.wait_settled(primaries, replicas);
        set
    }

    fn start_node(&mut self, port: u16) {
        let dir = self.dir.join(format!("node-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("nodes.conf").display().to_string();
        let extra = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            &conf,
            "--cluster-node-timeout",
            "2000",
            // CLUSTER SHARDS calls a replica "loading" until its replication
            // offset moves: the primary's pings move it.
            "--repl-ping-replica-period",
            "1",
        ];
        let mut redis = Redis::spawn(port, dir, &extra);
        wait_for_ping(port, "redis-server (cluster node)", &mut redis.child);
        self.nodes.push(redis);
    }

    /// Waits until every node says the cluster is ok with every slot
    /// assigned, all of them see the same owners, and every replica is in
    /// sync with its primary and called online by every node.
    fn wait_settled(&self, primaries: usize, replicas: usize) {
        wait_until_within("the cluster formed", Duration::from_secs(90), || {
            let ports = self.ports();
            let all_ok = ports.iter().all(|&p| {
                let info = cluster_info(p);
                info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_assigned:16384")
                    && info.contains(&format!("cluster_known_nodes:{}", ports.len()))
            });
            if !all_ok || !self.agreed() {
                return false;
            }
            let view = cluster_nodes(ports[0]);
            let (prim, repl): (Vec<_>, Vec<_>) = view.iter().partition(|n| n.is_primary());
            prim.len() == primaries
                && repl.len() == primaries * replicas
                && repl
                    .iter()
                    .all(|r| info(r.port, "replication").contains("master_link_status:up"))
                && ports.iter().all(|&p| {
                    let Ok(mut c) = Client::try_connect(p) else {
                        return false;
                    };
                    let shards = c.try_cmd(&["CLUSTER", "SHARDS"]);
                    shards.is_ok_and(|s| !mentions(&s, "loading"))
                })
        });
    }

    /// Whether every node sees the same owner for every slot, and every
    /// slot has one.
    fn agreed(&self) -> bool {
        let owners = |port: u16| {
            let mut owned: Vec<(u16, u16, u16)> = cluster_nodes(port)
                .iter()
                .flat_map(|n| n.slots.iter().map(|&(a, b)| (a, b, n.port)))
                .collect();
            owned.sort();
            owned
        };
        let ports = self.ports();
        let first = owners(ports[0]);
        let covered: u32 = first.iter().map(|(a, b, _)| u32::from(b - a) + 1).sum();
        covered == 16384 && ports.iter().all(|&p| owners(p) == first)
    }

    /// `127.0.0.1:port` of a primary.
    pub fn seed(&self) -> String {
        format!("127.0.0.1:{}", self.primaries()[0])
    }

    /// The ports of the nodes running, primaries and replicas.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|r| r.port).collect()
    }

    /// The running primaries, as the cluster now says.
    pub fn primaries(&self) -> Vec<u16> {
        let live = self.ports();
        let view = live
            .iter()
            .map(|&p| cluster_nodes(p))
            .find(|v| !v.is_empty())
            .expect("no cluster node answers CLUSTER NODES");
        view.iter()
            .filter(|n| n.is_primary() && !n.failed() && live.contains(&n.port))
            .map(|n| n.port)
            .collect()
    }

    /// The node ID of the node on `port`.
    pub fn id(&self, port: u16) -> String {
        match Client::connect(port).cmd(&["CLUSTER", "MYID"]) {
            Value::Bulk(b) => String::from_utf8(b).unwrap(),
            other => panic!("CLUSTER MYID on {port}: {other:?}"),
        }
    }

    /// The port of the primary owning `key`'s slot.
    pub fn primary_of_key(&self, key: &str) -> u16 {
        let port = self.primaries()[0];
        let Value::Int(slot) = Client::connect(port).cmd(&["CLUSTER", "KEYSLOT", key]) else {
            panic!("CLUSTER KEYSLOT {key}");
        };
        self.owner(slot as u16)
    }

    /// The port of the primary owning `slot`, as the first running node says.
    pub fn owner(&self, slot: u16) -> u16 {
        let view = cluster_nodes(self.ports()[0]);
        view.iter()
            .find(|n| n.is_primary() && n.owns(slot))
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("no primary owns slot {slot}"))
    }

    /// The ports of the replicas of the primary on `port`.
    pub fn replicas_of(&self, port: u16) -> Vec<u16> {
        let id = self.id(port);
        let live = self.ports();
        cluster_nodes(port)
            .iter()
            .filter(|n| n.primary.as_deref() == Some(id.as_str()) && live.contains(&n.port))
            .map(|n| n.port)
            .collect()
    }

    /// SIGKILL of the node on `port`, as a crash.
    pub fn kill9(&mut self, port: u16) {
        let view = cluster_nodes(port);
        if let Some(&(slot, _)) = view
            .iter()
            .find(|n| n.port == port)
            .and_then(|n| n.slots.first())
        {
            self.lost.push((port, slot));
        }
        let i = self
            .nodes
            .iter()
            .position(|r| r.port == port)
            .unwrap_or_else(|| panic!("no running node on {port}"));
        let mut node = self.nodes.remove(i);
        node.kill();
    }

    /// Waits until a replica of the killed primary `old` has taken its
    /// slots and every running node says the cluster is ok again; returns
    /// the new primary's port.
    pub fn wait_failover(&self, old: u16) -> u16 {
        let slot = self
            .lost
            .iter()
            .find(|(p, _)| *p == old)
            .map(|(_, s)| *s)
            .unwrap_or_else(|| panic!("{old} was not a primary killed with kill9"));
        let mut new = 0;
        wait_until_within("the failover", Duration::from_secs(60), || {
            let ports = self.ports();
            let owners: Vec<Option<u16>> = ports
                .iter()
                .map(|&p| {
                    cluster_nodes(p)
                        .into_iter()
                        .find(|n| n.is_primary() && !n.failed() && n.owns(slot))
                        .map(|n| n.port)
                })
                .collect();
            let Some(Some(owner)) = owners.first().copied() else {
                return false;
            };
            new = owner;
            owner != old
                && owners.iter().all(|o| *o == Some(owner))
                && ports
                    .iter()
                    .all(|&p| cluster_info(p).contains("cluster_state:ok"))
        });
        new
    }

    /// Moves `slot` and its keys from the primary on `from` to the one on
    /// `to`, as `redis-cli --cluster reshard` moves a slot.
    pub fn migrate_slot(&self, slot: u16, from: u16, to: u16) {
        self.begin_migration(slot, from, to);
        self.move_keys(slot, from, to);
        self.end_migration(slot, from, to);
    }

    /// The slot is importing on `to`, migrating on `from`: from here `from`
    /// answers ASK for the slot's keys it no longer has.
    pub fn begin_migration(&self, slot: u16, from: u16, to: u16) {
        let slot = slot.to_string();
        let ok = Value::Simple("OK".into());
        let (from_id, to_id) = (self.id(from), self.id(to));
        let set = |port: u16, how: &str, id: &str| {
            let reply = Client::connect(port).cmd(&["CLUSTER", "SETSLOT", &slot, how, id]);
            assert_eq!(reply, ok, "CLUSTER SETSLOT {slot} {how} on {port}");
        };
        set(to, "IMPORTING", &from_id);
        set(from, "MIGRATING", &to_id);
    }

    /// MIGRATE of every key of `slot` from `from` to `to`, 100 at a time.
    pub fn move_keys(&self, slot: u16, from: u16, to: u16) {
        let mut c = Client::connect(from);
        loop {
            let Value::Array(keys) = c.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100"])
            else {
                panic!("CLUSTER GETKEYSINSLOT {slot} on {from}");
            };
            if keys.is_empty() {
                return;
            }
            let to = to.to_string();
            let mut args: Vec<&[u8]> = vec![
                b"MIGRATE",
                b"127.0.0.1",
                to.as_bytes(),
                b"",
                b"0",
                b"10000",
                b"KEYS",
            ];
            for k in &keys {
                let Value::Bulk(k) = k else {
                    panic!("a key: {k:?}");
                };
                args.push(k);
            }
            let reply = c.cmd_bin(&args);
            assert_eq!(reply, Value::Simple("OK".into()), "MIGRATE of slot {slot}");
        }
    }

    /// `to` owns the slot: told to the target, the source, then every other
    /// primary, as redis-cli does; waits until every node agrees.
    pub fn end_migration(&self, slot: u16, from: u16, to: u16) {
        self.end_migration_in_order(slot, from, to, false, Duration::ZERO);
    }

    /// `end_migration`, telling the old owner first when `source_first`
    /// (the two owners then send requests to each other until both know),
    /// with `gap` between the first node told and the second.
    pub fn end_migration_in_order(
        &self,
        slot: u16,
        from: u16,
        to: u16,
        source_first: bool,
        gap: Duration,
    ) {
        let s = slot.to_string();
        let to_id = self.id(to);
        let mut order = if source_first {
            vec![from, to]
        } else {
            vec![to, from]
        };
        order.extend(
            self.primaries()
                .into_iter()
                .filter(|p| *p != to && *p != from),
        );
        for (i, port) in order.into_iter().enumerate() {
            if i == 1 {
                std::thread::sleep(gap);
            }
            let reply = Client::connect(port).cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
            assert_eq!(
                reply,
                Value::Simple("OK".into()),
                "CLUSTER SETSLOT {slot} NODE on {port}"
            );
        }
        wait_until_within(
            "every node seeing the slot moved",
            Duration::from_secs(30),
            || {
                self.ports().iter().all(|&p| {
                    cluster_nodes(p)
                        .iter()
                        .any(|n| n.port == to && n.owns(slot))
                })
            },
        );
    }

    /// `count` slots from the primary on `from` to the one on `to`, moved by
    /// `redis-cli --cluster reshard`; waits until every node agrees.
    pub fn reshard(&self, count: usize, from: u16, to: u16) {
        let out = Command::new("redis-cli")
            .args(["--cluster", "reshard", &format!("127.0.0.1:{from}")])
            .args(["--cluster-from", &self.id(from)])
            .args(["--cluster-to", &self.id(to)])
            .args(["--cluster-slots", &count.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli must be installed (apt-get install redis-tools)");
        assert!(
            out.status.success(),
            "redis-cli --cluster reshard failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        wait_until_within(
            "every node seeing the reshard",
            Duration::from_secs(30),
            || self.agreed(),
        );
    }
}

/// Whether `v` has the bulk string `word` anywhere in it.
fn mentions(v: &Value, word: &str) -> bool {
    match v {
        Value::Bulk(b) => b == word.as_bytes(),
        Value::Array(items) => items.iter().any(|i| mentions(i, word)),
        _ => false,
    }
}

impl Drop for ClusterSet {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            stop_child(&mut node.child, Duration::from_secs(3));
        }
        // Each node's Drop removes its directory.
        self.nodes.clear();
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

/// The built ackproxy binary, killed on drop, with the files it was
/// started with (removed after it).
pub struct Proxy {
    pub port: u16,
    child: Child,
    files: Vec<TempFile>,
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
        Proxy::running(port, child)
    }

    /// ackproxy with exactly these arguments, up once `ready` holds: for
    /// one that answers no plain PING on `port` (TLS only).
    pub fn start_when(port: u16, args: &[&str], ready: impl FnMut() -> bool) -> Proxy {
        let mut child = Proxy::spawn(args);
        wait_until_ready(port, "ackproxy", &mut child, ready);
        Proxy::running(port, child)
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
        let file = TempFile::new("ackproxy-test", "toml", toml);
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
            file.as_arg(),
        ];
        args.extend_from_slice(extra);
        let mut child = Proxy::spawn_limited(&args, Some(nofile));
        wait_for_ping(port, "ackproxy", &mut child);
        Proxy::running(port, child).owning(file)
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
        Proxy::running(port, child)
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
        let file = TempFile::new("ackproxy-test", "toml", toml);
        let mut args = vec!["--config", file.as_arg()];
        args.extend_from_slice(extra);
        Proxy::start(upstream_port, &args).owning(file)
    }

    fn running(port: u16, child: Child) -> Proxy {
        Proxy {
            port,
            child,
            files: Vec::new(),
        }
    }

    /// Keeps `file` until the proxy is dropped, and removes it then.
    pub fn owning(mut self, file: TempFile) -> Proxy {
        self.files.push(file);
        self
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
        Proxy::running(port, child)
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
pub fn wait_until(what: &str, done: impl FnMut() -> bool) {
    wait_until_within(what, Duration::from_secs(20), done);
}

/// [`wait_until`] with a limit of its own, for what takes long on a loaded
/// machine (a cluster forming, a failover).
pub fn wait_until_within(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `state` until it says done (`None`), failing only once what it
/// says (`Some(state)`) has not changed for 20 seconds, or after `cap`: a
/// wait that follows what it waits for, which a loaded machine slows but
/// does not stop.
pub fn wait_following(what: &str, cap: Duration, mut state: impl FnMut() -> Option<String>) {
    let started = Instant::now();
    let mut last = String::new();
    let mut moved = Instant::now();
    while let Some(now) = state() {
        if now != last {
            (last, moved) = (now, Instant::now());
        }
        assert!(
            moved.elapsed() < Duration::from_secs(20) && started.elapsed() < cap,
            "timed out waiting for {what}, at: {last}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the replica on `port` is in sync with its primary, for as
/// long as its synchronisation makes progress.
pub fn wait_replica_in_sync(port: u16, what: &str) {
    wait_following(what, Duration::from_secs(180), || {
        let info = info(port, "replication");
        if info.contains("master_link_status:up") {
            return None;
        }
        // The link, the transfer and the offset: any of them moving is
        // progress.
        let progress: Vec<&str> = info
            .lines()
            .filter(|l| {
                [
                    "master_link_status:",
                    "master_sync_in_progress:",
                    "master_sync_read_bytes:",
                    "slave_read_repl_offset:",
                ]
                .iter()
                .any(|k| l.starts_with(k))
            })
            .collect();
        Some(progress.join(" "))
    });
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

/// Whether python3 with redis-py is installed; when it is not, says that
/// the test calling it is skipped.
pub fn redis_py_installed() -> bool {
    let has = std::process::Command::new("python3")
        .args(["-c", "import redis"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        println!("skipped: python3 with redis-py not found (pip install redis)");
    }
    has
}
