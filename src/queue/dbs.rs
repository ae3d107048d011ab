//! Queues per database. A queue is a key of the database its client
//! selected, so `jobs` in database 1 and `jobs` in database 0 are two
//! queues, each with its own leases, delayed set and dead letters (the
//! function library is one for the whole server; a function call runs in
//! the database of the connection that sends it). What the proxy keeps
//! about queues is kept per database as well: the registry of queues with
//! leases, the parked pops and the keyspace events that wake them, the
//! connections their calls go on, and the leases of each client connection.
//!
//! Database 0 is set up at start-up; another database when a client first
//! runs a queue operation there (a database Redis accepted a `SELECT` for,
//! so at most Redis's `databases`), and kept from then on.

use std::ops::Deref;
use std::sync::{Arc, RwLock};

use tokio::sync::{watch, Notify};

use crate::output::ClientState;
use crate::queue::leases::owners::Owners;
use crate::queue::leases::registry::Registry;
use crate::queue::library::call::Caller;
use crate::queue::pop::waiters::{Events, Waiters};
use crate::queue::rules::Rules;
use crate::upstream::shared::SharedUpstream;
use crate::upstream::Endpoint;

/// One database's queue state.
pub struct Db {
    pub index: i64,
    /// Its queues with leases, for the reaper, and those the gauges sum.
    pub registry: Arc<Registry>,
    pub waiters: Waiters,
    pub owners: Owners,
    /// The proxy's own connection there: wake-ups, reaping, requeues.
    pub own: Caller,
    /// Where clients' queue operations in this database go. In database 0
    /// clients use their own shared connections instead.
    pub clients: SharedUpstream,
}

impl Db {
    fn open(
        index: i64,
        own: SharedUpstream,
        clients: SharedUpstream,
        rules: &Arc<Rules>,
        events: &Events,
        stop: &watch::Receiver<bool>,
        noted: &Arc<Notify>,
    ) -> Db {
        let registry = Arc::new(Registry::in_db(index));
        let waiters = Waiters::start(
            rules.clone(),
            events.clone(),
            own.clone(),
            registry.clone(),
            stop.clone(),
            index,
        );
        Db {
            index,
            registry,
            waiters,
            owners: Owners::telling(noted.clone()),
            own: Caller {
                shared: own,
                client: ClientState::new(0, usize::MAX),
                db: index,
            },
            clients,
        }
    }
}

/// Every database with queue state.
pub struct Dbs {
    zero: Db,
    /// The others, in the order they were first used (few: one per
    /// database clients run queue operations in).
    others: RwLock<Vec<Arc<Db>>>,
    rules: Arc<Rules>,
    endpoint: Arc<Endpoint>,
    events: Events,
    stop: watch::Receiver<bool>,
    /// Told when a connection, in any database, pops from a queue it had
    /// not (see `holder::Holder`).
    noted: Arc<Notify>,
}

/// A database's state: database 0's borrowed (its path costs nothing
/// more than before there were others), another's shared.
pub enum DbRef<'a> {
    Zero(&'a Db),
    Other(Arc<Db>),
}

impl Deref for DbRef<'_> {
    type Target = Db;
    fn deref(&self) -> &Db {
        match self {
            DbRef::Zero(d) => d,
            DbRef::Other(d) => d,
        }
    }
}

impl Dbs {
    /// Database 0's state, its calls on `own`.
    pub fn new(
        own: SharedUpstream,
        rules: Arc<Rules>,
        endpoint: Arc<Endpoint>,
        events: Events,
        stop: watch::Receiver<bool>,
    ) -> Dbs {
        let noted = Arc::new(Notify::new());
        let zero = Db::open(0, own.clone(), own, &rules, &events, &stop, &noted);
        Dbs {
            zero,
            others: RwLock::new(Vec::new()),
            rules,
            endpoint,
            events,
            stop,
            noted,
        }
    }

    pub fn zero(&self) -> &Db {
        &self.zero
    }

    /// Database `index`'s state, set up on first use.
    pub fn at(&self, index: i64) -> DbRef<'_> {
        if index == 0 {
            return DbRef::Zero(&self.zero);
        }
        if let Some(d) = self.find(index) {
            return DbRef::Other(d);
        }
        let mut others = self.others.write().unwrap();
        if let Some(d) = others.iter().find(|d| d.index == index) {
            return DbRef::Other(d.clone());
        }
        let d = Arc::new(Db::open(
            index,
            SharedUpstream::spawn_in(self.endpoint.clone(), index),
            SharedUpstream::spawn_in(self.endpoint.clone(), index),
            &self.rules,
            &self.events,
            &self.stop,
            &self.noted,
        ));
        others.push(d.clone());
        DbRef::Other(d)
    }

    /// Database `index`'s state if it has been used.
    pub fn find(&self, index: i64) -> Option<Arc<Db>> {
        let others = self.others.read().unwrap();
        others.iter().find(|d| d.index == index).cloned()
    }

    /// Told when a connection pops from a queue it had not, in any
    /// database.
    pub fn noted(&self) -> &Notify {
        &self.noted
    }

    /// The databases other than 0 that have been used.
    pub fn others(&self) -> Vec<Arc<Db>> {
        self.others.read().unwrap().clone()
    }
}
