//! The pop's function call: `pop` for any pop form over up to
//! `SOURCES_PER_CALL` sources, `pop1` for the common shape.

use std::sync::Arc;

use bytes::Bytes;
use smallvec::SmallVec;

use crate::queue::library;
use crate::queue::library::call::{Call, CallError};
use crate::queue::library::value::Value;
use crate::queue::rules::Queue;

/// A key a pop looks at: a queue's list, or a plain list beside queues in
/// one multi-key pop.
pub enum Source {
    Queue(Arc<Queue>),
    Plain(Bytes),
}

impl Source {
    pub fn key(&self) -> &Bytes {
        match self {
            Source::Queue(q) => &q.name,
            Source::Plain(k) => k,
        }
    }
}

/// `pop` (any pop form over up to `SOURCES_PER_CALL` sources) or `pop1`
/// (the common shape: one queue, no move, no connection): pops up to
/// `count` from the first source that has any and leases what it took.
pub struct Pop<'a> {
    pub sources: &'a [Source],
    /// Pop at the left end (LPOP...) rather than the right.
    pub left: bool,
    pub count: u64,
    /// Destination and whether it is pushed at its left end (move forms).
    pub dest: Option<&'a (Bytes, bool)>,
    /// The connection popping, on rules that track connections; else empty.
    pub owner: &'a Bytes,
    /// Earlier leases of the connection on next-pop rules acknowledged
    /// first, at most (-1: all).
    pub release: i64,
}

/// Values a pop call took: the common one without an allocation.
pub type Values = SmallVec<[Bytes; 1]>;

/// What a pop call did.
pub enum Taken {
    /// Nothing in any source of the call.
    Nothing,
    /// Source `g` (0-based in the call) gave `values`; `more` when the call
    /// stopped at its skip bound and source `g` may still hold messages.
    Took {
        g: usize,
        values: Values,
        more: bool,
    },
    /// Nothing popped: the connection's earlier leases (next-pop) are not
    /// all acknowledged yet. Call again.
    Again,
}

/// A pop call's COUNT argument: the common one without an allocation.
fn count_arg(count: u64) -> Bytes {
    match count {
        1 => Bytes::from_static(b"1"),
        n => Bytes::from(n.to_string()),
    }
}

impl Pop<'_> {
    /// Its function call.
    pub fn call(self) -> Call {
        let end: &'static [u8] = if self.left { b"L" } else { b"R" };
        if let ([Source::Queue(q)], None, true, true) = (
            self.sources,
            self.dest,
            self.owner.is_empty(),
            self.count > 0,
        ) {
            // The common shape has a function of its own, with half the
            // arguments (Redis pays for each), and none past the rule for
            // RPOP of one.
            let call = Call::new(&library::POP1).queue_rule(q);
            if !self.left && self.count == 1 {
                return call;
            }
            return call.arg(Bytes::from_static(end)).arg(count_arg(self.count));
        }
        let push: Bytes = match self.dest {
            None => Bytes::new(),
            Some((_, true)) => Bytes::from_static(b"L"),
            Some((_, false)) => Bytes::from_static(b"R"),
        };
        let mut call = Call::new(&library::POP)
            .arg(self.sources.len().to_string())
            .arg(Bytes::from_static(end))
            .arg(count_arg(self.count))
            .arg(push)
            .arg(self.owner.clone())
            .arg(self.release.to_string());
        for s in self.sources {
            match s {
                Source::Queue(q) => {
                    call = call.queue(q).arg(Bytes::from_static(b"q")).rule(q);
                }
                Source::Plain(k) => {
                    call = call.key(k.clone()).arg(Bytes::from_static(b"p"));
                }
            }
        }
        if let Some((dest, _)) = self.dest {
            call = call.key(dest.clone());
        }
        call
    }

    /// Reads the function's result (its events already counted).
    pub fn read(v: &Value) -> Result<Taken, CallError> {
        if let Value::Str(one) = v {
            // The short reply of `pop1` (see `tally::settle`): one value
            // from the first source, nothing more there.
            return Ok(Taken::Took {
                g: 0,
                values: smallvec::smallvec![one.clone()],
                more: false,
            });
        }
        let items = v.array();
        if items.is_empty() {
            return Ok(Taken::Nothing);
        }
        let (Some(status), Some(g)) = (items.first(), items.get(1)) else {
            return Err(CallError::Unexpected);
        };
        let g = g.int();
        if g < 1 {
            return Err(CallError::Unexpected);
        }
        if status.int() == 2 {
            return Ok(Taken::Again);
        }
        Ok(Taken::Took {
            g: g as usize - 1,
            // Slices of the reply, not copies of them.
            values: items[2..].iter().map(Value::to_bytes).collect(),
            more: status.int() == 1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> Value {
        Value::Str(Bytes::copy_from_slice(x.as_bytes()))
    }

    fn took(t: Taken) -> (usize, Vec<Bytes>, bool) {
        match t {
            Taken::Took { g, values, more } => (g, values.to_vec(), more),
            Taken::Nothing => panic!("nothing"),
            Taken::Again => panic!("again"),
        }
    }

    #[test]
    fn pop_reads_the_short_reply_as_its_flat_form() {
        let short = took(Pop::read(&s("payload")).unwrap());
        let flat = Value::Array(vec![Value::Int(0), Value::Int(1), s("payload")]);
        assert_eq!(short, took(Pop::read(&flat).unwrap()));
        assert_eq!(short, (0, vec![Bytes::from_static(b"payload")], false));
        // Nothing popped is never short.
        assert!(matches!(Pop::read(&Value::Nil), Ok(Taken::Nothing)));
    }
}
