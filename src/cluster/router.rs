//! Requests on the shared connections, sent to the cluster node that owns
//! their keys. Each request of a batch is routed on its own: to the owner
//! of its hash slot, split over the slots of its keys (`MGET`, `MSET`,
//! `DEL`, `UNLINK`, `EXISTS`, `TOUCH`), sent to every primary (see
//! [`super::fanout`]), or refused as Redis Cluster refuses it. A reply that
//! redirects (`MOVED`, `ASK`) or asks to retry (`TRYAGAIN`, `CLUSTERDOWN`)
//! never reaches the client: the request is sent again where it belongs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use super::fanout::{self, Merge, Plan};
use super::map::{parse_redirect, Redirect as Moved};
use super::topology::Topology;
use crate::output::{ClientState, Reply};
use crate::resp::scanner::{Limits, RequestScanner, Scan};
use crate::upstream::shared::{Pending, Redirect, Redirector, Request, Router, SharedUpstream, Target, To};
use crate::upstream::Endpoint;

/// Redirections one request follows before its last one is the reply:
/// more means the nodes disagree for longer than a resharding step takes.
const MAX_MOVES: u8 = 5;
/// `TRYAGAIN` and `CLUSTERDOWN` retries of one request (backing off from
/// 20 ms to 500 ms: some 6 s in all, longer than a failover's detection
/// with a node timeout of a few seconds).
const MAX_RETRIES: u8 = 18;

/// What kind of connection a [`Shared`] opens to each node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// A pair (writes and reads lanes), as for clients.
    Pair,
    /// A pair that speaks RESP3.
    Resp3,
    /// One connection, for the proxy's own requests.
    Single,
}

/// The shared connections of one kind to every node, as one
/// [`SharedUpstream`] (see [`Shared::handle`]).
pub struct Shared {
    inner: Arc<Inner>,
}

struct Inner {
    /// For the redirection handler, which runs with `&self`.
    me: std::sync::Weak<Inner>,
    topology: Arc<Topology>,
    flavor: Flavor,
    nodes: Mutex<HashMap<String, SharedUpstream>>,
}

impl Shared {
    /// A handle that sends each request to its node.
    pub fn handle(topology: Arc<Topology>, flavor: Flavor) -> SharedUpstream {
        let inner = Arc::new_cyclic(|me| Inner {
            me: me.clone(),
            topology,
            flavor,
            nodes: Mutex::new(HashMap::new()),
        });
        SharedUpstream::routed(Arc::new(Shared { inner }))
    }
}

impl Inner {
    /// The connection (pair) to the node at `addr`, opened on first use.
    fn node(&self, addr: &str) -> SharedUpstream {
        let mut nodes = self.nodes.lock().unwrap();
        if let Some(s) = nodes.get(addr) {
            return s.clone();
        }
        let endpoint: Arc<Endpoint> = self.topology.endpoint(addr);
        let s = match self.flavor {
            Flavor::Pair => SharedUpstream::spawn_pair(endpoint),
            Flavor::Resp3 => SharedUpstream::spawn_resp3(endpoint),
            Flavor::Single => SharedUpstream::spawn(endpoint),
        };
        nodes.insert(addr.to_string(), s.clone());
        s
    }

    /// Sends one request to the owner of `slot` (any node for `None`),
    /// following redirections.
    fn send_one(self: &Arc<Self>, frame: Bytes, slot: Option<u16>, pending_for: PendingFor, reads: bool) {
        let addr = match slot {
            Some(slot) => self.topology.owner(slot),
            None => self.topology.any(),
        };
        let redirect = Box::new(Redirect {
            request: frame.clone(),
            slot,
            hops: 0,
            retries: 0,
            asking: false,
            handler: self.clone(),
        });
        let pending = pending_for.pending(Some(redirect));
        let Some(addr) = addr else {
            return pending.answer(Ok(no_slot_owner()));
        };
        self.node(&addr).push(
            Request {
                bytes: frame,
                pending,
            },
            reads,
        );
    }

