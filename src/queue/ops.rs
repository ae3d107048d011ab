//! One type per operation of the function library: what its call sends
//! (keys and arguments, in the order the header of `lua/<op>.lua` states)
//! and how its reply reads. Everything that calls the library goes
//! through these; [`Call`] is the calling convention they share (a
//! queue's key group, its rule) and `call.rs` sends it.
//!
//! A reader is lenient where the function's reply is: a missing count is
//! 0, as the scripts leave out what is nothing. Only the pop, whose reply
//! steers what the proxy does next, refuses a shape it never gives.

use std::sync::Arc;

use bytes::Bytes;
use smallvec::SmallVec;

use super::call::{Call, CallError, Caller};
use super::library;
use super::rules::Queue;
use super::value::Value;

/// An operation of the library.
pub trait Op {
    /// What its reply says.
    type Reply;
    /// Its function call.
    fn call(self) -> Call;
    /// Reads the function's result (its events already counted).
    fn read(v: &Value) -> Result<Self::Reply, CallError>;
}

impl Caller {
    /// Runs an operation and reads its reply.
    pub async fn op<O: Op>(&self, op: O) -> Result<O::Reply, CallError> {
        let v = self.run(&op.call()).await?;
        O::read(&v)
    }
}

fn int_at(v: &Value, i: usize) -> i64 {
    v.array().get(i).map(Value::int).unwrap_or(0)
}

/// Leases on move destinations the function could not end itself (their
/// destination is a key it was not given): `(token, destination)` each,
/// for [`ExpireMove`].
pub type Moves = Vec<(Bytes, Bytes)>;

fn moves(items: &[Value]) -> Moves {
    items
        .chunks_exact(2)
        .map(|p| (p[0].to_bytes(), p[1].to_bytes()))
        .collect()
}

// ------------------------------------------------------------------ pops

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

impl Op for Pop<'_> {
    type Reply = Taken;

    fn call(self) -> Call {
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

    fn read(v: &Value) -> Result<Taken, CallError> {
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

// ------------------------------------------------------- ACK, NACK, EXTEND

/// `ack`: releases the leases of `ids` (at most `IDS_PER_CALL`).
pub struct Ack<'a, I> {
    pub q: &'a Queue,
    pub ids: I,
}

/// What an ACK call did.
pub struct Acked {
    pub released: i64,
    /// Ids acknowledged after their lease ran out (their copy cancelled).
    pub late: i64,
    /// When each released lease started (ms, Redis's clock).
    pub started: SmallVec<[i64; 4]>,
}

impl Acked {
    /// The client's count: released plus late.
    pub fn count(&self) -> i64 {
        self.released + self.late
    }
}

impl<I: Iterator<Item = Bytes>> Op for Ack<'_, I> {
    type Reply = Acked;

    fn call(self) -> Call {
        let mut call = Call::new(&library::ACK).queue_rule(self.q);
        call.argv.extend(self.ids);
        call
    }

    fn read(v: &Value) -> Result<Acked, CallError> {
        if let Value::Int(start) = v {
            // The short reply of `ack` (see `tally::settle`): one lease
            // released, that started then.
            return Ok(Acked {
                released: 1,
                late: 0,
                started: smallvec::smallvec![*start],
            });
        }
        let items = v.array();
        Ok(Acked {
            released: int_at(v, 0),
            late: int_at(v, 1),
            started: items
                .get(2..)
                .unwrap_or_default()
                .iter()
                .map(Value::int)
                .collect(),
        })
    }
}

/// `nack`: returns the messages of `ids` to the queue, at once, after the
/// rule's retry backoff, or after `delay` ms.
pub struct Nack<'a> {
    pub q: &'a Queue,
    pub delay: Option<i64>,
    pub ids: &'a [Bytes],
}

/// What a NACK call did.
pub struct Nacked {
    pub ended: i64,
    /// Move leases only marked (see [`Moves`]).
    pub moves: Moves,
}

impl Op for Nack<'_> {
    type Reply = Nacked;

    fn call(self) -> Call {
        let delay = self.delay.map(|ms| ms.to_string()).unwrap_or_default();
        let mut call = Call::new(&library::NACK).queue_rule(self.q).arg(delay);
        call.argv.extend(self.ids.iter().cloned());
        call
    }

    fn read(v: &Value) -> Result<Nacked, CallError> {
        let items = v.array();
        Ok(Nacked {
            ended: int_at(v, 0),
            moves: moves(items.get(1..).unwrap_or_default()),
        })
    }
}

/// `extend`: renews the leases of `id` for `ms` from now. Reply: how many.
pub struct Extend<'a> {
    pub q: &'a Queue,
    pub id: Bytes,
    pub ms: i64,
}

