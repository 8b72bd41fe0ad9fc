//! Unit tests of the Messages API: validation, token counts and cache usage, SSE framing
//! parsed back.

use super::*;

fn headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("anthropic-version", "2023-06-01".parse().unwrap());
    h
}

fn run(b: &Behavior, cache: &PromptCache, body: &Value, count_only: bool) -> Answer {
    answer(
        b,
        cache,
        &headers(),
        &Bytes::from(body.to_string()),
        "req_t",
        count_only,
    )
}

fn whole(b: &Behavior, cache: &PromptCache, body: &Value) -> (StatusCode, Value) {
    match run(b, cache, body, false) {
        Answer::Whole(status, bytes) => (status, serde_json::from_slice(&bytes).unwrap()),
        Answer::Events(_) => panic!("a stream"),
    }
}

/// The message of the 400 a body gets.
fn error_of(body: &Value) -> String {
    let (status, v) = whole(&Behavior::default(), &PromptCache::default(), body);
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["request_id"], "req_t");
    v["error"]["message"].as_str().unwrap().to_owned()
}

fn ok(body: &Value) -> Value {
    let (status, v) = whole(&Behavior::default(), &PromptCache::default(), body);
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

fn body(messages: Value) -> Value {
    json!({"model": "claude-x", "max_tokens": 1000, "messages": messages})
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

fn tool_use(id: &str) -> Value {
    json!({"role": "assistant", "content": [{"type": "text", "text": "running"},
        {"type": "tool_use", "id": id, "name": "Bash", "input": {"cmd": "ls"}}]})
}

fn tool_result(id: &str) -> Value {
    json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "a b", "is_error": false}]})
}

/// The events of a stream, parsed back: (the `event:` name, the data).
fn events(b: &Behavior, body: &Value) -> Vec<(String, Value)> {
    let Answer::Events(events) = run(b, &PromptCache::default(), body, false) else {
        panic!("not a stream");
    };
    events
        .iter()
        .map(|e| {
            let text = std::str::from_utf8(e).unwrap();
            assert!(text.ends_with("\n\n"), "{text}");
            let mut lines = text.trim_end().lines();
            let name = lines.next().unwrap().strip_prefix("event: ").unwrap();
            let data: String = lines.map(|l| l.strip_prefix("data: ").unwrap()).collect();
            assert!(data.starts_with(&format!(r#"{{"type":"{name}""#)), "{data}");
            (name.to_owned(), serde_json::from_str(&data).unwrap())
        })
        .collect()
}

#[test]
fn the_version_header_and_the_required_fields() {
    let answer = answer(
        &Behavior::default(),
        &PromptCache::default(),
        &HeaderMap::new(),
        &Bytes::from(body(json!([user("hi")])).to_string()),
        "req_t",
        false,
    );
    let Answer::Whole(status, bytes) = answer else {
        panic!("a stream");
    };
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        v["error"]["message"],
        "anthropic-version: header is required"
    );
    let mut b = body(json!([user("hi")]));
    b.as_object_mut().unwrap().remove("max_tokens");
    assert_eq!(error_of(&b), "max_tokens: Field required");
    // count_tokens takes no max_tokens.
    let Answer::Whole(status, _) = run(&Behavior::default(), &PromptCache::default(), &b, true)
    else {
        panic!("a stream");
    };
    assert_eq!(status, StatusCode::OK);
    b.as_object_mut().unwrap().remove("model");
    assert_eq!(error_of(&b), "model: Field required");
    assert_eq!(
        error_of(&json!({"model": "m", "max_tokens": 1})),
        "messages: Field required"
    );
    assert_eq!(
        error_of(&body(json!([{"role": "tool", "content": "x"}]))),
        "messages.0.role: Input should be 'user', 'assistant' or 'system'"
    );
}

#[test]
fn roles_first_user_and_alternation_on_demand() {
    let assistant = json!({"role": "assistant", "content": "hello"});
    assert_eq!(
        error_of(&body(json!([assistant]))),
        r#"messages: first message must use the "user" role"#
    );
    let doubled = body(json!([user("a"), user("b"), {"role": "system", "content": "note"}]));
    ok(&doubled);
    let strict = Behavior {
        strict_alternation: true,
        ..Behavior::default()
    };
    let (status, v) = whole(&strict, &PromptCache::default(), &doubled);
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        v["error"]["message"],
        r#"messages: roles must alternate between "user" and "assistant""#
    );
    // A system message between turns is not a turn.
    let claude_code =
        body(json!([user("a"), {"role": "system", "content": "env"}, assistant, user("b")]));
    assert_eq!(
        whole(&strict, &PromptCache::default(), &claude_code).0,
        StatusCode::OK
    );
}

#[test]
fn tool_uses_and_results_must_pair() {
    assert_eq!(
        error_of(&body(json!([
            user("go"),
            tool_use("toolu_1"),
            user("and?")
        ]))),
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_1. Each `tool_use` block must have a corresponding `tool_result` block in the next message."
    );
    let two = json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "a", "name": "x", "input": {}},
        {"type": "tool_use", "id": "b", "name": "x", "input": {}}]});
    assert_eq!(
        error_of(&body(json!([user("go"), two]))),
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: a, b. Each `tool_use` block must have a corresponding `tool_result` block in the next message."
    );
    assert_eq!(
        error_of(&body(
            json!([user("go"), {"role": "assistant", "content": "hm"}, tool_result("toolu_9")])
        )),
        "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_9. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
    );
    ok(&body(json!([
        user("go"),
        tool_use("toolu_1"),
        tool_result("toolu_1")
    ])));
}

