//! An operation of the function library: what its call sends and how its
//! reply reads. Each operation is made beside the code that issues
//! it (a command in `commands/`, the pop in `pop/`, the reaper's and the
//! connections' calls in `leases/`); [`Call`] is the calling convention
//! they share and `call.rs` sends it.
//!
//! A reader is lenient where the function's reply is: a missing count is
//! 0, as the scripts leave out what is nothing. Only the pop, whose reply
//! steers what the proxy does next, refuses a shape it never gives.

use bytes::Bytes;

use super::call::{Call, CallError, Caller};
use super::value::Value;

/// An operation of the library: its function call and the reader of the
/// function's result (its events already counted).
pub struct Op<R> {
    pub call: Call,
    pub read: fn(&Value) -> Result<R, CallError>,
}

impl<R> Op<R> {
    pub fn new(call: Call, read: fn(&Value) -> Result<R, CallError>) -> Op<R> {
        Op { call, read }
    }
}

impl Caller {
    /// Runs an operation and reads its reply.
    pub async fn op<R>(&self, op: Op<R>) -> Result<R, CallError> {
        let v = self.run(&op.call).await?;
        (op.read)(&v)
    }
}

pub fn int_at(v: &Value, i: usize) -> i64 {
    v.array().get(i).map(Value::int).unwrap_or(0)
}

/// The reader of a result whose first integer is the reply.
pub fn first_int(v: &Value) -> Result<i64, CallError> {
    Ok(int_at(v, 0))
}

/// The first two integers of a result.
pub fn two_ints(v: &Value) -> (i64, i64) {
    (int_at(v, 0), int_at(v, 1))
}

/// Leases on move destinations the function could not end itself (their
/// destination is a key it was not given): `(token, destination)` each,
/// for `commands::expire_move`.
pub type Moves = Vec<(Bytes, Bytes)>;

pub fn moves(items: &[Value]) -> Moves {
    items
        .chunks_exact(2)
        .map(|p| (p[0].to_bytes(), p[1].to_bytes()))
        .collect()
}
