//! Adversarial bodies through every per-request stage that reads them: parsing,
//! identity, the token estimates (approx and o200k) and every strategy, at 1 MB and
//! 8 MB. Each shape is one an attacker (or an unlucky agent) can send:
//!
//! - `huge_argument`: one tool call whose arguments are `"a/b " × n` (path-like text);
//! - `parallel_calls`: one assistant message with thousands of tool calls and their
//!   results;
//! - `tiny_messages`: tens of thousands of two-word messages;
//! - `letter_run`: one user message that is a single run of letters (one BPE piece);
//! - `many_urls`: a tool result of URLs and paths, each distinct;
//! - `wordy_ask`: a latest user message of distinct words (the summary gate's keywords).
//!
//! Every stage must be linear (or n log n) in the body: the throughput at 8 MB is about
//! the throughput at 1 MB. `ABRIDGE_BENCH_PROBE=1` skips criterion and prints one timing
//! per (shape, size, stage) for 256 KB … 8 MB, so a super-linear stage shows at a glance.

#![allow(
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "bench setup and the probe's report"
)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use abridge::formats::chat;
use abridge::identity::{IdentityKey, hash_conversation};
use abridge::secret::Secret;
use abridge::strategies::{
    Inline, Input, Settings, Strategy, SummaryError, SummaryRequest, compact,
};
use abridge::tokens::Estimator;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};

const SHAPES: [&str; 6] = [
    "huge_argument",
    "parallel_calls",
    "tiny_messages",
    "letter_run",
    "many_urls",
    "wordy_ask",
];

/// A body of about `size` bytes of the given shape.
fn body(shape: &str, size: usize) -> String {
    let mut m: Vec<Value> = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Start the task."}),
    ];
    match shape {
        "huge_argument" => {
            let arguments = json!({"path": "a/b ".repeat(size / 4)}).to_string();
            m.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "write_file", "arguments": arguments}}]}));
            m.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "ok"}));
            m.push(json!({"role": "assistant", "content": "Written."}));
        }
        "parallel_calls" => {
            let n = size / 160;
            let calls: Vec<Value> = (0..n)
                .map(|i| json!({"id": format!("call_{i}"), "type": "function", "function": {"name": "read_file", "arguments": format!("{{\"path\":\"src/f{i}.rs\"}}")}}))
                .collect();
            m.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
            for i in 0..n {
                m.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": format!("fn f{i}() {{}}")}));
            }
            m.push(json!({"role": "assistant", "content": "Read them all."}));
        }
        "tiny_messages" => {
            for i in 0..size / 40 {
                let role = if i % 2 == 0 { "user" } else { "assistant" };
                m.push(json!({"role": role, "content": format!("m{i}")}));
            }
            m.push(json!({"role": "assistant", "content": "ok"}));
        }
        "letter_run" => {
            m.push(json!({"role": "assistant", "content": "Send the data."}));
            m.push(json!({"role": "user", "content": "a".repeat(size)}));
            m.push(json!({"role": "assistant", "content": "Received."}));
        }
        "many_urls" => {
            let text: String = (0..size / 60)
                .map(|i| format!("https://example.com/p/{i} src/dir{i}/file{i}.rs\n"))
                .collect();
            m.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": "{\"query\":\"x\"}"}}]}));
            m.push(json!({"role": "tool", "tool_call_id": "call_1", "content": text}));
            m.push(json!({"role": "assistant", "content": "Found them."}));
        }
        "wordy_ask" => {
            m.push(json!({"role": "assistant", "content": "Go on."}));
            let words: String = (0..size / 10).map(|i| format!("word{i:05} ")).collect();
            m.push(json!({"role": "user", "content": words}));
            m.push(json!({"role": "assistant", "content": "Noted."}));
        }
        _ => unreachable!("unknown shape {shape}"),
    }
    let last = if shape == "wordy_ask" {
        let words: String = (0..size / 10).map(|i| format!("task{i:05} ")).collect();
        json!({"role": "user", "content": words})
    } else {
        json!({"role": "user", "content": "Carry on."})
    };
    m.push(last);
    json!({"model": "gpt-4o", "messages": m}).to_string()
}

async fn summarise(request: SummaryRequest) -> Result<String, SummaryError> {
    Ok(format!(
        "## Goal\nx\n## Constraints & Preferences\n(none)\n## Progress\n(none)\n## Key Decisions\n(none)\n\
         ## Relevant Files\n(none)\n## Next Steps\n(none)\n## Critical Context\n{}",
        request.prompt.chars().rev().take(300).collect::<String>()
    ))
}

/// The stages of one request, each timed by the probe and benched by criterion.
fn stages() -> Vec<&'static str> {
    let mut s = vec!["parse", "identity", "estimate_approx", "estimate_o200k"];
    s.extend(Strategy::ALL.iter().map(|s| s.as_str()));
    s
}

