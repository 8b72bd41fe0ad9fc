//! The summary a compaction item (Responses) or block (Messages) carries, asked of a
//! model when `compaction.strategy` summarises (`structured`, `llm_replace`): the
//! summary model (`summary.model`, else the request's own), through the summariser
//! every strategy uses, in the API of the route's upstream, with the client's own
//! credentials (so the client pays for its own summary, as for the request). The
//! transcript (labelled `[USER]` / `[ASSISTANT]` / `[TOOL CALL]` / `[TOOL RESULT]`,
//! long bodies cut to their start and end, the newest kept within a bound, secrets
//! redacted) goes in a fence it cannot close, after the previous compaction's summary
//! when there is one. Any failure — or a separate summary provider, whose key no tenant
//! budget guards before identification — leaves the `deterministic` digest in its
//! place, and the client is told ([`DIGEST`]).

use std::fmt::Write as _;

use http::{HeaderMap, Uri};
use sha2::{Digest, Sha256};

use super::compacted::{self, Kind};
use super::sealed::Summary;
use crate::azure::Deployment;
use crate::conversation::{Item, Role};
use crate::formats::Format;
use crate::formats::responses::Parsed;
use crate::headers::{Credentials, Provider};
use crate::prices::Tokens;
use crate::state::AppState;
use crate::strategies::redact::redact;
use crate::strategies::{SummaryRequest, structured};

/// Characters of one item's body in the transcript (its start and end kept).
const ITEM_CHARS: usize = 4000;
/// Characters of the whole transcript (the newest items kept).
const TRANSCRIPT_CHARS: usize = 120_000;
/// Characters of the model's summary kept (and of a previous one quoted).
pub(super) const SUMMARY_CHARS: usize = 16_000;
/// Characters of a client's summary instructions asked of the model.
const INSTRUCTIONS_CHARS: usize = 16_000;

/// The note when the digest stood in for the model's summary.
pub(super) const DIGEST: &str = "compaction: the summary model could not be used (it failed, timed out, or summaries go to a separate provider); abridge's deterministic digest summarises instead";

/// What the model said for a compaction made now.
pub(super) enum Model {
    /// Not asked: the strategy does not summarise.
    NotAsked,
    /// Asked, and no summary came: the digest stands in (with [`DIGEST`]).
    Failed,
    Said(String),
}

impl Model {
    /// What the model said, if anything.
    pub(super) fn said(&self) -> Option<&str> {
        match self {
            Model::Said(text) => Some(text),
            _ => None,
        }
    }

    /// The note the client gets about the summary.
    pub(super) fn note(&self) -> Option<&'static str> {
        matches!(self, Model::Failed).then_some(DIGEST)
    }
}

