//! The compaction strategies at 10 / 100 / 1,000 messages of an agentic conversation
//! (about 1 KB a message, so 1,000 messages ≈ 1 MB), recency also with the exact o200k
//! estimator, and the token estimator on a 200 KB request.
//!
//! The summariser is a fake that answers at once with a summary that passes the fidelity
//! check, so the LLM strategies' numbers are abridge's own work: building and redacting
//! the transcript, checking the answer, building the plan, validating it.

use std::hint::black_box;

use abridge::formats::chat;
use abridge::strategies::{
    Inline, Input, Settings, Strategy, SummaryError, SummaryRequest, compact,
};
use abridge::tokens::Estimator;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;

/// A conversation of about `n` messages: system, then turns of user → assistant tool
/// call → tool result (≈ 3 KB of test output) → assistant answer, then a final user
/// message.
fn conversation(n: usize) -> String {
    let mut m = vec![
        json!({"role": "system", "content": "You are a careful coding agent. Work in small steps and explain each change."}),
    ];
    let mut t = 0;
    while m.len() + 1 < n {
        m.push(json!({"role": "user", "content": format!("Step {t}: the test in src/module_{t}/parser.rs fails with error E{t:04}; please fix it and keep the public API unchanged.")}));
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{t:06}"), "type": "function", "function": {"name": "bash", "arguments": json!({"command": format!("cargo test -p module_{t} -- parser"), "timeout": 120}).to_string()}}]}));
        let mut out = format!("   Compiling module_{t} v0.1.{t} (/work/src/module_{t})\n");
        for line in 0..110 {
            out.push_str(&format!(
                "test parser::case_{line:03} ... {}\n",
                if line % 9 == 4 { "FAILED" } else { "ok" }
            ));
        }
        out.push_str(&format!(
            "test result: FAILED. 25 passed; 3 failed; finished in 0.{t:02}s\nexit code: 101"
        ));
        m.push(json!({"role": "tool", "tool_call_id": format!("call_{t:06}"), "content": out}));
        m.push(json!({"role": "assistant", "content": format!("The parser in src/module_{t}/parser.rs mishandled empty input; I changed `parse_header` to return `Ok(None)` and the three failing cases pass now (took 240 ms). Next: update the docs for E{t:04}.")}));
        t += 1;
    }
    m.push(json!({"role": "user", "content": "Now summarise the changes for the changelog."}));
    json!({"model": "bench-model", "messages": m}).to_string()
}

/// A summary with every section and the last user request, as a summariser would
/// answer (the identifier share is not enforced in these settings).
async fn summarise(request: SummaryRequest) -> Result<String, SummaryError> {
    let ask = request
        .prompt
        .rsplit_once("[USER]\n")
        .map(|(_, a)| a.chars().take(300).collect::<String>())
        .unwrap_or_default();
    Ok(format!(
        "## Goal\nFix the failing parser tests.\n## Constraints & Preferences\nKeep the public API.\n\
         ## Progress\n### Done\nFixed parsers.\n### In Progress\n(none)\n### Blocked\n(none)\n\
         ## Key Decisions\nReturn Ok(None) on empty input.\n## Relevant Files\nsrc/module_*/parser.rs\n\
         ## Next Steps\nDocs.\n## Critical Context\n{ask}"
    ))
}

fn strategies(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let settings = Settings {
        min_identifier_ratio: 0.0,
        ..Settings::default()
    };
    let approx = Estimator::approx();
    let exact = Estimator::for_model("gpt-4o");
    let mut group = c.benchmark_group("compact");
    group.sample_size(20);
    for n in [10, 100, 1000] {
        let body = conversation(n);
        let parsed = chat::parse(body.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        let messages = parsed.messages;
        group.throughput(Throughput::Bytes(body.len() as u64));
        let mut cases = vec![];
        for strategy in Strategy::ALL {
            cases.push((strategy, "approx", &approx));
        }
        if n == 1000 {
            cases.push((Strategy::Recency, "o200k", &exact));
        }
        for (strategy, estimator_name, estimator) in cases {
            let input = Input {
                messages: &messages,
                budget: estimator.messages(&messages) / 4,
                previous: None,
                focus: None,
                estimator,
                format: abridge::formats::Format::Chat,
                summary_window: None,
                summary_ratio: None,
            };
            // Each case must produce what it claims.
            let plan = runtime
                .block_on(compact(strategy, &input, &settings, summarise, &Inline))
                .unwrap_or_else(|e| panic!("{strategy} at {n}: {e}"));
            assert_eq!(plan.strategy, strategy, "{:?}", plan.fallback);
            let id = BenchmarkId::new(
                format!("{strategy}/{estimator_name}"),
                format!("{n}msgs_{}KB", body.len() / 1024),
            );
            group.bench_with_input(id, &input, |b, input| {
                b.iter(|| {
                    runtime
                        .block_on(compact(
                            strategy,
                            black_box(input),
                            &settings,
                            summarise,
                            &Inline,
                        ))
                        .map(|p| p.tokens_after)
                })
            });
        }
    }
    group.finish();
}

/// The estimator on a 200 KB request: the calibrated estimate, and o200k (exact).
fn estimator(c: &mut Criterion) {
    let mut n = 400;
    let mut body = conversation(n);
    while body.len() > 200 * 1024 {
        n -= 2;
        body = conversation(n);
    }
    let parsed = chat::parse(body.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    let messages = parsed.messages;
    let mut group = c.benchmark_group("estimate");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.sample_size(20);
    for (name, estimator) in [
        ("approx", Estimator::approx()),
        ("o200k", Estimator::for_model("gpt-4o")),
        ("cl100k", Estimator::for_model("gpt-4")),
    ] {
        let id = BenchmarkId::new(
            name,
            format!("{}KB_{}msgs", body.len() / 1024, messages.len()),
        );
        group.bench_with_input(id, &messages, |b, messages| {
            b.iter(|| estimator.messages(black_box(messages)))
        });
    }
    group.finish();
}

criterion_group!(benches, strategies, estimator);
criterion_main!(benches);
