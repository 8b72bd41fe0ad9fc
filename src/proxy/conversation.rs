//! The conversation routes — `POST /v1/chat/completions`, `POST /v1/responses` and
//! `POST /v1/messages`, and Azure's spellings of the first two (see [`crate::azure`]) —
//! one handler whatever the wire format: ingress → prepare (parse, identify, load) → plan →
//! rewrite → forward (→ retry without what abridge added, if the provider refused it →
//! compact-and-retry, if it said the prompt is too long) → relay → record.
//!
//! Where abridge serves the provider compaction APIs ([`crate::provider_apis`]), a
//! Responses or Messages body is first handed to them: answered there (Codex's
//! compaction trigger, a Messages compaction paused), edited (`compaction` items
//! expanded into their summaries, Anthropic's context edits applied) or compacted for
//! its `context_management` (the answer then gets abridge's item first) before it is
//! prepared; the answer to an edited Messages request is given what Anthropic's carries.
//!
//! A request whose state lives on the provider (a Responses `previous_response_id`, …)
//! or that asks for the provider's own compaction is forwarded untouched whatever the
//! headers say, and the client is told why. abridge's own errors answer in the route's
//! provider's shape.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Uri, Version, header};

use crate::azure::Deployment;
use crate::compactor::{Decision, Followup, Reason, Turn};
use crate::config::CompactionMode;
use crate::controls::{Compact, Controls, Report};
use crate::error::{Error, Shape};
use crate::formats::{Format, Request as Conversation};
use crate::headers::{self, Credentials};
use crate::prepare::{Prepared, parse, prepare_parsed};
use crate::provider_apis::messages::After;
use crate::provider_apis::{self, Before};
use crate::recall::Archive;
use crate::relay::Watch;
use crate::state::AppState;
use crate::stats::Route;
use crate::store::Checkpoint;

use super::{Billing, Exchange, Upstream, first_answer, recall, respond, send};

/// `POST /v1/chat/completions`: see the module docs.
pub async fn chat(State(state): State<AppState>, request: Request) -> Response {
    conversation(&state, request, Format::Chat, Route::Chat).await
}

/// `POST /v1/responses`: see the module docs.
pub async fn responses(State(state): State<AppState>, request: Request) -> Response {
    conversation(&state, request, Format::Responses, Route::Responses).await
}

/// `POST /v1/messages` (Anthropic): see the module docs.
pub async fn messages(State(state): State<AppState>, request: Request) -> Response {
    conversation(&state, request, Format::Messages, Route::Messages).await
}

/// `POST /v1/responses/compact`, routed only where abridge serves OpenAI's compaction
/// APIs: answered by [`crate::provider_apis::compact`], nothing forwarded.
pub async fn compact(State(state): State<AppState>, request: Request) -> Response {
    let exchange = Exchange::start(&state);
    let response = provider_apis::compact(&state, request)
        .await
        .unwrap_or_else(|e| e.response_in(Shape::OpenAi));
    exchange.finish(&state, Route::Responses, &response);
    response
}

async fn conversation(
    state: &AppState,
    request: Request,
    format: Format,
    route: Route,
) -> Response {
    let mut exchange = Exchange::start(state);
    let shape = match format {
        Format::Messages => Shape::Anthropic,
        Format::Chat | Format::Responses => Shape::OpenAi,
    };
    let mut response = stages(state, request, format, &mut exchange)
        .await
        .unwrap_or_else(|e| e.response_in(shape));
    if let Some(first) = exchange.first.take() {
        response = first.onto(response).await;
    }
    exchange.finish(state, route, &response);
    response
}

