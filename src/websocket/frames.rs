//! The text of the frames, as far as the session needs it: a client frame's
//! `response.create` request (the frame less its `type`: a Responses request body) and
//! the frame that carries it back after a rewrite, and what a provider's terminal event
//! (`response.completed`, `.incomplete`, `.failed`, a wrapped `error`) says.

use std::fmt;

use bytes::Bytes;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::relay::End;
use crate::relay::usage::{RawUsage, Usage};

/// The `type` of the frames whose request abridge reads.
const CREATE: &str = "response.create";

/// An object's members in order, each value as its raw JSON.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Walk;
        impl<'de> Visitor<'de> for Walk {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, &'de RawValue>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Walk)
    }
}

/// The request of a `response.create` frame: its members but `type`, in order, their
/// values byte for byte; `None` for any other frame (or one that is not a JSON object).
pub fn request(frame: &str) -> Option<Bytes> {
    let Members(members) = serde_json::from_str(frame).ok()?;
    let create = format!("\"{CREATE}\"");
    if !members
        .iter()
        .any(|(key, value)| key == "type" && value.get() == create)
    {
        return None;
    }
    let mut body = String::with_capacity(frame.len());
    body.push('{');
    for (key, value) in members.iter().filter(|(key, _)| key != "type") {
        if body.len() > 1 {
            body.push(',');
        }
        body.push_str(&serde_json::to_string(key).ok()?);
        body.push(':');
        body.push_str(value.get());
    }
    body.push('}');
    Some(Bytes::from(body))
}

/// The `response.create` frame that carries `body` (a JSON object, as [`request`] and
/// the rewrite make it).
pub fn reframe(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?.trim_start();
    let rest = text.strip_prefix('{')?;
    let comma = if rest.trim_start().starts_with('}') {
        ""
    } else {
        ","
    };
    Some(format!("{{\"type\":\"{CREATE}\"{comma}{rest}"))
}

#[derive(serde::Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(default)]
    response: Option<Inner>,
}

#[derive(serde::Deserialize)]
struct Inner {
    #[serde(default)]
    usage: Option<RawUsage>,
}

/// How a provider's event ends the answer in flight, and its usage; `None` for an event
/// that does not end one.
pub fn terminal(event: &str) -> Option<(Option<Usage>, End)> {
    // Most events are deltas: a byte search spares them the parse.
    let ends = [
        "response.completed",
        "response.incomplete",
        "response.failed",
        "error",
    ];
    if !ends
        .iter()
        .any(|end| memchr::memmem::find(event.as_bytes(), end.as_bytes()).is_some())
    {
        return None;
    }
    let event: Event<'_> = serde_json::from_str(event).ok()?;
    let usage = || event.response.and_then(|r| r.usage?.normalise());
    match &*event.kind {
        "response.completed" | "response.incomplete" => Some((usage(), End::Complete)),
        "response.failed" => Some((usage(), End::UpstreamError)),
        "error" => Some((None, End::UpstreamError)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_frame_is_its_request_less_the_type_and_back() {
        let frame = r#"{"type":"response.create", "model":"gpt-5","input":[{"role":"user","content":"hi \"x\""}],"a\nb":1}"#;
        let body = request(frame).unwrap();
        assert_eq!(
            &body[..],
            br#"{"model":"gpt-5","input":[{"role":"user","content":"hi \"x\""}],"a\nb":1}"#
        );
        let again = reframe(&body).unwrap();
        let (a, b): (serde_json::Value, serde_json::Value) = (
            serde_json::from_str(frame).unwrap(),
            serde_json::from_str(&again).unwrap(),
        );
        assert_eq!(a, b);
        assert_eq!(reframe(b"{}").unwrap(), r#"{"type":"response.create"}"#);
        assert_eq!(
            request(r#"{"type":"response.processed","response_id":"r"}"#),
            None
        );
        assert_eq!(request("[1]"), None);
        assert_eq!(request("not json"), None);
    }

    #[test]
    fn terminal_events_end_an_answer_with_their_usage() {
        let completed = r#"{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":120,"input_tokens_details":{"cached_tokens":100},"output_tokens":7}}}"#;
        let (usage, end) = terminal(completed).unwrap();
        let usage = usage.unwrap();
        assert_eq!(end, End::Complete);
        assert_eq!(usage.prompt_tokens, 120);
        assert_eq!(usage.cached_tokens, Some(100));
        assert_eq!(
            terminal(r#"{"type":"error","status":400,"error":{"message":"m"}}"#),
            Some((None, End::UpstreamError))
        );
        assert_eq!(
            terminal(r#"{"type":"response.output_text.delta","delta":"an error"}"#),
            None
        );
        assert_eq!(terminal(r#"{"type":"response.created"}"#), None);
    }
}
