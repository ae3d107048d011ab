//! Logging in to the web view: the admin token, given once, becomes a
//! session cookie, so the page never holds the token itself.
//!
//! The cookie is `HttpOnly` (no script reads it) and `SameSite=Strict` (no
//! other site's page sends it). An action authorised by it also needs the
//! session's CSRF token in `X-CSRF-Token`, which only a page of this origin
//! can read (from `GET /api/session`: no CORS headers, so no other origin
//! can), and every request that changes something is refused when the
//! browser says it comes from another origin ([`same_origin`]). Scripts
//! keep using `Authorization: Bearer <token>`, which no browser sends by
//! itself.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

pub const COOKIE: &str = "ackproxy_session";
pub const CSRF_HEADER: &str = "x-csrf-token";
/// A session ends after this long without an action or a look at
/// `/api/session` (the page asks on every load and navigation)...
const IDLE: Duration = Duration::from_secs(3600);
/// ...and this long after the login, however busy.
pub(super) const MAX_AGE: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at most: a login past it ends the oldest.
const MAX_SESSIONS: usize = 64;

/// Live sessions by the SHA1 of their cookie value: the map holds no
/// value that would be a credential if it leaked.
#[derive(Default)]
pub struct Sessions {
    live: Mutex<HashMap<[u8; 20], Session>>,
}

struct Session {
    csrf: String,
    created: Instant,
    last: Instant,
}

fn digest(id: &str) -> [u8; 20] {
    sha1_smol::Sha1::from(id.as_bytes()).digest().bytes()
}

/// 32 bytes from the TLS library's system random source, in hex.
fn random_hex() -> Option<String> {
    let mut b = [0u8; 32];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut b)
        .ok()?;
    Some(b.iter().map(|x| format!("{x:02x}")).collect())
}

impl Sessions {
    /// A new session: its cookie value and CSRF token.
    pub(super) fn open(&self) -> Option<(String, String)> {
        let (id, csrf) = (random_hex()?, random_hex()?);
        let now = Instant::now();
        let mut live = self.live.lock().unwrap();
        live.retain(|_, s| alive(s, now));
        if live.len() >= MAX_SESSIONS {
            if let Some(oldest) = live.iter().min_by_key(|(_, s)| s.created).map(|(k, _)| *k) {
                live.remove(&oldest);
            }
        }
        live.insert(
            digest(&id),
            Session {
                csrf: csrf.clone(),
                created: now,
                last: now,
            },
        );
        Some((id, csrf))
    }

    /// The CSRF token of the request's live session, which it renews.
    pub(super) fn csrf_of(&self, headers: &HeaderMap) -> Option<String> {
        let id = cookie(headers)?;
        let now = Instant::now();
        let mut live = self.live.lock().unwrap();
        let key = digest(&id);
        match live.get_mut(&key) {
            Some(s) if alive(s, now) => {
                s.last = now;
                Some(s.csrf.clone())
            }
            Some(_) => {
                live.remove(&key);
                None
            }
            None => None,
        }
    }

    pub(super) fn close(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers) {
            self.live.lock().unwrap().remove(&digest(&id));
        }
    }
}

fn alive(s: &Session, now: Instant) -> bool {
    now.duration_since(s.last) < IDLE && now.duration_since(s.created) < MAX_AGE
}

/// The session cookie's value, from any `Cookie` header.
fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim().to_string())
}

/// Why a request may not act.
#[derive(Debug, PartialEq, Eq)]
pub enum Denied {
    /// No `admin_token` is configured.
    ActionsDisabled,
    /// Neither the bearer token nor a live session with its CSRF token.
    Unauthorized,
}

/// Whether the request may act: the bearer token, or a live session with
/// its CSRF token in [`CSRF_HEADER`].
pub fn authorize(
    admin_token: Option<&str>,
    sessions: &Sessions,
    headers: &HeaderMap,
) -> Result<(), Denied> {
    let Some(token) = admin_token else {
        return Err(Denied::ActionsDisabled);
    };
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    if let Some(t) = bearer {
        return if same_secret(t.as_bytes(), token.as_bytes()) {
            Ok(())
        } else {
            Err(Denied::Unauthorized)
        };
    }
    let given = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
    match (sessions.csrf_of(headers), given) {
        (Some(csrf), Some(g)) if same_secret(csrf.as_bytes(), g.as_bytes()) => Ok(()),
        _ => Err(Denied::Unauthorized),
    }
}

