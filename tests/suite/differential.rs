//! Transparency: the same command sequence is sent to Redis A directly and
//! to Redis B through ackproxy (both start empty), and the raw reply bytes
//! must be identical — in the multiplexed mode and with one upstream
//! connection per client.

use std::time::Duration;

use crate::common::*;

fn corpus(extra: &[&str]) {
    let a = Redis::start();
    let b = Redis::start();
    let proxy = Proxy::start(b.port, extra);
    let mut c = Pair::new(&a, &proxy);

    data_types(&mut c);
    errors(&mut c);
    pipeline(&mut c);
    transactions(&mut c, &a, &proxy);
    blocking(&mut c, &a, &proxy);
    pubsub(&a, &proxy);
    connection_state(&mut c, &a, &proxy);
    scripts(&mut c);
    large(&mut c);
    inline_and_quit(&a, &proxy);
}

#[test]
fn transparent_multiplexed() {
    corpus(&[]);
}

#[test]
fn transparent_dedicated_per_client() {
    corpus(&["--dedicated-per-client"]);
}

fn data_types(c: &mut Pair) {
    for cmd in [
        // strings
        &["SET", "s", "hello"][..],
        &["GET", "s"],
        &["APPEND", "s", " world"],
        &["GETRANGE", "s", "0", "4"],
        &["SETRANGE", "s", "6", "there"],
        &["STRLEN", "s"],
        &["INCR", "n"],
        &["INCRBY", "n", "41"],
        &["INCRBYFLOAT", "n", "0.5"],
        &["DECR", "m"],
        &["SET", "bits", "\x0f"],
        &["SETBIT", "bits", "1", "1"],
        &["GETBIT", "bits", "1"],
        &["BITCOUNT", "bits"],
        &["BITPOS", "bits", "1"],
        &["BITOP", "NOT", "nbits", "bits"],
        &[
            "BITFIELD", "bf", "SET", "u8", "0", "200", "GET", "u8", "0", "INCRBY", "u8", "0", "100",
        ],
        &["MSET", "k1", "v1", "k2", "v2"],
        &["MGET", "k1", "k2", "missing"],
        &["SETNX", "k1", "x"],
        &["GETDEL", "k2"],
        &["SET", "ttl", "v", "PX", "100000"],
        &["EXISTS", "ttl", "k1", "nope"],
        &["TYPE", "k1"],
        // lists
        &["RPUSH", "l", "a", "b", "c", "d"],
        &["LPUSH", "l", "z"],
        &["LRANGE", "l", "0", "-1"],
        &["LINDEX", "l", "2"],
        &["LINSERT", "l", "BEFORE", "b", "x"],
        &["LPOS", "l", "c"],
        &["LSET", "l", "0", "first"],
        &["LREM", "l", "1", "x"],
        &["LTRIM", "l", "0", "3"],
        &["RPOP", "l"],
        &["LPOP", "l", "2"],
        &["LPOP", "nolist", "2"],
        &["RPOPLPUSH", "l", "l2"],
        &["LMOVE", "l2", "l", "LEFT", "RIGHT"],
        &["LMPOP", "2", "nolist", "l", "LEFT", "COUNT", "5"],
        &["LLEN", "l"],
        // hashes
        &["HSET", "h", "f1", "1", "f2", "2"],
        &["HGET", "h", "f1"],
        &["HINCRBY", "h", "f1", "5"],
        &["HMGET", "h", "f1", "f2", "f3"],
        &["HDEL", "h", "f2"],
        &["HEXISTS", "h", "f1"],
        &["HLEN", "h"],
        &["HKEYS", "h"],
        // sets
        &["SADD", "st", "a", "b", "c"],
        &["SISMEMBER", "st", "b"],
        &["SMISMEMBER", "st", "a", "z"],
        &["SCARD", "st"],
        &["SADD", "st2", "b", "c", "d"],
        &["SINTERCARD", "2", "st", "st2"],
        &["SMOVE", "st", "st2", "a"],
        // sorted sets
        &["ZADD", "z", "1", "a", "2", "b", "3", "c"],
        &["ZRANGE", "z", "0", "-1", "WITHSCORES"],
        &["ZRANGE", "z", "(1", "3", "BYSCORE"],
        &["ZRANGE", "z", "[a", "[b", "BYLEX"],
        &["ZREVRANGE", "z", "0", "1"],
        &["ZRANGEBYSCORE", "z", "-inf", "+inf", "LIMIT", "1", "1"],
        &["ZSCORE", "z", "b"],
        &["ZINCRBY", "z", "2.5", "a"],
        &["ZRANK", "z", "a"],
        &["ZCOUNT", "z", "1", "3"],
        &["ZPOPMIN", "z"],
        &["ZMPOP", "1", "z", "MAX"],
        &["ZCARD", "z"],
        // streams
        &["XADD", "x", "1-1", "f", "v"],
        &["XADD", "x", "2-1", "f", "w"],
        &["XLEN", "x"],
        &["XRANGE", "x", "-", "+"],
        &["XREVRANGE", "x", "+", "-", "COUNT", "1"],
        &["XREAD", "COUNT", "1", "STREAMS", "x", "0"],
        &["XGROUP", "CREATE", "x", "g", "0"],
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "c1",
            "COUNT",
            "1",
            "STREAMS",
            "x",
            ">",
        ],
        &["XPENDING", "x", "g"],
        &["XACK", "x", "g", "1-1"],
        &["XDEL", "x", "2-1"],
        // hyperloglog, geo
        &["PFADD", "hll", "a", "b", "c"],
        &["PFCOUNT", "hll"],
        &[
            "GEOADD",
            "geo",
            "13.361389",
            "38.115556",
            "Palermo",
            "15.087269",
            "37.502669",
            "Catania",
        ],
        &["GEODIST", "geo", "Palermo", "Catania", "km"],
        &["GEOPOS", "geo", "Palermo"],
        &[
            "GEOSEARCH",
            "geo",
            "FROMLONLAT",
            "15",
            "37",
            "BYRADIUS",
            "200",
            "km",
            "ASC",
        ],
        // keys
        &["RENAME", "k1", "k3"],
        &["DEL", "k3", "nope"],
        &["EXPIRE", "h", "1000"],
        &["PERSIST", "h"],
        &["DBSIZE"],
        &["ECHO", "echo"],
        &["PING"],
        &["PING", "hi"],
    ] {
        c.same(cmd);
    }
}

