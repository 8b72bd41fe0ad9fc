//! The wire formats abridge reads, behind one seam. Each format is a module that maps
//! its bytes to the format-neutral conversation (`crate::conversation`) and back:
//! parsing by borrowing, the items' neutral view, and the few places where a plan must
//! write the format's own shapes — a message abridge authors (a marker, a summary), a
//! tool result whose output is replaced by a digest — and how to check such a digest;
//! and the outgoing body, with the forwarded items spliced in. Nothing outside a format
//! module knows its field names.
//!
//! A body is read in one validating pass ([`crate::json::top`], as strict as serde_json),
//! which finds the top-level fields and the conversation's items on its way; each item
//! is then read by a walk over its validated bytes. Whatever the pass or a walk leaves
//! (a body serde refuses, a field of the wrong type, a duplicate) serde reads, so what is
//! understood, and every error, is as serde decides (each format's `parse_by_serde` is
//! the reference the tests and fuzz targets compare with).
//!
//! Closed sets, so enums: [`Format`] names a format, [`Request`] holds a parsed body of
//! one; both dispatch to the module.

/// A format module's `Request`: the body and its parse owned together (self_cell),
/// parsed once at ingress and carried — through the request path, the record stage and
/// a background job — without ever being parsed again. The module provides `Parsed`,
/// `Unparseable` and `parse(&[u8]) -> Result<Parsed<'_>, Unparseable>`.
macro_rules! owned_request {
    ($what:literal) => {
        self_cell::self_cell!(
            #[doc = concat!("A ", $what, " request's body and its parse, together (see `formats::owned_request`).")]
            pub struct Request {
                owner: bytes::Bytes,
                #[covariant]
                dependent: Parsed,
            }

            impl {Debug}
        );

        impl Request {
            /// Parses `body`; a body abridge does not understand is handed back with the
            /// reason.
            pub fn parse(body: bytes::Bytes) -> Result<Self, (bytes::Bytes, Unparseable)> {
                Request::try_new_or_recover(body, |b| parse(b))
            }

            /// The bytes as received.
            pub fn body(&self) -> &bytes::Bytes {
                self.borrow_owner()
            }

            /// The parse of them.
            pub fn parsed(&self) -> &Parsed<'_> {
                self.borrow_dependent()
            }
        }
    };
}

pub mod chat;
pub mod messages;
pub mod responses;
pub mod splice;

use bytes::Bytes;
use serde_json::value::RawValue;

use std::borrow::Cow;

use crate::conversation::{Content, Item, Part};
use crate::json::Raw;

/// A body's top level, deserialised by serde (the reference read, and the errors): its
/// UTF-8 checked once for the whole body, so that serde need not check again every
/// message it hands over as raw JSON. Bytes that are not UTF-8 (serde accepts them in
/// strings it skips) are left to serde, so what is understood and what is refused is as
/// serde decides.
fn from_body<'a, T: serde::Deserialize<'a>>(body: &'a [u8]) -> Result<T, serde_json::Error> {
    match std::str::from_utf8(body) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(body),
    }
}

