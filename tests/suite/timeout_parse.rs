//! `parse_timeout_secs` against a live redis-server: for every input, Redis's
//! verdict on `BLPOP key <timeout>` must be the parser's.

use std::time::{Duration, Instant};

use crate::common::{Redis, Value};
use ackproxy::timeout::{parse_timeout_secs, Timeout};

fn inputs() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = [
        "0",
        "0.0",
        "-0",
        "1",
        "1.5",
        ".5",
        "5.",
        "0x0",
        "0x10",
        "0x1p-2",
        "0X1P3",
        "1e3",
        "1E-3",
        "1e-400",
        "1e-4000",
        "1e5000",
        "-1",
        "-0.0001",
        "inf",
        "-inf",
        "infinity",
        "nan",
        " 1",
        "1 ",
        "+1",
        "1e",
        "0x",
        "",
        "1_000",
        "١",
        "9.3e15",
        "9.3e16",
        "9223372036854775.807",
        "9223372036854776",
        // Around 2^63 ms, where Redis's conversion to long long gives up.
        "9223372036854775.806",
        "9223372036854775.8075",
        "9223372036854775.808",
        "9223372036854775807e-3",
        "9223372036854775808e-3",
        "9223372036854774.9",
        "0x1p53",
        "0x1p63",
        "-9223372036854775.808",
        "1e300",
        "1e4932",
        "1.2e4932",
        "-1e5000",
        // Around the smallest subnormal long double.
        "1e-4950",
        "2e-4951",
        "1.8e-4951",
        "1e-5000",
        "0e-5000",
        "0e99999",
        "0x1p-16445",
        "0x1p-16446",
        "0x1p16383",
        "0x1p16384",
        // Where ceil(x * 1000) depends on long double rounding.
        "0.001",
        "-0.001",
        "-0.0010000000000000001",
        "-0.00099",
        "0.0001",
        "1e-3000",
        // Syntax strtold refuses or reads only in part.
        "1.",
        "..1",
        "1..",
        "--1",
        "+-1",
        "-",
        "+",
        "INF",
        "Infinity",
        "infinit",
        "infinityy",
        "NaN",
        "-nan",
        "nan(1)",
        "0x.8",
        "0x.",
        "0x1p",
        "0x1P-1",
        "0xg",
        "0x1.8p1",
        "1e+3",
        "1e-+3",
        "\t1",
        "\n1",
        "1\n",
        "01",
        "00.5",
        "1,5",
        "1e3.5",
        "0b1",
        "1d",
        "1f",
        "1L",
        "3.999999999999999999999",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    v.push(vec![b'0'; 5000]);
    v.push(vec![b'1'; 6000]);
    v.push(b"1\0".to_vec());
    v.push(vec![0, b'1']);
    // The longest argument Redis parses at all (1, in 5119 bytes), the same
    // with one byte more, and 10^-5117, which underflows to zero.
    let mut longest = vec![b'0'; 5118];
    longest.push(b'1');
    v.push(longest.clone());
    longest.insert(0, b'0');
    v.push(longest);
    let mut tiny = b"0.".to_vec();
    tiny.resize(5118, b'0');
    tiny.push(b'1');
    v.push(tiny);
    v.push(vec![b'0'; 5120]);
    v
}

fn show(arg: &[u8]) -> String {
    let s = arg.escape_ascii().to_string();
    if s.len() > 40 {
        format!("{}...({} bytes)", &s[..40], arg.len())
    } else {
        s
    }
}

#[test]
fn verdicts_match_redis() {
    let redis = Redis::start();
    let mut c = redis.client();
    let cases = inputs();
    assert!(cases.len() >= 60);
    for arg in &cases {
        // An element is always there, so a valid timeout returns at once.
        c.send(&["RPUSH", "k", "x"]);
        c.send_bin(&[b"BLPOP", b"k", arg]);
        assert!(matches!(c.read_value(), Value::Int(_)));
        let redis_says = match c.read_value() {
            Value::Array(_) => Ok(()),
            Value::Error(e) => Err(e),
            other => panic!("{}: unexpected reply {other:?}", show(arg)),
        };
        let parser_says = parse_timeout_secs(arg)
            .map(|_| ())
            .map_err(|e| format!("ERR {e}"));
        assert_eq!(parser_says, redis_says, "timeout {:?}", show(arg));
    }
}

/// Whether Redis blocks `BLPOP` on an empty key with this timeout until told
/// otherwise (a zero timeout) rather than timing out: tells 0 from a tiny
/// positive number of milliseconds.
fn blocks_forever(redis: &Redis, arg: &[u8]) -> bool {
    let mut a = redis.client();
    let mut b = redis.client();
    let Value::Int(id) = a.cmd(&["CLIENT", "ID"]) else {
        panic!("CLIENT ID")
    };
    a.send_bin(&[b"BLPOP", b"empty", arg]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let Value::Bulk(info) = b.cmd(&["CLIENT", "LIST", "ID", &id.to_string()]) else {
            panic!("CLIENT LIST")
        };
        if String::from_utf8_lossy(&info).contains("cmd=blpop") {
            break;
        }
        assert!(Instant::now() < deadline, "BLPOP never ran");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Let any of the tiny timeouts tested here expire, then make Redis run
    // an event-loop iteration, which handles expired blocking timeouts
    // before it writes the PONG.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(b.cmd(&["PING"]), Value::Simple("PONG".into()));
    let unblocked = b.cmd(&["CLIENT", "UNBLOCK", &id.to_string()]);
    // Timed out or unblocked, BLPOP answers nil.
    assert_eq!(a.read_value(), Value::Nil);
    match unblocked {
        Value::Int(1) => true,
        Value::Int(0) => false,
        other => panic!("CLIENT UNBLOCK: {other:?}"),
    }
}

#[test]
fn zero_and_tiny_timeouts_match_redis() {
    let redis = Redis::start();
    let tiny = [
        "0",
        "-0",
        "0.0",
        "0x0",
        "0e-5000",
        "-0.0001",
        "-0.001",
        "-0.0009999",
        "-1e-400",
        "-0x1p-10",
        "1e-400",
        "1e-4950",
        "0.0001",
        "0.001",
        "1E-3",
        "0x1p-20",
        "0x1p-10",
        "0.0005",
        "0.00000000000000000001",
    ];
    let mut forever = 0;
    for arg in tiny {
        let parsed = parse_timeout_secs(arg.as_bytes());
        let expect_forever = match parsed {
            Ok(Timeout::Forever) => true,
            Ok(Timeout::Millis(ms)) if ms <= 5 => false,
            other => panic!("{arg} is not a tiny timeout: {other:?}"),
        };
        forever += usize::from(expect_forever);
        assert_eq!(
            blocks_forever(&redis, arg.as_bytes()),
            expect_forever,
            "timeout {arg:?} parsed as {parsed:?}"
        );
    }
    // Both outcomes are exercised.
    assert!(forever > 3 && forever < tiny.len() - 3, "{forever}");
}
