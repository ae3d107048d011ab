//! A Redis Cluster upstream: clients that know nothing of the cluster talk
//! to ackproxy as to one Redis. Against a real local cluster: replies for
//! keys in one slot are byte for byte those of a single Redis; commands
//! split over slots or sent to every node answer as one Redis would;
//! cross-slot commands get Redis Cluster's own error; and queues keep
//! every message through a resharding, with no client ever seeing a
//! redirection.
//!
//! The long resharding run runs with `ACKPROXY_LONG_TESTS=1`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;

fn start_proxy(cluster: &ClusterSet, extra: &[&str]) -> Proxy {
    let seed = cluster.seed();
    let mut args = vec!["--upstream-mode", "cluster", "--upstream", seed.as_str()];
    args.extend_from_slice(extra);
    Proxy::start_args(&args)
}

fn start_proxy_with(cluster: &ClusterSet, toml: &str) -> Proxy {
    let file = TempFile::new(
        "ackproxy-test",
        "toml",
        &format!(
            "upstream_mode = \"cluster\"\nupstream = {:?}\n{toml}",
            cluster.seed()
        ),
    );
    Proxy::start_args(&["--config", file.as_arg()]).owning(file)
}

/// Runs `words` with `{t}` standing for a hash tag.
fn tagged(words: &[&str], tag: &str) -> Vec<String> {
    words.iter().map(|w| w.replace("{t}", tag)).collect()
}

#[test]
fn one_slot_replies_match_one_redis() {
    let cluster = ClusterSet::start(3, 0);
    let single = Redis::start();
    let proxy = start_proxy(&cluster, &[]);
    let mut c = Pair::new(&single, &proxy);
    // Every node's slots, one tag on each.
    for tag in ["{a}", "{b}", "{c}"] {
        let corpus: &[&[&str]] = &[
            &["SET", "{t}s", "v"],
            &["GET", "{t}s"],
            &["APPEND", "{t}s", "w"],
            &["GETRANGE", "{t}s", "0", "-1"],
            &["INCR", "{t}n"],
            &["INCRBYFLOAT", "{t}n", "1.5"],
            &["INCR", "{t}s"],
            &["SET", "{t}x", "1", "EX", "100"],
            &["TTL", "{t}x"],
            &["PERSIST", "{t}x"],
            &["TYPE", "{t}x"],
            &["RPUSH", "{t}l", "a", "b", "c", "d"],
            &["LRANGE", "{t}l", "0", "-1"],
            &["LPOP", "{t}l", "2"],
            &["LMOVE", "{t}l", "{t}l2", "LEFT", "RIGHT"],
            &["RPOPLPUSH", "{t}l", "{t}l2"],
            &["LRANGE", "{t}l2", "0", "-1"],
            &["HSET", "{t}h", "f", "1", "g", "2"],
            &["HGETALL", "{t}h"],
            &["HINCRBY", "{t}h", "f", "5"],
            &["SADD", "{t}a", "1", "2", "3"],
            &["SADD", "{t}b", "2", "3", "4"],
            &["SINTER", "{t}a", "{t}b"],
            &["SUNIONSTORE", "{t}u", "{t}a", "{t}b"],
            &["SCARD", "{t}u"],
            &["ZADD", "{t}z", "1", "a", "2", "b", "3", "c"],
            &["ZRANGE", "{t}z", "0", "-1", "WITHSCORES"],
            &[
                "ZUNIONSTORE",
                "{t}zu",
                "2",
                "{t}z",
                "{t}z",
                "WEIGHTS",
                "1",
                "2",
            ],
            &["ZRANGE", "{t}zu", "0", "-1", "WITHSCORES"],
            &["XADD", "{t}st", "1-1", "f", "v"],
            &["XRANGE", "{t}st", "-", "+"],
            &["XLEN", "{t}st"],
            &["MSET", "{t}m1", "1", "{t}m2", "2"],
            &["MGET", "{t}m1", "{t}m2", "{t}none"],
            &["DEL", "{t}m1", "{t}m2", "{t}none"],
            &["EXISTS", "{t}s", "{t}h"],
            &["RENAME", "{t}s", "{t}s2"],
            &["GET", "{t}s2"],
            &["LPUSH", "{t}s2", "x"],
            &["GET"],
            &["NOSUCHCOMMAND", "{t}s2"],
            &["EVAL", "return redis.call('GET', KEYS[1])", "1", "{t}s2"],
            &["EVAL", "return #KEYS", "2", "{t}a", "{t}b"],
            &["BLPOP", "{t}empty", "0.05"],
            &["BRPOP", "{t}l2", "1"],
            &["OBJECT", "ENCODING", "{t}h"],
            &["ECHO", "hello"],
            &["PING"],
        ];
        for words in corpus {
            let words = tagged(words, tag);
            let args: Vec<&str> = words.iter().map(String::as_str).collect();
            c.same(&args);
        }
        // A pipeline and a transaction, each in one slot.
        let pipeline: Vec<u8> = (0..50)
            .flat_map(|i| Client::encode(&[b"INCR", format!("{tag}p{}", i % 5).as_bytes()]))
            .collect();
        c.same_raw(&pipeline, 50);
        let tx = tagged(&["{t}tx"], tag).remove(0);
        c.same(&["MULTI"]);
        c.same(&["SET", &tx, "1"]);
        c.same(&["INCRBY", &tx, "41"]);
        c.same(&["GET", &tx]);
        c.same(&["EXEC"]);
        c.same(&["WATCH", &tx]);
        c.same(&["MULTI"]);
        c.same(&["INCR", &tx]);
        c.same(&["EXEC"]);
    }
}

