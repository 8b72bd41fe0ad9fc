//! The proxy's request handlers: the conversation routes ([`chat`], [`responses`],
//! [`messages`]),
//! which abridge reads, Anthropic's token counting where abridge serves its compaction
//! ([`count_tokens`]), and the transparent pass-through that serves everything else
//! under `/v1` (and Azure's `/openai/…`); and what they share: the bookkeeping of one exchange, sending to the provider, relaying the
//! answer, and the record stage.
//!
//! Each handler is a short list of named stages (see the picture in `lib.rs`); the
//! stages live in their own modules and only `forward` touches the network.

mod conversation;
mod count;
pub mod frame;
mod peek;
mod recall;
mod recall_stream;

pub use conversation::{chat, compact, messages, responses};
pub use count::count_tokens;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Uri, Version, header};
use http_body_util::{BodyExt, Limited};

use crate::accounting::{self, Estimates};
use crate::compactor::{Decision, Followup};
use crate::controls::Report;
use crate::error::{Error, Shape};
use crate::formats::Format;
use crate::headers;
use crate::identity::Fingerprint;
use crate::ingress;
use crate::prices::Price;
use crate::provider_apis::first::First;
use crate::relay::{self, OnDone, Outcome, Watch};
use crate::state::AppState;
use crate::stats::{InFlight, Route};

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
    /// A compaction item abridge made for the client, to put first in the answer (see
    /// [`crate::provider_apis::first`]).
    first: Option<First>,
}

