//! Provider compaction APIs for an upstream that lacks them (DESIGN §10): OpenAI's
//! `POST /v1/responses/compact`, Codex's remote compaction v2 (a `/v1/responses`
//! request whose input ends with `{"type": "compaction_trigger"}`), Responses
//! `context_management` ([`context`]; the answer's item put first by [`first`]) and the
//! `compaction` items a client sends back later. Behind OpenAI's or Azure OpenAI's own host they are
//! the provider's and pass untouched ([`serves`]); behind any other server abridge
//! answers them itself — a summary of the history (a model's when the strategy
//! summarises, [`asked`]; else, or when that fails, the `deterministic` digest) in a
//! `compaction` item of its own ([`sealed`]: signed with a key derived from
//! the identity secret, readable by every replica and after a restart) — and expands
//! such an item into its summary before a later request goes on ([`before`]), handing
//! on what it replaced (its archive, [`crate::recall::archive`]) for recall. Which of
//! the two also decides what a Responses WebSocket handshake gets ([`crate::websocket`]).
//!
//! Anthropic's compaction and context editing on `POST /v1/messages` are the
//! [`messages`] wing's, on the same summariser and the same sealing.
//!
//! Calls from the request path: the proxy's `/responses/compact` handler (routed only
//! when serving) calls [`compact`]; the conversation handler calls [`before`] on a
//! parsed Responses or Messages request before it is identified, and wraps the answer
//! to an edited Messages request with its [`messages::After`].

mod answer;
mod asked;
mod compacted;
mod context;
pub mod first;
pub mod messages;
mod rewriting;
pub mod sealed;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use sha2::{Digest, Sha256};

use crate::config::{Config, ProviderCompaction, UpstreamBase};
use crate::error::{Error, Shape};
use crate::formats;
use crate::formats::responses::{self, Parsed};
use crate::identity::IdentityKey;
use crate::recall::Archive;
use crate::state::AppState;

use compacted::Kind;

/// Hosts (and their subdomains) whose Responses API has the compaction APIs itself.
const OWN: &[&str] = &[
    "api.openai.com",
    "openai.azure.com",
    "cognitiveservices.azure.com",
    "services.ai.azure.com",
];

/// The note when a compaction item abridge did not make was dropped.
const FOREIGN: &str = "a compaction item abridge did not make (another provider's, or altered) was dropped: its summary could not be read";

/// Whether abridge serves the Responses compaction APIs for the configured upstream:
/// `provider_apis.responses_compaction`, `auto` meaning all but OpenAI's and Azure
/// OpenAI's own hosts.
pub fn serves(config: &Config) -> bool {
    match config.provider_apis.responses_compaction {
        ProviderCompaction::Native => false,
        ProviderCompaction::Serve => true,
        ProviderCompaction::Auto => !has_them(&config.upstream),
    }
}

fn has_them(base: &UpstreamBase) -> bool {
    let host = base.authority.host().to_ascii_lowercase();
    crate::azure::classic_root(&base.path).is_some()
        || OWN.iter().any(|own| {
            host.strip_suffix(own)
                .is_some_and(|rest| rest.is_empty() || rest.ends_with('.'))
        })
}

