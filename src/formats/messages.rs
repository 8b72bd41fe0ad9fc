//! Anthropic's Messages API (`POST /v1/messages`), as Claude Code and the Anthropic SDKs
//! send it: the system prompt in the top-level `system` (never an item, never touched),
//! the conversation in `messages`, alternating `user` and `assistant`.
//!
//! Messages and their neutral view:
//! - role `user`, `assistant`, or `system` (Claude Code sends its environment block as a
//!   `system` message inside `messages`; it is an instruction, kept in the head);
//! - content a string, or blocks: `text` is read as text; `tool_use` {`id`, `name`,
//!   `input`} is a call (its input's raw JSON as the arguments); `tool_result`
//!   {`tool_use_id`, `content`} answers that call (its text read as text); `thinking`,
//!   `redacted_thinking`, images, documents and every other block are kept raw, never
//!   edited. `cache_control` is not part of the view: clients move their breakpoints
//!   from turn to turn, and the conversation must still be recognised.
//!
//! A user message that carries tool results answers the calls of the assistant message
//! before it, so a cut never falls between them (the neutral layout's pairing).
//!
//! What abridge writes: a `user` message with one `text` block (for the system role
//! too: the only portable place for a system prompt in this API is the top level).
//! Where a message abridge wrote would stand next to one of the same role, a minimal
//! message of the other role is put between them, so the forwarded conversation still
//! alternates (many Anthropic-compatible servers reject consecutive turns, which
//! Anthropic itself merges) and starts with a `user` message. A tool result is cleared
//! in place: its block's `content` replaced by a digest, the message and its other
//! blocks kept ([`with_results`]).
//!
//! Requests that ask for the provider's own context editing or compaction (a
//! `context_management` edit that removes or compacts content) are forwarded untouched;
//! see [`untouchable`] for what does not count.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::Author;
use super::splice::{self, Edit, apply, array, span_of};
use crate::conversation::Item;
use crate::json::{self, Raw};

mod item;
mod results;

use item::MessageFields;
pub use item::{item, item_by_serde};
pub use results::{same_but_results, with_results};

/// The top level of a Messages request, of which abridge reads only this.
#[derive(Debug, Deserialize)]
pub struct Fields<'a> {
    #[serde(borrow, default)]
    pub model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub messages: Option<Raw<'a>>,
    #[serde(borrow, default)]
    pub context_management: Option<Raw<'a>>,
    #[serde(borrow, default)]
    pub metadata: Option<Metadata<'a>>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// The client's tools (`null` included, to replace it) and `tool_choice`, as
    /// written (see [`crate::recall`]).
    #[serde(borrow, default, deserialize_with = "super::present")]
    pub tools: Option<Raw<'a>>,
    #[serde(borrow, default)]
    pub tool_choice: Option<Raw<'a>>,
}

#[derive(Debug, Deserialize)]
pub struct Metadata<'a> {
    /// Claude Code puts its session id here (a JSON document in a string).
    #[serde(borrow, default)]
    pub user_id: Option<Cow<'a, str>>,
}

/// A parsed request: the top level and the messages as items.
#[derive(Debug)]
pub struct Parsed<'a> {
    pub fields: Fields<'a>,
    pub items: Vec<Item<'a>>,
    /// `context_management` once abridge serves it ([`Request::withhold_context_management`]):
    /// still in the body as received, never forwarded.
    pub withheld: Option<Raw<'a>>,
}

/// Why a body is not a Messages request abridge understands.
#[derive(Debug, thiserror::Error)]
pub enum Unparseable {
    #[error("request body is not a Messages request: {0}")]
    Body(serde_json::Error),
    #[error("`messages` is not an array")]
    NotAnArray,
    #[error("message {index} is not understood: {error}")]
    Message {
        index: usize,
        error: serde_json::Error,
    },
}

/// The body parsed: its top level and the messages found by the validating pass (serde
/// reads what that leaves to it, and gives the errors), then every message read by its
/// walk.
pub fn parse(body: &[u8]) -> Result<Parsed<'_>, Unparseable> {
    with_items(super::read_top(body, walked, by_serde)?)
}

