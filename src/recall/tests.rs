use super::*;
use crate::identity::Fingerprint;

fn body(messages: &[serde_json::Value]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"model": "m", "messages": messages})).unwrap()
}

/// A checkpoint that condensed `head..=through`, forwarding `kept` unchanged.
fn condensed(head: u32, through: u32, kept: &[u32]) -> Checkpoint {
    Checkpoint {
        kept: kept
            .iter()
            .enumerate()
            .map(|(i, &of)| crate::store::Kept {
                at: i as u32 + 1,
                of,
            })
            .collect(),
        ..Checkpoint::sample(
            (head, through),
            Fingerprint::from_hex(&"0".repeat(64)).unwrap(),
            vec![serde_json::value::RawValue::from_string("{}".to_owned()).unwrap()],
        )
    }
}

fn words(s: &str) -> u64 {
    s.len() as u64 / 4 + 1
}

#[test]
fn a_recall_returns_the_condensed_text_by_query_and_by_id_and_nothing_else() {
    let messages = [
        serde_json::json!({"role": "system", "content": "Be brief."}),
        serde_json::json!({"role": "user", "content": "The staging database is on port 6543, ticket PROJ-1234."}),
        serde_json::json!({"role": "assistant", "content": "Noted the port.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": "{\"cmd\":\"psql -p 6543\"}"}}]}),
        serde_json::json!({"role": "tool", "tool_call_id": "call_1", "content": "connected; api_key=sk-proj-abcdefghijklmnopqrstuvwxyz0123456789"}),
        serde_json::json!({"role": "user", "content": "Now about the harbour lighthouse."}),
        serde_json::json!({"role": "user", "content": "Still in the context: the final question."}),
    ];
    let body = body(&messages);
    let parsed = crate::formats::chat::parse(&body).unwrap();
    let corpus = Corpus::of(&parsed.messages, &condensed(1, 4, &[4]));
    assert_eq!(
        corpus.span().as_deref(),
        Some("m2–m4"),
        "m5 is kept, so not condensed"
    );

    let port = corpus.answer(r#"{"query": "which port for staging?"}"#, 2000, &words);
    assert!(
        port.starts_with("[abridge_recall: the exact text of condensed messages]"),
        "{port}"
    );
    let first = port.find("[m2 user]").unwrap();
    assert!(
        port[first..].contains("port 6543, ticket PROJ-1234"),
        "{port}"
    );
    assert!(
        !port.contains("final question") && !port.contains("Be brief"),
        "{port}"
    );

    let tool = corpus.answer(r#"{"id": "m4"}"#, 2000, &words);
    assert!(tool.contains("[m4 tool result call_1]"), "{tool}");
    assert!(
        tool.contains("[REDACTED]") && !tool.contains("abcdefghijklmnop"),
        "{tool}"
    );
    let range = corpus.answer(r#"{"id": "m2-m3"}"#, 2000, &words);
    assert!(
        range.contains("[m2 user]") && range.contains("[tool call shell call_1]"),
        "{range}"
    );
    assert!(!range.contains("[m4"), "{range}");

    // What it cannot find, it says, and names what can be asked.
    let outside = corpus.answer(r#"{"id": "m6"}"#, 2000, &words);
    assert!(
        outside.contains("`m6` is not a condensed message (they are m2–m4)"),
        "{outside}"
    );
    let nothing = corpus.answer(r#"{"query": "zebra"}"#, 2000, &words);
    assert!(
        nothing.contains("no condensed message matches") && nothing.contains("m2–m4"),
        "{nothing}"
    );
    assert!(
        corpus
            .answer("not json", 2000, &words)
            .contains("give `id` or `query`")
    );
}

#[test]
fn a_long_message_is_read_in_parts_within_the_budget() {
    let long = format!(
        "{}needle at the end",
        "filler line of a long tool output\n".repeat(300)
    );
    let messages = [
        serde_json::json!({"role": "user", "content": "start"}),
        serde_json::json!({"role": "user", "content": long}),
        serde_json::json!({"role": "user", "content": "end"}),
    ];
    let body = body(&messages);
    let parsed = crate::formats::chat::parse(&body).unwrap();
    let corpus = Corpus::of(&parsed.messages, &condensed(0, 1, &[]));
    let found = corpus.answer(r#"{"query": "needle"}"#, 2000, &words);
    assert!(found.contains("needle at the end"), "{found}");
    assert!(words(&found) <= 2000 + 50, "{}", found.len());
    let whole = corpus.answer(r#"{"id": "m2"}"#, 500, &words);
    assert!(words(&whole) <= 550, "{}", whole.len());
    assert!(whole.contains("[more matches, not shown: m2.2"), "{whole}");
    let part = corpus.answer(r#"{"id": "m2.3"}"#, 2000, &words);
    assert!(
        part.contains("needle at the end") && !part.contains("[m2 user]"),
        "{part}"
    );
}

#[test]
fn the_calls_of_one_answer_are_served_within_its_limits() {
    let messages: Vec<serde_json::Value> = (0..12)
        .map(|i| serde_json::json!({"role": "user", "content": format!("note {i}: {}", "port 6543 on the staging host. ".repeat(40))}))
        .collect();
    let body = body(&messages);
    let parsed = crate::formats::chat::parse(&body).unwrap();
    let corpus = Corpus::of(&parsed.messages, &condensed(0, 10, &[]));
    let limits = Limits {
        calls: 5,
        tokens: 2000,
        round_tokens: 2500,
    };
    let calls = vec![r#"{"query": "port 6543"}"#; 7];
    let answered = corpus.answer_round(&calls, limits, &words);
    assert_eq!(answered.len(), 7, "every call has its result");
    // The first call reads up to 2000 tokens, the next ones what is left of 2500; a
    // call that finds less than a short answer's worth left is not served; past five,
    // none is.
    assert!(answered[0].1 && words(&answered[0].0) <= 2000 + 50);
    assert_eq!(answered[4], (ROUND_SPENT.to_owned(), false));
    assert_eq!(answered[5], (TOO_MANY.to_owned(), false));
    assert_eq!(answered[6], (TOO_MANY.to_owned(), false));
    let served: u64 = answered
        .iter()
        .filter(|(_, served)| *served)
        .map(|(t, _)| words(t))
        .sum();
    assert!(served <= 2500 + 100, "{served}");
}

/// A checkpoint whose range reaches into the final turn (results the model has acted on
/// cleared: see `crate::strategies`) condenses the cleared results only: the ask and the
/// calls it forwards as they came are not recalled, the cleared output is, whole.
#[test]
fn a_result_cleared_inside_the_final_turn_is_recalled_whole() {
    let output = format!(
        "{}staging listens on port 6543\n",
        "row of the table\n".repeat(200)
    );
    let messages = [
        serde_json::json!({"role": "system", "content": "Be brief."}),
        serde_json::json!({"role": "user", "content": "Find where staging listens."}),
        serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": "{\"cmd\":\"cat ports\"}"}}]}),
        serde_json::json!({"role": "tool", "tool_call_id": "call_1", "content": output}),
        serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_2", "type": "function", "function": {"name": "shell", "arguments": "{\"cmd\":\"ls\"}"}}]}),
        serde_json::json!({"role": "tool", "tool_call_id": "call_2", "content": "ports"}),
    ];
    let body = body(&messages);
    let parsed = crate::formats::chat::parse(&body).unwrap();
    // The replacement: the marker, the ask and the first call as they came, the
    // first output's digest.
    let corpus = Corpus::of(&parsed.messages, &condensed(1, 3, &[1, 2]));
    assert_eq!(corpus.span().as_deref(), Some("m4"));
    let port = corpus.answer(
        r#"{"query": "which port does staging listen on"}"#,
        8000,
        &words,
    );
    assert!(port.contains("[m4 tool result call_1]"), "{port}");
    assert!(port.contains("staging listens on port 6543"), "{port}");
    assert!(!port.contains("Find where staging listens"), "{port}");
    // By the id its digest names (see `recency::digest`).
    let by_id = corpus.answer(r#"{"id": "m4"}"#, 8000, &words);
    assert!(by_id.contains("staging listens on port 6543"), "{by_id}");
}
