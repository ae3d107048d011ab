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
            // Redis 7.0 takes up to INT_MAX arguments; its real bound is the
            // 1 GB query buffer.
            max_array_len: i32::MAX as usize,
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
    /// More than 10 arguments from a client that has not authenticated.
    UnauthenticatedMultibulkLength,
    /// A bulk over 16384 bytes from a client that has not authenticated.
    UnauthenticatedBulkLength,
    /// Reply side only: bytes that are not a RESP reply.
    InvalidReply,
}

impl ProtocolError {
    /// The error reply Redis sends for this condition, CRLF included.
    ///
    /// For `ExpectedDollar` the offending byte is written raw, as Redis does
    /// (`%c`), except that CR and LF become spaces (Redis maps them so the
    /// reply stays one line). A NUL byte cannot reach this error (Redis's
    /// search for the header's CR stops at NUL, and so does the scanner's);
    /// if it did, Redis's formatting would cut the message there.
    pub fn to_reply(&self) -> Vec<u8> {
        let mut out = b"-ERR Protocol error: ".to_vec();
        match self {
            ProtocolError::TooBigInline => out.extend_from_slice(b"too big inline request"),
            ProtocolError::UnbalancedQuotes => {
                out.extend_from_slice(b"unbalanced quotes in request")
            }
            ProtocolError::TooBigMbulkCount => out.extend_from_slice(b"too big mbulk count string"),
            ProtocolError::InvalidMultibulkLength => {
                out.extend_from_slice(b"invalid multibulk length")
            }
            ProtocolError::TooBigBulkCount => out.extend_from_slice(b"too big bulk count string"),
            ProtocolError::ExpectedDollar(b) => {
                out.extend_from_slice(b"expected '$', got '");
                match *b {
                    0 => {}
                    b'\r' | b'\n' => out.extend_from_slice(b" '"),
                    b => out.extend_from_slice(&[b, b'\'']),
                }
            }
            ProtocolError::InvalidBulkLength => out.extend_from_slice(b"invalid bulk length"),
            ProtocolError::UnauthenticatedMultibulkLength => {
                out.extend_from_slice(b"unauthenticated multibulk length")
            }
            ProtocolError::UnauthenticatedBulkLength => {
                out.extend_from_slice(b"unauthenticated bulk length")
            }
            ProtocolError::InvalidReply => out.extend_from_slice(b"invalid reply from upstream"),
        }
        out.extend_from_slice(b"\r\n");
        out
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
    /// Reading the `*<n>` header.
    Start,
    /// Expecting the element header that starts at `at`; `left` elements
    /// (this one included) are still to come.
    Elements { at: usize, left: usize },
    /// Inside a bulk whose data (and the two bytes after it) end at `end`.
    Bulk { end: usize, left: usize },
}

/// Finds where one client request ends, the way Redis 7.0 reads requests
/// (`processMultibulkBuffer` / `processInlineBuffer` in `networking.c`).
///
/// Redis-compatible details, each checked against redis-server 7.0:
/// - Header lines are searched for `\r` (inline lines for `\n`) with C
///   string functions, so a NUL byte ends the search as if nothing had been
///   found: the request waits for more bytes and fails with the matching
///   "too big ..." error once more than `max_inline_len` bytes are buffered.
/// - The byte after a header's `\r` is not looked at (`*1\rX$4\r\nPING\r\n`
///   runs PING), and neither are the two bytes after a bulk's data
///   (`$4\r\nPINGxx` is accepted): Redis skips them unseen, and so does this
///   scanner, so the stream stays in step with the server's view of it.
/// - An element header is judged only once its `\r` and one more byte have
///   arrived: `*1\r\n!` waits, `*1\r\n!3\r\n` fails with "expected '$'".
/// - `*0`, `*-1` and any negative count are skipped without a reply.
#[derive(Debug)]
pub struct RequestScanner {
    limits: Limits,
    /// Redis's tighter limits for a client that must still authenticate.
    unauthenticated: bool,
    state: Req,
    args: Vec<Range<usize>>,
    /// Where the search for the current header's (or inline line's) end
    /// resumes: bytes before it hold no terminator. It stops on a NUL byte
    /// for good, like Redis's search.
    searched: usize,
}

/// Looks for `target` in `buf[*from..]`, stopping at a NUL byte as C's
/// `strchr` does on Redis's NUL-terminated query buffer. `*from` is moved
/// so the next call with more bytes resumes without reading anything twice.
fn search(buf: &[u8], from: &mut usize, target: u8) -> Option<usize> {
    let start = (*from).min(buf.len());
    match buf[start..].iter().position(|&b| b == target || b == 0) {
        Some(p) => {
            *from = start + p;
            (buf[start + p] == target).then_some(start + p)
        }
        None => {
            *from = buf.len();
            None
        }
    }
}

/// An integer as Redis's `string2ll` reads it.
fn parse_len(s: &[u8]) -> Option<i64> {
    super::parse_i64(s)
}

impl RequestScanner {
    pub fn new(limits: Limits) -> Self {
        RequestScanner {
            limits,
            unauthenticated: false,
            state: Req::Start,
            args: Vec::new(),
            searched: 0,
        }
    }

