//! The session's side of client authentication (see `crate::auth`): what a
//! client that has not logged in may do, logging in on its own connection,
//! and the permission check before a queue operation runs as the proxy's
//! user. Sessions of a Redis that needs no login never come here.

use bytes::Bytes;
use tokio::sync::oneshot;

use super::route::{route, Route};
use super::{Session, Stop};
use crate::auth::{self, State, Verdict};
use crate::command::{Args, Kind};
use crate::upstream::dedicated::Expect;

impl Session {
    pub(super) fn set_auth(&mut self, state: State) {
        self.scanner.set_unauthenticated(state == State::Anonymous);
        self.auth = state;
    }

    /// Handles what authentication decides before the usual routing;
    /// `None` leaves the request to it.
    pub(super) async fn guard(
        &mut self,
        kind: Kind,
        args: Args<'_>,
        frame: &Bytes,
    ) -> Option<Option<Stop>> {
        if self.auth == State::Anonymous && !auth::required() {
            // Redis checks its default user on every command: once it needs
            // no password, clients that never logged in are `default`.
            self.set_auth(State::User(Bytes::from_static(b"default")));
        }
        match kind {
            Kind::Quit => return None,
            Kind::Reset => {
                if self.dedicated.is_some() {
                    self.send_dedicated(kind, args, frame, None, None).await;
                } else {
                    self.mode = super::Mode::default();
                    self.answer(Bytes::from_static(b"+RESET\r\n")).await;
                }
                self.set_auth(State::after_reset());
                // Never back to the proxy's connections.
                self.pinned = true;
                return Some(None);
            }
            _ if auth::is_login(kind, args) && !self.mode.multi => {
                self.login(kind, args, frame).await;
                return Some(None);
            }
            _ => {}
        }
        if self.auth != State::Anonymous {
            return None;
        }
        if auth::refuse_unauthenticated(kind, args, self.ctx.queues.is_some()) {
            let reply = if args.is(0, "EXEC") {
                auth::NOAUTH_EXEC
            } else {
                auth::NOAUTH
            };
            self.answer(Bytes::from_static(reply)).await;
        } else {
            // Unknown commands, wrong arity, disabled DEBUG: Redis's answer
            // comes before its login check, so Redis gives it, on the
            // client's connection without credentials. None changes state.
            self.send_dedicated(Kind::Plain, args, frame, None, None)
                .await;
        }
        Some(None)
    }

    /// AUTH or HELLO on the client's own connection: the client is logged
    /// in as the user only if Redis says so, and a refusal changes nothing,
    /// as in Redis.
    async fn login(&mut self, kind: Kind, args: Args<'_>, frame: &Bytes) {
        let user = auth::login_user(kind, args);
        let protocol = if args.is(0, "HELLO") {
            match args.get(1) {
                Some(b"2") => Some(2),
                Some(b"3") => Some(3),
                _ => None,
            }
        } else {
            None
        };
        let (tx, rx) = oneshot::channel();
        self.send_dedicated(kind, args, frame, None, Some(Expect::Checked(protocol, tx)))
            .await;
        // The next request is read with the limits of the outcome, as
        // Redis reads it.
        let ok = rx.await.unwrap_or(false);
        if let (true, Some(user)) = (ok, user) {
            self.set_auth(State::User(user));
        }
    }

    /// Whether the client's user may run the queue operation; if not, the
    /// client has Redis's refusal.
    pub(super) async fn permitted(&mut self, kind: Kind, args: Args<'_>) -> bool {
        let State::User(user) = &self.auth else {
            return true;
        };
        let user = user.clone();
        let Some((command, name)) = auth::equivalent(kind, args) else {
            return true;
        };
        let verdict = match self.ctx.permissions.cached(&user, &name, &command) {
            Some(v) => v,
            None => {
                let request = auth::dryrun_request(&user, &command);
                match self.shared.call(request, self.out.clone()).await {
                    Ok(reply) => {
                        let v = auth::verdict(&reply, &name);
                        self.ctx
                            .permissions
                            .remember(&user, &name, &command, v.clone());
                        v
                    }
                    Err(e) => Verdict::Refused(Bytes::from(e.to_reply())),
                }
            }
        };
        let Verdict::Refused(reply) = verdict else {
            return true;
        };
        let in_multi = self.pinned && self.mode.multi;
        self.answer(reply).await;
        if in_multi {
            // Redis would refuse it at queueing time, which makes EXEC
            // fail: a request Redis refuses (wrong arity) does the same.
            if let Some(d) = &mut self.dedicated {
                d.send_dropped(b"*1\r\n$3\r\nGET\r\n", 1).await;
            }
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
            let reply = self.shared.call(frame, self.out.clone()).await;
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
