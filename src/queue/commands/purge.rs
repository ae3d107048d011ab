//! QUEUE PURGE queue DEAD: the dead letters and their histories deleted.

use std::sync::Arc;

use super::{changed, int_reply, rewrite, shared_dead_letters};
use crate::command::Args;
use crate::queue::leases::registry::Registry;
use crate::queue::library;
use crate::queue::library::call::{Call, CallError};
use crate::queue::library::op::Op;
use crate::queue::library::value::Value;
use crate::queue::rules::Queue;
use crate::queue::Intercept;
use crate::resp::reply;

/// QUEUE PURGE queue DEAD
pub(super) fn purge(args: Args<'_>, q: Arc<Queue>, registry: &Arc<Registry>) -> Intercept {
    if !args.is(3, "DEAD") || (args.len() == 7 && !args.is(4, "ID")) {
        return Intercept::Reply(reply::error("syntax error"));
    }
    if args.len() == 7 {
        return super::dead_one::one_dead_letter(args, q, registry, false);
    }
    if let Some(refused) = shared_dead_letters("PURGE", &q) {
        return refused;
    }
    let op = Purge { q: &q };
    let (q, registry) = (q.clone(), registry.clone());
    rewrite(op, registry.db, move |n| {
        changed(&registry, &q, n);
        int_reply(n)
    })
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
