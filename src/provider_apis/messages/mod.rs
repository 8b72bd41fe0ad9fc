//! Anthropic's compaction and context editing on `POST /v1/messages`, for a Messages
//! upstream that lacks them (llama-server, vLLM, other Anthropic-compatible servers):
//! `context_management.edits` read and checked as Anthropic checks them ([`edits`]);
//! `clear_thinking_20251015` and `clear_tool_uses_20250919` applied to what is forwarded
//! ([`clear`]); `compact_20260112` over its trigger answered with a `compaction` block
//! of abridge's own (the shared summariser, sealed as the Responses items are) and the
//! upstream's answer to the compacted request ([`compact`]); a `compaction` block sent
//! back expanded into its summary, everything before it dropped; and the answer given
//! what Anthropic's would carry — the block first, `context_management.applied_edits`,
//! `usage.iterations` ([`reply`]). `context_management` itself is not forwarded; when
//! no edit changes a message (Claude Code's `clear_thinking` keeping all, on every
//! request), the request goes on as it was parsed with the field withheld, not parsed
//! again. The client's `anthropic-beta` header loses the beta values of what abridge
//! serves ([`betas`], through [`upstream_betas`]).
//!
//! `POST /v1/messages/count_tokens` counts what `/v1/messages` would forward, with the
//! same expansion and clearing edits (no compaction: counting makes no summary), and
//! answers `context_management.original_input_tokens` ([`count`]).
//!
//! Behind Anthropic's own host the request passes untouched ([`serves`]). The
//! conversation handler calls [`before`] (through the wing's `before`) on a parsed
//! Messages request, and wraps the relayed answer with the [`After`] it returns; the
//! count handler calls [`count::body`].

mod betas;
mod clear;
mod compact;
pub mod count;
mod edits;
mod reply;

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use serde_json::value::RawValue;

use super::Before;
use crate::config::{Config, ProviderCompaction};
use crate::conversation::{Content, Item, Part, Role};
use crate::formats::messages::{self as wire, Parsed};
use crate::formats::{self, splice};
use crate::identity::IdentityKey;
use crate::json::Raw;
use crate::provider_apis::{asked, sealed};
use crate::recall::Archive;
use crate::state::AppState;
use crate::strategies::SummaryRole;
use crate::tokens::approx_text;

use edits::{Edits, Trigger};
pub use reply::After;

/// Hosts (and their subdomains) whose Messages API has these itself.
const OWN: &[&str] = &["api.anthropic.com"];

/// Whether abridge serves them for the Messages route's upstream
/// (`anthropic_upstream` when set, else `upstream`): `provider_apis.messages_compaction`,
/// `auto` meaning all but Anthropic's own host.
pub fn serves(config: &Config) -> bool {
    match config.provider_apis.messages_compaction {
        ProviderCompaction::Native => false,
        ProviderCompaction::Serve => true,
        ProviderCompaction::Auto => {
            let base = config
                .anthropic_upstream
                .as_ref()
                .unwrap_or(&config.upstream);
            let host = base.authority.host().to_ascii_lowercase();
            !OWN.iter().any(|own| {
                host.strip_suffix(own)
                    .is_some_and(|rest| rest.is_empty() || rest.ends_with('.'))
            })
        }
    }
}

/// The `anthropic-beta` header of a Messages request as its route's upstream is to see
/// it: when abridge serves these APIs for that route, without their beta values
/// ([`betas::SERVED`]); else untouched. Called on the headers before anything reads
/// them, so the summary calls asked with the client's protocol headers go without them
/// too.
///
/// Always both values in serve mode, not only those the body used: serving is decided
/// per route, and there abridge never forwards what they enable (`context_management`
/// is withheld, a `compaction` block expanded), while the upstream lacks them by the
/// configuration's word — so the value can only make a server that validates betas
/// refuse the request. Clients send them whether or not the body uses them (Claude Code
/// sends `context-management-2025-06-27` on every request): leaving them when unused
/// would fail exactly those requests. A body abridge does not understand goes on
/// untouched, and without them too: the upstream lacks the features either way.
pub fn upstream_betas(config: &Config, headers: &mut http::HeaderMap) {
    if serves(config) {
        betas::withhold(headers);
    }
}

/// One message as it will be forwarded.
pub(super) struct Entry<'a> {
    /// Its bytes in the request (`None`: abridge wrote it).
    raw: Option<Raw<'a>>,
    value: Value,
    /// Edited since it was read: forwarded as `value`.
    changed: bool,
    /// The request's message it comes from.
    from: Option<usize>,
}

impl Entry<'_> {
    fn authored(message: &RawValue) -> Option<Self> {
        Some(Entry {
            raw: None,
            value: serde_json::from_str(message.get()).ok()?,
            changed: true,
            from: None,
        })
    }
}

