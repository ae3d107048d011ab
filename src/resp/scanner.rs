//! Incremental RESP scanners: they find where a request or a reply ends
//! without building it, so the proxy can forward the bytes unchanged.
//!
//! Both scanners are resumable. `scan(buf)` is always given the buffer from
//! the first byte of the current frame; when it returns "incomplete" it keeps
//! how far it got, and the next call (with the same bytes plus more) carries
//! on from there. A large frame arriving in small pieces therefore costs
//! linear time, and waiting inside a bulk string costs O(1) per call.
//! Nesting is tracked on a heap stack, never by recursion.

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
    /// Reply side only: bytes that are not a RESP reply.
    InvalidReply,
}

impl ProtocolError {
    /// The error reply Redis sends for this condition, CRLF included.
    pub fn to_reply(&self) -> Vec<u8> {
        let what = match self {
            ProtocolError::TooBigInline => "too big inline request".to_string(),
            ProtocolError::UnbalancedQuotes => "unbalanced quotes in request".to_string(),
            ProtocolError::TooBigMbulkCount => "too big mbulk count string".to_string(),
            ProtocolError::InvalidMultibulkLength => "invalid multibulk length".to_string(),
            ProtocolError::TooBigBulkCount => "too big bulk count string".to_string(),
            ProtocolError::ExpectedDollar(b) => format!("expected '$', got '{}'", *b as char),
            ProtocolError::InvalidBulkLength => "invalid bulk length".to_string(),
            ProtocolError::InvalidReply => "invalid reply from upstream".to_string(),
        };
        format!("-ERR Protocol error: {what}\r\n").into_bytes()
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
    Inline {
        consumed: usize,
        encoded: Vec<u8>,
    },
    Error(ProtocolError),
}

/// Where a multibulk request stands between calls.
#[derive(Debug, Clone, Copy)]
enum Req {
    Start,
    /// Expecting element headers; `at` is the next unread byte.
    Elements {
        at: usize,
        left: usize,
    },
    /// Inside a bulk whose data (and CRLF) ends at `end`.
    Bulk {
        end: usize,
        left: usize,
    },
}

pub struct RequestScanner {
    limits: Limits,
    state: Req,
    args: Vec<Range<usize>>,
    /// Inline lines: bytes already searched for a newline.
    searched: usize,
}

fn find_cr(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?
        .iter()
        .position(|&b| b == b'\r')
        .map(|p| from + p)
}

/// An integer as Redis's `string2ll` reads it.
fn parse_len(s: &[u8]) -> Option<i64> {
    crate::command::parse_i64(s)
}

impl RequestScanner {
    pub fn new(limits: Limits) -> Self {
        RequestScanner {
            limits,
            state: Req::Start,
            args: Vec::new(),
            searched: 0,
        }
    }

    /// Argument ranges of the last `Command`/`Inline` result.
    pub fn args(&self) -> &[Range<usize>] {
        &self.args
    }

    fn reset(&mut self) {
        self.state = Req::Start;
        self.searched = 0;
    }

    pub fn scan(&mut self, buf: &[u8]) -> Scan {
        let r = self.scan_inner(buf);
        if r != Scan::Incomplete {
            self.reset();
        }
        r
    }

