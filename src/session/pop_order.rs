//! Whether a pop is the connection's next one (see `queue::How::next`): on
//! `ack = "next-pop"` rules it acknowledges what the connection popped
//! before, which is safe only when the client had read every reply before
//! sending it.

#[derive(Default)]
pub(super) struct PopOrder {
    /// A reply was still unwritten when the last bytes were read: the
    /// requests in them were sent without waiting for it.
    pending_at_read: bool,
    /// Pops handled since the last read (pipelined with one another).
    this_read: u32,
    /// The open transaction has a pop queued.
    in_multi: bool,
}

impl PopOrder {
    /// The client's bytes were read; `pending`: a reply of the client's
    /// was still unwritten.
    pub(super) fn read(&mut self, pending: bool) {
        self.pending_at_read = pending;
        self.this_read = 0;
    }

    /// Bytes read while a pop was parked: sent before its reply.
    pub(super) fn read_while_parked(&mut self) {
        self.pending_at_read = true;
    }

    pub(super) fn transaction_opened(&mut self) {
        self.in_multi = false;
    }

    /// A pop: whether it is the next one. Not if another pop came in the
    /// same read or the client had not read every reply; in a transaction,
    /// only its first pop.
    pub(super) fn pop(&mut self, in_multi: bool) -> bool {
        let first = self.this_read == 0 && !self.pending_at_read;
        self.this_read += 1;
        if in_multi {
            let first_in_multi = !self.in_multi;
            self.in_multi = true;
            return first && first_in_multi;
        }
        first
    }
}

#[cfg(test)]
mod tests {
    use super::PopOrder;

    #[test]
    fn only_an_unpipelined_pop_is_the_next_one() {
        let mut o = PopOrder::default();
        o.read(false);
        assert!(o.pop(false));
        assert!(!o.pop(false), "pipelined behind another pop");
        o.read(true);
        assert!(!o.pop(false), "sent before a reply was read");
        o.read(false);
        o.transaction_opened();
        assert!(o.pop(true));
        o.read(false);
        assert!(!o.pop(true), "a second pop in one transaction");
    }
}
