//! The client's connection state as far as routing cares: which stateful
//! modes it is in, and so whether it must stay on its dedicated connection.

use crate::command::{Args, Kind};
use crate::output::ReplyTransform;
use crate::upstream::dedicated::Expect;

#[derive(Default)]
pub struct Mode {
    pub multi: bool,
    pub watch: bool,
    /// State that only RESET or a disconnect undoes (AUTH, SELECT n, ...).
    pub sticky: bool,
    /// Replies no longer pair with requests (pub/sub, MONITOR, CLIENT REPLY).
    pub unpaired: bool,
    /// For each command queued in the open MULTI, the transform of its
    /// element in the EXEC reply, if it was rewritten.
    queued: Vec<Option<Box<dyn ReplyTransform>>>,
}

impl Mode {
    /// Commands queued in the open MULTI so far.
    pub fn queued(&self) -> usize {
        self.queued.len()
    }

    pub fn any(&self) -> bool {
        self.multi || self.watch || self.sticky || self.unpaired
    }

    /// Updates the mode for a request sent on the dedicated connection.
    /// Returns the expectation for an EXEC whose reply must be rewritten.
    pub fn apply(
        &mut self,
        kind: Kind,
        args: Args<'_>,
        rewritten: Option<Box<dyn ReplyTransform>>,
    ) -> Option<Expect> {
        match kind {
            Kind::Multi => self.multi = true,
            Kind::EndTransaction => {
                let was_multi = self.multi;
                self.multi = false;
                self.watch = false;
                let queued = std::mem::take(&mut self.queued);
                if was_multi && args.is(0, "EXEC") && queued.iter().any(Option::is_some) {
                    return Some(Expect::Exec(queued));
                }
            }
            Kind::Watch if !self.multi => self.watch = true,
            Kind::Unwatch if !self.multi => self.watch = false,
            // The protocol changes only if Redis accepts the HELLO: the
            // dedicated connection tracks that from the reply.
            Kind::Sticky => self.sticky = true,
            // Set when EXEC runs, where the proxy does not see it: the
            // client stays on the connection that has it.
            Kind::Meta if self.multi => self.sticky = true,
            Kind::StickyUnpaired => {
                self.sticky = true;
                self.unpaired = true;
            }
            // The session drains a connection whose replies did not pair
            // with requests before it relies on pairing again.
            Kind::Reset => *self = Mode::default(),
            _ => {}
        }
        if self.multi
            && !matches!(
                kind,
                Kind::Multi | Kind::EndTransaction | Kind::Watch | Kind::Reset | Kind::Quit
            )
        {
            self.queued.push(rewritten);
        }
        None
    }
}
