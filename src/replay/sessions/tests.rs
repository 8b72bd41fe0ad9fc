use serde_json::{Value, json};

use super::super::input::read;
use crate::formats::Format;

fn jsonl(lines: &[Value]) -> String {
    lines.iter().map(|l| format!("{l}\n")).collect()
}

fn record(uuid: &str, parent: Option<&str>, kind: &str, message: Value) -> Value {
    json!({"type": kind, "uuid": uuid, "parentUuid": parent, "isSidechain": false,
           "sessionId": "s1", "timestamp": "2026-12-01T10:00:00Z", "message": message})
}

/// A user record saying `text`.
fn said(uuid: &str, parent: Option<&str>, text: &str) -> Value {
    record(
        uuid,
        parent,
        "user",
        json!({"role": "user", "content": text}),
    )
}

fn answer_line(uuid: &str, parent: &str, id: &str, block: Value) -> Value {
    record(
        uuid,
        Some(parent),
        "assistant",
        json!({"id": id, "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
               "content": [block], "stop_reason": null,
               "usage": {"input_tokens": 10, "output_tokens": 5}}),
    )
}

#[test]
fn a_claude_code_transcript_is_the_chain_from_its_newest_record_as_messages_requests() {
    let lines = [
        json!({"type": "summary", "summary": "Fixing the parser", "leafUuid": "u6"}),
        said("u1", None, "Fix the parser."),
        // One answer, written a line per block.
        answer_line(
            "a1",
            "u1",
            "msg_1",
            json!({"type": "text", "text": "Looking."}),
        ),
        answer_line(
            "a2",
            "a1",
            "msg_1",
            json!({"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "cargo test"}}),
        ),
        record(
            "u2",
            Some("a2"),
            "user",
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "1 failed"}]}),
        ),
        // A dead branch: an answer the user rewound.
        answer_line(
            "x1",
            "u2",
            "msg_x",
            json!({"type": "text", "text": "abandoned"}),
        ),
        answer_line(
            "a3",
            "u2",
            "msg_2",
            json!({"type": "text", "text": "Fixed."}),
        ),
        json!({"type": "system", "subtype": "turn_duration", "uuid": "s1", "parentUuid": "a3", "durationMs": 5}),
        said("u3", Some("s1"), "Thanks; now the docs."),
        // An API error Claude Code wrote itself.
        json!({"type": "assistant", "uuid": "e1", "parentUuid": "u3", "isApiErrorMessage": true,
               "message": {"role": "assistant", "model": "<synthetic>", "content": [{"type": "text", "text": "API Error"}]}}),
    ];
    let inputs = read(&jsonl(&lines)).unwrap();
    assert_eq!(inputs.len(), 1);
    let input = &inputs[0];
    assert_eq!(
        (input.format, input.kind),
        (Format::Messages, "claude-code")
    );
    // A request before each answer, and the last (unanswered) one.
    assert_eq!(input.len(), 3);
    let last = input.body(2);
    assert_eq!(last["model"], "claude-sonnet-4-5");
    assert_eq!(last["stream"], false);
    // Claude Code's tools, which the file does not keep, stood for by one of them: an
    // agent's request, as the provider would have had it.
    assert_eq!(last["tools"][0]["name"], "Bash");
    assert!(last["tools"][0]["input_schema"].is_object());
    let messages = last["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant", "user"]);
    assert_eq!(
        messages[1]["content"].as_array().unwrap().len(),
        2,
        "text and tool_use"
    );
    let text = last.to_string();
    assert!(!text.contains("abandoned"), "the dead branch is left out");
    assert!(!text.contains("API Error"));
    assert_eq!(input.body(1)["messages"].as_array().unwrap().len(), 3);
}

