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

use crate::chat::{self, Message};
use crate::error::Error;
use crate::identity::{self, Fingerprint};
use crate::relay::{self, Outcome, Watch};
use crate::server::AppState;
use crate::store::UsageRecord;

/// `POST /v1/chat/completions`.
pub async fn chat(State(state): State<AppState>, request: Request) -> Result<Response, Error> {
    state.stats().request(true);
    let (mut parts, body) = request.into_parts();
    let target = state.upstream().uri_for(&parts.method, &parts.uri)?;

    // ingress: the one body abridge reads whole, bounded.
    let body = read_body(body, &parts.headers, state.config().limits.max_body_bytes).await?;

    // parse → identify → (plan → rewrite: later stages) → what goes upstream.
    let (body, watch, turn) = match chat::parse(&body) {
        Ok(parsed) => {
            let turn = identify(&state, &parts.headers, &parsed.messages).await;
            let (edited, watch) = request_usage(&state, &body, &parsed);
            (edited.unwrap_or(body), watch, turn)
        }
        Err(reason) => {
            state.stats().unparseable();
            tracing::debug!(%reason, "forwarding a chat body abridge does not understand untouched");
            (body, Watch::Usage { strip: false }, None)
        }
    };

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

    forward(&state, parts, target, Body::from(body), watch, turn).await
}

/// Every other request under `/v1`: method, path, query, headers and body stream through.
pub async fn passthrough(
    State(state): State<AppState>,
    request: Request,
) -> Result<Response, Error> {
    state.stats().request(false);
    let (parts, body) = request.into_parts();
    let target = state.upstream().uri_for(&parts.method, &parts.uri)?;
    forward(&state, parts, target, body, Watch::Nothing, None).await
}

/// What the record stage needs to know about the conversation a request belongs to.
#[derive(Debug, Clone, Copy)]
struct Turn {
    conversation: Fingerprint,
    /// Messages in the forwarded request, and the prefix hash through the last of them.
    messages: u32,
    prefix: Fingerprint,
}

/// identify: the conversation of a request, from the tenant header, the optional
/// `x-abridge-conversation` header and the messages. `None` when the request has no user
/// message, or the identity key is not available (store down: fail-open).
async fn identify(state: &AppState, headers: &HeaderMap, messages: &[Message<'_>]) -> Option<Turn> {
    let Some(key) = state.identity_key().await else {
        state.stats().store_unavailable();
        return None;
    };
    let tenant = headers
        .get(&state.config().identity.tenant_header.0)
        .map_or(&b""[..], HeaderValue::as_bytes);
    let explicit = headers
        .get(headers::CONVERSATION)
        .map(HeaderValue::as_bytes);
    let identified = identity::identify(&key, tenant, explicit, messages)?;
    state.stats().identified();
    Some(Turn {
        conversation: identified.conversation,
        messages: u32::try_from(messages.len()).unwrap_or(u32::MAX),
        prefix: *identified.hashes.prefixes.last()?,
    })
}

/// The body with `stream_options.include_usage` added when a streaming client did not
/// ask for usage (`None`: send the original bytes), and what the relay must watch for.
fn request_usage(
    state: &AppState,
    body: &Bytes,
    parsed: &chat::Parsed<'_>,
) -> (Option<Bytes>, Watch) {
    match chat::with_usage_requested(body, &parsed.request) {
        Some(edited) => {
            state.stats().usage_requested();
            (Some(edited), Watch::Usage { strip: true })
        }
        None => (None, Watch::Usage { strip: false }),
    }
}

/// forward → relay → record.
async fn forward(
    state: &AppState,
    mut parts: Parts,
    target: Uri,
    body: Body,
    watch: Watch,
    turn: Option<Turn>,
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
    let on_done = Box::new(move |outcome: Outcome| record(&recorder, &outcome, turn));
    Ok(relay::respond(
        upstream,
        watch,
        state.config().timeouts.stream_idle(),
        on_done,
    ))
}

/// record: what the provider reported, once the response has ended; the usage goes to
/// the store in the background (the client has its bytes already).
fn record(state: &AppState, outcome: &Outcome, turn: Option<Turn>) {
    state.stats().outcome(outcome);
    let Some(usage) = outcome.usage else {
        return;
    };
    tracing::debug!(
        prompt_tokens = usage.prompt_tokens,
        completion_tokens = usage.completion_tokens,
        end = ?outcome.end,
        "usage"
    );
    let (Some(turn), Ok(runtime)) = (turn, tokio::runtime::Handle::try_current()) else {
        return;
    };
    let store = state.store().clone();
    runtime.spawn(async move {
        let record = UsageRecord {
            tokens: usage.prompt_tokens,
            messages: turn.messages,
            prefix: turn.prefix,
        };
        // A failure is counted and logged by the store; nothing else to do here.
        let _ = store.record_usage(&turn.conversation, record).await;
    });
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
