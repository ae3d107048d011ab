//! Queue interception: pops on configured queue keys become atomic
//! pop-and-lease scripts; ACK, NACK and QUEUE are answered here; blocking
//! pops wait in the proxy; a reaper returns expired leases.
//!
//! The session asks [`Queues::intercept`] about every pop, LREM, ACK, NACK
//! and QUEUE request and gets back what to do instead of forwarding it.

pub mod bounded;
pub mod call;
pub mod commands;
pub mod job;
pub mod keys;
pub mod pop;
pub mod reaper;
pub mod registry;
pub mod rules;
pub mod scripts;
pub mod value;
pub mod waiters;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use crate::command::{Args, Kind, PopForm};
use crate::config::Config;
use crate::output::{ClientState, ReplyTransform};
use crate::upstream::shared::SharedUpstream;
use crate::upstream::Endpoint;
use bounded::ByteBoundedMap;
use call::{Caller, ScriptReply};
use job::Job;
use pop::{Parsed, Pop};
use rules::Rules;
use waiters::Waiters;

/// How the session can carry a queue operation out.
#[derive(Clone, Copy)]
pub struct How {
    /// RESP version of the client's replies.
    pub protocol: u8,
    /// Queued in the client's MULTI: one call, part of EXEC's reply.
    pub in_multi: bool,
    /// Whole scripts instead of EVALSHA (a NOSCRIPT cannot be retried).
    pub full: bool,
    /// Several calls may carry it out ([`Intercept::Job`]); false where it
    /// must be one request on the client's own connection (during a pause).
    pub split: bool,
}

/// What the session does with a request that may concern a queue.
pub enum Intercept {
    /// Not a queue operation: forward it unchanged.
    Pass,
    /// Answer at once (argument errors, QUEUE HELP).
    Reply(Bytes),
    /// Send `request` instead and rewrite its reply.
    Rewrite {
        request: Bytes,
        transform: Box<dyn ReplyTransform>,
    },
    /// A blocking pop on a queue key, outside MULTI.
    Block(Pop),
    /// Several bounded script calls, awaited before the client's next
    /// request is handled.
    Job(job::Job),
}

/// Bytes of move-destination names remembered at most; past it the oldest
/// are forgotten. Forgetting one only means an LREM there no longer
/// acknowledges: the lease then expires and the stale copy is removed, so
/// at-least-once still holds.
const DESTINATIONS_BYTES: usize = 8 << 20;

pub struct Queues {
    rules: Arc<Rules>,
    /// An LREM on these lists may acknowledge a lease.
    /// Destination → the queue's name (not the resolved queue, which can be
    /// large and is cached apart, within its own bound).
    destinations: RwLock<ByteBoundedMap<Bytes>>,
    /// Queues with leases, for the reaper.
    registry: Arc<registry::Registry>,
    waiters: Waiters,
}

impl Queues {
    /// Sets up queue handling when rules are configured.
    pub async fn start(
        config: &Config,
        endpoint: Arc<Endpoint>,
        stop: watch::Receiver<bool>,
    ) -> Option<Queues> {
        if config.queues.is_empty() {
            return None;
        }
        let rules = Arc::new(Rules::new(&config.queues));
        // The proxy's own traffic (wake-ups, reaping) gets its own shared
        // connection so that it never queues behind clients' pipelines.
        let shared = SharedUpstream::spawn(endpoint.clone());
        let registry = Arc::new(registry::Registry::default());
        let waiters = Waiters::start(
            rules.clone(),
            endpoint,
            shared.clone(),
            registry.clone(),
            stop.clone(),
        );
        let reaper = reaper::Reaper {
            rules: rules.clone(),
            registry: registry.clone(),
            caller: Caller {
                shared,
                client: ClientState::new(0, usize::MAX),
            },
            waiters: waiters.clone(),
            interval: Duration::from_millis(config.reaper.interval_ms.max(1)),
            batch: config.reaper.batch.max(1),
        };
        tokio::spawn(reaper.run(stop));
        Some(Queues {
            rules,
            destinations: RwLock::new(ByteBoundedMap::new(DESTINATIONS_BYTES)),
            registry,
            waiters,
        })
    }

    /// Whether the request needs interception (cheap; no I/O).
    pub fn concerns(&self, kind: Kind, args: Args<'_>) -> bool {
        match kind {
            Kind::Pop(form) => pop::source_keys(form, args)
                .iter()
                .any(|k| self.rules.is_queue(k)),
            Kind::Lrem => args
                .get(1)
                .is_some_and(|d| self.destinations.read().unwrap().contains_key(d)),
            Kind::Ack | Kind::Nack | Kind::Queue => true,
            _ => false,
        }
    }

