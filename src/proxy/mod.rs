//! The proxy's request handlers: the chat-completions route, which abridge reads, and
//! the transparent pass-through that serves everything else under `/v1`.
//!
//! Each handler is a short list of named stages (see the picture in `lib.rs`); the
//! stages live in their own modules and only `forward` touches the network.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Uri, Version, header};
use http_body_util::{BodyExt, Limited};

use crate::chat::{self, Message, Parsed};
use crate::compactor::{Decision, Followup, Reason, Turn};
use crate::config::Anonymous;
use crate::config::CompactionMode;
use crate::controls::{Compact, Controls, Report};
use crate::error::Error;
use crate::identity::{self, Fingerprint, Identified, IdentityKey};
use crate::ingress;
use crate::compactor::overflow;
use crate::relay::{self, OnDone, Outcome, Watch};
use crate::server::AppState;
use crate::stats::{InFlight, Route};
use crate::store::{Checkpoint, Loaded};
use crate::headers::{self, Credentials};

/// Largest provider error body read to see whether it says "context length exceeded".
const MAX_ERROR_BODY: usize = 1024 * 1024;

/// One request's bookkeeping: in flight until its response body ends, and the time spent
/// waiting for the provider, which abridge's added latency excludes.
struct Exchange {
    started: Instant,
    upstream_wait: Duration,
    inflight: Option<InFlight>,
    /// The request's tenant, once identified: a 2xx from the provider marks it accepted.
    tenant: Option<Fingerprint>,
    /// The body's share of `limits.max_inflight_body_bytes`, until abridge is done with
    /// the body (the end of the response, or of the background compaction it feeds).
    held: Option<ingress::Held>,
}

impl Exchange {
    fn start(state: &AppState) -> Self {
        Self {
            started: Instant::now(),
            upstream_wait: Duration::ZERO,
            inflight: Some(state.stats().request_started()),
            tenant: None,
            held: None,
        }
    }

    fn finish(self, state: &AppState, route: Route, response: &Response) {
        state.stats().response(route, response.status());
        // The provider accepted this tenant's credential (abridge's own errors never
        // reach here with a tenant: they end the request before it is identified).
        if let Some(tenant) = self.tenant
            && response.status().is_success()
        {
            state.tenants().accepted(tenant);
        }
        let own = self.started.elapsed().saturating_sub(self.upstream_wait);
        state.stats().added_latency(route, own);
    }
}

/// `POST /v1/chat/completions`: ingress → parse → identify (+ one store round trip) →
/// plan → rewrite → forward (compact-and-retry once on "context length exceeded") →
/// relay → record.
pub async fn chat(State(state): State<AppState>, request: Request) -> Response {
    let mut exchange = Exchange::start(&state);
    let response = chat_stages(&state, request, &mut exchange)
        .await
        .unwrap_or_else(IntoResponse::into_response);
    exchange.finish(&state, Route::Chat, &response);
    response
}

