//! The chat-completions request, parsed without losing anything.
//!
//! abridge never re-serialises a request it does not change: [`parse`] borrows from the
//! original bytes, reads only what abridge needs (model, stream flags, the messages as
//! raw JSON plus a typed view of each), and every edit is a splice into the original
//! bytes at the span of the value it replaces. Unknown fields, their order and their
//! formatting reach the provider exactly as the client wrote them.
//!
//! A body abridge cannot parse or does not understand (malformed JSON, `messages` not an
//! array, an unknown role, nesting deeper than serde_json's limit of 128) is an
//! [`Unparseable`]: the caller forwards it untouched so the provider's own error reaches
//! the client.

use std::borrow::Cow;

use bytes::Bytes;

use super::Author;
use super::splice::{Edit, apply, array, span_of};
use crate::conversation::{Content, Item, Opaque, Role, ToolCall};
use crate::json::{self, Raw};
use serde::Deserialize;
use serde_json::value::RawValue;

#[derive(Debug, Deserialize)]
pub struct ChatRequest<'a> {
    #[serde(borrow, default)]
    pub model: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub messages: Vec<Raw<'a>>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// `Some` whenever the key is present, `null` included (to edit it in place).
    #[serde(borrow, default, deserialize_with = "super::present")]
    pub stream_options: Option<Raw<'a>>,
    /// The client's tools (`null` included, to replace it), `tool_choice` and legacy
    /// `functions`, as written (for what abridge adds: see [`crate::recall`]).
    #[serde(borrow, default, deserialize_with = "super::present")]
    pub tools: Option<Raw<'a>>,
    #[serde(borrow, default)]
    pub tool_choice: Option<Raw<'a>>,
    #[serde(borrow, default)]
    pub functions: Option<Raw<'a>>,
    /// How many choices the client asks for, as written (a recall tool is not added
    /// beside more than one).
    #[serde(borrow, default)]
    pub n: Option<Raw<'a>>,
}

/// The message fields abridge reads, as serde_json reads them (the reference for
/// `fields`, and what [`with_content`] edits).
#[derive(Deserialize)]
struct MessageFields<'a> {
    role: Role,
    #[serde(borrow, default)]
    content: Option<Raw<'a>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<Raw<'a>>,
    #[serde(borrow, default)]
    tool_call_id: Option<Cow<'a, str>>,
}

/// The same fields with the values as raw JSON text (content with its text when the
/// walk decoded it), `null` as absent.
struct Fields<'a> {
    role: Role,
    content: Option<json::Member<'a>>,
    name: Option<Cow<'a, str>>,
    tool_calls: Option<&'a str>,
    tool_call_id: Option<Cow<'a, str>>,
}

