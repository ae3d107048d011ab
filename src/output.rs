//! The ordered reply stream of one client. Replies come from several places (the shared
//! upstream, a dedicated connection, the proxy itself) and must reach the
//! client in request order. Each request takes a slot in one ordered queue
//! when it is sent; whoever gets its reply fills the slot; the writer task
//! is woken only when the slot at the head is filled, and writes every
//! filled slot from the head on in one go.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;

use crate::error::UpstreamError;
use crate::net::WriteHalf;
use crate::telemetry::{self, Latency, Route};

pub type Reply = Result<Bytes, UpstreamError>;

/// Turns the upstream's reply to a rewritten request into the reply the
/// client expects for the request it sent.
pub trait ReplyTransform: Send {
    fn apply(&mut self, upstream_reply: Bytes) -> Transformed;

    /// Where its further requests ([`Transformed::Retry`],
    /// [`Transformed::Continue`]) go, if not on the client's shared
    /// upstream: a queue operation in another database than 0 goes on that
    /// database's connection.
    fn resend_on(&self) -> Option<&dyn Resend> {
        None
    }
}

pub enum Transformed {
    Done(Bytes),
    /// Send `before` (its reply dropped), then `request`, on the shared
    /// upstream and transform the reply to `request` instead (a function
    /// library Redis no longer has is loaded, then the call sent again).
    Retry {
        before: Bytes,
        request: Bytes,
    },
    /// The operation goes on: send `request` on the shared upstream and
    /// transform its reply too (a pop's next bounded call).
    Continue(Bytes),
}

/// Calls one transformed reply may continue into: a pop that fits one
/// call needs more only to skip cancelled copies or to finish a next-pop
/// release, each a bounded amount per call.
const MAX_CONTINUATIONS: usize = 10_000;

/// When the requests a slot answers were received ([`telemetry::now_us`]),
/// for their latency.
enum Stamp {
    /// Not timed: messages nobody asked for, or timing is off.
    None,
    /// Every reply of the slot answers a request of one read.
    At(u64, Route),
    /// Replies of the dedicated connection, one instant per reply.
    Each(Vec<u64>),
}

impl Stamp {
    /// The stamp of replies that leave before the rest of their batch
    /// (only shared batches, stamped once, are sent in parts).
    fn of_part(&self) -> Stamp {
        match self {
            Stamp::At(at, route) => Stamp::At(*at, *route),
            _ => Stamp::None,
        }
    }
}

enum Slot {
    /// `count` replies not arrived yet; `parts` holds complete replies of
    /// the batch that arrived first, written before the rest arrives.
    Waiting {
        count: u32,
        transform: Option<Box<dyn ReplyTransform>>,
        parts: VecDeque<(Bytes, u32)>,
        stamp: Stamp,
    },
    Filled {
        reply: Reply,
        count: u32,
        transform: Option<Box<dyn ReplyTransform>>,
        /// Bytes counted against the output limit while queued.
        accounted: usize,
        stamp: Stamp,
    },
    /// Write everything before, then close the connection.
    Close,
}

impl Slot {
    fn is_waiting(&self) -> bool {
        matches!(self, Slot::Waiting { .. })
    }
}

struct Queue {
    /// Sequence number of `slots[0]`.
    head: u64,
    slots: VecDeque<Slot>,
    /// When the requests sent on the dedicated connection and not answered
    /// yet were received, in order (timing only).
    dedicated: VecDeque<u64>,
}

/// State shared by a client's session, its writer and its reply sources.
pub struct ClientState {
    queue: Mutex<Queue>,
    head_filled: Notify,
    queued_bytes: AtomicUsize,
    output_limit: usize,
    inflight_limit: usize,
    /// Requests whose replies are not yet written to the socket.
    unwritten: AtomicUsize,
    written: Notify,
    /// Batches on the shared upstream whose replies have not arrived.
    shared_inflight: AtomicUsize,
    shared_drained: Notify,
    closed: AtomicBool,
    close: Notify,
    /// A reply of at least [`BIG_REPLY`] bytes reached this client on a
    /// shared connection: its requests go to its dedicated connection.
    big_replies: AtomicBool,
    /// Request latency is timed.
    latency: Option<&'static Latency>,
    /// When the session's last read of requests happened (timing only; 0
    /// before the first). Apart from the queue's lock: it is set on every
    /// read, which takes no slot yet.
    received: AtomicU64,
    /// The client's address, for what is logged about it (also from the
    /// tasks of the upstream connections that fill its replies).
    peer: Option<SocketAddr>,
}

