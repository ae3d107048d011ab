//! The one queue script sent with `EVALSHA` rather than as a function of
//! the library: `lua/scripts/release.lua`, an ACK's common case.
//!
//! Redis keeps every function library in one Lua heap and steps that
//! heap's collector every 50 script calls; on a heap the size of the
//! library each step walks far more than it frees, and an `FCALL` carries
//! that share (about a tenth of a pop + ACK pair's Redis instructions,
//! `bench/scripts/redis_instructions.py`). A script of the `EVAL` cache
//! runs in a heap of its own, kept small. Only this one is worth it: it
//! needs none of the library's helpers and nothing it keeps between calls.
//!
//! A script Redis does not have (a restart, `SCRIPT FLUSH`) answers
//! `NOSCRIPT`; the call goes again as `EVAL` with the text, which caches it
//! once more.

use std::sync::OnceLock;

use bytes::Bytes;

use crate::upstream::encode_command;

pub struct Script {
    text: &'static str,
    sha: String,
}

impl Script {
    fn new(text: &'static str) -> Script {
        Script {
            text,
            sha: sha1_smol::Sha1::from(text).digest().to_string(),
        }
    }

    /// `EVALSHA` of the script on `keys` and `args`.
    pub fn evalsha(&self, keys: &[&[u8]], args: &[&[u8]]) -> Bytes {
        self.request(b"EVALSHA", self.sha.as_bytes(), keys, args)
    }

    /// The same with the script's text, for a Redis that lost it.
    pub fn eval(&self, keys: &[&[u8]], args: &[&[u8]]) -> Bytes {
        self.request(b"EVAL", self.text.as_bytes(), keys, args)
    }

    fn request(&self, cmd: &[u8], script: &[u8], keys: &[&[u8]], args: &[&[u8]]) -> Bytes {
        let mut numkeys = itoa::Buffer::new();
        let mut all: Vec<&[u8]> = Vec::with_capacity(3 + keys.len() + args.len());
        all.extend([cmd, script, numkeys.format(keys.len()).as_bytes()]);
        all.extend_from_slice(keys);
        all.extend_from_slice(args);
        Bytes::from(encode_command(&all))
    }
}

/// `lua/scripts/release.lua`.
pub fn release() -> &'static Script {
    static RELEASE: OnceLock<Script> = OnceLock::new();
    RELEASE.get_or_init(|| Script::new(include_str!("../../../lua/scripts/release.lua")))
}

/// Whether Redis answered that it does not have the script.
pub fn is_noscript(reply: &[u8]) -> bool {
    reply.starts_with(b"-NOSCRIPT")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_is_named_by_the_sha1_of_its_text() {
        let s = release();
        assert_eq!(s.sha.len(), 40);
        let req = s.evalsha(&[b"k1", b"k2"], &[b"id"]);
        let text = String::from_utf8_lossy(&req);
        assert!(text.starts_with("*6\r\n$7\r\nEVALSHA\r\n$40\r\n"), "{text}");
        assert!(
            text.ends_with("$1\r\n2\r\n$2\r\nk1\r\n$2\r\nk2\r\n$2\r\nid\r\n"),
            "{text}"
        );
        assert!(is_noscript(
            b"-NOSCRIPT No matching script. Please use EVAL.\r\n"
        ));
        assert!(!is_noscript(b"-ERR other\r\n"));
    }
}
