//! The Responses API over WebSocket (`GET /v1/responses` with `Upgrade: websocket`,
//! `response.create` frames), which Codex CLI tries first on its built-in `openai`
//! provider: abridge does not carry it, so the handshake is answered at once with
//! `426 Upgrade Required`. Codex reads exactly that status as "no WebSocket here" and
//! goes on over HTTPS for the rest of the session (its `FallbackToHttp`); any other
//! answer (a plain GET forwarded, a 404, a reset) is retried five times, about 7 s,
//! before it falls back. The same for every upstream, OpenAI's own included: relaying
//! the frames would carry the conversation past abridge's compaction.

use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};

/// Whether a request asks to switch to WebSocket (`Upgrade: websocket`, any case, among
/// the protocols it lists).
pub fn asked(headers: &HeaderMap) -> bool {
    headers.get_all(header::UPGRADE).iter().any(|value| {
        value.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|p| p.trim().eq_ignore_ascii_case("websocket"))
        })
    })
}

/// The answer to the handshake: 426 with an OpenAI-shaped error that says to use HTTPS.
pub fn refused() -> Response {
    let body = serde_json::json!({"error": {
        "message": "abridge does not serve the Responses API over WebSocket: send POST /v1/responses over HTTP(S)",
        "type": "invalid_request_error", "param": null, "code": "websocket_not_supported",
    }});
    let mut response = (StatusCode::UPGRADE_REQUIRED, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_websocket_upgrade_is_asked() {
        let with = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::UPGRADE, HeaderValue::from_static(value));
            asked(&headers)
        };
        assert!(with("websocket"));
        assert!(with("WebSocket"));
        assert!(with("h2c, websocket"));
        assert!(!with("h2c"));
        assert!(!asked(&HeaderMap::new()));
    }
}