async fn chat_stages(
    state: &AppState,
    request: Request,
    exchange: &mut Exchange,
) -> Result<Response, Error> {
    let (mut parts, body) = request.into_parts();
    let target = state.upstream().uri_for(&parts.method, &parts.uri)?;
    let controls = Controls::from_headers(&parts.headers, state.config().compaction.allowed())?;

    // ingress: the one body abridge reads whole, bounded.
    let (body, held) = ingress::read_body(
        body,
        &parts.headers,
        state.config().limits.max_body_bytes,
        state.config().timeouts.client_body(),
        state.body_budget(),
    )
    .await?;
    exchange.held = Some(held);
    prepare_headers(&mut parts);
    // The credentials as the provider will see them (hop-by-hop headers gone).
    let credentials = Credentials::from_headers(
        &parts.headers,
        state.config().identity.tenant_headers.iter().map(|h| &h.0),
    );
    let key = identity_key(state).await;

    // parse: a body abridge does not understand goes untouched. A large body is parsed
    // and hashed off the async workers.
    let permit = state.cpu().permit_for(body.len()).await;
    let parsed = match state.cpu().run_with(&permit, || chat::parse(&body)) {
        Ok(parsed) => parsed,
        Err(reason) => {
            drop(permit);
            state.stats().unparseable();
            tracing::debug!(%reason, "forwarding a chat body abridge does not understand untouched");
            let report = Report {
                note: Some("request body not understood: forwarded untouched".to_owned()),
                ..Report::default()
            };
            let response = send(state, &parts, &target, body, exchange).await?;
            return Ok(respond(
                state,
                Upstream::Streaming(response),
                Watch::Usage { strip: false },
                &report,
                None,
                exchange,
            ));
        }
    };
    let identified = state.cpu().run_with(&permit, || {
        identify(
            state,
            key.as_deref(),
            &credentials,
            &controls,
            &parsed.messages,
        )
    });
    drop(permit);

    // load (one round trip).
    let loaded = load(state, identified.as_ref()).await;
    let model = parsed.request.model.as_deref().unwrap_or_default();
    let turn = Turn::new(
        &parsed,
        identified.as_ref(),
        loaded.as_ref(),
        &controls,
        &credentials,
        body.len(),
    );

    // plan → rewrite → forward (→ retry without what abridge added, if the provider
    // refused it → compact-and-retry, if it said the prompt is too long).
    let mut decision = state.compactor().plan(&turn, Reason::Request).await;
    let (outgoing, mut watch) = rewrite(state, &body, &parsed, decision.apply.as_ref());
    // An error body is read before it is passed on only when a retry could follow:
    // compaction may act, or abridge added a field the provider may refuse.
    let may_compact =
        controls.compact != Compact::Off && state.config().compaction.mode == CompactionMode::On;
    let added = watch == Watch::Usage { strip: true };
    let mut upstream = first_answer(
        state,
        &parts,
        &target,
        outgoing,
        may_compact || added,
        exchange,
    )
    .await?;
    if added && refused_addition(&upstream) {
        state.refuse_usage_option();
        let (outgoing, plain) = rewrite(state, &body, &parsed, decision.apply.as_ref());
        upstream = first_answer(state, &parts, &target, outgoing, may_compact, exchange).await?;
        watch = plain;
        decision.report.add_note(
            "the provider refused stream_options, which abridge adds to read usage: retried with the client's own fields; streaming usage is not read from this provider",
        );
    }
    if may_compact {
        upstream = overflow_retry(
            state,
            &turn,
            (&parts, &target, &body, &parsed),
            upstream,
            (&mut decision, &mut watch),
            exchange,
        )
        .await;
    }

    // relay → record.
    for note in &controls.ignored {
        decision.report.add_note(*note);
    }
    if identified.is_none() && key.is_some() && anonymous_refused(state, &credentials) {
        decision.report.add_note(
            "no credential: forwarded without conversation state (identity.anonymous = none)",
        );
    }
    let tenant = identified.as_ref().map(|i| i.tenant);
    let followup = identified
        .map(|identified| followup(identified, &decision, &parsed, &body, model, credentials));
    exchange.tenant = tenant;
    Ok(respond(
        state,
        upstream,
        watch,
        &decision.report,
        followup,
        exchange,
    ))
}

/// Every other request under `/v1`: method, path, query, headers and body stream through.
pub async fn passthrough(State(state): State<AppState>, request: Request) -> Response {
    let mut exchange = Exchange::start(&state);
    let response = passthrough_stages(&state, request, &mut exchange)
        .await
        .unwrap_or_else(IntoResponse::into_response);
    exchange.finish(&state, Route::Passthrough, &response);
    response
}