    /// Sends one request and awaits its reply (a part of a split or
    /// fanned-out request).
    async fn call(self: Arc<Self>, frame: Bytes, slot: Option<u16>, client: Arc<ClientState>) -> Reply {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send_one(frame, slot, PendingFor::new(Target::Call(tx), client), false);
        rx.await
            .unwrap_or(Err(crate::error::UpstreamError::ConnectionLost))
    }

    /// Sends `frame` to every primary and awaits their replies.
    async fn call_all(self: Arc<Self>, frame: Bytes, client: Arc<ClientState>) -> Vec<Reply> {
        let primaries = self.topology.primaries();
        let mut calls = Vec::with_capacity(primaries.len());
        for addr in primaries {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let pending = Pending::new(Target::Call(tx), client.clone(), None);
            self.node(&addr).push(
                Request {
                    bytes: frame.clone(),
                    pending,
                },
                false,
            );
            calls.push(rx);
        }
        let mut replies = Vec::with_capacity(calls.len());
        for rx in calls {
            replies.push(rx.await.unwrap_or(Err(crate::error::UpstreamError::ConnectionLost)));
        }
        replies
    }

    /// Runs a request that is not one node's: its parts, then the merge.
    fn spawn_plan(self: &Arc<Self>, plan: Plan, pending: Pending) {
        let inner = self.clone();
        let client = pending.client().clone();
        tokio::spawn(async move {
            let reply = match plan {
                Plan::Split { parts, merge } => {
                    let calls = parts
                        .into_iter()
                        .map(|(slot, frame)| inner.clone().call(frame, Some(slot), client.clone()));
                    let replies = join_all(calls).await;
                    fanout::merge(&merge, replies)
                }
                Plan::All { frame, merge } => {
                    let replies = inner.clone().call_all(frame, client.clone()).await;
                    fanout::merge(&merge, replies)
                }
                Plan::Scan { node, frame } => {
                    let primaries = inner.topology.primaries();
                    match primaries.get(node) {
                        Some(addr) => {
                            let addr = addr.clone();
                            let reply = inner.clone().call_at(&addr, frame, client.clone()).await;
                            fanout::merge(
                                &Merge::Scan {
                                    node,
                                    nodes: primaries.len(),
                                },
                                vec![reply],
                            )
                        }
                        None => Ok(Bytes::from_static(b"-ERR invalid cursor\r\n")),
                    }
                }
                Plan::Answer(bytes) => Ok(bytes),
                Plan::One { .. } => unreachable!("sent directly"),
            };
            pending.answer(reply);
        });
    }

    async fn call_at(self: Arc<Self>, addr: &str, frame: Bytes, client: Arc<ClientState>) -> Reply {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let pending = Pending::new(Target::Call(tx), client, None);
        self.node(addr).push(
            Request {
                bytes: frame,
                pending,
            },
            false,
        );
        rx.await
            .unwrap_or(Err(crate::error::UpstreamError::ConnectionLost))
    }
}

/// How the reply slot of a request is made, once it is known whether it
/// goes to one node (a pending request with a redirection handler) or is
/// answered after a merge.
struct PendingFor {
    target: Target,
    client: Arc<ClientState>,
}

impl PendingFor {
    fn new(target: Target, client: Arc<ClientState>) -> PendingFor {
        PendingFor { target, client }
    }

    fn pending(self, redirect: Option<Box<Redirect>>) -> Pending {
        Pending::new(self.target, self.client, redirect)
    }
}

async fn join_all<F: std::future::Future<Output = Reply>>(calls: impl Iterator<Item = F>) -> Vec<Reply> {
    // Sent as they are built (each call enqueues before its first await
    // returns), then awaited in order.
    let futures: Vec<_> = calls.map(Box::pin).collect();
    let mut replies = Vec::with_capacity(futures.len());
    for f in futures {
        replies.push(f.await);
    }
    replies
}

fn no_slot_owner() -> Bytes {
    Bytes::from_static(b"-CLUSTERDOWN Hash slot not served\r\n")
}