impl Exchange {
    fn start(state: &AppState) -> Self {
        Self {
            started: Instant::now(),
            upstream_wait: Duration::ZERO,
            inflight: Some(state.stats().request_started()),
            payer: None,
            held: None,
            first: None,
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
            first: None,
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
    Ok(relay::respond(
        response,
        Watch::Nothing,
        relay_bounds(state),
        passed(state, exchange),
    ))
}

/// What a relayed answer abridge does not read records when it ends: its outcome, the
/// request no longer in flight.
fn passed(state: &AppState, exchange: &mut Exchange) -> OnDone {
    let recorder = state.clone();
    let inflight = exchange.inflight.take();
    Box::new(move |outcome: Outcome| {
        recorder.stats().outcome(&outcome, false);
        drop(inflight);
    })
}

fn relay_bounds(state: &AppState) -> relay::Bounds {
    relay::Bounds {
        idle: state.config().timeouts.stream_idle(),
        max_stream: state.config().timeouts.max_stream(),
        max_decoded: state.config().limits.max_decoded_bytes,
        budget: state.body_budget().clone(),
        decoded: state.decode_budget().clone(),
    }
}

/// The provider's answer: streamed on, or — for an error that may mean "context length
/// exceeded" — read whole first (it is small), so abridge can still retry; or a 200
/// event stream whose start was read to see whether it reports an overflow ([`peek`]).
enum Upstream {
    Streaming(http::Response<hyper::body::Incoming>),
    Buffered(http::response::Parts, Bytes),
    Peeked(peek::Peeked),
    /// A whole (not streamed) answer read to see whether it calls the recall tool (its
    /// bytes decoded), the usage to record for the forwarded history, and the bytes'
    /// share of the body budget.
    Whole(
        http::response::Parts,
        Bytes,
        Option<relay::Usage>,
        ingress::Held,
    ),
    /// A whole answer not read for recall, and why (see [`recall::read_whole`]): the
    /// request is answered without the tool.
    Unread(&'static str),
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
            Upstream::Peeked(peeked) => peeked.overflow.clone(),
            Upstream::Streaming(_)
            | Upstream::Whole(..)
            | Upstream::Unread(_)
            | Upstream::Recalling(..) => None,
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
/// not an event stream is read whole, within bounds (the recall rounds read it: see
/// [`recall::read_whole`]).
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
    {
        let waiting = Instant::now();
        let read = recall::read_whole(state, response).await;
        exchange.upstream_wait += waiting.elapsed();
        return read;
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

/// What the record stage prices a request's usage with (see [`crate::accounting`]).
#[derive(Debug, Clone, Copy, Default)]
struct Billing {
    price: Option<Price>,
    format: Option<Format>,
    /// abridge's estimates of a compacted request and its history's previous request.
    compacted: Option<(Estimates, Option<accounting::Previous>)>,
}

impl Billing {
    /// A request abridge read: its model's price, its format, and what its decision
    /// estimated.
    fn of(state: &AppState, request: &crate::formats::Request, decision: &Decision) -> Self {
        let report = &decision.report;
        let compacted = report.compacted.then(|| {
            let estimates = Estimates {
                client: report.tokens_before.unwrap_or(0),
                forwarded: report.tokens_after.unwrap_or(0),
            };
            let applied = decision.apply.as_ref().map(|c| c.through);
            let previous = decision
                .previous
                .filter(|_| decision.previous_client_tokens > 0)
                .map(|record| accounting::Previous {
                    tokens: decision.previous_client_tokens,
                    // The provider's count, as the history's appended turns taught.
                    appended: decision.appended * u64::from(record.ratio_permille.max(1)) / 1000,
                    forwarded: (record.applied == applied).then_some(record.tokens),
                    cached: decision.previous_at_ms.is_some_and(|at| {
                        crate::store::now_ms().saturating_sub(at) <= accounting::CACHE_LIFETIME_MS
                    }),
                });
            (estimates, previous)
        });
        Self {
            price: state.prices().of(request.model()),
            format: Some(request.format()),
            compacted,
        }
    }

    /// What the request saved and cost, the provider having reported `usage`.
    fn tally(&self, usage: &relay::Usage) -> accounting::Tally {
        let reported = accounting::reported(usage);
        // Anthropic caches at the client's breakpoints; the forwarded request keeps the
        // client's latest ones, so a cache it read or wrote says the client marks them.
        let writes =
            self.format == Some(Format::Messages) && reported.cached + reported.cache_write > 0;
        let compacted = self
            .compacted
            .map(|(estimates, previous)| accounting::Compacted {
                estimates,
                previous,
                writes_at_breakpoints: writes,
            });
        accounting::request(reported, compacted, self.price)
    }
}

/// relay: the client's response, with abridge's report headers; record when it ends.
fn respond(
    state: &AppState,
    (upstream, watch): (Upstream, Watch),
    report: &Report,
    (followup, billing): (Option<Followup>, Billing),
    exchange: &mut Exchange,
) -> Response {
    let stream = upstream.streams().then(|| state.stats().stream_started());
    if let Some((e, _)) = billing.compacted {
        state
            .stats()
            .estimated_saving(e.client.saturating_sub(e.forwarded));
    }
    let recorder = state.clone();
    let inflight = exchange.inflight.take();
    let held = exchange.held.take();
    let on_done: OnDone = Box::new(move |outcome: Outcome| {
        // A background compaction keeps the body: its share of the budget goes along.
        let followup = followup.map(|mut f| {
            f.held = held;
            f
        });
        record(&recorder, &outcome, followup, &billing);
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
            Upstream::Buffered(..) | Upstream::Whole(..) | Upstream::Unread(_) => false,
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
        Upstream::Whole(head, body, usage, held) => {
            relay::respond_whole(head, (body, held), usage, on_done)
        }
        // Not left to relay: the rounds answer it without the tool (`recall::serve`).
        Upstream::Unread(why) => {
            on_done(Outcome {
                usage: None,
                end: relay::End::UpstreamError,
                usage_unreadable: false,
                stripped_events: 0,
            });
            Error::UpstreamUnreachable(format!("the provider's answer could not be read ({why})"))
                .response_in(Shape::OpenAi)
        }
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

/// record: the outcome in the stats; what the request saved and cost in the totals and,
/// with the usage the provider reported, in the conversation's account (store,
/// anti-thrash, background build).
fn record(state: &AppState, outcome: &Outcome, followup: Option<Followup>, billing: &Billing) {
    account(state, outcome, followup, billing);
    // Counted once the conversation's record is under way: whoever sees the report
    // counted sees the record in flight (`Compactor::settled`).
    state.stats().outcome(outcome, billing.compacted.is_some());
}

/// The usage the provider reported, if any: in the totals and the conversation's account.
fn account(state: &AppState, outcome: &Outcome, followup: Option<Followup>, billing: &Billing) {
    let Some(usage) = outcome.usage else {
        return;
    };
    tracing::debug!(
        prompt_tokens = usage.prompt_tokens,
        completion_tokens = usage.completion_tokens,
        end = ?outcome.end,
        "usage"
    );
    let tally = billing.tally(&usage);
    state.stats().tally(&tally);
    if let Some(followup) = followup {
        let entry = accounting::Entry {
            point: Some(accounting::Point {
                at_ms: crate::store::now_ms(),
                client: tally.client_tokens,
                forwarded: tally.forwarded_tokens,
                applied: followup.applied,
            }),
            format: billing.format.map(Format::as_str),
            verdict: Some(followup.verdict),
            tally,
        };
        state
            .compactor()
            .record(followup, usage.prompt_tokens, entry);
    }
}
