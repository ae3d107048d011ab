//! The pop forms on queue keys: parsing their arguments as Redis does,
//! building the pop-and-lease script call, and rebuilding from the script's
//! answer exactly the reply Redis would have sent.

pub mod call;
pub mod stream;
pub mod waiters;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::command::{parse_i64, Args, PopForm};
use crate::config::AckPolicy;
use crate::queue::leases::held::HeldLeases;
use crate::queue::leases::{clock, handed};
use crate::queue::library;
use crate::queue::library::call::{Call, CallError, Caller};
use crate::queue::library::script::{self, Request};
use crate::queue::library::tally;
use crate::queue::library::value::{self, Value};
use crate::queue::library::{ack_id, keys};
use crate::queue::rules::{Made, Queue, Rules};
use crate::resp::reply;
use crate::timeout::{parse_timeout_secs, Timeout};
use call::{Source, Taken, Values};

/// Bounds on one pop script call, whatever the client asked for: a pop with
/// a larger COUNT, or more source keys, is carried out as several calls.
/// Elements popped and leased per call: about 15 µs each with 1 KB payloads, so a call stays near 1 ms.
pub const POP_BATCH: u64 = 50;
/// Source keys looked at per call.
pub const SOURCES_PER_CALL: usize = 16;
/// Earlier leases of the connection acknowledged per call by a pop on an
/// `ack = "next-pop"` queue.
const RELEASE_PER_CALL: i64 = 100;

/// The keys a pop looks at: the common one key without an allocation.
pub type Sources = smallvec::SmallVec<[Source; 1]>;

/// A parsed pop on at least one queue key.
pub struct Pop {
    pub form: PopForm,
    pub sources: Sources,
    pub left: bool,
    /// `None` for the forms that pop one value and reply with it alone.
    pub count: Option<u64>,
    /// Destination and the end it is pushed at, for the move forms.
    pub dest: Option<(Bytes, bool)>,
    /// Blocking forms only.
    pub timeout: Timeout,
    pub protocol: u8,
    /// The client connection's name, when a source's rule tracks
    /// connections (see `leases/owners.rs`); empty otherwise.
    pub owner: Bytes,
    /// Whether it acknowledges the connection's earlier leases on next-pop
    /// rules (see `How::next`).
    pub next: bool,
    /// Where the rule tracks connections: this pop's place among the
    /// connection's (see `HeldLeases::pop_made`). Boxed: most pops have none.
    pub ticket: Option<Box<Ticket>>,
}

/// A pop's place among its connection's pops on rules that track them,
/// and the one lease the connection is known to hold (queue, token).
pub struct Ticket {
    pub leases: Arc<HeldLeases>,
    pub conn: u64,
    pub n: u64,
    pub held: Option<(Bytes, Bytes)>,
}