#[test]
fn thinking_signatures_are_checked() {
    let thinking = |signature: Value| {
        let mut block = json!({"type": "thinking", "thinking": "let me see"});
        if !signature.is_null() {
            block["signature"] = signature;
        }
        body(
            json!([user("go"), {"role": "assistant", "content": [block, {"type": "text", "text": "ok"}]}, user("more")]),
        )
    };
    ok(&thinking(json!(thinking_signature("let me see"))));
    assert_eq!(
        error_of(&thinking(json!("forged"))),
        "messages.1.content.0: Invalid `signature` in `thinking` block"
    );
    assert_eq!(
        error_of(&thinking(Value::Null)),
        "messages.1.content.0.thinking.signature: Field required"
    );
    assert_eq!(thinking_signature("a"), thinking_signature("a"));
    assert_ne!(thinking_signature("a"), thinking_signature("b"));
}

#[test]
fn at_most_four_cache_breakpoints() {
    let marked = json!({"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}});
    let mut b = body(json!([{"role": "user", "content": [marked, marked, marked]}]));
    b["system"] = json!([marked]);
    ok(&b);
    b["tools"] = json!([{"name": "t", "input_schema": {}, "cache_control": {"type": "ephemeral"}}]);
    assert_eq!(
        error_of(&b),
        "A maximum of 4 blocks with cache_control may be provided. Found 5."
    );
}

#[test]
fn the_window_says_the_prompt_is_too_long() {
    let b = Behavior {
        context_window: Some(20),
        token_scale: 2.0,
        ..Behavior::default()
    };
    let r = body(json!([user(&"x".repeat(40))]));
    // (3 + 4 + 10) × 2
    let (status, v) = whole(&b, &PromptCache::default(), &r);
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        v["error"]["message"],
        "prompt is too long: 34 tokens > 20 maximum"
    );
    // count_tokens counts, whatever the window.
    let Answer::Whole(status, bytes) = run(&b, &PromptCache::default(), &r, true) else {
        panic!("a stream");
    };
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        serde_json::from_slice::<Value>(&bytes).unwrap(),
        json!({"input_tokens": 34})
    );
}

#[test]
fn a_message_and_its_cache_usage() {
    let cache = PromptCache::default();
    let system =
        json!([{"type": "text", "text": "s".repeat(40), "cache_control": {"type": "ephemeral"}}]);
    let mut r = body(json!([user("hello there")]));
    r["system"] = system;
    let (_, v) = whole(&Behavior::default(), &cache, &r);
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["stop_sequence"], Value::Null);
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    assert!(
        v["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("Fake reply to: hello there")
    );
    // 3 + (4 + 10) cached at the system breakpoint, then 4 + 3.
    let usage = json!({"input_tokens": 7, "cache_creation_input_tokens": 17,
        "cache_read_input_tokens": 0, "output_tokens": 12});
    assert_eq!(v["usage"], usage);
    let (_, again) = whole(&Behavior::default(), &cache, &r);
    assert_eq!(again["usage"]["cache_read_input_tokens"], 17);
    assert_eq!(again["usage"]["cache_creation_input_tokens"], 0);
    assert_eq!(again["usage"]["input_tokens"], 7);
    assert_eq!(count_tokens(&r), 24);
    // A reported count replaces it all.
    let absurd = Behavior {
        reported_prompt_tokens: Some(5),
        ..Behavior::default()
    };
    let (_, v) = whole(&absurd, &cache, &r);
    assert_eq!(v["usage"]["input_tokens"], 5);
    assert_eq!(v["usage"]["cache_read_input_tokens"], 0);
}

