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
use std::ops::Range;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;

#[derive(Debug, Deserialize)]
pub struct ChatRequest<'a> {
    #[serde(borrow, default)]
    pub model: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub messages: Vec<&'a RawValue>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// `Some` whenever the key is present, `null` included (to edit it in place).
    #[serde(borrow, default, deserialize_with = "present")]
    pub stream_options: Option<&'a RawValue>,
}

/// `Some(raw)` for any present value, `null` included (serde maps `null` to `None`).
fn present<'de: 'a, 'a, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<&'a RawValue>, D::Error> {
    <&'a RawValue>::deserialize(d).map(Some)
}

/// One message: its raw JSON, which is what is forwarded when the message is kept, and a
/// typed view of the fields abridge reads. Content and tool calls stay raw until asked
/// for ([`Message::content`], [`Message::tool_calls`]).
#[derive(Debug, Clone)]
pub struct Message<'a> {
    pub raw: &'a RawValue,
    pub role: Role,
    /// `None` when absent or `null`.
    pub content: Option<&'a RawValue>,
    pub name: Option<Cow<'a, str>>,
    pub tool_calls: Option<&'a RawValue>,
    pub tool_call_id: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct MessageFields<'a> {
    role: Role,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_call_id: Option<Cow<'a, str>>,
}

impl<'a> Message<'a> {
    pub fn parse(raw: &'a RawValue) -> Result<Self, serde_json::Error> {
        let f: MessageFields<'a> = serde_json::from_str(raw.get())?;
        Ok(Self {
            raw,
            role: f.role,
            content: f.content,
            name: f.name,
            tool_calls: f.tool_calls,
            tool_call_id: f.tool_call_id,
        })
    }

    /// The content, parsed. Shapes abridge does not know are [`Content::Other`].
    pub fn content(&self) -> Content<'a> {
        let Some(raw) = self.content else {
            return Content::None;
        };
        let text = raw.get();
        match text.as_bytes().first() {
            Some(b'"') => match unescaped(text) {
                Some(s) => Content::Text(Cow::Borrowed(s)),
                None => match serde_json::from_str::<Cow<'a, str>>(text) {
                    Ok(s) => Content::Text(s),
                    Err(_) => Content::Other(raw),
                },
            },
            Some(b'[') => match serde_json::from_str::<Vec<&'a RawValue>>(text) {
                Ok(parts) => Content::Parts(parts.into_iter().map(Part::parse).collect()),
                Err(_) => Content::Other(raw),
            },
            _ => Content::Other(raw),
        }
    }

    /// The assistant's tool calls (empty when there are none).
    pub fn tool_calls(&self) -> Result<Vec<ToolCall<'a>>, serde_json::Error> {
        let Some(raw) = self.tool_calls else {
            return Ok(Vec::new());
        };
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
        let calls: Option<Vec<Call<'a>>> = serde_json::from_str(raw.get())?;
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
}

/// The text of a JSON string (`raw`, quotes included, already validated by the parse it
/// was borrowed from) when it has no escape: the bytes between the quotes, with no
/// second pass of the JSON parser. `None` when it must be unescaped.
fn unescaped(raw: &str) -> Option<&str> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    memchr::memchr(b'\\', inner.as_bytes())
        .is_none()
        .then_some(inner)
}

/// A message's content.
#[derive(Debug, Clone)]
pub enum Content<'a> {
    /// Absent or `null` (e.g. an assistant message that only calls tools).
    None,
    Text(Cow<'a, str>),
    Parts(Vec<Part<'a>>),
    /// Any other JSON value; forwarded as is.
    Other(&'a RawValue),
}

/// One element of a content array.
#[derive(Debug, Clone)]
pub enum Part<'a> {
    /// `{"type":"text","text":...}`
    Text(Cow<'a, str>),
    /// Images, audio, files, refusals...: kept raw.
    Other(&'a RawValue),
}

impl PartialEq for Part<'_> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Part::Text(a), Part::Text(b)) => a == b,
            (Part::Other(a), Part::Other(b)) => a.get() == b.get(),
            _ => false,
        }
    }
}