/// Replies this long hold a shared connection up for everyone behind them.
pub const BIG_REPLY: usize = 1024 * 1024;

impl ClientState {
    /// The proxy's own requests' state (no client behind them).
    pub fn new(output_limit: usize, inflight_limit: usize) -> Arc<Self> {
        Self::for_client(output_limit, inflight_limit, None)
    }

    pub fn for_client(
        output_limit: usize,
        inflight_limit: usize,
        peer: Option<SocketAddr>,
    ) -> Arc<Self> {
        Arc::new(ClientState {
            queue: Mutex::new(Queue {
                head: 0,
                slots: VecDeque::new(),
                dedicated: VecDeque::new(),
            }),
            head_filled: Notify::new(),
            queued_bytes: AtomicUsize::new(0),
            output_limit,
            inflight_limit: inflight_limit.max(1),
            unwritten: AtomicUsize::new(0),
            written: Notify::new(),
            shared_inflight: AtomicUsize::new(0),
            shared_drained: Notify::new(),
            closed: AtomicBool::new(false),
            close: Notify::new(),
            big_replies: AtomicBool::new(false),
            latency: telemetry::latency(),
            received: AtomicU64::new(0),
            peer,
        })
    }

    /// The client's address as logged ("-" for the proxy's own requests).
    pub fn peer(&self) -> String {
        self.peer.map_or_else(|| "-".to_string(), |a| a.to_string())
    }

    /// The session read requests now: they were all received together.
    pub fn received(&self) {
        if self.latency.is_some() {
            self.received.store(telemetry::now_us(), Ordering::Relaxed);
        }
    }

    fn stamp(&self, route: Route) -> Stamp {
        match self.received.load(Ordering::Relaxed) {
            0 => Stamp::None,
            at => Stamp::At(at, route),
        }
    }

    /// Takes the next slot, for `count` requests of the client whose
    /// replies arrive later: a rewritten queue operation when there is a
    /// transform, else requests multiplexed on a shared connection.
    pub fn reserve(&self, count: u32, transform: Option<Box<dyn ReplyTransform>>) -> u64 {
        let route = if transform.is_some() {
            Route::Queue
        } else {
            Route::Shared
        };
        telemetry::clients().commands(route).increment(count as u64);
        self.unwritten.fetch_add(count as usize, Ordering::AcqRel);
        let stamp = self.stamp(route);
        let mut q = self.queue.lock().unwrap();
        q.slots.push_back(Slot::Waiting {
            count,
            transform,
            parts: VecDeque::new(),
            stamp,
        });
        q.head + q.slots.len() as u64 - 1
    }

    /// A request of the client sent on its dedicated connection; `paired`
    /// when its reply is known to answer it (then [`ready`](Self::ready)
    /// times it).
    pub fn sent_dedicated(&self, paired: bool) {
        telemetry::clients().commands(Route::Dedicated).increment(1);
        if paired {
            let at = self.received.load(Ordering::Relaxed);
            if at != 0 {
                self.queue.lock().unwrap().dedicated.push_back(at);
            }
        }
    }

    /// The place of the reply to a request sent on the dedicated
    /// connection, held for a reply that comes later than the ones after
    /// it (a cluster node turned the request away; it is sent again).
    pub fn hold_dedicated(&self) -> u64 {
        self.unwritten.fetch_add(1, Ordering::AcqRel);
        let mut q = self.queue.lock().unwrap();
        let stamp = q
            .dedicated
            .pop_front()
            .map_or(Stamp::None, |at| Stamp::At(at, Route::Dedicated));
        q.slots.push_back(Slot::Waiting {
            count: 1,
            transform: None,
            parts: VecDeque::new(),
            stamp,
        });
        q.head + q.slots.len() as u64 - 1
    }

