//! The proxy's request handlers: the conversation routes ([`chat`], [`responses`],
//! [`messages`]),
//! which abridge reads, and the transparent pass-through that serves everything else
//! under `/v1` (and Azure's `/openai/…`); and what they share: the bookkeeping of one exchange, sending to the provider, relaying the
//! answer, and the record stage.
//!
//! Each handler is a short list of named stages (see the picture in `lib.rs`); the
//! stages live in their own modules and only `forward` touches the network.

mod conversation;
mod peek;
mod recall;
mod recall_stream;

pub use conversation::{chat, messages, responses};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Uri, Version, header};
use http_body_util::{BodyExt, Limited};

use crate::compactor::Followup;
use crate::controls::Report;
use crate::error::{Error, Shape};
use crate::headers;
use crate::identity::Fingerprint;
use crate::ingress;
use crate::relay::{self, OnDone, Outcome, Watch};
use crate::state::AppState;
use crate::stats::{Estimates, InFlight, Route};

/// Largest provider error body read to see whether it says "context length exceeded".
const MAX_ERROR_BODY: usize = 1024 * 1024;

/// One request's bookkeeping: in flight until its response body ends, and the time spent
/// waiting for the provider, which abridge's added latency excludes.
struct Exchange {
    started: Instant,
    upstream_wait: Duration,
    inflight: Option<InFlight>,
    /// Who pays for the request (the credential its provider authenticates), once
    /// identified: a 2xx from the provider marks it accepted, a 401 or 403 refused.
    payer: Option<Fingerprint>,
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
            payer: None,
            held: None,
        }
    }

    /// A request abridge makes for one it is serving (a recall follow-up): its
    /// bookkeeping is the served request's.
    fn detached() -> Self {
        Self {
            started: Instant::now(),
            upstream_wait: Duration::ZERO,
            inflight: None,
            payer: None,
            held: None,
        }
    }

    fn finish(self, state: &AppState, route: Route, response: &Response) {
        state.stats().response(route, response.status());
        // What the provider said of the credential (abridge's own errors never reach
        // here with a payer: they end the request before it is identified).
        if let Some(payer) = self.payer {
            let status = response.status();
            if status.is_success() {
                state.tenants().accepted(payer);
            } else if matches!(status.as_u16(), 401 | 403) {
                state.tenants().refused(payer);
            }
        }
        let own = self.started.elapsed().saturating_sub(self.upstream_wait);
        state.stats().added_latency(route, own);
    }
}

/// Every other request under `/v1` (and Azure's `/openai/…`): method, path, query,
/// headers and body stream through.
pub async fn passthrough(State(state): State<AppState>, request: Request) -> Response {
    let mut exchange = Exchange::start(&state);
    let shape = Shape::for_path(request.uri().path());
    let response = passthrough_stages(&state, request, &mut exchange)
        .await
        .unwrap_or_else(|e| e.response_in(shape));
    exchange.finish(&state, Route::Passthrough, &response);
    response
}

