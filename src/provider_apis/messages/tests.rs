use bytes::Bytes;
use serde_json::{Value, json};

use super::edits::{self, Trigger};
use super::*;
use crate::provider_apis::sealed;
use crate::secret::Secret;

fn key() -> IdentityKey {
    IdentityKey::new(Secret::new("messages wing"))
}

fn refused(management: Value) -> String {
    edits::read(&management.to_string()).unwrap_err()
}

#[test]
fn edits_are_refused_in_anthropics_words() {
    assert_eq!(
        refused(
            json!({"edits": [{"type": "clear_tool_uses_20250919"}, {"type": "clear_thinking_20251015"}]})
        ),
        "context_management.edits.1: `clear_thinking_20251015` must be the first strategy in `context_management.edits`"
    );
    assert_eq!(
        refused(
            json!({"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 1000}}]})
        ),
        "context_management.edits.0.trigger.value: Input should be greater than or equal to 50000"
    );
    assert_eq!(
        refused(json!({"edits": [{"type": "clear_everything"}]})),
        "context_management.edits.0: Input tag 'clear_everything' found using 'type' does not match any of the expected tags: 'clear_tool_uses_20250919', 'clear_thinking_20251015', 'compact_20260112'"
    );
    assert_eq!(
        refused(json!({"edits": [{"type": "clear_tool_uses_20250919", "keep": 3}]})),
        "context_management.edits.0.keep: Input should be a valid dictionary"
    );
    assert_eq!(
        refused(json!({"edits": [], "extra": 1})),
        "context_management.extra: Extra inputs are not permitted"
    );
    assert_eq!(
        refused(
            json!({"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 0}}]})
        ),
        "context_management.edits.0.keep.value: Input should be greater than 0"
    );
}

#[test]
fn edits_read_with_their_defaults() {
    let read = edits::read(
        &json!({"edits": [
            {"type": "clear_thinking_20251015", "keep": "all"},
            {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 4},
                "exclude_tools": ["memory"], "clear_tool_inputs": true},
            {"type": "compact_20260112", "pause_after_compaction": true, "instructions": "Keep file names."},
        ]})
        .to_string(),
    )
    .unwrap();
    assert_eq!(read.thinking.unwrap().keep, None, "all kept");
    let tools = read.tool_uses.unwrap();
    assert_eq!(tools.trigger, Trigger::ToolUses(4));
    assert_eq!(tools.keep, 3);
    assert_eq!(tools.exclude, ["memory"]);
    let compact = read.compact.unwrap();
    assert_eq!(compact.trigger, edits::DEFAULT_COMPACT_TRIGGER);
    assert!(compact.pause);
    assert_eq!(compact.instructions.as_deref(), Some("Keep file names."));
}

fn thinking(text: &str) -> Value {
    json!({"type": "thinking", "thinking": text, "signature": "sig"})
}

fn tool_round(n: u32, output: &str) -> [Value; 2] {
    let id = format!("toolu_{n}");
    [
        json!({"role": "assistant", "content": [thinking("why"), {"type": "tool_use", "id": id, "name": "read", "input": {"path": format!("/f{n}")}}]}),
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": output}]}),
    ]
}

fn ask(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// A `compaction` block abridge made with `key`, its summary covering `items` items of a
/// user fixing the parser (its plain `content` says only "shown").
pub(super) fn sealed_block(key: &IdentityKey, items: u64) -> Value {
    let summary = sealed::Summary {
        summary: "The user is fixing the parser.".into(),
        items,
        created_at: 1,
        archive: None,
    };
    json!({"type": "compaction", "content": "shown",
        "encrypted_content": sealed::seal(key, &summary)})
}

/// What `decide` forwards for a request (`None`: answered, or untouched).
fn forwarded_of(body: &Value, key: Option<&IdentityKey>) -> (Option<Value>, Option<After>) {
    let (sent, after, _) = passed_on(&body.to_string(), key);
    (
        after
            .is_some()
            .then(|| serde_json::from_slice(&sent).unwrap()),
        after,
    )
}

/// What the wing passes on for a request's bytes (as the conversation handler gets it
/// and forwards it with no checkpoint applied): the body sent, what the answer must
/// carry (`None`: untouched), and whether it goes on as it was first parsed (the same
/// parse, not a second one).
fn passed_on(text: &str, key: Option<&IdentityKey>) -> (Bytes, Option<After>, bool) {
    let body = Bytes::from(text.to_owned());
    let request = Arc::new(formats::Request::parse(formats::Format::Messages, body).unwrap());
    let first = Arc::as_ptr(&request);
    let formats::Request::Messages(messages) = &*request else {
        unreachable!("parsed as Messages")
    };
    let decided = decide(
        key,
        (messages.body(), messages.parsed()),
        SummaryRole::User,
        false,
    );
    let Planned::Done(decided) = decided else {
        panic!("no model asked");
    };
    let before = match decided {
        Some(Outcome::Withheld(after)) => withheld(request, after),
        Some(Outcome::Edited(body, after, archive)) => {
            Before::Edited(body, after.note(), after, archive)
        }
        Some(Outcome::Answer(_)) => panic!("answered"),
        None => Before::Go(request, None),
    };
    let as_parsed = |request: Arc<formats::Request>, after| {
        assert!(request.untouchable().is_none(), "left to abridge");
        let same = std::ptr::eq(Arc::as_ptr(&request), first);
        (request.outgoing(None, None, true).body, after, same)
    };
    match before {
        Before::Withheld(request, _, after) => as_parsed(request, Some(after)),
        Before::Go(request, _) => as_parsed(request, None),
        Before::Edited(body, _, after, _) => (body, Some(after), false),
        _ => panic!("not a Messages outcome"),
    }
}

#[test]
fn claude_codes_keep_all_goes_on_as_parsed_with_only_the_field_gone() {
    let management =
        r#""context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}"#;
    let text = format!(
        r#"{{"model": "claude-x", "max_tokens": 10,
  "messages": [ {{"role": "user", "content": "hi"}},
    {{"role": "assistant", "content": [{}, {{"type": "text", "text": "yo"}}]}},
    {{"role": "user", "content": "more"}} ],
  {management},
  "stream": true}}"#,
        thinking("why")
    );
    let (sent, after, same) = passed_on(&text, None);
    assert!(same, "the first parse goes on");
    let expected = text.replace(&format!("\n  {management},"), "");
    assert_ne!(expected, text);
    assert_eq!(String::from_utf8(sent.to_vec()).unwrap(), expected);
    assert_eq!(after.unwrap().applied, Some(vec![]), "applied_edits: []");

    // The bytes the wing forwarded when it rebuilt the body, for such a body as Claude
    // Code writes it.
    let body: Value = serde_json::from_str(&text).unwrap();
    let bytes = Bytes::from(body.to_string());
    let parsed = wire::parse(&bytes).unwrap();
    let entries: Vec<Entry<'_>> = (parsed.items.iter().enumerate())
        .map(|(k, item)| Entry {
            raw: Some(item.raw),
            value: serde_json::from_str(item.raw.get()).unwrap(),
            changed: false,
            from: Some(k),
        })
        .collect();
    let rebuilt = forwarded(&bytes, &parsed, &entries).unwrap();
    let (sent, _, same) = passed_on(&body.to_string(), None);
    assert!(same);
    assert_eq!(sent, rebuilt, "the same bytes as before");
}

#[test]
fn edits_under_their_triggers_go_on_as_parsed_and_over_them_edit() {
    let mut messages = vec![ask("read them")];
    for n in 1..=4 {
        messages.extend(tool_round(n, "output"));
    }
    let with = |edits: Value| {
        json!({"model": "m", "max_tokens": 10, "messages": messages,
            "context_management": {"edits": edits}})
        .to_string()
    };
    let tool_uses =
        |trigger: Value| json!({"type": "clear_tool_uses_20250919", "trigger": trigger});
    let compact = json!({"type": "compact_20260112"});
    let under = [
        json!([
            tool_uses(json!({"type": "input_tokens", "value": 100_000})),
            compact
        ]),
        json!([tool_uses(json!({"type": "tool_uses", "value": 4}))]),
        json!([]),
    ];
    for edits in under {
        let text = with(edits.clone());
        let (sent, after, same) = passed_on(&text, Some(&key()));
        assert!(same, "{edits}");
        let sent: Value = serde_json::from_slice(&sent).unwrap();
        assert_eq!(sent["messages"], json!(messages), "{edits}");
        assert!(sent.get("context_management").is_none());
        assert_eq!(after.unwrap().applied, Some(vec![]));
    }
    let over = with(json!([tool_uses(json!({"type": "tool_uses", "value": 3}))]));
    let (_, after, same) = passed_on(&over, Some(&key()));
    assert!(!same, "a message changed: a new body");
    assert_eq!(after.unwrap().applied.unwrap()[0]["cleared_tool_uses"], 1);
    // Thinking cleared (the default keeps one turn's): read and edited too.
    let thinking = with(json!([{"type": "clear_thinking_20251015"}]));
    assert!(!passed_on(&thinking, Some(&key())).2);
}

#[test]
fn a_compaction_block_spelled_with_an_escape_is_still_expanded() {
    let key = key();
    let block = sealed_block(&key, 2);
    let text = json!({"model": "m", "max_tokens": 10,
        "messages": [ask("old ask"), {"role": "assistant", "content": [block]}, ask("now")],
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}})
    .to_string()
    .replace(r#""compaction""#, r#""compac\u0074ion""#);
    let (sent, _, same) = passed_on(&text, Some(&key));
    assert!(!same);
    let sent = String::from_utf8(sent.to_vec()).unwrap();
    assert!(
        sent.contains("fixing the parser") && !sent.contains("old ask"),
        "{sent}"
    );
}

#[test]
fn a_tool_abridge_adds_goes_in_beside_the_withheld_field() {
    let text = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"context_management":{"edits":[]}}"#;
    let mut request =
        formats::Request::parse(formats::Format::Messages, Bytes::from(text)).unwrap();
    let formats::Request::Messages(messages) = &mut request else {
        unreachable!("parsed as Messages")
    };
    assert!(messages.withhold_context_management());
    assert!(!messages.withhold_context_management(), "taken once");
    let sent = request.outgoing(None, Some(r#"{"name":"t"}"#), true).body;
    assert_eq!(
        sent,
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"name":"t"}]}"#
    );
}