impl PartialEq for Content<'_> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Content::None, Content::None) => true,
            (Content::Text(a), Content::Text(b)) => a == b,
            (Content::Parts(a), Content::Parts(b)) => a == b,
            (Content::Other(a), Content::Other(b)) => a.get() == b.get(),
            _ => false,
        }
    }
}

impl<'a> Part<'a> {
    fn parse(raw: &'a RawValue) -> Self {
        #[derive(Deserialize)]
        struct Fields<'a> {
            #[serde(borrow, rename = "type")]
            kind: Cow<'a, str>,
            #[serde(borrow, default)]
            text: Option<Cow<'a, str>>,
        }
        match serde_json::from_str::<Fields<'a>>(raw.get()) {
            Ok(Fields {
                kind,
                text: Some(text),
            }) if kind == "text" => Part::Text(text),
            _ => Part::Other(raw),
        }
    }
}

impl<'a> Content<'a> {
    /// The text when the content is only text: a string, or an array whose parts are all
    /// text (concatenated, as providers read them). `None` for anything else.
    pub fn as_text(&self) -> Option<Cow<'a, str>> {
        match self {
            Content::Text(s) => Some(s.clone()),
            Content::Parts(parts) => {
                let mut out = String::new();
                for part in parts {
                    match part {
                        Part::Text(t) => out.push_str(t),
                        Part::Other(_) => return None,
                    }
                }
                Some(Cow::Owned(out))
            }
            Content::None | Content::Other(_) => None,
        }
    }

    /// All the text, non-text parts left out, parts separated by newlines: for
    /// summaries and token estimates.
    pub fn text_lossy(&self) -> Cow<'a, str> {
        match self {
            Content::Text(s) => s.clone(),
            Content::Parts(parts) => {
                let texts: Vec<&str> = parts
                    .iter()
                    .filter_map(|p| match p {
                        Part::Text(t) => Some(t.as_ref()),
                        Part::Other(_) => None,
                    })
                    .collect();
                Cow::Owned(texts.join("\n"))
            }
            Content::None | Content::Other(_) => Cow::Borrowed(""),
        }
    }
}

/// One tool call of an assistant message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall<'a> {
    pub id: Cow<'a, str>,
    pub name: Cow<'a, str>,
    /// The arguments as the model wrote them (a JSON document in a string).
    pub arguments: Cow<'a, str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
    /// The deprecated predecessor of `tool`.
    Function,
}

/// A parsed request: the top level and every message.
#[derive(Debug)]
pub struct Parsed<'a> {
    pub request: ChatRequest<'a>,
    pub messages: Vec<Message<'a>>,
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

pub fn parse(body: &[u8]) -> Result<Parsed<'_>, Unparseable> {
    let request: ChatRequest<'_> = serde_json::from_slice(body).map_err(Unparseable::Body)?;
    let messages = request
        .messages
        .iter()
        .enumerate()
        .map(|(index, raw)| {
            Message::parse(raw).map_err(|error| Unparseable::Message { index, error })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Parsed { request, messages })
}

/// One change to a body: the bytes at `span` (of the original body) become `bytes`.
/// Edits computed from one parse never overlap; [`apply`] makes them in one copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    pub span: Range<usize>,
    pub bytes: Vec<u8>,
}

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
pub fn messages_edit(
    body: &[u8],
    request: &ChatRequest<'_>,
    messages: &[&RawValue],
) -> Option<Edit> {
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
    let mut array =
        Vec::with_capacity(2 + messages.iter().map(|m| m.get().len() + 1).sum::<usize>());
    array.push(b'[');
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            array.push(b',');
        }
        array.extend_from_slice(m.get().as_bytes());
    }
    array.push(b']');
    Some(Edit {
        span: open..close + 1,
        bytes: array,
    })
}

/// `body` with `edits` made, in one copy. `None` when there is nothing to change, or the
/// edits overlap (they never do when computed from one parse; nothing is risked if so).
pub fn apply(body: &[u8], mut edits: Vec<Edit>) -> Option<Bytes> {
    if edits.is_empty() {
        return None;
    }
    edits.sort_by_key(|e| e.span.start);
    if edits.windows(2).any(|w| w[0].span.end > w[1].span.start)
        || edits.iter().any(|e| e.span.end > body.len())
    {
        return None;
    }
    let size = body.len() + edits.iter().map(|e| e.bytes.len()).sum::<usize>()
        - edits.iter().map(|e| e.span.len()).sum::<usize>();
    let mut out = BytesMut::with_capacity(size);
    let mut at = 0;
    for e in &edits {
        out.extend_from_slice(&body[at..e.span.start]);
        out.extend_from_slice(&e.bytes);
        at = e.span.end;
    }
    out.extend_from_slice(&body[at..]);
    Some(out.freeze())
}