#[test]
fn with_tools_a_fresh_ask_gets_a_tool_use() {
    let mut r = body(json!([user("list files"), {"role": "system", "content": "env"}]));
    r["tools"] = json!([{"name": "Bash", "input_schema": {"type": "object"}}]);
    let v = ok(&r);
    assert_eq!(v["stop_reason"], "tool_use");
    let block = &v["content"][0];
    assert_eq!(block["type"], "tool_use");
    assert_eq!(block["name"], "Bash");
    assert_eq!(block["input"], json!({"path": "/tmp/fake.txt"}));
    let id = block["id"].as_str().unwrap();
    assert!(id.starts_with("toolu_"));
    // Answered, the next turn is text.
    let mut next = r.clone();
    next["messages"] = json!([user("list files"), {"role": "assistant", "content": v["content"]}, tool_result(id)]);
    let v = ok(&next);
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["content"][0]["type"], "text");
    next["tool_choice"] = json!({"type": "none"});
    next["messages"] = json!([user("x")]);
    assert_eq!(ok(&next)["content"][0]["type"], "text");
}

#[test]
fn thinking_comes_first_and_replays_cleanly() {
    let mut r = body(json!([user("plan the work")]));
    r["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    let v = ok(&r);
    let thinking = &v["content"][0];
    assert_eq!(thinking["type"], "thinking");
    let text = thinking["thinking"].as_str().unwrap();
    assert_eq!(text, "Thinking about: plan the work");
    assert_eq!(thinking["signature"], thinking_signature(text));
    assert_eq!(v["usage"]["output_tokens"], 12 + 5);
    let mut next = r.clone();
    next["messages"] = json!([user("plan the work"), {"role": "assistant", "content": v["content"]}, user("go on")]);
    ok(&next);
    r["thinking"]["display"] = json!("omitted");
    assert_eq!(ok(&r)["content"][0]["thinking"], "");
}

#[test]
fn max_tokens_cuts_the_reply() {
    let mut r = body(json!([user("hi")]));
    r["max_tokens"] = json!(2);
    let v = ok(&r);
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["usage"]["output_tokens"], 2);
}

#[test]
fn the_stream_is_framed_and_ordered_like_anthropic() {
    let mut r = body(json!([user("hello there")]));
    r["stream"] = json!(true);
    let evs = events(&Behavior::default(), &r);
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    let deltas = names
        .iter()
        .filter(|n| **n == "content_block_delta")
        .count();
    assert_eq!(deltas, 12);
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(std::iter::repeat_n("content_block_delta", deltas));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);
    for (name, data) in &evs {
        assert_eq!(data["type"], *name);
        assert!(data.get("sequence_number").is_none());
    }
    let start = &evs[0].1["message"];
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["stop_reason"], Value::Null);
    assert_eq!(start["usage"]["output_tokens"], 1);
    let text: String = evs
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| {
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().unwrap().to_owned()
        })
        .collect();
    let plain = ok(&body(json!([user("hello there")])));
    assert_eq!(plain["content"][0]["text"], text);
    let delta = &evs[evs.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    // Cumulative: the same usage as the whole message.
    assert_eq!(delta["usage"], plain["usage"]);
    let multi = Behavior {
        multiline_data: true,
        ..Behavior::default()
    };
    assert_eq!(events(&multi, &r), evs);
}

#[test]
fn a_streamed_tool_use_and_thinking() {
    let mut r = body(json!([user("list")]));
    r["stream"] = json!(true);
    r["tools"] = json!([{"name": "Bash", "input_schema": {}}]);
    let b = Behavior {
        thinking: true,
        ..Behavior::default()
    };
    let evs = events(&b, &r);
    let starts: Vec<&Value> = evs
        .iter()
        .filter(|(n, _)| n == "content_block_start")
        .map(|(_, d)| &d["content_block"])
        .collect();
    assert_eq!(starts[0]["type"], "thinking");
    assert_eq!(starts[0]["signature"], "");
    assert_eq!(starts[1]["type"], "tool_use");
    assert_eq!(starts[1]["input"], json!({}));
    let of = |kind: &str, field: &str| -> String {
        evs.iter()
            .filter(|(n, d)| n == "content_block_delta" && d["delta"]["type"] == kind)
            .map(|(_, d)| d["delta"][field].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        of("input_json_delta", "partial_json"),
        r#"{"path":"/tmp/fake.txt"}"#
    );
    let thought = of("thinking_delta", "thinking");
    assert_eq!(
        of("signature_delta", "signature"),
        thinking_signature(&thought)
    );
    let stop = evs.iter().find(|(n, _)| n == "message_delta").unwrap();
    assert_eq!(stop.1["delta"]["stop_reason"], "tool_use");
}