/// What the conversation handler does with a parsed request.
pub enum Before {
    /// Goes on as parsed (nothing of the compaction APIs in it, or abridge does not
    /// serve them), with a note for the client.
    Go(Arc<formats::Request>, Option<&'static str>),
    /// Goes on as these bytes, its compaction items expanded (parsed by the caller: they
    /// are a new body), with a note and what the expanded item replaced (its archive,
    /// for recall).
    Expanded(Bytes, Option<&'static str>, Option<Archive>),
    /// Goes on as these bytes, compacted by abridge for the client's
    /// `context_management`; the answer gets the item first ([`first::First::onto`]);
    /// what the item replaced, for recall.
    Compacted(Bytes, Option<&'static str>, first::First, Option<Archive>),
    /// Goes on as these bytes (a Messages request whose context abridge edited or
    /// compacted, parsed by the caller), with a note; its answer is to be wrapped with
    /// the [`messages::After`]; what a compaction block it expanded or made replaced,
    /// for recall.
    Edited(
        Bytes,
        Option<&'static str>,
        messages::After,
        Option<Archive>,
    ),
    /// Goes on as parsed, its `context_management` withheld (a Messages request whose
    /// edits changed no message: served by abridge, not forwarded, not parsed again),
    /// with a note; its answer is to be wrapped with the [`messages::After`].
    Withheld(Arc<formats::Request>, Option<&'static str>, messages::After),
    /// abridge answered it (a compaction trigger, or its refusal).
    Answer(Response),
}

/// A parsed `/v1/responses` request, before it is identified: as it is, unless abridge
/// serves the compaction APIs and it carries their items (a byte search tells cheaply);
/// the work runs off the async workers, as the parse did. A Messages request: the
/// [`messages`] wing's.
pub async fn before(
    state: &AppState,
    request: Arc<formats::Request>,
    at: (&http::HeaderMap, &http::Uri),
) -> Before {
    let formats::Request::Responses(responses) = &*request else {
        return messages::before(state, request, at).await;
    };
    let body = responses.body();
    let carries = |needle: &[u8]| memchr::memmem::find(body, needle).is_some();
    if !serves(state.config()) || !(carries(b"\"compaction") || carries(b"\"context_management\""))
    {
        return Before::Go(request, None);
    }
    let parsed = responses.parsed();
    if on_provider(parsed) {
        return Before::Go(request, None);
    }
    let key = state.identity_key().await;
    let role = state.config().strategies.summary_role;
    let permit = state.cpu().permit_for(body.len()).await;
    let planned = state
        .cpu()
        .run_with(&permit, || plan(key.as_deref(), (body, parsed), role));
    drop(permit);
    let outcome = match planned {
        Planned::Done(outcome) => outcome,
        Planned::Make(plan) => {
            // A summary is asked only here, for a compaction that is made with it.
            let summaries = (plan.kinds.as_slice(), plan.opened.as_slice());
            let model = asked::for_compaction(state, at, (body.len(), parsed), summaries).await;
            let permit = state.cpu().permit_for(body.len()).await;
            state
                .cpu()
                .run_with(&permit, || plan.make((body, parsed), role, &model))
        }
    };
    match outcome {
        None => Before::Go(request, None),
        Some(Outcome::Answer(response)) => Before::Answer(response),
        Some(Outcome::Expanded(expanded, note, archive)) => {
            Before::Expanded(expanded, note, archive)
        }
        Some(Outcome::Compacted(body, note, first, archive)) => {
            Before::Compacted(body, note, first, archive)
        }
        Some(Outcome::Untouched(note)) => Before::Go(request, Some(note)),
    }
}

enum Outcome {
    Answer(Response),
    Expanded(Bytes, Option<&'static str>, Option<Archive>),
    Compacted(Bytes, Option<&'static str>, first::First, Option<Archive>),
    Untouched(&'static str),
}

/// State on the provider (`previous_response_id`, `conversation`): nothing to summarise
/// here; left to the provider as before.
fn on_provider(parsed: &Parsed<'_>) -> bool {
    let present = |v: Option<crate::json::Raw<'_>>| v.is_some_and(|v| v.get() != "null");
    present(parsed.fields.previous_response_id) || present(parsed.fields.conversation)
}

/// What a request that carries the compaction APIs comes to, planned once before any
/// summary is asked: decided outright, or a compaction to make (and only then a model
/// asked for its summary, so a summary asked is a summary used).
enum Planned<'a, 'k> {
    /// No compaction made (`None`: the request goes on as parsed).
    Done(Option<Outcome>),
    Make(Plan<'a, 'k>),
}

/// A compaction abridge makes for a request: what its input holds, and why it is made.
struct Plan<'a, 'k> {
    key: &'k IdentityKey,
    kinds: Vec<Kind<'a>>,
    opened: Vec<Option<sealed::Summary>>,
    /// A compaction item abridge did not make was dropped.
    foreign: bool,
    why: Why,
}

enum Why {
    /// Codex's `compaction_trigger`: answered with the item.
    Trigger,
    /// `context_management` over its threshold (by the estimate of the body as it would
    /// otherwise go on): the input compacted, the item first in the answer.
    OverThreshold,
}

fn plan<'a, 'k>(
    key: Option<&'k IdentityKey>,
    (body, parsed): (&Bytes, &Parsed<'a>),
    role: crate::strategies::SummaryRole,
) -> Planned<'a, 'k> {
    let kinds = compacted::kinds(&parsed.items);
    let trigger = kinds.iter().position(|k| *k == Kind::Trigger);
    if trigger.is_some_and(|at| at + 1 != kinds.len()) {
        let error = Error::InvalidValue {
            message: "compaction_trigger must be the last item of input",
            param: "input",
        };
        return Planned::Done(Some(Outcome::Answer(error.response_in(Shape::OpenAi))));
    }
    let compactions = kinds.iter().any(|k| matches!(k, Kind::Compaction(_)));
    let managed = match context::asked(parsed) {
        Ok(managed) => managed.filter(|_| trigger.is_none()),
        Err(error) => {
            return Planned::Done(Some(Outcome::Answer(error.response_in(Shape::OpenAi))));
        }
    };
    if trigger.is_none() && !compactions && managed.is_none() {
        return Planned::Done(None);
    }
    let Some(key) = key else {
        return Planned::Done(Some(Outcome::Untouched(
            "compaction: abridge's identity secret is not available (store unreachable); forwarded untouched",
        )));
    };
    let opened = compacted::opened(key, &kinds);
    let foreign = compacted::any_foreign(&kinds, &opened);
    let note = foreign.then_some(FOREIGN);
    let why = match managed {
        _ if trigger.is_some() => Why::Trigger,
        Some(threshold) => {
            let summaries = (kinds.as_slice(), opened.as_slice());
            match context::weigh((body, parsed), summaries, threshold, role) {
                Some(context::Weighed::Over) => Why::OverThreshold,
                Some(context::Weighed::Under(plain, archive)) => {
                    return Planned::Done(Some(Outcome::Expanded(plain, note, archive)));
                }
                None => return Planned::Done(None),
            }
        }
        None => {
            let expanded = compacted::expand(&parsed.items, &kinds, &opened, role);
            let body = responses::with_input(body, parsed, &expanded.forwarded());
            let archive = expanded.archive;
            return Planned::Done(body.map(|body| Outcome::Expanded(body, note, archive)));
        }
    };
    Planned::Make(Plan {
        key,
        kinds,
        opened,
        foreign,
        why,
    })
}

impl Plan<'_, '_> {
    /// The compaction made, with the model's summary when it said one, and what the
    /// request comes to with it.
    fn make(
        &self,
        (body, parsed): (&Bytes, &Parsed<'_>),
        role: crate::strategies::SummaryRole,
        model: &asked::Model,
    ) -> Option<Outcome> {
        let note = self.foreign.then_some(FOREIGN).or(model.note());
        let summaries = (self.kinds.as_slice(), self.opened.as_slice());
        let made = make(self.key, parsed, summaries, model);
        match self.why {
            Why::Trigger => {
                let stream = parsed.fields.stream == Some(true);
                let name = parsed.fields.model.as_deref().unwrap_or_default();
                Some(Outcome::Answer(triggered(&made, name, stream, note)))
            }
            Why::OverThreshold => context::compacted((body, parsed), summaries, (made, role), note),
        }
    }
}

/// A compaction made: its item and its id.
struct Made {
    id: String,
    item: serde_json::Value,
    created_at: u64,
    summary: sealed::Summary,
}

/// The compaction of `parsed`'s input: its summary (the model's, when it said one; else
/// the digest) sealed into a `compaction` item.
fn make(
    key: &IdentityKey,
    parsed: &Parsed<'_>,
    (kinds, opened): (&[Kind<'_>], &[Option<sealed::Summary>]),
    model: &asked::Model,
) -> Made {
    let created_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut summary = match model.said() {
        Some(said) => compacted::said(said, kinds, opened, created_at),
        None => compacted::summarise(&parsed.items, kinds, opened, created_at),
    };
    summary.archive = compacted::archive(&parsed.items, kinds, opened);
    let token = sealed::seal(key, &summary);
    let id = format!(
        "cmp_{}",
        &hex::encode(Sha256::digest(token.as_bytes()))[..32]
    );
    let item = answer::item(&id, &token);
    Made {
        id,
        item,
        created_at,
        summary,
    }
}

/// Codex's remote compaction v2 answered: one `compaction` output item, whole or
/// streamed.
fn triggered(made: &Made, model: &str, stream: bool, note: Option<&str>) -> Response {
    let shape = answer::Made {
        id: &made.id,
        created_at: made.created_at,
        model,
    };
    let (body, kind) = match stream {
        true => (answer::stream(&shape, &made.item), "text/event-stream"),
        false => {
            let response = answer::response(&shape, "completed", vec![made.item.clone()]);
            (Bytes::from(response.to_string()), "application/json")
        }
    };
    respond(body, kind, note)
}

/// An answer abridge made itself, with the headers that say so.
pub(crate) fn respond(body: Bytes, kind: &'static str, note: Option<&str>) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    headers.insert(
        "x-abridge-compaction",
        HeaderValue::from_static("served by abridge"),
    );
    if let Some(note) = note.and_then(|n| HeaderValue::from_str(n).ok()) {
        headers.insert("x-abridge-note", note);
    }
    response
}

/// `POST /v1/responses/compact` (and Azure's v1 spelling), when abridge serves it:
/// the user messages of the input (the newest within a budget) and one `compaction`
/// item, as OpenAI answers it. Nothing is forwarded. abridge's errors are the caller's
/// to shape (OpenAI's).
pub async fn compact(state: &AppState, request: Request) -> Result<Response, Error> {
    let (parts, body) = request.into_parts();
    let (body, _held) = state.read_body(body, &parts.headers).await?;
    let parsed = responses::parse(&body).map_err(|e| Error::ClientBody(e.to_string()))?;
    let key = state.identity_key().await.ok_or_else(|| {
        Error::Internal("the identity secret is not available (store unreachable)".into())
    })?;
    let at = (&parts.headers, &parts.uri);
    let kinds = compacted::kinds(&parsed.items);
    let opened = compacted::opened(&key, &kinds);
    let summaries = (kinds.as_slice(), opened.as_slice());
    let model = asked::for_compaction(state, at, (body.len(), &parsed), summaries).await;
    let note = compacted::any_foreign(&kinds, &opened)
        .then_some(FOREIGN)
        .or(model.note());
    // The digest and the archive run off the async workers, as a request's plan does.
    let permit = state.cpu().permit_for(body.len()).await;
    let made = state
        .cpu()
        .run_with(&permit, || make(&key, &parsed, (&kinds, &opened), &model));
    drop(permit);
    let kept = compacted::kept_users(&parsed.items, &kinds, compacted::KEPT_USER_TOKENS);
    let mut output: Vec<serde_json::Value> = kept
        .iter()
        .filter_map(|raw| serde_json::from_str(raw.get()).ok())
        .collect();
    output.push(made.item.clone());
    let model = parsed.fields.model.as_deref().unwrap_or_default();
    let shape = answer::Made {
        id: &made.id,
        created_at: made.created_at,
        model,
    };
    let body = Bytes::from(answer::compacted(&shape, output).to_string());
    Ok(respond(body, "application/json", note))
}

#[cfg(test)]
mod tests;