/// A body's top level read by `walked` from what abridge's validating pass found; where
/// the pass leaves it (a body not UTF-8, not JSON as serde_json reads it, not an object)
/// or `walked` does (a wrong type, a duplicate), by `by_serde`, which gives serde's
/// reading and its errors.
fn read_top<'a, R, E>(
    body: &'a [u8],
    walked: impl FnOnce(&crate::json::Top<'a>) -> Option<R>,
    by_serde: impl FnOnce(&'a [u8]) -> Result<R, E>,
) -> Result<R, E> {
    let top = std::str::from_utf8(body).ok().and_then(crate::json::top);
    match top.and_then(|top| walked(&top)) {
        Some(read) => Ok(read),
        None => by_serde(body),
    }
}

/// `Some(raw)` for any present value, `null` included (serde maps `null` to `None`): for
/// a member abridge may edit in place.
fn present<'de: 'a, 'a, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Raw<'a>>, D::Error> {
    <Raw<'a> as serde::Deserialize>::deserialize(d).map(Some)
}

/// A content value as the chat and Responses formats write it (`value`: its JSON text,
/// and its text when the walk decoded a string on its way): a
/// string, `null`, or an array of parts of which those whose `type` is one of
/// `text_kinds` (and that carry a `text`) are text and the rest kept raw; anything else
/// is [`Content::Other`]. A part's fields are walked (`json::fields`), or read by serde
/// where the walk leaves them to it.
pub(crate) fn content<'a>(
    value: crate::json::Member<'a>,
    text_kinds: &[&str],
) -> Result<Content<'a>, serde_json::Error> {
    let raw = value.raw;
    if let Some(text) = value.text() {
        // A string the walk decoded on its way.
        return Ok(Content::Text(text));
    }
    let other = || serde_json::from_str(raw).map(Content::Other);
    match raw.as_bytes().first() {
        Some(b'"') => match crate::json::string_text(raw) {
            Some(s) => Ok(Content::Text(s)),
            None => serde_json::from_str::<Cow<'_, str>>(raw)
                .map(Content::Text)
                .or_else(|_| other()),
        },
        Some(b'[') => match crate::json::elements(raw) {
            Some(parts) => Ok(Content::Parts(
                parts.into_iter().map(|p| part(p, text_kinds)).collect(),
            )),
            None => other(),
        },
        Some(b'n') if raw == "null" => Ok(Content::None),
        _ => other(),
    }
}

fn part<'a>(raw: Raw<'a>, text_kinds: &[&str]) -> Part<'a> {
    match part_walked(raw.get()).or_else(|| part_by_serde(raw.get())) {
        Some((kind, Some(text))) if text_kinds.contains(&kind.as_ref()) => Part::Text(text),
        _ => Part::Other(raw),
    }
}

/// A part's `type` and `text`, walked; `None` for whatever the walk leaves to serde.
fn part_walked(raw: &str) -> Option<(Cow<'_, str>, Option<Cow<'_, str>>)> {
    let [kind, text] = crate::json::fields(raw, ["type", "text"])?;
    Some((kind?.text()?, crate::json::optional_string(text)?))
}

/// The same read by serde: `None` where serde refuses the part.
fn part_by_serde(raw: &str) -> Option<(Cow<'_, str>, Option<Cow<'_, str>>)> {
    #[derive(serde::Deserialize)]
    struct Fields<'a> {
        #[serde(borrow, rename = "type")]
        kind: Cow<'a, str>,
        #[serde(borrow, default)]
        text: Option<Cow<'a, str>>,
    }
    let f: Fields<'_> = serde_json::from_str(raw).ok()?;
    Some((f.kind, f.text))
}

/// What the formats' properties share: objects written from members, values with
/// escapes, and the check that the walk and serde read a message (item) alike.
#[cfg(test)]
pub(crate) mod walk_check {
    use proptest::prelude::*;
    use serde_json::value::RawValue;

    use crate::conversation::Item;
    use crate::json::Raw;

    /// How a format reads an item (the walk, or serde alone).
    pub type Read = for<'a> fn(Raw<'a>) -> Result<Item<'a>, serde_json::Error>;

    /// The object of `members` (keys written as given, values as raw JSON).
    pub fn object<K: AsRef<str>, V: AsRef<str>>(members: &[(K, V)]) -> String {
        let joined: Vec<String> = members
            .iter()
            .map(|(k, v)| format!("\"{}\":{}", k.as_ref(), v.as_ref()))
            .collect();
        format!("{{{}}}", joined.join(","))
    }

    /// A JSON string of text with quotes, backslashes, line breaks and non-ASCII.
    pub fn escaped_text() -> impl Strategy<Value = String> {
        "(?s)[a-z \n\"\\\\é]{0,12}".prop_map(|t| serde_json::to_string(&t).unwrap())
    }

    /// One of `names`, as a key or a value's text.
    pub fn one_of(names: &'static [&'static str]) -> impl Strategy<Value = &'static str> {
        proptest::sample::select(names)
    }

    /// The walk and serde read the object `text` alike: the same item or the same
    /// refusal (text that is not JSON at all is not a message: nothing to compare).
    pub fn agree(text: &str, walk: Read, serde: Read) -> Result<(), TestCaseError> {
        let Ok(raw) = serde_json::from_str::<&RawValue>(text) else {
            return Ok(());
        };
        let walked = walk(raw.into()).map_err(|e| e.to_string());
        let by_serde = serde(raw.into()).map_err(|e| e.to_string());
        prop_assert_eq!(walked, by_serde, "{}", text);
        Ok(())
    }
}

