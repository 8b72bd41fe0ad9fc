//! Faults of a misbehaving provider, for abridge's fault and abuse tests: each set for
//! the whole instance ([`Faults`] in `Behavior`) or per request with an `x-fake-*`
//! header.
//!
//! - `gzip_bomb` / `x-fake-gzip-bomb: N` — a `200` JSON response, gzip-encoded, whose
//!   body decodes to N bytes (a few kilobytes on the wire); to a request that asks for a
//!   stream (`"stream": true`), a `text/event-stream` of SSE comment lines instead.
//! - `garbage` / `x-fake-garbage: 1` — a `200` `text/event-stream` of bytes that are not
//!   server-sent events, then the end.
//! - `reset` / `x-fake-reset: 1` — a stream reset after its first event (the connection
//!   fails mid-body).
//! - `reject_stream_options` / `x-fake-reject-stream-options: 1` — `400 Unrecognized
//!   request argument supplied: stream_options` for a body that has `stream_options`, as
//!   Azure OpenAI's older API versions and some compatible servers answer.
//! - `reject_tools` / `x-fake-reject-tools: 1` — llama-server's answer without `--jinja`
//!   to a body that has `tools`: `400 tools param requires --jinja flag`.
//! - `fail_follow_ups` / `x-fake-fail-follow-ups: 1` — `503 overloaded` for a body that
//!   carries the result of an `abridge_recall` call (a provider that fails a proxy's
//!   recall follow-up, and only that).
//! - `api_keys` — when not empty, a request whose `Authorization: Bearer <key>` or
//!   `x-api-key: <key>` is not in the list gets OpenAI's `401 invalid_api_key` (on the
//!   Messages routes Anthropic's `401 authentication_error`: `x-api-key header is
//!   required` without a key, `invalid x-api-key` with a wrong one).

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use flate2::Compression;
use flate2::write::GzEncoder;
use http::{HeaderMap, StatusCode, header};

#[derive(Debug, Clone, Default)]
pub struct Faults {
    pub gzip_bomb: Option<usize>,
    pub garbage: bool,
    pub reset: bool,
    pub reject_stream_options: bool,
    pub reject_tools: bool,
    pub fail_follow_ups: bool,
    pub api_keys: Vec<String>,
}

impl Faults {
    pub(crate) fn apply_headers(&mut self, headers: &HeaderMap) {
        let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let flag = |name: &str| get(name).is_some_and(|v| v == "1" || v == "true");
        if let Some(n) = get("x-fake-gzip-bomb").and_then(|v| v.parse().ok()) {
            self.gzip_bomb = Some(n);
        }
        self.garbage |= flag("x-fake-garbage");
        self.reset |= flag("x-fake-reset");
        self.reject_stream_options |= flag("x-fake-reject-stream-options");
        self.reject_tools |= flag("x-fake-reject-tools");
        self.fail_follow_ups |= flag("x-fake-fail-follow-ups");
    }
}

/// The faulty answer to a request, when a fault applies to it.
pub(crate) fn respond(
    faults: &Faults,
    headers: &HeaderMap,
    path: &str,
    body: &Bytes,
    request_id: &str,
) -> Option<Response> {
    if let Some(response) = unauthorized(&faults.api_keys, headers, path, request_id) {
        return Some(response);
    }
    if faults.reject_stream_options
        && serde_json::from_slice::<serde_json::Value>(body)
            .is_ok_and(|v| v.get("stream_options").is_some())
    {
        return Some(crate::error(
            StatusCode::BAD_REQUEST,
            "Unrecognized request argument supplied: stream_options",
            "invalid_request_error",
            None,
            None,
        ));
    }
    if faults.reject_tools
        && serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| v.get("tools").is_some())
    {
        return Some(crate::error(
            StatusCode::BAD_REQUEST,
            "tools param requires --jinja flag",
            "invalid_request_error",
            None,
            None,
        ));
    }
    if faults.fail_follow_ups && carries_recall_result(body) {
        return Some(crate::error(
            StatusCode::SERVICE_UNAVAILABLE,
            "The server is overloaded; try again.",
            "server_error",
            None,
            None,
        ));
    }
    if !path.ends_with("/chat/completions")
        && !path.ends_with("/responses")
        && !path.ends_with("/messages")
    {
        return None;
    }
    if let Some(size) = faults.gzip_bomb {
        let streamed =
            serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| v["stream"] == true);
        // JSON whitespace, or SSE comment lines (`:` and spaces), 64 bytes a line.
        let mut unit = vec![b' '; 64 * 1024];
        if streamed {
            for line in unit.chunks_mut(64) {
                line[0] = b':';
                line[63] = b'\n';
            }
        }
        let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
        let mut left = size;
        while left > 0 {
            let n = left.min(unit.len());
            if std::io::Write::write_all(&mut gz, &unit[..n]).is_err() {
                break;
            }
            left -= n;
        }
        let compressed = gz.finish().unwrap_or_default();
        let content_type = if streamed {
            "text/event-stream"
        } else {
            "application/json"
        };
        return Some(
            (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, content_type),
                    (header::CONTENT_ENCODING, "gzip"),
                ],
                compressed,
            )
                .into_response(),
        );
    }
    if faults.garbage {
        let junk: Vec<u8> = (0u32..4096)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        return Some(
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/event-stream")],
                junk,
            )
                .into_response(),
        );
    }
    None
}

/// The 401 of a key list that does not have the request's key, in the route's API shape.
fn unauthorized(
    keys: &[String],
    headers: &HeaderMap,
    path: &str,
    request_id: &str,
) -> Option<Response> {
    if keys.is_empty() {
        return None;
    }
    let presented = presented(headers);
    if presented.is_some_and(|p| keys.iter().any(|k| k == p)) {
        return None;
    }
    if crate::messages::is_route(path) {
        let message = if presented.is_none() {
            "x-api-key header is required"
        } else {
            "invalid x-api-key"
        };
        return Some(crate::messages::error(
            StatusCode::UNAUTHORIZED,
            message,
            request_id,
        ));
    }
    Some(crate::error(
        StatusCode::UNAUTHORIZED,
        "Incorrect API key provided: sk-fake-***. You can find your API key at https://platform.openai.com/account/api-keys.",
        "invalid_request_error",
        None,
        Some("invalid_api_key"),
    ))
}

/// The key a request presents: `Authorization: Bearer`, `x-api-key` or `api-key`.
fn presented(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .or_else(|| headers.get("api-key").and_then(|v| v.to_str().ok()))
}

/// Whether a request answers an `abridge_recall` call: its conversation (not its tools)
/// holds a call of the tool (any of the three formats).
pub(crate) fn carries_recall_result(body: &[u8]) -> bool {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return false;
    };
    let conversation = value.get("messages").or_else(|| value.get("input"));
    conversation.is_some_and(|c| {
        c.to_string()
            .contains(&format!("\"name\":\"{}", crate::recall::NAME))
    })
}
