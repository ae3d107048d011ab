//! Incremental RESP scanners (request side and reply side).
//!
//! API contract (implementation pending):
//! - `RequestScanner::scan(buf)`: `buf` starts at the first byte of the current
//!   request. If the previous call returned `Incomplete`, scanning resumes where
//!   it stopped (never from byte 0), so a large frame arriving in pieces costs
//!   linear time. State resets after any other result.
//! - `ReplyScanner::scan(buf)`: same contract for one reply (RESP2 and RESP3).

use std::ops::Range;

#[derive(Clone, Debug)]
pub struct Limits {
    pub max_bulk_len: usize,
    pub max_array_len: usize,
    pub max_inline_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk_len: 512 * 1024 * 1024,
            max_array_len: 1024 * 1024,
            max_inline_len: 64 * 1024,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    TooBigInline,
    UnbalancedQuotes,
    TooBigMbulkCount,
    InvalidMultibulkLength,
    TooBigBulkCount,
    ExpectedDollar(u8),
    InvalidBulkLength,
    /// Reply side only: a byte that starts no RESP type, or a malformed header.
    InvalidReply,
}

impl ProtocolError {
    /// The exact error reply Redis sends for this condition, CRLF included.
    pub fn to_reply(&self) -> Vec<u8> {
        todo!()
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Scan {
    /// Not enough bytes yet.
    Incomplete,
    /// `n` bytes hold nothing to execute (blank inline line, `*0`, `*-1`).
    Skip(usize),
    /// A multibulk command occupies `buf[..n]`; `args()` are ranges into `buf`.
    Command(usize),
    /// An inline command occupied `consumed` bytes; `encoded` is the same
    /// command as a multibulk frame and `args()` are ranges into `encoded`.
    Inline { consumed: usize, encoded: Vec<u8> },
    Error(ProtocolError),
}

pub struct RequestScanner {
    _limits: Limits,
    args: Vec<Range<usize>>,
}

impl RequestScanner {
    pub fn new(limits: Limits) -> Self {
        RequestScanner {
            _limits: limits,
            args: Vec::new(),
        }
    }

    pub fn scan(&mut self, _buf: &[u8]) -> Scan {
        todo!()
    }

    /// Argument ranges of the last `Command`/`Inline` result.
    pub fn args(&self) -> &[Range<usize>] {
        &self.args
    }
}

#[derive(Default)]
pub struct ReplyScanner {}

impl ReplyScanner {
    pub fn new() -> Self {
        ReplyScanner {}
    }

    /// `Ok(Some(n))` when one whole reply occupies `buf[..n]`.
    pub fn scan(&mut self, _buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
        todo!()
    }
}
