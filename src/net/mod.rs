//! Byte streams to clients and to Redis, plain TCP or TLS: one type for
//! both, so the request path is the same whichever it is.
//!
//! TLS writes are encrypted into a buffer of rustls's that a write may
//! leave partly unsent when the socket is full, so everything that writes
//! through these types flushes once it has nothing more to write (a no-op
//! on plain TCP).

pub mod tls;

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::TlsStream;

/// A connection, before it is split into a reading and a writing half.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// The reading half of a split [`Stream`].
pub enum ReadHalf {
    Plain(OwnedReadHalf),
    Tls(Arc<Mutex<TlsStream<TcpStream>>>),
}

/// The writing half of a split [`Stream`].
pub enum WriteHalf {
    Plain(OwnedWriteHalf),
    Tls(Arc<Mutex<TlsStream<TcpStream>>>),
}

impl Stream {
    /// Halves that a reader task and a writer task use at the same time.
    /// A TLS connection is one state machine for both directions, so its
    /// halves share it behind a lock held only while one of them polls.
    pub fn split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Plain(s) => {
                let (rd, wr) = s.into_split();
                (ReadHalf::Plain(rd), WriteHalf::Plain(wr))
            }
            Stream::Tls(s) => {
                let shared = Arc::new(Mutex::new(*s));
                (ReadHalf::Tls(shared.clone()), WriteHalf::Tls(shared))
            }
        }
    }
}

fn lock(s: &Mutex<TlsStream<TcpStream>>) -> MutexGuard<'_, TlsStream<TcpStream>> {
    // Nothing panics while holding it; if something did, the stream is
    // still the stream.
    s.lock().unwrap_or_else(|e| e.into_inner())
}

impl ReadHalf {
    /// Waits until there is something to read: input, the end of the
    /// stream or an error. As with tokio's `readable`, a wake-up may find
    /// nothing after all, which `try_read_buf` reports as `WouldBlock`.
    /// Needs no buffer, so a connection waiting for its next request holds
    /// none. Cancel-safe.
    pub async fn readable(&self) -> io::Result<()> {
        match self {
            ReadHalf::Plain(rd) => rd.readable().await,
            ReadHalf::Tls(s) => {
                std::future::poll_fn(|cx| {
                    let mut s = lock(s);
                    Poll::Ready(ready!(Pin::new(&mut *s).poll_fill_buf(cx)).map(|_| ()))
                })
                .await
            }
        }
    }

    /// Appends what has arrived to `buf` without waiting: `Ok(0)` at the
    /// end of the stream, `WouldBlock` if nothing has.
    ///
    /// A read that filled less than the room it had took everything the
    /// socket held: the stream is then marked not readable, so the next
    /// [`ReadHalf::readable`] waits for new input instead of returning at
    /// once for a read that would only find nothing (one system call less
    /// per request of a client that waits for each reply). Tokio keeps a
    /// readiness event that arrived in between, so nothing is missed.
    pub fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        match self {
            ReadHalf::Plain(rd) => {
                let sock: &TcpStream = rd.as_ref();
                let fd = std::os::fd::AsRawFd::as_raw_fd(sock);
                if buf.len() == buf.capacity() {
                    buf.reserve(4096);
                }
                let mut short = None;
                // The readiness cleared is the one seen before the read:
                // an event that comes in during it keeps the stream readable.
                let read = sock.try_io(tokio::io::Interest::READABLE, || {
                    let spare = buf.spare_capacity_mut();
                    let room = spare.len();
                    // SAFETY: recv writes at most `room` bytes into the
                    // spare capacity, which `advance_mut` then counts.
                    let n = loop {
                        let n = unsafe { libc::recv(fd, spare.as_mut_ptr().cast(), room, 0) };
                        if n >= 0 {
                            break n;
                        }
                        let e = io::Error::last_os_error();
                        if e.kind() != io::ErrorKind::Interrupted {
                            return Err(e);
                        }
                    };
                    let n = n as usize;
                    unsafe { bytes::BufMut::advance_mut(buf, n) };
                    if n > 0 && n < room {
                        short = Some(n);
                        return Err(io::ErrorKind::WouldBlock.into());
                    }
                    Ok(n)
                });
                match short {
                    Some(n) => Ok(n),
                    None => read,
                }
            }
            ReadHalf::Tls(s) => {
                // Whatever this poll registers is replaced by the next
                // `readable`, which the caller awaits before it sleeps.
                let mut cx = Context::from_waker(std::task::Waker::noop());
                match poll_take(&mut lock(s), &mut cx, buf) {
                    Poll::Ready(r) => r,
                    Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
                }
            }
        }
    }
}

/// Moves the plaintext rustls has decrypted into `buf`: the first piece,
/// then whatever else is ready.
fn poll_take(
    s: &mut TlsStream<TcpStream>,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<io::Result<usize>> {
    let mut s = Pin::new(s);
    let first = ready!(s.as_mut().poll_fill_buf(cx))?;
    if first.is_empty() {
        return Poll::Ready(Ok(0));
    }
    let mut taken = first.len();
    buf.extend_from_slice(first);
    s.as_mut().consume(taken);
    // An error or the end here is seen again on the next call.
    while let Poll::Ready(Ok(more)) = s.as_mut().poll_fill_buf(cx) {
        if more.is_empty() {
            break;
        }
        let n = more.len();
        buf.extend_from_slice(more);
        s.as_mut().consume(n);
        taken += n;
    }
    Poll::Ready(Ok(taken))
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Plain(rd) => Pin::new(rd).poll_read(cx, buf),
            ReadHalf::Tls(s) => Pin::new(&mut *lock(s)).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Plain(wr) => Pin::new(wr).poll_write(cx, buf),
            WriteHalf::Tls(s) => Pin::new(&mut *lock(s)).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Plain(wr) => Pin::new(wr).poll_flush(cx),
            WriteHalf::Tls(s) => Pin::new(&mut *lock(s)).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Plain(wr) => Pin::new(wr).poll_shutdown(cx),
            WriteHalf::Tls(s) => Pin::new(&mut *lock(s)).poll_shutdown(cx),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => {
                // A request written without a flush may still sit in rustls
                // while its caller waits for the reply: reading sends it on.
                // Both directions are polled by the one task that owns an
                // unsplit stream, so no other task's wake-up is taken.
                if let Poll::Ready(Err(e)) = Pin::new(&mut **s).poll_flush(cx) {
                    return Poll::Ready(Err(e));
                }
                Pin::new(&mut **s).poll_read(cx, buf)
            }
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}