#[cfg(test)]
mod top_tests;

#[cfg(test)]
mod part_tests {
    use super::walk_check::{escaped_text, object, one_of};
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Where the walk reads a part, it reads what serde reads.
        #[test]
        fn the_walk_reads_parts_as_serde_does(
            members in prop::collection::vec(
                (
                    one_of(&["type", "text", "t\\u0065xt", "x"]),
                    prop_oneof![
                        Just("null".to_owned()),
                        Just("1".to_owned()),
                        Just(r#""\ud800""#.to_owned()),
                        Just(r#"{"a":"}"}"#.to_owned()),
                        escaped_text(),
                    ],
                ),
                0..4,
            ),
        ) {
            let text = object(&members);
            if serde_json::from_str::<&RawValue>(&text).is_err() {
                return Ok(());
            }
            if let Some(walked) = part_walked(&text) {
                prop_assert_eq!(Some(walked), part_by_serde(&text), "{}", text);
            }
        }
    }
}

/// Which wire format a conversation came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// OpenAI chat completions (`POST /v1/chat/completions`): [`chat`].
    #[default]
    Chat,
    /// OpenAI Responses (`POST /v1/responses`): [`responses`].
    Responses,
    /// Anthropic Messages (`POST /v1/messages`): [`messages`].
    Messages,
}

impl Format {
    /// `chat`, `responses` or `messages`, as the admin API and the dashboard name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Chat => "chat",
            Format::Responses => "responses",
            Format::Messages => "messages",
        }
    }
}

/// The role abridge gives a message it writes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Author {
    User,
    System,
}

impl Format {
    /// The format's name in metrics, logs and the admin API.
    pub fn name(self) -> &'static str {
        match self {
            Format::Chat => "chat",
            Format::Responses => "responses",
            Format::Messages => "messages",
        }
    }

    /// The format's part of a tenant's namespace: a conversation in one format never
    /// matches state stored for another (a checkpoint's replacement is written in its
    /// format). `None` for chat, whose namespaces predate the other formats.
    pub fn domain(self) -> Option<&'static [u8]> {
        match self {
            Format::Chat => None,
            Format::Responses => Some(b"responses"),
            Format::Messages => Some(b"messages"),
        }
    }

    /// One item of this format (a replacement message, to check or count it).
    pub fn item<'a>(self, raw: Raw<'a>) -> Option<Item<'a>> {
        match self {
            Format::Chat => chat::item(raw).ok(),
            Format::Responses => responses::item(raw).ok(),
            Format::Messages => messages::item(raw).ok(),
        }
    }

    /// A message abridge writes: `text` as the content of a message of `role`.
    pub fn authored(self, role: Author, text: &str) -> Box<RawValue> {
        match self {
            Format::Chat => chat::authored(role, text),
            Format::Responses => responses::authored(role, text),
            Format::Messages => messages::authored(role, text),
        }
    }

    /// The tool result `item` with its output replaced by what `line` makes of it
    /// (called with the call id the output answers, if any, and the output's text; a
    /// Messages result is a block inside a user message, so `line` is called for each
    /// of its `tool_result` blocks), everything else kept byte for byte. `None` when
    /// `line` replaces nothing, or the output cannot be spliced.
    pub fn digest(
        self,
        item: &Item<'_>,
        mut line: impl FnMut(Option<&str>, &str) -> Option<String>,
    ) -> Option<Box<RawValue>> {
        if let Format::Messages = self {
            return messages::with_results(item.raw, |id, text| line(Some(id), text));
        }
        let text = match &item.content {
            Content::Text(t) => t.clone(),
            Content::Parts(_) => item.content.text_lossy(),
            Content::None | Content::Other(_) => return None,
        };
        let text = line(item.results.first().map(|id| id.as_ref()), &text)?;
        match self {
            Format::Chat => chat::with_content(item.raw, &text),
            Format::Responses => responses::with_output(item.raw, &text),
            Format::Messages => None,
        }
    }

    /// Whether `digest` is `original` with only its output replaced.
    pub fn is_digest_of(self, digest: Raw<'_>, original: Raw<'_>) -> bool {
        match self {
            Format::Chat => chat::same_but_content(digest, original),
            Format::Responses => responses::same_but_output(digest, original),
            Format::Messages => messages::same_but_results(digest, original),
        }
    }
}

