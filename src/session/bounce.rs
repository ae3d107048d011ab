//! Requests a cluster node turned away on the client's dedicated
//! connection (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN` while slots move
//! or a primary fails over), sent again where they belong, so that the
//! client sees what Redis Cluster clients see after their retries: the
//! reply, never the redirection.
//!
//! The dedicated connection holds the turned-away reply's place in the
//! client's reply stream and hands the request back here (see
//! `upstream::dedicated::Routed`). A request outside a transaction is sent
//! again: after a backoff on the same connection (`ASK`, `TRYAGAIN`,
//! `CLUSTERDOWN`: the slot is on its way or the cluster is electing), or on
//! a connection to the new owner (`MOVED`), which the client keeps from
//! then on. A request queued in a transaction makes Redis abort its EXEC:
//! the client is told `QUEUED`, and the transaction runs again, whole, where
//! its slot is. A transaction under a WATCH whose keys moved is aborted as
//! Redis aborts one whose watched keys changed (migrating a key deletes it
//! from the old owner, which touches it). Retries end at the connect
//! timeout, with the node's last reply.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;

use super::mode::Mode;
use super::Session;
use crate::cluster::map::{parse_redirect, Redirect};
use crate::command::{Args, Kind};
use crate::error::UpstreamError;
use crate::output::ReplyTransform;
use crate::upstream::dedicated::{is_redirection, transform_exec, Bounced, Expect, Role, Routed};

pub(super) struct Bounces {
    tx: mpsc::UnboundedSender<Bounced>,
    rx: mpsc::UnboundedReceiver<Bounced>,
    /// The number of the client's open (or last) transaction.
    tx_number: u64,
    /// The requests queued in the open transaction, for a replay.
    queued: Vec<Bytes>,
    /// A request queued in transaction `.0` was turned away: Redis aborts
    /// its EXEC, which runs it again, at `.1` if a node named its owner.
    doomed: Option<(u64, Option<String>)>,
    /// The connection that held the client's WATCH was given up for one to
    /// the watched keys' new owner: the next EXEC fails, as on Redis.
    watch_lost: bool,
}

impl Default for Bounces {
    fn default() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Bounces {
            tx,
            rx,
            tx_number: 0,
            queued: Vec::new(),
            doomed: None,
            watch_lost: false,
        }
    }
}

/// Waits before a request is sent again, longer each time (20 ms to
/// 500 ms, as the shared connections' retries).
fn backoff(hops: u32) -> Duration {
    Duration::from_millis(20u64 << hops.min(5)).min(Duration::from_millis(500))
}

impl Bounces {
    pub(super) fn sender(&self) -> mpsc::UnboundedSender<Bounced> {
        self.tx.clone()
    }

    /// A turned-away request not handled yet (the dedicated connection
    /// rings the session's doorbell for each).
    pub(super) fn next(&mut self) -> Option<Bounced> {
        self.rx.try_recv().ok()
    }

    /// The expectation of a request written to the dedicated connection,
    /// after `mode` took it in: requests with keys, and EXEC, become
    /// [`Routed`]. `watched` and `queued_before` are the mode's before.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn route(
        &mut self,
        kind: Kind,
        args: Args<'_>,
        frame: &[u8],
        expect: Option<Expect>,
        watched: bool,
        queued_before: usize,
        mode: &Mode,
    ) -> Option<Expect> {
        if kind == Kind::Multi {
            self.tx_number += 1;
            self.queued.clear();
        }
        if !mode.watch {
            self.watch_lost = false;
        }
        let queued = mode.queued() > queued_before;
        if queued {
            self.queued.push(Bytes::copy_from_slice(frame));
        }
        let role = match expect {
            Some(Expect::Raw) if queued && has_slot(args) => Role::Queued { tx: self.tx_number },
            Some(Expect::Raw) if kind == Kind::EndTransaction && args.is(0, "EXEC") => Role::Exec {
                tx: self.tx_number,
                frames: std::mem::take(&mut self.queued),
                watched,
                transforms: Vec::new(),
            },
            Some(Expect::Exec(transforms)) => Role::Exec {
                tx: self.tx_number,
                frames: std::mem::take(&mut self.queued),
                watched,
                transforms,
            },
            Some(Expect::Raw) if has_slot(args) => Role::Plain,
            other => {
                if kind == Kind::EndTransaction {
                    self.queued.clear();
                }
                return other;
            }
        };
        Some(Expect::Routed(Box::new(Routed {
            request: Bytes::copy_from_slice(frame),
            seq: None,
            since: None,
            hops: 0,
            role,
        })))
    }
}

