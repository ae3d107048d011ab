//! Plain HTTP requests, and the proxy's Prometheus endpoint read through
//! them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::poll_until;

/// One series of the proxy's Prometheus endpoint on `port`, -1 while it
/// cannot be read. A labelled series is named with its labels as the
/// endpoint writes them (see [`series`]).
pub fn metric(port: u16, name: &str) -> f64 {
    let Ok(reply) = http(port, "GET", "/metrics", &[], b"") else {
        return -1.0;
    };
    series_value(&reply.text(), name).unwrap_or(-1.0)
}

/// The endpoint's whole text, if it answers.
pub fn scrape(port: u16) -> Option<String> {
    http(port, "GET", "/metrics", &[], b"")
        .ok()
        .map(|r| r.text())
}

/// The value of one series in a scraped text.
pub fn series_value(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// A series name with labels, in the exporter's order and quoting:
/// `series("x_total", &[("rule", "jobs")])` is `x_total{rule="jobs"}`.
pub fn series(name: &str, labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return name.to_string();
    }
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    format!("{name}{{{}}}", labels.join(","))
}

/// Waits until the series has the value `want` (metrics change after the
/// reply that caused them, and gauges when sampled), then asserts it.
pub fn await_metric(port: u16, name: &str, want: f64) {
    await_metric_within(
        port,
        name,
        want,
        Duration::from_secs(30),
        Duration::from_millis(20),
    );
}

/// [`await_metric`] with a limit and a polling interval of its own.
pub fn await_metric_within(port: u16, name: &str, want: f64, limit: Duration, every: Duration) {
    poll_until(limit, every, || {
        let got = metric(port, name);
        if got == want {
            Ok(())
        } else {
            Err(format!("{name}: expected {want}, still {got}"))
        }
    });
}

/// An HTTP response: status, headers (names lower-cased), body.
pub struct HttpReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpReply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One HTTP/1.1 request to 127.0.0.1:`port` on a connection of its own
/// (closed after the reply); `headers` may override `Host`.
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<HttpReply> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
    }
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    // Some servers keep the connection open whatever the request says:
    // the reply ends where its length or its last chunk says.
    let mut r = BufReader::new(s);
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP reply");
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(bad)?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(bad());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (n, v) = l.split_once(':').ok_or_else(bad)?;
        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let reply = HttpReply {
        status,
        headers,
        body: Vec::new(),
    };
    let mut body = Vec::new();
    if reply
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let size = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size, 16).map_err(|_| bad())?;
            if size == 0 {
                break;
            }
            let at = body.len();
            body.resize(at + size + 2, 0);
            r.read_exact(&mut body[at..])?;
            body.truncate(at + size);
        }
    } else if let Some(n) = reply.header("content-length") {
        body.resize(n.parse().map_err(|_| bad())?, 0);
        r.read_exact(&mut body)?;
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok(HttpReply { body, ..reply })
}