/// Why a body is not a request abridge understands (it is forwarded untouched).
#[derive(Debug, thiserror::Error)]
pub enum Unparseable {
    #[error(transparent)]
    Chat(#[from] chat::Unparseable),
    #[error(transparent)]
    Responses(#[from] responses::Unparseable),
    #[error(transparent)]
    Messages(#[from] messages::Unparseable),
}

/// A conversation request's body and its parse, in its format.
#[derive(Debug)]
pub enum Request {
    Chat(chat::Request),
    Responses(responses::Request),
    Messages(messages::Request),
}

/// The body to send upstream.
#[derive(Debug)]
pub struct Outgoing {
    pub body: Bytes,
    /// abridge asked for usage the client did not ask for (chat's
    /// `stream_options.include_usage`): the relay removes it again.
    pub asked_usage: bool,
}

impl Request {
    /// Parses `body` as `format`; a body abridge does not understand is handed back,
    /// with the reason.
    pub fn parse(format: Format, body: Bytes) -> Result<Self, (Bytes, Unparseable)> {
        match format {
            Format::Chat => chat::Request::parse(body)
                .map(Request::Chat)
                .map_err(|(b, e)| (b, e.into())),
            Format::Responses => responses::Request::parse(body)
                .map(Request::Responses)
                .map_err(|(b, e)| (b, e.into())),
            Format::Messages => messages::Request::parse(body)
                .map(Request::Messages)
                .map_err(|(b, e)| (b, e.into())),
        }
    }

    pub fn format(&self) -> Format {
        match self {
            Request::Chat(_) => Format::Chat,
            Request::Responses(_) => Format::Responses,
            Request::Messages(_) => Format::Messages,
        }
    }

    /// The bytes as received.
    pub fn body(&self) -> &Bytes {
        match self {
            Request::Chat(r) => r.body(),
            Request::Responses(r) => r.body(),
            Request::Messages(r) => r.body(),
        }
    }

    /// The conversation, as items.
    pub fn items(&self) -> &[Item<'_>] {
        match self {
            Request::Chat(r) => &r.parsed().messages,
            Request::Responses(r) => &r.parsed().items,
            Request::Messages(r) => &r.parsed().items,
        }
    }

    /// The model the client asked for (empty when it named none).
    pub fn model(&self) -> &str {
        match self {
            Request::Chat(r) => r.parsed().request.model.as_deref(),
            Request::Responses(r) => r.parsed().fields.model.as_deref(),
            Request::Messages(r) => r.parsed().fields.model.as_deref(),
        }
        .unwrap_or_default()
    }

    /// Why this request must be forwarded untouched whatever the `x-abridge-*` headers
    /// say (its state lives on the provider, or the client asked for the provider's own
    /// compaction).
    pub fn untouchable(&self) -> Option<&'static str> {
        match self {
            Request::Chat(_) => None,
            Request::Responses(r) => r.untouchable(),
            Request::Messages(r) => messages::untouchable(r.parsed()),
        }
    }

    /// The client's own name for this conversation, when its format has one (the
    /// Responses API's `prompt_cache_key`, which Codex CLI sets to its thread id and keeps
    /// across `resume`): a hint within the tenant's namespace. Not a Messages
    /// `metadata.user_id`: Claude Code puts a session id there that changes when a
    /// session is continued (`claude --continue`), which would make every continuation
    /// a new conversation.
    pub fn hint(&self) -> Option<&str> {
        match self {
            Request::Chat(_) | Request::Messages(_) => None,
            Request::Responses(r) => r.parsed().fields.prompt_cache_key.as_deref(),
        }
        .filter(|h| !h.is_empty())
    }

    /// The body to send: the original bytes with `items` (the forwarded conversation,
    /// when a checkpoint is applied) in place of the client's, `tool` (a tool definition
    /// in this format) after the client's tools, what it [`withheld`](Self::withheld)
    /// left out, and — where the format needs it and `ask_usage` allows — the ask for
    /// usage in streams.
    pub fn outgoing(
        &self,
        items: Option<&[Raw<'_>]>,
        tool: Option<&str>,
        ask_usage: bool,
    ) -> Outgoing {
        let body = self.body();
        let tool = tool.and_then(|tool| splice::append_tool(body, self.tools(), tool));
        let (edited, asked_usage) = match self {
            Request::Chat(r) => chat::outgoing(body, r.parsed(), (items, tool), ask_usage),
            Request::Responses(r) => {
                let input = items.and_then(|items| responses::input_edit(body, r.parsed(), items));
                (
                    splice::apply(body, input.into_iter().chain(tool).collect()),
                    false,
                )
            }
            Request::Messages(r) => {
                let messages =
                    items.and_then(|items| messages::messages_edit(body, r.parsed(), items));
                let withheld = messages::withheld_edit(body, r.parsed());
                let edits = messages.into_iter().chain(withheld).chain(tool);
                (splice::apply(body, edits.collect()), false)
            }
        };
        Outgoing {
            body: edited.unwrap_or_else(|| body.clone()),
            asked_usage,
        }
    }

    /// A top-level member of the body that is not forwarded (a Messages
    /// `context_management` abridge serves), as written.
    pub fn withheld(&self) -> Option<Raw<'_>> {
        match self {
            Request::Chat(_) | Request::Responses(_) => None,
            Request::Messages(r) => r.parsed().withheld,
        }
    }

    /// The client's `tools`, as written.
    pub fn tools(&self) -> Option<Raw<'_>> {
        match self {
            Request::Chat(r) => r.parsed().request.tools,
            Request::Responses(r) => r.parsed().fields.tools,
            Request::Messages(r) => r.parsed().fields.tools,
        }
    }

    /// The client's `tool_choice`, as written.
    pub fn tool_choice(&self) -> Option<Raw<'_>> {
        match self {
            Request::Chat(r) => r.parsed().request.tool_choice,
            Request::Responses(r) => r.parsed().fields.tool_choice,
            Request::Messages(r) => r.parsed().fields.tool_choice,
        }
    }

