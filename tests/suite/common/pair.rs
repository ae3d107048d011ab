//! Differential comparison: the same requests to a Redis directly and, in
//! step, through the proxy; the replies must be the same bytes.

use super::{Client, Proxy, Redis};

/// Larger replies are told apart by their sizes: printing megabytes of
/// both would bury the message.
const SHOWN: usize = 64 * 1024;

/// One client straight to a Redis, one through the proxy (to another
/// Redis, or a cluster, that starts in the same state).
pub struct Pair {
    pub direct: Client,
    pub proxied: Client,
}

impl Pair {
    pub fn new(direct: &Redis, proxy: &Proxy) -> Pair {
        Pair {
            direct: direct.client(),
            proxied: proxy.client(),
        }
    }

    /// Sends `args` to both; their replies must match. Returns the reply.
    pub fn same(&mut self, args: &[&str]) -> Vec<u8> {
        let d = self.direct.raw(args);
        let p = self.proxied.raw(args);
        assert_eq!(
            String::from_utf8_lossy(&p),
            String::from_utf8_lossy(&d),
            "reply to {args:?} differs"
        );
        d
    }

    /// [`Pair::same`] for binary arguments, compared byte for byte.
    pub fn same_bin(&mut self, args: &[&[u8]]) -> Vec<u8> {
        self.direct.send_bin(args);
        self.proxied.send_bin(args);
        let d = self.direct.read_raw();
        let p = self.proxied.read_raw();
        if p != d && p.len().max(d.len()) <= SHOWN {
            assert_eq!(
                String::from_utf8_lossy(&p),
                String::from_utf8_lossy(&d),
                "reply to {:?} differs",
                String::from_utf8_lossy(args[0])
            );
        }
        assert!(
            p == d,
            "reply to {:?}, a {}-byte command, differs ({} bytes through the proxy, {} direct)",
            String::from_utf8_lossy(args[0]),
            args.iter().map(|a| a.len()).sum::<usize>(),
            p.len(),
            d.len()
        );
        d
    }

    /// Sends raw bytes to both and compares `n` replies.
    pub fn same_raw(&mut self, bytes: &[u8], n: usize) {
        self.direct.send_raw(bytes);
        self.proxied.send_raw(bytes);
        for i in 0..n {
            let d = self.direct.read_raw();
            let p = self.proxied.read_raw();
            assert_eq!(
                String::from_utf8_lossy(&p),
                String::from_utf8_lossy(&d),
                "reply {i} to {:?} differs",
                String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
            );
        }
    }

    /// Reads one more reply from each (one pushed, or to a request sent
    /// before); they must match.
    pub fn read_same(&mut self, what: &str) {
        let d = self.direct.read_raw();
        let p = self.proxied.read_raw();
        assert_eq!(
            String::from_utf8_lossy(&p),
            String::from_utf8_lossy(&d),
            "{what}"
        );
    }

    /// Sends `args` to both and returns the replies unchecked, direct
    /// first: for replies that name the connection, which differs.
    pub fn each(&mut self, args: &[&str]) -> (Vec<u8>, Vec<u8>) {
        (self.direct.raw(args), self.proxied.raw(args))
    }
}

/// A HELLO reply with the connection id, which differs between servers,
/// masked.
pub fn mask_hello_id(reply: &[u8]) -> String {
    let text = String::from_utf8_lossy(reply).into_owned();
    let Some(at) = text.find("$2\r\nid\r\n:") else {
        return text;
    };
    let start = at + "$2\r\nid\r\n:".len();
    let end = start + text[start..].find("\r\n").unwrap();
    format!("{}<id>{}", &text[..start], &text[end..])
}