impl Op for Extend<'_> {
    type Reply = i64;

    fn call(self) -> Call {
        Call::new(&library::EXTEND)
            .queue(self.q)
            .arg(self.id)
            .arg(self.ms.to_string())
    }

    fn read(v: &Value) -> Result<i64, CallError> {
        Ok(v.int())
    }
}

/// `expire_move`: ends one expired (or nacked) move lease, its stale copy
/// taken out of `dest` first.
pub struct ExpireMove<'a> {
    pub q: &'a Queue,
    pub dest: &'a [u8],
    pub token: &'a [u8],
}

/// Messages back in their queue and messages dead-lettered.
#[derive(Default, Clone, Copy)]
pub struct Ended {
    pub requeued: i64,
    pub dead: i64,
}

impl Op for ExpireMove<'_> {
    type Reply = Ended;

    fn call(self) -> Call {
        Call::new(&library::EXPIRE_MOVE)
            .queue(self.q)
            .key(Bytes::copy_from_slice(self.dest))
            .rule(self.q)
            .arg(Bytes::copy_from_slice(self.token))
    }

    fn read(v: &Value) -> Result<Ended, CallError> {
        Ok(Ended {
            requeued: int_at(v, 0),
            dead: int_at(v, 1),
        })
    }
}

/// `lrem`: LREM on a move destination, `count` copies of `payload`; a
/// removed copy releases its lease. Reply: LREM's own.
pub struct Lrem<'a> {
    pub dest: &'a [u8],
    pub q: &'a Queue,
    pub count: &'a [u8],
    pub payload: &'a [u8],
}

impl Op for Lrem<'_> {
    type Reply = i64;

    fn call(self) -> Call {
        Call::new(&library::LREM)
            .key(Bytes::copy_from_slice(self.dest))
            .queue(self.q)
            .arg(Bytes::copy_from_slice(self.count))
            .arg(Bytes::copy_from_slice(self.payload))
    }

    fn read(v: &Value) -> Result<i64, CallError> {
        Ok(int_at(v, 0))
    }
}

// ------------------------------------------------------------- producing

/// `push`: QUEUE PUSH's messages (at most `PUSH_PER_CALL`), now or due
/// later.
pub struct Push<'a> {
    pub q: &'a Queue,
    /// '' (now), 'D' (ms from now) or 'A' (unix ms).
    pub when: &'static [u8],
    pub ms: Bytes,
    pub payloads: &'a [Bytes],
}

/// What a push call did.
pub struct Pushed {
    pub accepted: i64,
    /// Ms until the messages are due; `None` when they were pushed now.
    pub due_in_ms: Option<i64>,
}

impl Op for Push<'_> {
    type Reply = Pushed;

    fn call(self) -> Call {
        let mut call = Call::new(&library::PUSH)
            .queue(self.q)
            .rule(self.q)
            .arg(Bytes::from_static(self.when))
            .arg(self.ms);
        call.argv.extend(self.payloads.iter().cloned());
        call
    }

    fn read(v: &Value) -> Result<Pushed, CallError> {
        let due = v.array().get(1).map(Value::int).unwrap_or(-1);
        Ok(Pushed {
            accepted: int_at(v, 0),
            due_in_ms: (due >= 0).then_some(due),
        })
    }
}

// ------------------------------------------------------------ inspecting

/// `info`: a queue's sizes, totals and poison list.
pub struct Info<'a> {
    pub q: &'a Queue,
}

/// What QUEUE INFO and the gauges show.
pub struct QueueInfo {
    pub ready: i64,
    pub leased: i64,
    pub dead: i64,
    /// -1 without leases.
    pub oldest_lease_ms: i64,
    /// Distinct ids with copies back in the list after an expiry.
    pub requeued: i64,
    pub delayed: i64,
    /// In `tally::EVENTS` order (see `tally::totals`).
    pub totals: Vec<Value>,
    pub poison: i64,
    pub poison_ids: Vec<Bytes>,
}

impl Op for Info<'_> {
    type Reply = QueueInfo;

    fn call(self) -> Call {
        Call::new(&library::INFO).queue(self.q).rule(self.q)
    }

    fn read(v: &Value) -> Result<QueueInfo, CallError> {
        let a = v.array();
        Ok(QueueInfo {
            ready: int_at(v, 0),
            leased: int_at(v, 1),
            dead: int_at(v, 2),
            oldest_lease_ms: int_at(v, 3),
            requeued: int_at(v, 4),
            delayed: int_at(v, 5),
            totals: a.get(6).map(Value::array).unwrap_or_default().to_vec(),
            poison: int_at(v, 7),
            poison_ids: a
                .get(8)
                .map(Value::array)
                .unwrap_or_default()
                .iter()
                .map(|v| Bytes::copy_from_slice(v.bytes()))
                .collect(),
        })
    }
}