/// A parsed Messages request, before it is identified: as it is unless abridge serves
/// these APIs and it asks for one (`context_management`, or a `compaction` block).
pub(super) async fn before(
    state: &AppState,
    request: Arc<formats::Request>,
    at: (&http::HeaderMap, &http::Uri),
) -> Before {
    let formats::Request::Messages(messages) = &*request else {
        return Before::Go(request, None);
    };
    let (body, parsed) = (messages.body(), messages.parsed());
    if !serves(state.config()) || !asks(body, parsed) {
        return Before::Go(request, None);
    }
    let key = state.identity_key().await;
    let role = state.config().strategies.summary_role;
    let summarises = state.config().compaction.strategy.summarises();
    let permit = state.cpu().permit_for(body.len()).await;
    let planned = state.cpu().run_with(&permit, || {
        decide(key.as_deref(), (body, parsed), role, summarises)
    });
    drop(permit);
    let outcome = match planned {
        Planned::Done(outcome) => outcome,
        Planned::Ask(pending) => {
            // A summary is asked only here, for a compaction that is made with it. Its
            // transcript is written off the async workers, as the plan was.
            let max_tokens = state.config().strategies.summary_max_tokens;
            let permit = state.cpu().permit_for(body.len()).await;
            let request = state
                .cpu()
                .run_with(&permit, || pending.request(parsed, max_tokens));
            drop(permit);
            let model = parsed.fields.model.as_deref().unwrap_or_default();
            let said = asked::for_messages(state, at, model, &request).await;
            let permit = state.cpu().permit_for(body.len()).await;
            state.cpu().run_with(&permit, || {
                pending.finish(key.as_deref(), (body, parsed), role, (true, said))
            })
        }
    };
    match outcome {
        Some(Outcome::Answer(response)) => Before::Answer(response),
        Some(Outcome::Edited(body, after, archive)) => {
            Before::Edited(body, after.note(), after, archive)
        }
        Some(Outcome::Withheld(after)) => withheld(request, after),
        None => Before::Go(request, None),
    }
}

/// What [`decide`] came to: done, or a compaction to make once its model has been asked.
enum Planned<'a> {
    Done(Option<Outcome>),
    Ask(Pending<'a>),
}

/// A compaction over its trigger whose summary a model is to write: the request's
/// messages as edited so far, and what it is to make.
struct Pending<'a> {
    entries: Vec<Entry<'a>>,
    after: After,
    archive: Option<Archive>,
    prior: Option<sealed::Summary>,
    edit: edits::Compact,
    newest: usize,
}

impl Pending<'_> {
    /// The summary request: the messages the compaction replaces, after the summary of
    /// the block they carry on from, with the edit's `instructions`.
    fn request(&self, parsed: &Parsed<'_>, max_tokens: u32) -> crate::strategies::SummaryRequest {
        let replaced = compact::sent(&parsed.items, &self.entries);
        let asked = (self.prior.as_ref(), self.edit.instructions.as_deref());
        asked::transcript_request(replaced.iter(), asked, max_tokens)
    }

    /// The compaction made (the model's summary when it said one; else the digest, and
    /// the client told so when the model was `asked`) and what the request comes to
    /// with it.
    fn finish(
        mut self,
        key: Option<&IdentityKey>,
        (body, parsed): (&Bytes, &Parsed<'_>),
        role: SummaryRole,
        (asked, said): (bool, Option<asked::Summarised>),
    ) -> Option<Outcome> {
        let made = compact::Made {
            instructions: self.edit.instructions.as_deref(),
            said: said.as_ref().map(|s| s.text.as_str()),
            role,
        };
        let at = (&mut self.entries, self.prior.as_ref(), self.newest);
        if let Some((block, archive)) = compact::make(key, &parsed.items, at, &made) {
            self.archive = archive;
            self.after
                .compacted(block, said.as_ref().and_then(|s| s.spent));
            if asked && said.is_none() {
                self.after.noted(asked::DIGEST);
            }
            if self.edit.pause {
                let model = parsed.fields.model.as_deref().unwrap_or_default();
                let stream = parsed.fields.stream == Some(true);
                return Some(Outcome::Answer(self.after.paused(model, stream)));
            }
        }
        let body = forwarded(body, parsed, &self.entries)?;
        Some(Outcome::Edited(body, self.after, self.archive))
    }
}

/// Whether a request asks for what abridge serves: `context_management`, or a
/// `compaction` block (a byte search tells cheaply).
fn asks(body: &[u8], parsed: &Parsed<'_>) -> bool {
    let managed = parsed
        .fields
        .context_management
        .is_some_and(|m| m.get() != "null");
    managed || memchr::memmem::find(body, b"\"compaction\"").is_some()
}