    /// Fills slot `seq` with the reply that arrived for it.
    pub fn fill(&self, seq: u64, reply: Reply) {
        if self.is_closed() {
            // Nobody will write it: let the memory go now.
            return;
        }
        let mut accounted = reply.as_ref().map_or(0, Bytes::len);
        self.account(accounted);
        let at_head = {
            let mut q = self.queue.lock().unwrap();
            let Some(i) = seq.checked_sub(q.head) else {
                return;
            };
            let Some(slot) = q.slots.get_mut(i as usize) else {
                return;
            };
            if let Slot::Waiting {
                count,
                transform,
                parts,
                stamp,
            } = std::mem::replace(slot, Slot::Close)
            {
                let (reply, count) = if parts.is_empty() {
                    (reply, count)
                } else {
                    // The slot was not at the head yet: what arrived before
                    // goes out with the rest.
                    let mut all = BytesMut::new();
                    let mut total = count;
                    for (bytes, n) in parts {
                        all.extend_from_slice(&bytes);
                        accounted += bytes.len();
                        total += n;
                    }
                    match reply {
                        Ok(b) => all.extend_from_slice(&b),
                        Err(e) => {
                            for _ in 0..count {
                                all.extend_from_slice(&e.to_reply());
                            }
                        }
                    }
                    (Ok(all.freeze()), total)
                };
                *slot = Slot::Filled {
                    reply,
                    count,
                    transform,
                    accounted,
                    stamp,
                };
            }
            i == 0
        };
        if at_head {
            self.head_filled.notify_one();
        }
    }

    /// The first `count` replies of the batch in slot `seq` (one without a
    /// transform), so that the client can read them while the rest is still
    /// on its way: only what it has not read counts against its limit.
    pub fn fill_part(&self, seq: u64, bytes: Bytes, count: u32) {
        if self.is_closed() {
            return;
        }
        self.account(bytes.len());
        let at_head = {
            let mut q = self.queue.lock().unwrap();
            let Some(i) = seq.checked_sub(q.head) else {
                return;
            };
            let Some(Slot::Waiting {
                count: left, parts, ..
            }) = q.slots.get_mut(i as usize)
            else {
                return;
            };
            *left -= count.min(*left);
            parts.push_back((bytes, count));
            i == 0
        };
        if at_head {
            self.head_filled.notify_one();
        }
    }

    /// Bytes from the dedicated connection answering `count` requests sent
    /// there (0 for messages nobody asked for: pub/sub, MONITOR).
    pub fn ready(&self, bytes: Bytes, count: u32) {
        if self.is_closed() {
            return;
        }
        self.account(bytes.len());
        self.unwritten.fetch_add(count as usize, Ordering::AcqRel);
        let accounted = bytes.len();
        let mut q = self.queue.lock().unwrap();
        let stamp = match count {
            _ if q.dedicated.is_empty() => Stamp::None,
            0 => Stamp::None,
            1 => Stamp::At(q.dedicated.pop_front().unwrap(), Route::Dedicated),
            n => {
                let n = (n as usize).min(q.dedicated.len());
                Stamp::Each(q.dedicated.drain(..n).collect())
            }
        };
        Self::push_locked(
            &self.head_filled,
            q,
            Slot::Filled {
                reply: Ok(bytes),
                count,
                transform: None,
                accounted,
                stamp,
            },
        );
    }

    /// A reply the proxy made to one request, served by `route`.
    pub fn answer(&self, bytes: Bytes, route: Route) {
        telemetry::clients().commands(route).increment(1);
        if self.is_closed() {
            return;
        }
        self.account(bytes.len());
        self.unwritten.fetch_add(1, Ordering::AcqRel);
        let accounted = bytes.len();
        let stamp = self.stamp(route);
        let q = self.queue.lock().unwrap();
        Self::push_locked(
            &self.head_filled,
            q,
            Slot::Filled {
                reply: Ok(bytes),
                count: 1,
                transform: None,
                accounted,
                stamp,
            },
        );
    }

    /// Closes the connection once everything queued so far is written.
    pub fn finish(&self) {
        self.push(Slot::Close);
    }

    fn push(&self, slot: Slot) {
        Self::push_locked(&self.head_filled, self.queue.lock().unwrap(), slot);
    }

    fn push_locked(head_filled: &Notify, mut q: std::sync::MutexGuard<'_, Queue>, slot: Slot) {
        q.slots.push_back(slot);
        let at_head = q.slots.len() == 1;
        drop(q);
        if at_head {
            head_filled.notify_one();
        }
    }

