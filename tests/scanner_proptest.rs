//! Property tests of the RESP scanners against redis-protocol's decoders:
//! frame boundaries must agree, whatever chunks the bytes arrive in, and no
//! input may panic or make incremental and whole-buffer scanning disagree.

use ackproxy::resp::{Limits, ReplyScanner, RequestScanner, Scan};
use proptest::prelude::*;

/// A reply as RESP bytes, built recursively.
#[derive(Debug, Clone)]
enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    NullBulk,
    NullArray,
    Array(Vec<Reply>),
    // RESP3 only
    Null,
    Bool(bool),
    Double(f64),
    BigNum(String),
    BlobError(Vec<u8>),
    Verbatim(Vec<u8>),
    Map(Vec<(Reply, Reply)>),
    Set(Vec<Reply>),
    Push(Vec<Reply>),
}

impl Reply {
    fn encode(&self, out: &mut Vec<u8>) {
        let blob = |out: &mut Vec<u8>, t: u8, b: &[u8]| {
            out.push(t);
            out.extend_from_slice(format!("{}\r\n", b.len()).as_bytes());
            out.extend_from_slice(b);
            out.extend_from_slice(b"\r\n");
        };
        let agg = |out: &mut Vec<u8>, t: u8, items: &[Reply]| {
            out.push(t);
            out.extend_from_slice(format!("{}\r\n", items.len()).as_bytes());
            for i in items {
                i.encode(out);
            }
        };
        match self {
            Reply::Simple(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
            Reply::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
            Reply::Int(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
            Reply::Bulk(b) => blob(out, b'$', b),
            Reply::NullBulk => out.extend_from_slice(b"$-1\r\n"),
            Reply::NullArray => out.extend_from_slice(b"*-1\r\n"),
            Reply::Array(items) => agg(out, b'*', items),
            Reply::Null => out.extend_from_slice(b"_\r\n"),
            Reply::Bool(b) => out.extend_from_slice(if *b { b"#t\r\n" } else { b"#f\r\n" }),
            Reply::Double(d) => out.extend_from_slice(format!(",{d}\r\n").as_bytes()),
            Reply::BigNum(n) => out.extend_from_slice(format!("({n}\r\n").as_bytes()),
            Reply::BlobError(b) => blob(out, b'!', b),
            Reply::Verbatim(b) => {
                let mut v = b"txt:".to_vec();
                v.extend_from_slice(b);
                blob(out, b'=', &v)
            }
            Reply::Map(pairs) => {
                out.extend_from_slice(format!("%{}\r\n", pairs.len()).as_bytes());
                for (k, v) in pairs {
                    k.encode(out);
                    v.encode(out);
                }
            }
            Reply::Set(items) => agg(out, b'~', items),
            Reply::Push(items) => agg(out, b'>', items),
        }
    }
}

fn line() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 _.:-]{0,20}"
}

fn resp2() -> impl Strategy<Value = Reply> {
    let leaf = prop_oneof![
        line().prop_map(Reply::Simple),
        line().prop_map(Reply::Error),
        any::<i64>().prop_map(Reply::Int),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(Reply::Bulk),
        Just(Reply::NullBulk),
        Just(Reply::NullArray),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop::collection::vec(inner, 0..8).prop_map(Reply::Array)
    })
}

fn map_key() -> impl Strategy<Value = Reply> {
    prop_oneof![
        line().prop_map(Reply::Simple),
        any::<i64>().prop_map(Reply::Int),
        prop::collection::vec(any::<u8>(), 0..16).prop_map(Reply::Bulk),
    ]
}

fn resp3() -> impl Strategy<Value = Reply> {
    let leaf = prop_oneof![
        line().prop_map(Reply::Simple),
        line().prop_map(Reply::Error),
        any::<i64>().prop_map(Reply::Int),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(Reply::Bulk),
        Just(Reply::Null),
        any::<bool>().prop_map(Reply::Bool),
        (-1e9f64..1e9).prop_map(Reply::Double),
        "[1-9][0-9]{0,30}".prop_map(Reply::BigNum),
        prop::collection::vec(any::<u8>(), 0..32).prop_map(Reply::BlobError),
        prop::collection::vec(any::<u8>(), 0..32).prop_map(Reply::Verbatim),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Reply::Array),
            // The reference decoder only takes hashable map keys.
            prop::collection::vec((map_key(), inner.clone()), 0..4).prop_map(Reply::Map),
            prop::collection::vec(map_key(), 0..6).prop_map(Reply::Set),
            prop::collection::vec(inner, 1..6).prop_map(Reply::Push),
        ]
    })
}

/// Frame lengths found by feeding `buf` in pieces of the given sizes.
fn reply_frames_in_chunks(buf: &[u8], chunks: &[usize]) -> Vec<usize> {
    let mut scanner = ReplyScanner::new();
    let mut frames = Vec::new();
    let mut start = 0;
    let mut avail = 0;
    let mut sizes = chunks.iter().cycle();
    while start < buf.len() {
        avail = (avail + sizes.next().copied().unwrap_or(1).max(1)).min(buf.len());
        while let Ok(Some(n)) = scanner.scan(&buf[start..avail]) {
            frames.push(n);
            start += n;
        }
    }
    frames
}