fn errors(c: &mut Pair) {
    for cmd in [
        &["NOSUCHCOMMAND", "x"][..],
        &["GET"],
        &["SET", "k"],
        &["LPUSH", "s", "x"],
        &["INCR", "s"],
        &["SET", "k", "v", "BADOPT"],
        &["LRANGE", "l", "a", "b"],
        &["EXPIRE", "k", "notanumber"],
        &["ZADD", "z", "nan", "m"],
        &["HSET", "h", "f"],
        &["BITFIELD", "bf", "GET", "u99", "0"],
        &["XADD", "x", "0-0", "f", "v"],
        &["CONFIG", "GET"],
        &["OBJECT", "FOO"],
        &["SELECT", "abc"],
        &["SELECT", "99"],
        &["EXEC"],
        &["DISCARD"],
        &["BLPOP", "l", "-1"],
        &["BLPOP", "l", "abc"],
    ] {
        c.same(cmd);
    }
}

fn pipeline(c: &mut Pair) {
    let mut bytes = Vec::new();
    let mut n = 0;
    for i in 0..150 {
        let key = format!("p{}", i % 7);
        let cmd: Vec<String> = match i % 6 {
            0 => vec!["INCR".into(), key],
            1 => vec!["GET".into(), key],
            2 => vec!["RPUSH".into(), format!("pl{}", i % 3), i.to_string()],
            3 => vec![
                "LRANGE".into(),
                format!("pl{}", i % 3),
                "0".into(),
                "-1".into(),
            ],
            4 => vec!["HINCRBY".into(), "ph".into(), key, "3".into()],
            _ => vec!["NOSUCH".into()],
        };
        let args: Vec<&[u8]> = cmd.iter().map(|s| s.as_bytes()).collect();
        bytes.extend_from_slice(&Client::encode(&args));
        n += 1;
    }
    c.same_raw(&bytes, n);
}