async fn passthrough_stages(
    state: &AppState,
    request: Request,
    exchange: &mut Exchange,
) -> Result<Response, Error> {
    let (mut parts, body) = request.into_parts();
    let target = state.upstream().uri_for(&parts.method, &parts.uri)?;
    headers::strip_request(&mut parts.headers);
    let body = Body::new(ingress::IdleBody::new(
        body,
        state.config().timeouts.client_body(),
    ));
    parts.uri = target;
    parts.version = Version::HTTP_11;
    let waiting = Instant::now();
    let response = state
        .upstream()
        .send(http::Request::from_parts(parts, body))
        .await
        .inspect_err(|_| state.stats().upstream_error());
    exchange.upstream_wait += waiting.elapsed();
    let response = response?;
    let recorder = state.clone();
    let inflight = exchange.inflight.take();
    let on_done: OnDone = Box::new(move |outcome: Outcome| {
        recorder.stats().outcome(&outcome, false);
        drop(inflight);
    });
    Ok(relay::respond(
        response,
        Watch::Nothing,
        relay_bounds(state),
        on_done,
    ))
}

fn relay_bounds(state: &AppState) -> relay::Bounds {
    relay::Bounds {
        idle: state.config().timeouts.stream_idle(),
        max_decoded: state.config().limits.max_decoded_bytes,
    }
}

/// The chat request's headers for the upstream: hop-by-hop and `x-abridge-*` removed,
/// an uncompressed response asked for (so usage can be read, see `relay`), and no
/// `Expect` (the body is already here, whole).
fn prepare_headers(parts: &mut Parts) {
    headers::strip_request(&mut parts.headers);
    parts.headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    parts.headers.remove(header::EXPECT);
    parts.version = Version::HTTP_11;
}

/// The identity key, or `None` while the store has never answered (fail-open: the
/// request goes on unidentified, and that is counted).
async fn identity_key(state: &AppState) -> Option<Arc<IdentityKey>> {
    let key = state.identity_key().await;
    if key.is_none() {
        state.stats().store_unavailable();
    }
    key
}

/// Requests without a credential get no conversation state (`identity.anonymous =
/// "none"`).
fn anonymous_refused(state: &AppState, credentials: &Credentials) -> bool {
    credentials.is_empty() && state.config().identity.anonymous == Anonymous::None
}

