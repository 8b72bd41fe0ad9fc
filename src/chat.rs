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

/// A typed view of one message; the message itself stays in its raw form.
#[derive(Debug, Deserialize)]
pub struct Message<'a> {
    pub role: Role,
    #[serde(borrow, default)]
    pub content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub tool_calls: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub tool_call_id: Option<Cow<'a, str>>,
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

/// A parsed request: the top level and a typed view of every message.
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
            serde_json::from_str::<Message<'_>>(raw.get())
                .map_err(|error| Unparseable::Message { index, error })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Parsed { request, messages })
}

/// For a streaming request that did not ask for `stream_options.include_usage`, the body
/// with it set to `true`, so abridge can read the usage the provider reports; `None`
/// when the body already asks for usage, is not streaming, or cannot be edited safely.
/// The caller then strips the usage the client did not ask for from the stream.
pub fn with_usage_requested(body: &Bytes, request: &ChatRequest<'_>) -> Option<Bytes> {
    if request.stream != Some(true) {
        return None;
    }
    match request.stream_options {
        None => {
            let open = body.iter().position(|b| !b.is_ascii_whitespace())?;
            (body[open] == b'{').then(|| {
                splice(
                    body,
                    open + 1..open + 1,
                    br#""stream_options":{"include_usage":true},"#,
                )
            })
        }
        Some(raw) => {
            let value: serde_json::Value = serde_json::from_str(raw.get()).ok()?;
            let replacement = match value {
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
            let span = span_of(body, raw.get())?;
            Some(splice(body, span, &replacement))
        }
    }
}

/// Where `part` (a slice borrowed from `body`) lies in `body`.
pub fn span_of(body: &[u8], part: &str) -> Option<Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= body.len()).then_some(start..end)
}

/// `body` with `span` replaced by `replacement`.
pub fn splice(body: &[u8], span: Range<usize>, replacement: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(body.len() - span.len() + replacement.len());
    out.extend_from_slice(&body[..span.start]);
    out.extend_from_slice(replacement);
    out.extend_from_slice(&body[span.end..]);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage_body(body: &str) -> Option<String> {
        let bytes = Bytes::copy_from_slice(body.as_bytes());
        let parsed = parse(&bytes).unwrap();
        with_usage_requested(&bytes, &parsed.request)
            .map(|b| String::from_utf8(b.to_vec()).unwrap())
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
        assert!(parsed.messages[2].tool_calls.is_some());
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