#[test]
fn split_and_fanned_out_commands_answer_as_one_redis() {
    let cluster = ClusterSet::start(3, 0);
    let single = Redis::start();
    let proxy = start_proxy(&cluster, &[]);
    let mut c = Pair::new(&single, &proxy);
    let keys: Vec<String> = (0..40).map(|i| format!("key:{i}")).collect();
    let mut mset = vec!["MSET".to_string()];
    for k in &keys {
        mset.push(k.clone());
        mset.push(format!("value of {k}"));
    }
    fn run(c: &mut Pair, v: Vec<String>) {
        let words: Vec<&str> = v.iter().map(String::as_str).collect();
        c.same(&words);
    }
    run(&mut c, mset);
    let with = |name: &str, extra: &[&str]| {
        let mut v = vec![name.to_string()];
        v.extend(extra.iter().map(|s| s.to_string()));
        v.extend(keys.iter().rev().cloned());
        v
    };
    run(&mut c, with("MGET", &["missing:1", "key:3"]));
    run(&mut c, with("EXISTS", &["key:1", "missing"]));
    run(&mut c, with("TOUCH", &[]));
    c.same(&["DBSIZE"]);
    // KEYS and SCAN: the same keys, in whatever order the nodes give them.
    let sorted_keys = |v: Value| -> Vec<Vec<u8>> {
        let Value::Array(items) = v else {
            panic!("not an array: {v:?}")
        };
        let mut out: Vec<Vec<u8>> = items
            .into_iter()
            .map(|i| match i {
                Value::Bulk(b) => b,
                other => panic!("not a key: {other:?}"),
            })
            .collect();
        out.sort();
        out
    };
    assert_eq!(
        sorted_keys(c.proxied.cmd(&["KEYS", "key:*"])),
        sorted_keys(c.direct.cmd(&["KEYS", "key:*"]))
    );
    let mut scanned = Vec::new();
    let mut cursor = "0".to_string();
    let mut calls = 0;
    loop {
        let Value::Array(reply) = c.proxied.cmd(&["SCAN", &cursor, "COUNT", "7"]) else {
            panic!("SCAN reply")
        };
        calls += 1;
        let Value::Bulk(next) = &reply[0] else {
            panic!("SCAN cursor")
        };
        scanned.extend(sorted_keys(reply[1].clone()));
        cursor = String::from_utf8(next.clone()).unwrap();
        if cursor == "0" {
            break;
        }
        assert!(calls < 1000, "SCAN does not end");
    }
    scanned.sort();
    scanned.dedup();
    assert_eq!(scanned, sorted_keys(c.direct.cmd(&["KEYS", "*"])));
    // Any number is a cursor to Redis, also one no SCAN gave: its low
    // byte names no node here (it was "ERR invalid cursor").
    for cursor in ["255", "18446744073709551615"] {
        let Value::Array(reply) = c.proxied.cmd(&["SCAN", cursor]) else {
            panic!("SCAN {cursor}")
        };
        assert_eq!(reply.len(), 2, "SCAN {cursor}: {reply:?}");
    }
    assert!(matches!(
        c.proxied.cmd(&["SCAN", "x"]),
        Value::Error(ref e) if e == "ERR invalid cursor"
    ));
    assert!(matches!(c.proxied.cmd(&["RANDOMKEY"]), Value::Bulk(_)));
    run(&mut c, with("UNLINK", &["missing"]));
    c.same(&["DBSIZE"]);
    c.same(&["RANDOMKEY"]);
    c.same(&["SET", "a", "1"]);
    c.same(&["SET", "b", "2"]);
    c.same(&["DEL", "a", "b", "c"]);
    c.same(&["FLUSHALL"]);
    c.same(&["DBSIZE"]);
    // A script loaded through the proxy runs on every node.
    let sha = c.same(&["SCRIPT", "LOAD", "return KEYS[1]"]);
    let sha = String::from_utf8_lossy(&sha);
    let sha = sha.lines().nth(1).unwrap().to_string();
    for k in ["a", "b", "c", "d"] {
        c.same(&["EVALSHA", &sha, "1", k]);
    }
    c.same(&["SCRIPT", "EXISTS", &sha, "0000"]);
}

#[test]
fn cross_slot_commands_get_redis_clusters_error() {
    let cluster = ClusterSet::start(3, 0);
    let proxy = start_proxy(&cluster, &[]);
    let mut p = proxy.client();
    let node = cluster.primary_of_key("a");
    let mut direct = Client::connect(node);
    for args in [
        &["RENAME", "a", "b"][..],
        &["MSETNX", "a", "1", "b", "2"],
        &["SUNIONSTORE", "a", "b", "c"],
        &["RPOPLPUSH", "a", "b"],
        &["EVAL", "return 1", "2", "a", "b"],
        &["BLMOVE", "a", "b", "LEFT", "LEFT", "0"],
        &["SINTER", "a", "b"],
    ] {
        let d = direct.raw(args);
        let got = p.raw(args);
        assert!(
            String::from_utf8_lossy(&d).starts_with("-CROSSSLOT"),
            "Redis Cluster itself answers {args:?} with {:?}",
            String::from_utf8_lossy(&d)
        );
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&d),
            "{args:?}"
        );
    }
}

/// The first key `<prefix><n>` in `slot`.
fn key_in_slot(prefix: &str, slot: u16) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|k| key_slot(k) == slot)
        .unwrap()
}

/// A primary other than `port`.
fn another_primary(cluster: &ClusterSet, port: u16) -> u16 {
    cluster
        .primaries()
        .into_iter()
        .find(|p| *p != port)
        .unwrap()
}

#[test]
fn a_request_to_a_moved_slot_is_followed_not_shown() {
    let cluster = ClusterSet::start(3, 0);
    let proxy = start_proxy(&cluster, &[]);
    let mut c = proxy.client();
    let slot = 866; // "{a}"'s slot is 15495; "key:866"… any slot works
    let key = key_in_slot("k", slot);
    assert_eq!(c.cmd(&["SET", &key, "before"]), Value::Simple("OK".into()));
    let from = cluster.owner(slot);
    let to = another_primary(&cluster, from);
    // Half-way: keys of the slot on both nodes, the slot migrating.
    cluster.begin_migration(slot, from, to);
    let other = key_in_slot("m", slot);
    // A key the source does not have: Redis answers ASK.
    assert_eq!(
        c.cmd(&["SET", &other, "during"]),
        Value::Simple("OK".into())
    );
    assert_eq!(c.cmd(&["GET", &key]), Value::bulk("before"));
    cluster.move_keys(slot, from, to);
    assert_eq!(c.cmd(&["GET", &other]), Value::bulk("during"));
    cluster.end_migration(slot, from, to);
    // The proxy's map still says `from`: Redis answers MOVED.
    assert_eq!(c.cmd(&["GET", &key]), Value::bulk("before"));
    assert_eq!(c.cmd(&["SET", &key, "after"]), Value::Simple("OK".into()));
    assert_eq!(
        Client::connect(to).cmd(&["GET", &key]),
        Value::bulk("after")
    );
}