#[test]
fn claude_codes_own_compaction_starts_a_conversation_of_its_own() {
    let lines = [
        said("u1", None, "Start."),
        answer_line(
            "a1",
            "u1",
            "msg_1",
            json!({"type": "text", "text": "Started."}),
        ),
        json!({"type": "system", "subtype": "compact_boundary", "uuid": "c1", "parentUuid": null,
               "logicalParentUuid": "a1", "content": "Conversation compacted",
               "compactMetadata": {"trigger": "auto", "preTokens": 2048}}),
        json!({"type": "user", "uuid": "u2", "parentUuid": "c1", "isCompactSummary": true,
               "message": {"role": "user", "content": "This session is being continued…"}}),
        answer_line(
            "a2",
            "u2",
            "msg_2",
            json!({"type": "text", "text": "Continuing."}),
        ),
        said("u3", Some("a2"), "Go on."),
    ];
    let inputs = read(&jsonl(&lines)).unwrap();
    assert_eq!(inputs.len(), 2);
    assert_eq!(inputs[0].len(), 1);
    assert_eq!(inputs[1].len(), 2);
    let after = inputs[1].body(1).to_string();
    assert!(after.contains("being continued") && !after.contains("Start."));
}

#[test]
fn a_compaction_naming_a_record_never_written_closes_the_history_before_it() {
    // Claude Code 2.1 writes a `microcompact_boundary`, then a `compact_boundary` whose
    // `logicalParentUuid` is in no record: the history before it is still a conversation.
    let lines = [
        said("u1", None, "Start."),
        answer_line(
            "a1",
            "u1",
            "msg_1",
            json!({"type": "text", "text": "Started."}),
        ),
        said("u2", Some("a1"), "More."),
        answer_line(
            "a2",
            "u2",
            "msg_2",
            json!({"type": "text", "text": "More done."}),
        ),
        json!({"type": "system", "subtype": "microcompact_boundary", "uuid": "m1", "parentUuid": "a2"}),
        json!({"type": "system", "subtype": "compact_boundary", "uuid": "c1", "parentUuid": null,
               "logicalParentUuid": "never-written", "content": "Conversation compacted",
               "compactMetadata": {"trigger": "auto", "preTokens": 2048}}),
        json!({"type": "user", "uuid": "u3", "parentUuid": "c1", "isCompactSummary": true,
               "message": {"role": "user", "content": "This session is being continued…"}}),
        answer_line(
            "a3",
            "u3",
            "msg_3",
            json!({"type": "text", "text": "Continuing."}),
        ),
    ];
    let inputs = read(&jsonl(&lines)).unwrap();
    assert_eq!(
        inputs.len(),
        2,
        "the history before the boundary is replayed too"
    );
    assert_eq!(inputs[0].len(), 2);
    assert!(inputs[0].body(1).to_string().contains("More."));
    assert_eq!(inputs[1].len(), 1);
}

fn codex_line(kind: &str, payload: Value) -> Value {
    json!({"timestamp": "2026-12-01T10:00:00Z", "type": kind, "payload": payload})
}

