//! Recall's cost on the request path: adding the tool to a compacted request's body
//! (against the same body without it), and answering a call — building the condensed
//! messages' passages and ranking a query (BM25), or reading an id — for an agentic
//! conversation of 100 and 1,000 messages (about 1 KB a message) condensed but for its
//! last ten messages; and, per relayed event, what the stream filter of a compacted
//! stream that carries the tool costs (read, parse, renumber, relay) against only
//! splitting the same stream into events, for a Messages stream of 200 text deltas.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "bench setup: a failed unwrap is a broken bench"
)]

use std::hint::black_box;

use abridge::formats::{Format, Request};
use abridge::recall::stream::{Carry, Event, Round};
use abridge::recall::{Corpus, NAME, wire};
use abridge::relay::events::next_event;
use abridge::store::Checkpoint;
use abridge::strategies::Strategy;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;

fn conversation(n: usize) -> String {
    let mut m = vec![json!({"role": "system", "content": "You are a careful coding agent."})];
    let mut t = 0;
    while m.len() + 1 < n {
        m.push(json!({"role": "user", "content": format!("Step {t}: the test in src/module_{t}/parser.rs fails with error E{t:04}; fix it.")}));
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{t:06}"), "type": "function", "function": {"name": "bash", "arguments": json!({"command": format!("cargo test -p module_{t}")}).to_string()}}]}));
        let out: String = (0..20)
            .map(|line| format!("test parser::case_{line:03} ... ok (port {})\n", 8000 + t))
            .collect();
        m.push(json!({"role": "tool", "tool_call_id": format!("call_{t:06}"), "content": out}));
        m.push(json!({"role": "assistant", "content": format!("Fixed module_{t}: the tokenizer now handles escapes.")}));
        t += 1;
    }
    m.push(json!({"role": "user", "content": "Which port did module 7 use?"}));
    json!({"model": "gpt-4o", "messages": m}).to_string()
}

/// A checkpoint that condensed messages 1 ..= n − 11.
fn condensed(n: usize) -> Checkpoint {
    serde_json::from_value(json!({
        "through": n - 11, "prefix": "0".repeat(64), "head": 1,
        "replacement": [{"role": "user", "content": "marker"}],
        "strategy": Strategy::Recency, "tokens_before": 0, "tokens_after": 0, "created_ms": 0,
    }))
    .unwrap()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("recall");
    for n in [100, 1000] {
        let body = conversation(n);
        let request = Request::parse(Format::Chat, body.clone().into()).unwrap();
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(
            BenchmarkId::new("outgoing_without_tool", n),
            &request,
            |b, r| b.iter(|| black_box(r.outgoing(None, None, false))),
        );
        group.bench_with_input(
            BenchmarkId::new("outgoing_with_tool", n),
            &request,
            |b, r| {
                b.iter(|| {
                    black_box(r.outgoing(None, Some(&wire::tool(Format::Chat, NAME, false)), false))
                })
            },
        );
        let checkpoint = condensed(n);
        let tokens = |t: &str| t.len() as u64 / 4;
        group.bench_with_input(BenchmarkId::new("corpus_and_query", n), &request, |b, r| {
            b.iter(|| {
                let corpus = Corpus::of(r.items(), &checkpoint);
                black_box(corpus.answer(r#"{"query": "port module_7"}"#, 2000, &tokens))
            })
        });
        let corpus = Corpus::of(request.items(), &checkpoint);
        group.bench_function(BenchmarkId::new("query_only", n), |b| {
            b.iter(|| black_box(corpus.answer(r#"{"query": "port module_7"}"#, 2000, &tokens)))
        });
        group.bench_function(BenchmarkId::new("id_only", n), |b| {
            b.iter(|| black_box(corpus.answer(r#"{"id": "m30-m33"}"#, 2000, &tokens)))
        });
    }
    group.finish();
}

/// A Messages stream: opening events, one text block of `deltas` deltas, the end.
fn messages_stream(deltas: usize) -> Vec<u8> {
    let named =
        |v: serde_json::Value| format!("event: {}\ndata: {v}\n\n", v["type"].as_str().unwrap());
    let mut s = named(
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "content": [], "stop_reason": null, "usage": {"input_tokens": 2000, "output_tokens": 1}}}),
    );
    s += &named(
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    );
    for i in 0..deltas {
        s += &named(
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": format!("word{i} of the answer, ")}}),
        );
    }
    s += &named(json!({"type": "content_block_stop", "index": 0}));
    s += &named(
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": deltas}}),
    );
    s += &named(json!({"type": "message_stop"}));
    s.into_bytes()
}

fn bench_stream(c: &mut Criterion) {
    let mut group = c.benchmark_group("recall_stream");
    let stream = messages_stream(200);
    let events = 204;
    group.throughput(Throughput::Elements(events));
    group.bench_function("split_only", |b| {
        b.iter(|| {
            let mut rest = &stream[..];
            let mut n = 0;
            while let Some((len, event)) = next_event(rest) {
                n += black_box(event.data().len());
                rest = &rest[len..];
            }
            n
        })
    });
    group.bench_function("filter", |b| {
        b.iter(|| {
            let mut round = Round::new(Carry::new(Format::Messages, json!(null), NAME.into()));
            let mut rest = &stream[..];
            let mut out = 0;
            while let Some((len, event)) = Event::read(rest) {
                out += round.event(event).len();
                rest = &rest[len..];
            }
            out + round.flush().len()
        })
    });
    group.finish();
}

criterion_group!(benches, bench, bench_stream);
criterion_main!(benches);