async fn stages(
    state: &AppState,
    request: Request,
    format: Format,
    exchange: &mut Exchange,
) -> Result<Response, Error> {
    let (mut parts, body) = request.into_parts();
    let controls = Controls::from_headers(&parts.headers, state.config().compaction.allowed())?;
    prepare_headers(state, &mut parts, format);
    // Where it goes, by whose API it speaks, as the provider will see its headers.
    let (target, provider) = state
        .upstream()
        .route(&parts.method, &parts.uri, &parts.headers)?;

    // ingress → parse, and the provider compaction APIs abridge serves.
    let (
        request,
        Served {
            note: served,
            after,
            archive,
        },
    ) = match read(state, &parts, body, format, exchange).await? {
        Read::Parsed(request, served) => (request, served),
        Read::Answer(response) => return Ok(response),
        Read::Unparsed(body, note) => {
            let note = with(note, "request body not understood: forwarded untouched");
            return untouched(state, (&parts, &target), body, &note, exchange).await;
        }
    };
    // The credentials as the provider will see them (hop-by-hop headers gone).
    let credentials = Credentials::from_headers(
        &parts.headers,
        state.config().identity.tenant_headers.iter().map(|h| &h.0),
    );

    // prepare: identify, load; a request left to the provider goes untouched.
    let deployment = Deployment::of(parts.uri.path(), parts.uri.query());
    let prepared = prepare_parsed(
        state,
        Reason::Request,
        (controls, credentials),
        (request, archive),
        (deployment, provider),
    )
    .await;
    if let Some(note) = prepared.request.untouchable() {
        let body = prepared.request.body().clone();
        let note = with(served, note);
        let answer = untouched(state, (&parts, &target), body, &note, exchange).await;
        return answer.map(|a| answered(after, a));
    }
    let turn = prepared.turn();
    ask_window(state, &turn);

    // plan → rewrite → forward, with its retries.
    let mut decision = state.compactor().plan(&turn, Reason::Request).await;
    if let Some(note) = served {
        decision.report.add_note(note);
    }
    let (mut upstream, watch, recalling) = forward(
        state,
        &turn,
        &prepared,
        (&parts, &target),
        &mut decision,
        exchange,
    )
    .await?;
    if let Some(sent) = recalling {
        let at = (&parts, &target, sent);
        upstream = recall::serve(state, &prepared, at, &mut decision, upstream, exchange).await;
    }

    let answer = relay(state, &prepared, (upstream, watch), decision, exchange);
    Ok(answered(after, answer))
}

/// The answer, given what the provider APIs abridge served say it carries.
fn answered(after: Option<After>, answer: Response) -> Response {
    match after {
        Some(after) => after.wrap(answer),
        None => answer,
    }
}

/// relay → record: the provider's answer to the client, with what abridge did and every
/// note of the request's, and what the record stage needs once the body has gone.
fn relay(
    state: &AppState,
    prepared: &Prepared,
    (upstream, watch): (Upstream, Watch),
    mut decision: Decision,
    exchange: &mut Exchange,
) -> Response {
    for note in prepared
        .controls
        .ignored
        .iter()
        .copied()
        .chain(prepared.note)
    {
        decision.report.add_note(note);
    }
    exchange.payer = prepared.identified.as_ref().map(|i| i.payer);
    let followup = followup(prepared, &decision);
    let billing = Billing::of(state, &prepared.request, &decision);
    respond(
        state,
        (upstream, watch),
        &decision.report,
        (followup, billing),
        exchange,
    )
}

