//! Decoding the replies of the proxy's own scripts. They are small and
//! shallow (integers, strings, arrays of those), in RESP2 or, on a client's
//! RESP3 connection, RESP3.

use bytes::Bytes;

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Nil,
    Int(i64),
    Str(Bytes),
    Array(Vec<Value>),
    Error(Bytes),
}

impl Value {
    pub fn int(&self) -> i64 {
        match self {
            Value::Int(i) => *i,
            Value::Str(s) => num(s).unwrap_or(0),
            _ => 0,
        }
    }

    pub fn array(&self) -> &[Value] {
        match self {
            Value::Array(a) => a,
            _ => &[],
        }
    }

    /// The string as a slice of the reply it came in (no copy).
    pub fn to_bytes(&self) -> Bytes {
        match self {
            Value::Str(s) => s.clone(),
            _ => Bytes::new(),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            Value::Str(s) => s,
            _ => b"",
        }
    }
}

/// Our scripts nest at most this deep; deeper means a bug, not data.
const MAX_DEPTH: usize = 8;

pub fn decode(reply: &Bytes) -> Option<Value> {
    let (v, used) = decode_at(reply, 0, 0)?;
    (used == reply.len()).then_some(v)
}

fn line(b: &Bytes, at: usize) -> Option<(&[u8], usize)> {
    let end = at + b.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
    Some((&b[at + 1..end], end + 2))
}

fn num(s: &[u8]) -> Option<i64> {
    // Redis writes integers canonically: the fast reading nearly always.
    crate::resp::parse_i64(s).or_else(|| std::str::from_utf8(s).ok()?.parse().ok())
}

fn decode_at(b: &Bytes, at: usize, depth: usize) -> Option<(Value, usize)> {
    if depth > MAX_DEPTH {
        return None;
    }
    let (text, next) = line(b, at)?;
    match *b.get(at)? {
        b':' => Some((Value::Int(num(text)?), next)),
        b'+' => Some((Value::Str(b.slice(at + 1..next - 2)), next)),
        b'-' => Some((Value::Error(b.slice(at..next)), next)),
        b'_' => Some((Value::Nil, next)),
        b'#' => Some((
            if text == b"t" {
                Value::Int(1)
            } else {
                Value::Nil
            },
            next,
        )),
        b'$' => {
            let n = num(text)?;
            if n < 0 {
                return Some((Value::Nil, next));
            }
            let end = next + n as usize;
            if b.len() < end + 2 {
                return None;
            }
            Some((Value::Str(b.slice(next..end)), end + 2))
        }
        b'*' => {
            let n = num(text)?;
            if n < 0 {
                return Some((Value::Nil, next));
            }
            let mut items = Vec::with_capacity((n as usize).min(1024));
            let mut at = next;
            for _ in 0..n {
                let (v, after) = decode_at(b, at, depth + 1)?;
                items.push(v);
                at = after;
            }
            Some((Value::Array(items), at))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_both_protocols() {
        let v = decode(&Bytes::from_static(b"*3\r\n:1\r\n$3\r\nabc\r\n$-1\r\n")).unwrap();
        assert_eq!(
            v,
            Value::Array(vec![
                Value::Int(1),
                Value::Str(Bytes::from_static(b"abc")),
                Value::Nil
            ])
        );
        assert_eq!(decode(&Bytes::from_static(b"_\r\n")), Some(Value::Nil));
        assert_eq!(decode(&Bytes::from_static(b"#f\r\n")), Some(Value::Nil));
        assert_eq!(decode(&Bytes::from_static(b"*2\r\n:1\r\n")), None);
    }
}
