//! An operation of the function library: what its call sends and how its
//! reply reads. Each operation's type stands beside the code that issues
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

pub fn int_at(v: &Value, i: usize) -> i64 {
    v.array().get(i).map(Value::int).unwrap_or(0)
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