/// identify: the conversation of a request, from its credentials (the tenant), the
/// optional `x-abridge-conversation` header and the messages. `None` when the request
/// has no user message, no identity key is available (store down: fail-open), or it
/// carries no credential and anonymous requests get no state.
fn identify(
    state: &AppState,
    key: Option<&IdentityKey>,
    credentials: &Credentials,
    controls: &Controls,
    messages: &[Message<'_>],
) -> Option<Identified> {
    let key = key?;
    if anonymous_refused(state, credentials) {
        return None;
    }
    let explicit = controls.conversation.as_deref().map(str::as_bytes);
    let identified = identity::identify(key, &credentials.tenant(), explicit, messages)?;
    state.stats().identified();
    Some(identified)
}

/// The conversation's checkpoints and state: one round trip; `None` when the store did
/// not answer (the request goes on without them).
async fn load(state: &AppState, identified: Option<&Identified>) -> Option<Loaded> {
    let identified = identified?;
    match state.store().load(&identified.conversation).await {
        Ok(loaded) => Some(loaded),
        Err(_) => {
            state.stats().store_unavailable();
            None
        }
    }
}

/// rewrite: the body to send — the original bytes unless a checkpoint is applied or
/// usage must be asked for — and what the relay must watch for.
fn rewrite(
    state: &AppState,
    body: &Bytes,
    parsed: &Parsed<'_>,
    apply: Option<&Checkpoint>,
) -> (Bytes, Watch) {
    let mut edits = Vec::with_capacity(2);
    // Not where the provider is known to refuse it (then usage is not read, counted).
    let usage = chat::usage_edit(body, &parsed.request);
    let usage = match usage {
        Some(_) if state.refuses_usage_option() => {
            state.stats().usage_not_asked();
            None
        }
        usage => usage,
    };
    let strip = usage.is_some();
    edits.extend(usage);
    if let Some(checkpoint) = apply {
        let messages = crate::compactor::forwarded(&parsed.messages, checkpoint);
        edits.extend(chat::messages_edit(body, &parsed.request, &messages));
    }
    if strip {
        state.stats().usage_requested();
    }
    let outgoing = chat::apply(body, edits).unwrap_or_else(|| body.clone());
    (outgoing, Watch::Usage { strip })
}

/// compact-and-retry: the provider said the prompt is too long, and nothing has reached
/// the client yet. Compacts harder and sends once more; when that cannot be sent, the
/// provider's own answer is passed on.
async fn overflow_retry(
    state: &AppState,
    turn: &Turn<'_, '_>,
    (parts, target, body, parsed): (&Parts, &Uri, &Bytes, &Parsed<'_>),
    upstream: Upstream,
    (decision, watch): (&mut Decision, &mut Watch),
    exchange: &mut Exchange,
) -> Upstream {
    let Upstream::Buffered(head, error) = &upstream else {
        return upstream;
    };
    if !overflow::is_context_overflow(head.status, error) {
        return upstream;
    }
    let sent = decision.estimate;
    let retry = state
        .compactor()
        .plan(turn, Reason::Overflow { sent })
        .await;
    let deeper = retry.apply.is_some()
        && retry.apply.as_ref().map(|c| c.through) != decision.apply.as_ref().map(|c| c.through);
    if !deeper {
        return upstream;
    }
    let (outgoing, retry_watch) = rewrite(state, body, parsed, retry.apply.as_ref());
    match send(state, parts, target, outgoing, exchange).await {
        Ok(response) => {
            state.stats().retry();
            tracing::info!(conversation = ?turn.conversation, "context length exceeded: compacted and retried once");
            *watch = retry_watch;
            *decision = retry;
            decision
                .report
                .add_note("provider reported context length exceeded: compacted and retried");
            Upstream::Streaming(response)
        }
        // The provider's own answer is better than an error of abridge's.
        Err(e) => {
            tracing::warn!(conversation = ?turn.conversation, error = %e, "context length exceeded; the compacted retry could not be sent, the provider's error is passed on");
            decision
                .report
                .add_note("provider reported context length exceeded; the retry could not be sent");
            upstream
        }
    }
}

/// Whether the provider refused what abridge added to the request (`stream_options`):
/// a 400 or 422 that names it. Azure OpenAI's older API versions and some compatible
/// servers answer `Unrecognized request argument supplied: stream_options`.
fn refused_addition(upstream: &Upstream) -> bool {
    let Upstream::Buffered(head, error) = upstream else {
        return false;
    };
    if !matches!(head.status.as_u16(), 400 | 422) {
        return false;
    }
    let text = String::from_utf8_lossy(&error[..error.len().min(64 * 1024)]).to_ascii_lowercase();
    text.contains("stream_options") || text.contains("include_usage")
}

/// The provider's answer: streamed on, or — for an error that may mean "context length
/// exceeded" — read whole first (it is small), so abridge can still retry.
enum Upstream {
    Streaming(http::Response<hyper::body::Incoming>),
    Buffered(http::response::Parts, Bytes),
}

async fn send(
    state: &AppState,
    parts: &Parts,
    target: &Uri,
    body: Bytes,
    exchange: &mut Exchange,
) -> Result<http::Response<hyper::body::Incoming>, Error> {
    let mut request = http::Request::new(Body::from(body.clone()));
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = target.clone();
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = parts.headers.clone();
    request
        .headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    let waiting = Instant::now();
    let response = state.upstream().send(request).await;
    exchange.upstream_wait += waiting.elapsed();
    response.inspect_err(|_| state.stats().upstream_error())
}

async fn first_answer(
    state: &AppState,
    parts: &Parts,
    target: &Uri,
    body: Bytes,
    may_retry: bool,
    exchange: &mut Exchange,
) -> Result<Upstream, Error> {
    let response = send(state, parts, target, body, exchange).await?;
    // Only an error that could be a context overflow is read whole, and only when a
    // retry could follow; one announced as larger than any such error passes untouched.
    let announced = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if !may_retry
        || !matches!(response.status().as_u16(), 400 | 413 | 422)
        || announced.is_some_and(|n| n > MAX_ERROR_BODY)
    {
        return Ok(Upstream::Streaming(response));
    }
    let (head, incoming) = response.into_parts();
    let idle = state.config().timeouts.stream_idle();
    let waiting = Instant::now();
    let read = tokio::time::timeout(idle, Limited::new(incoming, MAX_ERROR_BODY).collect()).await;
    exchange.upstream_wait += waiting.elapsed();
    match read {
        Ok(Ok(collected)) => Ok(Upstream::Buffered(head, collected.to_bytes())),
        // An unreadable error body: say what happened rather than invent one.
        _ => Err(Error::UpstreamUnreachable(
            "the provider's error response could not be read".to_owned(),
        )),
    }
}

/// relay: the client's response, with abridge's report headers; record when it ends.
fn respond(
    state: &AppState,
    upstream: Upstream,
    watch: Watch,
    report: &Report,
    followup: Option<Followup>,
    exchange: &mut Exchange,
) -> Response {
    let stream = match &upstream {
        Upstream::Streaming(r) if relay::is_event_stream(r.headers()) => {
            Some(state.stats().stream_started())
        }
        _ => None,
    };
    if report.compacted
        && let (Some(before), Some(after)) = (report.tokens_before, report.tokens_after)
    {
        state.stats().tokens_saved(before.saturating_sub(after));
    }
    let recorder = state.clone();
    let compacted = report.compacted;
    let inflight = exchange.inflight.take();
    let held = exchange.held.take();
    let on_done: OnDone = Box::new(move |outcome: Outcome| {
        // A background compaction keeps the body: its share of the budget goes along.
        let followup = followup.map(|mut f| {
            f.held = held;
            f
        });
        record(&recorder, &outcome, followup, compacted);
        drop((inflight, stream));
    });
    let mut response = match upstream {
        Upstream::Streaming(response) => {
            relay::respond(response, watch, relay_bounds(state), on_done)
        }
        Upstream::Buffered(head, body) => relay::respond_buffered(head, body, on_done),
    };
    report.write(response.headers_mut());
    response
}

/// What the record stage needs to know about this request.
fn followup(
    identified: Identified,
    decision: &Decision,
    parsed: &Parsed<'_>,
    body: &Bytes,
    model: &str,
    credentials: Credentials,
) -> Followup {
    Followup {
        held: None,
        tenant: identified.tenant,
        conversation: identified.conversation,
        messages: u32::try_from(parsed.messages.len()).unwrap_or(u32::MAX),
        prefix: identified
            .hashes
            .prefixes
            .last()
            .copied()
            .unwrap_or(identified.conversation),
        applied: decision.apply.as_ref().map(|c| c.through),
        threshold: decision.threshold,
        soft: decision.soft,
        active: decision.active,
        strategy: decision.strategy,
        replaces: decision.usage,
        growth: decision.growth,
        head_tokens: decision.head_tokens,
        appended: decision.appended,
        previous: decision.previous,
        last_seen_ms: decision.last_seen_ms,
        body: body.clone(),
        prefixes: identified.hashes.prefixes,
        model: model.to_owned(),
        credentials,
    }
}

/// record: the outcome in the stats; the usage the provider reported to the compactor
/// (store, anti-thrash, background build).
fn record(state: &AppState, outcome: &Outcome, followup: Option<Followup>, compacted: bool) {
    state.stats().outcome(outcome, compacted);
    let Some(usage) = outcome.usage else {
        return;
    };
    tracing::debug!(
        prompt_tokens = usage.prompt_tokens,
        completion_tokens = usage.completion_tokens,
        end = ?outcome.end,
        "usage"
    );
    if let Some(followup) = followup {
        state.compactor().record(followup, usage.prompt_tokens);
    }
}
