//! A Sentinel-monitored primary and replica.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::process::{free_port, fresh_dir, stop_child, wait_for_ping};
use super::{field, wait_replica_in_sync, wait_until, Client, Redis, Value};

/// The master name the sentinels of a [`SentinelSet`] monitor.
pub const SENTINEL_MASTER: &str = "ackmaster";

/// A Sentinel-monitored Redis on free loopback ports: a primary, a replica
/// and three sentinels (`redis-server <conf> --sentinel`: no separate
/// redis-sentinel binary needed), quick to fail over (down after 1 s).
/// Every process is torn down by its PID, SIGTERM then SIGKILL.
#[derive(Default)]
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
        let mut set = SentinelSet::default();
        set.dir = fresh_dir(dir);
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
        let dir = fresh_dir(self.dir.join(format!("node-{port}")));
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