fn has_slot(args: Args<'_>) -> bool {
    let slot = crate::command::table::with_current(|t| crate::cluster::slot::command_slot(args, t));
    matches!(slot, crate::cluster::slot::CommandSlot::Slot(_))
}

/// The reply of an EXEC whose transaction Redis aborted for its WATCH.
fn null_reply(protocol: u8) -> Bytes {
    Bytes::from_static(if protocol == 3 { b"_\r\n" } else { b"*-1\r\n" })
}

/// DISCARD's reply, for the client's EXEC of a transaction that fails.
struct Aborted(u8);

impl ReplyTransform for Aborted {
    fn apply(&mut self, _discarded: Bytes) -> crate::output::Transformed {
        crate::output::Transformed::Done(null_reply(self.0))
    }
}

impl Session {
    /// An EXEC after the connection with the client's WATCH was given up:
    /// the transaction is discarded and the client gets the reply of a
    /// transaction whose watched keys changed. Returns whether it did so.
    pub(super) async fn watch_lost_at_exec(&mut self, args: Args<'_>) -> bool {
        let lost = self.bounces.as_ref().is_some_and(|b| b.watch_lost);
        if !(lost && self.mode.multi && args.is(0, "EXEC")) {
            return false;
        }
        let Some(d) = self.dedicated.as_mut() else {
            return false;
        };
        self.mode.apply(Kind::EndTransaction, args, None);
        if let Some(b) = &mut self.bounces {
            b.watch_lost = false;
            b.queued.clear();
        }
        let aborted = Expect::Transformed(Box::new(Aborted(d.protocol())));
        self.out.sent_dedicated(true);
        if let Err(e) = d.send(b"*1\r\n$7\r\nDISCARD\r\n", Some(aborted)).await {
            self.out.ready(Bytes::from(e.to_reply()), 1);
        }
        true
    }

    /// A request a node turned away: sent again where it belongs (see the
    /// module's text).
    pub(super) async fn bounced(&mut self, b: Bounced) {
        let Bounced { mut routed, reply } = b;
        let Some(seq) = routed.seq else { return };
        let since = *routed.since.get_or_insert_with(Instant::now);
        if let Role::Queued { tx } = routed.role {
            // Redis aborts this transaction's EXEC; it runs again then.
            let to = match parse_redirect(&reply) {
                Some(Redirect::Moved { slot, addr }) => {
                    self.topology().map(|t| t.moved(slot, &addr))
                }
                _ => None,
            };
            if let Some(b) = &mut self.bounces {
                b.doomed = Some((tx, to));
            }
            self.out.fill(seq, Ok(Bytes::from_static(b"+QUEUED\r\n")));
            return;
        }
        if matches!(routed.role, Role::Exec { .. }) {
            return self.replay(seq, routed, reply).await;
        }
        if since.elapsed() >= self.ctx.config.connect_timeout() {
            // What a client of Redis Cluster gets after its retries.
            return self.out.fill(seq, Ok(reply));
        }
        routed.hops += 1;
        match parse_redirect(&reply) {
            Some(Redirect::Moved { slot, addr }) => {
                let Some(addr) = self.topology().map(|t| t.moved(slot, &addr)) else {
                    return self.out.fill(seq, Ok(reply));
                };
                if routed.hops > 1 {
                    // The two owners each send it to the other until both
                    // know the slot moved.
                    tokio::time::sleep(backoff(routed.hops)).await;
                }
                if self.dedicated_node.as_deref() != Some(addr.as_str()) {
                    if !self.movable() {
                        return self.out.fill(seq, Ok(reply));
                    }
                    if let Err(e) = self.move_dedicated(addr).await {
                        return self.out.fill(seq, Err(e));
                    }
                }
            }
            _ => {
                if reply.starts_with(b"-CLUSTERDOWN") {
                    if let Some(t) = self.topology() {
                        t.refresh_soon();
                    }
                }
                tokio::time::sleep(backoff(routed.hops)).await;
            }
        }
        self.send_routed(seq, routed).await;
    }

    async fn send_routed(&mut self, seq: u64, routed: Routed) {
        let Some(d) = self.dedicated.as_mut() else {
            return self.out.fill(seq, Err(UpstreamError::ConnectionLost));
        };
        let request = routed.request.clone();
        if let Err(e) = d
            .send(&request, Some(Expect::Routed(Box::new(routed))))
            .await
        {
            self.out.fill(seq, Err(e));
        }
    }

