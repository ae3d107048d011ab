//! Shared connections of logged-in users. A client that logged in through
//! Redis (on a connection of its own, so Redis judged the password) joins
//! the pool of that user and password: one multiplexed pair of connections
//! (writes and reads, see `shared`), logged in with the same credentials,
//! opened on first use. Its stateless commands then share that pair with
//! the other clients of the same login, and still run with the user's
//! rights.
//!
//! A pool's connections are never opened twice. When one ends — Redis
//! closed it (`ACL DELUSER`, `CLIENT KILL`, a restart) or refused its
//! login — the other is closed too, and every
//! client of the pool is disconnected, as Redis disconnects the clients of
//! a deleted user or a closed connection: nobody keeps running as a user on
//! a login that Redis no longer accepts. A client that logs in again gets a
//! new pool, judged by Redis again.
//!
//! Each pool also keeps a few connections logged in with its login ready
//! for its clients' own connections (see `ready`), so that a client's first
//! stateful request waits for no login. They are opened again as clients
//! take them, until one fails to open: then its clients' own connections
//! are opened when needed, and refused as Redis refuses them.
//!
//! The number of pools is bounded: past the maximum, the least recently
//! used pool that no client is in is closed; if every pool has clients, a
//! newly logged-in client keeps the connection it logged in on, as when
//! pools are off.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};

use super::ready::Ready;
use super::shared::SharedUpstream;
use super::{Credentials, Endpoint};
use crate::output::ClientState;

/// A salted digest of a secret: pools are found by it, and a password the
/// proxy checks itself is kept only as one. The salt is random per process,
/// so digests say nothing outside it.
pub struct Salt([u8; 16]);

impl Salt {
    pub fn random() -> Salt {
        let state = RandomState::new();
        let mut salt = [0u8; 16];
        salt[..8].copy_from_slice(&state.hash_one(1u8).to_le_bytes());
        salt[8..].copy_from_slice(&state.hash_one(2u8).to_le_bytes());
        Salt(salt)
    }

    pub fn digest(&self, secret: &[u8]) -> [u8; 20] {
        let mut h = sha1_smol::Sha1::new();
        h.update(&self.0);
        h.update(secret);
        h.digest().bytes()
    }
}

/// Compares in time that depends only on the lengths, so the comparison
/// does not tell how much of a guess was right.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    user: String,
    password: [u8; 20],
}

struct Pool {
    id: u64,
    /// Needed to open the dedicated connections of its clients (stateful
    /// commands) with the same login; dropped with the pool.
    password: String,
    shared: SharedUpstream,
    /// Connections with the same login, for its clients' own.
    ready: Arc<Ready>,
    members: HashMap<u64, Arc<ClientState>>,
    last_used: u64,
}

#[derive(Default)]
struct Inner {
    pools: HashMap<Key, Pool>,
    next_id: u64,
    clock: u64,
}

pub struct Users {
    endpoint: Arc<Endpoint>,
    max: usize,
    /// Ready connections kept per pool.
    ready: usize,
    salt: Salt,
    inner: Mutex<Inner>,
}

/// A client's place in a pool; leaving is dropping it.
pub struct Member {
    users: Arc<Users>,
    key: Key,
    pool: u64,
    id: u64,
    shared: SharedUpstream,
}

impl Users {
    /// At most `max` pools (0: none, logged-in clients keep their own
    /// connection), each keeping `ready` connections ready.
    pub fn new(endpoint: Arc<Endpoint>, max: usize, ready: usize) -> Arc<Users> {
        Arc::new(Users {
            endpoint,
            max,
            ready,
            salt: Salt::random(),
            inner: Mutex::new(Inner::default()),
        })
    }