/// When the old owner of a slot learns it moved (`CLUSTER SETSLOT … NODE`)
/// before the new owner does, each sends the request to the other until
/// both know: the proxy waits that out rather than give the client the
/// `-MOVED` (it gave it after five hops).
#[test]
fn nodes_that_disagree_for_a_moment_show_the_client_no_redirect() {
    let cluster = ClusterSet::start(3, 0);
    let proxy = start_proxy(&cluster, &[]);
    let mut c = proxy.client();
    let slot = 4242;
    let key = key_in_slot("k", slot);
    assert_eq!(c.cmd(&["SET", &key, "v"]), Value::Simple("OK".into()));
    let from = cluster.owner(slot);
    let to = another_primary(&cluster, from);
    cluster.begin_migration(slot, from, to);
    cluster.move_keys(slot, from, to);
    let s = slot.to_string();
    let to_id = cluster.id(to);
    let node = |port: u16| {
        let reply = Client::connect(port).cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
        assert_eq!(reply, Value::Simple("OK".into()));
    };
    // The old owner first: it now answers MOVED to the new one, which,
    // still importing, answers MOVED back.
    node(from);
    let (s2, to_id2) = (s.clone(), to_id.clone());
    let later = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(400));
        Client::connect(to).cmd(&["CLUSTER", "SETSLOT", &s2, "NODE", &to_id2])
    });
    for _ in 0..3 {
        assert_eq!(c.cmd(&["GET", &key]), Value::bulk("v"));
    }
    assert_eq!(later.join().unwrap(), Value::Simple("OK".into()));
    cluster.end_migration(slot, from, to);
    assert_eq!(c.cmd(&["GET", &key]), Value::bulk("v"));
}

/// MIGRATE of one key from `from` to `to` (its slot migrating).
fn migrate_key(from: u16, to: u16, key: &str) {
    let to = to.to_string();
    let reply = Client::connect(from).cmd(&["MIGRATE", "127.0.0.1", &to, key, "0", "10000"]);
    assert_eq!(reply, Value::Simple("OK".into()), "MIGRATE {key}");
}

/// Clients on their own connection to a node (the durable-push recipe's
/// WATCH, a transaction, a transaction under WATCH) while their slot
/// moves, with the old owner told first or last: no redirection reaches
/// them. A pinned request follows the slot to its new owner; a transaction
/// a node turned away runs again there; one under a WATCH whose keys moved
/// fails as Redis fails it when they change.
#[test]
fn pinned_connections_see_no_redirect_while_their_slot_moves() {
    let cluster = ClusterSet::start(3, 0);
    let proxy = start_proxy_with(&cluster, "connect_timeout_ms = 5000\n");
    let ok = Value::Simple("OK".into());
    let queued = Value::Simple("QUEUED".into());
    for (slot, source_first) in [(1200u16, false), (1201, true)] {
        let (q, k) = (key_in_slot("q", slot), key_in_slot("k", slot));
        let from = cluster.owner(slot);
        let to = another_primary(&cluster, from);
        let mut producer = proxy.client();
        assert_eq!(producer.cmd(&["WATCH", &q]), ok);
        assert_eq!(producer.cmd(&["LPUSH", &q, "a"]), Value::Int(1));
        assert_eq!(producer.cmd(&["WAIT", "0", "0"]), Value::Int(0));
        let mut tx = proxy.client();
        assert_eq!(tx.cmd(&["SET", &k, "1"]), ok);
        assert_eq!(tx.cmd(&["MULTI"]), ok);
        assert_eq!(tx.cmd(&["INCR", &k]), queued);
        let mut guarded = proxy.client();
        assert_eq!(guarded.cmd(&["WATCH", &k]), ok);
        // The slot migrating, the queue's key already on the new owner: the
        // old one answers ASK for it until the move ends, then MOVED.
        cluster.begin_migration(slot, from, to);
        migrate_key(from, to, &q);
        std::thread::scope(|scope| {
            let ending = scope.spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                cluster.move_keys(slot, from, to);
                let gap = Duration::from_millis(400);
                cluster.end_migration_in_order(slot, from, to, source_first, gap);
            });
            let order = format!("old owner told first: {source_first}");
            assert_eq!(producer.cmd(&["LPUSH", &q, "b"]), Value::Int(2), "{order}");
            assert_eq!(producer.cmd(&["WAIT", "0", "0"]), Value::Int(0));
            assert_eq!(tx.cmd(&["INCR", &k]), queued);
            assert_eq!(
                tx.cmd(&["EXEC"]),
                Value::Array(vec![Value::Int(2), Value::Int(3)]),
                "{order}"
            );
            assert_eq!(guarded.cmd(&["GET", &k]), Value::bulk("3"), "{order}");
            assert_eq!(guarded.cmd(&["MULTI"]), ok);
            assert_eq!(guarded.cmd(&["SET", &k, "guarded"]), queued);
            assert_eq!(guarded.cmd(&["EXEC"]), Value::Nil, "{order}");
            ending.join().unwrap();
        });
        // The pinned connections are on the new owner from now on.
        assert_eq!(producer.cmd(&["LPUSH", &q, "c"]), Value::Int(3));
        assert_eq!(guarded.cmd(&["WATCH", &k]), ok);
        assert_eq!(guarded.cmd(&["MULTI"]), ok);
        assert_eq!(guarded.cmd(&["SET", &k, "guarded"]), queued);
        assert_eq!(guarded.cmd(&["EXEC"]), Value::Array(vec![ok.clone()]));
        assert_eq!(
            Client::connect(to).cmd(&["LRANGE", &q, "0", "-1"]),
            Value::bulks(&["c", "b", "a"])
        );
        assert_eq!(
            Client::connect(to).cmd(&["GET", &k]),
            Value::bulk("guarded")
        );
    }
}