fn reference_frames(buf: &[u8], resp3: bool) -> Vec<usize> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < buf.len() {
        let n = if resp3 {
            redis_protocol::resp3::decode::complete::decode(&buf[at..])
                .expect("reference decodes")
                .expect("complete")
                .1
        } else {
            redis_protocol::resp2::decode::decode(&buf[at..])
                .expect("reference decodes")
                .expect("complete")
                .1
        };
        out.push(n);
        at += n;
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn resp2_reply_boundaries_match_the_reference(
        replies in prop::collection::vec(resp2(), 1..5),
        chunks in prop::collection::vec(1usize..64, 1..8),
    ) {
        let mut buf = Vec::new();
        for r in &replies {
            r.encode(&mut buf);
        }
        let reference = reference_frames(&buf, false);
        prop_assert_eq!(reference.len(), replies.len());
        prop_assert_eq!(reply_frames_in_chunks(&buf, &chunks), reference);
    }

    #[test]
    fn resp3_reply_boundaries_match_the_reference(
        replies in prop::collection::vec(resp3(), 1..5),
        chunks in prop::collection::vec(1usize..64, 1..8),
    ) {
        let mut buf = Vec::new();
        for r in &replies {
            r.encode(&mut buf);
        }
        let reference = reference_frames(&buf, true);
        prop_assert_eq!(reference.len(), replies.len());
        prop_assert_eq!(reply_frames_in_chunks(&buf, &chunks), reference);
    }

    #[test]
    fn multibulk_requests_give_back_their_arguments(
        commands in prop::collection::vec(
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..8), 1..5),
        chunks in prop::collection::vec(1usize..50, 1..8),
    ) {
        let mut buf = Vec::new();
        for cmd in &commands {
            buf.extend_from_slice(format!("*{}\r\n", cmd.len()).as_bytes());
            for a in cmd {
                buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                buf.extend_from_slice(a);
                buf.extend_from_slice(b"\r\n");
            }
        }
        let mut scanner = RequestScanner::new(Limits::default());
        let mut got: Vec<Vec<Vec<u8>>> = Vec::new();
        let (mut start, mut avail) = (0, 0);
        let mut sizes = chunks.iter().cycle();
        while start < buf.len() {
            avail = (avail + *sizes.next().unwrap()).min(buf.len());
            loop {
                match scanner.scan(&buf[start..avail]) {
                    Scan::Command(n) => {
                        let frame = &buf[start..start + n];
                        got.push(scanner.args().iter().map(|r| frame[r.clone()].to_vec()).collect());
                        start += n;
                    }
                    Scan::Incomplete => break,
                    other => prop_assert!(false, "unexpected {:?}", other),
                }
            }
        }
        prop_assert_eq!(got, commands);
    }

    #[test]
    fn inline_requests_split_into_words(
        words in prop::collection::vec("[a-zA-Z0-9]{1,12}", 1..8),
    ) {
        let line = format!("{}\r\n", words.join("  "));
        let mut scanner = RequestScanner::new(Limits::default());
        match scanner.scan(line.as_bytes()) {
            Scan::Inline { consumed, encoded } => {
                prop_assert_eq!(consumed, line.len());
                let args: Vec<String> = scanner
                    .args()
                    .iter()
                    .map(|r| String::from_utf8(encoded[r.clone()].to_vec()).unwrap())
                    .collect();
                prop_assert_eq!(args, words);
            }
            other => prop_assert!(false, "unexpected {:?}", other),
        }
    }

    #[test]
    fn garbage_never_panics_and_chunking_never_changes_the_outcome(
        bytes in prop::collection::vec(prop_oneof![
            any::<u8>(),
            Just(b'\r'), Just(b'\n'), Just(b'*'), Just(b'$'), Just(b'1'), Just(b'-'),
        ], 0..200),
        cut in 0usize..200,
    ) {
        let cut = cut.min(bytes.len());
        // Requests: scanning a prefix first must not change the verdict.
        let mut whole = RequestScanner::new(Limits::default());
        let expected = whole.scan(&bytes);
        let mut split = RequestScanner::new(Limits::default());
        let first = split.scan(&bytes[..cut]);
        let second = if first == Scan::Incomplete { split.scan(&bytes) } else { first };
        prop_assert_eq!(second, expected);
        // Replies likewise.
        let mut whole = ReplyScanner::new();
        let expected = whole.scan(&bytes);
        let mut split = ReplyScanner::new();
        let first = split.scan(&bytes[..cut]);
        let second = if first == Ok(None) { split.scan(&bytes) } else { first };
        prop_assert_eq!(second, expected);
    }
}