    /// Moves the filled slots at the head into `out`, and the replies that
    /// arrived so far of the first slot still waiting.
    fn take_filled(&self, out: &mut Vec<Slot>) {
        let mut q = self.queue.lock().unwrap();
        while q.slots.front().is_some_and(|s| !s.is_waiting()) {
            out.push(q.slots.pop_front().unwrap());
            q.head += 1;
        }
        if let Some(Slot::Waiting { parts, stamp, .. }) = q.slots.front_mut() {
            for (bytes, count) in parts.drain(..) {
                let accounted = bytes.len();
                out.push(Slot::Filled {
                    reply: Ok(bytes),
                    count,
                    transform: None,
                    accounted,
                    stamp: stamp.of_part(),
                });
            }
        }
    }

    /// Accounts for reply bytes queued for this client; a client whose unread
    /// replies exceed the limit is disconnected rather than buffered forever.
    pub fn account(&self, n: usize) {
        let total = self.queued_bytes.fetch_add(n, Ordering::Relaxed) + n;
        if self.output_limit > 0 && total > self.output_limit {
            tracing::warn!(
                client = %self.peer(),
                queued = total,
                "client output buffer limit reached, closing"
            );
            self.kill();
        }
    }

    fn unaccount(&self, n: usize) {
        self.queued_bytes.fetch_sub(n, Ordering::Relaxed);
    }

    pub fn kill(&self) {
        self.closed.store(true, Ordering::Release);
        self.close.notify_waiters();
        self.written.notify_waiters();
        self.shared_drained.notify_waiters();
        self.head_filled.notify_one();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub async fn closed(&self) {
        let n = self.close.notified();
        tokio::pin!(n);
        n.as_mut().enable();
        if !self.is_closed() {
            n.await;
        }
    }

    pub fn mark_big_replies(&self) {
        self.big_replies.store(true, Ordering::Relaxed);
    }

    pub fn has_big_replies(&self) -> bool {
        self.big_replies.load(Ordering::Relaxed)
    }

    /// Whether nothing of this client's is in flight on a shared connection.
    pub fn shared_idle(&self) -> bool {
        self.shared_inflight.load(Ordering::Acquire) == 0
    }

    pub fn shared_sent(&self) {
        self.shared_inflight.fetch_add(1, Ordering::AcqRel);
    }

    pub fn shared_done(&self) {
        if self.shared_inflight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shared_drained.notify_waiters();
        }
    }

    /// Waits until every batch sent on the shared upstream has its reply, so
    /// that a command sent elsewhere next cannot overtake them in Redis.
    pub async fn shared_drained(&self) {
        loop {
            let n = self.shared_drained.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.shared_inflight.load(Ordering::Acquire) == 0 || self.is_closed() {
                return;
            }
            n.await;
        }
    }

    pub fn unwritten(&self) -> usize {
        self.unwritten.load(Ordering::Acquire)
    }

    /// Whether `n` more bytes of replies would pass the output limit.
    pub fn over_output_limit(&self, n: usize) -> bool {
        self.output_limit > 0
            && self.queued_bytes.load(Ordering::Relaxed).saturating_add(n) > self.output_limit
    }

    pub fn inflight_limit(&self) -> usize {
        self.inflight_limit
    }

    /// Waits until fewer replies than the limit are waiting to be written.
    pub async fn below_inflight_limit(&self) {
        loop {
            let n = self.written.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.unwritten() < self.inflight_limit || self.is_closed() {
                return;
            }
            n.await;
        }
    }

    fn written(&self, replies: usize, bytes: usize) {
        self.unaccount(bytes);
        let before = self.unwritten.fetch_sub(replies, Ordering::AcqRel);
        if before >= self.inflight_limit && before - replies < self.inflight_limit {
            self.written.notify_waiters();
        }
    }
}

/// Replies smaller than this are copied together into one write.
const COALESCE: usize = 16 * 1024;

/// How the writer re-sends a request whose transform asks for it (see
/// [`Transformed::Retry`], [`Transformed::Continue`]): through the client's
/// shared upstream, which the reply stream knows only as this.
pub trait Resend: Send + Sync {
    /// Sends `before` (none if empty; its reply dropped), then `request`,
    /// and gives `request`'s reply.
    fn resend(
        &self,
        before: Bytes,
        request: Bytes,
        client: Arc<ClientState>,
    ) -> Pin<Box<dyn Future<Output = Reply> + Send>>;
}

