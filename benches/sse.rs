//! The SSE usage scanner on a typical streamed completion (22 events, as in the
//! performance brief) and per event: observe mode (client asked for usage) and strip mode
//! (abridge asked for it and removes it again).

use abridge::relay::sse::SseTap;
use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const EVENTS: usize = 22;

/// An OpenAI-style stream with `include_usage`: role chunk, content chunks, finish chunk,
/// usage chunk, `[DONE]`, one network chunk per event.
fn stream() -> Vec<Bytes> {
    let head = r#"{"id":"chatcmpl-Abc123","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_0ba0d124f1","choices":["#;
    let mut events = vec![format!(
        r#"data: {head}{{"index":0,"delta":{{"role":"assistant","content":"","refusal":null}},"logprobs":null,"finish_reason":null}}],"usage":null}}"#
    )];
    for i in 0..EVENTS - 4 {
        events.push(format!(
            r#"data: {head}{{"index":0,"delta":{{"content":"word{i} "}},"logprobs":null,"finish_reason":null}}],"usage":null}}"#
        ));
    }
    events.push(format!(r#"data: {head}{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":"stop"}}],"usage":null}}"#));
    events.push(
        r#"data: {"id":"chatcmpl-Abc123","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini-2024-07-18","choices":[],"usage":{"prompt_tokens":512,"completion_tokens":19,"total_tokens":531}}"#
            .to_owned(),
    );
    events.push("data: [DONE]".to_owned());
    events
        .into_iter()
        .map(|e| Bytes::from(format!("{e}\n\n")))
        .collect()
}

fn scan(c: &mut Criterion) {
    let chunks = stream();
    let mut group = c.benchmark_group("sse_stream_22_events");
    group.throughput(Throughput::Elements(EVENTS as u64));
    for (name, strip) in [("observe", false), ("strip", true)] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut tap = SseTap::new(strip);
                let mut out = 0;
                for chunk in &chunks {
                    out += tap.feed(chunk.clone()).len();
                }
                out += tap.finish().len();
                assert!(tap.usage().is_some());
                out
            })
        });
    }
    group.finish();

    // Events split in the middle: the partial-event path.
    let split: Vec<Bytes> = chunks
        .iter()
        .flat_map(|c| {
            let mid = c.len() / 2;
            [c.slice(..mid), c.slice(mid..)]
        })
        .collect();
    let mut group = c.benchmark_group("sse_stream_22_events_split");
    group.throughput(Throughput::Elements(EVENTS as u64));
    group.bench_function("observe", |b| {
        b.iter(|| {
            let mut tap = SseTap::new(false);
            for chunk in &split {
                tap.feed(chunk.clone());
            }
            tap.finish();
            tap.usage()
        })
    });
    group.finish();
}

criterion_group!(benches, scan);
criterion_main!(benches);
