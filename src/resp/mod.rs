//! RESP framing. The hot path never builds typed frames: it only finds where
//! a request or reply ends, so bytes can be forwarded unchanged.

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
    let digits = s.strip_prefix(b"-").unwrap_or(s);
    if digits.is_empty()
        || !digits.iter().all(u8::is_ascii_digit)
        || (digits[0] == b'0' && (digits.len() > 1 || s.len() > 1))
    {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}