/// [`parse`] with the top level read by serde alone: what the validating pass must agree
/// with (tests and fuzzing compare them).
#[doc(hidden)]
pub fn parse_by_serde(body: &[u8]) -> Result<Parsed<'_>, Unparseable> {
    with_items(by_serde(body)?)
}

fn with_items<'a>((fields, raw): (Fields<'a>, Vec<Raw<'a>>)) -> Result<Parsed<'a>, Unparseable> {
    let items = raw
        .into_iter()
        .enumerate()
        .map(|(index, raw)| item(raw).map_err(|error| Unparseable::Message { index, error }))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Parsed {
        fields,
        items,
        withheld: None,
    })
}

/// The top level and the messages as the validating pass found them; `None` for
/// whatever serde should read (`messages` not an array among it).
pub(super) fn walked<'a>(top: &json::Top<'a>) -> Option<(Fields<'a>, Vec<Raw<'a>>)> {
    let [
        model,
        messages,
        context_management,
        metadata,
        stream,
        tools,
        tool_choice,
    ] = top.fields([
        "model",
        "messages",
        "context_management",
        "metadata",
        "stream",
        "tools",
        "tool_choice",
    ])?;
    let raw = match json::optional_raw(messages) {
        None => Vec::new(),
        Some(_) => messages?.elements?.to_vec(),
    };
    let metadata = match json::optional_raw(metadata) {
        None => None,
        Some(m) => {
            let [user_id] = json::fields(m.get(), ["user_id"])?;
            Some(Metadata {
                user_id: json::optional_string(user_id)?,
            })
        }
    };
    let fields = Fields {
        model: json::optional_text(model)?,
        messages: json::optional_raw(messages),
        context_management: json::optional_raw(context_management),
        metadata,
        stream: json::optional_flag(stream)?,
        tools: tools.map(|v| v.raw),
        tool_choice: json::optional_raw(tool_choice),
    };
    Some((fields, raw))
}

/// The same read by serde (the reference, and the errors).
fn by_serde(body: &[u8]) -> Result<(Fields<'_>, Vec<Raw<'_>>), Unparseable> {
    let fields: Fields<'_> = super::from_body(body).map_err(Unparseable::Body)?;
    let raw = match fields.messages {
        None => Vec::new(),
        Some(m) if m.get().starts_with('[') => {
            serde_json::from_str(m.get()).map_err(Unparseable::Body)?
        }
        Some(_) => return Err(Unparseable::NotAnArray),
    };
    Ok((fields, raw))
}

/// A message abridge writes: role `user`, one text block.
pub fn authored(_role: Author, text: &str) -> Box<RawValue> {
    let json = serde_json::json!({
        "role": "user",
        "content": [{"type": "text", "text": text}],
    });
    RawValue::from_string(json.to_string())
        .unwrap_or_else(|_| unreachable!("serde_json wrote valid JSON"))
}

const USER_FILLER: &str = r#"{"role":"user","content":[{"type":"text","text":"Continue."}]}"#;
const ASSISTANT_FILLER: &str =
    r#"{"role":"assistant","content":[{"type":"text","text":"Understood."}]}"#;

/// The role of a forwarded message for alternation (`None`: a `system` message, which
/// alternation skips, or one abridge cannot read).
fn turn_role(raw: Raw<'_>) -> Option<bool> {
    let f: MessageFields<'_> = serde_json::from_str(raw.get()).ok()?;
    match f.role.as_ref() {
        "user" => Some(true),
        "assistant" => Some(false),
        _ => None,
    }
}