async fn passthrough_stages(
    state: &AppState,
    request: Request,
    exchange: &mut Exchange,
) -> Result<Response, Error> {
    let (mut parts, body) = request.into_parts();
    headers::strip_request(&mut parts.headers);
    // Whose API it speaks decides where it goes (what the provider will see: after
    // hop-by-hop stripping).
    let (target, _) = state
        .upstream()
        .route(&parts.method, &parts.uri, &parts.headers)?;
    let timeouts = &state.config().timeouts;
    let body = Body::new(ingress::IdleBody::new(
        body,
        timeouts.client_body(),
        timeouts.passthrough_body(),
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
        recorder.stats().outcome(&outcome, None);
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
        max_stream: state.config().timeouts.max_stream(),
        max_decoded: state.config().limits.max_decoded_bytes,
        budget: state.body_budget().clone(),
    }
}

/// The provider's answer: streamed on, or — for an error that may mean "context length
/// exceeded" — read whole first (it is small), so abridge can still retry; or a 200
/// event stream whose start was read to see whether it reports an overflow ([`peek`]).
enum Upstream {
    Streaming(http::Response<hyper::body::Incoming>),
    Buffered(http::response::Parts, Bytes),
    Peeked(peek::Peeked),
    /// A whole (not streamed) answer read to see whether it calls the recall tool, and
    /// the usage to record for the forwarded history.
    Whole(http::response::Parts, Bytes, Option<relay::Usage>),
    /// A stream (`Streaming` or `Peeked`) to go through the recall rounds as it is
    /// relayed.
    Recalling(Box<Upstream>, Box<recall_stream::Streamed>),
}

impl Upstream {
    /// The provider said the prompt is too long (read whole, so nothing reached the
    /// client yet).
    fn overflow(&self) -> Option<crate::compactor::overflow::Overflow> {
        match self {
            Upstream::Buffered(head, error) => crate::compactor::overflow::read(head.status, error),
            Upstream::Peeked(peeked) => peeked.overflow,
            Upstream::Streaming(_) | Upstream::Whole(..) | Upstream::Recalling(..) => None,
        }
    }
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

/// The provider's answer to `body`. With `may_retry`, one that may be an overflow (an
/// error body, the start of an event stream) is read first; with `whole`, a 200 that is
/// not an event stream is read whole (the recall rounds read it).
async fn first_answer(
    state: &AppState,
    parts: &Parts,
    target: &Uri,
    body: Bytes,
    (may_retry, whole): (bool, bool),
    exchange: &mut Exchange,
) -> Result<Upstream, Error> {
    let response = send(state, parts, target, body, exchange).await?;
    if whole
        && response.status() == http::StatusCode::OK
        && !relay::is_event_stream(response.headers())
        && !response.headers().contains_key(header::CONTENT_ENCODING)
    {
        let (head, incoming) = response.into_parts();
        let idle = state.config().timeouts.stream_idle();
        let limit = state.config().limits.max_decoded_bytes;
        let waiting = Instant::now();
        let read = tokio::time::timeout(idle, Limited::new(incoming, limit).collect()).await;
        exchange.upstream_wait += waiting.elapsed();
        return match read {
            Ok(Ok(collected)) => {
                let body = collected.to_bytes();
                let usage = relay::usage::from_json(&body);
                Ok(Upstream::Whole(head, body, usage))
            }
            _ => Err(Error::UpstreamUnreachable(
                "the provider's answer could not be read".to_owned(),
            )),
        };
    }
    if may_retry
        && response.status() == http::StatusCode::OK
        && relay::is_event_stream(response.headers())
        && !response.headers().contains_key(header::CONTENT_ENCODING)
    {
        let waiting = Instant::now();
        let peeked = peek::peek(response, state.config().timeouts.stream_idle()).await;
        exchange.upstream_wait += waiting.elapsed();
        return peeked.map(Upstream::Peeked);
    }
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
    let stream = upstream.streams().then(|| state.stats().stream_started());
    let compacted = match (report.compacted, report.tokens_before, report.tokens_after) {
        (true, Some(client), Some(forwarded)) => {
            state
                .stats()
                .estimated_saving(client.saturating_sub(forwarded));
            Some(Estimates { client, forwarded })
        }
        (true, ..) => Some(Estimates {
            client: 0,
            forwarded: 0,
        }),
        (false, ..) => None,
    };
    let recorder = state.clone();
    let inflight = exchange.inflight.take();
    let held = exchange.held.take();
    let recalled = report
        .recalls
        .filter(|n| *n > 0)
        .zip(followup.as_ref().map(|f| f.conversation));
    let on_done: OnDone = Box::new(move |outcome: Outcome| {
        // A background compaction keeps the body: its share of the budget goes along.
        let followup = followup.map(|mut f| {
            f.held = held;
            f
        });
        record(&recorder, &outcome, followup, compacted);
        if let (Some((n, conversation)), Ok(runtime)) =
            (recalled, tokio::runtime::Handle::try_current())
        {
            let store = recorder.store().clone();
            // Failures are counted and logged by the store.
            runtime.spawn(async move { store.add_recalls(&conversation, u64::from(n)).await });
        }
        drop((inflight, stream));
    });
    let mut response = relayed(state, upstream, watch, on_done);
    report.write(response.headers_mut());
    response
}

impl Upstream {
    /// Whether the client gets an event stream.
    fn streams(&self) -> bool {
        match self {
            Upstream::Streaming(r) => relay::is_event_stream(r.headers()),
            Upstream::Peeked(_) => true,
            Upstream::Recalling(inner, _) => inner.streams(),
            Upstream::Buffered(..) | Upstream::Whole(..) => false,
        }
    }
}

/// The client's response for `upstream`, `on_done` called when it ends.
fn relayed(state: &AppState, upstream: Upstream, watch: Watch, on_done: OnDone) -> Response {
    match upstream {
        Upstream::Streaming(response) => {
            relay::respond(response, watch, relay_bounds(state), on_done)
        }
        Upstream::Buffered(head, body) => relay::respond_buffered(head, body, on_done),
        Upstream::Whole(head, body, usage) => relay::respond_whole(head, body, usage, on_done),
        Upstream::Peeked(peeked) => relay::respond_after(
            peeked.response,
            peeked.read,
            watch,
            relay_bounds(state),
            on_done,
        ),
        Upstream::Recalling(inner, rounds) => {
            let first = relayed(state, *inner, watch, on_done);
            rounds.wrap(first, watch, relay_bounds(state))
        }
    }
}

/// record: the outcome in the stats; the usage the provider reported to the compactor
/// (store, anti-thrash, background build).
fn record(
    state: &AppState,
    outcome: &Outcome,
    followup: Option<Followup>,
    compacted: Option<Estimates>,
) {
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
