//! Conversation identity on the hot path: hashing every prefix of a request's messages
//! (10 / 100 / 1,000 messages of ~1 KB, so up to ~1 MB), parsing alone (the same
//! conversation in the chat, Messages and Responses formats), the validating pass alone
//! (abridge's, and serde_json's beside it), parsing + hashing together, and the floor —
//! SHA-256 over the body's bytes once.

#![allow(
    clippy::unwrap_used,
    reason = "bench setup: a failure is a broken bench"
)]

use abridge::formats::chat::parse;
use abridge::formats::{messages, responses};
use abridge::identity::{IdentityKey, hash_conversation};
use abridge::secret::Secret;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use sha2::{Digest, Sha256};

/// A chat body of `n` messages of about `size` bytes each: alternating user and
/// assistant turns, every fifth assistant turn a tool call with its result.
fn body(n: usize, size: usize) -> String {
    // A line break every ~80 characters and the odd quoted word, as chat and tool
    // output have: JSON escapes.
    let line = "lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor\n";
    let quoted = "see \"src/main.rs\" ";
    let text = format!("{line}{line}{quoted}{line}").repeat(size / 264 + 1);
    let text = &text[..size];
    let mut messages =
        vec![serde_json::json!({"role": "system", "content": "You are a helpful assistant."})];
    for i in 1..n {
        let m = match i % 10 {
            2 => serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": format!("call_{i}"), "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"src/main.rs\"}"}}]}),
            3 => {
                serde_json::json!({"role": "tool", "tool_call_id": format!("call_{}", i - 1), "content": text})
            }
            k if k % 2 == 1 => serde_json::json!({"role": "user", "content": text}),
            _ => serde_json::json!({"role": "assistant", "content": text}),
        };
        messages.push(m);
    }
    serde_json::json!({"model": "gpt-4o", "messages": messages}).to_string()
}

/// The same conversation as an Anthropic Messages body (text blocks, `tool_use`, a
/// `tool_result` with its output as a string, as Claude Code sends them) and as a
/// Responses body (`input_text`/`output_text` parts, `function_call` and its output, as
/// Codex sends them).
fn agent_bodies(n: usize, size: usize) -> (String, String) {
    let chat: serde_json::Value = serde_json::from_str(&body(n, size)).unwrap();
    let (mut anthropic, mut responses) = (Vec::new(), Vec::new());
    for m in chat["messages"].as_array().unwrap().iter().skip(1) {
        let text = m["content"].as_str().unwrap_or_default();
        match (m["role"].as_str().unwrap(), m.get("tool_calls")) {
            ("assistant", Some(calls)) => {
                let id = calls[0]["id"].as_str().unwrap();
                anthropic.push(serde_json::json!({"role": "assistant", "content": [
                    {"type": "tool_use", "id": id, "name": "read_file", "input": {"path": "src/main.rs"}}]}));
                responses.push(serde_json::json!({"type": "function_call", "call_id": id,
                    "name": "read_file", "arguments": "{\"path\":\"src/main.rs\"}"}));
            }
            ("tool", _) => {
                let id = m["tool_call_id"].as_str().unwrap();
                anthropic.push(serde_json::json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": id, "content": text}]}));
                responses.push(serde_json::json!({"type": "function_call_output", "call_id": id, "output": text}));
            }
            (role, _) => {
                let kind = if role == "user" {
                    "input_text"
                } else {
                    "output_text"
                };
                anthropic.push(
                    serde_json::json!({"role": role, "content": [{"type": "text", "text": text}]}),
                );
                responses.push(serde_json::json!({"type": "message", "role": role,
                    "content": [{"type": kind, "text": text}]}));
            }
        }
    }
    (
        serde_json::json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": anthropic}).to_string(),
        serde_json::json!({"model": "gpt-5", "store": false, "input": responses}).to_string(),
    )
}

fn identity(c: &mut Criterion) {
    let key = IdentityKey::new(Secret::new("bench-secret"));
    let namespace = key.namespace(b"Bearer sk-bench", None);
    let mut group = c.benchmark_group("identity");
    for n in [10, 100, 1000] {
        let body = body(n, 1000);
        group.throughput(Throughput::Bytes(body.len() as u64));
        let parsed = parse(body.as_bytes()).unwrap();
        group.bench_with_input(
            BenchmarkId::new("hash_conversation", n),
            &parsed.messages,
            |b, messages| b.iter(|| hash_conversation(&namespace, messages)),
        );
        // The floor: SHA-256 over the body's bytes once, no canonical form.
        group.bench_with_input(BenchmarkId::new("sha256_of_body", n), &body, |b, body| {
            b.iter(|| Sha256::digest(body.as_bytes()))
        });
        // The validating pass alone: abridge's own, and serde_json's.
        group.bench_with_input(BenchmarkId::new("validate", n), &body, |b, body| {
            b.iter(|| abridge::json::top(body).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("validate_serde", n), &body, |b, body| {
            b.iter(|| serde_json::from_str::<serde::de::IgnoredAny>(body).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("parse", n), &body, |b, body| {
            b.iter(|| parse(body.as_bytes()).unwrap().messages.len())
        });
        let (anthropic, responses) = agent_bodies(n, 1000);
        group.bench_with_input(
            BenchmarkId::new("parse_messages", n),
            &anthropic,
            |b, body| b.iter(|| messages::parse(body.as_bytes()).unwrap().items.len()),
        );
        group.bench_with_input(
            BenchmarkId::new("parse_responses", n),
            &responses,
            |b, body| b.iter(|| responses::parse(body.as_bytes()).unwrap().items.len()),
        );
        group.bench_with_input(BenchmarkId::new("parse_and_hash", n), &body, |b, body| {
            b.iter(|| {
                let parsed = parse(body.as_bytes()).unwrap();
                hash_conversation(&namespace, &parsed.messages)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, identity);
criterion_main!(benches);