fn transactions(c: &mut Pair, a: &Redis, proxy: &Proxy) {
    c.same_raw(b"*1\r\n$5\r\nMULTI\r\n*3\r\n$3\r\nSET\r\n$2\r\ntx\r\n$1\r\n1\r\n*2\r\n$4\r\nINCR\r\n$2\r\ntx\r\n*1\r\n$4\r\nEXEC\r\n", 4);
    for cmd in [
        &["MULTI"][..],
        &["INCR", "tx"],
        &["DISCARD"],
        &["GET", "tx"],
    ] {
        c.same(cmd);
    }
    // A command that cannot be queued aborts the transaction.
    for cmd in [&["MULTI"][..], &["SET", "tx"], &["INCR", "tx"], &["EXEC"]] {
        c.same(cmd);
    }
    // Runtime errors inside EXEC, and nested MULTI.
    for cmd in [
        &["MULTI"][..],
        &["MULTI"],
        &["INCR", "s"],
        &["INCR", "tx"],
        &["EXEC"],
    ] {
        c.same(cmd);
    }
    // WATCH conflict: another client (on the same path) changes the key.
    let mut other_direct = a.client();
    let mut other_proxied = proxy.client();
    c.same(&["WATCH", "w"]);
    c.same(&["MULTI"]);
    c.same(&["SET", "w", "mine"]);
    other_direct.cmd(&["SET", "w", "theirs"]);
    other_proxied.cmd(&["SET", "w", "theirs"]);
    c.same(&["EXEC"]);
    c.same(&["GET", "w"]);
    // And without a conflict.
    for cmd in [
        &["WATCH", "w"][..],
        &["MULTI"],
        &["SET", "w", "mine"],
        &["EXEC"],
        &["GET", "w"],
    ] {
        c.same(cmd);
    }
    c.same(&["WATCH", "w"]);
    c.same(&["UNWATCH"]);
}

fn blocking(c: &mut Pair, a: &Redis, proxy: &Proxy) {
    let mut pusher_direct = a.client();
    let mut pusher_proxied = proxy.client();
    // Timeout 0, unblocked by another client's push.
    c.direct.send(&["BLPOP", "bq", "0"]);
    c.proxied.send(&["BLPOP", "bq", "0"]);
    std::thread::sleep(Duration::from_millis(100));
    pusher_direct.cmd(&["RPUSH", "bq", "x"]);
    pusher_proxied.cmd(&["RPUSH", "bq", "x"]);
    c.read_same("BLPOP unblocked by a push");
    // Fractional timeouts that expire.
    c.same(&["BLPOP", "bq", "0.1"]);
    c.same(&["BRPOPLPUSH", "bq", "bq2", "0.05"]);
    c.same(&["BLMOVE", "bq", "bq2", "LEFT", "RIGHT", "0.05"]);
    c.same(&["BZPOPMIN", "bz", "0.05"]);
    c.same(&["BLMPOP", "0.05", "1", "bq", "LEFT"]);
    c.same(&["XREAD", "BLOCK", "50", "STREAMS", "x", "$"]);
    // Data already there: no wait.
    c.same(&["RPUSH", "bq", "y", "z"]);
    c.same(&["BLMOVE", "bq", "bq2", "LEFT", "RIGHT", "0"]);
    c.same(&["ZADD", "bz", "1", "m"]);
    c.same(&["BZPOPMIN", "bz", "0"]);
    // The client is usable after blocking, and commands pipelined behind a
    // blocking one wait for it.
    c.same_raw(
        b"*3\r\n$5\r\nBLPOP\r\n$2\r\nbq\r\n$3\r\n0.1\r\n*2\r\n$3\r\nGET\r\n$1\r\ns\r\n",
        2,
    );
}

fn pubsub(a: &Redis, proxy: &Proxy) {
    for resp3 in [false, true] {
        let mut sub_d = a.client();
        let mut sub_p = proxy.client();
        let mut c = Pair::new(a, proxy);
        std::mem::swap(&mut c.direct, &mut sub_d);
        std::mem::swap(&mut c.proxied, &mut sub_p);
        if resp3 {
            let (d, p) = c.each(&["HELLO", "3"]);
            assert_eq!(mask_hello_id(&p), mask_hello_id(&d), "HELLO 3");
        }
        c.same(&["SUBSCRIBE", "ch1", "ch2"]);
        c.read_same("second subscribe confirmation");
        c.same(&["PSUBSCRIBE", "pat*"]);
        let mut pub_d = sub_d;
        let mut pub_p = sub_p;
        assert_eq!(
            pub_d.cmd(&["PUBLISH", "ch1", "hello"]),
            pub_p.cmd(&["PUBLISH", "ch1", "hello"])
        );
        c.read_same("message");
        pub_d.cmd(&["PUBLISH", "pattern", "p-hello"]);
        pub_p.cmd(&["PUBLISH", "pattern", "p-hello"]);
        c.read_same("pmessage");
        c.same(&["PING"]);
        c.same(&["UNSUBSCRIBE", "ch1"]);
        c.same(&["PUNSUBSCRIBE"]);
        c.same(&["UNSUBSCRIBE"]);
        if resp3 {
            // RESP3 allows ordinary commands on a subscribed connection.
            c.same(&["GET", "s"]);
        }
        c.same(&["RESET"]);
        c.same(&["GET", "s"]);
    }
}