/// The source keys, for deciding whether a rule applies: an iterator, not
/// a collection, since every pop asks (and a collection is an allocation).
pub fn source_keys<'a>(form: PopForm, args: Args<'a>) -> impl Iterator<Item = &'a [u8]> + 'a {
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
    range.filter_map(move |i| args.get(i))
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

/// The timeout as Redis reads it; `None` where Redis refuses it (Redis then
/// says why, see [`neutralised`]).
fn timeout(a: Option<&[u8]>) -> Option<Timeout> {
    parse_timeout_secs(a?).ok()
}

pub fn parse(form: PopForm, args: Args<'_>, rules: &Rules, protocol: u8) -> Parsed {
    let n = args.len();
    let sources = |keys: &mut dyn Iterator<Item = &[u8]>| -> Sources {
        keys.map(|k| match rules.resolve(k) {
            Some(q) => Source::Queue(q),
            None => Source::Plain(Bytes::copy_from_slice(k)),
        })
        .collect()
    };
    let mut pop = Pop {
        form,
        sources: Sources::new(),
        left: false,
        count: None,
        dest: None,
        timeout: Timeout::Forever,
        protocol,
        owner: Bytes::new(),
        next: false,
        ticket: None,
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
    pop.sources = sources(&mut source_keys(form, args));
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

/// What a pop did.
pub struct Popped {
    /// The client's reply; `None` when nothing was popped and the form
    /// blocks.
    pub reply: Option<Bytes>,
    /// The queue the elements were leased from, if any.
    pub queue: Option<Arc<Queue>>,
    pub count: usize,
}

/// How far a pop carried out as bounded calls has got (see [`Pop::run`]).
#[derive(Default)]
pub struct Progress {
    /// The first source the next call looks at, until one gave elements.
    from: usize,
    /// The source that gave elements.
    source: Option<usize>,
    got: Values,
    /// When the first call that took something answered (its leases
    /// started a little before).
    first_taken: Option<std::time::Instant>,
    done: bool,
    /// The sources and the count of the call in flight.
    lo: usize,
    hi: usize,
    ask: u64,
}

/// The length of `*<n>\r\n`.
fn head_len(n: usize) -> usize {
    3 + crate::queue::library::call::decimal_len(n)
}

/// The length of a bulk string holding `v`.
fn bulk_len(v: &[u8]) -> usize {
    head_len(v.len()) + v.len() + 2
}

/// Whether `reply` is exactly the bulk string whose data `v` is a slice
/// of.
fn is_bulk_of(reply: &[u8], v: &[u8]) -> bool {
    reply.first() == Some(&b'$')
        && reply.len() == bulk_len(v)
        && std::ptr::eq(reply[reply.len() - 2 - v.len()..].as_ptr(), v.as_ptr())
}

/// The null a command that returns a string sends, without an allocation.
fn null_bulk(protocol: u8) -> Bytes {
    Bytes::from_static(if protocol >= 3 { b"_\r\n" } else { b"$-1\r\n" })
}

/// The null a command that returns an array sends, likewise.
fn null_array(protocol: u8) -> Bytes {
    Bytes::from_static(if protocol >= 3 { b"_\r\n" } else { b"*-1\r\n" })
}

/// A pop's first call as one of the take scripts (see
/// [`Pop::take_request`]).
pub struct Take {
    pub request: Request,
    pub q: Arc<Queue>,
    /// take_owned.lua was asked to acknowledge the connection's earlier
    /// lease (a next-pop pop).
    pub acking: bool,
}

impl Take {
    /// What the script's reply says was popped, as the library's pop
    /// would give it, its delivery and acknowledgement counted (for the
    /// totals the proxy writes, see `Queue::totals_to_write`, and the
    /// rule's counters): `None` when the script left the pop to the
    /// library. Each script answers the value, or nil, for a pop that did
    /// what it was asked; take_owned.lua wraps it in an array of one when
    /// it was asked to acknowledge and the connection held nothing there.
    pub fn reply(&self, reply: &Bytes) -> Result<Option<Value>, CallError> {
        if &reply[..] == b":0\r\n" {
            return Ok(None);
        }
        if reply.first() == Some(&b'-') {
            return Err(CallError::Redis(reply.clone()));
        }
        let (v, acked) = match value::decode(reply) {
            Some(Value::Array(mut one)) if one.len() == 1 => (one.pop(), false),
            v => (v, self.acking),
        };
        let v = match v {
            Some(v @ Value::Str(_)) => {
                self.q.made(Made::Deliveries);
                tally::counted(&self.q.pattern, "deliveries", 1);
                v
            }
            Some(Value::Nil) => Value::Nil,
            _ => return Err(CallError::Unexpected),
        };
        if acked {
            self.q.made(Made::Acks);
            tally::counted(&self.q.pattern, "acks", 1);
        }
        Ok(Some(v))
    }
}

impl Pop {
    /// The pop-and-lease script call over `sources[from..to]`, popping up
    /// to `count` (never blocks), acknowledging first up to `release`
    /// earlier leases of the connection on next-pop queues (-1: all).
    fn call_for(&self, from: usize, to: usize, count: u64, release: i64) -> Call {
        call::Pop {
            sources: &self.sources[from..to],
            left: self.left,
            count,
            dest: self.dest.as_ref(),
            owner: &self.owner,
            release,
        }
        .call()
    }

    /// The whole pop as one call, for inside MULTI, where it cannot be
    /// split: its work is bounded by what the queues hold, as Redis's own
    /// pop with that COUNT would be.
    pub fn single_call(&self) -> Call {
        let release = if self.next { -1 } else { 0 };
        self.call_for(0, self.sources.len(), self.count.unwrap_or(1), release)
    }

    /// The client's reply for a [`Pop::single_call`]'s answer; `None` when
    /// nothing was popped (a blocking form then waits).
    pub fn reply(&self, v: &Value) -> Option<Bytes> {
        match call::Pop::read(v) {
            Ok(Taken::Took { g, values, .. }) => self.build(Some(g), &values),
            _ => self.build(None, &[]),
        }
    }

    /// Carries the pop out as bounded script calls: each pops at most
    /// [`POP_BATCH`] elements from at most [`SOURCES_PER_CALL`] sources.
    /// Once a source gave elements, the following calls pop from it alone,
    /// so the reply is the one Redis would send; what the client gives up
    /// for counts above the bound is that other clients may pop between two
    /// calls, and that a pop still going after half the rule's lease stops
    /// with what it has (fewer than COUNT while the list holds more).
    /// Returns `None` when nothing was popped (a blocking form then waits).
    pub async fn run(&self, caller: &Caller) -> Result<Popped, CallError> {
        let mut p = Progress::default();
        while let Some(call) = self.next_call(&mut p) {
            let v = match self.take_request(&call, &p, caller.db) {
                // Boxed: this future is part of every client's session
                // task, and idle clients should not pay for its size.
                Some(take) => Box::pin(self.take(caller, take, &call)).await?,
                None => caller.run(&call).await?,
            };
            self.absorb(&mut p, &v)?;
        }
        Ok(self.finish(p, None))
    }

    /// The call as `take.lua` (see [`Pop::take_request`]), then as `call`
    /// if the script leaves the pop to the library; awaited, as every
    /// call of [`Pop::run`].
    async fn take(&self, caller: &Caller, take: Take, call: &Call) -> Result<Value, CallError> {
        let mut reply = caller
            .shared
            .call(take.request.evalsha.clone(), caller.client.clone())
            .await
            .map_err(CallError::Upstream)?;
        if script::is_noscript(&reply) {
            reply = caller
                .shared
                .call(take.request.eval(), caller.client.clone())
                .await
                .map_err(CallError::Upstream)?;
        }
        match take.reply(&reply)? {
            None => caller.run(call).await,
            Some(v) => {
                self.note_held(&take.q, &v);
                Ok(v)
            }
        }
    }

    /// After take_owned.lua's reply `v` to this pop, a next-pop pop: the
    /// connection now holds one lease on `q`, the value's if it took one
    /// (see `HeldLeases::took`). Its token as the proxy reads it: when the
    /// script gave the lease another (a duplicate's), the next pop's
    /// script finds no such lease and looks for it as it would otherwise.
    pub fn note_held(&self, q: &Queue, v: &Value) {
        let Some(t) = &self.ticket else {
            return;
        };
        if !self.next || q.rule.ack != AckPolicy::NextPop {
            return;
        }
        if let Ok(Taken::Took { values, .. }) = call::Pop::read(v) {
            if let [value] = &values[..] {
                if let Some(id) = ack_id::of(&q.rule.ack_id, value) {
                    let token = Bytes::from(keys::id_key(id));
                    t.leases.took(t.conn, t.n, q.name.clone(), token);
                }
            }
        }
    }

    /// Whether [`Pop::run`] would need one call at most, all going well:
    /// a COUNT and sources one call takes. (Skipped cancelled copies and
    /// next-pop releases past their bounds may still ask for more.)
    pub fn fits_one_call(&self) -> bool {
        self.count.unwrap_or(1) <= POP_BATCH && self.sources.len() <= SOURCES_PER_CALL
    }

    /// The next bounded call of the pop, `None` once it is complete.
    pub fn next_call(&self, p: &mut Progress) -> Option<Call> {
        if p.done {
            return None;
        }
        let want = self.count.unwrap_or(1);
        let n = self.sources.len();
        let (lo, hi) = match p.source {
            Some(g) if !p.got.is_empty() => (g, g + 1),
            _ => (p.from, (p.from + SOURCES_PER_CALL).min(n)),
        };
        if lo >= hi {
            p.done = true;
            return None;
        }
        let ask = (want - p.got.len() as u64).min(POP_BATCH);
        // Only before this pop took anything: what it takes is not done.
        let release = if p.got.is_empty() && self.next {
            RELEASE_PER_CALL
        } else {
            0
        };
        (p.lo, p.hi, p.ask) = (lo, hi, ask);
        Some(self.call_for(lo, hi, ask, release))
    }

    /// Takes in the answer to the call [`Pop::next_call`] gave last.
    pub fn absorb(&self, p: &mut Progress, v: &Value) -> Result<(), CallError> {
        let want = self.count.unwrap_or(1);
        match call::Pop::read(v)? {
            Taken::Again => {}
            Taken::Nothing => {
                if p.got.is_empty() {
                    p.source = None;
                    p.from = p.hi;
                } else {
                    p.done = true;
                }
            }
            Taken::Took { g, values, more } => {
                let g = p.lo + g;
                let k = values.len() as u64;
                p.source = Some(g);
                if p.got.is_empty() {
                    p.got = values;
                } else {
                    // Copies past the first call: a slice would keep its
                    // whole read buffer for as long as the pop goes on.
                    p.got
                        .extend(values.iter().map(|v| Bytes::copy_from_slice(v)));
                }
                if want == 0 || p.got.len() as u64 >= want {
                    p.done = true;
                    return Ok(());
                }
                // The leases of what this pop took run from when each
                // call took it, not from the reply: a pop still going
                // after half a lease stops with what it has, before its
                // first leases can run out and their copies come back
                // into its own reply.
                let first = *p.first_taken.get_or_insert_with(std::time::Instant::now);
                if let Some(Source::Queue(q)) = self.sources.get(g) {
                    if first.elapsed().as_millis() as u64 >= q.rule.lease_ms / 2 {
                        p.done = true;
                        return Ok(());
                    }
                }
                if more {
                    // Stopped at the skip bound: look at source g again
                    // (and, if it has nothing real, at the ones after).
                    p.from = g;
                } else if k < p.ask {
                    p.done = true;
                }
            }
        }
        Ok(())
    }

    /// What the pop did, once [`Pop::next_call`] has no more calls. `last`:
    /// the reply of the last call, when the caller has it; if that is the
    /// one bulk string holding the one value a plain pop took (`pop1`'s
    /// short reply), it is the client's reply byte for byte, in RESP2 and
    /// RESP3, and goes on as it is rather than written again.
    pub fn finish(&self, p: Progress, last: Option<&Bytes>) -> Popped {
        let single = matches!(self.form, PopForm::Pop { .. }) && self.count.is_none();
        let reply = match (last, &p.got[..]) {
            (Some(last), [v]) if single && is_bulk_of(last, v) => Some(last.clone()),
            _ => self.build(p.source, &p.got),
        };
        let queue = match p.source.and_then(|g| self.sources.get(g)) {
            Some(Source::Queue(q)) if !p.got.is_empty() => Some(q.clone()),
            _ => None,
        };
        if let Some(q) = &queue {
            self.hand_out(q, &p.got);
        }
        Popped {
            reply,
            queue,
            count: p.got.len(),
        }
    }

    /// The first call as `lua/scripts/take.lua` (see `library/script.rs`)
    /// when it is the pop of one value from a queue in database 0
    /// (`take_owned.lua` on a rule that tracks connections, `take_move.lua`
    /// for a move on one that does not):
    /// that script's request, and the queue. The library's pop (`call`)
    /// does what the script leaves to it.
    pub fn take_request(&self, call: &Call, p: &Progress, db: i64) -> Option<Take> {
        let [Source::Queue(q)] = &self.sources[..] else {
            return None;
        };
        if db != 0 || p.ask != 1 {
            return None;
        }
        let field = q.rule.ack_id.field();
        let end: &[u8] = match (self.left, q.skiplist_turn()) {
            (true, false) => b"L",
            (false, false) => b"R",
            (true, true) => b"l",
            (false, true) => b"r",
        };
        let lease = itoa::Buffer::new().format(q.rule.lease_ms).to_owned();
        let k = &q.keys;
        let keys = [k.queue(), k.prefix()];
        let tracked = q.rule.tracks_connections();
        // A connection's name is given exactly when the rule tracks it.
        if tracked == self.owner.is_empty() {
            return None;
        }
        let mut acking = false;
        let request = if let Some((dest, left)) = &self.dest {
            if tracked || call.function.op != library::POP.op {
                return None;
            }
            let push: &[u8] = if *left { b"L" } else { b"R" };
            script::take_move().call(
                q,
                &[keys[0], keys[1], dest],
                &[
                    end,
                    lease.as_bytes(),
                    field,
                    push,
                    &ack_id::record_dest(dest),
                ],
            )
        } else if tracked {
            if call.function.op != library::POP.op {
                return None;
            }
            // As next_call's release: only before this pop took anything.
            let release = self.next && p.got.is_empty() && q.rule.ack == AckPolicy::NextPop;
            let held = match self.ticket.as_deref().and_then(|t| t.held.as_ref()) {
                Some((queue, token)) if release && *queue == q.name => token.as_ref(),
                _ => b"",
            };
            acking = release;
            let release: &[u8] = if release { b"1" } else { b"0" };
            script::take_owned().call(
                q,
                &keys,
                &[end, lease.as_bytes(), field, &self.owner, release, held],
            )
        } else {
            if call.function.op != library::POP1.op {
                return None;
            }
            script::take().call(q, &keys, &[end, lease.as_bytes(), field])
        };
        Some(Take {
            request,
            q: q.clone(),
            acking,
        })
    }

    /// Notes the leases of `values`, just taken from `q`, whose ACKs can
    /// take the short way (see `leases/handed.rs`): plain leases of rules
    /// acknowledged by ACK.
    fn hand_out(&self, q: &Queue, values: &[Bytes]) {
        // Next-pop leases end by the connection's next pop, not by ACK:
        // notes of them would only crowd the others out.
        if self.dest.is_some() || q.rule.ack == AckPolicy::NextPop {
            return;
        }
        let now = clock::redis_now_ms();
        for v in values {
            handed::handed(&q.name, &q.rule.ack_id, v, now);
        }
    }

    /// What a [`Pop::single_call`] popped, for bookkeeping.
    pub fn popped(&self, v: &Value) -> Popped {
        let (queue, count) = match call::Pop::read(v) {
            Ok(Taken::Took { g, values, .. }) => match self.sources.get(g) {
                Some(Source::Queue(q)) if !values.is_empty() => {
                    self.hand_out(q, &values);
                    (Some(q.clone()), values.len())
                }
                _ => (None, values.len()),
            },
            _ => (None, 0),
        };
        Popped {
            reply: self.reply(v),
            queue,
            count,
        }
    }

    /// The client's reply: `source` is the index of the source that exists
    /// (and gave `values`), `None` when no source had anything.
    fn build(&self, source: Option<usize>, values: &[Bytes]) -> Option<Bytes> {
        let p = self.protocol;
        let Some(g) = source else {
            return match self.form {
                PopForm::Pop { .. } if self.count.is_none() => Some(null_bulk(p)),
                PopForm::Pop { .. } | PopForm::LMPop => Some(null_array(p)),
                PopForm::RPopLPush | PopForm::LMove => Some(null_bulk(p)),
                _ => None,
            };
        };
        let key = self
            .sources
            .get(g)
            .map(Source::key)
            .cloned()
            .unwrap_or_default();
        // The exact size, so that the reply is one allocation (a `Bytes`
        // frozen with spare room takes a second, for its shared header).
        let all = head_len(values.len()) + values.iter().map(|v| bulk_len(v)).sum::<usize>();
        let size = match self.form {
            PopForm::Pop { .. } if self.count.is_none() => {
                values.first().map_or(5, |v| bulk_len(v))
            }
            PopForm::Pop { .. } => all,
            PopForm::BPop { .. } => {
                head_len(2) + bulk_len(&key) + values.first().map_or(0, |v| bulk_len(v))
            }
            PopForm::LMPop | PopForm::BLMPop => head_len(2) + bulk_len(&key) + all,
            _ => values.first().map_or(0, |v| bulk_len(v)),
        };
        let mut out = BytesMut::with_capacity(size);
        match self.form {
            PopForm::Pop { .. } => match self.count {
                None => match values.first() {
                    Some(v) => reply::bulk(&mut out, v),
                    None => reply::null_bulk(&mut out, p),
                },
                Some(_) => {
                    reply::array(&mut out, values.len());
                    for v in values {
                        reply::bulk(&mut out, v);
                    }
                }
            },
            PopForm::BPop { .. } => {
                let v = values.first()?;
                reply::array(&mut out, 2);
                reply::bulk(&mut out, &key);
                reply::bulk(&mut out, v);
            }
            PopForm::RPopLPush | PopForm::BRPopLPush | PopForm::LMove | PopForm::BLMove => {
                let v = values.first()?;
                reply::bulk(&mut out, v);
            }
            PopForm::LMPop | PopForm::BLMPop => {
                if values.is_empty() {
                    return None;
                }
                reply::array(&mut out, 2);
                reply::bulk(&mut out, &key);
                reply::array(&mut out, values.len());
                for v in values {
                    reply::bulk(&mut out, v);
                }
            }
        }
        Some(out.freeze())
    }

    /// What a blocking form replies when its timeout passes: a null array,
    /// for the move forms too (Redis 7.0 answers every timed-out list pop so).
    pub fn timeout_reply(&self) -> Bytes {
        null_array(self.protocol)
    }

    /// What a blocking form replies inside MULTI when there is nothing to
    /// pop: Redis does not block there, and the move forms send a plain null.
    pub fn multi_empty_reply(&self) -> Bytes {
        match self.form {
            PopForm::BRPopLPush | PopForm::BLMove => null_bulk(self.protocol),
            _ => null_array(self.protocol),
        }
    }

    pub fn queues(&self) -> impl Iterator<Item = &Arc<Queue>> {
        self.sources.iter().filter_map(|s| match s {
            Source::Queue(q) => Some(q),
            Source::Plain(_) => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bulk_is_recognised_only_around_its_own_data() {
        let reply = Bytes::from_static(b"$7\r\npayload\r\n");
        let v = reply.slice(4..11);
        assert!(is_bulk_of(&reply, &v));
        // The same bytes elsewhere are not its data.
        let copy = Bytes::copy_from_slice(b"payload");
        assert!(!is_bulk_of(&reply, &copy));
        // A reply that holds more than the bulk, or another kind of value.
        let longer = Bytes::from_static(b"*1\r\n$7\r\npayload\r\n");
        assert!(!is_bulk_of(&longer, &longer.slice(8..15)));
        let simple = Bytes::from_static(b"+payload\r\n");
        assert!(!is_bulk_of(&simple, &simple.slice(1..8)));
    }
}