#[test]
fn a_codex_rollout_is_its_response_items_as_responses_requests() {
    let lines = [
        codex_line(
            "session_meta",
            json!({"id": "r1", "cli_version": "0.63.0", "base_instructions": {"text": "You are Codex."}}),
        ),
        codex_line(
            "response_item",
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix it."}]}),
        ),
        codex_line(
            "event_msg",
            json!({"type": "user_message", "message": "Fix it."}),
        ),
        codex_line("turn_context", json!({"model": "gpt-5.1-codex"})),
        codex_line(
            "response_item",
            json!({"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}),
        ),
        codex_line(
            "response_item",
            json!({"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "c1"}),
        ),
        codex_line(
            "response_item",
            json!({"type": "function_call_output", "call_id": "c1", "output": "ok"}),
        ),
        codex_line(
            "response_item",
            json!({"type": "ghost_snapshot", "ghost_commit": {}}),
        ),
        codex_line(
            "response_item",
            json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}),
        ),
        codex_line(
            "compacted",
            json!({"message": "", "replacement_history": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Summary: fixed."}]}]}),
        ),
        codex_line(
            "response_item",
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Next."}]}),
        ),
    ];
    let inputs = read(&jsonl(&lines)).unwrap();
    assert_eq!(inputs.len(), 2);
    let (before, after) = (&inputs[0], &inputs[1]);
    assert_eq!((before.format, before.kind), (Format::Responses, "codex"));
    assert_eq!(before.len(), 2, "before the reasoning, before the answer");
    let body = before.body(1);
    assert_eq!(body["model"], "gpt-5.1-codex");
    assert_eq!(body["instructions"], "You are Codex.");
    assert_eq!(body["tools"][0]["name"], "shell");
    assert_eq!(body["tools"][0]["type"], "function");
    assert_eq!(body["input"].as_array().unwrap().len(), 4);
    assert!(
        !body.to_string().contains("ghost"),
        "only what Codex sends the model"
    );
    assert_eq!(after.len(), 1);
    assert_eq!(after.body(0)["input"].as_array().unwrap().len(), 2);
}

#[test]
fn an_older_codex_rollout_without_the_envelope_is_read_too() {
    let lines = [
        json!({"id": "r0", "timestamp": "2025-08-18T01:16:13.522Z", "instructions": null, "git": {}}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}),
        json!({"record_type": "state"}),
        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Bye"}]}),
    ];
    let inputs = read(&jsonl(&lines)).unwrap();
    assert_eq!(inputs.len(), 1);
    assert_eq!(inputs[0].len(), 2);
}

fn usage_line(uuid: &str, parent: &str, id: &str, block: Value, read: u64) -> Value {
    let mut line = answer_line(uuid, parent, id, block);
    line["message"]["usage"] = json!({"input_tokens": 3, "cache_read_input_tokens": read,
        "cache_creation_input_tokens": 200, "output_tokens": 40});
    line
}

fn result_line(uuid: &str, parent: &str, tool: &str, text: &str) -> Value {
    record(
        uuid,
        Some(parent),
        "user",
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool, "content": text}]}),
    )
}

/// Two tools called at once, as Claude Code writes them: each `tool_use` a record of the
/// same answer, each result a user record whose parent is *its* `tool_use`.
fn parallel_calls() -> String {
    let lines = [
        said("u1", None, "Read both files."),
        usage_line(
            "a1",
            "u1",
            "msg_1",
            json!({"type": "text", "text": "Reading."}),
            1000,
        ),
        usage_line(
            "a2",
            "a1",
            "msg_1",
            json!({"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "/a"}}),
            1000,
        ),
        usage_line(
            "a3",
            "a2",
            "msg_1",
            json!({"type": "tool_use", "id": "t2", "name": "Read", "input": {"file_path": "/b"}}),
            1000,
        ),
        result_line("r1", "a2", "t1", "contents of a"),
        result_line("r2", "a3", "t2", "contents of b"),
        // The next answer continues from the last result only.
        usage_line(
            "a4",
            "r2",
            "msg_2",
            json!({"type": "text", "text": "Both read."}),
            1400,
        ),
        // A rewound prompt beside the chain: a dead branch.
        said("x1", Some("a4"), "abandoned ask"),
        said("u2", Some("a4"), "Now fix b."),
    ];
    jsonl(&lines)
}

#[test]
fn parallel_tool_calls_are_a_tree_and_every_result_is_kept() {
    let inputs = read(&parallel_calls()).unwrap();
    let input = &inputs[0];
    assert_eq!(input.len(), 3);
    let last = input.body(2);
    let messages = last["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant", "user"]);
    let results: Vec<&str> = messages[2]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["tool_use_id"].as_str().unwrap())
        .collect();
    assert_eq!(results, ["t1", "t2"], "both results, one user message");
    assert_eq!(messages[1]["content"].as_array().unwrap().len(), 3);
    assert!(!last.to_string().contains("abandoned"));
}