/// `leases`: the `count` leases that end first after the first `offset`.
pub struct Leases<'a> {
    pub q: &'a Queue,
    pub count: i64,
    pub offset: i64,
}

/// One lease as QUEUE LEASES shows it; a field is an integer or a string
/// as the function gave it, `Nil` where it gave none.
pub struct Lease {
    pub id: Value,
    pub payload: Value,
    pub deliveries: Value,
    pub expires_in_ms: Value,
    /// Empty unless a move form took it.
    pub destination: Value,
    pub nacks: Value,
    pub expiries: Value,
}

/// Field `i` of a lease: `Nil` only when the function left it out (a null
/// it gave shows as an empty string, as it always has).
fn field(f: &[Value], i: usize) -> Value {
    match f.get(i) {
        None => Value::Nil,
        Some(Value::Nil) => Value::Str(Bytes::new()),
        Some(v) => v.clone(),
    }
}

impl Op for Leases<'_> {
    type Reply = Vec<Lease>;

    fn call(self) -> Call {
        Call::new(&library::LEASES)
            .queue(self.q)
            .arg(self.count.to_string())
            .arg(self.offset.to_string())
    }

    fn read(v: &Value) -> Result<Vec<Lease>, CallError> {
        Ok(v.array()
            .iter()
            .map(|l| {
                let f = l.array();
                Lease {
                    id: field(f, 0),
                    payload: field(f, 1),
                    deliveries: field(f, 2),
                    expires_in_ms: field(f, 3),
                    destination: field(f, 4),
                    nacks: field(f, 5),
                    expiries: field(f, 6),
                }
            })
            .collect())
    }
}

// ---------------------------------------------------------- dead letters

/// `dead`: the `count` oldest dead letters after the `offset` oldest, with
/// their histories.
pub struct Dead<'a> {
    pub q: &'a Queue,
    pub count: i64,
    pub offset: i64,
}

/// A dead letter: its payload, then its history (id, deliveries, NACKs,
/// expiries, first and last delivery, last reason, when it died), each
/// `Nil` where none was kept.
pub struct DeadLetter {
    pub fields: [Value; DEAD_FIELDS],
}

/// Payload and history fields of a dead letter, in the function's order.
pub const DEAD_FIELDS: usize = 9;

impl Op for Dead<'_> {
    type Reply = Vec<DeadLetter>;

    fn call(self) -> Call {
        Call::new(&library::DEAD)
            .queue(self.q)
            .arg(self.count.to_string())
            .arg(self.offset.to_string())
    }

    fn read(v: &Value) -> Result<Vec<DeadLetter>, CallError> {
        Ok(v.array()
            .iter()
            .map(|l| {
                let f = l.array();
                DeadLetter {
                    fields: std::array::from_fn(|i| match f.get(i) {
                        Some(v @ (Value::Int(_) | Value::Str(_))) => v.clone(),
                        _ => Value::Nil,
                    }),
                }
            })
            .collect())
    }
}

/// `redrive`: returns up to `count` dead letters to the queue.
pub struct Redrive<'a> {
    pub q: &'a Queue,
    pub count: i64,
}

pub struct Redriven {
    pub moved: i64,
    /// Dead letters left after it.
    pub left: i64,
}

impl Op for Redrive<'_> {
    type Reply = Redriven;

    fn call(self) -> Call {
        Call::new(&library::REDRIVE)
            .queue(self.q)
            .rule(self.q)
            .arg(self.count.to_string())
    }

    fn read(v: &Value) -> Result<Redriven, CallError> {
        Ok(Redriven {
            moved: int_at(v, 0),
            left: int_at(v, 1),
        })
    }
}

/// `purge`: deletes the dead letters and their histories. Reply: how many.
pub struct Purge<'a> {
    pub q: &'a Queue,
}

impl Op for Purge<'_> {
    type Reply = i64;

    fn call(self) -> Call {
        Call::new(&library::PURGE).queue(self.q)
    }

    fn read(v: &Value) -> Result<i64, CallError> {
        Ok(v.int())
    }
}

/// `dead_one`: redrives (`redrive`) or deletes the one dead letter with
/// this id and payload. Reply: 1, or 0 if there is none.
pub struct DeadOne<'a> {
    pub q: &'a Queue,
    pub redrive: bool,
    pub id: &'a [u8],
    pub payload: &'a [u8],
}