    /// Joins the pool of a login Redis has just accepted from this client,
    /// creating it if needed. `None`: no pool can take the client (the
    /// bound is reached by pools in use, or the login is not text, which
    /// the proxy's own logins cannot send).
    pub fn join(
        self: &Arc<Self>,
        user: &[u8],
        password: &[u8],
        client: &Arc<ClientState>,
    ) -> Option<Member> {
        if self.max == 0 {
            return None;
        }
        let user = std::str::from_utf8(user).ok()?;
        let password = std::str::from_utf8(password).ok()?;
        let key = Key {
            user: user.to_string(),
            password: self.salt.digest(password.as_bytes()),
        };
        let mut inner = self.inner.lock().unwrap();
        inner.clock += 1;
        let now = inner.clock;
        inner.next_id += 1;
        let member_id = inner.next_id;
        if let Some(pool) = inner.pools.get_mut(&key) {
            // Equal digests of different passwords must never share a login.
            if !constant_time_eq(pool.password.as_bytes(), password.as_bytes()) {
                return None;
            }
            pool.members.insert(member_id, client.clone());
            pool.last_used = now;
            return Some(Member {
                users: self.clone(),
                key,
                pool: pool.id,
                id: member_id,
                shared: pool.shared.clone(),
            });
        }
        if inner.pools.len() >= self.max {
            let idle = inner
                .pools
                .iter()
                .filter(|(_, p)| p.members.is_empty())
                .min_by_key(|(_, p)| p.last_used)
                .map(|(k, _)| k.clone())?;
            // Its connection closes once nothing holds it any more.
            inner.pools.remove(&idle);
        }
        inner.next_id += 1;
        let pool_id = inner.next_id;
        let credentials = Credentials {
            user: Some(user.to_string()),
            password: Some(password.to_string()),
        };
        let ready = Arc::new(Ready::start(
            self.endpoint.clone(),
            Some(credentials.clone()),
            self.ready,
        ));
        let (shared, ended) = SharedUpstream::spawn_as(self.endpoint.clone(), credentials);
        let watcher = self.clone();
        let watched = key.clone();
        tokio::spawn(async move {
            let _ = ended.await;
            watcher.ended(&watched, pool_id);
        });
        let mut members = HashMap::new();
        members.insert(member_id, client.clone());
        inner.pools.insert(
            key.clone(),
            Pool {
                id: pool_id,
                password: password.to_string(),
                shared: shared.clone(),
                ready,
                members,
                last_used: now,
            },
        );
        Some(Member {
            users: self.clone(),
            key,
            pool: pool_id,
            id: member_id,
            shared,
        })
    }

    /// The pool's connection is gone: so is the pool, and its clients are
    /// disconnected once what they were sent is written.
    fn ended(&self, key: &Key, id: u64) {
        let mut inner = self.inner.lock().unwrap();
        if inner.pools.get(key).is_none_or(|p| p.id != id) {
            // Closed for the bound, with no clients.
            return;
        }
        let pool = inner.pools.remove(key).expect("looked up above");
        drop(inner);
        if !pool.members.is_empty() {
            tracing::info!(
                user = %key.user,
                clients = pool.members.len(),
                "connection of a logged-in user ended: its clients are disconnected"
            );
        }
        for client in pool.members.values() {
            client.finish();
        }
    }

    fn leave(&self, m: &Member) {
        let mut inner = self.inner.lock().unwrap();
        inner.clock += 1;
        let now = inner.clock;
        if let Some(pool) = inner.pools.get_mut(&m.key).filter(|p| p.id == m.pool) {
            pool.members.remove(&m.id);
            pool.last_used = now;
        }
    }

    fn ready(&self, m: &Member) -> Option<Arc<Ready>> {
        let inner = self.inner.lock().unwrap();
        let pool = inner.pools.get(&m.key).filter(|p| p.id == m.pool)?;
        Some(pool.ready.clone())
    }

    fn credentials(&self, m: &Member) -> Option<Credentials> {
        let inner = self.inner.lock().unwrap();
        let pool = inner.pools.get(&m.key).filter(|p| p.id == m.pool)?;
        Some(Credentials {
            user: Some(m.key.user.clone()),
            password: Some(pool.password.clone()),
        })
    }

    /// Pools open now.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap().pools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Member {
    /// The pool's connection, for the client's stateless commands.
    pub fn shared(&self) -> &SharedUpstream {
        &self.shared
    }