#[test]
fn parallel_calls_make_requests_a_provider_takes_each_with_its_bill() {
    let inputs = read(&parallel_calls()).unwrap();
    let input = &inputs[0];
    // Every request is one a provider takes: each tool_use answered right after it.
    for k in 0..input.len() {
        let body = input.body(k);
        let items = body["messages"].as_array().unwrap();
        assert_eq!(
            crate::replay::rules::violation(Format::Messages, items),
            None,
            "{k}"
        );
    }
    // Each answer's bill is the request before it.
    let bill = input.bill(1).unwrap();
    assert_eq!(
        (bill.input, bill.cached, bill.cache_write),
        (1400 + 203, 1400, 200)
    );
    assert_eq!(input.bill(0).unwrap().cached, 1000);
    assert_eq!(
        input.bill(2),
        None,
        "the last request was not answered in the file"
    );
}

#[test]
fn a_sub_agent_is_a_conversation_of_its_own() {
    let side = |uuid: &str, parent: Option<&str>, kind: &str, message: Value| {
        let mut line = record(uuid, parent, kind, message);
        line["isSidechain"] = json!(true);
        line
    };
    let lines = [
        said("u1", None, "Explore."),
        side(
            "s1",
            None,
            "user",
            json!({"role": "user", "content": "Find the config loader."}),
        ),
        side(
            "s2",
            Some("s1"),
            "assistant",
            json!({"id": "msg_s", "role": "assistant", "model": "claude-haiku-4-5",
            "content": [{"type": "text", "text": "It is in src/config."}], "usage": {"input_tokens": 9, "output_tokens": 2}}),
        ),
        answer_line(
            "a1",
            "u1",
            "msg_1",
            json!({"type": "text", "text": "Explored."}),
        ),
    ];
    let inputs = read(&jsonl(&lines)).unwrap();
    assert_eq!(inputs.len(), 2);
    assert!(inputs[0].body(0).to_string().contains("Explore."));
    let sub = inputs[1].body(0).to_string();
    assert!(
        sub.contains("config loader") && !sub.contains("Explore."),
        "{sub}"
    );
    assert_eq!(inputs[1].body(0)["model"], "claude-haiku-4-5");
}

#[test]
fn codex_bills_are_its_token_counts_written_once_each() {
    let count = |input: u64, cached: u64, total: u64| {
        codex_line(
            "event_msg",
            json!({"type": "token_count", "info": {
            "total_token_usage": {"input_tokens": total, "cached_input_tokens": 0, "output_tokens": 9},
            "last_token_usage": {"input_tokens": input, "cached_input_tokens": cached, "output_tokens": 9,
                                 "reasoning_output_tokens": 4}}}),
        )
    };
    let item = |v: Value| codex_line("response_item", v);
    let lines = [
        codex_line("turn_context", json!({"model": "gpt-5.1-codex"})),
        item(
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix"}]}),
        ),
        item(json!({"type": "reasoning", "summary": [], "encrypted_content": "gAAAA"})),
        item(json!({"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"})),
        count(5000, 0, 5000),
        count(5000, 0, 5000),
        item(json!({"type": "function_call_output", "call_id": "c1", "output": "ok"})),
        item(
            json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}),
        ),
        count(5200, 4864, 10_200),
        count(5200, 4864, 10_200),
    ];
    let inputs = read(&jsonl(&lines)).unwrap();
    let input = &inputs[0];
    assert_eq!(input.len(), 2);
    assert_eq!(input.body(0)["model"], "gpt-5.1-codex");
    assert_eq!(input.bill(0).map(|b| b.input), Some(5000));
    let second = input.bill(1).unwrap();
    assert_eq!((second.input, second.cached), (5200, 4864));
}

#[test]
fn a_chat_trajectory_is_a_request_per_answer() {
    let request = json!({"model": "m", "messages": [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "read", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "source"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c2", "type": "function",
            "function": {"name": "edit", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "edited"},
        {"role": "assistant", "content": "Fixed."},
    ]});
    let inputs = read(&request.to_string()).unwrap();
    assert_eq!(inputs[0].format, Format::Chat);
    let sizes: Vec<usize> = (0..inputs[0].len())
        .map(|k| inputs[0].body(k)["messages"].as_array().unwrap().len())
        .collect();
    assert_eq!(sizes, [2, 4, 6], "one request per answer the agent got");
}
