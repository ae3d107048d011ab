//! The pop forms on queue keys: parsing their arguments as Redis does,
//! building the pop-and-lease script call, and rebuilding from the script's
//! answer exactly the reply Redis would have sent.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::call::Call;
use super::rules::{Queue, Rules};
use super::scripts;
use super::value::Value;
use crate::command::{parse_i64, Args, PopForm};
use crate::resp::reply;

/// Expired leases a pop returns to its queue before popping, at most.
const REQUEUE_PER_POP: &str = "10";

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

/// A parsed pop on at least one queue key.
pub struct Pop {
    pub form: PopForm,
    pub sources: Vec<Source>,
    pub left: bool,
    /// `None` for the forms that pop one value and reply with it alone.
    pub count: Option<u64>,
    /// Destination and the end it is pushed at, for the move forms.
    pub dest: Option<(Bytes, bool)>,
    /// Seconds; 0 waits forever. Blocking forms only.
    pub timeout: f64,
    pub protocol: u8,
}

/// Positions of the source keys, for deciding whether a rule applies.
pub fn source_keys<'a>(form: PopForm, args: Args<'a>) -> Vec<&'a [u8]> {
    let n = args.len();
    let range = match form {
        PopForm::Pop { .. } => 1..n.min(2),
        PopForm::BPop { .. } => 1..n.saturating_sub(1),
        PopForm::RPopLPush | PopForm::BRPopLPush | PopForm::LMove | PopForm::BLMove => 1..n.min(2),
        PopForm::LMPop | PopForm::BLMPop => {
            let at = if form == PopForm::LMPop { 1 } else { 2 };
            match args.get(at).and_then(parse_i64) {
                Some(k) if k > 0 && (at + 1 + k as usize) <= n => at + 1..at + 1 + k as usize,
                _ => 0..0,
            }
        }
    };
    range.filter_map(|i| args.get(i)).collect()
}

/// What parsing found.
pub enum Parsed {
    Pop(Pop),
    /// Arguments Redis rejects: let Redis say so, on a key that holds nothing.
    Invalid,
}

fn direction(a: Option<&[u8]>) -> Option<bool> {
    let a = a?;
    if a.eq_ignore_ascii_case(b"LEFT") {
        Some(true)
    } else if a.eq_ignore_ascii_case(b"RIGHT") {
        Some(false)
    } else {
        None
    }
}

fn timeout(a: Option<&[u8]>) -> Option<f64> {
    let t: f64 = std::str::from_utf8(a?).ok()?.parse().ok()?;
    // Redis refuses timeouts past LLONG_MAX milliseconds.
    (t.is_finite() && t >= 0.0 && t <= (i64::MAX / 1000) as f64).then_some(t)
}

pub fn parse(form: PopForm, args: Args<'_>, rules: &Rules, protocol: u8) -> Parsed {
    let n = args.len();
    let sources = |keys: Vec<&[u8]>| -> Vec<Source> {
        keys.into_iter()
            .map(|k| match rules.resolve(k) {
                Some(q) => Source::Queue(q),
                None => Source::Plain(Bytes::copy_from_slice(k)),
            })
            .collect()
    };
    let mut pop = Pop {
        form,
        sources: Vec::new(),
        left: false,
        count: None,
        dest: None,
        timeout: 0.0,
        protocol,
    };
    let ok = match form {
        PopForm::Pop { left } => {
            pop.left = left;
            if n == 3 {
                match args.get(2).and_then(parse_i64) {
                    Some(c) if c >= 0 => pop.count = Some(c as u64),
                    _ => return Parsed::Invalid,
                }
            }
            n == 2 || n == 3
        }
        PopForm::BPop { left } => {
            pop.left = left;
            match timeout(args.get(n - 1)) {
                Some(t) if n >= 3 => {
                    pop.timeout = t;
                    true
                }
                _ => false,
            }
        }
        PopForm::RPopLPush | PopForm::BRPopLPush => {
            pop.dest = args.get(2).map(|d| (Bytes::copy_from_slice(d), true));
            if form == PopForm::BRPopLPush {
                pop.timeout = match timeout(args.get(3)) {
                    Some(t) => t,
                    None => return Parsed::Invalid,
                };
                n == 4
            } else {
                n == 3
            }
        }
        PopForm::LMove | PopForm::BLMove => {
            let (Some(from), Some(to)) = (direction(args.get(3)), direction(args.get(4))) else {
                return Parsed::Invalid;
            };
            pop.left = from;
            pop.dest = args.get(2).map(|d| (Bytes::copy_from_slice(d), to));
            if form == PopForm::BLMove {
                pop.timeout = match timeout(args.get(5)) {
                    Some(t) => t,
                    None => return Parsed::Invalid,
                };
                n == 6
            } else {
                n == 5
            }
        }
        PopForm::LMPop | PopForm::BLMPop => {
            let at = if form == PopForm::LMPop { 1 } else { 2 };
            if form == PopForm::BLMPop {
                pop.timeout = match timeout(args.get(1)) {
                    Some(t) => t,
                    None => return Parsed::Invalid,
                };
            }
            let Some(k) = args.get(at).and_then(parse_i64).filter(|&k| k > 0) else {
                return Parsed::Invalid;
            };
            let dir_at = at + 1 + k as usize;
            let Some(left) = direction(args.get(dir_at)) else {
                return Parsed::Invalid;
            };
            pop.left = left;
            pop.count = Some(1);
            match n - dir_at - 1 {
                0 => true,
                2 if args.is(dir_at + 1, "COUNT") => match args.get(dir_at + 2).and_then(parse_i64)
                {
                    Some(c) if c > 0 => {
                        pop.count = Some(c as u64);
                        true
                    }
                    _ => false,
                },
                _ => false,
            }
        }
    };
    if !ok {
        return Parsed::Invalid;
    }
    pop.sources = sources(source_keys(form, args));
    Parsed::Pop(pop)
}