impl Op for DeadOne<'_> {
    type Reply = i64;

    fn call(self) -> Call {
        Call::new(&library::DEAD_ONE)
            .queue(self.q)
            .rule(self.q)
            .arg(Bytes::from_static(if self.redrive { b"R" } else { b"D" }))
            .arg(Bytes::copy_from_slice(self.id))
            .arg(Bytes::copy_from_slice(self.payload))
    }

    fn read(v: &Value) -> Result<i64, CallError> {
        Ok(int_at(v, 0))
    }
}

// ------------------------------------------------------------ background

/// `reap`: expired leases back to the queue (or dead-lettered), due
/// delayed messages in, in a batch of at most `batch` each.
pub struct Reap<'a> {
    pub q: &'a Queue,
    pub batch: usize,
}

pub struct Reaped {
    pub requeued: i64,
    pub dead: i64,
    /// Leases and delayed messages left.
    pub left: i64,
    /// Ms until the next deadline or due time; `None`: there is none.
    pub next_ms: Option<i64>,
    pub promoted: i64,
    /// Expired move leases, for [`ExpireMove`].
    pub moves: Moves,
}

impl Op for Reap<'_> {
    type Reply = Reaped;

    fn call(self) -> Call {
        Call::new(&library::REAP)
            .queue(self.q)
            .rule(self.q)
            .arg(self.batch.to_string())
    }

    fn read(v: &Value) -> Result<Reaped, CallError> {
        let next = int_at(v, 3);
        Ok(Reaped {
            requeued: int_at(v, 0),
            dead: int_at(v, 1),
            left: int_at(v, 2),
            next_ms: (next >= 0).then_some(next),
            promoted: int_at(v, 4),
            moves: moves(v.array().get(5..).unwrap_or_default()),
        })
    }
}

/// `disown` (`release` false): ends now up to `limit` leases `owner` holds,
/// the messages back in the queue; `release` (true): acknowledges them
/// instead (next-pop rules).
pub struct Disown<'a> {
    pub q: &'a Queue,
    pub owner: &'a Bytes,
    pub limit: usize,
    pub release: bool,
}

pub struct Disowned {
    pub ended: i64,
    /// More may be left: call again.
    pub more: bool,
    /// Move leases only marked (disown only).
    pub moves: Moves,
}

impl Op for Disown<'_> {
    type Reply = Disowned;

    fn call(self) -> Call {
        let function = if self.release {
            &library::RELEASE
        } else {
            &library::DISOWN
        };
        Call::new(function)
            .queue(self.q)
            .rule(self.q)
            .arg(self.owner.clone())
            .arg(self.limit.to_string())
    }

    fn read(v: &Value) -> Result<Disowned, CallError> {
        Ok(Disowned {
            ended: int_at(v, 0),
            more: int_at(v, 1) == 1,
            moves: moves(v.array().get(2..).unwrap_or_default()),
        })
    }
}

/// `hold`: renews up to `limit` leases of `owners` (connections still
/// open), going on after the lease `after` of the first.
pub struct Hold<'a> {
    pub q: &'a Queue,
    pub limit: usize,
    pub after: Bytes,
    pub owners: &'a [Bytes],
}

pub struct Held {
    pub renewed: i64,
    /// 0: done; else the place (1-based) in `owners` of the connection the
    /// budget ran out at, and the lease to go on after.
    pub next: i64,
    pub after: Bytes,
}

impl Op for Hold<'_> {
    type Reply = Held;

    fn call(self) -> Call {
        let mut call = Call::new(&library::HOLD)
            .queue(self.q)
            .rule(self.q)
            .arg(self.limit.to_string())
            .arg(self.after);
        call.argv.extend(self.owners.iter().cloned());
        call
    }

    fn read(v: &Value) -> Result<Held, CallError> {
        Ok(Held {
            renewed: int_at(v, 0),
            next: int_at(v, 1),
            after: Bytes::copy_from_slice(v.array().get(2).map(Value::bytes).unwrap_or_default()),
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

    #[test]
    fn ack_reads_the_short_reply_as_its_flat_form() {
        let flat = Value::Array(vec![
            Value::Int(1),
            Value::Int(0),
            Value::Int(1700000000123),
        ]);
        for v in [Value::Int(1700000000123), flat] {
            let a = Ack::<std::iter::Empty<Bytes>>::read(&v).unwrap();
            assert_eq!(
                (a.released, a.late, a.started.to_vec()),
                (1, 0, vec![1700000000123])
            );
        }
        let none =
            Ack::<std::iter::Empty<Bytes>>::read(&Value::Array(vec![Value::Int(0), Value::Int(2)]))
                .unwrap();
        assert_eq!((none.released, none.late, none.started.len()), (0, 2, 0));
    }
}