/// `items` as they go upstream: where a message abridge wrote (one not borrowed from
/// `body`) stands next to one of the same role, a filler of the other role goes between
/// them; a conversation that would start with an assistant message gets a user filler.
fn alternating<'r>(body: &[u8], items: &[Raw<'r>]) -> Vec<Raw<'r>> {
    static FILLERS: std::sync::OnceLock<[Box<RawValue>; 2]> = std::sync::OnceLock::new();
    let fillers = FILLERS.get_or_init(|| {
        [USER_FILLER, ASSISTANT_FILLER].map(|text| {
            RawValue::from_string(text.to_owned())
                .unwrap_or_else(|_| unreachable!("a constant JSON object"))
        })
    });
    let filler = |user: bool| Raw::from(&*fillers[usize::from(!user)]);
    let mut out: Vec<Raw<'r>> = Vec::with_capacity(items.len() + 2);
    // The last message that counts for alternation: its role, and whether abridge wrote it.
    let mut last: Option<(bool, bool)> = None;
    for &raw in items {
        let authored = span_of(body, raw.get()).is_none();
        if let Some(user) = turn_role(raw) {
            match last {
                None if !user => out.push(filler(true)),
                Some((was_user, was_authored))
                    if was_user == user && (authored || was_authored) =>
                {
                    out.push(filler(!user));
                }
                _ => {}
            }
            last = Some((user, authored));
        }
        out.push(raw);
    }
    out
}

/// The body with its `messages` array replaced by `items` (made to alternate where
/// abridge's own messages meet the client's), every other byte kept.
pub fn with_messages(body: &Bytes, parsed: &Parsed<'_>, items: &[Raw<'_>]) -> Option<Bytes> {
    apply(body, vec![messages_edit(body, parsed, items)?])
}

/// The edit [`with_messages`] makes.
pub fn messages_edit(body: &Bytes, parsed: &Parsed<'_>, items: &[Raw<'_>]) -> Option<Edit> {
    let messages = parsed.fields.messages?;
    let span = span_of(body, messages.get())?;
    Some(Edit {
        span,
        bytes: array(&alternating(body, items)),
    })
}

/// Why this request is left to the provider: its `context_management` asks the
/// provider to edit or compact the context (clear tool uses, clear thinking beyond
/// what it keeps, compact). Claude Code sends `clear_thinking` with `keep: "all"` — no
/// edit at all — and the `context-management-*` beta on every request; neither on its
/// own hands the conversation to the provider (were it so, Claude Code would never be
/// compacted).
pub fn untouchable(parsed: &Parsed<'_>) -> Option<&'static str> {
    #[derive(Deserialize)]
    struct Management<'a> {
        #[serde(borrow, default)]
        edits: Vec<EditSpec<'a>>,
    }
    #[derive(Deserialize)]
    struct EditSpec<'a> {
        #[serde(borrow, rename = "type")]
        kind: Cow<'a, str>,
        #[serde(borrow, default)]
        keep: Option<Raw<'a>>,
    }
    let raw = parsed.fields.context_management?;
    if raw.get() == "null" {
        return None;
    }
    let edits = match serde_json::from_str::<Management<'_>>(raw.get()) {
        Ok(m) => m.edits,
        // A shape abridge does not know: the provider's to manage.
        Err(_) => return Some(MANAGED),
    };
    let keeps_everything = |e: &EditSpec<'_>| {
        e.kind.starts_with("clear_thinking") && e.keep.is_some_and(|k| k.get() == r#""all""#)
    };
    (!edits.iter().all(keeps_everything)).then_some(MANAGED)
}

const MANAGED: &str =
    "context_management: the provider edits this conversation itself; forwarded untouched";

owned_request!("Messages");

impl Request {
    /// Takes `context_management` from the request, for abridge serves it (see
    /// `crate::provider_apis::messages`): the body stays as received, but the field is
    /// no longer the provider's — not forwarded ([`withheld_edit`]) and no reason to
    /// leave the request untouched ([`untouchable`]). Without parsing again. `false`
    /// (nothing taken) when there is none, or it cannot be cut out of the body.
    pub fn withhold_context_management(&mut self) -> bool {
        self.with_dependent_mut(|body, parsed| {
            let Some(field) = parsed.fields.context_management else {
                return false;
            };
            if splice::remove_member(body, field.get()).is_none() {
                return false;
            }
            parsed.withheld = parsed.fields.context_management.take();
            true
        })
    }
}

/// The edit that leaves out what the request withholds ([`Request::withhold_context_management`]).
pub fn withheld_edit(body: &[u8], parsed: &Parsed<'_>) -> Option<Edit> {
    splice::remove_member(body, parsed.withheld?.get())
}

#[cfg(test)]
mod tests;