    /// What to do instead of forwarding.
    pub fn intercept(&self, kind: Kind, args: Args<'_>, how: How) -> Intercept {
        let How {
            protocol,
            in_multi,
            full,
            split,
        } = how;
        // Where a request cannot be split, it is one call, as in MULTI.
        let one_call = in_multi || !split;
        match kind {
            Kind::Pop(form) => {
                if !self.concerns(kind, args) {
                    return Intercept::Pass;
                }
                self.pop(form, args, protocol, (in_multi, one_call), full)
            }
            Kind::Lrem => {
                let dest = args.get(1).unwrap_or_default();
                let name = self.destinations.read().unwrap().get(dest).cloned();
                match name.and_then(|n| self.rules.resolve(&n)) {
                    Some(q) => commands::lrem(args, &q, full),
                    None => Intercept::Pass,
                }
            }
            Kind::Ack => commands::ack(args, &self.rules, one_call, full),
            Kind::Nack => commands::nack(args, &self.rules, &self.registry, one_call, full),
            Kind::Queue => commands::queue(args, &self.rules, &self.registry, protocol, full),
            _ => Intercept::Pass,
        }
    }

    fn pop(
        &self,
        form: PopForm,
        args: Args<'_>,
        protocol: u8,
        (in_multi, one_call): (bool, bool),
        full: bool,
    ) -> Intercept {
        let pop = match pop::parse(form, args, &self.rules, protocol) {
            Parsed::Pop(p) => p,
            Parsed::Invalid => {
                return Intercept::Rewrite {
                    request: pop::neutralised(args, &self.rules),
                    transform: Box::new(Verbatim),
                }
            }
        };
        if let (Some((dest, _)), Some(q)) = (&pop.dest, pop.queues().next()) {
            let known = self.destinations.read().unwrap().contains_key(dest);
            if !known {
                self.destinations.write().unwrap().insert(
                    dest.clone(),
                    q.name.clone(),
                    q.name.len(),
                );
            }
        }
        let registry = self.registry.clone();
        if in_multi || (one_call && !form.is_blocking()) {
            let call = pop.single_call();
            return Intercept::Rewrite {
                request: call.request(full),
                transform: ScriptReply::boxed(call, move |v| {
                    let done = pop.popped(&v);
                    after_pop(&registry, &done);
                    done.reply.unwrap_or_else(|| pop.multi_empty_reply())
                }),
            };
        }
        if form.is_blocking() {
            return Intercept::Block(pop);
        }
        Intercept::Job(Job::new(move |caller| async move {
            match pop.run(&caller).await {
                Ok(done) => {
                    after_pop(&registry, &done);
                    done.reply.unwrap_or_else(|| pop.multi_empty_reply())
                }
                Err(e) => e.to_reply(),
            }
        }))
    }

    /// Waits until the pop gets a message or its timeout passes.
    pub async fn blocking_pop(&self, pop: Pop, _client: Arc<ClientState>) -> Bytes {
        let timeout = pop.timeout;
        let timeout_reply = pop.timeout_reply();
        let rx = self.waiters.park(pop);
        if let crate::timeout::Timeout::Millis(ms) = timeout {
            match tokio::time::timeout(Duration::from_millis(ms), rx).await {
                Ok(Ok(reply)) => reply,
                Ok(Err(_)) => Bytes::from_static(b"-ERR ackproxy: blocking pop abandoned\r\n"),
                Err(_) => timeout_reply,
            }
        } else {
            rx.await.unwrap_or_else(|_| {
                Bytes::from_static(b"-ERR ackproxy: blocking pop abandoned\r\n")
            })
        }
    }
}

/// Bookkeeping after a pop leased messages: the reaper learns the queue,
/// and the messages are counted under their rule.
fn after_pop(registry: &registry::Registry, done: &pop::Popped) {
    registry.record(done);
    if let Some(q) = &done.queue {
        crate::telemetry::rule(&q.rule.pattern)
            .pops
            .increment(done.count as u64);
    }
}

/// The upstream's reply, unchanged.
struct Verbatim;

impl ReplyTransform for Verbatim {
    fn apply(&mut self, reply: Bytes) -> crate::output::Transformed {
        crate::output::Transformed::Done(reply)
    }
}
