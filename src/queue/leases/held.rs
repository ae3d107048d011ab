//! The one lease a next-pop pop left its connection holding, by
//! connection: its token, which the connection's next pop names to
//! take_owned.lua instead of having it read what the connection holds
//! from the connection's index. Only ever a hint: the script removes only
//! an entry that exists in that index, and reads it as before when there
//! is none.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;

#[derive(Default)]
pub struct HeldLeases {
    conns: Mutex<HashMap<u64, Held>>,
}

#[derive(Default)]
struct Held {
    /// The connection's pops made so far on rules that track it.
    made: u64,
    /// The queue, and the token of the connection's one lease there.
    lease: Option<(Bytes, Bytes)>,
}

impl HeldLeases {
    /// A pop of connection `conn` on a rule that tracks it is made: its
    /// number among them, and what [`HeldLeases::took`] last kept (then
    /// forgotten: a pop may change what the connection holds).
    pub fn pop_made(&self, conn: u64) -> (u64, Option<(Bytes, Bytes)>) {
        let mut conns = self.conns.lock().unwrap();
        let h = conns.entry(conn).or_default();
        h.made += 1;
        (h.made, h.lease.take())
    }

    /// Pop number `n` of connection `conn` left it holding exactly one
    /// lease on `queue`, `token`: kept for its next pop. Not when a later
    /// pop was made meanwhile: its reply may be pending, and the lease it
    /// takes would then go unseen.
    pub fn took(&self, conn: u64, n: u64, queue: Bytes, token: Bytes) {
        let mut conns = self.conns.lock().unwrap();
        if let Some(h) = conns.get_mut(&conn) {
            if h.made == n {
                h.lease = Some((queue, token));
            }
        }
    }

    /// Connection `conn` closed.
    pub fn forget(&self, conn: u64) {
        self.conns.lock().unwrap().remove(&conn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_kept_only_when_no_later_pop_was_made() {
        let h = HeldLeases::default();
        let (n, none) = h.pop_made(7);
        assert!(none.is_none());
        h.took(7, n, "q".into(), "ja".into());
        let (n2, held) = h.pop_made(7);
        assert_eq!(held, Some(("q".into(), "ja".into())));
        // A pop made before the reply of pop n2 came: n2's lease is not kept.
        h.pop_made(7);
        h.took(7, n2, "q".into(), "jb".into());
        assert_eq!(h.pop_made(7).1, None);
        h.forget(7);
        h.took(7, 1, "q".into(), "jc".into());
        assert_eq!(h.pop_made(7), (1, None));
    }
}