/// One chat message as a conversation item: its raw JSON (forwarded when it is kept) and
/// the neutral view, parsed once. The body's parse has validated `raw`, so its members
/// are found by a walk over its bytes (`fields`) instead of a second serde pass over
/// every string; a message the walk leaves to serde (a duplicate field, a role or name
/// that is not a plain string) is read by serde, errors included.
pub fn item(raw: Raw<'_>) -> Result<Item<'_>, serde_json::Error> {
    match fields(raw.get()) {
        Some(f) => build(raw, f),
        None => item_by_serde(raw),
    }
}

/// [`item`] through serde alone: what the walk must agree with (tests and fuzzing
/// compare them).
#[doc(hidden)]
pub fn item_by_serde(raw: Raw<'_>) -> Result<Item<'_>, serde_json::Error> {
    let f: MessageFields<'_> = serde_json::from_str(raw.get())?;
    let fields = Fields {
        role: f.role,
        content: f.content.map(|c| json::Member::unread(c.get())),
        name: f.name,
        tool_calls: f.tool_calls.map(Raw::get),
        tool_call_id: f.tool_call_id,
    };
    build(raw, fields)
}

/// The fields of the message `text`, walked; `None` for whatever it leaves to serde.
fn fields(text: &str) -> Option<Fields<'_>> {
    let [role, content, name, tool_calls, tool_call_id] = json::fields(
        text,
        ["role", "content", "name", "tool_calls", "tool_call_id"],
    )?;
    Some(Fields {
        role: role_named(&role?.text()?)?,
        content,
        name: json::optional_string(name)?,
        tool_calls: tool_calls.map(|c| c.raw),
        tool_call_id: json::optional_string(tool_call_id)?,
    })
}

/// The role a message names, by `Role`'s own serde names (an unknown one is left to
/// serde's read of the message, whose error names it).
fn role_named(name: &str) -> Option<Role> {
    use serde::de::IntoDeserializer;
    let name: serde::de::value::StrDeserializer<'_, serde::de::value::Error> =
        name.into_deserializer();
    Role::deserialize(name).ok()
}

fn build<'a>(raw: Raw<'a>, f: Fields<'a>) -> Result<Item<'a>, serde_json::Error> {
    let (calls, extra) = match f.tool_calls {
        None => (Vec::new(), None),
        Some(text) => match tool_calls(text) {
            Ok(calls) => (calls, None),
            // A shape abridge does not know: its exact bytes are part of identity.
            Err(_) => (Vec::new(), Some(serde_json::from_str(text)?)),
        },
    };
    let content = match f.content {
        None => Content::None,
        Some(value) => super::content(value, &["text"])?,
    };
    Ok(Item {
        raw,
        role: f.role,
        content,
        name: f.name.filter(|n| !n.is_empty()),
        calls,
        results: f
            .tool_call_id
            .filter(|id| !id.is_empty())
            .into_iter()
            .collect(),
        opaque: Opaque::None,
        extra,
        reasoning: None,
        dropped: false,
    })
}

/// A message abridge writes: `{"role":…,"content":…}`.
pub fn authored(role: Author, text: &str) -> Box<RawValue> {
    #[derive(serde::Serialize)]
    struct Authored<'a> {
        role: &'a str,
        content: &'a str,
    }
    let role = match role {
        Author::User => "user",
        Author::System => "system",
    };
    let json = serde_json::to_string(&Authored {
        role,
        content: text,
    })
    // Serialising two strings cannot fail; an empty object would fail validation.
    .unwrap_or_else(|_| "{}".to_owned());
    RawValue::from_string(json).unwrap_or_else(|_| unreachable!("serde_json wrote valid JSON"))
}

/// The message `raw` with its `content` replaced by the string `text`, every other
/// byte kept; `None` when it has no content to replace.
pub fn with_content(raw: Raw<'_>, text: &str) -> Option<Box<RawValue>> {
    let fields: MessageFields<'_> = serde_json::from_str(raw.get()).ok()?;
    super::splice::with_string(raw, fields.content?, text)
}

/// Whether two messages are the same JSON object apart from `content`.
pub fn same_but_content(a: Raw<'_>, b: Raw<'_>) -> bool {
    super::splice::same_except(a, b, "content")
}

/// The assistant's tool calls (`null` is none).
fn tool_calls(raw: &str) -> Result<Vec<ToolCall<'_>>, serde_json::Error> {
    #[derive(Deserialize)]
    struct Call<'a> {
        #[serde(borrow)]
        id: Cow<'a, str>,
        #[serde(borrow)]
        function: Function<'a>,
    }
    #[derive(Deserialize)]
    struct Function<'a> {
        #[serde(borrow)]
        name: Cow<'a, str>,
        #[serde(borrow, default)]
        arguments: Cow<'a, str>,
    }
    let calls: Option<Vec<Call<'_>>> = serde_json::from_str(raw)?;
    Ok(calls
        .unwrap_or_default()
        .into_iter()
        .map(|c| ToolCall {
            id: c.id,
            name: c.function.name,
            arguments: c.function.arguments,
        })
        .collect())
}

/// A parsed request: the top level and every message, as conversation items.
#[derive(Debug)]
pub struct Parsed<'a> {
    pub request: ChatRequest<'a>,
    pub messages: Vec<Item<'a>>,
}

#[derive(Debug, thiserror::Error)]
pub enum Unparseable {
    #[error("request body is not a chat request: {0}")]
    Body(serde_json::Error),
    #[error("message {index} is not understood: {error}")]
    Message {
        index: usize,
        error: serde_json::Error,
    },
}

/// The body parsed: its top level found by the validating pass (serde reads what that
/// leaves to it, and gives the errors), then every message read by its walk.
pub fn parse(body: &[u8]) -> Result<Parsed<'_>, Unparseable> {
    let by_serde = |body| super::from_body(body).map_err(Unparseable::Body);
    with_messages(super::read_top(body, request, by_serde)?)
}

/// [`parse`] with the top level read by serde alone: what the validating pass must agree
/// with (tests and fuzzing compare them).
#[doc(hidden)]
pub fn parse_by_serde(body: &[u8]) -> Result<Parsed<'_>, Unparseable> {
    with_messages(super::from_body(body).map_err(Unparseable::Body)?)
}

