//! Arbitrary bytes, split at an arbitrary point, through both scanners:
//! nothing may panic, and scanning a prefix first must not change the
//! outcome of scanning the whole.
//!
//! Run with `-max_len` at most `max_inline_len` below: an inline line longer
//! than the limit is refused only when seen without its newline (as in
//! Redis), so for such lines the verdict rightly depends on the split.
#![no_main]

use ackproxy::resp::{Limits, ProtocolError, ReplyScanner, RequestScanner, Scan};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, bytes)) = data.split_first() else {
        return;
    };
    let cut = (cut as usize * bytes.len()) / 255;
    let limits = Limits {
        max_bulk_len: 1 << 20,
        max_array_len: 1 << 16,
        max_inline_len: 1 << 12,
    };

    // Requests: every complete command is taken off the front until the
    // buffer is exhausted or an error stops the connection.
    let mut whole = RequestScanner::new(limits.clone());
    let mut split = RequestScanner::new(limits);
    let mut at = 0;
    loop {
        let expected = whole.scan(&bytes[at..]);
        let first = split.scan(&bytes[at..cut.max(at)]);
        let got = if first == Scan::Incomplete {
            split.scan(&bytes[at..])
        } else {
            first
        };
        assert_eq!(got, expected);
        if matches!(got, Scan::Command(_) | Scan::Inline { .. }) {
            assert_eq!(split.args(), whole.args());
        }
        if let Scan::Error(e) = &got {
            // Redis's search for the header's CR stops at NUL, so a NUL can
            // never be the byte reported.
            assert_ne!(*e, ProtocolError::ExpectedDollar(0));
            let reply = e.to_reply();
            assert!(reply.starts_with(b"-ERR Protocol error: ") && reply.ends_with(b"\r\n"));
            assert!(!reply[..reply.len() - 2].contains(&b'\r'));
            assert!(!reply[..reply.len() - 2].contains(&b'\n'));
        }
        match got {
            Scan::Command(n) => {
                assert!(n > 0 && whole.args().iter().all(|r| r.end <= n));
                at += n;
            }
            Scan::Skip(n) => {
                assert!(n > 0);
                at += n;
            }
            Scan::Inline { consumed, encoded } => {
                assert!(whole.args().iter().all(|r| r.end <= encoded.len()));
                at += consumed;
            }
            _ => break,
        }
    }

    // Replies, the same way.
    let mut whole = ReplyScanner::new();
    let mut split = ReplyScanner::new();
    let mut at = 0;
    loop {
        let expected = whole.scan(&bytes[at..]);
        let first = split.scan(&bytes[at..cut.max(at)]);
        let got = if first == Ok(None) {
            split.scan(&bytes[at..])
        } else {
            first
        };
        assert_eq!(got, expected);
        match got {
            Ok(Some(n)) => {
                assert!(n > 0 && at + n <= bytes.len());
                at += n;
            }
            _ => break,
        }
    }
});
