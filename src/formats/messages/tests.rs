use super::*;
use crate::conversation::{Content, Part, Role};
use crate::json::Raw;

const BODY: &str = r#"{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":true,
    "system":[{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}],
    "messages":[
    {"role":"user","content":[{"type":"text","text":"Fix the build"}]},
    {"role":"system","content":"<env>cwd: /srv/app</env>"},
    {"role":"assistant","content":[{"type":"thinking","thinking":"Look first.","signature":"sig1"},
        {"type":"text","text":"Reading."},
        {"type":"tool_use","id":"toolu_1","name":"Read","input":{"path":"a.rs"}}]},
    {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"fn main() {}","cache_control":{"type":"ephemeral"}}]},
    {"role":"assistant","content":"Done."},
    {"role":"user","content":"Thanks"}],
    "metadata":{"user_id":"{\"session_id\":\"s-1\"}"}}"#;

#[test]
fn messages_have_their_neutral_view() {
    let parsed = parse(BODY.as_bytes()).unwrap();
    let items = &parsed.items;
    assert_eq!(items.len(), 6);
    assert!(items[0].is_ask());
    assert_eq!(items[0].content.as_text().as_deref(), Some("Fix the build"));
    assert!(
        items[1].is_instruction(),
        "a system message inside messages"
    );
    assert_eq!(items[2].calls[0].id, "toolu_1");
    assert_eq!(items[2].calls[0].arguments, r#"{"path":"a.rs"}"#);
    assert!(
        matches!(&items[2].content, Content::Parts(p) if matches!(p[0], Part::Other(_))),
        "thinking is kept raw"
    );
    assert_eq!(items[3].results, ["toolu_1"]);
    assert!(items[3].is_result() && !items[3].is_ask());
    assert_eq!(items[3].content.as_text().as_deref(), Some("fn main() {}"));
    assert!(items[5].is_ask());
    assert_eq!(
        parsed.fields.metadata.and_then(|m| m.user_id).as_deref(),
        Some(r#"{"session_id":"s-1"}"#)
    );
}

#[test]
fn a_moved_cache_breakpoint_does_not_change_the_view() {
    let with = r#"{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}"#;
    let without = r#"{"role":"user","content":[{"type":"text","text":"hi"}]}"#;
    let raw = |s: &str| RawValue::from_string(s.to_owned()).unwrap();
    let (a, b) = (raw(with), raw(without));
    let (a, b) = (item(Raw::from(&*a)).unwrap(), item(Raw::from(&*b)).unwrap());
    assert_eq!(a.content, b.content);
    assert_eq!(
        crate::identity::hash_message(&a),
        crate::identity::hash_message(&b)
    );
}

#[test]
fn spliced_messages_alternate_and_everything_else_is_kept() {
    let body = Bytes::from_static(BODY.as_bytes());
    let parsed = parse(&body).unwrap();
    let raw: Vec<Raw<'_>> = parsed.items.iter().map(|i| i.raw).collect();
    let summary = authored(Author::System, "[summary]");
    // Head (user, system), the summary, then the last assistant answer and the ask.
    let kept = [raw[0], raw[1], Raw::from(&*summary), raw[4], raw[5]];
    let out = with_messages(&body, &parsed, &kept).unwrap();
    let text = std::str::from_utf8(&out).unwrap();
    assert!(text.starts_with(r#"{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":true,"#));
    assert!(text.ends_with(r#""metadata":{"user_id":"{\"session_id\":\"s-1\"}"}}"#));
    let again = parse(&out).unwrap();
    let roles: Vec<Role> = again.items.iter().map(|i| i.role).collect();
    use Role::{Assistant as A, System as S, User as U};
    // user, system, [assistant filler], summary (user), assistant, user.
    assert_eq!(roles, [U, S, A, U, A, U]);
    assert_eq!(
        again.items[3].content.as_text().as_deref(),
        Some("[summary]")
    );

    // A summary after a tool result and before the ask: a filler on both sides.
    let kept = [raw[0], raw[1], raw[2], raw[3], Raw::from(&*summary), raw[5]];
    let again = with_messages(&body, &parsed, &kept).unwrap();
    let roles: Vec<Role> = parse(&again)
        .unwrap()
        .items
        .iter()
        .map(|i| i.role)
        .collect();
    assert_eq!(roles, [U, S, A, U, A, U, A, U]);

    // A conversation that would start with abridge's message of the assistant role
    // never does; the client's own consecutive turns are left as they were.
    let kept = [raw[4], raw[4], raw[5]];
    let again = with_messages(&body, &parsed, &kept).unwrap();
    let roles: Vec<Role> = parse(&again)
        .unwrap()
        .items
        .iter()
        .map(|i| i.role)
        .collect();
    assert_eq!(roles, [U, A, A, U]);
}

#[test]
fn provider_managed_context_is_left_alone() {
    let managed = |body: &str| untouchable(&parse(body.as_bytes()).unwrap()).is_some();
    assert!(managed(
        r#"{"messages":[],"context_management":{"edits":[{"type":"clear_tool_uses_20250919"}]}}"#
    ));
    assert!(managed(
        r#"{"messages":[],"context_management":{"edits":[{"type":"compact_20260112"}]}}"#
    ));
    assert!(managed(
        r#"{"messages":[],"context_management":{"edits":[{"type":"clear_thinking_20251015","keep":{"type":"thinking_turns","value":1}}]}}"#
    ));
    assert!(managed(
        r#"{"messages":[],"context_management":"something new"}"#
    ));
    // What Claude Code sends on every request: keep all thinking, i.e. no edit.
    assert!(!managed(
        r#"{"messages":[],"context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]}}"#
    ));
    assert!(!managed(r#"{"messages":[],"context_management":null}"#));
    assert!(!managed(r#"{"messages":[]}"#));
}

#[test]
fn bytes_that_are_not_utf8_are_read_as_serde_reads_them() {
    // Skipped by serde (a field abridge does not read): understood.
    let skipped = b"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"x_vendor\":\"\xff\"}";
    assert_eq!(parse(skipped).unwrap().items.len(), 1);
    // In a message: refused.
    let in_message = b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}";
    assert!(parse(in_message).is_err());
}

#[test]
fn unknown_roles_and_shapes_are_not_understood() {
    assert!(parse(br#"{"messages":[{"role":"tool","content":"x"}]}"#).is_err());
    assert!(parse(br#"{"messages":"hi"}"#).is_err());
    assert!(parse(br#"{"messages":[{"role":"user","content":[{"text":"no type"}]}]}"#).is_err());
}

/// A value of a message or block field, in the shapes clients send and a few they
/// should not.
fn field_value() -> impl proptest::strategy::Strategy<Value = String> {
    use crate::formats::walk_check::{escaped_text, one_of};
    use proptest::prelude::*;
    prop_oneof![
        one_of(&["null", "7", r#""\ud800""#, r#"{"path":"a.rs"}"#]).prop_map(str::to_owned),
        one_of(&["user", "assistant", "system", "wizard", "us\\u0065r"])
            .prop_map(|r| format!("\"{r}\"")),
        escaped_text(),
        block().prop_map(|b| format!("[{b}]")),
        (block(), block()).prop_map(|(a, b)| format!("[{a},{b}]")),
    ]
}

/// A content block of any of the types the view reads, fields from a small set.
fn block() -> impl proptest::strategy::Strategy<Value = String> {
    use crate::formats::walk_check::{object, one_of};
    use proptest::prelude::*;
    let kind = one_of(&["text", "tool_use", "tool_result", "thinking", "image"]);
    let value = one_of(&[
        "null",
        "1",
        r#""toolu_1""#,
        r#""Read""#,
        r#""out""#,
        r#""a\nb \"q\"""#,
        r#""a\nb \"q\"""#,
        r#"[{"type":"text","text":"out"}]"#,
        r#"[{"type":"text","text":"a"},{"type":"image","source":{}}]"#,
        r#"[{"type":"text","text":5}]"#,
    ]);
    let key = one_of(&[
        "text",
        "id",
        "name",
        "input",
        "tool_use_id",
        "content",
        "cache_control",
        "t\\u0065xt",
    ]);
    (kind, proptest::collection::vec((key, value), 0..4)).prop_map(|(kind, fields)| {
        let mut all = vec![("type", format!("\"{kind}\""))];
        all.extend(fields.into_iter().map(|(k, v)| (k, v.to_owned())));
        object(&all)
    })
}

proptest::proptest! {
    /// The walk reads every message as serde reads it: the same item, or the same
    /// refusal — whatever the fields and blocks hold, duplicated, escaped or odd.
    #[test]
    fn the_walk_reads_messages_as_serde_does(
        role in crate::formats::walk_check::one_of(&["user", "assistant", "system"]),
        blocks in proptest::collection::vec(block(), 0..4),
        members in proptest::collection::vec(
            (
                crate::formats::walk_check::one_of(&["role", "content", "x", "r\\u006fle"]),
                field_value(),
            ),
            0..2,
        ),
    ) {
        let mut fields = vec![
            ("role", format!("\"{role}\"")),
            ("content", format!("[{}]", blocks.join(","))),
        ];
        fields.extend(members);
        let text = crate::formats::walk_check::object(&fields);
        crate::formats::walk_check::agree(&text, item, item_by_serde)?;
    }
}

const RESULTS: &str = r#"{"role":"user","content":[
    {"type":"tool_result","tool_use_id":"toolu_1","content":"long output","is_error":true},
    {"type":"text","text":"<system-reminder>keep</system-reminder>"},
    {"type":"tool_result","tool_use_id":"toolu_2","content":[{"type":"text","text":"short"}],"cache_control":{"type":"ephemeral"}},
    {"type":"tool_result","tool_use_id":"toolu_3","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]}]}"#;

#[test]
fn a_result_block_is_cleared_in_place_and_everything_else_is_kept() {
    let raw = RawValue::from_string(RESULTS.to_owned()).unwrap();
    let mut offered = Vec::new();
    let digest = with_results(Raw::from(&*raw), |id, text| {
        offered.push((id.to_owned(), text.to_owned()));
        (id != "toolu_2").then(|| format!("[digest of {id}]"))
    })
    .unwrap();
    // Text results only (the image result is not offered), each with its own call id.
    assert_eq!(
        offered,
        [("toolu_1", "long output"), ("toolu_2", "short")].map(|(a, b)| (a.into(), b.into()))
    );
    // Only the first block's content changed, byte for byte everywhere else.
    assert_eq!(
        digest.get(),
        RESULTS.replace(r#""long output""#, r#""[digest of toolu_1]""#)
    );
    let d = item(Raw::from(&*digest)).unwrap();
    assert_eq!(d.results, ["toolu_1", "toolu_2", "toolu_3"]);
    assert!(same_but_results(Raw::from(&*digest), Raw::from(&*raw)));
    // Nothing to replace: no digest.
    assert!(with_results(Raw::from(&*raw), |_, _| None).is_none());
}

#[test]
fn only_a_result_blocks_content_may_differ_in_a_digest() {
    let original = RawValue::from_string(RESULTS.to_owned()).unwrap();
    let not_a_digest = |changed: String| {
        let changed = RawValue::from_string(changed).unwrap();
        !same_but_results(Raw::from(&*changed), Raw::from(&*original))
    };
    let cleared = RESULTS.replace(r#""long output""#, r#""[digest]""#);
    assert!(!not_a_digest(cleared.clone()), "the digest itself");
    // Another call answered, the error flag dropped, a reminder rewritten, a block
    // dropped, a result's content that is not a string, another role.
    assert!(not_a_digest(cleared.replace("toolu_1", "toolu_9")));
    assert!(not_a_digest(cleared.replace(r#","is_error":true"#, "")));
    assert!(not_a_digest(cleared.replace(">keep<", ">other<")));
    assert!(not_a_digest(cleared.replace(
        r#"{"type":"text","text":"<system-reminder>keep</system-reminder>"},"#,
        ""
    )));
    assert!(not_a_digest(
        RESULTS.replace(r#""long output""#, r#"[{"type":"text","text":"x"}]"#)
    ));
    assert!(not_a_digest(
        cleared.replace(r#""role":"user""#, r#""role":"assistant""#)
    ));
}
