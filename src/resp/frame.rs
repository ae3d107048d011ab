//! Reading a reply that is whole in a buffer: its elements, and the text
//! of a string, without decoding the rest.

use std::ops::Range;

use super::ReplyScanner;

/// The children of an aggregate reply (a map's keys and values in turn),
/// as ranges of `frame`, with the aggregate's type byte.
pub fn items(frame: &[u8]) -> Option<(u8, Vec<Range<usize>>)> {
    let kind = *frame.first()?;
    let nl = frame.iter().position(|&b| b == b'\n')?;
    let n = crate::resp::parse_i64(frame.get(1..nl.checked_sub(1)?)?)?;
    let children = match kind {
        b'*' | b'~' if n >= 0 => n,
        b'%' if n >= 0 => n.checked_mul(2)?,
        _ => return None,
    };
    let mut at = nl + 1;
    let mut out = Vec::with_capacity((children as usize).min(1024));
    for _ in 0..children {
        let len = ReplyScanner::new().scan(frame.get(at..)?).ok()??;
        out.push(at..at + len);
        at += len;
    }
    Some((kind, out))
}

/// The text of a bulk or simple string reply.
pub fn bulk(frame: &[u8]) -> Option<&[u8]> {
    let nl = frame.iter().position(|&b| b == b'\n')?;
    let line = frame.get(1..nl.checked_sub(1)?)?;
    match frame.first()? {
        b'+' => Some(line),
        b'$' => {
            let n = usize::try_from(super::parse_i64(line)?).ok()?;
            frame.get(nl + 1..nl + 1 + n)
        }
        _ => None,
    }
}
