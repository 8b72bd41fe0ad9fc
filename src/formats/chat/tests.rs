//! The chat format's parse, views, edits and walk-vs-serde properties.

use super::*;
use crate::conversation::Part;

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
    assert_eq!(parsed.messages[3].results, ["c1"]);
    assert_eq!(
        parsed.messages[1].raw.get(),
        parsed.request.messages[1].get()
    );
    let calls = &parsed.messages[2].calls;
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (
            calls[0].id.as_ref(),
            calls[0].name.as_ref(),
            calls[0].arguments.as_ref()
        ),
        ("c1", "f", "{}")
    );
    assert_eq!(parsed.messages[2].content, Content::None);
    assert!(parsed.messages[3].calls.is_empty());
    // A tool_calls shape abridge does not know is kept for identity, not dropped.
    let odd = parse(br#"{"messages":[{"role":"assistant","tool_calls":{"x":1}}]}"#).unwrap();
    assert!(odd.messages[0].calls.is_empty());
    assert_eq!(odd.messages[0].extra.map(|r| r.get()), Some(r#"{"x":1}"#));
}

#[test]
fn content_views() {
    let body = br#"{"messages":[
        {"role":"user","content":"a\nb"},
        {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"\nb"}]},
        {"role":"user","content":[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"data:x"}}]},
        {"role":"user","content":42}]}"#;
    let parsed = parse(body).unwrap();
    let c: Vec<Content<'_>> = parsed.messages.iter().map(|m| m.content.clone()).collect();
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
        let read = parsed.messages[0].content.as_text();
        proptest::prop_assert_eq!(read.as_deref(), Some(text.as_str()));
        // Borrowed from the body exactly when there was no escape to decode.
        let borrowed = matches!(parsed.messages[0].content, Content::Text(Cow::Borrowed(_)));
        proptest::prop_assert_eq!(borrowed, !body.contains("\\"));
    }
}

/// A value of a message field, in the shapes clients send and a few they should not.
fn field_value() -> impl proptest::strategy::Strategy<Value = String> {
    use crate::formats::walk_check::{escaped_text, one_of};
    use proptest::prelude::*;
    prop_oneof![
        one_of(&[
            "null",
            "42",
            r#"{"user":null}"#,
            r#""\ud800""#,
            r#"{"x":[1,{"y":"]}"}]}"#
        ])
        .prop_map(str::to_owned),
        one_of(&["user", "assistant", "tool", "wizard", "us\\u0065r"])
            .prop_map(|r| format!("\"{r}\"")),
        escaped_text(),
        Just(
            r#"[{"type":"text","text":"a\nb"},{"type":"image_url","image_url":{"url":"x"}}]"#
                .to_owned()
        ),
        Just(
            r#"[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]"#
                .to_owned()
        ),
        tool_calls(),
    ]
}

/// A `tool_calls` array: calls whose fields are well formed, escaped, missing, `null`,
/// of another type or duplicated, and elements that are not calls.
fn tool_calls() -> impl proptest::strategy::Strategy<Value = String> {
    use crate::formats::walk_check::{escaped_text, object, one_of};
    use proptest::prelude::*;
    let value = || {
        prop_oneof![
            3 => escaped_text(),
            1 => one_of(&["null", "7", r#"["f","{}"]"#, r#""\ud800""#]).prop_map(str::to_owned),
        ]
    };
    let function = proptest::collection::vec(
        (one_of(&["name", "arguments", "n\\u0061me", "x"]), value()),
        0..4,
    )
    .prop_map(|members| object(&members));
    let function = prop_oneof![
        4 => function,
        1 => one_of(&["null", r#"["f","{}"]"#]).prop_map(str::to_owned),
    ];
    let call = (
        proptest::collection::vec((one_of(&["id", "type", "i\\u0064"]), value()), 0..3),
        function,
    )
        .prop_map(|(mut members, function)| {
            members.push(("function", function));
            object(&members)
        });
    let element = prop_oneof![
        6 => call,
        1 => one_of(&["1", "null", "[]"]).prop_map(str::to_owned),
    ];
    proptest::collection::vec(element, 0..3).prop_map(|calls| format!("[{}]", calls.join(" , ")))
}

proptest::proptest! {
    /// The walk reads every message as serde reads it: the same item, or the same
    /// refusal — whatever the fields hold, duplicated, escaped or spaced.
    #[test]
    fn the_walk_reads_messages_as_serde_does(
        members in proptest::collection::vec(
            (
                crate::formats::walk_check::one_of(&[
                    "role", "content", "name", "tool_calls", "tool_call_id", "x_vendor",
                    "r\\u006fle",
                ]),
                field_value(),
                "[ \n]{0,1}",
            ),
            0..6,
        ),
    ) {
        // Spaces around values: the walk skips what serde skips.
        let spaced: Vec<(&str, String)> = members
            .iter()
            .map(|(key, value, space)| (*key, format!("{space}{value}{space}")))
            .collect();
        let text = crate::formats::walk_check::object(&spaced);
        crate::formats::walk_check::agree(&text, item, item_by_serde)?;
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
fn bytes_that_are_not_utf8_are_read_as_serde_reads_them() {
    // In a field abridge skips, serde does not check them: the body is understood.
    let skipped = b"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"x\":\"\xff\"}";
    assert!(serde_json::from_slice::<ChatRequest<'_>>(skipped).is_ok());
    assert_eq!(parse(skipped).unwrap().messages.len(), 1);
    // In a message, handed over as raw JSON text, they are refused.
    let in_message = b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}";
    assert!(serde_json::from_slice::<ChatRequest<'_>>(in_message).is_err());
    assert!(matches!(parse(in_message), Err(Unparseable::Body(_))));
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
