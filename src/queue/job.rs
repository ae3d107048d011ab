//! Queue operations carried out as several script calls: a pop with a large
//! COUNT, an ACK of many ids, a NACK that must then end move leases. Each
//! call does bounded work; the session awaits the whole job before it
//! handles the client's next request, so the client's requests still take
//! effect in the order it sent them, and gets one reply, the one Redis
//! would send.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;

use super::call::Caller;

type Run = Box<dyn FnOnce(Caller) -> Pin<Box<dyn Future<Output = Bytes> + Send>> + Send>;

pub struct Job(Run);

impl Job {
    pub fn new<F, Fut>(f: F) -> Job
    where
        F: FnOnce(Caller) -> Fut + Send + 'static,
        Fut: Future<Output = Bytes> + Send + 'static,
    {
        Job(Box::new(move |caller| Box::pin(f(caller))))
    }

    /// Runs the calls on `caller`'s connection and returns the client's reply.
    pub async fn run(self, caller: Caller) -> Bytes {
        (self.0)(caller).await
    }
}
