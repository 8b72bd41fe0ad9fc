//! The proxy's request handlers: the chat-completions route, which abridge reads, and
//! the transparent pass-through that serves everything else under `/v1`.
//!
//! Each handler is a short list of named stages (see the picture in `lib.rs`); the
//! stages live in their own modules and only `forward` touches the network.

pub mod headers;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Uri, Version, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::chat;
use crate::error::Error;
use crate::relay::{self, Outcome, Watch};
use crate::server::AppState;

/// `POST /v1/chat/completions`.
pub async fn chat(State(state): State<AppState>, request: Request) -> Result<Response, Error> {
    state.stats().request(true);
    let (mut parts, body) = request.into_parts();
    let target = state.upstream().uri_for(&parts.method, &parts.uri)?;

    // ingress: the one body abridge reads whole, bounded.
    let body = read_body(body, &parts.headers, state.config().limits.max_body_bytes).await?;

    // parse (+ identify, plan, rewrite in later stages): what goes upstream.
    let (body, watch) = outgoing_chat_body(&state, body);

    // Usage must be readable: ask for an uncompressed response (see `relay`).
    parts.headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    // The body is already here, whole: nothing to wait for upstream.
    parts.headers.remove(header::EXPECT);

    forward(&state, parts, target, Body::from(body), watch).await
}

/// Every other request under `/v1`: method, path, query, headers and body stream through.
pub async fn passthrough(
    State(state): State<AppState>,
    request: Request,
) -> Result<Response, Error> {
    state.stats().request(false);
    let (parts, body) = request.into_parts();
    let target = state.upstream().uri_for(&parts.method, &parts.uri)?;
    forward(&state, parts, target, body, Watch::Nothing).await
}

/// The chat body to send and what to watch for in the response. The original bytes go
/// upstream unless something must change; an unparseable body goes untouched.
fn outgoing_chat_body(state: &AppState, body: Bytes) -> (Bytes, Watch) {
    let parsed = match chat::parse(&body) {
        Ok(parsed) => parsed,
        Err(reason) => {
            state.stats().unparseable();
            tracing::debug!(%reason, "forwarding a chat body abridge does not understand untouched");
            return (body, Watch::Usage { strip: false });
        }
    };
    match chat::with_usage_requested(&body, &parsed.request) {
        Some(edited) => {
            state.stats().usage_requested();
            (edited, Watch::Usage { strip: true })
        }
        None => (body, Watch::Usage { strip: false }),
    }
}

/// forward → relay → record.
async fn forward(
    state: &AppState,
    mut parts: Parts,
    target: Uri,
    body: Body,
    watch: Watch,
) -> Result<Response, Error> {
    headers::strip_request(&mut parts.headers);
    parts.uri = target;
    parts.version = Version::HTTP_11;
    let request = http::Request::from_parts(parts, body);

    let upstream = state
        .upstream()
        .send(request)
        .await
        .inspect_err(|_| state.stats().upstream_error())?;

    let recorder = state.clone();
    let on_done = Box::new(move |outcome: Outcome| record(&recorder, &outcome));
    Ok(relay::respond(
        upstream,
        watch,
        state.config().timeouts.stream_idle(),
        on_done,
    ))
}

/// record: what the provider reported, once the response has ended.
fn record(state: &AppState, outcome: &Outcome) {
    state.stats().outcome(outcome);
    if let Some(usage) = outcome.usage {
        tracing::debug!(
            prompt_tokens = usage.prompt_tokens,
            completion_tokens = usage.completion_tokens,
            end = ?outcome.end,
            "usage"
        );
    }
}

async fn read_body(body: Body, headers: &HeaderMap, limit: usize) -> Result<Bytes, Error> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(Error::BodyTooLarge { limit });
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(Error::BodyTooLarge { limit }),
        Err(e) => Err(Error::ClientBody(e.to_string())),
    }
}