/// The same request with every queue key replaced by a key that never
/// exists, so Redis answers invalid arguments with its own error and
/// cannot pop anything unleased.
pub fn neutralised(args: Args<'_>, rules: &Rules) -> Bytes {
    let parts: Vec<&[u8]> = args
        .iter()
        .enumerate()
        .map(|(i, a)| {
            if i > 0 && rules.is_queue(a) {
                &b"ackq:void"[..]
            } else {
                a
            }
        })
        .collect();
    Bytes::from(crate::upstream::encode_command(&parts))
}

impl Pop {
    /// The pop-and-lease script call (never blocks).
    pub fn call(&self) -> Call {
        let end: &'static [u8] = if self.left { b"L" } else { b"R" };
        let push: Bytes = match &self.dest {
            None => Bytes::new(),
            Some((_, true)) => Bytes::from_static(b"L"),
            Some((_, false)) => Bytes::from_static(b"R"),
        };
        let mut call = Call::new(&scripts::POP)
            .arg(self.sources.len().to_string())
            .arg(Bytes::from_static(end))
            .arg(self.count.unwrap_or(1).to_string())
            .arg(push)
            .arg(REQUEUE_PER_POP);
        for s in &self.sources {
            match s {
                Source::Queue(q) => {
                    for k in q.key_group() {
                        call = call.key(k.clone());
                    }
                    call = call.arg(Bytes::from_static(b"q"));
                    for a in &q.spec {
                        call = call.arg(a.clone());
                    }
                }
                Source::Plain(k) => {
                    call = call.key(k.clone()).arg(Bytes::from_static(b"p"));
                }
            }
        }
        if let Some((dest, _)) = &self.dest {
            call = call.key(dest.clone());
        }
        call
    }

    /// The client's reply for the script's answer; `None` when nothing was
    /// popped (a blocking form then waits).
    pub fn reply(&self, v: &Value) -> Option<Bytes> {
        let items = v.array();
        let mut out = BytesMut::new();
        let p = self.protocol;
        if items.is_empty() {
            // Nothing popped and no source exists.
            match self.form {
                PopForm::Pop { .. } if self.count.is_none() => reply::null_bulk(&mut out, p),
                PopForm::Pop { .. } | PopForm::LMPop => reply::null_array(&mut out, p),
                PopForm::RPopLPush | PopForm::LMove => reply::null_bulk(&mut out, p),
                _ => return None,
            }
            return Some(out.freeze());
        }
        let g = items[0].int().max(1) as usize;
        let key = self
            .sources
            .get(g - 1)
            .map(Source::key)
            .cloned()
            .unwrap_or_default();
        let values = &items[1..];
        match self.form {
            PopForm::Pop { .. } => match self.count {
                None => match values.first() {
                    Some(v) => reply::bulk(&mut out, v.bytes()),
                    None => reply::null_bulk(&mut out, p),
                },
                Some(_) => {
                    reply::array(&mut out, values.len());
                    for v in values {
                        reply::bulk(&mut out, v.bytes());
                    }
                }
            },
            PopForm::BPop { .. } => {
                let v = values.first()?;
                reply::array(&mut out, 2);
                reply::bulk(&mut out, &key);
                reply::bulk(&mut out, v.bytes());
            }
            PopForm::RPopLPush | PopForm::BRPopLPush | PopForm::LMove | PopForm::BLMove => {
                let v = values.first()?;
                reply::bulk(&mut out, v.bytes());
            }
            PopForm::LMPop | PopForm::BLMPop => {
                if values.is_empty() {
                    return None;
                }
                reply::array(&mut out, 2);
                reply::bulk(&mut out, &key);
                reply::array(&mut out, values.len());
                for v in values {
                    reply::bulk(&mut out, v.bytes());
                }
            }
        }
        Some(out.freeze())
    }

    /// What a blocking form replies when its timeout passes: a null array,
    /// for the move forms too (Redis 7.0 answers every timed-out list pop so).
    pub fn timeout_reply(&self) -> Bytes {
        let mut out = BytesMut::new();
        reply::null_array(&mut out, self.protocol);
        out.freeze()
    }

    /// What a blocking form replies inside MULTI when there is nothing to
    /// pop: Redis does not block there, and the move forms send a plain null.
    pub fn multi_empty_reply(&self) -> Bytes {
        let mut out = BytesMut::new();
        match self.form {
            PopForm::BRPopLPush | PopForm::BLMove => reply::null_bulk(&mut out, self.protocol),
            _ => reply::null_array(&mut out, self.protocol),
        }
        out.freeze()
    }

    pub fn queues(&self) -> impl Iterator<Item = &Arc<Queue>> {
        self.sources.iter().filter_map(|s| match s {
            Source::Queue(q) => Some(q),
            Source::Plain(_) => None,
        })
    }
}
