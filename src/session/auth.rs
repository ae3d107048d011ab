//! The session's side of client authentication (see `crate::auth`): what a
//! client that has not logged in may do, logging in on its own connection
//! and then moving to its user's shared connection, and the permission
//! check before a queue operation runs as the proxy's user. Sessions that
//! need no login come here only to log in or for RESET.

use bytes::Bytes;
use tokio::sync::oneshot;

use super::route::{route, Route};
use super::{Session, Step};
use crate::auth::{self, ProxyLogin, State, Verdict};
use crate::command::{Args, Kind};
use crate::upstream::dedicated::{Dedicated, Expect};

impl Session {
    pub(super) fn set_auth(&mut self, state: State) {
        self.scanner.set_unauthenticated(state == State::Anonymous);
        if !matches!(state, State::User(_)) {
            self.member = None;
        }
        self.auth = state;
    }

    /// Whether the proxy asks clients for a password of its own.
    pub(super) fn proxy_password(&self) -> bool {
        self.ctx.requirepass.is_some()
    }

    /// Whether a client connecting now would have to log in.
    fn must_log_in(&self) -> bool {
        auth::required() || self.proxy_password()
    }

    /// Whether the client's stateless commands may go on a shared
    /// connection: the proxy's, or its user's.
    pub(super) fn shares(&self) -> bool {
        self.auth == State::Open || self.member.is_some()
    }

    /// Handles what authentication decides before the usual routing;
    /// [`Step::Pass`] leaves the request to it.
    pub(super) async fn guard(&mut self, kind: Kind, args: Args<'_>, frame: &Bytes) -> Step {
        if self.auth == State::Anonymous && !self.must_log_in() {
            // Redis checks its default user on every command: once no login
            // is wanted, clients that never logged in are like new ones.
            self.set_auth(State::Open);
        }
        match kind {
            Kind::Quit => return Step::Pass,
            Kind::Reset if self.auth != State::Open || self.must_log_in() => {
                if self.dedicated.is_some() {
                    self.send_dedicated(kind, args, frame, None, None).await;
                } else {
                    // What was sent on the user's connection runs first.
                    self.out.shared_drained().await;
                    self.mode = super::Mode::default();
                    self.answer(Bytes::from_static(b"+RESET\r\n")).await;
                }
                self.set_auth(State::after_reset(self.proxy_password()));
                // Back to a shared connection only if the new standing has
                // one (see `maybe_unpin`).
                self.pinned = true;
                return Step::Served;
            }
            _ if auth::is_login(kind, args) && !self.mode.multi => {
                self.login(kind, args, frame).await;
                return Step::Served;
            }
            _ => {}
        }
        if self.auth != State::Anonymous {
            return Step::Pass;
        }
        let refused = auth::refuse_unauthenticated(kind, args, self.ctx.queues.active());
        if refused || (!auth::required() && crate::command::table::current().is_none()) {
            // (Without Redis's table and with a Redis that would run it, any
            // request is refused.)
            let reply = if args.is(0, "EXEC") {
                auth::NOAUTH_EXEC
            } else {
                auth::NOAUTH
            };
            self.answer(Bytes::from_static(reply)).await;
        } else if !auth::required() {
            // Only the proxy's password is missing: on the client's
            // connection Redis would run the request as `default`, so it
            // goes inside a transaction that is discarded.
            if !self.switch_to_dedicated().await {
                return Step::Served;
            }
            if let Some(d) = &mut self.dedicated {
                d.send_dropped(auth::UNEXECUTED_BEFORE, 1).await;
            }
            let refusal = Expect::Transformed(Box::new(auth::QueuedRefused));
            self.send_dedicated(Kind::Plain, args, frame, None, Some(refusal))
                .await;
            if let Some(d) = &mut self.dedicated {
                d.send_dropped(auth::UNEXECUTED_AFTER, 1).await;
            }
        } else {
            // Unknown commands, wrong arity, disabled DEBUG: Redis's answer
            // comes before its login check, so Redis gives it, on the
            // client's connection without credentials. None changes state.
            self.send_dedicated(Kind::Plain, args, frame, None, None)
                .await;
        }
        Step::Served
    }