/// The model's summary for a compaction made now of `parsed`'s input (`kinds` and
/// what their compaction items carry, `opened`, as the plan read them) — a trailing
/// `compaction_trigger`, a `/responses/compact` call, or `context_management` over its
/// threshold — when the strategy summarises. Called only for a compaction that is made:
/// what it says is used.
pub(super) async fn for_compaction(
    state: &AppState,
    at: (&HeaderMap, &Uri),
    (size, parsed): (usize, &Parsed<'_>),
    (kinds, opened): (&[Kind<'_>], &[Option<Summary>]),
) -> Model {
    let config = state.config();
    if !config.compaction.strategy.summarises() {
        return Model::NotAsked;
    }
    let max_tokens = config.strategies.summary_max_tokens;
    let permit = state.cpu().permit_for(size).await;
    let request = state.cpu().run_with(&permit, || {
        request(&parsed.items, (kinds, opened), max_tokens)
    });
    drop(permit);
    let model = parsed.fields.model.as_deref().unwrap_or_default();
    let on = (Provider::Main, Format::Responses);
    match ask(state, at, on, model, &request).await {
        Some(said) => Model::Said(said.text),
        None => Model::Failed,
    }
}

/// The request for a summary of `items` (their conversation items since the latest
/// earlier compaction, [`compacted::summarised`]), after that compaction's summary.
pub(super) fn request(
    items: &[Item<'_>],
    (kinds, opened): (&[Kind<'_>], &[Option<Summary>]),
    max_tokens: u32,
) -> SummaryRequest {
    let prior = opened.iter().rev().flatten().next();
    let items = compacted::summarised(items, kinds, opened);
    transcript_request(items, (prior, None), max_tokens)
}

/// The request for a summary of `items` (oldest first; the newest kept within a bound),
/// after `prior`'s summary. The client's `instructions` (bounded), when it gave them,
/// are what is asked of the transcript in place of abridge's own handoff sections — as
/// Anthropic's compaction `instructions` replace its default prompt.
pub(super) fn transcript_request<'i, 'a: 'i>(
    items: impl DoubleEndedIterator<Item = &'i Item<'a>>,
    (prior, instructions): (Option<&Summary>, Option<&str>),
    max_tokens: u32,
) -> SummaryRequest {
    let mut blocks: Vec<String> = Vec::new();
    let mut chars = 0;
    for item in items.rev() {
        let block = block(item);
        chars += block.len();
        if chars > TRANSCRIPT_CHARS && !blocks.is_empty() {
            break;
        }
        blocks.push(block);
    }
    blocks.reverse();
    let transcript = redact(&blocks.concat()).into_owned();
    let fence = hex::encode(&Sha256::digest(transcript.as_bytes())[..8]);
    let mut prompt = String::with_capacity(transcript.len() + 2048);
    if let Some(prior) = prior {
        let earlier: String = prior.summary.chars().take(SUMMARY_CHARS).collect();
        let _ = write!(
            prompt,
            "The conversation continues an earlier part, summarised before as (PREVIOUS \
             SUMMARY):\n<previous-summary-{fence}>\n{}\n</previous-summary-{fence}>\n\n",
            redact(&earlier)
        );
    }
    let words = (u64::from(max_tokens) * 3 / 4 / 10 * 10).max(10);
    let _ = write!(
        prompt,
        "Summarise the transcript below: a conversation between a user and an AI agent \
         ({} items). Your summary replaces them in the agent's context; the agent carries \
         on from it. The transcript is everything between the two tags marked {fence}.\n\n\
         <transcript-{fence}>\n{transcript}</transcript-{fence}>\n\n",
        blocks.len()
    );
    match instructions.filter(|i| !i.trim().is_empty()) {
        Some(asked) => {
            let asked: String = asked.chars().take(INSTRUCTIONS_CHARS).collect();
            let _ = write!(prompt, "{asked}\n\nWrite at most about {words} words.");
        }
        None => {
            let _ = write!(
                prompt,
                "Write one handoff summary with these sections as Markdown headings: Goal; \
                 Constraints & Preferences; Progress; Key Decisions; Relevant Files; Next \
                 Steps; Critical Context. Keep file paths, commands, IDs, URLs, numbers and \
                 error messages exactly as written, and make the user's latest request and \
                 its status clear. Write at most about {words} words."
            );
        }
    }
    SummaryRequest {
        system: structured::SYSTEM.to_owned(),
        prompt,
        max_tokens,
        // A transcript of its own: the provider APIs answer before the conversation is
        // identified, so no forwarded request is there to ride the cache of.
        in_context: None,
    }
}

/// One item as the transcript shows it.
fn block(item: &Item<'_>) -> String {
    let label = match (item.role, item.results.first()) {
        (_, Some(id)) => format!("[TOOL RESULT {id}]"),
        (Role::User, None) => "[USER]".to_owned(),
        (Role::System | Role::Developer, None) => "[INSTRUCTIONS]".to_owned(),
        _ => "[ASSISTANT]".to_owned(),
    };
    let mut out = format!("{label} {}\n", cut(&item.content.text_lossy()));
    for call in &item.calls {
        let _ = writeln!(out, "[TOOL CALL {}] {}", call.name, cut(&call.arguments));
    }
    out
}

/// `text` within [`ITEM_CHARS`]: its start and end.
fn cut(text: &str) -> String {
    let count = text.chars().count();
    if count <= ITEM_CHARS {
        return text.trim().to_owned();
    }
    let head: String = text.chars().take(ITEM_CHARS * 3 / 4).collect();
    let tail: String = text.chars().skip(count - ITEM_CHARS / 4).collect();
    format!(
        "{head}\n[… {} characters cut …]\n{tail}",
        count - ITEM_CHARS
    )
}

/// A model's summary, and what its call spent as its provider reported it.
pub(super) struct Summarised {
    pub text: String,
    pub spent: Option<Tokens>,
}

/// The model's summary for a compaction made now on the Messages route (`request`, of
/// [`transcript_request`]), in the Messages API on that route's upstream with the
/// client's credentials; `None` when it could not be had (the digest then stands in,
/// with [`DIGEST`]).
pub(super) async fn for_messages(
    state: &AppState,
    at: (&HeaderMap, &Uri),
    model: &str,
    request: &SummaryRequest,
) -> Option<Summarised> {
    ask(
        state,
        at,
        (Provider::Anthropic, Format::Messages),
        model,
        request,
    )
    .await
}

/// The model's summary of what `request` quotes, asked of `provider` in `format`'s API,
/// or `None` (the digest then stands in).
async fn ask(
    state: &AppState,
    (headers, uri): (&HeaderMap, &Uri),
    (provider, format): (Provider, Format),
    model: &str,
    request: &SummaryRequest,
) -> Option<Summarised> {
    let summariser = state.compactor().summariser();
    if !summariser.uses_client_credentials() {
        return None;
    }
    let tenants = state.config().identity.tenant_headers.iter().map(|h| &h.0);
    let credentials = Credentials::from_headers(headers, tenants);
    let deployment = Deployment::of(uri.path(), uri.query());
    let to = (&credentials, provider, format, deployment.as_ref());
    match summariser.summarise(to, model, request).await {
        Ok(answer) if !answer.text.trim().is_empty() => Some(Summarised {
            text: answer.text.trim().chars().take(SUMMARY_CHARS).collect(),
            spent: answer.spent,
        }),
        Ok(_) => None,
        Err(failure) => {
            tracing::warn!(error = %failure, "compaction item's summary failed; the digest is used");
            None
        }
    }
}
