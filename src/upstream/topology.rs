//! Where the Redis primary is now: the one answer every connection to
//! Redis dials. Fixed for a direct upstream; with Sentinel, `sentinel.rs`
//! moves it on a failover, and every connection opened to the previous
//! primary is closed ([`Address::moved_from`]) so that it opens again on
//! the new one.

use std::fmt;
use std::future::Future;

use tokio::sync::watch;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Primary {
    /// `host:port`; `None` until the sentinels have named one.
    addr: Option<String>,
    /// Moves so far.
    generation: u64,
}

/// The primary's address, shared by every connection factory.
#[derive(Debug)]
pub struct Address {
    tx: watch::Sender<Primary>,
    /// The sentinels' master name: the primary may move.
    master: Option<String>,
}

impl Address {
    /// One address for good.
    pub fn fixed(addr: impl Into<String>) -> Address {
        Address {
            tx: watch::Sender::new(Primary {
                addr: Some(addr.into()),
                generation: 0,
            }),
            master: None,
        }
    }

    /// The primary of the sentinels' `master`, not known yet.
    pub fn following(master: impl Into<String>) -> Address {
        Address {
            tx: watch::Sender::new(Primary {
                addr: None,
                generation: 0,
            }),
            master: Some(master.into()),
        }
    }

    /// Whether the primary may move (Sentinel): a connection lost then is
    /// more likely a failover in progress than Redis gone.
    pub fn follows_sentinels(&self) -> bool {
        self.master.is_some()
    }

    /// The address to dial now, if one is known.
    pub fn current(&self) -> Option<String> {
        self.tx.borrow().addr.clone()
    }

    /// Changes with every move: taken before a connection is opened, it
    /// tells [`Address::moved_from`] which primary the connection is to.
    pub fn generation(&self) -> u64 {
        self.tx.borrow().generation
    }

    /// The primary is now at `addr`; returns whether that is a move.
    pub fn set(&self, addr: String) -> bool {
        self.tx.send_if_modified(|p| {
            if p.addr.as_deref() == Some(addr.as_str()) {
                return false;
            }
            p.addr = Some(addr);
            p.generation += 1;
            true
        })
    }

    /// Completes once the primary has moved since `generation` (at once if
    /// it already has); never for a fixed address.
    pub fn moved_from(&self, generation: u64) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.tx.subscribe();
        async move {
            if rx.wait_for(|p| p.generation != generation).await.is_err() {
                // The address is gone with the proxy's state: nothing moves.
                std::future::pending::<()>().await;
            }
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.current(), &self.master) {
            (Some(addr), _) => f.write_str(&addr),
            (None, Some(master)) => {
                write!(f, "primary of sentinel master {master:?} (not known yet)")
            }
            (None, None) => f.write_str("(none)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_move_ends_the_wait_of_connections_to_the_previous_primary() {
        let a = Address::following("m");
        assert_eq!(a.current(), None);
        assert!(a.set("127.0.0.1:1".into()));
        let gen = a.generation();
        let moved = a.moved_from(gen);
        // The same address again is no move.
        assert!(!a.set("127.0.0.1:1".into()));
        tokio::pin!(moved);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), &mut moved)
                .await
                .is_err()
        );
        assert!(a.set("127.0.0.1:2".into()));
        tokio::time::timeout(std::time::Duration::from_secs(5), moved)
            .await
            .expect("moved");
        // Taken before the move: done at once.
        tokio::time::timeout(std::time::Duration::from_secs(5), a.moved_from(gen))
            .await
            .expect("moved already");
        assert_eq!(a.current().as_deref(), Some("127.0.0.1:2"));
    }

    #[tokio::test]
    async fn a_fixed_address_never_moves() {
        let a = Address::fixed("127.0.0.1:1");
        assert!(!a.follows_sentinels());
        let moved = a.moved_from(a.generation());
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), moved)
                .await
                .is_err()
        );
    }
}
