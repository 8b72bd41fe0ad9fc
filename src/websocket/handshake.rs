//! The two handshakes of a relayed Responses WebSocket: the provider's first — an
//! HTTP/1.1 upgrade sent through the upstream's pool, so the target, TLS, connect and
//! first-byte deadlines and the header rules are a POST's — then the client's, answered
//! `101` only once the provider's is. A provider that refuses (a 401, a 429, …) is
//! answered to the client as it is, one that has no WebSocket there (404, 405, 426, 501)
//! with the 426 Codex falls back from at once; the client's upgrade is then never
//! accepted.

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, StatusCode, Uri, Version, header};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use crate::error::{Error, Shape};
use crate::headers;
use crate::proxy::frame::Context;
use crate::serve::Drain;
use crate::state::AppState;

use super::session;

/// The handshake headers that belong to one hop (abridge sets its own on each side).
const PER_HOP: [header::HeaderName; 5] = [
    header::SEC_WEBSOCKET_KEY,
    header::SEC_WEBSOCKET_ACCEPT,
    header::SEC_WEBSOCKET_VERSION,
    header::SEC_WEBSOCKET_EXTENSIONS,
    header::CONTENT_LENGTH,
];

/// The answer to a client's handshake: `101` with the session started behind it, the
/// provider's refusal, or abridge's error in OpenAI's shape.
pub async fn relay(state: &AppState, request: Request) -> Response {
    open(state, request)
        .await
        .unwrap_or_else(|e| e.response_in(Shape::OpenAi))
}

async fn open(state: &AppState, request: Request) -> Result<Response, Error> {
    let (mut parts, _) = request.into_parts();
    let key = client_key(&parts.headers)?;
    let client = parts
        .extensions
        .remove::<OnUpgrade>()
        .ok_or_else(|| Error::Internal("the connection cannot be upgraded".to_owned()))?;
    // The listener's drain, which the session answers (absent: not served by `serve`).
    let drain = parts.extensions.remove::<Drain>();
    let (context, target) = Context::of(state, &mut parts.headers, &parts.uri)?;
    let ours = generate_key();
    let upstream_request = to_upstream(parts.headers, target, &ours);
    let response = state
        .upstream()
        .send(upstream_request)
        .await
        .inspect_err(|_| state.stats().upstream_error())?;
    if lacks_it(response.status()) {
        tracing::debug!(status = %response.status(), "the provider has no Responses WebSocket: 426");
        return Ok(super::refused());
    }
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (mut head, body) = response.into_parts();
        headers::strip_response(&mut head.headers);
        return Ok(Response::from_parts(head, Body::new(body)));
    }
    let accepted = response.headers().get(header::SEC_WEBSOCKET_ACCEPT);
    if accepted.is_none_or(|a| a.as_bytes() != derive_accept_key(ours.as_bytes()).as_bytes()) {
        state.stats().upstream_error();
        return Err(Error::UpstreamUnreachable(
            "the provider's WebSocket handshake did not answer abridge's key".to_owned(),
        ));
    }
    let answer = switching(&key, response.headers());
    let provider = hyper::upgrade::on(response);
    let state = state.clone();
    tokio::spawn(async move {
        match tokio::join!(client, provider) {
            (Ok(client), Ok(provider)) => {
                let sides = (TokioIo::new(client), TokioIo::new(provider));
                session::run(state, context, sides, drain).await;
            }
            (client, provider) => tracing::debug!(
                client = client.is_ok(),
                provider = provider.is_ok(),
                "a WebSocket upgrade did not complete"
            ),
        }
    });
    Ok(answer)
}

/// Whether the provider's answer to the handshake says it has no WebSocket there (no
/// such path, method or upgrade): the client then gets the 426 Codex falls back to HTTPS
/// from at once, where the provider's own answer would have it reconnect first.
fn lacks_it(status: StatusCode) -> bool {
    matches!(status.as_u16(), 404 | 405 | 426 | 501)
}