enum Outcome {
    Answer(axum::response::Response),
    /// Messages edited: this body goes on, with what a compaction block expanded or
    /// made replaced (for recall).
    Edited(Bytes, After, Option<Archive>),
    /// No message changed: the request goes on as parsed, `context_management` withheld.
    Withheld(After),
}

/// A request whose edits change no message goes on as it was parsed, its
/// `context_management` taken from the parse (not forwarded): not parsed again. Were the
/// request shared (it is not, on the request path), the body without the field, for the
/// caller to parse.
fn withheld(mut request: Arc<formats::Request>, after: After) -> Before {
    let note = after.note();
    if let Some(formats::Request::Messages(messages)) = Arc::get_mut(&mut request) {
        return match messages.withhold_context_management() {
            true => Before::Withheld(request, note, after),
            false => Before::Go(request, None),
        };
    }
    let formats::Request::Messages(messages) = &*request else {
        return Before::Go(request, None);
    };
    match without_management(messages.body(), messages.parsed()) {
        Some(body) => Before::Edited(body, note, after, None),
        None => Before::Go(request, None),
    }
}

/// The body without its `context_management` (`None`: it has none, or it could not be
/// cut).
fn without_management(body: &[u8], parsed: &Parsed<'_>) -> Option<Bytes> {
    parsed
        .fields
        .context_management
        .and_then(|field| splice::remove_member(body, field.get()))
        .and_then(|edit| splice::apply(body, vec![edit]))
}

/// What a request's `context_management` and `compaction` blocks come to: when the
/// strategy `summarises`, a compaction over its trigger is left [`Pending`] for its
/// model; else it is made with the digest here.
fn decide<'a>(
    key: Option<&IdentityKey>,
    (body, parsed): (&Bytes, &'a Parsed<'a>),
    role: SummaryRole,
    summarises: bool,
) -> Planned<'a> {
    let edits = match requested(parsed) {
        Ok(edits) => edits,
        Err(refusal) => return Planned::Done(Some(Outcome::Answer(*refusal))),
    };
    if edits
        .as_ref()
        .is_some_and(|edits| changes_nothing(body, parsed, edits))
    {
        return Planned::Done(Some(Outcome::Withheld(After::new(true, None))));
    }
    let Some((mut entries, opened)) = entries(key, parsed, role) else {
        return Planned::Done(None);
    };
    if edits.is_none() && untouched(&entries) {
        // Only the word: no block, nothing asked.
        return Planned::Done(None);
    }
    let mut after = After::new(edits.is_some(), opened.note);
    let archive = opened.prior.as_ref().and_then(sealed::Summary::archive);
    let edits = edits.unwrap_or_default();
    clear_edits(&edits, (body, parsed), &mut entries, &mut after);
    let compacts = edits
        .compact
        .filter(|edit| estimate(body, parsed, &entries) > edit.trigger)
        .and_then(|edit| Some((edit, compact::newest(&entries)?)));
    let Some((edit, newest)) = compacts else {
        let body = forwarded(body, parsed, &entries);
        return Planned::Done(body.map(|body| Outcome::Edited(body, after, archive)));
    };
    let prior = opened.prior;
    let pending = Pending {
        entries,
        after,
        archive,
        prior,
        edit,
        newest,
    };
    match summarises {
        true => Planned::Ask(pending),
        false => Planned::Done(pending.finish(key, (body, parsed), role, (false, None))),
    }
}

/// The edits `context_management` asks for (`None`: it is absent or `null`), or
/// Anthropic's 400 refusing them.
fn requested(parsed: &Parsed<'_>) -> Result<Option<Edits>, Box<axum::response::Response>> {
    match parsed.fields.context_management {
        Some(raw) if raw.get() != "null" => edits::read(raw.get())
            .map(Some)
            .map_err(|message| Box::new(reply::invalid(&message))),
        _ => Ok(None),
    }
}

