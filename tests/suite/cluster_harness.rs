//! A real Redis Cluster (three primaries, three replicas): the slot map
//! read from it agrees with what its nodes say, redirections during and
//! after a slot migration name the right node, and a killed primary's
//! replica takes its slots.

use std::collections::BTreeSet;

use crate::common::{cluster_nodes, Client, ClusterSet, Value};
use ackproxy::cluster::key_slot;
use ackproxy::cluster::map::{parse_redirect, Redirect, SlotMap};

fn addr(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

fn shards(port: u16) -> SlotMap {
    let raw = Client::connect(port).raw(&["CLUSTER", "SHARDS"]);
    let reply = redis::parse_redis_value(&raw).expect("a CLUSTER SHARDS reply");
    SlotMap::from_shards(&reply, "127.0.0.1").expect("a slot map")
}

fn slots(port: u16) -> SlotMap {
    let raw = Client::connect(port).raw(&["CLUSTER", "SLOTS"]);
    let reply = redis::parse_redis_value(&raw).expect("a CLUSTER SLOTS reply");
    SlotMap::from_slots(&reply, "127.0.0.1").expect("a slot map")
}

/// The error `GET key` gets from the node on `port`, as raw bytes.
fn get_error(port: u16, key: &str) -> Vec<u8> {
    let raw = Client::connect(port).raw(&["GET", key]);
    assert_eq!(
        raw[0],
        b'-',
        "GET {key} on {port}: {:?}",
        String::from_utf8_lossy(&raw)
    );
    raw
}

/// Both maps, read from every node, agree with CLUSTER NODES on every
/// slot's owner and every primary's replicas.
fn check_maps(cluster: &ClusterSet) {
    let nodes = cluster_nodes(cluster.primaries()[0]);
    let owner = |slot: u16| {
        nodes
            .iter()
            .find(|n| n.is_primary() && !n.failed() && n.owns(slot))
            .map(|n| addr(n.port))
    };
    for port in cluster.ports() {
        for map in [shards(port), slots(port)] {
            assert!(map.covers_all(), "from {port}");
            for slot in 0..16384u16 {
                assert_eq!(
                    map.primary_of(slot).map(String::from),
                    owner(slot),
                    "slot {slot} from {port}"
                );
            }
            let primaries: BTreeSet<String> = map.primaries().iter().cloned().collect();
            let want: BTreeSet<String> = cluster.primaries().into_iter().map(addr).collect();
            assert_eq!(primaries, want, "from {port}");
            for p in cluster.primaries() {
                let got: BTreeSet<&str> = map
                    .replicas_of(&addr(p))
                    .iter()
                    .map(String::as_str)
                    .collect();
                let want: Vec<String> = cluster.replicas_of(p).into_iter().map(addr).collect();
                let want: BTreeSet<&str> = want.iter().map(String::as_str).collect();
                assert_eq!(got, want, "replicas of {p} from {port}");
            }
        }
    }
}

#[test]
fn slot_map_redirects_and_failover_on_a_real_cluster() {
    let mut cluster = ClusterSet::start(3, 1);
    assert_eq!(cluster.primaries().len(), 3);
    assert_eq!(cluster.ports().len(), 6);
    check_maps(&cluster);

    // Keys hash where CLUSTER KEYSLOT says, and live on the primary the
    // map names; any other primary redirects there.
    let map = shards(cluster.primaries()[0]);
    let mut seed = Client::connect(cluster.primaries()[0]);
    for i in 0..50 {
        let key = format!("key:{i}");
        assert_eq!(
            seed.cmd(&["CLUSTER", "KEYSLOT", &key]),
            Value::Int(i64::from(key_slot(key.as_bytes())))
        );
        let owner = cluster.primary_of_key(&key);
        let slot = key_slot(key.as_bytes());
        assert_eq!(map.primary_of(slot), Some(addr(owner).as_str()));
        let other = cluster
            .primaries()
            .into_iter()
            .find(|&p| p != owner)
            .unwrap();
        assert_eq!(
            parse_redirect(&get_error(other, &key)),
            Some(Redirect::Moved {
                slot,
                addr: addr(owner)
            }),
            "{key}"
        );
    }

    // A slot with more keys than one MIGRATE batch moves to another primary.
    let tag = "{moving}";
    let slot = key_slot(tag.as_bytes());
    let from = cluster.owner(slot);
    let to = cluster
        .primaries()
        .into_iter()
        .find(|&p| p != from)
        .unwrap();
    let mut c = Client::connect(from);
    for i in 0..250 {
        let key = format!("{tag}:{i}");
        assert_eq!(
            c.cmd(&["SET", &key, &i.to_string()]),
            Value::Simple("OK".into())
        );
    }
    let mut before = shards(from);
    cluster.begin_migration(slot, from, to);
    // Keys still on the source are served there.
    assert_eq!(c.cmd(&["GET", "{moving}:1"]), Value::bulk("1"));
    cluster.move_keys(slot, from, to);
    let ask = Some(Redirect::Ask {
        slot,
        addr: addr(to),
    });
    assert_eq!(parse_redirect(&get_error(from, "{moving}:1")), ask);
    // The target sends a client that did not say ASKING back to the owner.
    assert_eq!(
        parse_redirect(&get_error(to, "{moving}:1")),
        Some(Redirect::Moved {
            slot,
            addr: addr(from)
        })
    );
    let mut t = Client::connect(to);
    assert_eq!(t.cmd(&["ASKING"]), Value::Simple("OK".into()));
    assert_eq!(t.cmd(&["GET", "{moving}:249"]), Value::bulk("249"));
    cluster.end_migration(slot, from, to);
    let moved = parse_redirect(&get_error(from, "{moving}:1"));
    assert_eq!(
        moved,
        Some(Redirect::Moved {
            slot,
            addr: addr(to)
        })
    );
    assert_eq!(t.cmd(&["GET", "{moving}:7"]), Value::bulk("7"));
    // The map corrected by that MOVED is the cluster's new one.
    let Some(Redirect::Moved { slot: s, addr: a }) = moved else {
        unreachable!()
    };
    before.set_owner(s, &a);
    let after = shards(to);
    for slot in 0..16384u16 {
        assert_eq!(
            before.primary_of(slot),
            after.primary_of(slot),
            "slot {slot}"
        );
    }
    check_maps(&cluster);

    // redis-cli --cluster reshard moves slots as well.
    let owned = |port: u16| {
        cluster_nodes(port)
            .iter()
            .find(|n| n.port == port)
            .map(|n| {
                n.slots
                    .iter()
                    .map(|(a, b)| u32::from(b - a) + 1)
                    .sum::<u32>()
            })
            .unwrap()
    };
    let (from_before, to_before) = (owned(from), owned(to));
    cluster.reshard(10, from, to);
    assert_eq!(owned(from), from_before - 10);
    assert_eq!(owned(to), to_before + 10);
    check_maps(&cluster);

    // A primary dies: its replica takes over its slots.
    let victim = cluster.primary_of_key("key:0");
    let replicas = cluster.replicas_of(victim);
    assert_eq!(replicas.len(), 1);
    cluster.kill9(victim);
    let new = cluster.wait_failover(victim);
    assert_eq!(new, replicas[0]);
    assert_eq!(cluster.primary_of_key("key:0"), new);
    assert!(!cluster.primaries().contains(&victim));
    let map = shards(new);
    assert!(map.covers_all());
    assert_eq!(map.primary_of(key_slot(b"key:0")), Some(addr(new).as_str()));
    assert!(!map.primaries().contains(&addr(victim)));
    check_maps(&cluster);
}
