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
use crate::error::UpstreamError;
use crate::output::{ClientState, Reply};
use crate::resp::scanner::{Limits, RequestScanner, Scan};
use crate::upstream::shared::{
    Pending, Redirect, Redirector, Request, Router, SharedUpstream, Target, To,
};
use crate::upstream::Endpoint;

/// Redirections one request follows at once: more means the nodes
/// disagree, and the request is tried again after a backoff (see
/// `MAX_RETRIES`), which only then answers with the last one.
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
    fn send_one(
        self: &Arc<Self>,
        frame: Bytes,
        slot: Option<u16>,
        pending_for: PendingFor,
        reads: bool,
    ) {
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
        let Some(addr) = addr else {
            // No primary serves the slot for now (one failed, a replica
            // is not promoted yet): asked again as the map changes.
            self.topology.refresh_soon();
            let pending = pending_for.pending(None);
            return self.later(frame, pending, redirect, Ok(no_slot_owner()));
        };
        let pending = pending_for.pending(Some(redirect));
        self.node(&addr).push(
            Request {
                bytes: frame,
                pending,
            },
            reads,
        );
    }

    /// Sends one request (a part of a split or fanned-out one); the
    /// receiver gets its reply.
    fn part(self: &Arc<Self>, frame: Bytes, slot: Option<u16>, client: &Arc<ClientState>) -> Call {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send_one(
            frame,
            slot,
            PendingFor::new(Target::Call(tx), client.clone()),
            false,
        );
        rx
    }

    /// Sends `frame` to the node at `addr` as it is (no redirection: a
    /// request for every node, or for one node in particular).
    fn part_at(&self, addr: &str, frame: Bytes, client: &Arc<ClientState>) -> Call {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let pending = Pending::new(Target::Call(tx), client.clone(), None);
        self.node(addr).push(
            Request {
                bytes: frame,
                pending,
            },
            false,
        );
        rx
    }

    /// Runs a request that is not one node's: its parts are sent now, so
    /// that they go ahead of the client's next requests, and their replies
    /// merged once in.
    fn run_plan(self: &Arc<Self>, plan: Plan, pending: Pending) {
        let client = pending.client().clone();
        let (calls, merge) = match plan {
            Plan::Split { parts, merge } => {
                let calls = parts
                    .into_iter()
                    .map(|(slot, frame)| self.part(frame, Some(slot), &client))
                    .collect();
                (calls, merge)
            }
            Plan::All { frame, merge } => {
                let calls = self
                    .topology
                    .primaries()
                    .iter()
                    .map(|addr| self.part_at(addr, frame.clone(), &client))
                    .collect();
                (calls, merge)
            }
            Plan::Scan { node, frame } => {
                let primaries = self.topology.primaries();
                let Some(addr) = primaries.get(node) else {
                    // Redis takes any number as a cursor and guarantees
                    // nothing for one it did not give: a cursor past the
                    // last node ends the iteration, as a single Redis's
                    // cursor past its table would.
                    return pending.answer(Ok(Bytes::from_static(b"*2\r\n$1\r\n0\r\n*0\r\n")));
                };
                let merge = Merge::Scan {
                    node,
                    nodes: primaries.len(),
                };
                (vec![self.part_at(addr, frame, &client)], merge)
            }
            Plan::Answer(bytes) => return pending.answer(Ok(bytes)),
            Plan::One { .. } => unreachable!("sent with send_one"),
        };
        tokio::spawn(async move {
            let mut replies = Vec::with_capacity(calls.len());
            for rx in calls {
                replies.push(rx.await.unwrap_or(Err(UpstreamError::ConnectionLost)));
            }
            pending.answer(fanout::merge(&merge, replies));
        });
    }
}

type Call = tokio::sync::oneshot::Receiver<Reply>;

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
                fanout::plan(
                    crate::command::Args::new(&frame, scanner.args()),
                    table,
                    &frame,
                )
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
                plan => self.inner.run_plan(plan, pending_for.pending(None)),
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
            Some(_) if redirect.retries < MAX_RETRIES => {
                // The nodes still disagree after MAX_MOVES hops: the two
                // owners of a slot each learnt of its move (CLUSTER SETSLOT
                // … NODE) at another moment, and send the request to each
                // other until both know. Later, to the owner of the moment,
                // with the hops counted afresh; a client of Redis Cluster
                // would retry too, never shown the redirection.
                self.topology.refresh_soon();
                redirect.hops = 0;
                self.later(bytes, pending, redirect, Ok(reply));
            }
            None if redirect.retries < MAX_RETRIES => {
                // TRYAGAIN (keys of a slot being moved, split for now) or
                // CLUSTERDOWN (a failover under way): later, to the owner
                // of the moment. The retried request may be redirected as
                // many times as a new one.
                if reply.starts_with(b"-CLUSTERDOWN") {
                    self.topology.refresh_soon();
                }
                redirect.hops = 0;
                self.later(bytes, pending, redirect, Ok(reply));
            }
            // Too many: the last one is the reply.
            _ => pending.answer(Ok(reply)),
        }
    }

    fn unreachable(&self, request: Request, redirect: Box<Redirect>, error: UpstreamError) {
        let Request { bytes, pending } = request;
        if redirect.retries >= MAX_RETRIES {
            return pending.answer(Err(error));
        }
        // The node may have failed: the cluster names its successor once
        // a replica takes over.
        self.topology.refresh_soon();
        self.later(bytes, pending, redirect, Err(error));
    }
}

impl Inner {
    /// Sends a request again after a backoff, to the owner of its slot
    /// then; `otherwise` answers it if the router is gone by then.
    fn later(&self, bytes: Bytes, pending: Pending, mut redirect: Box<Redirect>, otherwise: Reply) {
        let delay =
            Duration::from_millis(20u64 << redirect.retries.min(5)).min(Duration::from_millis(500));
        redirect.retries += 1;
        redirect.asking = false;
        let Some(me) = self.me.upgrade() else {
            return pending.answer(otherwise);
        };
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let addr = match redirect.slot {
                Some(slot) => me.topology.owner(slot),
                None => me.topology.any(),
            };
            let Some(addr) = addr else {
                if redirect.retries >= MAX_RETRIES {
                    return pending.answer(Ok(no_slot_owner()));
                }
                me.topology.refresh_soon();
                let otherwise = Ok(no_slot_owner());
                return me.later(bytes, pending, redirect, otherwise);
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
}