/// What the read stages make of a body.
enum Read {
    Parsed(Arc<Conversation>, Served),
    /// Not understood: forwarded untouched.
    Unparsed(Bytes, Option<&'static str>),
    /// Answered by abridge (see [`crate::provider_apis`]).
    Answer(Response),
}

/// What the provider compaction APIs abridge served leave to the later stages: a note
/// for the client, what the answer is to be given (a Messages request's), and what a
/// compaction item or block the request carried replaced (its archive, for recall).
struct Served {
    note: Option<&'static str>,
    after: Option<After>,
    archive: Option<Archive>,
}

impl Served {
    fn of(note: Option<&'static str>, after: Option<After>, archive: Option<Archive>) -> Self {
        Self {
            note,
            after,
            archive,
        }
    }
}

/// ingress: the one body abridge reads whole, bounded; parse (once); then the provider
/// compaction APIs abridge serves, which answer it here, expand their items or edit its
/// messages (a new body, parsed once in turn), or only withhold a Messages
/// `context_management` (the parse goes on).
async fn read(
    state: &AppState,
    parts: &Parts,
    body: axum::body::Body,
    format: Format,
    exchange: &mut Exchange,
) -> Result<Read, Error> {
    let (body, held) = state.read_body(body, &parts.headers).await?;
    exchange.held = Some(held);
    let parsed = |body| parse(state, Reason::Request, format, body);
    let request = match parsed(body).await {
        Ok(request) => request,
        Err((body, reason)) => {
            tracing::debug!(%reason, "forwarding a body abridge does not understand untouched");
            return Ok(Read::Unparsed(body, None));
        }
    };
    let at = (&parts.headers, &parts.uri);
    let (body, served) = match provider_apis::before(state, request, at).await {
        Before::Go(request, note) => {
            return Ok(Read::Parsed(request, Served::of(note, None, None)));
        }
        Before::Answer(response) => return Ok(Read::Answer(response)),
        Before::Withheld(request, note, after) => {
            return Ok(Read::Parsed(request, Served::of(note, Some(after), None)));
        }
        Before::Expanded(body, note, archive) => (body, Served::of(note, None, archive)),
        Before::Edited(body, note, after, archive) => {
            (body, Served::of(note, Some(after), archive))
        }
        Before::Compacted(body, note, first, archive) => {
            exchange.first = Some(first);
            (body, Served::of(note, None, archive))
        }
    };
    // A new body: parsed once in turn.
    Ok(match parsed(body).await {
        Ok(request) => Read::Parsed(request, served),
        Err((body, _)) => Read::Unparsed(body, served.note),
    })
}

/// `note` after what the provider compaction APIs said, if anything.
fn with(served: Option<&str>, note: &str) -> String {
    served.map_or_else(|| note.to_owned(), |served| format!("{served}; {note}"))
}

/// For a model whose window abridge does not know, asks its server in the background
/// (see [`crate::ask`]); what it says applies from a later request on.
pub(super) fn ask_window(state: &AppState, turn: &Turn<'_, '_>) {
    let Some(tenant) = turn.payer else { return };
    if state.config().compaction.mode == CompactionMode::Off
        || !state
            .compactor()
            .should_ask(turn.provider, turn.model, tenant)
    {
        return;
    }
    let (upstream, compactor) = (state.upstream().clone(), state.compactor().clone());
    let (provider, model) = (turn.provider, turn.model.to_owned());
    let credentials = turn
        .credentials
        .for_provider(provider, state.upstream().is_azure());
    tokio::spawn(async move {
        if let Some(window) = crate::ask::ask(&upstream, provider, &model, &credentials).await {
            compactor.asked(provider, &model, window);
        }
    });
}

/// A body abridge does not understand, or must not touch: forwarded untouched, the
/// provider's own answer relayed, and `note` says why.
async fn untouched(
    state: &AppState,
    (parts, target): (&Parts, &Uri),
    body: Bytes,
    note: &str,
    exchange: &mut Exchange,
) -> Result<Response, Error> {
    let report = Report {
        note: Some(note.to_owned()),
        ..Report::default()
    };
    let response = send(state, parts, target, body, exchange).await?;
    Ok(respond(
        state,
        (Upstream::Streaming(response), Watch::Usage { strip: false }),
        &report,
        (None, Billing::default()),
        exchange,
    ))
}

/// forward: the rewritten body; when the provider refuses what abridge added, once more
/// with the client's own fields; when it says the prompt is too long, compacted harder
/// and once more. With the recall tool added (and kept), also the body sent.
async fn forward(
    state: &AppState,
    turn: &Turn<'_, '_>,
    prepared: &Prepared,
    (parts, target): (&Parts, &Uri),
    decision: &mut Decision,
    exchange: &mut Exchange,
) -> Result<(Upstream, Watch, Option<Bytes>), Error> {
    let request = &*prepared.request;
    let mut recalling = recall::wanted(prepared, decision);
    let tool = recall::tool(prepared, recalling);
    let (outgoing, mut watch) = rewrite(state, request, decision.apply.as_ref(), tool.as_deref());
    let mut sent = outgoing.clone();
    // An error body is read before it is passed on only when a retry could follow:
    // compaction may act, or abridge added a field the provider may refuse.
    let may_compact = prepared.controls.compact != Compact::Off
        && state.config().compaction.mode == CompactionMode::On;
    let added = watch.strips();
    let reads = (may_compact || added || recalling, recalling);
    let mut upstream = first_answer(state, parts, target, outgoing, reads, exchange).await?;
    if recalling && recall::refused(prepared, &upstream) {
        recalling = false;
        let (outgoing, plain) = rewrite(state, request, decision.apply.as_ref(), None);
        let reads = (may_compact || added, false);
        upstream = first_answer(state, parts, target, outgoing, reads, exchange).await?;
        watch = plain;
        // Refused for the tool only when the request without it is not refused too;
        // remembered for this tenant only (one tenant never turns recall off for another).
        if !recall::refused(prepared, &upstream) {
            recall::remember_refusal(state, prepared, &mut decision.report);
        }
    }
    if added && refused_addition(&upstream) {
        state.refuse_usage_option();
        let tool = recall::tool(prepared, recalling);
        let (outgoing, plain) = rewrite(state, request, decision.apply.as_ref(), tool.as_deref());
        sent = outgoing.clone();
        let reads = (may_compact || recalling, recalling);
        upstream = first_answer(state, parts, target, outgoing, reads, exchange).await?;
        watch = plain;
        decision.report.add_note(
            "the provider refused stream_options, which abridge adds to read usage: retried with the client's own fields; streaming usage is not read from this provider",
        );
    }
    // Boxed: a retry holds a second plan and send, which only an overflow needs.
    let overflow = upstream.overflow();
    if let Some(overflow) = &overflow {
        // Learned for the tenant's later requests of this model, whatever this one does.
        let body = prepared.request.body();
        state
            .compactor()
            .overflowed(turn, overflow, decision.estimate, body);
    }
    if may_compact && overflow.is_some() {
        // The retry goes without the tool: its answer is relayed as it comes.
        recalling = false;
        upstream = Box::pin(overflow_retry(
            state,
            turn,
            (parts, target, request),
            upstream,
            (decision, &mut watch),
            exchange,
        ))
        .await;
    }
    Ok((upstream, watch, recalling.then_some(sent)))
}

/// The request's headers for the upstream: hop-by-hop and `x-abridge-*` removed, an
/// uncompressed response asked for (so usage can be read, see `relay`), no `Expect` (the
/// body is already here, whole), and on the Messages route no beta value of what abridge
/// serves there ([`provider_apis::messages::upstream_betas`]).
fn prepare_headers(state: &AppState, parts: &mut Parts, format: Format) {
    headers::strip_request(&mut parts.headers);
    if format == Format::Messages {
        provider_apis::messages::upstream_betas(state.config(), &mut parts.headers);
    }
    parts.headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    parts.headers.remove(header::EXPECT);
    parts.version = Version::HTTP_11;
}

/// rewrite: the body to send — the original bytes unless a checkpoint is applied or
/// usage must be asked for — and what the relay must watch for.
pub(super) fn rewrite(
    state: &AppState,
    request: &Conversation,
    apply: Option<&Checkpoint>,
    tool: Option<&str>,
) -> (Bytes, Watch) {
    // Not where the provider is known to refuse the ask (then usage is not read, counted).
    let refused = state.refuses_usage_option();
    if refused && request.wants_usage_ask() {
        state.stats().usage_not_asked();
    }
    let items = apply.map(|c| crate::compactor::forwarded(request.items(), c));
    let outgoing = request.outgoing(items.as_deref(), tool, !refused);
    if outgoing.asked_usage {
        state.stats().usage_requested();
    }
    let watch = Watch::Usage {
        strip: outgoing.asked_usage,
    };
    (outgoing.body, watch)
}

/// compact-and-retry: the provider said the prompt is too long, and nothing has reached
/// the client yet. Compacts harder and sends once more; when that cannot be sent, the
/// provider's own answer is passed on. Called only on an overflow ([`Upstream::overflow`]).
async fn overflow_retry(
    state: &AppState,
    turn: &Turn<'_, '_>,
    (parts, target, request): (&Parts, &Uri, &Conversation),
    upstream: Upstream,
    (decision, watch): (&mut Decision, &mut Watch),
    exchange: &mut Exchange,
) -> Upstream {
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
    let (outgoing, retry_watch) = rewrite(state, request, retry.apply.as_ref(), None);
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

/// What the record stage needs to know about this request (`None`: not identified, or
/// its conversation could not be read). A request the store could not be read for was
/// decided without the checkpoints; its usage, recorded once the store is back, would
/// read as "the checkpoint in force is none" and make the next turn compact afresh,
/// breaking the forwarded prefix the checkpoints kept (seen across a Sentinel failover).
pub(super) fn followup(prepared: &Prepared, decision: &Decision) -> Option<Followup> {
    let identified = prepared.identified.as_ref()?;
    prepared.loaded.as_ref()?;
    Some(Followup {
        held: None,
        payer: identified.payer,
        conversation: identified.conversation,
        messages: u32::try_from(prepared.request.items().len()).unwrap_or(u32::MAX),
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
        beside: decision.beside,
        previous: decision.previous,
        last_seen_ms: decision.last_seen_ms,
        expects: decision.expects,
        verdict: crate::outcome::Verdict {
            compacted: decision.report.compacted,
            ..decision.verdict
        },
        request: Arc::clone(&prepared.request),
        prefixes: identified.hashes.prefixes.clone(),
        credentials: prepared.credentials.clone(),
        deployment: prepared.deployment.clone(),
        provider: prepared.provider,
        recall_tool: prepared.recall_tool.is_some(),
        recall_always: prepared.recall_always(),
    })
}