    /// Argument ranges of the last `Command`/`Inline` result.
    pub fn args(&self) -> &[Range<usize>] {
        &self.args
    }

    /// Whether the client must still authenticate: Redis then refuses
    /// requests of more than 10 arguments or with bulks over 16384 bytes
    /// (and closes the connection), so no one can make it buffer much
    /// before logging in.
    pub fn set_unauthenticated(&mut self, on: bool) {
        self.unauthenticated = on;
    }

    /// Forgets a partly scanned request, so the next `scan` starts afresh.
    pub fn reset(&mut self) {
        self.state = Req::Start;
        self.searched = 0;
    }

    /// Scans the request at the start of `buf`; see [`Scan`].
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
        let max_line = self.limits.max_inline_len;
        loop {
            match self.state {
                Req::Start => {
                    let Some(cr) = search(buf, &mut self.searched, b'\r') else {
                        if buf.len() > max_line {
                            return Scan::Error(ProtocolError::TooBigMbulkCount);
                        }
                        return Scan::Incomplete;
                    };
                    if cr > max_line {
                        return Scan::Error(ProtocolError::TooBigMbulkCount);
                    }
                    if cr + 1 >= buf.len() {
                        return Scan::Incomplete;
                    }
                    let n = match parse_len(&buf[1..cr]) {
                        Some(n) if n <= i32::MAX as i64 => n,
                        _ => return Scan::Error(ProtocolError::InvalidMultibulkLength),
                    };
                    if self.unauthenticated && n > 10 {
                        return Scan::Error(ProtocolError::UnauthenticatedMultibulkLength);
                    }
                    if n <= 0 {
                        return Scan::Skip(cr + 2);
                    }
                    if n as u64 > self.limits.max_array_len as u64 {
                        return Scan::Error(ProtocolError::InvalidMultibulkLength);
                    }
                    // Arguments are recorded as they arrive: nothing is
                    // reserved for the declared count.
                    self.args.clear();
                    self.searched = cr + 2;
                    self.state = Req::Elements {
                        at: cr + 2,
                        left: n as usize,
                    };
                }
                Req::Elements { at, left } => {
                    if left == 0 {
                        return Scan::Command(at);
                    }
                    let Some(cr) = search(buf, &mut self.searched, b'\r') else {
                        if buf.len().saturating_sub(at) > max_line {
                            return Scan::Error(ProtocolError::TooBigBulkCount);
                        }
                        return Scan::Incomplete;
                    };
                    if cr - at > max_line {
                        return Scan::Error(ProtocolError::TooBigBulkCount);
                    }
                    if cr + 1 >= buf.len() {
                        return Scan::Incomplete;
                    }
                    if buf[at] != b'$' {
                        return Scan::Error(ProtocolError::ExpectedDollar(buf[at]));
                    }
                    let len = match parse_len(&buf[at + 1..cr]) {
                        Some(l) if l >= 0 && (l as u64) <= self.limits.max_bulk_len as u64 => {
                            l as usize
                        }
                        _ => return Scan::Error(ProtocolError::InvalidBulkLength),
                    };
                    if self.unauthenticated && len > 16384 {
                        return Scan::Error(ProtocolError::UnauthenticatedBulkLength);
                    }
                    let start = cr + 2;
                    self.args.push(start..start.saturating_add(len));
                    self.state = Req::Bulk {
                        end: start.saturating_add(len).saturating_add(2),
                        left: left - 1,
                    };
                }
                Req::Bulk { end, left } => {
                    if buf.len() < end {
                        // O(1) per call however large the bulk.
                        return Scan::Incomplete;
                    }
                    // Redis skips the two bytes after the data without
                    // looking at them; so does this scanner.
                    self.searched = end;
                    self.state = Req::Elements { at: end, left };
                }
            }
        }
    }