/// A node whose cluster is down answers CLUSTERDOWN: a pinned client's
/// request is tried again until the cluster is up, and once the connect
/// timeout has passed gets the error Redis gives, not a stall.
#[test]
fn a_pinned_request_waits_out_a_cluster_down_within_the_connect_timeout() {
    let cluster = ClusterSet::start(3, 0);
    let proxy = start_proxy_with(&cluster, "connect_timeout_ms = 3000\n");
    let ok = Value::Simple("OK".into());
    let slot = 2300;
    let q = key_in_slot("q", slot);
    let node = cluster.owner(slot);
    // Another slot of the same node, taken from it: its cluster is down.
    let gone = (0..16384u16)
        .find(|&s| s != slot && cluster.owner(s) == node)
        .unwrap()
        .to_string();
    let mut producer = proxy.client();
    assert_eq!(producer.cmd(&["WATCH", &q]), ok);
    let down = |on: bool| {
        let how = if on { "DELSLOTS" } else { "ADDSLOTS" };
        assert_eq!(Client::connect(node).cmd(&["CLUSTER", how, &gone]), ok);
    };
    for (outage, answered) in [
        (Duration::from_millis(800), true),
        (Duration::from_secs(6), false),
    ] {
        down(true);
        wait_until_within("the node's cluster down", Duration::from_secs(10), || {
            cluster_info(node).contains("cluster_state:fail")
        });
        let (reply, took) = std::thread::scope(|scope| {
            let pushed = scope.spawn(|| {
                let started = Instant::now();
                let reply = producer.cmd(&["LPUSH", &q, "m"]);
                (reply, started.elapsed())
            });
            std::thread::sleep(outage);
            down(false);
            pushed.join().unwrap()
        });
        if answered {
            assert!(matches!(reply, Value::Int(_)), "{reply:?}");
        } else {
            assert!(
                matches!(&reply, Value::Error(e) if e.starts_with("CLUSTERDOWN")),
                "{reply:?}"
            );
            assert!(took < Duration::from_secs(5), "answered after {took:?}");
        }
        wait_until_within("the node's cluster up", Duration::from_secs(10), || {
            cluster_info(node).contains("cluster_state:ok")
        });
    }
}

/// Queues `jobs:N`, one on each of the three primaries.
fn queue_on_each_primary(cluster: &ClusterSet) -> Vec<String> {
    let mut queues: Vec<String> = Vec::new();
    let mut owners = HashSet::new();
    for i in 0.. {
        let q = format!("jobs:{i}");
        if owners.insert(cluster.owner(key_slot(&q))) {
            queues.push(q);
        }
        if queues.len() == 3 {
            break;
        }
    }
    queues
}

/// Redis Cluster's slot of a key (CRC16 of its hash tag).
fn key_slot(key: &str) -> u16 {
    ackproxy::cluster::key_slot(key.as_bytes())
}

const QUEUES: usize = 6;

/// What the resharding run saw.
#[derive(Default)]
struct Tally {
    pushed: Mutex<HashSet<String>>,
    acked: Mutex<HashMap<String, usize>>,
    deliveries: AtomicUsize,
    redirects: Mutex<Vec<String>>,
    errors: AtomicUsize,
    /// INCRs answered, per plain key.
    incrs: Mutex<HashMap<String, i64>>,
    /// Transactions (MULTI, two INCRs, EXEC) that ran.
    transactions: AtomicUsize,
    /// Transactions under WATCH that ran, and that were aborted.
    guarded: AtomicUsize,
    guarded_aborted: AtomicUsize,
    /// The reshards are over: the producer stops.
    resharded: AtomicBool,
    stop: AtomicBool,
}

/// The `i`th queue of the run: names whose hash slots are among the
/// cluster's lowest (below 100), which every resharding round of the run
/// moves.
fn queue_name(i: usize) -> String {
    (0..)
        .map(|n| format!("jobs:{n}"))
        .filter(|q| key_slot(q) < 100)
        .nth(i)
        .unwrap()
}

fn consumer(port: u16, queue: String, tally: Arc<Tally>) {
    let mut c = Client::connect(port);
    c.set_read_timeout(Some(Duration::from_secs(30)));
    while !tally.stop.load(Ordering::Relaxed) {
        match c.cmd(&["BRPOP", &queue, "1"]) {
            Value::Array(kv) => {
                let Some(Value::Bulk(p)) = kv.get(1) else {
                    panic!("BRPOP reply {kv:?}")
                };
                tally.deliveries.fetch_add(1, Ordering::Relaxed);
                let payload = String::from_utf8_lossy(p).into_owned();
                let id = payload.split('"').nth(3).expect("a JSON id").to_string();
                match c.cmd(&["ACK", &queue, &id]) {
                    Value::Int(1) => *tally.acked.lock().unwrap().entry(id).or_default() += 1,
                    Value::Int(_) => {}
                    other => note_error(&tally, &format!("ACK: {other:?}")),
                }
            }
            Value::Nil => {}
            other => note_error(&tally, &format!("BRPOP: {other:?}")),
        }
    }
}

fn note_error(tally: &Tally, what: &str) {
    if ["MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN"]
        .iter()
        .any(|r| what.contains(r))
    {
        tally.redirects.lock().unwrap().push(what.to_string());
    }
    tally.errors.fetch_add(1, Ordering::Relaxed);
}

