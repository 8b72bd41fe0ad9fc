use serde_json::{Value, json};

use super::*;
use crate::recall::NAME;

/// `events` through a round: what the client got, and the round.
fn run(carry: Carry, events: &[String]) -> (String, Round) {
    let mut round = Round::new(carry);
    let mut out = Vec::new();
    for raw in events {
        let (len, event) = Event::read(raw.as_bytes()).unwrap();
        assert_eq!(len, raw.len());
        out.extend(round.event(event));
    }
    (String::from_utf8(out).unwrap(), round)
}

fn chat(chunk: Value) -> String {
    format!("data: {chunk}\n\n")
}

fn named(value: Value) -> String {
    format!(
        "event: {}\ndata: {value}\n\n",
        value["type"].as_str().unwrap()
    )
}

fn data(out: &str) -> Vec<Value> {
    out.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

fn call_delta(index: u64, name: Option<&str>, arguments: &str) -> String {
    let mut function = json!({"arguments": arguments});
    let mut call = json!({"index": index});
    if let Some(name) = name {
        function["name"] = json!(name);
        call["id"] = json!(format!("call_{index}"));
    }
    call["function"] = function;
    chat(
        json!({"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": null}]}),
    )
}

#[test]
fn chat_text_passes_at_once_and_a_recall_call_is_held_then_served() {
    let carry = Carry::new(Format::Chat, json!("auto"), NAME.into());
    let text = chat(
        json!({"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me check."}, "finish_reason": null}]}),
    );
    let (out, mut round) = run(
        carry,
        &[
            text.clone(),
            call_delta(0, Some(NAME), "{\"query\":"),
            call_delta(0, None, "\"port\"}"),
            chat(
                json!({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            ),
            "data: [DONE]\n\n".to_owned(),
        ],
    );
    assert_eq!(out, text, "the text as it came; the call held");
    let answer = round.recalled(true).unwrap();
    assert_eq!(answer.calls.len(), 1);
    assert_eq!(answer.calls[0].arguments, r#"{"query":"port"}"#);
    assert_eq!(answer.calls[0].id, "call_0");
    let message = &answer.value["choices"][0]["message"];
    assert_eq!(message["content"], "Let me check.");
    assert!(message["tool_calls"][0].get("index").is_none(), "{message}");
    assert!(
        round.recalled(false).is_none(),
        "no more rounds: not served"
    );
    let _ = round.flush();
}

#[test]
fn the_last_round_takes_the_recall_call_out_and_renumbers_the_clients() {
    let carry = Carry::new(Format::Chat, json!("auto"), NAME.into());
    let (out, mut round) = run(
        carry,
        &[
            call_delta(0, Some(NAME), "{}"),
            call_delta(1, Some("shell"), "{\"cmd\":\"ls\"}"),
            chat(
                json!({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            ),
            "data: [DONE]\n\n".to_owned(),
        ],
    );
    assert!(out.is_empty());
    let flushed = String::from_utf8(round.flush()).unwrap();
    assert!(!flushed.contains(NAME), "{flushed}");
    let chunks = data(&flushed);
    assert_eq!(
        chunks.len(),
        2,
        "the recall call's chunk is gone: {flushed}"
    );
    assert_eq!(
        chunks[0]["choices"][0]["delta"]["tool_calls"][0]["index"],
        0
    );
    assert_eq!(chunks[1]["choices"][0]["finish_reason"], "tool_calls");
    assert!(flushed.ends_with("data: [DONE]\n\n"));

    // Only a recall call: the answer says it stopped.
    let (_, mut round) = run(
        Carry::new(Format::Chat, json!("auto"), NAME.into()),
        &[
            call_delta(0, Some(NAME), "{}"),
            chat(
                json!({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            ),
        ],
    );
    let chunks = data(&String::from_utf8(round.flush()).unwrap());
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0]["choices"][0]["finish_reason"], "stop");
}

#[test]
fn a_chat_continuation_reports_every_rounds_usage() {
    let (_, first) = run(
        Carry::new(Format::Chat, json!("auto"), NAME.into()),
        &[
            call_delta(0, Some(NAME), "{}"),
            chat(
                json!({"id": "c1", "choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 5}}),
            ),
        ],
    );
    assert!(first.recalled(true).is_some());
    let usage = chat(
        json!({"id": "c2", "choices": [], "usage": {"prompt_tokens": 130, "completion_tokens": 9}}),
    );
    let (out, _) = run(first.into_carry(), &[usage]);
    assert_eq!(
        data(&out)[0]["usage"],
        json!({"prompt_tokens": 230, "completion_tokens": 14})
    );
}

fn responses_round(seq: &mut u64, with_call: bool) -> Vec<String> {
    let mut next = |mut v: Value| {
        v["sequence_number"] = json!(*seq);
        *seq += 1;
        named(v)
    };
    let tools = json!([{"type": "function", "name": "shell"}, {"type": "function", "name": NAME}]);
    let mut events = vec![
        next(
            json!({"type": "response.created", "response": {"id": "r", "tools": tools, "tool_choice": "auto", "output": []}}),
        ),
        next(
            json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "reasoning", "id": "rs"}}),
        ),
        next(
            json!({"type": "response.output_item.done", "output_index": 0, "item": {"type": "reasoning", "id": "rs"}}),
        ),
    ];
    let item = if with_call {
        json!({"type": "function_call", "id": "fc", "call_id": "call_r", "name": NAME, "arguments": "{\"id\":\"m3\"}"})
    } else {
        json!({"type": "message", "id": "msg", "content": [{"type": "output_text", "text": "port 6543"}]})
    };
    events.push(next(
        json!({"type": "response.output_item.added", "output_index": 1, "item": item}),
    ));
    events.push(next(
        json!({"type": "response.output_item.done", "output_index": 1, "item": item}),
    ));
    let output = json!([{"type": "reasoning", "id": "rs"}, item]);
    events.push(next(json!({"type": "response.completed", "response": {
        "id": "r", "tools": tools, "tool_choice": "auto", "output": output,
        "usage": {"input_tokens": 50, "output_tokens": 4}}})));
    events
}

#[test]
fn a_responses_continuation_is_numbered_after_what_was_relayed() {
    let mut seq = 0;
    let (out, first) = run(
        Carry::new(Format::Responses, json!("auto"), NAME.into()),
        &responses_round(&mut seq, true),
    );
    let sent = data(&out);
    assert_eq!(sent.len(), 3, "created and the reasoning item: {out}");
    assert_eq!(
        sent[0]["response"]["tools"],
        json!([{"type": "function", "name": "shell"}])
    );
    let answer = first.recalled(true).unwrap();
    assert_eq!(answer.calls[0].id, "call_r");

    let mut seq = 0;
    let (out, _) = run(first.into_carry(), &responses_round(&mut seq, false));
    let sent = data(&out);
    assert!(
        sent.iter().all(|e| e["type"] != "response.created"),
        "{out}"
    );
    let numbers: Vec<u64> = sent
        .iter()
        .map(|e| e["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, [3, 4, 5, 6, 7]);
    let indices: Vec<u64> = sent
        .iter()
        .filter_map(|e| e["output_index"].as_u64())
        .collect();
    assert_eq!(indices, [1, 1, 2, 2]);
    let completed = &sent[4]["response"];
    let types: Vec<&str> = completed["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["reasoning", "reasoning", "message"]);
    assert_eq!(
        completed["usage"],
        json!({"input_tokens": 100, "output_tokens": 8})
    );
    assert_eq!(completed["tools"].as_array().unwrap().len(), 1);
}

#[test]
fn a_messages_continuation_drops_its_start_and_numbers_its_blocks_after() {
    let start = |id: &str| {
        named(
            json!({"type": "message_start", "message": {"id": id, "role": "assistant", "model": "m", "content": [], "usage": {"input_tokens": 40, "output_tokens": 1}}}),
        )
    };
    let block = |i: u64, block: Value| {
        named(json!({"type": "content_block_start", "index": i, "content_block": block}))
    };
    let delta =
        |i: u64, d: Value| named(json!({"type": "content_block_delta", "index": i, "delta": d}));
    let stop = |i: u64| named(json!({"type": "content_block_stop", "index": i}));
    let end = |reason: &str, out: u64| {
        [
            named(
                json!({"type": "message_delta", "delta": {"stop_reason": reason}, "usage": {"output_tokens": out}}),
            ),
            named(json!({"type": "message_stop"})),
        ]
    };
    let mut first = vec![
        start("msg_1"),
        block(
            0,
            json!({"type": "thinking", "thinking": "", "signature": ""}),
        ),
        delta(
            0,
            json!({"type": "thinking_delta", "thinking": "Need the port."}),
        ),
        delta(0, json!({"type": "signature_delta", "signature": "sig"})),
        stop(0),
        block(
            1,
            json!({"type": "tool_use", "id": "toolu_r", "name": NAME, "input": {}}),
        ),
        delta(
            1,
            json!({"type": "input_json_delta", "partial_json": "{\"query\": \"port\"}"}),
        ),
        stop(1),
    ];
    first.extend(end("tool_use", 7));
    let (out, round) = run(
        Carry::new(Format::Messages, json!("auto"), NAME.into()),
        &first,
    );
    assert_eq!(data(&out).len(), 5, "start and the thinking block: {out}");
    let answer = round.recalled(true).unwrap();
    assert_eq!(answer.calls[0].arguments, r#"{"query":"port"}"#);
    assert_eq!(answer.value["content"][0]["thinking"], "Need the port.");
    assert_eq!(answer.value["content"][0]["signature"], "sig");

    let mut second = vec![
        start("msg_2"),
        block(0, json!({"type": "text", "text": ""})),
        delta(0, json!({"type": "text_delta", "text": "Port 6543."})),
        stop(0),
    ];
    second.extend(end("end_turn", 3));
    let (out, _) = run(round.into_carry(), &second);
    let sent = data(&out);
    assert_eq!(
        sent[0]["type"], "content_block_start",
        "no second message_start"
    );
    assert!(
        sent.iter()
            .filter_map(|e| e["index"].as_u64())
            .all(|i| i == 1)
    );
    let usage = &sent[3]["usage"];
    assert_eq!(usage["input_tokens"], 80);
    assert_eq!(usage["output_tokens"], 10);
}
