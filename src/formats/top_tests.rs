//! The top level of a body as the validating pass finds it, against serde's read of it:
//! every format reads the same request and items, or gives the same error.

use proptest::prelude::*;

use super::walk_check::{escaped_text, object, one_of};
use super::{chat, messages, responses};

/// Keys the formats read (one written with an escape), and one they do not.
const KEYS: &[&str] = &[
    "model",
    "m\\u006fdel",
    "messages",
    "m\\u0065ssages",
    "input",
    "\\u0069nput",
    "stream",
    "stream_options",
    "tools",
    "t\\u006fols",
    "tool_choice",
    "functions",
    "n",
    "metadata",
    "previous_response_id",
    "conversation",
    "context_management",
    "prompt_cache_key",
    "other",
];

/// Values of every type the formats' fields take, and of the types they refuse.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("null".to_owned()),
        Just("true".to_owned()),
        Just("false".to_owned()),
        Just("1".to_owned()),
        Just(r#""\ud800""#.to_owned()),
        Just("[]".to_owned()),
        Just(r#"[{"role":"user","content":"hi"}]"#.to_owned()),
        Just(r#"[{"role":"user","content":[{"type":"text","text":"a\nb"}]}, 2]"#.to_owned()),
        Just(
            r#"[{"type":"message","role":"user","content":[{"type":"input_text","text":"x"}]}]"#
                .to_owned()
        ),
        Just(r#"{"user_id":"u"}"#.to_owned()),
        Just(r#"{"user_id":1}"#.to_owned()),
        Just(r#"{"user_id":null}"#.to_owned()),
        Just("{}".to_owned()),
        Just(r#"{"user_id":"a","user_id":"b"}"#.to_owned()),
        Just(r#"{"user_id":"\ud800"}"#.to_owned()),
        Just(r#"{"user_\u0069d":"u"}"#.to_owned()),
        Just(r#"{"include_usage":true}"#.to_owned()),
        escaped_text(),
    ]
}

proptest! {
    /// Any body of the keys the formats read, duplicates and wrong types included: the
    /// validating pass's read is serde's, for all three formats.
    #[test]
    fn every_format_reads_the_top_as_serde_does(
        members in prop::collection::vec((one_of(KEYS), value()), 0..7),
        pad in "[ \n]{0,2}",
    ) {
        let body = format!("{pad}{}{pad}", object(&members));
        let body = body.as_bytes();
        prop_assert_eq!(
            format!("{:?}", chat::parse(body)),
            format!("{:?}", chat::parse_by_serde(body)),
            "{}", String::from_utf8_lossy(body)
        );
        prop_assert_eq!(
            format!("{:?}", responses::parse(body)),
            format!("{:?}", responses::parse_by_serde(body)),
            "{}", String::from_utf8_lossy(body)
        );
        prop_assert_eq!(
            format!("{:?}", messages::parse(body)),
            format!("{:?}", messages::parse_by_serde(body)),
            "{}", String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn bodies_serde_refuses_get_serde_s_error() {
    for body in [
        &b"{\"messages\":[],\"model\":\"a\",\"model\":\"b\"}"[..],
        b"{\"messages\":[1,]}",
        b"{\"messages\":[],\"stream\":\"yes\"}",
        b"[1]",
        b"{\"messages\":[\xff]}",
        b"",
    ] {
        let serde = format!("{:?}", chat::parse_by_serde(body));
        assert!(serde.starts_with("Err"), "{serde}");
        assert_eq!(format!("{:?}", chat::parse(body)), serde);
    }
}

/// The bodies real clients send take the validating pass's path, not serde's (both read
/// them alike, so only this shows the pass is used at all).
#[test]
fn the_bodies_clients_send_take_the_pass() {
    let top = |body: &'static str| crate::json::top(body).unwrap();
    let chat = r#"{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},
        "messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}],
        "tools":[{"type":"function","function":{"name":"f","parameters":{}}}]}"#;
    let request = chat::request(&top(chat)).unwrap();
    assert_eq!(request.messages.len(), 2);
    assert_eq!(request.stream, Some(true));
    let codex = r#"{"model":"gpt-5","store":false,"stream":true,"prompt_cache_key":"t-1",
        "input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]},
        {"type":"function_call","call_id":"c1","name":"exec","arguments":"{}"}],
        "tools":[],"tool_choice":"auto"}"#;
    let (fields, items) = responses::walked(&top(codex)).unwrap();
    assert_eq!(
        (items.len(), fields.prompt_cache_key.as_deref()),
        (2, Some("t-1"))
    );
    let claude = r#"{"model":"claude-sonnet-4-5","max_tokens":1024,"system":[{"type":"text","text":"x"}],
        "messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],
        "metadata":{"user_id":"{\"session_id\":\"s\"}"},"stream":true}"#;
    let (fields, items) = messages::walked(&top(claude)).unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(
        fields.metadata.and_then(|m| m.user_id).as_deref(),
        Some(r#"{"session_id":"s"}"#)
    );
}
