//! The Responses API over WebSocket (`GET /v1/responses` with `Upgrade: websocket`,
//! then `response.create` text frames answered by the same event objects the SSE stream
//! carries, one per frame), which Codex CLI tries first on its built-in `openai`
//! provider. What a handshake gets depends on whether the upstream has the provider
//! APIs ([`crate::provider_apis::serves`]):
//!
//! - **Native** (OpenAI's or Azure OpenAI's own host, or `responses_compaction =
//!   "native"`): relayed. The upgrade goes to the configured upstream first, on the same
//!   path mapping, connection pool, TLS and header rules as a POST (and with the same
//!   `x-abridge-*` controls); the client's is accepted only once the provider's is. A
//!   refusal (a 401) is the provider's answer, passed on; a provider that turns out to
//!   have no WebSocket there (a 404) gets the client the 426 below. Then [`session`]
//!   relays the frames both ways, each `response.create` through the conversation stages
//!   of a POST ([`crate::proxy::frame`]); a client with [`MAX_IN_FLIGHT`] of them
//!   unanswered is closed (`1008`).
//! - **Serve** (any other upstream): answered at once with `426 Upgrade Required`. Codex
//!   reads exactly that status as "no WebSocket here" and goes on over HTTPS for the rest
//!   of the session (its `FallbackToHttp`); any other answer (a plain GET forwarded, a
//!   404, a reset) is retried five times, about 7 s, before it falls back. Such an
//!   upstream (llama-server, vLLM, …) has no Responses WebSocket to relay to.
//!
//! The module owns the WebSocket end to end: the handshakes ([`handshake`]) and the
//! session; the frames' requests are the proxy's conversation stages.

mod frames;
mod handshake;
mod session;

pub use session::MAX_IN_FLIGHT;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};

use crate::proxy;
use crate::state::AppState;

/// `GET` on a Responses path: a WebSocket handshake is relayed or refused (see the
/// module docs); any other passes through.
pub async fn responses_get(State(state): State<AppState>, request: Request) -> Response {
    if !asked(request.headers()) {
        return proxy::passthrough(State(state), request).await;
    }
    let exchange = proxy::frame::Handshake::start(&state);
    let response = if crate::provider_apis::serves(state.config()) {
        refused()
    } else {
        handshake::relay(&state, request).await
    };
    exchange.finish(&state, &response);
    response
}

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

/// The answer to the handshake where the upstream has no Responses WebSocket: 426 with
/// an OpenAI-shaped error that says to use HTTPS.
pub fn refused() -> Response {
    let body = serde_json::json!({"error": {
        "message": "abridge does not serve the Responses API over WebSocket for this upstream: send POST /v1/responses over HTTP(S)",
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