fn run_stage(
    stage: &str,
    body: &str,
    messages: &[abridge::conversation::Item<'_>],
    runtime: &tokio::runtime::Runtime,
) -> u64 {
    match stage {
        "parse" => chat::parse(body.as_bytes()).unwrap().messages.len() as u64,
        "identity" => {
            let key = IdentityKey::new(Secret::new("bench"));
            let ns = key.namespace(b"t", None);
            hash_conversation(&ns, messages).prefixes.len() as u64
        }
        "estimate_approx" => Estimator::approx().messages(messages),
        "estimate_o200k" => Estimator::for_model("gpt-4o").messages(messages),
        strategy => {
            let strategy: Strategy = strategy.parse().unwrap();
            let estimator = Estimator::approx();
            let settings = Settings {
                min_identifier_ratio: 0.0,
                ..Settings::default()
            };
            let input = Input {
                messages,
                budget: estimator.messages(messages) / 2,
                previous: None,
                focus: None,
                estimator: &estimator,
                format: abridge::formats::Format::Chat,
                summary_window: None,
                summary_ratio: None,
            };
            runtime
                .block_on(compact(strategy, &input, &settings, summarise, &Inline))
                .map_or(0, |p| p.tokens_after)
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

/// `ABRIDGE_BENCH_PROBE=1`: one timing per case, growing sizes, each case in a child
/// process of its own (this binary again, with `ABRIDGE_BENCH_CASE`), killed after 20 s
/// and reported as such, so a runaway case does not slow down the ones after it.
fn probe() {
    let exe = std::env::current_exe().unwrap();
    for shape in SHAPES {
        for size in [256usize << 10, 1 << 20, 4 << 20, 8 << 20] {
            for stage in stages() {
                let mut child = std::process::Command::new(&exe)
                    .env("ABRIDGE_BENCH_CASE", format!("{shape}:{size}:{stage}"))
                    .env_remove("ABRIDGE_BENCH_PROBE")
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                let deadline = Instant::now() + Duration::from_secs(20);
                let finished = loop {
                    if let Some(status) = child.try_wait().unwrap() {
                        break Some(status);
                    }
                    if Instant::now() > deadline {
                        let _ = child.kill();
                        let _ = child.wait();
                        break None;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                };
                let ms: Option<f64> = finished.and_then(|_| {
                    let mut out = String::new();
                    std::io::Read::read_to_string(child.stdout.as_mut()?, &mut out).ok()?;
                    out.trim().parse().ok()
                });
                match ms {
                    Some(ms) => println!(
                        "{shape:15} {:5} KB {stage:16} {ms:9.1} ms  {:7.1} MB/s",
                        size >> 10,
                        size as f64 / ms / 1e3
                    ),
                    None => println!("{shape:15} {:5} KB {stage:16}  > 20 s", size >> 10),
                }
            }
        }
    }
}

/// One probe case (`shape:size:stage`): prints its time in milliseconds.
fn probe_case(case: &str) {
    let mut parts = case.split(':');
    let (shape, size, stage) = (
        parts.next().unwrap(),
        parts.next().unwrap().parse().unwrap(),
        parts.next().unwrap(),
    );
    let body = body(shape, size);
    let parsed = chat::parse(body.as_bytes()).unwrap();
    if stage == "estimate_o200k" {
        // The table is loaded once per process; not part of the request's cost.
        black_box(Estimator::for_model("gpt-4o").text("warm up"));
    }
    let rt = runtime();
    let start = Instant::now();
    black_box(run_stage(stage, &body, &parsed.messages, &rt));
    println!("{}", start.elapsed().as_secs_f64() * 1e3);
}

fn adversarial(c: &mut Criterion) {
    if let Ok(case) = std::env::var("ABRIDGE_BENCH_CASE") {
        probe_case(&case);
        return;
    }
    if std::env::var_os("ABRIDGE_BENCH_PROBE").is_some() {
        probe();
        return;
    }
    let rt = runtime();
    let mut group = c.benchmark_group("adversarial");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(3));
    for shape in SHAPES {
        for size in [1usize << 20, 8 << 20] {
            let body = body(shape, size);
            let parsed = chat::parse(body.as_bytes()).unwrap();
            group.throughput(Throughput::Bytes(body.len() as u64));
            for stage in stages() {
                let id = BenchmarkId::new(format!("{shape}/{stage}"), format!("{}MB", size >> 20));
                group.bench_with_input(id, &body, |b, body| {
                    b.iter(|| run_stage(stage, black_box(body), &parsed.messages, &rt))
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, adversarial);
criterion_main!(benches);