    fn scan_inner(&mut self, buf: &[u8]) -> Scan {
        if buf.is_empty() {
            return Scan::Incomplete;
        }
        if buf[0] != b'*' {
            return self.inline(buf);
        }
        loop {
            match self.state {
                Req::Start => {
                    let Some(cr) = find_cr(buf, 1) else {
                        if buf.len() > self.limits.max_inline_len {
                            return Scan::Error(ProtocolError::TooBigMbulkCount);
                        }
                        return Scan::Incomplete;
                    };
                    if cr > self.limits.max_inline_len {
                        return Scan::Error(ProtocolError::TooBigMbulkCount);
                    }
                    if cr + 1 >= buf.len() {
                        return Scan::Incomplete;
                    }
                    let n = match parse_len(&buf[1..cr]) {
                        Some(n) if n <= i32::MAX as i64 => n,
                        _ => return Scan::Error(ProtocolError::InvalidMultibulkLength),
                    };
                    if n <= 0 {
                        return Scan::Skip(cr + 2);
                    }
                    if n as usize > self.limits.max_array_len {
                        return Scan::Error(ProtocolError::InvalidMultibulkLength);
                    }
                    self.args.clear();
                    self.state = Req::Elements {
                        at: cr + 2,
                        left: n as usize,
                    };
                }
                Req::Elements { at, left } => {
                    if left == 0 {
                        return Scan::Command(at);
                    }
                    if at >= buf.len() {
                        return Scan::Incomplete;
                    }
                    if buf[at] != b'$' {
                        return Scan::Error(ProtocolError::ExpectedDollar(buf[at]));
                    }
                    let Some(cr) = find_cr(buf, at + 1) else {
                        if buf.len() - at > self.limits.max_inline_len {
                            return Scan::Error(ProtocolError::TooBigBulkCount);
                        }
                        return Scan::Incomplete;
                    };
                    if cr - at > self.limits.max_inline_len {
                        return Scan::Error(ProtocolError::TooBigBulkCount);
                    }
                    if cr + 1 >= buf.len() {
                        return Scan::Incomplete;
                    }
                    let len = match parse_len(&buf[at + 1..cr]) {
                        Some(l) if l >= 0 && (l as u64) <= self.limits.max_bulk_len as u64 => {
                            l as usize
                        }
                        _ => return Scan::Error(ProtocolError::InvalidBulkLength),
                    };
                    let start = cr + 2;
                    self.args.push(start..start + len);
                    self.state = Req::Bulk {
                        end: start + len + 2,
                        left: left - 1,
                    };
                }
                Req::Bulk { end, left } => {
                    if buf.len() < end {
                        return Scan::Incomplete;
                    }
                    // Redis skips the two bytes after the data without looking.
                    self.state = Req::Elements { at: end, left };
                }
            }
        }
    }

    fn inline(&mut self, buf: &[u8]) -> Scan {
        let from = self.searched;
        let Some(nl) = buf[from..]
            .iter()
            .position(|&b| b == b'\n')
            .map(|p| from + p)
        else {
            self.searched = buf.len();
            if buf.len() > self.limits.max_inline_len {
                return Scan::Error(ProtocolError::TooBigInline);
            }
            return Scan::Incomplete;
        };
        // Like Redis, a line is refused only while it has no end yet: a long
        // line that arrives whole runs.
        let line = if nl > 0 && buf[nl - 1] == b'\r' {
            &buf[..nl - 1]
        } else {
            &buf[..nl]
        };
        let Some(words) = split_args(line) else {
            return Scan::Error(ProtocolError::UnbalancedQuotes);
        };
        if words.is_empty() {
            return Scan::Skip(nl + 1);
        }
        let mut encoded = Vec::with_capacity(line.len() + 16 * words.len() + 16);
        encoded.extend_from_slice(format!("*{}\r\n", words.len()).as_bytes());
        self.args.clear();
        for w in &words {
            encoded.extend_from_slice(format!("${}\r\n", w.len()).as_bytes());
            let start = encoded.len();
            encoded.extend_from_slice(w);
            self.args.push(start..encoded.len());
            encoded.extend_from_slice(b"\r\n");
        }
        Scan::Inline {
            consumed: nl + 1,
            encoded,
        }
    }
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t' | 0x0b | 0x0c)
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Redis's `sdssplitargs`: whitespace-separated words, "double quotes" with
/// escapes, 'single quotes'; `None` for unbalanced quotes.
pub fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        while i < line.len() && is_space(line[i]) {
            i += 1;
        }
        if i >= line.len() {
            return Some(out);
        }
        let mut word = Vec::new();
        let (mut inq, mut insq) = (false, false);
        loop {
            if inq {
                if i >= line.len() {
                    return None;
                }
                if line[i] == b'\\'
                    && i + 3 < line.len()
                    && line[i + 1] == b'x'
                    && hex(line[i + 2]).is_some()
                    && hex(line[i + 3]).is_some()
                {
                    word.push(hex(line[i + 2])? * 16 + hex(line[i + 3])?);
                    i += 3;
                } else if line[i] == b'\\' && i + 1 < line.len() {
                    i += 1;
                    word.push(match line[i] {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 0x08,
                        b'a' => 0x07,
                        c => c,
                    });
                } else if line[i] == b'"' {
                    if i + 1 < line.len() && !is_space(line[i + 1]) {
                        return None;
                    }
                    i += 1;
                    break;
                } else {
                    word.push(line[i]);
                }
            } else if insq {
                if i >= line.len() {
                    return None;
                }
                if line[i] == b'\\' && i + 1 < line.len() && line[i + 1] == b'\'' {
                    i += 1;
                    word.push(b'\'');
                } else if line[i] == b'\'' {
                    if i + 1 < line.len() && !is_space(line[i + 1]) {
                        return None;
                    }
                    i += 1;
                    break;
                } else {
                    word.push(line[i]);
                }
            } else {
                if i >= line.len() {
                    break;
                }
                match line[i] {
                    c if is_space(c) => break,
                    b'"' => inq = true,
                    b'\'' => insq = true,
                    c => word.push(c),
                }
            }
            i += 1;
        }
        out.push(word);
    }
}

