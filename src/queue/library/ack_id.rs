//! The ack id of a payload as `ack_id` in `lua/lease_core.lua` gives it,
//! where the proxy can tell it without decoding the JSON. Only ever a
//! hint: `leases/handed.rs` notes by it which leases an ACK may release the
//! short way (the script still goes by the ACK's own id), and
//! `commands/lrem.rs` names by it the lease an LREM releases, which
//! `lrem_ack.lua` takes only when its record holds that payload in that
//! destination. A payload the library reads otherwise (JSON its decoder
//! refuses, say) costs the longer way, never a wrong lease.
//!
//! It also makes the parts of `take_move.lua`'s record that the proxy
//! knows ([`record_dest`], [`record_tail`]): Lua formats a number with
//! `sprintf`, which costs Redis more than the argument carrying it.

use crate::config::AckId;

/// A decimal length, '|', then the bytes: how a move lease's record writes
/// its destination and its id.
fn counted(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(itoa::Buffer::new().format(bytes.len()).as_bytes());
    out.push(b'|');
    out.extend_from_slice(bytes);
}

/// The destination's part of a move lease's record: its length, '|' and
/// its name (`take_move.lua`'s ARGV[5]).
pub fn record_dest(dest: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(dest.len() + 4);
    counted(&mut out, dest);
    out
}

/// What the record of `payload`'s move lease in `dest` holds between its
/// end letter and the payload, when the payload's ack id is `id`: the
/// destination's part, then '|' when the payload is its own id, else the
/// id's length, '|' and the id (`lrem_ack.lua`'s ARGV[5]).
pub fn record_tail(dest: &[u8], id: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut out = record_dest(dest);
    if id == payload {
        out.push(b'|');
    } else {
        counted(&mut out, id);
    }
    out
}

/// The ack id of `payload` in the common cases: the whole payload, or a
/// top-level field of a JSON object whose value is a string without
/// escapes or a number (its text as written). `None` for the rest (dotted
/// paths, escapes, what is not an object).
pub fn of<'a>(ack_id: &AckId, payload: &'a [u8]) -> Option<&'a [u8]> {
    match ack_id {
        AckId::Payload => Some(payload),
        AckId::JsonField(f) if !f.contains('.') => json_field(payload, f.as_bytes()),
        AckId::JsonField(_) => None,
    }
}

fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && matches!(s[i], b' ' | b'\t' | b'\r' | b'\n') {
        i += 1;
    }
    i
}

/// The index after the JSON string that starts at `i` (a `"`).
fn string_end(s: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    while i < s.len() {
        match s[i] {
            b'"' => return Some(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    None
}

/// The index after the JSON value that starts at `i`.
fn value_end(s: &[u8], i: usize) -> Option<usize> {
    match s.get(i)? {
        b'"' => string_end(s, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < s.len() {
                match s[j] {
                    b'"' => {
                        j = string_end(s, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let n = s[i..]
                .iter()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'+' | b'.'))
                .count();
            (n > 0).then_some(i + n)
        }
    }
}

/// The value of `field` at the top level of the JSON object `s`: a
/// string's bytes (none with escapes), a number's text. The last
/// occurrence wins, as in the library's decoder.
fn json_field<'a>(s: &'a [u8], field: &[u8]) -> Option<&'a [u8]> {
    let mut i = skip_ws(s, 0);
    if s.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(s, i + 1);
    let mut found = None;
    while s.get(i) == Some(&b'"') {
        let kend = string_end(s, i)?;
        let key = &s[i + 1..kend - 1];
        i = skip_ws(s, kend);
        if s.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(s, i + 1);
        let vend = value_end(s, i)?;
        if key == field {
            let v = &s[i..vend];
            found = match v.first() {
                Some(b'"') if !v.contains(&b'\\') => Some(&v[1..v.len() - 1]),
                Some(c) if c.is_ascii_digit() || *c == b'-' => Some(v),
                _ => None,
            };
        }
        i = skip_ws(s, vend);
        match s.get(i) {
            Some(b',') => i = skip_ws(s, i + 1),
            Some(b'}') => return found,
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(s: &str) -> Option<String> {
        json_field(s.as_bytes(), b"id").map(|v| String::from_utf8_lossy(v).into_owned())
    }

    #[test]
    fn a_top_level_field_is_found_as_the_library_finds_it() {
        assert_eq!(field(r#"{"id":"a1","body":"x"}"#).as_deref(), Some("a1"));
        assert_eq!(
            field(r#" { "body" : {"id":"inner"} , "id" : 12 } "#).as_deref(),
            Some("12")
        );
        assert_eq!(field(r#"{"id":"a","id":"b"}"#).as_deref(), Some("b"));
        assert_eq!(
            field(r#"{"x":[1,{"id":"n"}],"id":-1.5e3}"#).as_deref(),
            Some("-1.5e3")
        );
        // Escapes, other types, no such field, not an object, cut short.
        assert_eq!(field(r#"{"id":"a\"b"}"#), None);
        assert_eq!(field(r#"{"id":true}"#), None);
        assert_eq!(field(r#"{"other":"a"}"#), None);
        assert_eq!(field(r#"["id","a"]"#), None);
        assert_eq!(field(r#"{"id":"a""#), None);
        assert_eq!(field("plain text"), None);
    }

    #[test]
    fn a_move_records_parts_are_take_moves() {
        assert_eq!(record_dest(b"doing:jobs"), b"10|doing:jobs");
        assert_eq!(record_tail(b"d", b"x1", br#"{"id":"x1"}"#), b"1|d2|x1");
        assert_eq!(record_tail(b"d", b"p", b"p"), b"1|d|");
    }
}
