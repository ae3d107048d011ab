//! RESP framing. The hot path never builds typed frames: it only finds where
//! a request or reply ends, so bytes can be forwarded unchanged.

pub mod reply;
pub mod scanner;

pub use scanner::{Limits, ProtocolError, ReplyScanner, RequestScanner, Scan};
