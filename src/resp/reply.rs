//! Builders for replies the proxy writes itself, in the client's protocol.

use bytes::{BufMut, BytesMut};

pub fn bulk(out: &mut BytesMut, v: &[u8]) {
    out.put_u8(b'$');
    out.extend_from_slice(itoa::Buffer::new().format(v.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(v);
    out.extend_from_slice(b"\r\n");
}

pub fn integer(out: &mut BytesMut, v: i64) {
    out.put_u8(b':');
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
    out.extend_from_slice(b"\r\n");
}

pub fn array(out: &mut BytesMut, n: usize) {
    out.put_u8(b'*');
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// A map of `n` pairs: `%` in RESP3, a flat array of 2n in RESP2.
pub fn map(out: &mut BytesMut, n: usize, protocol: u8) {
    if protocol >= 3 {
        out.put_u8(b'%');
        out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        out.extend_from_slice(b"\r\n");
    } else {
        array(out, n * 2);
    }
}

pub fn simple(out: &mut BytesMut, s: &str) {
    out.put_u8(b'+');
    out.extend_from_slice(s.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// The null a command that returns a string sends.
pub fn null_bulk(out: &mut BytesMut, protocol: u8) {
    out.extend_from_slice(if protocol >= 3 { b"_\r\n" } else { b"$-1\r\n" });
}

/// The null a command that returns an array sends.
pub fn null_array(out: &mut BytesMut, protocol: u8) {
    out.extend_from_slice(if protocol >= 3 { b"_\r\n" } else { b"*-1\r\n" });
}

/// `-ERR ...`: `msg` must not contain CR or LF.
pub fn error(msg: &str) -> bytes::Bytes {
    let mut out = BytesMut::with_capacity(msg.len() + 7);
    out.extend_from_slice(b"-ERR ");
    out.extend_from_slice(msg.as_bytes());
    out.extend_from_slice(b"\r\n");
    out.freeze()
}