impl Router for Shared {
    fn send(&self, bytes: Bytes, count: u32, client: &Arc<ClientState>, to: To, reads: bool) {
        let mut scanner = RequestScanner::new(Limits::default());
        let mut rest = bytes;
        let mut to = Some(to);
        let mut sent = 0;
        while sent < count && !rest.is_empty() {
            let n = match scanner.scan(&rest) {
                Scan::Skip(n) => {
                    let _ = rest.split_to(n);
                    continue;
                }
                Scan::Command(n) => n,
                // Batches hold whole multibulk requests only.
                _ => break,
            };
            let frame = rest.split_to(n);
            let plan = crate::command::table::with_current(|table| {
                fanout::plan(crate::command::Args::new(&frame, scanner.args()), table, &frame)
            });
            sent += 1;
            let target = match to.take() {
                Some(To::Client(transform)) => Target::Slot(client.reserve(1, transform)),
                Some(To::Call(tx)) => Target::Call(tx),
                Some(To::Discard) => {
                    to = Some(To::Discard);
                    Target::Discard
                }
                // The transform was the first request's: the others
                // take none.
                None => Target::Slot(client.reserve(1, None)),
            };
            let pending_for = PendingFor::new(target, client.clone());
            match plan {
                Plan::One { slot } => self.inner.send_one(frame, slot, pending_for, reads),
                plan => self.inner.spawn_plan(plan, pending_for.pending(None)),
            }
        }
    }

    fn is_congested(&self) -> bool {
        self.inner
            .nodes
            .lock()
            .unwrap()
            .values()
            .any(SharedUpstream::is_congested)
    }
}

impl Redirector for Inner {
    fn redirect(&self, request: Request, mut redirect: Box<Redirect>, reply: Bytes) {
        let Request { bytes, pending } = request;
        match parse_redirect(&reply) {
            Some(Moved::Moved { slot, addr }) if redirect.hops < MAX_MOVES => {
                let addr = self.topology.moved(slot, &addr);
                redirect.hops += 1;
                redirect.asking = false;
                let node = self.node(&addr);
                node.push(
                    Request {
                        bytes,
                        pending: pending.resent(redirect),
                    },
                    false,
                );
            }
            Some(Moved::Ask { addr, .. }) if redirect.hops < MAX_MOVES => {
                let addr = self.topology.resolve(&addr);
                redirect.hops += 1;
                redirect.asking = true;
                let mut asking = BytesMut::with_capacity(bytes.len() + 16);
                asking.extend_from_slice(b"*1\r\n$6\r\nASKING\r\n");
                asking.extend_from_slice(&bytes);
                self.node(&addr).push(
                    Request {
                        bytes: asking.freeze(),
                        pending: pending.resent(redirect),
                    },
                    false,
                );
            }
            None if redirect.retries < MAX_RETRIES => {
                // TRYAGAIN (keys of a slot being moved, split for now) or
                // CLUSTERDOWN (a failover under way): later, to the owner
                // of the moment.
                if reply.starts_with(b"-CLUSTERDOWN") {
                    self.topology.refresh_soon();
                }
                let delay = Duration::from_millis(20u64 << redirect.retries.min(5)).min(Duration::from_millis(500));
                redirect.retries += 1;
                redirect.asking = false;
                let topology = self.topology.clone();
                let slot = redirect.slot;
                let Some(me) = self.me.upgrade() else {
                    return pending.answer(Ok(reply));
                };
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let addr = match slot {
                        Some(slot) => topology.owner(slot),
                        None => topology.any(),
                    };
                    let Some(addr) = addr else {
                        return pending.answer(Ok(no_slot_owner()));
                    };
                    me.node(&addr).push(
                        Request {
                            bytes,
                            pending: pending.resent(redirect),
                        },
                        false,
                    );
                });
            }
            // Too many: the last one is the reply.
            _ => pending.answer(Ok(reply)),
        }
    }
}
