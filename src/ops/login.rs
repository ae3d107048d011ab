//! The web view's login, logout and session status (see [`super::session`]
//! for how a session is kept and checked).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::api::{ApiError, Ops};
use super::session::{no_store, same_secret, COOKIE, MAX_AGE};

/// `{admin_actions, logged_in, csrf}`: what the page may offer.
pub async fn status(State(ops): State<Arc<Ops>>, headers: HeaderMap) -> Response {
    let csrf = ops
        .admin_token
        .as_ref()
        .and_then(|_| ops.sessions.csrf_of(&headers));
    no_store(
        Json(json!({
            "admin_actions": ops.admin_token.is_some(),
            "logged_in": csrf.is_some(),
            "csrf": csrf,
        }))
        .into_response(),
    )
}

#[derive(Deserialize)]
pub struct Login {
    token: String,
}

/// Wrong tokens wait this long: guessing one is slow.
const REFUSED_LOGIN_DELAY: Duration = Duration::from_millis(500);

/// `{"token": …}` as JSON: a body other sites' forms cannot send.
pub async fn login(State(ops): State<Arc<Ops>>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(token) = &ops.admin_token else {
        return ApiError::ActionsDisabled.into_response();
    };
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Json(json!({"error": "expected Content-Type: application/json"})),
        )
            .into_response();
    }
    let login: Login = match serde_json::from_slice(&body) {
        Ok(l) => l,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({ "error": format!("expected {{\"token\": …}}: {e}") })),
            )
                .into_response()
        }
    };
    if !same_secret(login.token.trim().as_bytes(), token.as_bytes()) {
        tracing::info!("operations: login refused (wrong admin token)");
        tokio::time::sleep(REFUSED_LOGIN_DELAY).await;
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": "wrong admin token"})),
        )
            .into_response();
    }
    let Some((id, csrf)) = ops.sessions.open() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "no random numbers for a session"})),
        )
            .into_response();
    };
    tracing::info!("operations: logged in");
    let cookie = format!(
        "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
        MAX_AGE.as_secs()
    );
    let mut r = Json(json!({"logged_in": true, "csrf": csrf})).into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    no_store(r)
}

pub async fn logout(State(ops): State<Arc<Ops>>, headers: HeaderMap) -> Response {
    ops.sessions.close(&headers);
    let mut r = Json(json!({"logged_in": false})).into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("ackproxy_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    no_store(r)
}
