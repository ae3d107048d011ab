//! Where completion signals' acknowledgements go (see `signals.rs`): a
//! reply transform that fires them once Redis accepted the signalling
//! write, and the task that sends their `ACK`s on the proxy's own
//! connection, through a bounded backlog. A `SWAPDB` goes the same way: once
//! it ran, the parked pops of both databases look again.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::output::{ReplyTransform, Transformed};
use crate::queue::dbs::Dbs;
use crate::queue::rules::Rules;
use crate::queue::signals::Fired;

/// Signalled requests waiting for their acknowledgements; past it one is
/// dropped, counted (see [`Sink::fire`]).
const BACKLOG: usize = 4096;

/// Where signalled acknowledgements wait for the proxy's connection.
#[derive(Clone)]
pub struct Sink {
    tx: mpsc::Sender<(i64, Fired)>,
}

impl Sink {
    /// Starts the task that acknowledges what signals name.
    pub fn start(rules: Arc<Rules>, dbs: Arc<Dbs>) -> Sink {
        let (tx, rx) = mpsc::channel(BACKLOG);
        tokio::spawn(acknowledge(rx, rules, dbs));
        Sink { tx }
    }

    /// Acknowledges what `fired` names in database `db`, soon. A full
    /// backlog drops it, counted: its leases then run out and their jobs
    /// run again, as without the signal.
    pub fn fire(&self, db: i64, fired: Fired) {
        if self.tx.try_send((db, fired)).is_err() {
            metrics::counter!("ackproxy_signals_dropped_total").increment(1);
        }
    }

    /// A reply transform that fires `fired` once Redis accepted the request
    /// (its reply is no error), and leaves the reply as it is.
    pub fn on_success(&self, db: i64, fired: Fired) -> Box<dyn ReplyTransform> {
        Box::new(OnSuccess {
            sink: self.clone(),
            db,
            fired: Some(fired),
        })
    }
}

struct OnSuccess {
    sink: Sink,
    db: i64,
    fired: Option<Fired>,
}

impl ReplyTransform for OnSuccess {
    fn apply(&mut self, reply: Bytes) -> Transformed {
        // EXEC's null (`*-1`, RESP3 `_`) is a transaction WATCH aborted:
        // nothing of it ran.
        let ran =
            !matches!(reply.first(), Some(b'-' | b'_' | b'!')) && !reply.starts_with(b"*-1\r\n");
        if let Some(fired) = self.fired.take().filter(|_| ran) {
            self.sink.fire(self.db, fired);
        }
        Transformed::Done(reply)
    }
}

async fn acknowledge(mut rx: mpsc::Receiver<(i64, Fired)>, rules: Arc<Rules>, dbs: Arc<Dbs>) {
    while let Some((db, fired)) = rx.recv().await {
        for index in &fired.wake {
            // A database no pop has used has no parked pops.
            match index {
                0 => dbs.zero().waiters.wake_all(),
                i => {
                    if let Some(d) = dbs.find(*i) {
                        d.waiters.wake_all();
                    }
                }
            }
        }
        if fired.acks.is_empty() {
            continue;
        }
        let db = dbs.at(db);
        let mut acks = fired.acks;
        // One call per queue, its ids together.
        acks.sort_by(|a, b| a.0.cmp(&b.0));
        for group in acks.chunk_by(|a, b| a.0 == b.0) {
            let Some(q) = rules.resolve_leased(&group[0].0) else {
                continue;
            };
            let ids: Vec<Bytes> = group.iter().map(|(_, id)| id.clone()).collect();
            match db
                .own
                .op(crate::queue::commands::ack_op(&q, ids.into_iter()))
                .await
            {
                Ok(acked) => {
                    let n = crate::queue::commands::count_acks(&q, &acked);
                    metrics::counter!("ackproxy_signal_acks_total", "rule" => q.rule.pattern.clone())
                        .increment(n.max(0) as u64);
                    if n != 0 {
                        db.registry.changed(&q.name);
                    }
                }
                Err(e) => tracing::warn!(
                    queue = %String::from_utf8_lossy(&q.name),
                    error = %String::from_utf8_lossy(e.to_reply().trim_ascii_end()),
                    "a completion signal's acknowledgement failed; the lease runs out instead"
                ),
            }
        }
    }
}