/// One pending aggregate of a reply: children still to come.
#[derive(Debug, Default)]
pub struct ReplyScanner {
    /// Next unread byte.
    at: usize,
    /// Remaining children of each open aggregate, innermost last.
    stack: Vec<u64>,
    /// Inside a blob whose data (and CRLF) ends here.
    blob_end: Option<usize>,
}

impl ReplyScanner {
    pub fn new() -> Self {
        ReplyScanner::default()
    }

    fn reset(&mut self) {
        self.at = 0;
        self.stack.clear();
        self.blob_end = None;
    }

    /// `Ok(Some(n))` when one whole reply occupies `buf[..n]`.
    pub fn scan(&mut self, buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
        match self.scan_inner(buf) {
            Ok(Some(n)) => {
                self.reset();
                Ok(Some(n))
            }
            Ok(None) => Ok(None),
            Err(e) => {
                self.reset();
                Err(e)
            }
        }
    }

    /// A value just ended: close the aggregates it completes.
    fn value_done(&mut self) -> bool {
        while let Some(top) = self.stack.last_mut() {
            *top -= 1;
            if *top > 0 {
                return false;
            }
            self.stack.pop();
        }
        true
    }

    fn scan_inner(&mut self, buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
        loop {
            if let Some(end) = self.blob_end {
                if buf.len() < end {
                    return Ok(None);
                }
                self.blob_end = None;
                self.at = end;
                if self.value_done() {
                    return Ok(Some(end));
                }
                continue;
            }
            let at = self.at;
            if at >= buf.len() {
                return Ok(None);
            }
            let Some(nl) = buf[at..].iter().position(|&b| b == b'\n').map(|p| at + p) else {
                return Ok(None);
            };
            // A type byte, then the line, then CRLF.
            if nl < at + 2 || buf[nl - 1] != b'\r' {
                return Err(ProtocolError::InvalidReply);
            }
            let text = &buf[at + 1..nl - 1];
            let next = nl + 1;
            let num = || parse_len(text).ok_or(ProtocolError::InvalidReply);
            match buf[at] {
                b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => {
                    self.at = next;
                    if self.value_done() {
                        return Ok(Some(next));
                    }
                }
                b'$' | b'!' | b'=' => {
                    let n = num()?;
                    if n < 0 {
                        if n != -1 {
                            return Err(ProtocolError::InvalidReply);
                        }
                        self.at = next;
                        if self.value_done() {
                            return Ok(Some(next));
                        }
                    } else {
                        self.blob_end = Some(next + n as usize + 2);
                    }
                }
                b'*' | b'~' | b'>' | b'%' | b'|' => {
                    let n = num()?;
                    self.at = next;
                    let children = match buf[at] {
                        b'%' => n.checked_mul(2),
                        // Attributes precede the value they describe.
                        b'|' => n.checked_mul(2).and_then(|c| c.checked_add(1)),
                        _ => Some(n),
                    };
                    match children {
                        Some(c) if c > 0 => self.stack.push(c as u64),
                        Some(_) if n <= 0 => {
                            if n < -1 {
                                return Err(ProtocolError::InvalidReply);
                            }
                            if self.value_done() {
                                return Ok(Some(next));
                            }
                        }
                        _ => return Err(ProtocolError::InvalidReply),
                    }
                }
                _ => return Err(ProtocolError::InvalidReply),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(buf: &[u8]) -> (Scan, Vec<Vec<u8>>) {
        let mut s = RequestScanner::new(Limits::default());
        let r = s.scan(buf);
        let src: &[u8] = match &r {
            Scan::Inline { encoded, .. } => encoded,
            _ => buf,
        };
        let args = s.args().iter().map(|a| src[a.clone()].to_vec()).collect();
        (r, args)
    }

    #[test]
    fn multibulk_commands() {
        let (r, args) = req(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nextra");
        assert_eq!(r, Scan::Command(20));
        assert_eq!(args, vec![b"GET".to_vec(), b"k".to_vec()]);
        assert_eq!(req(b"*0\r\n").0, Scan::Skip(4));
        assert_eq!(req(b"*-1\r\n").0, Scan::Skip(5));
        assert_eq!(req(b"*2\r\n$3\r\nGET").0, Scan::Incomplete);
    }

    #[test]
    fn protocol_errors() {
        assert_eq!(
            req(b"*abc\r\n").0,
            Scan::Error(ProtocolError::InvalidMultibulkLength)
        );
        assert_eq!(
            req(b"*1\r\n!3\r\n").0,
            Scan::Error(ProtocolError::ExpectedDollar(b'!'))
        );
        assert_eq!(
            req(b"*1\r\n*1\r\n").0,
            Scan::Error(ProtocolError::ExpectedDollar(b'*'))
        );
        assert_eq!(
            req(b"*1\r\n$-5\r\n").0,
            Scan::Error(ProtocolError::InvalidBulkLength)
        );
        assert_eq!(
            req(b"*1\r\n$600000000\r\n").0,
            Scan::Error(ProtocolError::InvalidBulkLength)
        );
        assert_eq!(
            req(&vec![b'a'; 70_000]).0,
            Scan::Error(ProtocolError::TooBigInline)
        );
        assert_eq!(
            req(b"SET a \"b\r\n").0,
            Scan::Error(ProtocolError::UnbalancedQuotes)
        );
        assert_eq!(
            ProtocolError::ExpectedDollar(b'!').to_reply(),
            b"-ERR Protocol error: expected '$', got '!'\r\n"
        );
    }

    #[test]
    fn inline_commands() {
        let (r, args) = req(b"SET a \"b c\\x41\" 'd\\'e'\r\n");
        assert!(matches!(r, Scan::Inline { consumed: 24, .. }), "{r:?}");
        assert_eq!(
            args,
            vec![
                b"SET".to_vec(),
                b"a".to_vec(),
                b"b cA".to_vec(),
                b"d'e".to_vec()
            ]
        );
        assert_eq!(req(b"   \r\n").0, Scan::Skip(5));
        assert_eq!(req(b"\n").0, Scan::Skip(1));
        let (r, args) = req(b"PING\n");
        assert!(matches!(r, Scan::Inline { consumed: 5, .. }));
        assert_eq!(args, vec![b"PING".to_vec()]);
    }

    #[test]
    fn split_at_every_byte_gives_the_same_frame() {
        let frame = b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$10\r\n0123456789\r\n";
        for cut in 0..frame.len() {
            let mut s = RequestScanner::new(Limits::default());
            let first = s.scan(&frame[..cut]);
            assert_eq!(first, Scan::Incomplete, "cut {cut}");
            assert_eq!(s.scan(frame), Scan::Command(frame.len()), "cut {cut}");
            assert_eq!(s.args().len(), 3);
        }
    }

    #[test]
    fn replies() {
        let mut s = ReplyScanner::new();
        assert_eq!(s.scan(b"+OK\r\n"), Ok(Some(5)));
        assert_eq!(s.scan(b"$-1\r\n"), Ok(Some(5)));
        assert_eq!(s.scan(b"*-1\r\n"), Ok(Some(5)));
        assert_eq!(s.scan(b"*0\r\n"), Ok(Some(4)));
        assert_eq!(s.scan(b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n+x"), Ok(Some(19)));
        assert_eq!(s.scan(b"%1\r\n+a\r\n:1\r\n"), Ok(Some(12)));
        assert_eq!(s.scan(b"|1\r\n+a\r\n:1\r\n+v\r\n"), Ok(Some(16)));
        assert_eq!(s.scan(b">2\r\n+a\r\n_\r\n"), Ok(Some(11)));
        assert_eq!(s.scan(b"?x\r\n"), Err(ProtocolError::InvalidReply));
        assert_eq!(s.scan(b"\r\n"), Err(ProtocolError::InvalidReply));
        assert_eq!(s.scan(b"*1\r\n\r\n"), Err(ProtocolError::InvalidReply));
    }

    #[test]
    fn deep_replies_do_not_recurse() {
        let depth = 200_000;
        let mut buf = b"*1\r\n".repeat(depth);
        buf.extend_from_slice(b":1\r\n");
        let mut s = ReplyScanner::new();
        assert_eq!(s.scan(&buf), Ok(Some(buf.len())));
    }

    #[test]
    fn large_reply_in_pieces_resumes() {
        let mut buf = b"*100000\r\n".to_vec();
        for i in 0..100_000 {
            buf.extend_from_slice(format!("${}\r\n{}\r\n", i.to_string().len(), i).as_bytes());
        }
        let mut s = ReplyScanner::new();
        let mut end = 0;
        for cut in (0..buf.len()).step_by(4096) {
            assert_eq!(s.scan(&buf[..cut]), Ok(None));
            end = cut;
        }
        assert!(end < buf.len());
        assert_eq!(s.scan(&buf), Ok(Some(buf.len())));
    }
}