fn connection_state(c: &mut Pair, a: &Redis, proxy: &Proxy) {
    // SELECT
    for cmd in [
        &["SELECT", "1"][..],
        &["SET", "indb1", "yes"],
        &["GET", "indb1"],
        &["DBSIZE"],
        &["SELECT", "0"],
        &["GET", "indb1"],
    ] {
        c.same(cmd);
    }
    // CLIENT SETNAME / GETNAME
    c.same(&["CLIENT", "GETNAME"]);
    c.same(&["CLIENT", "SETNAME", "worker-1"]);
    c.same(&["CLIENT", "GETNAME"]);
    c.same(&["CLIENT", "SETNAME", "bad name"]);
    // HELLO 3 and back.
    let (d, p) = c.each(&["HELLO", "3"]);
    assert_eq!(mask_hello_id(&p), mask_hello_id(&d));
    for cmd in [
        &["HGETALL", "h"][..],
        &["ZRANGE", "z", "0", "-1", "WITHSCORES"],
        &["GET", "missing"],
        &["SMEMBERS", "nosuchset"],
        &["INCRBYFLOAT", "n", "1"],
        &["HELLO", "4"],
    ] {
        c.same(cmd);
    }
    let (d, p) = c.each(&["HELLO", "2"]);
    assert_eq!(mask_hello_id(&p), mask_hello_id(&d));
    // AUTH as an ACL user, on fresh connections.
    let mut admin_d = a.client();
    let mut admin_p = proxy.client();
    let setuser = ["ACL", "SETUSER", "alice", "on", ">pw", "~*", "&*", "+@all"];
    assert_eq!(admin_d.raw(&setuser), admin_p.raw(&setuser));
    let mut u = Pair::new(a, proxy);
    u.same(&["AUTH", "alice", "wrong"]);
    u.same(&["AUTH", "alice", "pw"]);
    u.same(&["ACL", "WHOAMI"]);
    u.same(&["SET", "alice-key", "1"]);
    u.same(&["RESET"]);
    u.same(&["ACL", "WHOAMI"]);
    u.same(&["AUTH", "nobody", "x"]);
}

fn scripts(c: &mut Pair) {
    let body = "return {KEYS[1], ARGV[1], redis.call('INCR', KEYS[1])}";
    c.same(&["EVAL", body, "1", "ek", "arg"]);
    let sha = c.same(&["SCRIPT", "LOAD", body]);
    let sha = String::from_utf8_lossy(&sha[5..sha.len() - 2]).into_owned();
    c.same(&["EVALSHA", &sha, "1", "ek", "arg"]);
    c.same(&["EVALSHA", "0000000000000000000000000000000000000000", "0"]);
    c.same(&["EVAL", "return redis.call('INCR', KEYS[1])", "1", "s"]);
    c.same(&["EVAL", "return {err='custom failure'}", "0"]);
    c.same(&["EVAL", "syntax error here", "0"]);
    c.same(&["EVAL", "return redis.status_reply('FINE')", "0"]);
    c.same(&["FUNCTION", "LIST"]);
}

fn large(c: &mut Pair) {
    let big = vec![b'v'; 10 * 1024 * 1024];
    c.same_bin(&[b"SET", b"big", &big]);
    let reply = c.same_bin(&[b"GET", b"big"]);
    assert_eq!(reply.len(), big.len() + "$10485760\r\n\r\n".len());
    for chunk in 0..10 {
        let mut args: Vec<Vec<u8>> = vec![b"RPUSH".to_vec(), b"biglist".to_vec()];
        args.extend((0..10_000).map(|i| format!("e{}", chunk * 10_000 + i).into_bytes()));
        let refs: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
        c.same_bin(&refs);
    }
    let reply = c.same(&["LRANGE", "biglist", "0", "-1"]);
    assert!(reply.starts_with(b"*100000\r\n"));
}

fn inline_and_quit(a: &Redis, proxy: &Proxy) {
    let mut c = Pair::new(a, proxy);
    c.same_raw(b"PING\r\n", 1);
    c.same_raw(b"SET inl \"b c\"\r\nGET inl\r\n\r\n   \r\nECHO 'x y'\n", 3);
    c.same_raw(b"*0\r\n*-1\r\nPING\r\n", 1);
    c.same(&["RESET"]);
    c.same(&["QUIT"]);
    // Both close the connection after QUIT's reply.
    assert!(c.direct.try_read_raw().is_err());
    assert!(c.proxied.try_read_raw().is_err());
}