#[test]
fn old_thinking_is_cleared_and_the_current_turns_kept() {
    let mut messages = vec![ask("first")];
    messages.extend(tool_round(1, "one"));
    messages.push(json!({"role": "assistant", "content": [thinking("done"), {"type": "text", "text": "Read it."}]}));
    messages.push(ask("second"));
    messages.extend(tool_round(2, "two"));
    let body = json!({"model": "m", "max_tokens": 10, "messages": messages,
        "context_management": {"edits": [{"type": "clear_thinking_20251015"}]}});
    let (out, after) = forwarded_of(&body, None);
    let out = out.unwrap();
    assert!(out.get("context_management").is_none(), "not forwarded");
    let sent = out["messages"].as_array().unwrap();
    let thinking_at: Vec<usize> = sent
        .iter()
        .enumerate()
        .filter(|(_, m)| {
            m["content"]
                .as_array()
                .is_some_and(|b| b.iter().any(|b| b["type"] == "thinking"))
        })
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        thinking_at,
        [5],
        "only the current turn's tool loop keeps its thinking"
    );
    let after = after.unwrap();
    assert_eq!(
        after.applied.as_ref().unwrap()[0]["type"],
        "clear_thinking_20251015"
    );
    assert_eq!(
        after.applied.as_ref().unwrap()[0]["cleared_thinking_turns"],
        1
    );
}