/// The request's messages as entries, the latest `compaction` block sent back expanded
/// ([`compact::expand`]); `None` when a message cannot be read.
fn entries<'a>(
    key: Option<&IdentityKey>,
    parsed: &Parsed<'a>,
    role: SummaryRole,
) -> Option<(Vec<Entry<'a>>, compact::Opened)> {
    let mut entries = parsed
        .items
        .iter()
        .enumerate()
        .map(|(k, item)| {
            Some(Entry {
                raw: Some(item.raw),
                value: serde_json::from_str(item.raw.get()).ok()?,
                changed: false,
                from: Some(k),
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let opened = compact::expand(key, &mut entries, role);
    Some((entries, opened))
}

/// Whether `entries` are the request's messages as read, none changed.
fn untouched(entries: &[Entry<'_>]) -> bool {
    entries.iter().all(|e| e.raw.is_some() && !e.changed)
}

/// `clear_thinking_20251015`, then `clear_tool_uses_20250919` (its trigger read on the
/// prompt the first left), applied to `entries`; each edit that applied told to `after`.
fn clear_edits(
    edits: &Edits,
    (body, parsed): (&[u8], &Parsed<'_>),
    entries: &mut [Entry<'_>],
    after: &mut After,
) {
    if let Some(edit) = &edits.thinking {
        after.add(clear::thinking(entries, edit));
    }
    if let Some(edit) = &edits.tool_uses {
        let prompt = estimate(body, parsed, entries);
        after.add(clear::tool_uses(entries, edit, prompt));
    }
}

/// Whether `edits` leave every message as it is, so that only `context_management`
/// goes: no `compaction` block to expand, every thinking block kept, tool uses and
/// compaction under their triggers. The common case — Claude Code asks on every request
/// to keep all thinking — decided from the parse, with no message read again.
fn changes_nothing(body: &[u8], parsed: &Parsed<'_>, edits: &Edits) -> bool {
    if edits.thinking.as_ref().is_some_and(|t| t.keep.is_some())
        || carries_compaction(body, &parsed.items)
    {
        return false;
    }
    let prompt = || {
        let messages = parsed.items.iter().map(|item| approx_text(item.raw.get()));
        prompt(body, parsed, messages)
    };
    let tool_uses = edits
        .tool_uses
        .as_ref()
        .is_none_or(|edit| match edit.trigger {
            Trigger::InputTokens(n) => prompt() <= n,
            Trigger::ToolUses(n) => {
                let assistants = parsed.items.iter().filter(|i| i.role == Role::Assistant);
                assistants.map(|i| i.calls.len() as u64).sum::<u64>() <= n
            }
        });
    tool_uses
        && edits
            .compact
            .as_ref()
            .is_none_or(|edit| prompt() <= edit.trigger)
}

/// Whether a message carries a `compaction` block: found by a byte search, or — where
/// the body has escapes, which could spell the type — by the type of every block the
/// view keeps raw.
fn carries_compaction(body: &[u8], items: &[Item<'_>]) -> bool {
    #[derive(serde::Deserialize)]
    struct Typed<'a> {
        #[serde(borrow, rename = "type")]
        kind: Cow<'a, str>,
    }
    let is_block = |raw: &Raw<'_>| {
        serde_json::from_str::<Typed<'_>>(raw.get()).is_ok_and(|b| b.kind == "compaction")
    };
    if memchr::memmem::find(body, b"\"compaction\"").is_some() {
        return true;
    }
    memchr::memmem::find(body, b"\\u").is_some()
        && items.iter().any(|item| match &item.content {
            Content::Parts(parts) => parts
                .iter()
                .any(|part| matches!(part, Part::Other(raw) if is_block(raw))),
            _ => false,
        })
}

/// The request's input tokens as abridge estimates them, with `entries` as its messages.
fn estimate(body: &[u8], parsed: &Parsed<'_>, entries: &[Entry<'_>]) -> u64 {
    let messages = entries.iter().map(|e| match (e.raw, e.changed) {
        (Some(raw), false) => approx_text(raw.get()),
        _ => approx_text(&e.value.to_string()),
    });
    prompt(body, parsed, messages)
}

/// The request's input tokens as abridge estimates them, with messages of `messages`
/// tokens in place of its own.
fn prompt(body: &[u8], parsed: &Parsed<'_>, messages: impl Iterator<Item = u64>) -> u64 {
    let whole = approx_text(std::str::from_utf8(body).unwrap_or_default());
    let own = parsed.fields.messages.map_or(0, |m| approx_text(m.get()));
    whole.saturating_sub(own) + messages.sum::<u64>()
}

/// The body to forward: `entries` as its messages, `context_management` gone.
fn forwarded(body: &Bytes, parsed: &Parsed<'_>, entries: &[Entry<'_>]) -> Option<Bytes> {
    let written: Vec<Option<Box<RawValue>>> = entries
        .iter()
        .map(|e| match (e.raw, e.changed) {
            (Some(_), false) => None,
            _ => RawValue::from_string(e.value.to_string()).ok(),
        })
        .collect();
    let messages: Vec<Raw<'_>> = entries
        .iter()
        .zip(&written)
        .filter_map(|(e, w)| w.as_deref().map(Raw::from).or(e.raw))
        .collect();
    let mut changes = vec![wire::messages_edit(body, parsed, &messages)?];
    if let Some(management) = parsed.fields.context_management {
        changes.push(splice::remove_member(body, management.get())?);
    }
    splice::apply(body, changes)
}

#[cfg(test)]
mod tests;
