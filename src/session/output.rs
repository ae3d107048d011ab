//! The client's reply stream. Replies come from several places (the shared
//! upstream, a dedicated connection, the proxy itself) and must reach the
//! client in request order; every reply source appends an [`Out`] item to one
//! ordered channel, and one writer task turns the items into socket writes,
//! waiting on items whose reply has not arrived yet.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{mpsc, oneshot, Notify};

use crate::error::UpstreamError;
use crate::upstream::shared::SharedUpstream;

pub type Reply = Result<Bytes, UpstreamError>;

/// Turns the upstream's reply to a rewritten request into the reply the
/// client expects for the request it sent.
pub trait ReplyTransform: Send {
    fn apply(&mut self, upstream_reply: Bytes) -> Transformed;
}

pub enum Transformed {
    Done(Bytes),
    /// Send this request on the shared upstream and transform its reply
    /// instead (a script Redis no longer has must be sent in full).
    Retry(Bytes),
}

pub enum Out {
    /// Bytes answering `count` requests (0 for pushed messages).
    Ready(Bytes, u32),
    /// `count` replies that arrive later, all at once.
    Later {
        rx: oneshot::Receiver<Reply>,
        count: u32,
        transform: Option<Box<dyn ReplyTransform>>,
    },
    /// Write what is queued before this, then close the connection.
    Close,
}

/// State shared by a client's session, its writer and its reply sources.
pub struct ClientState {
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
}

impl ClientState {
    pub fn new(output_limit: usize, inflight_limit: usize) -> Arc<Self> {
        Arc::new(ClientState {
            queued_bytes: AtomicUsize::new(0),
            output_limit,
            inflight_limit: inflight_limit.max(1),
            unwritten: AtomicUsize::new(0),
            written: Notify::new(),
            shared_inflight: AtomicUsize::new(0),
            shared_drained: Notify::new(),
            closed: AtomicBool::new(false),
            close: Notify::new(),
        })
    }

    /// Accounts for reply bytes queued for this client; a client whose unread
    /// replies exceed the limit is disconnected rather than buffered forever.
    pub fn account(&self, n: usize) {
        let total = self.queued_bytes.fetch_add(n, Ordering::Relaxed) + n;
        if self.output_limit > 0 && total > self.output_limit {
            tracing::warn!(
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
}

/// The sending side of a client's reply stream.
#[derive(Clone)]
pub struct Output {
    tx: mpsc::UnboundedSender<Out>,
    pub state: Arc<ClientState>,
}

impl Output {
    /// Bytes answering `count` requests; 0 for messages nobody asked for
    /// (pub/sub, MONITOR).
    pub fn ready(&self, bytes: Bytes, count: u32) {
        self.state.account(bytes.len());
        self.state
            .unwritten
            .fetch_add(count as usize, Ordering::AcqRel);
        let _ = self.tx.send(Out::Ready(bytes, count));
    }

    pub fn later(
        &self,
        rx: oneshot::Receiver<Reply>,
        count: u32,
        transform: Option<Box<dyn ReplyTransform>>,
    ) {
        self.state
            .unwritten
            .fetch_add(count as usize, Ordering::AcqRel);
        let _ = self.tx.send(Out::Later {
            rx,
            count,
            transform,
        });
    }

    pub fn close(&self) {
        let _ = self.tx.send(Out::Close);
    }
}

pub fn channel(
    output_limit: usize,
    inflight_limit: usize,
) -> (Output, mpsc::UnboundedReceiver<Out>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        Output {
            tx,
            state: ClientState::new(output_limit, inflight_limit),
        },
        rx,
    )
}

/// Replies smaller than this are copied together into one write.
const COALESCE: usize = 16 * 1024;

/// Runs until the client is closed: writes replies in order.
pub async fn run_writer(
    mut sock: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Out>,
    state: Arc<ClientState>,
    shared: SharedUpstream,
) {
    let mut wbuf = BytesMut::new();
    let mut next: Option<Out> = None;
    let result: std::io::Result<()> = async {
        loop {
            let item = match next.take() {
                Some(item) => item,
                None => {
                    flush(&mut sock, &mut wbuf).await?;
                    tokio::select! {
                        biased;
                        _ = state.closed() => return Ok(()),
                        item = rx.recv() => match item {
                            Some(item) => item,
                            None => return Ok(()),
                        },
                    }
                }
            };
            match item {
                Out::Ready(bytes, count) => {
                    emit(&mut sock, &mut wbuf, &bytes, count as usize, &state).await?;
                }
                Out::Later {
                    mut rx,
                    count,
                    mut transform,
                } => {
                    let reply = match rx.try_recv() {
                        Ok(r) => r,
                        Err(oneshot::error::TryRecvError::Empty) => {
                            flush(&mut sock, &mut wbuf).await?;
                            tokio::select! {
                                biased;
                                _ = state.closed() => return Ok(()),
                                r = &mut rx => r.unwrap_or(Err(UpstreamError::ConnectionLost)),
                            }
                        }
                        Err(oneshot::error::TryRecvError::Closed) => {
                            Err(UpstreamError::ConnectionLost)
                        }
                    };
                    let bytes =
                        resolve(reply, count, transform.as_deref_mut(), &shared, &state).await;
                    emit(&mut sock, &mut wbuf, &bytes, count as usize, &state).await?;
                }
                Out::Close => {
                    flush(&mut sock, &mut wbuf).await?;
                    let _ = sock.shutdown().await;
                    return Ok(());
                }
            }
            if let Ok(item) = rx.try_recv() {
                next = Some(item);
            }
        }
    }
    .await;
    if let Err(e) = result {
        tracing::debug!("client write failed: {e}");
    }
    state.kill();
}

async fn resolve(
    mut reply: Reply,
    count: u32,
    mut transform: Option<&mut (dyn ReplyTransform + 'static)>,
    shared: &SharedUpstream,
    state: &Arc<ClientState>,
) -> Bytes {
    // At most one retry: a script sent in full cannot be missing again.
    for attempt in 0..2 {
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
        match t.apply(bytes) {
            Transformed::Done(b) => return b,
            Transformed::Retry(req) if attempt == 0 => {
                reply = shared.call(req, state.clone()).await;
            }
            Transformed::Retry(_) => break,
        }
    }
    Bytes::from_static(b"-ERR ackproxy: script could not be loaded\r\n")
}

async fn emit(
    sock: &mut OwnedWriteHalf,
    wbuf: &mut BytesMut,
    bytes: &[u8],
    replies: usize,
    state: &ClientState,
) -> std::io::Result<()> {
    if bytes.len() >= COALESCE {
        flush(sock, wbuf).await?;
        sock.write_all(bytes).await?;
    } else {
        wbuf.extend_from_slice(bytes);
        if wbuf.len() >= COALESCE {
            flush(sock, wbuf).await?;
        }
    }
    state.unaccount(bytes.len());
    let before = state.unwritten.fetch_sub(replies, Ordering::AcqRel);
    if before >= state.inflight_limit && before - replies < state.inflight_limit {
        state.written.notify_waiters();
    }
    Ok(())
}

async fn flush(sock: &mut OwnedWriteHalf, wbuf: &mut BytesMut) -> std::io::Result<()> {
    if !wbuf.is_empty() {
        sock.write_all(wbuf).await?;
        wbuf.clear();
    }
    Ok(())
}