fn with_messages(request: ChatRequest<'_>) -> Result<Parsed<'_>, Unparseable> {
    let messages = request
        .messages
        .iter()
        .enumerate()
        .map(|(index, &raw)| item(raw).map_err(|error| Unparseable::Message { index, error }))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Parsed { request, messages })
}

/// The request as the validating pass found its top level; `None` for whatever serde
/// should read (its error is the one to give, or its reading the one to take).
pub(super) fn request<'a>(top: &json::Top<'a>) -> Option<ChatRequest<'a>> {
    let [
        model,
        messages,
        stream,
        stream_options,
        tools,
        tool_choice,
        functions,
        n,
    ] = top.fields([
        "model",
        "messages",
        "stream",
        "stream_options",
        "tools",
        "tool_choice",
        "functions",
        "n",
    ])?;
    Some(ChatRequest {
        model: json::optional_text(model)?,
        messages: messages?.elements?.to_vec(),
        stream: json::optional_flag(stream)?,
        stream_options: stream_options.map(|v| v.raw),
        tools: tools.map(|v| v.raw),
        tool_choice: json::optional_raw(tool_choice),
        functions: json::optional_raw(functions),
        n: json::optional_raw(n),
    })
}

owned_request!("chat completions");

/// For a streaming request that did not ask for `stream_options.include_usage`, the edit
/// that sets it to `true`, so abridge can read the usage the provider reports; `None`
/// when the body already asks for usage, is not streaming, or cannot be edited safely.
/// The caller then strips the usage the client did not ask for from the stream.
pub fn usage_edit(body: &[u8], request: &ChatRequest<'_>) -> Option<Edit> {
    if request.stream != Some(true) {
        return None;
    }
    match request.stream_options {
        None => {
            let open = body.iter().position(|b| !b.is_ascii_whitespace())?;
            (body[open] == b'{').then(|| Edit {
                span: open + 1..open + 1,
                bytes: br#""stream_options":{"include_usage":true},"#.to_vec(),
            })
        }
        Some(raw) => {
            let value: serde_json::Value = serde_json::from_str(raw.get()).ok()?;
            let bytes = match value {
                serde_json::Value::Null => br#"{"include_usage":true}"#.to_vec(),
                serde_json::Value::Object(mut options) => {
                    if options.get("include_usage") == Some(&serde_json::Value::Bool(true)) {
                        return None;
                    }
                    options.insert("include_usage".to_owned(), serde_json::Value::Bool(true));
                    serde_json::to_vec(&options).ok()?
                }
                // Not an object: the provider will reject it; leave it alone.
                _ => return None,
            };
            Some(Edit {
                span: span_of(body, raw.get())?,
                bytes,
            })
        }
    }
}

/// The edit that replaces the `messages` array with `messages` (each the raw JSON of one
/// message, spliced in as is). `None` if the request has no messages or the array cannot
/// be located.
pub fn messages_edit(body: &[u8], request: &ChatRequest<'_>, messages: &[Raw<'_>]) -> Option<Edit> {
    let first = span_of(body, request.messages.first()?.get())?;
    let last = span_of(body, request.messages.last()?.get())?;
    // Only whitespace may stand between the brackets and the first/last element.
    let open = body[..first.start]
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())?;
    let close = last.end
        + body[last.end..]
            .iter()
            .position(|b| !b.is_ascii_whitespace())?;
    if body[open] != b'[' || body[close] != b']' {
        return None;
    }
    Some(Edit {
        span: open..close + 1,
        bytes: array(messages),
    })
}

/// The body to send: `items` in place of the messages when given, and the ask for
/// usage when `ask_usage` and the client did not ask; `None` when nothing changes. The
/// flag says whether usage was asked for (the relay then strips it again).
pub fn outgoing(
    body: &Bytes,
    parsed: &Parsed<'_>,
    (items, tool): (Option<&[Raw<'_>]>, Option<Edit>),
    ask_usage: bool,
) -> (Option<Bytes>, bool) {
    let usage = ask_usage
        .then(|| usage_edit(body, &parsed.request))
        .flatten();
    let asked = usage.is_some();
    let mut edits: Vec<Edit> = usage.into_iter().collect();
    if let Some(items) = items {
        edits.extend(messages_edit(body, &parsed.request, items));
    }
    edits.extend(tool);
    let edited = apply(body, edits);
    let asked = asked && edited.is_some();
    (edited, asked)
}

#[cfg(test)]
mod tests;
