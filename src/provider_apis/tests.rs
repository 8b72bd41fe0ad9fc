//! The wing's decisions, without a network: what a request becomes.

use bytes::Bytes;
use serde_json::{Value, json};

use super::*;
use crate::secret::Secret;
use crate::strategies::SummaryRole;

fn key() -> IdentityKey {
    IdentityKey::new(Secret::new("test secret"))
}

fn run(body: &Value) -> Option<Outcome> {
    run_with(body, &super::asked::Model::NotAsked)
}

/// What a request comes to, the model having said `model` if a compaction is made.
fn run_with(body: &Value, model: &super::asked::Model) -> Option<Outcome> {
    let body = Bytes::from(body.to_string());
    let parsed = responses::parse(&body).unwrap();
    let key = key();
    match plan(Some(&key), (&body, &parsed), SummaryRole::User) {
        Planned::Done(outcome) => outcome,
        Planned::Make(plan) => plan.make((&body, &parsed), SummaryRole::User, model),
    }
}

fn user(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
}

fn history() -> Vec<Value> {
    vec![
        json!({"type": "message", "role": "developer", "content": "You are a coding agent."}),
        user("Fix the parser in src/parse.rs"),
        json!({"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{\"cmd\":\"cargo test\"}"}),
        json!({"type": "function_call_output", "call_id": "c1", "output": "3 tests failed"}),
        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Fixed."}]}),
    ]
}

fn item_of(outcome: Option<Outcome>) -> Value {
    let Some(Outcome::Answer(response)) = outcome else {
        panic!("not answered");
    };
    assert_eq!(response.status(), StatusCode::OK);
    let body = futures_body(response);
    body["output"][0].clone()
}