    fn inline(&mut self, buf: &[u8]) -> Scan {
        let Some(nl) = search(buf, &mut self.searched, b'\n') else {
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
///
/// Redis runs it on a C string, so a NUL byte ends the line. (The request
/// scanner never passes one: Redis's search for the newline stops at NUL.)
pub fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let line = &line[..line.iter().position(|&b| b == 0).unwrap_or(line.len())];
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

/// Finds where one upstream reply ends (RESP2 and RESP3).
///
/// Aggregates are tracked as counts of children still to come on a heap
/// stack, so any depth is safe. A map of n pairs has 2n children; an
/// attribute (`|`) of n pairs is followed by the value it describes, so it
/// counts as 2n + 1 children of which the last is that value. `$-1` and
/// `*-1` are nulls; other negative lengths, bad lengths, a line not ending
/// in CRLF, a blob not followed by CRLF, or an unknown type byte are
/// `InvalidReply`. The text of simple lines (`+ - : _ , # (`) is not
/// checked: only where they end matters.
#[derive(Debug, Default)]
pub struct ReplyScanner {
    /// Start of the next unread line.
    at: usize,
    /// Where the search for the end of the line at `at` resumes.
    searched: usize,
    /// Remaining children of each open aggregate, innermost last.
    stack: Vec<u64>,
    /// Inside a blob whose data and CRLF end here.
    blob_end: Option<usize>,
}

impl ReplyScanner {
    pub fn new() -> Self {
        ReplyScanner::default()
    }

    /// Forgets a partly scanned reply, so the next `scan` starts afresh.
    pub fn reset(&mut self) {
        self.at = 0;
        self.searched = 0;
        self.stack.clear();
        self.blob_end = None;
    }

    /// `Ok(Some(n))` when one whole reply occupies `buf[..n]`; `Ok(None)`
    /// when more bytes are needed (call again with them appended).
    pub fn scan(&mut self, buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
        match self.scan_inner(buf) {
            Ok(None) => Ok(None),
            done => {
                self.reset();
                done
            }
        }
    }

    /// A value just ended: close the aggregates it completes. True when the
    /// whole reply is done.
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

    /// Moves past a value that ended at `next`.
    fn advance(&mut self, next: usize) -> bool {
        self.at = next;
        self.searched = next;
        self.value_done()
    }

    fn scan_inner(&mut self, buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
        loop {
            if let Some(end) = self.blob_end {
                if buf.len() < end {
                    return Ok(None);
                }
                if &buf[end - 2..end] != b"\r\n" {
                    return Err(ProtocolError::InvalidReply);
                }
                self.blob_end = None;
                if self.advance(end) {
                    return Ok(Some(end));
                }
                continue;
            }
            let at = self.at;
            let from = self.searched.max(at);
            let Some(nl) = buf
                .get(from..)
                .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
                .map(|p| from + p)
            else {
                self.searched = buf.len().max(at);
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
                    if self.advance(next) {
                        return Ok(Some(next));
                    }
                }
                kind @ (b'$' | b'!' | b'=') => match num()? {
                    -1 if kind == b'$' => {
                        if self.advance(next) {
                            return Ok(Some(next));
                        }
                    }
                    n if n >= 0 => {
                        let end = usize::try_from(n)
                            .ok()
                            .and_then(|n| next.checked_add(n)?.checked_add(2))
                            .ok_or(ProtocolError::InvalidReply)?;
                        self.blob_end = Some(end);
                    }
                    _ => return Err(ProtocolError::InvalidReply),
                },
                kind @ (b'*' | b'~' | b'>' | b'%' | b'|') => {
                    let n = num()?;
                    let children = match kind {
                        b'%' => n.checked_mul(2),
                        b'|' => n.checked_mul(2).and_then(|c| c.checked_add(1)),
                        _ => Some(n),
                    };
                    match children {
                        Some(c) if c > 0 => {
                            self.at = next;
                            self.searched = next;
                            self.stack.push(c as u64);
                        }
                        // An empty aggregate, or the null array.
                        Some(0) | Some(-1) if n == 0 || kind == b'*' => {
                            if self.advance(next) {
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
        let args = match r {
            Scan::Command(_) | Scan::Inline { .. } => {
                s.args().iter().map(|a| src[a.clone()].to_vec()).collect()
            }
            _ => Vec::new(),
        };
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

    fn err(buf: &[u8]) -> ProtocolError {
        match req(buf).0 {
            Scan::Error(e) => e,
            other => panic!("{buf:?}: expected an error, got {other:?}"),
        }
    }

    #[test]
    fn unauthenticated_limits_as_redis() {
        let mut r = RequestScanner::new(Limits::default());
        r.set_unauthenticated(true);
        assert_eq!(
            r.scan(b"*11\r\n"),
            Scan::Error(ProtocolError::UnauthenticatedMultibulkLength)
        );
        assert_eq!(r.scan(b"*10\r\n$4\r\nPING\r\n"), Scan::Incomplete);
        r.reset();
        assert_eq!(
            r.scan(b"*2\r\n$4\r\nECHO\r\n$16385\r\n"),
            Scan::Error(ProtocolError::UnauthenticatedBulkLength)
        );
        assert_eq!(r.scan(b"*2\r\n$4\r\nECHO\r\n$16384\r\n"), Scan::Incomplete);
        r.reset();
        // The invalid-length checks come first, as in Redis.
        assert_eq!(
            r.scan(b"*9999999999\r\n"),
            Scan::Error(ProtocolError::InvalidMultibulkLength)
        );
        assert_eq!(
            ProtocolError::UnauthenticatedBulkLength.to_reply(),
            b"-ERR Protocol error: unauthenticated bulk length\r\n"
        );
        r.set_unauthenticated(false);
        assert_eq!(r.scan(b"*11\r\n"), Scan::Incomplete);
    }

    #[test]
    fn error_replies_are_redis_bytes() {
        let cases: [(ProtocolError, &[u8]); 11] = [
            (
                ProtocolError::TooBigInline,
                b"-ERR Protocol error: too big inline request\r\n",
            ),
            (
                ProtocolError::UnbalancedQuotes,
                b"-ERR Protocol error: unbalanced quotes in request\r\n",
            ),
            (
                ProtocolError::TooBigMbulkCount,
                b"-ERR Protocol error: too big mbulk count string\r\n",
            ),
            (
                ProtocolError::InvalidMultibulkLength,
                b"-ERR Protocol error: invalid multibulk length\r\n",
            ),
            (
                ProtocolError::TooBigBulkCount,
                b"-ERR Protocol error: too big bulk count string\r\n",
            ),
            (
                ProtocolError::ExpectedDollar(b'%'),
                b"-ERR Protocol error: expected '$', got '%'\r\n",
            ),
            // Redis writes the byte raw, but CR and LF become spaces.
            (
                ProtocolError::ExpectedDollar(0xff),
                b"-ERR Protocol error: expected '$', got '\xff'\r\n",
            ),
            (
                ProtocolError::ExpectedDollar(b'\r'),
                b"-ERR Protocol error: expected '$', got ' '\r\n",
            ),
            (
                ProtocolError::ExpectedDollar(b'\n'),
                b"-ERR Protocol error: expected '$', got ' '\r\n",
            ),
            (
                ProtocolError::InvalidBulkLength,
                b"-ERR Protocol error: invalid bulk length\r\n",
            ),
            (
                ProtocolError::InvalidReply,
                b"-ERR Protocol error: invalid reply from upstream\r\n",
            ),
        ];
        for (e, bytes) in cases {
            assert_eq!(e.to_reply(), bytes, "{e:?}");
        }
    }

    #[test]
    fn every_request_error() {
        use ProtocolError::*;
        for bad in [
            &b"*abc\r\n"[..],
            b"*\r\n",
            b"*-0\r\n",
            b"*01\r\n",
            b"*+1\r\n",
            b"*2147483648\r\n",
        ] {
            assert_eq!(err(bad), InvalidMultibulkLength, "{bad:?}");
        }
        // Like Redis, up to i32::MAX by default; a lower limit is opt-in.
        assert_eq!(req(b"*1048577\r\n").0, Scan::Incomplete);
        assert_eq!(req(b"*2147483647\r\n").0, Scan::Incomplete);
        let mut strict = RequestScanner::new(Limits {
            max_array_len: 1024 * 1024,
            ..Limits::default()
        });
        assert_eq!(strict.scan(b"*1048576\r\n"), Scan::Incomplete);
        let mut strict = RequestScanner::new(Limits {
            max_array_len: 1024 * 1024,
            ..Limits::default()
        });
        assert!(matches!(
            strict.scan(b"*1048577\r\n"),
            Scan::Error(InvalidMultibulkLength)
        ));
        for bad in [
            &b"*1\r\n$\r\n"[..],
            b"*1\r\n$-0\r\n",
            b"*1\r\n$+3\r\n",
            b"*1\r\n$03\r\n",
            b"*1\r\n$-1\r\n",
            b"*1\r\n$x\r\n",
            b"*1\r\n$536870913\r\n",
        ] {
            assert_eq!(err(bad), InvalidBulkLength, "{bad:?}");
        }
        assert_eq!(req(b"*1\r\n$536870912\r\n").0, Scan::Incomplete);
        assert_eq!(err(b"*1\r\n\r\n"), ExpectedDollar(b'\r'));
        assert_eq!(err(b"*1\r\n\n\r\n"), ExpectedDollar(b'\n'));
        assert_eq!(err(b"*2\r\n$1\r\na\r\n:1\r\n"), ExpectedDollar(b':'));

        let mut long = b"*".to_vec();
        long.extend(std::iter::repeat_n(b'1', 65_535));
        assert_eq!(req(&long).0, Scan::Incomplete);
        long.push(b'1');
        assert_eq!(err(&long), TooBigMbulkCount);
        long.extend_from_slice(b"\r\n");
        assert_eq!(err(&long), TooBigMbulkCount);

        let mut long = b"*1\r\n$".to_vec();
        long.extend(std::iter::repeat_n(b'1', 65_536));
        assert_eq!(err(&long), TooBigBulkCount);
        // Redis judges the first byte only once the header has its CR.
        let mut long = b"*1\r\n!".to_vec();
        assert_eq!(req(&long).0, Scan::Incomplete);
        long.extend(std::iter::repeat_n(b'x', 65_536));
        assert_eq!(err(&long), TooBigBulkCount);

        let mut long = vec![b'a'; 65_536];
        assert_eq!(req(&long).0, Scan::Incomplete);
        long.push(b'a');
        assert_eq!(err(&long), TooBigInline);
        // A long line that arrives whole runs, as in Redis.
        long.push(b'\n');
        assert!(matches!(
            req(&long).0,
            Scan::Inline {
                consumed: 65_538,
                ..
            }
        ));

        for bad in [
            &b"ECHO \"ab\"c\r\n"[..],
            b"ECHO 'a'b\r\n",
            b"ECHO \"a\"'b'\r\n",
            b"ECHO \"a\\\r\n",
            b"ECHO 'a\n",
            b"\"\n",
        ] {
            assert_eq!(err(bad), UnbalancedQuotes, "{bad:?}");
        }
    }

    #[test]
    fn nul_bytes_stop_the_search_for_a_line_end_as_in_redis() {
        use ProtocolError::*;
        // Redis looks for CR / LF with strchr, which stops at NUL: these wait.
        for waits in [
            &b"*1\x00\r\n$4\r\nPING\r\n"[..],
            b"*1\r\n\x00\r\n",
            b"*1\r\n$3\x00\r\nfoo\r\n",
            b"ECHO a\x00b\r\n",
            b"\x00\r\n",
        ] {
            let mut s = RequestScanner::new(Limits::default());
            assert_eq!(s.scan(waits), Scan::Incomplete, "{waits:?}");
            // Later bytes do not help, however many newlines they hold.
            let mut more = waits.to_vec();
            more.extend_from_slice(b"\r\n*1\r\n$4\r\nPING\r\n");
            assert_eq!(s.scan(&more), Scan::Incomplete, "{waits:?}");
        }
        let pad = |head: &[u8]| {
            let mut v = head.to_vec();
            v.extend(std::iter::repeat_n(b'a', 70_000));
            v
        };
        assert_eq!(err(&pad(b"*1\x00\r\n")), TooBigMbulkCount);
        assert_eq!(err(&pad(b"*1\r\n$3\x00\r\n")), TooBigBulkCount);
        assert_eq!(err(&pad(b"ECHO a\x00b\r\n")), TooBigInline);
        // NUL inside bulk data is ordinary data.
        let (r, args) = req(b"*1\r\n$3\r\nf\x00o\r\n");
        assert_eq!(r, Scan::Command(13));
        assert_eq!(args, vec![b"f\x00o".to_vec()]);
        assert_eq!(
            split_args(b"a b\x00c d"),
            Some(vec![b"a".to_vec(), b"b".to_vec()])
        );
    }

    #[test]
    fn bytes_redis_skips_unseen() {
        // The byte after a header's CR and the two after bulk data are not
        // checked by Redis (`*1\rX$4\r\nPING\r\n` answers +PONG).
        let (r, args) = req(b"*1\rX$4\r\nPING\r\n");
        assert_eq!(r, Scan::Command(14));
        assert_eq!(args, vec![b"PING".to_vec()]);
        let (r, args) = req(b"*1\r\n$4\r\nPINGxx*1\r\n");
        assert_eq!(r, Scan::Command(14));
        assert_eq!(args, vec![b"PING".to_vec()]);
        assert_eq!(req(b"*-5\r\nPING\r\n").0, Scan::Skip(5));
        assert_eq!(req(b"*1\r").0, Scan::Incomplete);
        assert_eq!(req(b"*1\r\n$4\r\nPING\r").0, Scan::Incomplete);
    }

    #[test]
    fn inline_quoting() {
        let words = |line: &[u8]| split_args(line).unwrap();
        assert_eq!(
            words(b"\"\\n\\r\\t\\b\\a\\\\\\\"\\q\""),
            vec![b"\n\r\t\x08\x07\\\"q".to_vec()]
        );
        assert_eq!(words(b"\"\\x41\\x4g\\q\""), vec![b"Ax4gq".to_vec()]);
        assert_eq!(words(b"\"\\x4\""), vec![b"x4".to_vec()]);
        assert_eq!(words(b"\"\\xfF\""), vec![vec![0xff]]);
        assert_eq!(words(b"'a\\nb'"), vec![b"a\\nb".to_vec()]);
        assert_eq!(words(b"'a\\'b'"), vec![b"a'b".to_vec()]);
        assert_eq!(words(b"a\"b\" c"), vec![b"ab".to_vec(), b"c".to_vec()]);
        assert_eq!(split_args(b"a\"b\"c"), None);
        assert_eq!(words(b"\"\" ''"), vec![b"".to_vec(), b"".to_vec()]);
        assert_eq!(
            words(b"a\rb\tc\x0bd\x0ce"),
            vec![
                b"a".to_vec(),
                b"b".to_vec(),
                b"c".to_vec(),
                b"d".to_vec(),
                b"e".to_vec()
            ]
        );
        assert_eq!(words(b"  \t "), Vec::<Vec<u8>>::new());
        let (r, args) = req(b"ECHO \"a b\"\n");
        assert!(
            matches!(&r, Scan::Inline { consumed: 11, encoded } if encoded == b"*2\r\n$4\r\nECHO\r\n$3\r\na b\r\n"),
            "{r:?}"
        );
        assert_eq!(args, vec![b"ECHO".to_vec(), b"a b".to_vec()]);
        assert_eq!(req(b"\r\r\n").0, Scan::Skip(3));
        assert_eq!(req(b"\t \nPING\r\n").0, Scan::Skip(3));
        assert_eq!(
            req(b"\"\"\n").0,
            Scan::Inline {
                consumed: 3,
                encoded: b"*1\r\n$0\r\n\r\n".to_vec()
            }
        );
    }

    /// Feeds every prefix of `buf` before the whole and checks the verdict
    /// never changes, and that an early verdict is the whole-buffer one.
    fn same_in_two_pieces(buf: &[u8]) {
        let mut whole = RequestScanner::new(Limits::default());
        let expected = whole.scan(buf);
        let expected_args = whole.args().to_vec();
        for cut in 0..=buf.len() {
            let mut s = RequestScanner::new(Limits::default());
            let first = s.scan(&buf[..cut]);
            let got = if first == Scan::Incomplete {
                s.scan(buf)
            } else {
                first
            };
            assert_eq!(got, expected, "{buf:?} cut at {cut}");
            if matches!(got, Scan::Command(_) | Scan::Inline { .. }) {
                assert_eq!(s.args(), &expected_args[..]);
            }
        }
        let mut r = ReplyScanner::new();
        let expected = r.scan(buf);
        for cut in 0..=buf.len() {
            let mut s = ReplyScanner::new();
            let first = s.scan(&buf[..cut]);
            let got = if first == Ok(None) {
                s.scan(buf)
            } else {
                first
            };
            assert_eq!(got, expected, "reply {buf:?} cut at {cut}");
        }
    }

    #[test]
    fn split_at_every_byte_of_several_frames() {
        for frame in [
            &b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$10\r\n0123456789\r\n"[..],
            b"*1\r\n$0\r\n\r\n",
            b"*0\r\n",
            b"*-1\r\n",
            b"SET a \"b c\\x41\" 'd\\'e'\r\n",
            b"   \r\n",
            b"*2\r\n$1\r\na\r\n!3\r\n",
            b"*1\r\n$-3\r\n",
            b"ECHO \"ab\"c\r\n",
            b"*1\x00\r\n",
            b"%2\r\n+a\r\n*2\r\n:1\r\n$-1\r\n|1\r\n+k\r\n_\r\n=7\r\ntxt:abc\r\n",
            b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nhi\r\n",
            b"*2\r\n$3\r\nabcXY",
        ] {
            same_in_two_pieces(frame);
        }
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
    fn reply_edge_cases() {
        let mut s = ReplyScanner::new();
        let bad = ProtocolError::InvalidReply;
        for b in [
            &b"$-2\r\n"[..],
            b"%-1\r\n",
            b"~-1\r\n",
            b"|-1\r\n",
            b"!-1\r\n",
            b"*-2\r\n",
            b"$x\r\n",
            b"$03\r\nabc\r\n",
            b"+OK\n",
            b"$3\r\nabcXY",
            b"*1\r\n$1\r\nab\r\n",
        ] {
            assert_eq!(s.scan(b), Err(bad.clone()), "{b:?}");
        }
        assert_eq!(s.scan(b"|0\r\n+v\r\n"), Ok(Some(8)));
        assert_eq!(s.scan(b"~0\r\n"), Ok(Some(4)));
        assert_eq!(s.scan(b"$0\r\n\r\n"), Ok(Some(6)));
        assert_eq!(s.scan(b"!3\r\nERR\r\n"), Ok(Some(9)));
        assert_eq!(
            s.scan(b"*2\r\n|1\r\n+k\r\n+v\r\n:1\r\n:2\r\n"),
            Ok(Some(24))
        );
        assert_eq!(s.scan(b"$3\r\nabc\r"), Ok(None));
        assert_eq!(s.scan(b"$3\r\nabc\r\n"), Ok(Some(9)));
        assert_eq!(s.scan(b"$9223372036854775807\r\n"), Ok(None));
        s.reset();
        assert_eq!(s.scan(b"+OK\r\n"), Ok(Some(5)));
    }

    #[test]
    fn deep_resp3_nesting_does_not_recurse() {
        let depth = 100_000;
        let mut buf = b"%1\r\n+k\r\n|1\r\n+a\r\n_\r\n~1\r\n".repeat(depth);
        buf.extend_from_slice(b"#t\r\n");
        let mut s = ReplyScanner::new();
        assert_eq!(s.scan(&buf[..buf.len() - 1]), Ok(None));
        assert_eq!(s.scan(&buf), Ok(Some(buf.len())));
    }

    #[test]
    fn long_lines_and_bulks_in_pieces_cost_linear_time() {
        // A 16 MB simple string in 1 KB pieces: rescanning from the line's
        // start each time would read about 128 GB.
        let mut line = vec![b'x'; 16 << 20];
        line[0] = b'+';
        line.extend_from_slice(b"\r\n");
        let mut s = ReplyScanner::new();
        for cut in (0..line.len()).step_by(1024) {
            assert_eq!(s.scan(&line[..cut]), Ok(None));
        }
        assert_eq!(s.scan(&line), Ok(Some(line.len())));

        let mut req = b"*2\r\n$3\r\nSET\r\n$16777216\r\n".to_vec();
        req.resize(req.len() + (16 << 20), b'v');
        req.extend_from_slice(b"\r\n");
        let mut r = RequestScanner::new(Limits::default());
        for cut in (0..req.len()).step_by(1024) {
            assert_eq!(r.scan(&req[..cut]), Scan::Incomplete);
        }
        assert_eq!(r.scan(&req), Scan::Command(req.len()));
        assert_eq!(r.args()[1].len(), 16 << 20);
    }

    #[test]
    fn huge_declared_counts_allocate_nothing_up_front() {
        let limits = Limits {
            max_array_len: usize::MAX,
            ..Limits::default()
        };
        let mut r = RequestScanner::new(limits);
        assert_eq!(r.scan(b"*2147483647\r\n$1\r\na\r\n"), Scan::Incomplete);
        assert!(r.args.capacity() < 1024);
        let mut s = ReplyScanner::new();
        assert_eq!(
            s.scan(b"*9223372036854775807\r\n%4611686018427387903\r\n"),
            Ok(None)
        );
        assert!(s.stack.capacity() < 1024);
        let mut s = ReplyScanner::new();
        assert_eq!(
            s.scan(b"%4611686018427387904\r\n"),
            Err(ProtocolError::InvalidReply)
        );
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