#[test]
fn old_tool_results_are_cleared_with_their_pairs_intact() {
    let mut messages = vec![ask("read them")];
    for n in 1..=4 {
        messages.extend(tool_round(n, &"output ".repeat(50)));
    }
    let edit = json!({"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 2},
        "keep": {"type": "tool_uses", "value": 1}, "exclude_tools": []});
    let body = json!({"model": "m", "max_tokens": 10, "messages": messages,
        "context_management": {"edits": [edit]}});
    let (out, after) = forwarded_of(&body, None);
    let sent = out.unwrap()["messages"].as_array().unwrap().clone();
    assert_eq!(sent.len(), messages.len(), "nothing removed");
    for n in 1..=4usize {
        let result = &sent[2 * n]["content"][0];
        assert_eq!(result["tool_use_id"], format!("toolu_{n}"));
        assert_eq!(sent[2 * n - 1]["content"][1]["id"], format!("toolu_{n}"));
        let cleared = result["content"] == clear::PLACEHOLDER;
        assert_eq!(cleared, n < 4, "tool use {n}");
    }
    let applied = after.unwrap().applied.unwrap();
    assert_eq!(applied[0]["cleared_tool_uses"], 3);
    assert!(applied[0]["cleared_input_tokens"].as_u64().unwrap() > 0);
}

