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
    "input",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "functions",
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
