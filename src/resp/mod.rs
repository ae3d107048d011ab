//! RESP framing. The hot path never builds typed frames: it only finds where
//! a request or reply ends, so bytes can be forwarded unchanged.

pub mod frame;
pub mod reply;
pub mod scanner;

pub use scanner::{Limits, ProtocolError, ReplyScanner, RequestScanner, Scan};

/// Makes room to read into `buf`: at least `min` free bytes, and as much as
/// `buf` already holds, so that a frame arriving in many reads is copied
/// O(log n) times, not once per read.
pub fn grow(buf: &mut bytes::BytesMut, min: usize) {
    let free = buf.capacity() - buf.len();
    if free < min / 4 || free < buf.len() / 8 {
        buf.reserve(min.max(buf.len()));
    }
}

/// An integer as Redis's `string2ll` reads it: no sign but `-`, no
/// leading zeros, no spaces.
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    // Read here rather than through `str::parse`: every length in every
    // request and reply comes through, and the UTF-8 check and generic
    // parse cost several times the digits themselves.
    let (negative, digits) = match s.strip_prefix(b"-") {
        Some(d) => (true, d),
        None => (false, s),
    };
    if digits.is_empty() || (digits[0] == b'0' && s.len() > 1) {
        return None;
    }
    // Accumulated below zero, which also holds i64::MIN.
    let mut n: i64 = 0;
    for &b in digits {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        n = n.checked_mul(10)?.checked_sub(i64::from(d))?;
    }
    if negative {
        Some(n)
    } else {
        n.checked_neg()
    }
}

#[cfg(test)]
mod tests {
    use super::parse_i64;

    #[test]
    fn integers_are_read_as_redis_reads_them() {
        let cases: &[(&[u8], Option<i64>)] = &[
            (b"0", Some(0)),
            (b"7", Some(7)),
            (b"-12", Some(-12)),
            (b"9223372036854775807", Some(i64::MAX)),
            (b"-9223372036854775808", Some(i64::MIN)),
            (b"9223372036854775808", None),
            (b"-9223372036854775809", None),
            (b"99999999999999999999", None),
            (b"", None),
            (b"-", None),
            (b"-0", None),
            (b"007", None),
            (b"+1", None),
            (b" 1", None),
            (b"1 ", None),
            (b"1a", None),
            (b"\xff", None),
        ];
        for (s, want) in cases {
            assert_eq!(parse_i64(s), *want, "{:?}", String::from_utf8_lossy(s));
        }
    }
}
