//! A small blocking RESP client returning replies as raw bytes (for
//! byte-for-byte comparison) or as decoded values.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A decoded reply, for assertions that do not need raw bytes.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Value>),
    /// Any RESP3-only type, kept raw.
    Other(Vec<u8>),
}

impl Value {
    pub fn bulk(s: &str) -> Value {
        Value::Bulk(s.as_bytes().to_vec())
    }

    /// An array of bulk strings.
    pub fn bulks(items: &[&str]) -> Value {
        Value::Array(items.iter().map(|s| Value::bulk(s)).collect())
    }
}

pub struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Client {
    pub fn connect(port: u16) -> Client {
        Client::try_connect(port).unwrap_or_else(|e| panic!("connect to {port}: {e}"))
    }

    /// The client's own address, as the proxy sees it.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.writer.local_addr().unwrap()
    }

    pub fn try_connect(port: u16) -> std::io::Result<Client> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Client {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
        })
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) {
        self.writer.set_read_timeout(t).unwrap();
    }

    pub fn stream(&self) -> &TcpStream {
        &self.writer
    }

    pub fn encode(args: &[&[u8]]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).unwrap();
    }

    pub fn send(&mut self, args: &[&str]) {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        self.send_raw(&Client::encode(&a));
    }

    pub fn send_bin(&mut self, args: &[&[u8]]) {
        self.send_raw(&Client::encode(args));
    }

    /// One reply, exactly as its bytes arrived.
    pub fn read_raw(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        self.read_raw_into(&mut out).expect("read reply");
        out
    }

    pub fn try_read_raw(&mut self) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.read_raw_into(&mut out)?;
        Ok(out)
    }

    fn read_line(&mut self, out: &mut Vec<u8>) -> std::io::Result<String> {
        let start = out.len();
        let n = self.reader.read_until(b'\n', out)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(String::from_utf8_lossy(&out[start + 1..out.len() - 2]).into_owned())
    }

    fn read_raw_into(&mut self, out: &mut Vec<u8>) -> std::io::Result<()> {
        let start = out.len();
        let line = self.read_line(out)?;
        match out[start] {
            b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Ok(()),
            b'$' | b'!' | b'=' => {
                let n: i64 = line.parse().unwrap();
                if n >= 0 {
                    let at = out.len();
                    out.resize(at + n as usize + 2, 0);
                    self.reader.read_exact(&mut out[at..])?;
                }
                Ok(())
            }
            b'*' | b'~' | b'>' | b'%' | b'|' => {
                let n: i64 = line.parse().unwrap();
                let per = if matches!(out[start], b'%' | b'|') {
                    2
                } else {
                    1
                };
                for _ in 0..(n.max(0) * per) {
                    self.read_raw_into(out)?;
                }
                if out[start] == b'|' {
                    self.read_raw_into(out)?;
                }
                Ok(())
            }
            other => panic!("unexpected reply byte {:?}", other as char),
        }
    }

    pub fn read_value(&mut self) -> Value {
        let raw = self.read_raw();
        decode(&raw).0
    }

    /// Send one command and read its reply as a value.
    pub fn cmd(&mut self, args: &[&str]) -> Value {
        self.send(args);
        self.read_value()
    }

    pub fn cmd_bin(&mut self, args: &[&[u8]]) -> Value {
        self.send_bin(args);
        self.read_value()
    }

    /// Like [`Client::cmd`], with a connection that may be closed under it
    /// (a proxy or a Redis going away) reported rather than a panic.
    pub fn try_cmd(&mut self, args: &[&str]) -> std::io::Result<Value> {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        (&self.writer).write_all(&Client::encode(&a))?;
        let raw = self.try_read_raw()?;
        Ok(decode(&raw).0)
    }

    /// Send one command and read its reply as raw bytes.
    pub fn raw(&mut self, args: &[&str]) -> Vec<u8> {
        self.send(args);
        self.read_raw()
    }
}

/// The text of each of `items`, which must be bulk strings holding UTF-8;
/// `what` names them when one is not.
pub fn bulk_strings(items: &[Value], what: &str) -> Vec<String> {
    items
        .iter()
        .map(|v| match v {
            Value::Bulk(b) => String::from_utf8(b.clone()).unwrap(),
            other => panic!("{what}: {other:?}"),
        })
        .collect()
}

/// Decode one RESP2/RESP3 value from the start of `b`; returns it and its length.
pub fn decode(b: &[u8]) -> (Value, usize) {
    let end = b.windows(2).position(|w| w == b"\r\n").unwrap();
    let line = String::from_utf8_lossy(&b[1..end]).into_owned();
    let after = end + 2;
    match b[0] {
        b'+' => (Value::Simple(line), after),
        b'-' => (Value::Error(line), after),
        b':' => (Value::Int(line.parse().unwrap()), after),
        b'_' => (Value::Nil, after),
        b'$' => {
            let n: i64 = line.parse().unwrap();
            if n < 0 {
                (Value::Nil, after)
            } else {
                let n = n as usize;
                (Value::Bulk(b[after..after + n].to_vec()), after + n + 2)
            }
        }
        b'*' | b'~' | b'>' => {
            let n: i64 = line.parse().unwrap();
            if n < 0 {
                return (Value::Nil, after);
            }
            let mut at = after;
            let mut items = Vec::new();
            for _ in 0..n {
                let (v, used) = decode(&b[at..]);
                items.push(v);
                at += used;
            }
            (Value::Array(items), at)
        }
        b'%' => {
            let n: usize = line.parse().unwrap();
            let mut at = after;
            let mut items = Vec::new();
            for _ in 0..n * 2 {
                let (v, used) = decode(&b[at..]);
                items.push(v);
                at += used;
            }
            (Value::Array(items), at)
        }
        _ => (Value::Other(b.to_vec()), b.len()),
    }
}

/// The value after `name` in a field/value reply (a RESP2 flat array).
pub fn field(v: &Value, name: &str) -> Option<Value> {
    let Value::Array(items) = v else {
        return None;
    };
    items
        .chunks(2)
        .find(|pair| pair[0] == Value::bulk(name))
        .map(|pair| pair[1].clone())
}

/// Everything a connection receives until the peer closes it.
pub fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            // Closing with unread input pending makes the kernel reset the
            // connection; Redis does the same.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return out,
            Err(e) => panic!(
                "connection not closed: {e} (got {:?})",
                String::from_utf8_lossy(&out)
            ),
        }
    }
}

/// Up to `n` idle connections to `port`, at least `at_least`: a low
/// RLIMIT_NOFILE in this process stops the opening early (each connection
/// costs a descriptor here and one in the proxy). Each then answers a PING,
/// within `timeout` (`None`: however long it takes).
pub fn open_pinged(
    port: u16,
    n: usize,
    at_least: usize,
    timeout: Option<Duration>,
) -> Vec<TcpStream> {
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => conns.push(s),
            Err(e) => {
                println!("stopped at {i} connections: {e} (raise ulimit -n; tests/run.sh does)");
                break;
            }
        }
    }
    assert!(conns.len() >= at_least, "only {} connections", conns.len());
    for s in conns.iter_mut() {
        s.write_all(b"PING\r\n").unwrap();
    }
    for s in conns.iter_mut() {
        s.set_read_timeout(timeout).unwrap();
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"+PONG\r\n");
    }
    conns
}