/// Runs until the client is closed: writes replies in order.
pub async fn run_writer<R: Resend>(mut sock: WriteHalf, state: Arc<ClientState>, resend: R) {
    let mut wbuf = BytesMut::new();
    let mut filled = Vec::new();
    // Stamps of the replies in `wbuf` or being written, timed once written.
    let mut written: Vec<(Stamp, u32)> = Vec::new();
    let result: std::io::Result<()> = async {
        loop {
            if state.is_closed() {
                return Ok(());
            }
            state.take_filled(&mut filled);
            if filled.is_empty() {
                state.head_filled.notified().await;
                continue;
            }
            for slot in filled.drain(..) {
                match slot {
                    Slot::Filled {
                        reply,
                        count,
                        mut transform,
                        accounted,
                        stamp,
                    } => {
                        let bytes =
                            resolve(reply, count, transform.as_deref_mut(), &resend, &state).await;
                        if bytes.len() >= COALESCE {
                            flush(&mut sock, &mut wbuf).await?;
                            // A client cut off for its output limit may never
                            // read again: do not wait for it.
                            tokio::select! {
                                r = sock.write_all(&bytes) => r?,
                                _ = state.closed() => return Ok(()),
                            }
                        } else {
                            wbuf.extend_from_slice(&bytes);
                        }
                        state.written(count as usize, accounted);
                        if !matches!(stamp, Stamp::None) {
                            written.push((stamp, count));
                        }
                    }
                    Slot::Close => {
                        flush(&mut sock, &mut wbuf).await?;
                        if let Some(latency) = state.latency {
                            record(latency, &mut written);
                        }
                        let _ = sock.shutdown().await;
                        return Ok(());
                    }
                    Slot::Waiting { .. } => unreachable!("only filled slots are taken"),
                }
            }
            flush(&mut sock, &mut wbuf).await?;
            if let Some(latency) = state.latency {
                record(latency, &mut written);
            }
            if wbuf.capacity() > 4 * COALESCE {
                wbuf = BytesMut::new();
            }
        }
    }
    .await;
    if let Err(e) = result {
        tracing::debug!("client write failed: {e}");
    }
    state.kill();
}

/// Latency of every reply just written: one clock read for all of them.
fn record(latency: &Latency, written: &mut Vec<(Stamp, u32)>) {
    if written.is_empty() {
        return;
    }
    let now = telemetry::now_us();
    for (stamp, count) in written.iter() {
        match stamp {
            Stamp::None => {}
            Stamp::At(at, route) => latency
                .route(*route)
                .record_many(now.saturating_sub(*at), *count as u64),
            Stamp::Each(ats) => {
                for &at in ats {
                    latency
                        .route(Route::Dedicated)
                        .record(now.saturating_sub(at));
                }
            }
        }
    }
    written.clear();
}

/// A reply as the client gets it: transformed, re-sent once through
/// `resend` when the transform asks (a library Redis no longer has).
pub async fn resolve(
    mut reply: Reply,
    count: u32,
    mut transform: Option<&mut (dyn ReplyTransform + 'static)>,
    resend: &dyn Resend,
    state: &Arc<ClientState>,
) -> Bytes {
    // At most one retry: a library loaded right before is not missing again.
    let mut retried = false;
    for _ in 0..MAX_CONTINUATIONS {
        let bytes = match reply {
            Ok(b) => b,
            Err(e) => {
                let one = e.to_reply();
                let mut all = Vec::with_capacity(one.len() * count as usize);
                for _ in 0..count {
                    all.extend_from_slice(&one);
                }
                return Bytes::from(all);
            }
        };
        let Some(t) = transform.as_deref_mut() else {
            return bytes;
        };
        let (before, request) = match t.apply(bytes) {
            Transformed::Done(b) => return b,
            Transformed::Retry { before, request } if !retried => {
                retried = true;
                (before, request)
            }
            Transformed::Retry { .. } => break,
            Transformed::Continue(request) => (Bytes::new(), request),
        };
        let on = t.resend_on().unwrap_or(resend);
        reply = on.resend(before, request, state.clone()).await;
    }
    Bytes::from_static(b"-ERR ackproxy: the queue function library could not be loaded\r\n")
}

async fn flush(sock: &mut WriteHalf, wbuf: &mut BytesMut) -> std::io::Result<()> {
    if !wbuf.is_empty() {
        sock.write_all(wbuf).await?;
        wbuf.clear();
    }
    // Sends what TLS still holds of this and of earlier big replies.
    sock.flush().await
}
