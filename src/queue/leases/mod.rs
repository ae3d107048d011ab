//! Leases after the pop that took them: the reaper that ends the expired
//! ones, the registry of queues it looks at, the leases each client
//! connection holds and the renewal of held ones, and Redis's clock for
//! their age at ACK, and the leases this proxy handed out (the ACKs that
//! can take the short way).

pub mod clock;
pub mod handed;
pub mod held;
pub mod holder;
pub mod owners;
pub mod reaper;
pub mod registry;
