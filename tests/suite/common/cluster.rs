//! A Redis Cluster of local nodes, and what tests read of its layout.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::process::{assert_success, free_port, fresh_dir, stop_child, wait_for_ping};
use super::{info, wait_until_within, Client, Redis, Value};

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
#[derive(Default)]
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
        let mut set = ClusterSet::default();
        set.dir = fresh_dir(dir);
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
        assert_success(&out, "redis-cli --cluster create");
        set.wait_settled(primaries, replicas);
        set
    }

    fn start_node(&mut self, port: u16) {
        let dir = fresh_dir(self.dir.join(format!("node-{port}")));
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
        assert_success(&out, "redis-cli --cluster reshard");
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
