//! Property tests of the RESP scanners against redis-protocol's decoders:
//! frame boundaries must agree, whatever chunks the bytes arrive in, and no
//! input may panic or make incremental and whole-buffer scanning disagree.

use ackproxy::resp::{Limits, ProtocolError, ReplyScanner, RequestScanner, Scan};
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
    /// Attribute pairs, then the value they describe.
    Attr(Vec<(Reply, Reply)>, Box<Reply>),
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
            Reply::Attr(pairs, value) => {
                out.extend_from_slice(format!("|{}\r\n", pairs.len()).as_bytes());
                for (k, v) in pairs {
                    k.encode(out);
                    v.encode(out);
                }
                value.encode(out);
            }
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
            prop::collection::vec(inner.clone(), 1..6).prop_map(Reply::Push),
            // The reference decoder attaches attributes to the next value,
            // which may not be a null or another attribute.
            (
                prop::collection::vec((map_key(), inner.clone()), 0..3),
                inner.prop_filter("attributable", |v| {
                    !matches!(v, Reply::Null | Reply::Attr(..))
                }),
            )
                .prop_map(|(pairs, v)| Reply::Attr(pairs, Box::new(v))),
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

/// The replies, encoded back to back and fed in `chunks`, end where the
/// reference parser says, one frame a reply.
fn reply_boundaries_match(
    replies: &[Reply],
    chunks: &[usize],
    resp3: bool,
) -> Result<(), TestCaseError> {
    let mut buf = Vec::new();
    for r in replies {
        r.encode(&mut buf);
    }
    let reference = reference_frames(&buf, resp3);
    prop_assert_eq!(reference.len(), replies.len());
    prop_assert_eq!(reply_frames_in_chunks(&buf, chunks), reference);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn resp2_reply_boundaries_match_the_reference(
        replies in prop::collection::vec(resp2(), 1..5),
        chunks in prop::collection::vec(1usize..64, 1..8),
    ) {
        reply_boundaries_match(&replies, &chunks, false)?;
    }

    #[test]
    fn resp3_reply_boundaries_match_the_reference(
        replies in prop::collection::vec(resp3(), 1..5),
        chunks in prop::collection::vec(1usize..64, 1..8),
    ) {
        reply_boundaries_match(&replies, &chunks, true)?;
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

/// One argument written for an inline command line, in one of the forms
/// Redis's `sdssplitargs` reads back.
fn quote(arg: &[u8], style: u8) -> Vec<u8> {
    let plain_ok = !arg.is_empty()
        && arg
            .iter()
            .all(|&b| b.is_ascii_graphic() && b != b'"' && b != b'\'');
    let single_ok = arg.iter().all(|&b| !matches!(b, b'\\' | b'\'' | b'\n' | 0));
    match style % 3 {
        0 if plain_ok => arg.to_vec(),
        1 if single_ok => {
            let mut out = vec![b'\''];
            out.extend_from_slice(arg);
            out.push(b'\'');
            out
        }
        _ => {
            let mut out = vec![b'"'];
            for &b in arg {
                match b {
                    b'\\' => out.extend_from_slice(b"\\\\"),
                    b'"' => out.extend_from_slice(b"\\\""),
                    b'\n' => out.extend_from_slice(b"\\n"),
                    b'\r' => out.extend_from_slice(b"\\r"),
                    b'\t' => out.extend_from_slice(b"\\t"),
                    0x07 => out.extend_from_slice(b"\\a"),
                    0x08 => out.extend_from_slice(b"\\b"),
                    b if b.is_ascii_graphic() || b == b' ' => out.push(b),
                    b => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
                }
            }
            out.push(b'"');
            out
        }
    }
}

/// Every verdict, in order, for a byte stream scanned request by request,
/// with the bytes arriving in pieces of the given sizes (whole if empty).
fn request_stream(bytes: &[u8], chunks: &[usize]) -> Vec<(Scan, Vec<Vec<u8>>)> {
    // An inline line longer than the limit is refused only if it is seen
    // without its newline (as in Redis), which depends on how the bytes
    // arrive: the limit here is above the garbage's length.
    let mut scanner = RequestScanner::new(Limits {
        max_bulk_len: 1 << 10,
        max_array_len: 64,
        max_inline_len: 1 << 10,
    });
    let mut out = Vec::new();
    let mut sizes = chunks.iter().cycle();
    let (mut start, mut avail) = (0, if chunks.is_empty() { bytes.len() } else { 0 });
    loop {
        let r = scanner.scan(&bytes[start..avail]);
        let src: &[u8] = match &r {
            Scan::Inline { encoded, .. } => encoded,
            _ => &bytes[start..avail],
        };
        let args = match &r {
            Scan::Command(_) | Scan::Inline { .. } => scanner
                .args()
                .iter()
                .map(|a| src[a.clone()].to_vec())
                .collect(),
            _ => Vec::new(),
        };
        match &r {
            Scan::Command(n) | Scan::Skip(n) | Scan::Inline { consumed: n, .. } => start += n,
            Scan::Incomplete if avail < bytes.len() => {
                avail = (avail + sizes.next().copied().unwrap_or(usize::MAX)).min(bytes.len());
                continue;
            }
            _ => {
                out.push((r, args));
                return out;
            }
        }
        out.push((r, args));
    }
}

/// Every verdict, in order, for a byte stream of replies fed in pieces.
fn reply_stream(bytes: &[u8], chunks: &[usize]) -> Vec<Result<Option<usize>, ProtocolError>> {
    let mut scanner = ReplyScanner::new();
    let mut out = Vec::new();
    let mut sizes = chunks.iter().cycle();
    let (mut start, mut avail) = (0, if chunks.is_empty() { bytes.len() } else { 0 });
    loop {
        let r = scanner.scan(&bytes[start..avail]);
        match r {
            Ok(Some(n)) => start += n,
            Ok(None) if avail < bytes.len() => {
                avail = (avail + sizes.next().copied().unwrap_or(usize::MAX)).min(bytes.len());
                continue;
            }
            _ => {
                out.push(r);
                return out;
            }
        }
        out.push(r);
    }
}

fn garbage() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![
            any::<u8>(),
            Just(b'\r'),
            Just(b'\n'),
            Just(b'*'),
            Just(b'$'),
            Just(b'1'),
            Just(b'2'),
            Just(b'-'),
            Just(b'"'),
            Just(b'\''),
            Just(b' '),
            Just(b'%'),
            Just(b'|'),
        ],
        0..300,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn quoted_inline_commands_round_trip(
        args in prop::collection::vec(
            (prop::collection::vec(1u8..=255, 0..20), any::<u8>(), 1usize..4, any::<bool>()),
            1..6),
        crlf in any::<bool>(),
    ) {
        let mut line = Vec::new();
        for (arg, style, spaces, tab) in &args {
            line.extend(std::iter::repeat_n(if *tab { b'\t' } else { b' ' }, *spaces));
            line.extend_from_slice(&quote(arg, *style));
        }
        line.extend_from_slice(if crlf { b"\r\n" } else { b"\n" });
        let expected: Vec<Vec<u8>> = args.iter().map(|a| a.0.clone()).collect();
        let mut scanner = RequestScanner::new(Limits::default());
        match scanner.scan(&line) {
            Scan::Inline { consumed, encoded } => {
                prop_assert_eq!(consumed, line.len());
                let got: Vec<Vec<u8>> =
                    scanner.args().iter().map(|r| encoded[r.clone()].to_vec()).collect();
                prop_assert_eq!(&got, &expected);
                // The encoding is a multibulk frame with the same arguments.
                prop_assert_eq!(scanner.scan(&encoded), Scan::Command(encoded.len()));
                let again: Vec<Vec<u8>> =
                    scanner.args().iter().map(|r| encoded[r.clone()].to_vec()).collect();
                prop_assert_eq!(again, expected);
            }
            other => prop_assert!(false, "unexpected {:?} for {:?}", other, line),
        }
    }

    #[test]
    fn garbage_streams_give_the_same_verdicts_in_any_chunks(
        bytes in garbage(),
        chunks in prop::collection::vec(1usize..40, 1..6),
    ) {
        prop_assert_eq!(request_stream(&bytes, &chunks), request_stream(&bytes, &[]));
        prop_assert_eq!(reply_stream(&bytes, &chunks), reply_stream(&bytes, &[]));
    }
}