#[test]
fn a_sealed_block_sent_back_replaces_everything_before_it() {
    let key = key();
    let block = sealed_block(&key, 7);
    let messages = json!([ask("old ask"), {"role": "assistant", "content": [block, {"type": "text", "text": "Fixed."}]}, ask("now test it")]);
    let body = json!({"model": "m", "max_tokens": 10, "messages": messages});
    let (out, after) = forwarded_of(&body, Some(&key));
    let sent = out.unwrap()["messages"].clone();
    let text = sent.to_string();
    assert!(
        !text.contains("old ask") && !text.contains("\"compaction\""),
        "{text}"
    );
    assert!(
        sent[0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("The user is fixing the parser.")
    );
    assert_eq!(
        sent[1]["content"],
        json!([{"type": "text", "text": "Fixed."}])
    );
    assert_eq!(sent[2]["content"], "now test it");
    assert!(after.unwrap().note().is_none());
    // Another secret's block is read as plain text, and said so.
    let (out, after) = forwarded_of(&body, Some(&IdentityKey::new(Secret::new("other"))));
    assert!(out.unwrap()["messages"][0].to_string().contains("shown"));
    assert!(after.unwrap().note().unwrap().contains("plain text"));
}

#[test]
fn serves_all_but_anthropics_own_host() {
    let mut config = Config {
        upstream: "http://127.0.0.1:8080/v1".parse().unwrap(),
        ..Config::default()
    };
    assert!(serves(&config));
    config.anthropic_upstream = Some("https://api.anthropic.com/v1".parse().unwrap());
    assert!(!serves(&config));
    config.provider_apis.messages_compaction = ProviderCompaction::Serve;
    assert!(serves(&config));
}

#[test]
fn one_task_and_its_long_tool_loop_compact_to_the_last_call_and_its_result() {
    let mut messages = vec![ask("port the parser")];
    for n in 1..=24 {
        messages.extend(tool_round(
            n,
            &format!("fn parse_{n}() {{ next(); }} ").repeat(500),
        ));
    }
    let edit =
        json!({"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50000}});
    let body = json!({"model": "m", "max_tokens": 10, "messages": messages,
        "context_management": {"edits": [edit]}});
    let (out, after) = forwarded_of(&body, Some(&key()));
    let sent = out.unwrap()["messages"].as_array().unwrap().clone();
    assert_eq!(sent.len(), 3, "the summary, the last call, its result");
    assert!(
        sent[0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("port the parser")
    );
    assert_eq!(sent[1..], messages[messages.len() - 2..]);
    let block = after.unwrap().block.unwrap();
    assert_eq!(block["type"], "compaction");
    assert!(
        block["encrypted_content"]
            .as_str()
            .unwrap()
            .starts_with("abridge.v1.")
    );
}

/// On the request that compacts, recall reads what the block replaced but the newest
/// turn, which goes on as sent (not read back twice); the block carries all of it for
/// the requests after.
#[test]
fn the_compacting_request_recalls_all_but_the_turn_it_forwards() {
    let mut messages = vec![ask("port the parser")];
    for n in 1..=24 {
        messages.extend(tool_round(
            n,
            &format!("fn parse_{n}() {{ next(); }} ").repeat(500),
        ));
    }
    messages.push(ask("now the lexer in src/lex.rs"));
    let edit =
        json!({"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50000}});
    let body = json!({"model": "m", "max_tokens": 10, "messages": messages,
        "context_management": {"edits": [edit]}});
    let request =
        formats::Request::parse(formats::Format::Messages, Bytes::from(body.to_string())).unwrap();
    let formats::Request::Messages(parsed) = &request else {
        unreachable!("parsed as Messages")
    };
    let decided = decide(
        Some(&key()),
        (parsed.body(), parsed.parsed()),
        SummaryRole::User,
        false,
    );
    let Planned::Done(Some(Outcome::Edited(_, after, Some(now)))) = decided else {
        panic!("compacted, with what this request recalls from");
    };
    let now = now.open().unwrap();
    let block = after.block.unwrap();
    let sealed = sealed::open(&key(), block["encrypted_content"].as_str().unwrap()).unwrap();
    let whole = sealed.archive().unwrap().open().unwrap();
    assert_eq!(whole.total as usize, messages.len());
    assert!(whole.messages.last().unwrap().text.contains("src/lex.rs"));
    assert_eq!(now.total as usize, messages.len() - 1);
    assert!(now.messages.iter().all(|m| !m.text.contains("src/lex.rs")));
}