/// Pushes at least `messages`, and goes on (paced) until the reshards are
/// over, so that they happen under load.
fn producer(port: u16, messages: usize, tally: Arc<Tally>) {
    let mut c = Client::connect(port);
    for n in 0.. {
        if n >= messages && tally.resharded.load(Ordering::Relaxed) {
            return;
        }
        if n % 20 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let id = format!("{n:012}");
        let payload = format!("{{\"id\":\"{id}\",\"body\":\"x\"}}");
        let queue = queue_name(n % QUEUES);
        loop {
            match c.cmd(&["LPUSH", &queue, &payload]) {
                Value::Int(_) => break,
                other => {
                    note_error(&tally, &format!("LPUSH: {other:?}"));
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        tally.pushed.lock().unwrap().insert(id);
    }
}

/// The `i`th key named `prefix…` whose slot every move of the run moves.
fn moved_key(prefix: &str, i: usize) -> String {
    (0..)
        .map(|n| format!("{prefix}{n}"))
        .filter(|k| key_slot(k) < 100)
        .nth(i)
        .unwrap()
}

/// Pushes with the durable-push recipe: WATCH of the queue (which pins
/// the connection to its node), then LPUSH and WAIT, until the producers
/// stop. Its ids start with "d".
fn durable_producer(port: u16, tally: Arc<Tally>) {
    let mut c = Client::connect(port);
    let mut watched = None;
    for n in 0.. {
        if tally.resharded.load(Ordering::Relaxed) {
            return;
        }
        let queue = queue_name(n % QUEUES);
        if watched.as_ref() != Some(&queue) {
            match c.cmd(&["WATCH", &queue]) {
                Value::Simple(_) => watched = Some(queue.clone()),
                other => note_error(&tally, &format!("WATCH: {other:?}")),
            }
        }
        let id = format!("d{n:011}");
        let payload = format!("{{\"id\":\"{id}\",\"body\":\"x\"}}");
        match c.cmd(&["LPUSH", &queue, &payload]) {
            Value::Int(_) => {
                tally.pushed.lock().unwrap().insert(id);
            }
            other => note_error(&tally, &format!("pinned LPUSH: {other:?}")),
        }
        match c.cmd(&["WAIT", "0", "0"]) {
            Value::Int(_) => {}
            other => note_error(&tally, &format!("WAIT: {other:?}")),
        }
        std::thread::sleep(Duration::from_millis(3));
    }
}

/// INCRs of plain keys, and transactions of two INCRs, plain and under
/// WATCH, until the run stops: each reply is checked, and counted for the
/// values at the end.
fn key_worker(port: u16, tally: Arc<Tally>) {
    let mut plain = Client::connect(port);
    let mut tx = Client::connect(port);
    let mut guarded = Client::connect(port);
    let tag = moved_key("t", 0);
    let (a, b, g) = (
        format!("a{{{tag}}}"),
        format!("b{{{tag}}}"),
        format!("g{{{tag}}}"),
    );
    let queued = Value::Simple("QUEUED".into());
    for n in 0.. {
        if tally.stop.load(Ordering::Relaxed) || tally.resharded.load(Ordering::Relaxed) {
            return;
        }
        let key = moved_key("plain:", n % 4);
        match plain.cmd(&["INCR", &key]) {
            Value::Int(_) => *tally.incrs.lock().unwrap().entry(key).or_default() += 1,
            other => note_error(&tally, &format!("INCR: {other:?}")),
        }
        tx.cmd(&["MULTI"]);
        for k in [&a, &b] {
            let reply = tx.cmd(&["INCR", k]);
            if reply != queued {
                note_error(&tally, &format!("queued INCR: {reply:?}"));
            }
        }
        match tx.cmd(&["EXEC"]) {
            Value::Array(r) if r.len() == 2 && r[0] == r[1] => {
                tally.transactions.fetch_add(1, Ordering::Relaxed);
            }
            other => note_error(&tally, &format!("EXEC: {other:?}")),
        }
        guarded.cmd(&["WATCH", &g]);
        let v = match guarded.cmd(&["GET", &g]) {
            Value::Bulk(v) => String::from_utf8(v).unwrap().parse::<i64>().unwrap(),
            Value::Nil => 0,
            other => {
                note_error(&tally, &format!("watched GET: {other:?}"));
                guarded.cmd(&["UNWATCH"]);
                continue;
            }
        };
        guarded.cmd(&["MULTI"]);
        let reply = guarded.cmd(&["SET", &g, &(v + 1).to_string()]);
        if reply != queued {
            note_error(&tally, &format!("queued SET: {reply:?}"));
        }
        match guarded.cmd(&["EXEC"]) {
            Value::Array(_) => tally.guarded.fetch_add(1, Ordering::Relaxed),
            Value::Nil => tally.guarded_aborted.fetch_add(1, Ordering::Relaxed),
            other => {
                note_error(&tally, &format!("watched EXEC: {other:?}"));
                0
            }
        };
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// What the key worker's counts say Redis holds.
fn check_keys(port: u16, tally: &Tally) {
    let mut c = Client::connect(port);
    for (key, n) in tally.incrs.lock().unwrap().iter() {
        assert_eq!(c.cmd(&["GET", key]), Value::bulk(&n.to_string()), "{key}");
    }
    let tag = moved_key("t", 0);
    let done = tally.transactions.load(Ordering::Relaxed).to_string();
    for k in [format!("a{{{tag}}}"), format!("b{{{tag}}}")] {
        assert_eq!(c.cmd(&["GET", &k]), Value::bulk(&done), "{k}");
    }
    let guarded = tally.guarded.load(Ordering::Relaxed).to_string();
    assert_eq!(
        c.cmd(&["GET", &format!("g{{{tag}}}")]),
        Value::bulk(&guarded)
    );
}

/// How the run moves the slots below 100 (those of its queues and keys).
#[derive(Clone, Copy)]
enum Moves {
    /// `redis-cli --cluster reshard` of all 100, `n` times.
    RedisCli(usize),
    /// By hand, slot by slot, `n` times: MIGRATE, then `CLUSTER SETSLOT …
    /// NODE` to the new owner first on even rounds and to the old owner
    /// first (with a gap) on odd ones.
    EitherOrder(usize),
}

/// Slots of the queues move between primaries while 20 consumers (half on
/// each of two proxies) pop and acknowledge, a producer pushes through a
/// pinned connection, and plain keys and transactions are written: every
/// message is acked, none is lost, every key holds what its replies said,
/// and no client sees a redirection.
fn resharding_run(messages: usize, moves: Moves) {
    let cluster = ClusterSet::start(3, 0);
    let rules = "connect_timeout_ms = 1000\n\
                 [[queue]]\npattern = \"jobs:*\"\nack_id = \"json:id\"\nlease_ms = 2000\n\
                 max_deliveries = 1000\n";
    let proxies = [
        start_proxy_with(&cluster, rules),
        start_proxy_with(&cluster, rules),
    ];
    let tally = Arc::new(Tally::default());
    let mut threads = Vec::new();
    for i in 0..20 {
        let (port, t) = (proxies[i % 2].port, tally.clone());
        threads.push(std::thread::spawn(move || {
            consumer(port, queue_name(i % QUEUES), t)
        }));
    }
    let producers = [
        {
            let (port, t) = (proxies[0].port, tally.clone());
            std::thread::spawn(move || producer(port, messages, t))
        },
        {
            let (port, t) = (proxies[1].port, tally.clone());
            std::thread::spawn(move || durable_producer(port, t))
        },
        {
            let (port, t) = (proxies[0].port, tally.clone());
            std::thread::spawn(move || key_worker(port, t))
        },
    ];
    let started = Instant::now();
    match moves {
        // `redis-cli --cluster reshard` moves the lowest 100 slots (every
        // queue's) from their owner to the next primary, round after
        // round, while the run goes on.
        Moves::RedisCli(rounds) => {
            for _ in 0..rounds {
                let from = cluster.owner(0);
                let primaries = cluster.primaries();
                let next =
                    (primaries.iter().position(|p| *p == from).unwrap() + 1) % primaries.len();
                cluster.reshard(100, from, primaries[next]);
                assert_eq!(
                    cluster.owner(0),
                    primaries[next],
                    "the reshard moved slot 0"
                );
            }
        }
        Moves::EitherOrder(rounds) => {
            let mut slots: Vec<u16> = (0..QUEUES).map(|i| key_slot(&queue_name(i))).collect();
            slots.extend((0..4).map(|i| key_slot(&moved_key("plain:", i))));
            slots.push(key_slot(&moved_key("t", 0)));
            slots.sort();
            slots.dedup();
            for round in 0..rounds {
                for &slot in &slots {
                    let from = cluster.owner(slot);
                    let primaries = cluster.primaries();
                    let to = primaries[(primaries.iter().position(|p| *p == from).unwrap() + 1)
                        % primaries.len()];
                    cluster.begin_migration(slot, from, to);
                    std::thread::sleep(Duration::from_millis(30));
                    cluster.move_keys(slot, from, to);
                    let gap = Duration::from_millis(150);
                    cluster.end_migration_in_order(slot, from, to, round % 2 == 1, gap);
                }
            }
        }
    }
    tally.resharded.store(true, Ordering::Relaxed);
    for p in producers {
        p.join().unwrap();
    }
    let messages = tally.pushed.lock().unwrap().len();
    wait_until_within("every message acked", Duration::from_secs(120), || {
        tally.acked.lock().unwrap().len() >= messages
    });
    tally.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let acked = tally.acked.lock().unwrap();
    let pushed = tally.pushed.lock().unwrap();
    let missing: Vec<&String> = pushed
        .iter()
        .filter(|id| !acked.contains_key(*id))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "never acked: {missing:?}");
    let redirects = tally.redirects.lock().unwrap();
    assert!(
        redirects.is_empty(),
        "clients saw {} redirections, the first: {:?}",
        redirects.len(),
        &redirects[..redirects.len().min(10)]
    );
    check_keys(proxies[1].port, &tally);
    let deliveries = tally.deliveries.load(Ordering::Relaxed);
    // Redelivered only what was leased when a pop or an ACK failed.
    let duplicates = deliveries - messages;
    assert!(
        duplicates <= 20 * (tally.errors.load(Ordering::Relaxed) + 1),
        "{duplicates} duplicate deliveries for {} errors",
        tally.errors.load(Ordering::Relaxed)
    );
    eprintln!(
        "resharding run: {messages} messages, {} transactions, {} guarded ({} aborted), \
         slots moved in {:?}, {deliveries} deliveries, {} errors",
        tally.transactions.load(Ordering::Relaxed),
        tally.guarded.load(Ordering::Relaxed),
        tally.guarded_aborted.load(Ordering::Relaxed),
        started.elapsed(),
        tally.errors.load(Ordering::Relaxed)
    );
}

#[test]
fn queues_keep_every_message_through_a_resharding() {
    resharding_run(3_000, Moves::RedisCli(3));
}

/// Slot by slot, the new owner told first, then the old owner first: the
/// two orders Redis Cluster's tools use.
#[test]
fn no_client_sees_a_redirection_through_slot_moves_in_either_order() {
    resharding_run(2_000, Moves::EitherOrder(2));
}

#[test]
fn long_resharding_run() {
    if std::env::var("ACKPROXY_LONG_TESTS").as_deref() != Ok("1") {
        return;
    }
    resharding_run(50_000, Moves::RedisCli(30));
}

#[test]
fn a_dead_letter_list_outside_its_queues_slot_is_refused_in_cluster_mode() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ackproxy"))
        .args([
            "--check-config",
            "--upstream-mode",
            "cluster",
            "--upstream",
            "127.0.0.1:7000",
            "--queues",
            "[[queue]]\npattern = \"jobs:*\"\ndead_letter = \"dead:$queue\"",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("jobs:*") && stderr.contains("hash slot"),
        "{stderr}"
    );
    // The default list, and one with the queue's tag, pass.
    for dead in ["", "dead_letter = \"{jobs}:dead\""] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ackproxy"))
            .args([
                "--check-config",
                "--upstream-mode",
                "cluster",
                "--upstream",
                "127.0.0.1:7000",
                "--queues",
                &format!("[[queue]]\npattern = \"jobs\"\n{dead}"),
            ])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{dead}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// What the failover run saw.
#[derive(Default)]
struct Seen {
    /// Payloads whose push a replica acknowledged (`WAIT 1` answered 1).
    pushed: Mutex<Vec<String>>,
    /// Payloads acknowledged by a worker, and when the ACK's reply came.
    acked: Mutex<HashMap<String, Instant>>,
    /// Payloads whose ACK got no reply (the primary died under it): it may
    /// have run.
    uncertain: Mutex<HashSet<String>>,
    reconnects: AtomicUsize,
    /// Redirections and cluster errors the pinned producers were shown.
    redirects: Mutex<Vec<String>>,
    stop_pushing: AtomicBool,
    stop: AtomicBool,
}

/// Whether `reply` is an error Redis Cluster's clients retry rather than show.
fn is_redirection(reply: &Value) -> bool {
    matches!(reply, Value::Error(e) if ["MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN"]
        .iter()
        .any(|r| e.starts_with(r)))
}

fn connect_again(port: u16, seen: &Seen) -> Option<Client> {
    loop {
        if seen.stop.load(Ordering::Relaxed) {
            return None;
        }
        if let Ok(c) = Client::try_connect(port) {
            c.set_read_timeout(Some(Duration::from_secs(10)));
            return Some(c);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn failover_worker(port: u16, queue: String, seen: Arc<Seen>) {
    let mut conn = connect_again(port, &seen);
    while let Some(c) = conn.as_mut() {
        if seen.stop.load(Ordering::Relaxed) {
            return;
        }
        let lost = match c.try_cmd(&["BRPOP", &queue, "1"]) {
            Ok(Value::Array(kv)) => {
                let Some(Value::Bulk(p)) = kv.get(1) else {
                    panic!("BRPOP reply {kv:?}")
                };
                let payload = String::from_utf8_lossy(p).into_owned();
                match c.try_cmd(&["ACK", &queue, &payload]) {
                    Ok(Value::Int(1)) => {
                        seen.acked
                            .lock()
                            .unwrap()
                            .entry(payload)
                            .or_insert_with(Instant::now);
                        false
                    }
                    Ok(Value::Error(e)) if e.contains("connection lost") => {
                        seen.uncertain.lock().unwrap().insert(payload);
                        false
                    }
                    // Not acknowledged: it comes again when its lease ends.
                    Ok(_) => false,
                    Err(_) => {
                        seen.uncertain.lock().unwrap().insert(payload);
                        true
                    }
                }
            }
            Ok(Value::Nil) => false,
            Ok(Value::Error(e)) => {
                assert!(
                    !e.starts_with("MOVED") && !e.starts_with("ASK"),
                    "a worker saw a redirection: {e}"
                );
                std::thread::sleep(Duration::from_millis(50));
                false
            }
            Ok(other) => panic!("BRPOP: {other:?}"),
            Err(_) => true,
        };
        if lost {
            seen.reconnects.fetch_add(1, Ordering::Relaxed);
            conn = connect_again(port, &seen);
        }
    }
}

/// Pushes to `queue`, each push followed by `WAIT 1` on a connection
/// pinned to the queue's node by a WATCH of the queue (so that WAIT
/// measures the push's own replication), until told to stop.
fn failover_producer(port: u16, queue: String, seen: Arc<Seen>) {
    let mut next = 0usize;
    let mut conn: Option<Client> = None;
    while !seen.stop_pushing.load(Ordering::Relaxed) {
        let c = match conn.as_mut() {
            Some(c) => c,
            None => {
                let Some(mut c) = connect_again(port, &seen) else {
                    return;
                };
                let watched = c.try_cmd(&["WATCH", &queue]);
                if let Some(reply) = watched.as_ref().ok().filter(|r| is_redirection(r)) {
                    seen.redirects
                        .lock()
                        .unwrap()
                        .push(format!("WATCH: {reply:?}"));
                }
                if watched.ok() != Some(Value::Simple("OK".into())) {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                conn.insert(c)
            }
        };
        let payload = format!("{queue}/m{next}");
        next += 1;
        let pushed = c
            .try_cmd(&["LPUSH", &queue, &payload])
            .and_then(|r| match r {
                Value::Int(_) => c.try_cmd(&["WAIT", "1", "2000"]).map(Some),
                r if is_redirection(&r) => {
                    seen.redirects.lock().unwrap().push(format!("LPUSH: {r:?}"));
                    Ok(None)
                }
                _ => Ok(None),
            });
        match pushed {
            Ok(Some(Value::Int(n))) if n >= 1 => seen.pushed.lock().unwrap().push(payload),
            Ok(_) => {
                // Not known replicated (it may still arrive); a connection
                // to a node that is no primary any more is let go.
                conn = None;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => {
                seen.reconnects.fetch_add(1, Ordering::Relaxed);
                conn = None;
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A primary killed with SIGKILL mid-run: every push a replica
/// acknowledged is acknowledged by a worker at least once, and workers
/// carry on by themselves. Prints the recovery time: from the kill to the
/// first message of the dead primary's queue acknowledged after it.
#[test]
fn a_killed_primary_loses_no_replicated_message() {
    let mut cluster = ClusterSet::start(3, 1);
    // Retries of a pinned request last up to the connect timeout: longer
    // than the failover (a node timeout of 2 s, then the election).
    let rules = "connect_timeout_ms = 8000\n\
                 [[queue]]\npattern = \"jobs:*\"\nlease_ms = 3000\nmax_deliveries = 1000\n";
    let proxy = start_proxy_with(&cluster, rules);
    let queues = queue_on_each_primary(&cluster);
    let seen = Arc::new(Seen::default());
    let mut threads = Vec::new();
    for q in &queues {
        for _ in 0..3 {
            let (port, q, s) = (proxy.port, q.clone(), seen.clone());
            threads.push(std::thread::spawn(move || failover_worker(port, q, s)));
        }
    }
    let producers: Vec<_> = queues
        .iter()
        .map(|q| {
            let (port, q, s) = (proxy.port, q.clone(), seen.clone());
            std::thread::spawn(move || failover_producer(port, q, s))
        })
        .collect();
    wait_until_within("pushes replicated", Duration::from_secs(60), || {
        seen.pushed.lock().unwrap().len() >= 300
    });
    let victim = cluster.owner(key_slot(&queues[0]));
    cluster.kill9(victim);
    let killed_at = Instant::now();
    let new = cluster.wait_failover(victim);
    eprintln!(
        "primary {victim} killed, {new} took over after {:?}",
        killed_at.elapsed()
    );
    let first_after = || {
        let prefix = format!("{}/", queues[0]);
        seen.acked
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, at)| p.starts_with(&prefix) && **at > killed_at)
            .map(|(_, at)| *at)
            .min()
    };
    wait_until_within("an ACK on the new primary", Duration::from_secs(60), || {
        first_after().is_some()
    });
    eprintln!(
        "recovery: {:?} from the kill to the first message of its queue acknowledged",
        first_after().unwrap() - killed_at
    );
    // The other queues' pushes go on meanwhile; the dead primary's queue
    // has no replica left to acknowledge its pushes.
    let before = seen.pushed.lock().unwrap().len();
    wait_until_within("more pushes replicated", Duration::from_secs(60), || {
        seen.pushed.lock().unwrap().len() >= before + 100
    });
    seen.stop_pushing.store(true, Ordering::Relaxed);
    for p in producers {
        p.join().expect("producer");
    }
    let pushed = seen.pushed.lock().unwrap().clone();
    let mut info = proxy.client();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let acked = seen.acked.lock().unwrap().clone();
        let missing: Vec<&String> = pushed.iter().filter(|p| !acked.contains_key(*p)).collect();
        if missing.is_empty() {
            break;
        }
        // An ACK that ran but whose reply was lost with the primary: its
        // message is nowhere any more.
        let uncertain = seen.uncertain.lock().unwrap().clone();
        let drained = queues.iter().all(|q| {
            let Value::Array(fields) = info.cmd(&["QUEUE", "INFO", q]) else {
                return false;
            };
            fields.chunks(2).all(|kv| match (&kv[0], kv.get(1)) {
                (Value::Bulk(k), Some(v))
                    if matches!(&k[..], b"ready" | b"leased" | b"delayed") =>
                {
                    *v == Value::Int(0)
                }
                _ => true,
            })
        });
        if missing.iter().all(|p| uncertain.contains(*p)) && drained {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} replicated pushes never acknowledged, e.g. {:?}",
            missing.len(),
            pushed.len(),
            &missing[..missing.len().min(10)]
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    seen.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("worker");
    }
    let redirects = seen.redirects.lock().unwrap();
    assert!(
        redirects.is_empty(),
        "pinned producers saw {} redirections, the first: {:?}",
        redirects.len(),
        &redirects[..redirects.len().min(10)]
    );
    eprintln!(
        "{} replicated pushes, {} acknowledged, {} reconnects",
        pushed.len(),
        seen.acked.lock().unwrap().len(),
        seen.reconnects.load(Ordering::Relaxed)
    );
}

/// Two proxies in front of one Redis, each announcing both: a
/// cluster-aware client (redis-py's RedisCluster, when installed) finds
/// them as a cluster, spreads its connections over both, and its keys and
/// queue work as through one.
#[test]
fn cluster_aware_clients_spread_over_the_announced_proxies() {
    let redis = Redis::start();
    let ports = [free_port(), free_port()];
    let announce = format!("127.0.0.1:{},127.0.0.1:{}", ports[0], ports[1]);
    let rules = "--queues=[[queue]]\npattern = \"jobs\"\nack_id = \"json:id\"";
    let proxies: Vec<Proxy> = ports
        .iter()
        .map(|p| Proxy::start_on(*p, redis.port, &["--cluster-announce", &announce, rules]))
        .collect();
    // The same answer from both, naming both.
    let slots = proxies[0].client().raw(&["CLUSTER", "SLOTS"]);
    assert_eq!(slots, proxies[1].client().raw(&["CLUSTER", "SLOTS"]));
    let text = String::from_utf8_lossy(&slots);
    assert!(text.starts_with("*2\r\n*3\r\n:0\r\n:8191\r\n"), "{text}");
    assert!(text.contains(&format!(":{}\r\n", ports[1])), "{text}");
    let mut c = proxies[1].client();
    assert_eq!(c.cmd(&["CLUSTER", "KEYSLOT", "foo"]), Value::Int(12182));
    let Value::Bulk(nodes) = c.cmd(&["CLUSTER", "NODES"]) else {
        panic!("CLUSTER NODES")
    };
    let nodes = String::from_utf8_lossy(&nodes).into_owned();
    assert!(
        nodes.contains(&format!("127.0.0.1:{}@0 myself,master", ports[1])),
        "{nodes}"
    );
    if !redis_py_installed() {
        return;
    }
    let script = r#"
import sys, json, redis
from redis.cluster import RedisCluster
rc = RedisCluster(host="127.0.0.1", port=int(sys.argv[1]), socket_timeout=30)
assert len(rc.get_primaries()) == 2, rc.get_primaries()
for i in range(200):
    rc.set(f"key:{i}", str(i))
for i in range(200):
    assert rc.get(f"key:{i}") == str(i).encode()
for i in range(20):
    rc.lpush("jobs", json.dumps({"id": f"m{i}"}))
acked = 0
for i in range(20):
    m = json.loads(rc.rpop("jobs"))
    acked += rc.execute_command("ACK", "jobs", m["id"], target_nodes=rc.get_random_node())
assert acked == 20, acked
used = [n.name for n in rc.get_nodes() if n.redis_connection and n.redis_connection.connection_pool._created_connections > 0]
print(sorted(used))
assert len(used) == 2, used
"#;
    python(script, &[&ports[0].to_string()]);
    // Nothing leased is left behind.
    let info = c.cmd(&["QUEUE", "INFO", "jobs"]);
    assert_eq!(field(&info, "leased"), Some(Value::Int(0)), "{info:?}");
}

#[test]
fn the_example_configuration_checks() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/config/cluster.toml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ackproxy"))
        .args(["--check-config", "--config", example])
        .output()
        .unwrap();
    assert_success(&out, "ackproxy --check-config");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("Redis Cluster, learnt from 127.0.0.1:7000,127.0.0.1:7001"),
        "{stdout}"
    );
}

/// A blocking pop parked on a queue of each node wakes as soon as its
/// queue gets a push: each primary's keyspace notifications are heard, not
/// polled for (the safety recheck alone would take a second).
#[test]
fn parked_pops_on_every_node_wake_on_a_push() {
    let cluster = ClusterSet::start(3, 0);
    let m = free_port();
    let proxy = {
        let seed = cluster.seed();
        let metrics = format!("127.0.0.1:{m}");
        Proxy::start_args(&[
            "--upstream-mode",
            "cluster",
            "--upstream",
            &seed,
            "--metrics",
            &metrics,
            "--queues",
            "[[queue]]\npattern = \"jobs:*\"",
        ])
    };
    let queues = queue_on_each_primary(&cluster);
    // A first pop turns the subscriptions on.
    let mut first = proxy.client();
    assert_eq!(first.cmd(&["BRPOP", &queues[0], "0.1"]), Value::Nil);
    wait_until("every node's keyspace notifications", || {
        metric(m, "ackproxy_wakeup_polling") == 0.0
    });
    for q in &queues {
        let mut waiter = proxy.client();
        waiter.send(&["BRPOP", q, "10"]);
        // Parked (the pop found nothing) before the push.
        wait_until("the pop parked", || {
            metric(m, "ackproxy_parked_clients") >= 1.0
        });
        let pushed = Instant::now();
        assert_eq!(proxy.client().cmd(&["LPUSH", q, "m"]), Value::Int(1));
        let reply = waiter.read_value();
        let took = pushed.elapsed();
        assert_eq!(reply, Value::bulks(&[q, "m"]));
        assert!(
            took < Duration::from_millis(700),
            "{q}: woken {took:?} after its push"
        );
    }
}
