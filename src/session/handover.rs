//! The handle `queue/` gets on the client's connection when the session
//! hands it a queue request (see [`crate::queue::Conn`]): the session's
//! part is only where bytes go and how the client's stream is kept in
//! order.

use bytes::Bytes;

use super::{buffers, Session, QUERY_BUFFER_LIMIT};
use crate::command::{Args, Kind};
use crate::output::ReplyTransform;
use crate::queue::library::call::Caller;
use crate::queue::{Conn, Left, Place, Wait};
use crate::telemetry::Route as Served;
use crate::upstream::dedicated::Expect;

impl Conn for Session {
    async fn answer(&mut self, reply: Bytes) {
        self.answer_as(reply, Served::Queue).await;
    }

    async fn abort_transaction(&mut self) {
        self.fail_transaction().await;
    }

    async fn send(&mut self, kind: Kind, call: Bytes, reply: Box<dyn ReplyTransform>, to: Place) {
        let none = Args::new(&[], &[]);
        match to {
            Place::Transaction => {
                self.send_dedicated(kind, none, &call, Some(reply), None)
                    .await;
            }
            // (A client in a stateful mode cannot have it run on its own
            // connection, which may be in another database or protocol.)
            Place::Alone => {
                if self.switch_to_dedicated().await {
                    let expect = Some(Expect::Transformed(reply));
                    self.send_dedicated(kind, none, &call, None, expect).await;
                }
            }
            Place::Shared => self.send_queue_shared(call, reply).await,
        }
    }

    fn hold_next(&mut self, resolved: tokio::sync::oneshot::Receiver<()>) {
        self.held = Some(resolved);
    }

    async fn caller(&mut self) -> Caller {
        self.after_sent_before().await;
        Caller {
            shared: self.queue_shared().unwrap_or_else(|| self.shared.clone()),
            client: self.out.clone(),
            db: self.db(),
        }
    }

    async fn park(&mut self, wait: Wait<'_>, unblocked: Bytes) -> Result<(), Left> {
        self.client.parked(true);
        let ended = self.parked(wait, unblocked).await;
        self.client.parked(false);
        ended
    }
}

impl Session {
    /// Waits until everything the client sent before has run: on its
    /// dedicated connection and on its user's shared one.
    async fn after_sent_before(&mut self) {
        if self.pinned {
            if let Some(d) = &self.dedicated {
                d.idle().await;
            }
        }
        self.out.shared_drained().await;
    }

    /// A call on the shared connection of the client's database.
    async fn send_queue_shared(&mut self, request: Bytes, transform: Box<dyn ReplyTransform>) {
        // A client pinned for SELECT n, AUTH or HELLO pops on a shared
        // connection of its database, once what it sent on its dedicated
        // connection is done.
        if let Some(d) = &self.dedicated {
            if self.pinned {
                d.idle().await;
            }
        }
        if let Some(shared) = self.queue_shared() {
            // (Its next request, on its dedicated connection, waits for
            // this: see `switch_to_dedicated`.)
            let transform = Box::new(crate::queue::InDb {
                inner: transform,
                shared: shared.clone(),
            });
            shared.send(request, 1, &self.out, Some(transform));
        } else if self.member.is_some() || self.meta.protocol == 3 {
            // Two connections (its user's, or RESP3): what the client sent
            // on the other runs first, and what it sends next waits for
            // this.
            self.out.shared_drained().await;
            self.shared.send(request, 1, &self.out, Some(transform));
            self.out.shared_drained().await;
        } else {
            self.avoid_congestion();
            self.enter_writes_lane().await;
            self.shared.send(request, 1, &self.out, Some(transform));
        }
    }

    /// The wait of a blocking pop that found nothing at once.
    async fn parked(&mut self, mut wait: Wait<'_>, timeout: Bytes) -> Result<(), Left> {
        let state = self.out.clone();
        let unblocked = self.client.unblocked(timeout);
        tokio::pin!(unblocked);
        let mut shutdown = self.ctx.shutdown.clone();
        loop {
            tokio::select! {
                reply = &mut wait => {
                    self.out.answer(reply, Served::Queue);
                    return Ok(());
                }
                // CLIENT UNBLOCK: as if the pop timed out (or failed). A
                // message leased for it meanwhile comes back when its lease
                // expires.
                reply = &mut unblocked => {
                    self.out.answer(reply, Served::Queue);
                    return Ok(());
                }
                _ = state.closed() => return Err(Left::Gone),
                // As Redis's SHUTDOWN closes its blocked clients: the replies
                // before this pop are written, then the connection closes
                // without one for the pop, at once rather than when the
                // drain period ends. A message the dispatcher leased for it
                // meanwhile comes back when its lease expires.
                Ok(_) = shutdown.wait_for(|stop| *stop) => return Err(Left::Shutdown),
                r = self.rd.readable() => {
                    if r.is_err() {
                        return Err(Left::Gone);
                    }
                    // Keep what the client sends meanwhile for later, but
                    // notice when it goes away: its pop is then abandoned.
                    crate::resp::grow(&mut self.buf, buffers::READ_SIZE);
                    match self.rd.try_read_buf(&mut self.buf) {
                        Ok(0) => return Err(Left::Gone),
                        Ok(_) => {
                            // Sent before this pop's reply: not after it.
                            self.pop_order.read_while_parked();
                            if self.buf.len() > QUERY_BUFFER_LIMIT {
                                return Err(Left::Gone);
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(_) => return Err(Left::Gone),
                    }
                }
            }
        }
    }
}