/// The client's `Sec-WebSocket-Key`, from a handshake of version 13 (RFC 6455).
fn client_key(headers: &HeaderMap) -> Result<HeaderValue, Error> {
    let version = headers.get(header::SEC_WEBSOCKET_VERSION);
    if version.is_none_or(|v| v.as_bytes() != b"13") {
        return Err(Error::BadHeader {
            header: "sec-websocket-version",
            value: version
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default(),
            expected: "13",
        });
    }
    headers
        .get(header::SEC_WEBSOCKET_KEY)
        .filter(|k| !k.is_empty())
        .cloned()
        .ok_or(Error::BadHeader {
            header: "sec-websocket-key",
            value: String::new(),
            expected: "a WebSocket key (RFC 6455)",
        })
}

/// The provider's handshake: the client's headers as a POST forwards them (already
/// stripped of hop-by-hop and `x-abridge-*`), abridge's own key.
fn to_upstream(mut headers: HeaderMap, target: Uri, key: &str) -> http::Request<Body> {
    for name in &PER_HOP {
        headers.remove(name);
    }
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(
        header::SEC_WEBSOCKET_VERSION,
        HeaderValue::from_static("13"),
    );
    if let Ok(key) = HeaderValue::from_str(key) {
        headers.insert(header::SEC_WEBSOCKET_KEY, key);
    }
    let mut request = http::Request::new(Body::empty());
    *request.uri_mut() = target;
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = headers;
    request
}

/// The client's `101`: the provider's headers (its request id, its model and reasoning
/// hints, a chosen subprotocol) less hop-by-hop ones, with the client's accept key.
fn switching(key: &HeaderValue, provider: &HeaderMap) -> Response {
    let mut headers = provider.clone();
    headers::strip_response(&mut headers);
    for name in &PER_HOP {
        headers.remove(name);
    }
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *response.headers_mut() = headers;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_provider_gets_abridges_key_and_the_client_its_own_accept() {
        let mut client = HeaderMap::new();
        client.insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        client.insert(
            header::SEC_WEBSOCKET_KEY,
            HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ=="),
        );
        client.insert(
            header::SEC_WEBSOCKET_EXTENSIONS,
            HeaderValue::from_static("permessage-deflate"),
        );
        client.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        let key = client_key(&client).unwrap();
        let sent = to_upstream(
            client,
            "http://up/v1/responses".parse().unwrap(),
            "b3Vycw==",
        );
        let h = sent.headers();
        assert_eq!(h[header::SEC_WEBSOCKET_KEY], "b3Vycw==");
        assert_eq!(h[header::AUTHORIZATION], "Bearer k");
        assert_eq!(h[header::UPGRADE], "websocket");
        assert!(!h.contains_key(header::SEC_WEBSOCKET_EXTENSIONS));

        let mut provider = HeaderMap::new();
        provider.insert("x-models-etag", HeaderValue::from_static("e1"));
        provider.insert(
            header::SEC_WEBSOCKET_ACCEPT,
            HeaderValue::from_static("theirs"),
        );
        let answer = switching(&key, &provider);
        assert_eq!(answer.status(), StatusCode::SWITCHING_PROTOCOLS);
        // RFC 6455's own example.
        assert_eq!(
            answer.headers()[header::SEC_WEBSOCKET_ACCEPT],
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        assert_eq!(answer.headers()["x-models-etag"], "e1");
    }

    #[test]
    fn a_handshake_without_a_key_or_of_another_version_is_refused() {
        let mut headers = HeaderMap::new();
        headers.insert(header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("8"));
        headers.insert(header::SEC_WEBSOCKET_KEY, HeaderValue::from_static("k"));
        assert!(client_key(&headers).is_err());
        headers.insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        assert!(client_key(&headers).is_ok());
        headers.remove(header::SEC_WEBSOCKET_KEY);
        assert!(client_key(&headers).is_err());
    }
}
