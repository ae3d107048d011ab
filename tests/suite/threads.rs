//! The proxy on more than one worker thread (`--threads N`): every reply of
//! many clients pipelining a mix of plain commands and queue operations
//! reaches its own client in request order, byte for byte what Redis
//! answers. Each request's reply is known in advance (unique keys and
//! values per client and request), so a reply delivered to the wrong
//! request, or to the wrong client, cannot go unnoticed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::Duration;

use crate::common::*;

const CONFIG: &str = r#"
[[queue]]
pattern = "tq:*"
lease_ms = 600000
ack_id = "payload"
"#;

const CLIENTS: usize = 60;
/// Rounds of [`round`] per client: 10 requests each.
const ROUNDS: usize = 110;
/// Requests written before the client starts reading them.
const CHUNK: usize = 200;

fn bulk(v: &str) -> Vec<u8> {
    format!("${}\r\n{v}\r\n", v.len()).into_bytes()
}

fn int(n: i64) -> Vec<u8> {
    format!(":{n}\r\n").into_bytes()
}

/// One round of client `c`'s requests, round `i`, each with the reply Redis
/// gives it: writes and reads of keys of its own, a counter, and a queue
/// message pushed, popped (an FCALL behind the proxy) and acknowledged.
fn round(c: usize, i: usize) -> Vec<(Vec<String>, Vec<u8>)> {
    let k = format!("k:{c}:{i}");
    let v = format!("value-{c}-{i}-{}", "x".repeat(i % 7));
    let q = format!("tq:{c}");
    let m = format!("m:{c}:{i}");
    let s = |a: &[&str]| a.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        (s(&["SET", &k, &v]), b"+OK\r\n".to_vec()),
        (s(&["GET", &k]), bulk(&v)),
        (s(&["INCR", &format!("n:{c}")]), int(i as i64 + 1)),
        (s(&["LPUSH", &q, &m]), int(1)),
        (s(&["ECHO", &m]), bulk(&m)),
        (s(&["RPOP", &q]), bulk(&m)),
        (
            s(&["GET", &format!("missing:{c}:{i}")]),
            b"$-1\r\n".to_vec(),
        ),
        (s(&["ACK", &q, &m]), int(1)),
        (s(&["STRLEN", &k]), int(v.len() as i64)),
        (s(&["RPOP", &q]), b"$-1\r\n".to_vec()),
    ]
}

/// One reply, exactly as its bytes arrived (the replies here are flat).
fn read_reply(r: &mut BufReader<TcpStream>) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    if r.read_until(b'\n', &mut out)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    if out[0] == b'$' {
        let n: i64 = String::from_utf8_lossy(&out[1..out.len() - 2])
            .parse()
            .unwrap_or(-1);
        if n >= 0 {
            let at = out.len();
            out.resize(at + n as usize + 2, 0);
            r.read_exact(&mut out[at..])?;
        }
    }
    Ok(out)
}

/// Client `c` pipelines all its requests (writing on one thread, reading on
/// another) and returns what went wrong: (request index, request, wanted,
/// got).
fn client(port: u16, c: usize) -> Vec<(usize, String, String, String)> {
    let reqs: Vec<_> = (0..ROUNDS).flat_map(|i| round(c, i)).collect();
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut w = s.try_clone().unwrap();
    let wire: Vec<Vec<u8>> = reqs
        .chunks(CHUNK)
        .map(|chunk| {
            chunk
                .iter()
                .flat_map(|(args, _)| {
                    let a: Vec<&[u8]> = args.iter().map(|x| x.as_bytes()).collect();
                    Client::encode(&a)
                })
                .collect()
        })
        .collect();
    let writer = thread::spawn(move || {
        for bytes in wire {
            w.write_all(&bytes).unwrap();
        }
    });
    let mut r = BufReader::new(s);
    let mut wrong = Vec::new();
    for (n, (args, want)) in reqs.iter().enumerate() {
        let got = match read_reply(&mut r) {
            Ok(got) => got,
            Err(e) => {
                wrong.push((n, args.join(" "), "a reply".into(), e.to_string()));
                break;
            }
        };
        if &got != want {
            wrong.push((
                n,
                args.join(" "),
                String::from_utf8_lossy(want).into_owned(),
                String::from_utf8_lossy(&got).into_owned(),
            ));
        }
    }
    writer.join().unwrap();
    wrong
}

fn every_reply_answers_its_request(threads: &str) {
    let redis = Redis::start();
    let proxy = Proxy::start_with_config(redis.port, CONFIG, &["--threads", threads]);
    // Loads the library, so that every client's first pop is an ordinary one.
    assert_eq!(proxy.client().cmd(&["RPOP", "tq:none"]), Value::Nil);
    let port = proxy.port;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| thread::spawn(move || client(port, c)))
        .collect();
    let mut wrong = Vec::new();
    for (c, h) in clients.into_iter().enumerate() {
        for w in h.join().unwrap() {
            wrong.push((c, w));
        }
    }
    let total = CLIENTS * ROUNDS * round(0, 0).len();
    assert!(
        wrong.is_empty(),
        "{} of {total} replies wrong with --threads {threads}; the first: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    // Nothing left leased or queued: every pop was acknowledged.
    let mut r = redis.client();
    for c in 0..CLIENTS {
        let q = format!("tq:{c}");
        assert_eq!(r.cmd(&["LLEN", &q]), Value::Int(0), "{q}");
    }
    let mut p = proxy.client();
    for c in 0..CLIENTS {
        let info = p.cmd(&["QUEUE", "INFO", &format!("tq:{c}")]);
        assert_eq!(
            field(&info, "leased"),
            Some(Value::Int(0)),
            "tq:{c}: {info:?}"
        );
    }
}

#[test]
fn two_threads_keep_every_pipelined_reply_with_its_request() {
    every_reply_answers_its_request("2");
}

#[test]
fn four_threads_keep_every_pipelined_reply_with_its_request() {
    every_reply_answers_its_request("4");
}
