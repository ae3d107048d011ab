//! Read buffers lent to sessions while they read. A client waiting for its
//! next request holds no buffer (10,000 idle clients would otherwise hold
//! 40 MB), but allocating one for every request and freeing it at every
//! wait cost about 10% of a passthrough request's instructions. Buffers of
//! waiting clients are kept per thread instead, up to [`KEPT`] of them, for
//! the next client that has something to read.

use std::cell::RefCell;

use bytes::BytesMut;

/// The size a session reads in at least.
pub const READ_SIZE: usize = 4096;
/// Buffers kept per thread: enough for the clients one thread serves
/// between two waits, few enough not to matter (at most 4 MB).
const KEPT: usize = 64;
/// A buffer grown past this for a big request is let go, not kept.
const KEPT_CAPACITY: usize = 16 * READ_SIZE;

thread_local! {
    static KEPT_BUFFERS: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// A buffer to read into: one a waiting client gave back, or a new one.
pub fn take() -> BytesMut {
    KEPT_BUFFERS
        .with(|k| k.borrow_mut().pop())
        .unwrap_or_else(|| BytesMut::with_capacity(READ_SIZE))
}

/// Gives back the buffer of a client about to wait. Only an empty one with
/// room for a read, and not grown for a big request, is kept; its memory
/// may still be shared with requests in flight, which is fine: they only
/// read the part before it.
pub fn give(buf: BytesMut) {
    if !buf.is_empty() || !(READ_SIZE / 4..=KEPT_CAPACITY).contains(&buf.capacity()) {
        return;
    }
    KEPT_BUFFERS.with(|k| {
        let mut k = k.borrow_mut();
        if k.len() < KEPT {
            k.push(buf);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_buffers_with_room_are_lent_again_up_to_the_bound() {
        let mut b = take();
        assert!(b.capacity() >= READ_SIZE);
        b.extend_from_slice(b"PING\r\n");
        let frame = b.split_to(6).freeze();
        let ptr = b.as_ptr();
        give(b);
        // The same memory, after the frame still in flight.
        let again = take();
        assert_eq!(again.as_ptr(), ptr);
        assert_eq!(&frame[..], b"PING\r\n");
        assert!(again.capacity() >= READ_SIZE - 6);

        // Not kept: a buffer holding a partial request, or with no room.
        let mut partial = take();
        partial.extend_from_slice(b"*1\r\n");
        give(partial);
        give(BytesMut::new());
        give(BytesMut::with_capacity(KEPT_CAPACITY + 1));
        assert!(KEPT_BUFFERS.with(|k| k.borrow().is_empty()));

        for _ in 0..KEPT + 10 {
            give(BytesMut::with_capacity(READ_SIZE));
        }
        assert_eq!(KEPT_BUFFERS.with(|k| k.borrow().len()), KEPT);
    }
}