/// Where `part` (a slice borrowed from `body`) lies in `body`.
pub fn span_of(body: &[u8], part: &str) -> Option<Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= body.len()).then_some(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage_body(body: &str) -> Option<String> {
        let bytes = Bytes::copy_from_slice(body.as_bytes());
        let parsed = parse(&bytes).unwrap();
        let edit = usage_edit(&bytes, &parsed.request)?;
        apply(&bytes, vec![edit]).map(|b| String::from_utf8(b.to_vec()).unwrap())
    }

    #[test]
    fn parses_and_keeps_the_raw_messages() {
        let body = br#"{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},
            {"role":"user","content":[{"type":"text","text":"hi"}],"x_vendor":1},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"ok"}],"temperature":0.2,"unknown":{"a":[1,2]}}"#;
        let parsed = parse(body).unwrap();
        assert_eq!(parsed.request.model.as_deref(), Some("gpt-4o"));
        assert_eq!(parsed.messages.len(), 4);
        assert_eq!(parsed.messages[1].role, Role::User);
        assert!(parsed.request.messages[1].get().contains("x_vendor"));
        assert_eq!(parsed.messages[3].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(
            parsed.messages[1].raw.get(),
            parsed.request.messages[1].get()
        );
        let calls = parsed.messages[2].tool_calls().unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(
            (
                calls[0].id.as_ref(),
                calls[0].name.as_ref(),
                calls[0].arguments.as_ref()
            ),
            ("c1", "f", "{}")
        );
        assert_eq!(parsed.messages[2].content(), Content::None);
        assert!(parsed.messages[3].tool_calls().unwrap().is_empty());
    }

    #[test]
    fn content_views() {
        let body = br#"{"messages":[
            {"role":"user","content":"a\nb"},
            {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"\nb"}]},
            {"role":"user","content":[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"data:x"}}]},
            {"role":"user","content":42}]}"#;
        let parsed = parse(body).unwrap();
        let c: Vec<Content<'_>> = parsed.messages.iter().map(Message::content).collect();
        assert_eq!(c[0].as_text().as_deref(), Some("a\nb"));
        assert_eq!(
            c[1].as_text(),
            c[0].as_text(),
            "text parts read as the equal string"
        );
        assert_eq!(c[2].as_text(), None);
        assert_eq!(c[2].text_lossy(), "see");
        assert!(matches!(c[3], Content::Other(_)));
        assert!(matches!(&c[2], Content::Parts(p) if matches!(p[1], Part::Other(_))));
    }

    proptest::proptest! {
        /// The escape-free fast path reads the same text as the JSON parser.
        #[test]
        fn string_content_reads_as_the_parser_reads_it(text in "(?s).{0,40}") {
            let body = serde_json::json!({"messages": [{"role": "user", "content": text}]}).to_string();
            let parsed = parse(body.as_bytes()).unwrap();
            let read = parsed.messages[0].content().as_text();
            proptest::prop_assert_eq!(read.as_deref(), Some(text.as_str()));
            let raw = parsed.messages[0].content.unwrap().get();
            proptest::prop_assert_eq!(unescaped(raw).is_some(), !raw.contains('\\'));
        }
    }

    #[test]
    fn bad_bodies_are_unparseable() {
        for body in [
            &b"not json"[..],
            br#"{"messages":"hi"}"#,
            br#"{"model":"m"}"#,
            br#"[1,2]"#,
            br#"{"messages":[{"role":"wizard","content":"x"}]}"#,
            br#"{"messages":[{"content":"no role"}]}"#,
        ] {
            assert!(parse(body).is_err(), "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn absurd_nesting_never_overflows_the_stack() {
        let depth = 2_000_000;
        let nest = |inner: &str| format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth));
        // As a message: not understood.
        let as_message = format!(r#"{{"messages":{}}}"#, nest(""));
        assert!(parse(as_message.as_bytes()).is_err());
        // In a field abridge does not read: skipped without recursion, kept in the bytes.
        let in_field = format!(
            r#"{{"messages":[{{"role":"user","content":{}}}],"x":{}}}"#,
            nest("1"),
            nest("2")
        );
        let parsed = parse(in_field.as_bytes()).unwrap();
        assert_eq!(parsed.messages.len(), 1);
    }

    #[test]
    fn messages_are_replaced_and_everything_else_kept() {
        let body = br#"{"model":"m", "messages" : [ {"role":"system","content":"s"} ,{"role":"user","content":"u1"},
            {"role":"user","content":"u2"} ] ,"tools":[{"type":"function"}],"x":1}"#;
        let parsed = parse(body).unwrap();
        let keep = [parsed.request.messages[0], parsed.request.messages[2]];
        let out = apply(
            body,
            vec![messages_edit(body, &parsed.request, &keep).unwrap()],
        )
        .unwrap();
        let text = String::from_utf8(out.to_vec()).unwrap();
        assert_eq!(
            text,
            r#"{"model":"m", "messages" : [{"role":"system","content":"s"},{"role":"user","content":"u2"}] ,"tools":[{"type":"function"}],"x":1}"#
        );
        // Unchanged messages give the same messages back.
        let again = parse(&out).unwrap();
        assert_eq!(again.messages.len(), 2);
        let none = parse(br#"{"messages":[]}"#).unwrap();
        assert!(messages_edit(br#"{"messages":[]}"#, &none.request, &keep).is_none());
    }

    #[test]
    fn both_edits_apply_together_at_their_original_spans() {
        let body = br#"{"stream":true,"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}],"stream_options":{"x":1}}"#;
        let parsed = parse(body).unwrap();
        let keep = [parsed.request.messages[1]];
        let edits = vec![
            usage_edit(body, &parsed.request).unwrap(),
            messages_edit(body, &parsed.request, &keep).unwrap(),
        ];
        let out = apply(body, edits).unwrap();
        assert_eq!(
            String::from_utf8(out.to_vec()).unwrap(),
            r#"{"stream":true,"messages":[{"role":"user","content":"b"}],"stream_options":{"include_usage":true,"x":1}}"#
        );
        let overlapping = vec![
            Edit {
                span: 0..5,
                bytes: vec![],
            },
            Edit {
                span: 3..8,
                bytes: vec![],
            },
        ];
        assert!(apply(body, overlapping).is_none());
        assert!(apply(body, vec![]).is_none());
    }

    #[test]
    fn include_usage_is_added_only_when_streaming_without_it() {
        let msgs = r#""messages":[{"role":"user","content":"hi"}]"#;
        assert_eq!(usage_body(&format!("{{{msgs}}}")), None);
        assert_eq!(usage_body(&format!("{{{msgs},\"stream\":false}}")), None);
        assert_eq!(
            usage_body(&format!(" {{{msgs},\"stream\":true}}")).unwrap(),
            format!(" {{\"stream_options\":{{\"include_usage\":true}},{msgs},\"stream\":true}}")
        );
        assert_eq!(
            usage_body(&format!(
                "{{{msgs},\"stream\":true,\"stream_options\":{{\"include_usage\":true}}}}"
            )),
            None
        );
        let edited = usage_body(&format!(
            "{{{msgs},\"stream\":true,\"stream_options\":{{\"include_usage\":false,\"x\":1}},\"z\":2}}"
        ))
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&edited).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["stream_options"]["x"], 1);
        assert_eq!(v["z"], 2);
        assert!(edited.starts_with(&format!("{{{msgs},\"stream\":true,\"stream_options\":")));
        let null = usage_body(&format!(
            "{{{msgs},\"stream\":true,\"stream_options\":null}}"
        ))
        .unwrap();
        assert!(
            null.ends_with(r#""stream_options":{"include_usage":true}}"#),
            "{null}"
        );
        assert_eq!(
            usage_body(&format!(
                "{{{msgs},\"stream\":true,\"stream_options\":\"x\"}}"
            )),
            None
        );
    }
}