    /// An EXEC Redis aborted: run again, whole, where its slot is, if it
    /// was aborted because a node turned a queued request away.
    async fn replay(&mut self, seq: u64, routed: Routed, reply: Bytes) {
        let Role::Exec {
            tx,
            frames,
            watched,
            transforms,
        } = routed.role
        else {
            return;
        };
        let doomed = self
            .bounces
            .as_mut()
            .and_then(|b| b.doomed.take_if(|(t, _)| *t == tx).map(|(_, to)| to));
        // Redis checks the queued requests' slot again at EXEC, and
        // discards the transaction when a node turns EXEC away.
        let mut to = match (doomed, parse_redirect(&reply)) {
            (_, Some(Redirect::Moved { slot, addr })) => {
                self.topology().map(|t| t.moved(slot, &addr))
            }
            (Some(to), _) => to,
            (None, _) if is_redirection(&reply) => None,
            // Aborted for an error Redis gave the client when it queued.
            (None, _) => return self.out.fill(seq, Ok(reply)),
        };
        if watched {
            // Its watched keys are in the slot that moved.
            let protocol = self.dedicated.as_ref().map_or(2, |d| d.protocol());
            return self.out.fill(seq, Ok(null_reply(protocol)));
        }
        let since = routed.since.unwrap_or_else(Instant::now);
        let mut hops = 0;
        let mut request = BytesMut::from(&b"*1\r\n$5\r\nMULTI\r\n"[..]);
        for f in &frames {
            request.extend_from_slice(f);
        }
        request.extend_from_slice(b"*1\r\n$4\r\nEXEC\r\n");
        loop {
            if let Some(addr) = to.take() {
                if self.dedicated_node.as_deref() != Some(addr.as_str()) {
                    if let Err(e) = self.move_dedicated(addr).await {
                        return self.out.fill(seq, Err(e));
                    }
                }
            }
            let Some(d) = self.dedicated.as_mut() else {
                return self.out.fill(seq, Err(UpstreamError::ConnectionLost));
            };
            let (done, replies) = tokio::sync::oneshot::channel();
            let gather = Expect::Gather {
                left: frames.len() as u32 + 2,
                got: BytesMut::new(),
                tx: done,
            };
            if let Err(e) = d.send(&request, Some(gather)).await {
                return self.out.fill(seq, Err(e));
            }
            let Ok(all) = replies.await else {
                return self.out.fill(seq, Err(UpstreamError::ConnectionLost));
            };
            let parts = split_replies(&all);
            let exec = parts.last().cloned().unwrap_or_default();
            let away = parts
                .get(1..parts.len().saturating_sub(1))
                .unwrap_or_default()
                .iter()
                .find(|p| is_redirection(p));
            let Some(away) = away else {
                return self.out.fill(seq, Ok(transform_exec(transforms, exec)));
            };
            if since.elapsed() >= self.ctx.config.connect_timeout() {
                return self.out.fill(seq, Ok(exec));
            }
            hops += 1;
            match parse_redirect(away) {
                Some(Redirect::Moved { slot, addr }) => {
                    to = self.topology().map(|t| t.moved(slot, &addr));
                    if hops > 1 {
                        tokio::time::sleep(backoff(hops)).await;
                    }
                }
                _ => tokio::time::sleep(backoff(hops)).await,
            }
        }
    }

    /// Whether the client's dedicated connection can be given up for one
    /// to another node: it holds nothing a new one would not have but a
    /// WATCH (which then fails, see `watch_lost`).
    fn movable(&self) -> bool {
        self.auth == crate::auth::State::Open
            && !self.mode.multi
            && !self.mode.sticky
            && !self.mode.unpaired
            && self
                .dedicated
                .as_ref()
                .is_none_or(|d| d.subscriptions() == 0)
    }

    /// The client's dedicated connection to `addr` from now on, once the
    /// one it has answered everything sent on it.
    async fn move_dedicated(&mut self, addr: String) -> Result<(), UpstreamError> {
        if let Some(d) = &self.dedicated {
            d.idle().await;
        }
        let watching = self.mode.watch;
        self.dedicated = None;
        self.node_wanted = Some(addr);
        self.open_dedicated(false).await?;
        if let Some(d) = &self.dedicated {
            d.set_bound(self.mode.any());
        }
        if watching {
            if let Some(b) = &mut self.bounces {
                b.watch_lost = true;
            }
        }
        Ok(())
    }

    fn topology(&self) -> Option<&std::sync::Arc<crate::cluster::topology::Topology>> {
        self.ctx.cluster.as_ref()
    }
}

/// The complete replies in `bytes`, one by one.
fn split_replies(bytes: &Bytes) -> Vec<Bytes> {
    let mut scanner = crate::resp::ReplyScanner::new();
    let mut parts = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        match scanner.scan(&bytes[at..]) {
            Ok(Some(len)) => {
                parts.push(bytes.slice(at..at + len));
                at += len;
            }
            _ => break,
        }
    }
    parts
}