fn futures_body(response: Response) -> Value {
    let bytes = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(http_body_util::BodyExt::collect(response.into_body()))
        .unwrap()
        .to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

#[test]
fn a_trigger_is_answered_with_one_compaction_item_that_expands_later() {
    let mut input = history();
    input.push(json!({"type": "compaction_trigger"}));
    let item = item_of(run(&json!({"model": "m", "input": input})));
    assert_eq!(item["type"], "compaction");
    let token = item["encrypted_content"].as_str().unwrap();
    let opened = sealed::open(&key(), token).unwrap();
    assert!(
        opened.summary.contains("src/parse.rs"),
        "{}",
        opened.summary
    );
    assert_eq!(opened.items, 5);

    // Sent back: expanded into a message, what it summarised dropped.
    let next = json!({"model": "m", "input": [
        history()[0], user("Fix the parser in src/parse.rs"), item, user("Now the docs"),
    ]});
    let Some(Outcome::Expanded(body, None, _)) = run(&next) else {
        panic!("not expanded");
    };
    let sent: Value = serde_json::from_slice(&body).unwrap();
    let input = sent["input"].as_array().unwrap();
    assert_eq!(input.len(), 4, "{sent}");
    assert_eq!(input[0], history()[0]);
    let text = input[2]["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with(crate::strategies::FRAME), "{text}");
    assert!(text.contains("src/parse.rs"));
    assert_eq!(input[3], user("Now the docs"));
    assert!(!body.windows(10).any(|w| w == b"compaction"));
}

#[test]
fn a_foreign_item_is_dropped_with_a_note() {
    let mut input = history();
    input.push(json!({"type": "compaction", "encrypted_content": "gAAAAABfromOpenAI"}));
    input.push(user("go on"));
    let Some(Outcome::Expanded(body, Some(note), _)) = run(&json!({"model": "m", "input": input}))
    else {
        panic!("not dropped");
    };
    assert!(note.contains("did not make"));
    let sent: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(sent["input"].as_array().unwrap().len(), 6, "the rest kept");
}

#[test]
fn a_trigger_that_is_not_last_is_refused() {
    let input = json!([user("x"), {"type": "compaction_trigger"}, user("y")]);
    let Some(Outcome::Answer(response)) = run(&json!({"model": "m", "input": input})) else {
        panic!("not refused");
    };
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body = futures_body(response);
    assert_eq!(body["error"]["param"], "input");
    assert!(body["error"]["message"].as_str().unwrap().contains("last"));
}

#[test]
fn nothing_of_the_apis_is_left_alone() {
    assert!(run(&json!({"model": "m", "input": history()})).is_none());
}

#[test]
fn openai_and_azure_hosts_have_the_apis() {
    let mut config = Config::default();
    assert!(!serves(&config), "api.openai.com");
    for (url, serving) in [
        ("http://127.0.0.1:8080/v1", true),
        ("https://x.openai.azure.com/openai/v1", false),
        ("https://openrouter.ai/api/v1", true),
    ] {
        config.upstream = url.parse().unwrap();
        assert_eq!(serves(&config), serving, "{url}");
    }
    config.provider_apis.responses_compaction = ProviderCompaction::Serve;
    config.upstream = "https://api.openai.com/v1".parse().unwrap();
    assert!(serves(&config));
}

#[test]
fn a_second_compaction_starts_from_the_first() {
    let mut input = history();
    input.push(json!({"type": "compaction_trigger"}));
    let first = item_of(run(&json!({"model": "m", "input": input})));
    let input = json!([
        history()[0], user("Fix the parser in src/parse.rs"), first,
        user("Now write docs/parser.md"),
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Written."}]},
        {"type": "additional_tools", "tools": []},
        {"type": "compaction_trigger"},
    ]);
    let second = item_of(run(&json!({"model": "m", "input": input, "stream": false})));
    let token = second["encrypted_content"].as_str().unwrap();
    let opened = sealed::open(&key(), token).unwrap();
    assert!(opened.summary.contains("Earlier, as compacted before"));
    assert!(
        opened.summary.contains("src/parse.rs"),
        "{}",
        opened.summary
    );
    assert!(
        opened.summary.contains("docs/parser.md"),
        "{}",
        opened.summary
    );
    // The first item's 5, and the 2 conversation items after it (not the item, the
    // request-scoped tools or the trigger; not the two kept before it, which the first
    // item's summary covers): each said once.
    assert_eq!(opened.items, 5 + 2);
    let (_, since) = opened.summary.split_once("Since then:").unwrap();
    assert!(!since.contains("Fix the parser"), "{}", opened.summary);
}

/// The model asked for a later compaction's summary reads what came after the item it
/// carries on from, the item's summary standing for what came before, and the item
/// records as many items as the digest would.
#[test]
fn a_later_summary_asks_the_model_only_about_what_followed_the_item() {
    let mut input = history();
    input.push(json!({"type": "compaction_trigger"}));
    let first = item_of(run(&json!({"model": "m", "input": input})));
    let mut input = history();
    input.push(first);
    input.push(user("Now the lexer"));
    let body = Bytes::from(json!({"model": "m", "input": input}).to_string());
    let parsed = responses::parse(&body).unwrap();
    let kinds = compacted::kinds(&parsed.items);
    let opened = compacted::opened(&key(), &kinds);
    let asked = super::asked::request(&parsed.items, (&kinds, &opened), 500);
    let prompt = &asked.prompt;
    assert!(prompt.contains("(1 items)"), "{prompt}");
    let (earlier, transcript) = prompt.split_once("<transcript-").unwrap();
    assert!(earlier.contains("PREVIOUS SUMMARY"), "{prompt}");
    assert!(transcript.contains("Now the lexer"), "{prompt}");
    assert!(!transcript.contains("Fix the parser"), "{prompt}");
    let said = compacted::said("The lexer next.", &kinds, &opened, 0);
    assert_eq!(said.items, 5 + 1);
}

#[test]
fn compact_keeps_the_newest_user_messages_within_the_budget() {
    let body = Bytes::from(
        json!({"model": "m", "input": [user(&"old ".repeat(400)), user("middle"), user("new")]})
            .to_string(),
    );
    let parsed = responses::parse(&body).unwrap();
    let kinds = compacted::kinds(&parsed.items);
    let all = compacted::kept_users(&parsed.items, &kinds, 10_000);
    assert_eq!(all.len(), 3);
    let kept = compacted::kept_users(&parsed.items, &kinds, 100);
    let kept: Vec<&str> = kept.iter().map(|r| r.get()).collect();
    assert_eq!(kept, [parsed.raw_items[1].get(), parsed.raw_items[2].get()]);
}

/// A request that sends back an item with the long history it replaced, asking for
/// compaction over `threshold`.
fn sent_back(threshold: Option<u64>) -> Value {
    let mut input = history();
    for n in 0..20 {
        input.push(json!({"type": "function_call", "call_id": format!("d{n}"), "name": "shell", "arguments": "{}"}));
        input.push(json!({"type": "function_call_output", "call_id": format!("d{n}"), "output": "log line ".repeat(200)}));
    }
    let summary = sealed::Summary {
        summary: "The parser is fixed.".into(),
        items: 45,
        created_at: 1,
        archive: None,
    };
    input.push(answer::item("cmp_1", &sealed::seal(&key(), &summary)));
    input.push(user("Now the docs"));
    let management = json!([{"type": "compaction", "compact_threshold": threshold}]);
    json!({"model": "m", "input": input, "context_management": management})
}

/// The estimate a request is weighed by: its body as it would go on uncompacted.
fn weighed(body: &Value) -> u64 {
    let body = Bytes::from(body.to_string());
    let parsed = responses::parse(&body).unwrap();
    let kinds = compacted::kinds(&parsed.items);
    let opened = compacted::opened(&key(), &kinds);
    let summaries = (kinds.as_slice(), opened.as_slice());
    let Some(context::Weighed::Under(plain, _)) =
        context::weigh((&body, &parsed), summaries, None, SummaryRole::User)
    else {
        panic!("not rewritten");
    };
    crate::tokens::approx_text(std::str::from_utf8(&plain).unwrap())
}

#[test]
fn a_summary_is_asked_only_for_a_compaction_that_is_made() {
    // Over the threshold by the body as received (what the item replaced is still in
    // it), under it by the body as it goes on: the summary would be paid for and not
    // used. The plan weighs once, so no compaction is made and none asked.
    let plain = weighed(&sent_back(None));
    let raw = crate::tokens::approx_text(&sent_back(None).to_string());
    assert!(raw > plain + 1000, "raw {raw}, as it goes on {plain}");
    let threshold = plain + (raw - plain) / 2;
    let body = Bytes::from(sent_back(Some(threshold)).to_string());
    assert!(crate::tokens::approx_text(std::str::from_utf8(&body).unwrap()) > threshold);
    let parsed = responses::parse(&body).unwrap();
    let key = key();
    let Planned::Done(Some(Outcome::Expanded(sent, None, _))) =
        plan(Some(&key), (&body, &parsed), SummaryRole::User)
    else {
        panic!("a compaction is planned under the threshold");
    };
    let sent = String::from_utf8(sent.to_vec()).unwrap();
    assert!(sent.contains("The parser is fixed.") && !sent.contains("log line"));

    // Over it as it goes on: the compaction is made, with what the model said.
    let over = sent_back(Some(plain - 1));
    let body = Bytes::from(over.to_string());
    let parsed = responses::parse(&body).unwrap();
    assert!(matches!(
        plan(Some(&key), (&body, &parsed), SummaryRole::User),
        Planned::Make(Plan {
            why: Why::OverThreshold,
            ..
        })
    ));
    let said = super::asked::Model::Said("Docs are next; the parser is fixed.".into());
    let Some(Outcome::Compacted(sent, _, _, _)) = run_with(&over, &said) else {
        panic!("not compacted");
    };
    let sent = String::from_utf8(sent.to_vec()).unwrap();
    assert!(
        sent.contains("Docs are next; the parser is fixed."),
        "{sent}"
    );
}

/// A second compaction over a request that still sends the history its item replaced
/// archives that history once (from the item's archive) and only what came after the
/// item anew; the expanded request hands the item's archive on for recall.
#[test]
fn a_later_compaction_archives_only_what_follows_the_item_it_carries_on_from() {
    let archived = |item: &Value| {
        let token = item["encrypted_content"].as_str().unwrap();
        let opened = sealed::open(&key(), token).unwrap();
        opened.archive().unwrap().open().unwrap()
    };
    let mut input = history();
    input.push(json!({"type": "compaction_trigger"}));
    let first = item_of(run(&json!({"model": "m", "input": input})));
    let once = archived(&first);
    let texts: Vec<&str> = once.messages.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(once.total, 5, "{texts:?}");
    assert!(texts[3].contains("3 tests failed"), "{texts:?}");

    // The client keeps everything and appends the item, then a new turn.
    let mut input = history();
    input.push(first.clone());
    input.push(user("Now the lexer"));
    let Some(Outcome::Expanded(_, None, Some(carried))) =
        run(&json!({"model": "m", "input": input.clone()}))
    else {
        panic!("expanded, with the item's archive");
    };
    assert_eq!(carried.open(), Some(once.clone()));

    input.push(json!({"type": "compaction_trigger"}));
    let second = archived(&item_of(run(&json!({"model": "m", "input": input}))));
    assert_eq!(second.total, 6, "the history once, the new ask once");
    assert_eq!(second.messages[..5], once.messages[..]);
    assert_eq!(second.messages[5].n, 6);
    assert!(second.messages[5].text.contains("Now the lexer"));
}

/// A request compacted over its `compact_threshold` recalls what the item replaces but
/// the current turn, which goes on as sent; the item carries all of it.
#[test]
fn the_compacting_request_recalls_all_but_the_turn_it_forwards() {
    let mut input = history();
    input.push(user("Now the lexer in src/lex.rs"));
    input.push(
        json!({"type": "function_call", "call_id": "c2", "name": "shell", "arguments": "{}"}),
    );
    input.push(json!({"type": "function_call_output", "call_id": "c2", "output": "lexed"}));
    let management = json!([{"type": "compaction", "compact_threshold": 10}]);
    let body = json!({"model": "m", "input": input, "context_management": management});
    let Some(Outcome::Compacted(sent, _, first, Some(now))) = run(&body) else {
        panic!("compacted, with what this request recalls from");
    };
    let sent: Value = serde_json::from_slice(&sent).unwrap();
    let sent = sent["input"].as_array().unwrap();
    assert_eq!(sent[sent.len() - 3..], input[input.len() - 3..]);
    let now = now.open().unwrap();
    assert_eq!(now.total as usize, history().len());
    assert!(now.messages.iter().all(|m| !m.text.contains("src/lex.rs")));
    let token = first.item()["encrypted_content"]
        .as_str()
        .unwrap()
        .to_owned();
    let whole = sealed::open(&key(), &token).unwrap().archive().unwrap();
    let whole = whole.open().unwrap();
    assert_eq!(whole.total as usize, input.len());
}