/// Compares digests of both, in time independent of where they differ
/// (and of the token's length).
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let (x, y) = (
        sha1_smol::Sha1::from(a).digest().bytes(),
        sha1_smol::Sha1::from(b).digest().bytes(),
    );
    x.iter()
        .zip(y.iter())
        .fold(0u8, |acc, (p, q)| acc | (p ^ q))
        == 0
}

pub(super) fn no_store(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// Refuses a request that may change something (any method but GET and
/// HEAD) when the browser says another origin's page sent it: by
/// `Sec-Fetch-Site`, or by an `Origin` whose host and port are not the
/// request's `Host`. Clients that are no browser send neither and pass;
/// they need the bearer token anyway.
pub async fn same_origin(req: Request, next: Next) -> Response {
    if req.method() == Method::GET || req.method() == Method::HEAD {
        return next.run(req).await;
    }
    if cross_origin(req.headers()) {
        return (
            StatusCode::FORBIDDEN,
            Json(json!({"error": "cross-origin requests cannot change anything here"})),
        )
            .into_response();
    }
    next.run(req).await
}

fn cross_origin(headers: &HeaderMap) -> bool {
    let text = |name| headers.get(name).map(|v| v.to_str().unwrap_or(""));
    if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site")) {
        if !matches!(site, "same-origin" | "none") {
            return true;
        }
    }
    let Some(origin) = text(header::ORIGIN) else {
        return false;
    };
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    match (authority, text(header::HOST)) {
        (Some(a), Some(host)) => !a.eq_ignore_ascii_case(host),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn secrets_compare_by_content() {
        assert!(same_secret(b"token", b"token"));
        assert!(!same_secret(b"token", b"tokem"));
        assert!(!same_secret(b"token", b"token2"));
        assert!(!same_secret(b"", b"token"));
    }

    #[test]
    fn other_origins_are_told_apart_from_this_one() {
        let host = ("host", "127.0.0.1:7380");
        for same in [
            vec![host],
            vec![host, ("origin", "http://127.0.0.1:7380")],
            vec![host, ("sec-fetch-site", "same-origin")],
            vec![host, ("sec-fetch-site", "none")],
        ] {
            assert!(!cross_origin(&headers(&same)), "{same:?}");
        }
        for other in [
            vec![host, ("origin", "http://evil.example")],
            vec![host, ("origin", "http://127.0.0.1:7381")],
            vec![host, ("origin", "null")],
            vec![host, ("sec-fetch-site", "cross-site")],
            vec![host, ("sec-fetch-site", "same-site")],
            vec![("origin", "http://127.0.0.1:7380")],
        ] {
            assert!(cross_origin(&headers(&other)), "{other:?}");
        }
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let h = headers(&[("cookie", "a=1; ackproxy_session=abc ; b=2")]);
        assert_eq!(cookie(&h).as_deref(), Some("abc"));
        assert_eq!(cookie(&headers(&[("cookie", "ackproxy_sessionx=1")])), None);
    }

    #[test]
    fn sessions_open_and_close() {
        let s = Sessions::default();
        let (id, csrf) = s.open().unwrap();
        assert_eq!((id.len(), csrf.len()), (64, 64));
        assert_ne!(id, csrf);
        let mut h = HeaderMap::new();
        h.insert("cookie", format!("{COOKIE}={id}").parse().unwrap());
        assert_eq!(s.csrf_of(&h), Some(csrf));
        s.close(&h);
        assert_eq!(s.csrf_of(&h), None);
        for _ in 0..MAX_SESSIONS + 5 {
            s.open().unwrap();
        }
        assert_eq!(s.live.lock().unwrap().len(), MAX_SESSIONS);
    }
}