    /// AUTH or HELLO on the client's own connection: the client is logged
    /// in as the user only if Redis says so, and a refusal changes nothing,
    /// as in Redis. Logged in, the client joins its user's shared
    /// connection, unless the request left state on its own connection
    /// (RESP3, a name) or state already lives there until RESET.
    async fn login(&mut self, kind: Kind, args: Args<'_>, frame: &Bytes) {
        let anonymous = self.auth == State::Anonymous;
        let ctx = self.ctx.clone();
        let by_proxy = ctx.requirepass.as_ref().filter(|_| !auth::required());
        let mut request = frame.clone();
        if let Some(password) = by_proxy {
            match auth::proxy_login(args, password, anonymous) {
                ProxyLogin::AsIs => {}
                ProxyLogin::Rewritten(r) => request = r,
                ProxyLogin::Reply(reply) => {
                    self.answer(Bytes::from_static(reply)).await;
                    return;
                }
                ProxyLogin::WithoutLogin(r) => {
                    // It cannot log in, nor change the protocol.
                    let refusal = Expect::Transformed(Box::new(auth::HelloRefused));
                    self.send_dedicated(Kind::Plain, args, &r, None, Some(refusal))
                        .await;
                    return;
                }
            }
        }
        let login = auth::login_credentials(kind, args);
        let protocol = if args.is(0, "HELLO") {
            match args.get(1) {
                Some(b"2") => Some(2),
                Some(b"3") => Some(3),
                _ => None,
            }
        } else {
            None
        };
        // A RESP3 client's stateless requests cannot go on its user's
        // RESP2 connection: it keeps its own.
        let sticky_before = self.mode.sticky || self.meta.protocol == 3;
        // A HELLO without AUTH logs nobody in: it runs as the user the
        // client is, on a connection logged in as that user (Redis answers
        // it, and switches the protocol, for a logged-in client).
        let fresh = login.is_some()
            && self.member.is_some()
            && self.dedicated.as_ref().is_none_or(|d| d.is_dead());
        if fresh {
            // A connection for the login alone: the pool's login is not
            // needed on it.
            match Dedicated::open_plain(&self.ctx.endpoint, self.out.clone()).await {
                Ok(d) => self.dedicated = Some(d),
                Err(e) => {
                    self.out.ready(Bytes::from(e.to_reply()), 1);
                    return;
                }
            }
        }
        let (tx, rx) = oneshot::channel();
        self.send_dedicated(
            kind,
            args,
            &request,
            None,
            Some(Expect::Checked(protocol, tx)),
        )
        .await;
        // The next request is read with the limits of the outcome, as
        // Redis reads it.
        let ok = rx.await.unwrap_or(false);
        let logged_in = match login.filter(|_| ok) {
            Some((user, _)) if by_proxy.is_some() && user == "default" => {
                // The proxy's password: as a client that needs no login.
                self.set_auth(State::Open);
                true
            }
            Some((user, password)) => {
                self.set_auth(State::User(user.clone()));
                // A client that keeps state on its own connection until
                // RESET (which logs out) would never use the pool.
                self.member = if sticky_before || auth::hello_keeps_state(args) {
                    None
                } else {
                    self.ctx.users.join(&user, &password, &self.out)
                };
                true
            }
            None => false,
        };
        self.mode.sticky = if !ok {
            sticky_before
        } else if logged_in && !self.shares() {
            // No shared connection for this user: the login lives on the
            // client's own connection, which it keeps.
            true
        } else {
            sticky_before || auth::hello_keeps_state(args)
        };
        if self.shares() && !self.mode.any() && (logged_in || fresh) {
            // Nothing the client needs is left on it: Redis sees one
            // connection per login, however many clients share it.
            self.dedicated = None;
        } else if let Some(d) = &self.dedicated {
            d.set_bound(self.mode.any());
        }
        self.maybe_unpin();
    }

    /// Whether the client's user may run the queue operation; if not, the
    /// client has Redis's refusal, for the first of its keys refused.
    pub(super) async fn permitted(&mut self, kind: Kind, args: Args<'_>) -> bool {
        let State::User(user) = &self.auth else {
            return true;
        };
        let user = user.clone();
        let queues = self.ctx.queues.clone();
        let Some((commands, name)) = auth::equivalent(kind, args, |q| queues.dead_letter_of(q))
        else {
            return true;
        };
        let mut verdict = Verdict::Allowed;
        for command in &commands {
            verdict = match self.ctx.permissions.cached(&user, &name, command) {
                Some(v) => v,
                None => {
                    let request = auth::dryrun_request(&user, command);
                    match self.shared.call(request, self.out.clone()).await {
                        Ok(reply) => {
                            let v = auth::verdict(&reply, &name);
                            self.ctx
                                .permissions
                                .remember(&user, &name, command, v.clone());
                            v
                        }
                        Err(e) => Verdict::Refused(Bytes::from(e.to_reply())),
                    }
                }
            };
            if verdict != Verdict::Allowed {
                break;
            }
        }
        let Verdict::Refused(reply) = verdict else {
            return true;
        };
        let in_multi = self.pinned && self.mode.multi;
        self.answer(reply).await;
        if in_multi {
            // Redis would refuse it at queueing time, which makes EXEC fail.
            self.fail_transaction().await;
        }
        false
    }

    /// CONFIG SET requirepass: sent like any CONFIG SET, and once Redis
    /// accepts it the proxy's own new connections use the new password.
    pub(super) async fn set_requirepass(
        &mut self,
        kind: Kind,
        args: Args<'_>,
        frame: Bytes,
        password: Vec<u8>,
    ) {
        let ok = if self.pinned || route(kind, args, &self.facts()) != Route::Shared {
            if self.mode.multi || self.mode.unpaired {
                // Queued or unpaired: its outcome is not known here.
                self.send_dedicated(kind, args, &frame, None, None).await;
                false
            } else {
                let (tx, rx) = oneshot::channel();
                self.send_dedicated(kind, args, &frame, None, Some(Expect::Checked(None, tx)))
                    .await;
                rx.await.unwrap_or(false)
            }
        } else {
            // After the client's reads still in flight: it goes on the
            // writes lane.
            self.enter_writes_lane().await;
            let shared = self.member.as_ref().map_or(&self.shared, |m| m.shared());
            let reply = shared.call(frame, self.out.clone()).await;
            let ok = matches!(&reply, Ok(b) if b.starts_with(b"+"));
            let bytes = reply.unwrap_or_else(|e| Bytes::from(e.to_reply()));
            self.out.answer(bytes, crate::telemetry::Route::Shared);
            ok
        };
        if ok {
            auth::adopt_requirepass(&self.ctx.endpoint, &password);
        }
    }
}
