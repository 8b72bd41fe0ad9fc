//! Unit tests of the Responses API: validation, token counts, SSE framing parsed back.

use super::*;

fn whole(b: &Behavior, body: &Value) -> (StatusCode, Value) {
    match answer(b, &AutoCache::default(), &Bytes::from(body.to_string())) {
        Answer::Whole(status, bytes) => (status, serde_json::from_slice(&bytes).unwrap()),
        Answer::Events(_) => panic!("a stream"),
    }
}

fn error_of(body: &Value) -> Value {
    let (status, v) = whole(&Behavior::default(), body);
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    v["error"].clone()
}

fn user(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
}

fn call(id: &str) -> Value {
    json!({"type": "function_call", "call_id": id, "name": "exec", "arguments": "{}"})
}

fn output(id: &str) -> Value {
    json!({"type": "function_call_output", "call_id": id, "output": "done"})
}

fn reasoning(id: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [], "encrypted_content": "gAAAA1234567"})
}

fn body(input: Value) -> Value {
    json!({"model": "m", "input": input})
}

/// The events of a stream, parsed back: (the `event:` name, the data).
fn events(b: &Behavior, body: &Value) -> Vec<(String, Value)> {
    let Answer::Events(events) = answer(b, &AutoCache::default(), &Bytes::from(body.to_string()))
    else {
        panic!("not a stream");
    };
    events
        .iter()
        .map(|e| {
            let text = std::str::from_utf8(e).unwrap();
            assert!(text.ends_with("\n\n"), "{text}");
            let mut lines = text.trim_end().lines();
            let name = lines
                .next()
                .unwrap()
                .strip_prefix("event: ")
                .unwrap()
                .to_owned();
            let data: String = lines.map(|l| l.strip_prefix("data: ").unwrap()).collect();
            assert!(data.starts_with(&format!(r#"{{"type":"{name}","sequence_number":"#)));
            (name, serde_json::from_str(&data).unwrap())
        })
        .collect()
}

#[test]
fn counts_tokens_as_documented() {
    let r = json!({"instructions": "12345678", "input": [
        user("abc"),
        call("c1"),
        output("c1"),
        reasoning("rs_1"),
        {"type": "compaction", "encrypted_content": "12345"},
        {"type": "compaction_trigger"},
    ]});
    // 3 + (4 + 2) + (4 + 1) + (4 + 1 + 1) + (4 + 1) + (4 + 3) + (4 + 2) + 4
    assert_eq!(count_tokens(&r), 3 + 6 + 5 + 6 + 5 + 7 + 6 + 4);
    assert_eq!(count_tokens(&json!({"input": "abcd"})), 3 + 4 + 1);
}

#[test]
fn calls_and_outputs_must_pair() {
    let e = error_of(&body(json!([user("x"), call("call_1")])));
    assert_eq!(
        e["message"],
        "No tool output found for function call call_1."
    );
    assert_eq!(e["type"], "invalid_request_error");
    assert_eq!(e["param"], "input");
    assert_eq!(e["code"], Value::Null);
    let e = error_of(&body(json!([user("x"), output("call_2")])));
    assert_eq!(
        e["message"],
        "No tool call found for function call output with call_id call_2."
    );
    // The output before its call does not count.
    let e = error_of(&body(json!([user("x"), output("c"), call("c")])));
    assert_eq!(
        e["message"],
        "No tool call found for function call output with call_id c."
    );
    let custom =
        json!({"type": "custom_tool_call", "call_id": "k", "name": "apply_patch", "input": "*"});
    let e = error_of(&body(json!([user("x"), custom])));
    assert_eq!(e["message"], "No tool output found for custom tool call k.");
    // Chained to an earlier response, the call may be there.
    let mut chained = body(json!([output("call_2")]));
    chained["previous_response_id"] = json!("resp_1");
    assert_eq!(whole(&Behavior::default(), &chained).0, StatusCode::OK);
}

#[test]
fn reasoning_needs_its_following_item() {
    let msg = "Item 'rs_1' of type 'reasoning' was provided without its required following item.";
    assert_eq!(
        error_of(&body(json!([user("x"), reasoning("rs_1")])))["message"],
        msg
    );
    assert_eq!(
        error_of(&body(json!([reasoning("rs_1"), user("x")])))["message"],
        msg
    );
    // A run is judged at its last item.
    assert_eq!(
        error_of(&body(json!([
            user("x"),
            reasoning("rs_0"),
            reasoning("rs_1")
        ])))["message"],
        msg
    );
    let run = json!([
        user("x"),
        reasoning("rs_0"),
        reasoning("rs_1"),
        call("c"),
        output("c")
    ]);
    assert_eq!(whole(&Behavior::default(), &body(run)).0, StatusCode::OK);
    let assistant = json!({"role": "assistant", "content": "ok"});
    for next in [call("c"), assistant] {
        let mut input = vec![user("x"), reasoning("rs_1"), next.clone()];
        if next["type"] == "function_call" {
            input.push(output("c"));
        }
        assert_eq!(
            whole(&Behavior::default(), &body(json!(input))).0,
            StatusCode::OK
        );
    }
}

#[test]
fn missing_fields_roles_and_unknown_items() {
    let e = error_of(&json!({"input": "hi"}));
    assert_eq!(e["message"], "Missing required parameter: 'model'.");
    assert_eq!(e["code"], "missing_required_parameter");
    let e = error_of(&json!({"model": "m"}));
    assert_eq!(e["message"], "Missing required parameter: 'input'.");
    let e = error_of(&body(json!([{"role": "tool", "content": "x"}])));
    assert_eq!(e["param"], "input[0].role");
    let unknown = json!([{"type": "web_search_call", "id": "ws_1"}, {"type": "item_reference", "id": "x"}, user("x")]);
    assert_eq!(
        whole(&Behavior::default(), &body(unknown)).0,
        StatusCode::OK
    );
}

#[test]
fn the_window_answers_context_length_exceeded() {
    let b = Behavior {
        context_window: Some(10),
        ..Behavior::default()
    };
    let (status, v) = whole(&b, &body(json!("x".repeat(40))));
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(v["error"]["param"], "input");
    assert_eq!(
        v["error"]["message"],
        "Your input exceeds the context window of this model. Please adjust your input and try again."
    );
    assert_eq!(whole(&b, &body(json!("x"))).0, StatusCode::OK);
}

#[test]
fn a_text_response_and_its_usage() {
    let b = Behavior {
        token_scale: 2.0,
        ..Behavior::default()
    };
    let r = json!({"model": "m", "instructions": "be brief", "input": "hello there"});
    let (status, v) = whole(&b, &r);
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert!(v["id"].as_str().unwrap().starts_with("resp_"));
    let item = &v["output"][0];
    assert_eq!(item["type"], "message");
    assert_eq!(item["role"], "assistant");
    assert!(item["id"].as_str().unwrap().starts_with("msg_"));
    let text = item["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("Fake reply to: hello there"));
    let usage = &v["usage"];
    assert_eq!(usage["input_tokens"], 2 * (3 + 6 + 7));
    assert_eq!(usage["output_tokens"], 12);
    assert_eq!(usage["total_tokens"], 2 * 16 + 12);
    assert_eq!(usage["input_tokens_details"]["cached_tokens"], 0);
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 0);
}

#[test]
fn with_tools_the_last_user_item_gets_a_call() {
    let tools = json!([{"type": "web_search"}, {"type": "function", "name": "exec_command", "parameters": {}}]);
    let r = json!({"model": "m", "input": [user("run it")], "tools": tools});
    let (_, v) = whole(&Behavior::default(), &r);
    let item = &v["output"][0];
    assert_eq!(item["type"], "function_call");
    assert_eq!(item["name"], "exec_command");
    assert_eq!(item["arguments"], r#"{"path":"/tmp/fake.txt"}"#);
    let call_id = item["call_id"].as_str().unwrap();
    assert!(call_id.starts_with("call_"));
    // Its output answered, the next turn is text.
    let next =
        json!({"model": "m", "tools": tools, "input": [user("run it"), item, output(call_id)]});
    let (status, v) = whole(&Behavior::default(), &next);
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["output"][0]["type"], "message");
    let none = json!({"model": "m", "input": [user("x")], "tools": tools, "tool_choice": "none"});
    assert_eq!(
        whole(&Behavior::default(), &none).1["output"][0]["type"],
        "message"
    );
}

#[test]
fn max_output_tokens_makes_an_incomplete_response() {
    let r = json!({"model": "m", "input": "hi", "max_output_tokens": 3});
    let (_, v) = whole(&Behavior::default(), &r);
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(v["usage"]["output_tokens"], 3);
    let mut s = r.clone();
    s["stream"] = json!(true);
    let evs = events(&Behavior::default(), &s);
    assert_eq!(evs.last().unwrap().0, "response.incomplete");
}

#[test]
fn the_stream_is_framed_and_ordered_like_openai() {
    let b = Behavior {
        multiline_data: false,
        ..Behavior::default()
    };
    let r = json!({"model": "m", "input": "hello there", "stream": true});
    let evs = events(&b, &r);
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    let deltas = names
        .iter()
        .filter(|n| **n == "response.output_text.delta")
        .count();
    assert_eq!(deltas, 12);
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names, expected);
    for (i, (name, data)) in evs.iter().enumerate() {
        assert_eq!(data["type"], *name);
        assert_eq!(data["sequence_number"], i as u64);
    }
    assert_eq!(evs[0].1["response"]["status"], "in_progress");
    assert_eq!(evs[0].1["response"]["usage"], Value::Null);
    let text: String = evs
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    let done = &evs.last().unwrap().1["response"];
    assert_eq!(done["output"][0]["content"][0]["text"], text);
    // The same response as without streaming.
    let (_, plain) = whole(&b, &json!({"model": "m", "input": "hello there"}));
    assert_eq!(done["usage"], plain["usage"]);
    assert_eq!(done["output"], plain["output"]);
    // Spread over several data lines, it parses back the same.
    let multi = Behavior {
        multiline_data: true,
        ..Behavior::default()
    };
    let again = events(&multi, &r);
    assert_eq!(again, evs);
}

#[test]
fn a_streamed_call_carries_its_arguments_in_deltas() {
    let tools = json!([{"type": "function", "name": "exec_command"}]);
    let r = json!({"model": "m", "input": "go", "tools": tools, "stream": true});
    let evs = events(&Behavior::default(), &r);
    let args: String = evs
        .iter()
        .filter(|(n, _)| n == "response.function_call_arguments.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(args, r#"{"path":"/tmp/fake.txt"}"#);
    let added = evs
        .iter()
        .find(|(n, _)| n == "response.output_item.added")
        .unwrap();
    assert_eq!(added.1["item"]["arguments"], "");
    assert_eq!(added.1["item"]["status"], "in_progress");
    let done = &evs.last().unwrap().1["response"];
    assert_eq!(done["output"][0]["type"], "function_call");
    assert_eq!(done["output"][0]["status"], "completed");
}

#[test]
fn thinking_puts_a_reasoning_item_first_that_replays_cleanly() {
    let b = Behavior {
        thinking: true,
        ..Behavior::default()
    };
    let tools = json!([{"type": "function", "name": "exec_command"}]);
    let r = json!({"model": "m", "input": [user("run the tests")], "tools": tools,
        "include": ["reasoning.encrypted_content"]});
    let (_, v) = whole(&b, &r);
    let out = v["output"].as_array().unwrap();
    assert_eq!(out[0]["type"], "reasoning");
    assert!(out[0]["encrypted_content"].is_string());
    assert_eq!(out[1]["type"], "function_call");
    assert_eq!(v["usage"]["output_tokens_details"]["reasoning_tokens"], 5);
    let mut input = vec![user("run the tests")];
    input.extend(out.iter().cloned());
    input.push(output(out[1]["call_id"].as_str().unwrap()));
    let (status, v) = whole(&b, &json!({"model": "m", "input": input, "tools": tools}));
    assert_eq!(status, StatusCode::OK, "{v}");
    let mut s = r.clone();
    s["stream"] = json!(true);
    let evs = events(&b, &s);
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names[2..8],
        [
            "response.output_item.added",
            "response.reasoning_summary_part.added",
            "response.reasoning_summary_text.delta",
            "response.reasoning_summary_text.done",
            "response.reasoning_summary_part.done",
            "response.output_item.done",
        ]
    );
    assert_eq!(evs[8].1["output_index"], 1);
}

#[test]
fn the_compaction_apis_are_not_known_here() {
    for (item, kind) in [
        (json!({"type": "compaction_trigger"}), "compaction_trigger"),
        (
            json!({"type": "compaction", "encrypted_content": "gAAAA"}),
            "compaction",
        ),
    ] {
        let e = error_of(&body(json!([user("x"), item])));
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .starts_with(&format!("Invalid value: '{kind}'.")),
            "{e}"
        );
        assert_eq!(e["param"], "input[1].type");
        assert_eq!(e["code"], "invalid_value");
    }
}