    /// The pool's login, for a dedicated connection of the client's own;
    /// `None` once the pool has ended.
    pub fn credentials(&self) -> Option<Credentials> {
        self.users.credentials(self)
    }

    /// The pool's ready connections, for a connection of the client's own
    /// with the pool's login; `None` once the pool has ended.
    pub fn ready(&self) -> Option<Arc<Ready>> {
        self.users.ready(self)
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.users.leave(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint() -> Arc<Endpoint> {
        // Nothing listens there; these tests never send a request.
        Arc::new(Endpoint {
            addr: crate::upstream::topology::Address::fixed("127.0.0.1:1"),
            credentials: Default::default(),
            connect_timeout: std::time::Duration::from_millis(100),
            tls: None,
            opened: Default::default(),
            connected: Default::default(),
        })
    }

    fn client() -> Arc<ClientState> {
        ClientState::new(0, 1)
    }

    #[tokio::test]
    async fn one_pool_per_user_and_password() {
        let users = Users::new(endpoint(), 8, 0);
        let (a, b) = (client(), client());
        let m1 = users.join(b"u", b"p", &a).unwrap();
        let m2 = users.join(b"u", b"p", &b).unwrap();
        assert_eq!(users.len(), 1);
        assert_eq!(m1.pool, m2.pool);
        let other = users.join(b"u", b"q", &a).unwrap();
        assert_ne!(other.pool, m1.pool);
        let v = users.join(b"v", b"p", &a).unwrap();
        assert_ne!(v.pool, m1.pool);
        assert_eq!(users.len(), 3);
        let c = m1.credentials().unwrap();
        assert_eq!(
            (c.user.as_deref(), c.password.as_deref()),
            (Some("u"), Some("p"))
        );
    }

    #[tokio::test]
    async fn bounded_by_closing_the_least_recently_used_idle_pool() {
        let users = Users::new(endpoint(), 2, 0);
        let c = client();
        let a = users.join(b"a", b"p", &c).unwrap();
        let b = users.join(b"b", b"p", &c).unwrap();
        // Both in use: a third login keeps its own connection.
        assert!(users.join(b"c", b"p", &c).is_none());
        drop(a);
        drop(b);
        // `b` was left last, so `a` goes.
        let third = users.join(b"c", b"p", &c).unwrap();
        assert_eq!(users.len(), 2);
        assert!(third.credentials().is_some());
        let again = users.join(b"b", b"p", &c).unwrap();
        assert_eq!(users.len(), 2);
        assert!(again.credentials().is_some());
        let a_again = users.join(b"a", b"p", &c);
        assert!(a_again.is_none(), "both pools in use");
    }

    #[tokio::test]
    async fn an_ended_pool_disconnects_its_clients() {
        let users = Users::new(endpoint(), 4, 0);
        let (a, b) = (client(), client());
        let m = users.join(b"u", b"p", &a).unwrap();
        let other = users.join(b"v", b"p", &b).unwrap();
        users.ended(&m.key, m.pool);
        assert!(m.credentials().is_none());
        assert_eq!(users.len(), 1);
        assert!(other.credentials().is_some());
        // A stale end does not touch a newer pool of the same login.
        let fresh = users.join(b"u", b"p", &a).unwrap();
        users.ended(&m.key, m.pool);
        assert!(fresh.credentials().is_some());
    }

    #[test]
    fn no_pools_when_off_or_not_text() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let off = Users::new(endpoint(), 0, 0);
            assert!(off.join(b"u", b"p", &client()).is_none());
            let users = Users::new(endpoint(), 4, 0);
            assert!(users.join(b"u", b"\xff", &client()).is_none());
        });
    }

    #[test]
    fn digests_and_comparison() {
        let s = Salt::random();
        assert_eq!(s.digest(b"x"), s.digest(b"x"));
        assert_ne!(s.digest(b"x"), s.digest(b"y"));
        assert_ne!(s.digest(b"x"), Salt::random().digest(b"x"));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