    /// Whether the client leaves the choice of tool to the model: no `tool_choice`, or
    /// `auto` (chat and Responses: `"auto"`; Messages: `{"type": "auto"}`), and not chat's
    /// legacy `functions` (which cannot be mixed with `tools`). A tool abridge adds is
    /// added only then: never beside `none`, a required or a forced tool.
    pub fn lets_the_model_choose_tools(&self) -> bool {
        #[derive(serde::Deserialize)]
        struct Typed<'a> {
            #[serde(borrow, rename = "type")]
            kind: Option<std::borrow::Cow<'a, str>>,
        }
        if let Request::Chat(r) = self
            && r.parsed()
                .request
                .functions
                .is_some_and(|f| f.get() != "null")
        {
            return false;
        }
        let Some(choice) = self.tool_choice().map(Raw::get).filter(|c| *c != "null") else {
            return true;
        };
        match self {
            Request::Messages(_) => serde_json::from_str::<Typed<'_>>(choice)
                .is_ok_and(|t| t.kind.as_deref() == Some("auto")),
            _ => choice == "\"auto\"",
        }
    }

    /// Whether the client asks for more than one answer (chat's `n` above 1).
    pub fn asks_several_answers(&self) -> bool {
        match self {
            Request::Chat(r) => r
                .parsed()
                .request
                .n
                .is_some_and(|n| n.get().trim().parse::<f64>().is_ok_and(|n| n > 1.0)),
            Request::Responses(_) | Request::Messages(_) => false,
        }
    }

    /// Whether the client asked for a stream.
    pub fn streams(&self) -> bool {
        match self {
            Request::Chat(r) => r.parsed().request.stream == Some(true),
            Request::Responses(r) => r.parsed().fields.stream == Some(true),
            Request::Messages(r) => r.parsed().fields.stream == Some(true),
        }
    }

    /// Whether the format would ask the provider for usage in this request's stream
    /// (chat only, when the client did not).
    pub fn wants_usage_ask(&self) -> bool {
        match self {
            Request::Chat(r) => chat::usage_edit(self.body(), &r.parsed().request).is_some(),
            Request::Responses(_) | Request::Messages(_) => false,
        }
    }
}
