//! The one decision made about every request: how it is served. It is
//! computed once, when the request is framed; the batching in
//! [`Session::process`](super::Session) and the handling in
//! [`Session::serve`](super::Session) both read it, so a new interception is
//! one variant here and one arm there.
//!
//! The order of the checks is the order in which they win: the proxy's own
//! metadata (HELLO, CLIENT SETNAME …) before the login gate, the client
//! table before queue rules, queue rules before the replies the proxy
//! rewrites. A request nothing claims is forwarded, in a batch for the
//! shared connection where [`route`] allows.

use super::route::{route, Route};
use super::{client_table, Session};
use crate::command::{Args, Kind};
use crate::output::ReplyTransform;
use crate::queue::library::visible::View;
use crate::queue::signals::Fired;

pub(super) enum Decision {
    /// Stateless, and nothing of the proxy's concerns it: it joins the
    /// batch for the shared connection. `writes`: it may write.
    Batch {
        writes: bool,
    },
    /// Sent as it is, alone, on the connection [`route`] picks then.
    Forward,
    /// `HELLO` the proxy may answer for the client's metadata; forwarded
    /// if it is a login.
    Hello,
    /// `CLIENT SETNAME|SETINFO|GETNAME` kept by the proxy; forwarded where
    /// Redis must answer.
    ClientMeta,
    /// `CLIENT ID|INFO|LIST|KILL|NO-EVICT|UNBLOCK`: the proxy's client table.
    ClientTable,
    Quit,
    /// `RESET` of a client not pinned to its own connection.
    Reset,
    /// A pop, LREM, ACK, NACK or QUEUE a queue rule concerns: handed to
    /// `queue/` once.
    Queue,
    /// `CONFIG SET requirepass`, with the new password.
    Requirepass(Vec<u8>),
    /// A request whose reply must not show the proxy's own library.
    View(View),
    /// A job framework's completion signal.
    Signal(Fired),
    /// `INFO`, its clients section made the proxy's.
    Info,
    /// A `CLUSTER` request the proxy may answer with its announced nodes.
    Announce,
    /// `CLIENT GETREDIR|TRACKINGINFO` of a client whose redirect the proxy
    /// moved to another connection.
    RedirectView(Box<dyn ReplyTransform>),
    /// `CLIENT TRACKING … REDIRECT id`: the id is a proxy client's.
    TrackingRedirect {
        at: usize,
        id: i64,
    },
}

impl Session {
    /// How the request is served (see the module's header).
    pub(super) fn decide(&self, kind: Kind, args: Args<'_>, writes: bool) -> Decision {
        // Metadata and protocol are the proxy's to keep, unless the request
        // is queued in a transaction (or replies no longer pair).
        let in_mode = self.mode.multi || self.mode.unpaired;
        match kind {
            Kind::Sticky
                if !self.pinned && self.auth == crate::auth::State::Open && args.is(0, "HELLO") =>
            {
                return Decision::Hello
            }
            Kind::Meta if !in_mode && self.shares() && super::meta::keeps(args) => {
                return Decision::ClientMeta
            }
            Kind::Meta if !in_mode && client_table::answers(args) => return Decision::ClientTable,
            Kind::Quit => return Decision::Quit,
            Kind::Reset if !self.pinned => return Decision::Reset,
            Kind::Pop(_) | Kind::Lrem | Kind::Ack | Kind::Nack | Kind::Queue
                if self.ctx.queues.concerns(kind, args) =>
            {
                return Decision::Queue
            }
            _ => {}
        }
        self.decide_unqueued(kind, args, writes)
    }

    /// [`Session::decide`] past the queue rules: also what becomes of a
    /// request `queue/` let pass.
    pub(super) fn decide_unqueued(&self, kind: Kind, args: Args<'_>, writes: bool) -> Decision {
        let named = proxy_named(args);
        if named {
            if let Some(password) = crate::auth::sets_requirepass(args) {
                return Decision::Requirepass(password.to_vec());
            }
            if crate::queue::library::visible::concerns(args) {
                return crate::queue::library::visible::view(args)
                    .map_or(Decision::Forward, Decision::View);
            }
        }
        // A completion signal's reply is looked at (see `signalled`).
        if let Some(fired) = self.ctx.queues.signal(args) {
            return Decision::Signal(fired);
        }
        if named {
            if crate::clients::format::concerns(args) {
                return Decision::Info;
            }
            if self.ctx.announce.is_some() && args.is(0, "CLUSTER") {
                return Decision::Announce;
            }
            if let Some(transform) = self.redirect_view(args) {
                return Decision::RedirectView(transform);
            }
            if let Some((at, id)) = client_table::names_redirect(args) {
                return Decision::TrackingRedirect { at, id };
            }
        }
        let stateless = match kind {
            // A `FUNCTION DELETE|FLUSH|RESTORE` is looked at on its way.
            Kind::Plain => !(named && crate::queue::library::may_unload(args)),
            Kind::Pop(form) => !form.is_blocking(),
            Kind::Lrem | Kind::Ack | Kind::Nack | Kind::Queue => true,
            _ => false,
        };
        if stateless && route(kind, args, &self.facts()) == Route::Shared {
            Decision::Batch { writes }
        } else {
            Decision::Forward
        }
    }
}

/// Whether the request's name is one of those the proxy answers or rewrites
/// the reply of without a queue rule (`CLIENT`, `CLUSTER`, `COMMAND`,
/// `CONFIG`, `FUNCTION`, `INFO`): one look at the name's length and first
/// letter spares every other request (a GET) the word-by-word checks.
fn proxy_named(args: Args<'_>) -> bool {
    args.get(0).is_some_and(|name| {
        matches!(
            (name.len(), name.first().map(|b| b | 0x20)),
            (4, Some(b'i')) | (6, Some(b'c')) | (7, Some(b'c')) | (8, Some(b'f'))
        )
    })
}

#[cfg(test)]
mod tests {
    use super::proxy_named;
    use crate::command::with_words;

    #[test]
    fn the_names_the_proxy_may_answer_pass_the_first_look() {
        for name in [
            "CLIENT", "client", "CLUSTER", "COMMAND", "Config", "FUNCTION", "info",
        ] {
            assert!(with_words(&[name, "X"], proxy_named), "{name}");
        }
        for name in ["GET", "SET", "LPUSH", "EVALSHA", "FCALL", "HSET", ""] {
            assert!(!with_words(&[name, "X"], proxy_named), "{name}");
        }
    }
}
