//! Tests of the strategies through [`compact`], the validator, and property tests over
//! random conversations.

use std::cell::RefCell;

use proptest::prelude::{
    Just, ProptestConfig, TestCaseError, any, prop_assert, prop_assert_eq, prop_oneof, proptest,
};
use proptest::strategy::Strategy as _;
use serde_json::{Value, json};

use super::Strategy;
use super::structured::echo_summary;
use super::*;
use crate::formats::chat;

fn body(messages: &[Value]) -> String {
    json!({ "model": "m", "messages": messages }).to_string()
}

fn parse(body: &str) -> Vec<Item<'_>> {
    chat::parse(body.as_bytes()).unwrap().messages
}

fn run<F, Fut>(
    strategy: Strategy,
    input: &Input<'_>,
    settings: &Settings,
    summarise: F,
) -> Result<Plan, CannotCompact>
where
    F: Fn(SummaryRequest) -> Fut,
    Fut: Future<Output = Result<String, SummaryError>>,
{
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(compact(strategy, input, settings, summarise, &Inline))
}

async fn never(_: SummaryRequest) -> Result<String, SummaryError> {
    Err(SummaryError::Unreadable)
}

async fn echo(request: SummaryRequest) -> Result<String, SummaryError> {
    Ok(echo_summary(&request))
}

fn input<'x>(messages: &'x [Item<'x>], budget: u64, estimator: &'x Estimator) -> Input<'x> {
    Input {
        messages,
        budget,
        previous: None,
        focus: None,
        estimator,
        format: crate::formats::Format::Chat,
    }
}

/// The forwarded messages, parsed back.
fn forwarded_json(messages: &[Item<'_>], plan: &Plan) -> Vec<Value> {
    plan.forwarded(messages)
        .into_iter()
        .map(|r| serde_json::from_str(r.get()).unwrap())
        .collect()
}

fn forwarded_tokens(messages: &[Item<'_>], plan: &Plan, estimator: &Estimator) -> u64 {
    let joined: Vec<String> = plan
        .forwarded(messages)
        .into_iter()
        .map(|r| r.get().to_owned())
        .collect();
    let body = format!(r#"{{"messages":[{}]}}"#, joined.join(","));
    estimator.messages(&parse(&body))
}

fn frames(messages: &[Item<'_>], plan: &Plan) -> usize {
    plan.forwarded(messages)
        .iter()
        .filter(|r| r.get().contains(&FRAME.replace('"', "\\\"")))
        .count()
}

/// An agentic conversation: system, then `turns` turns of user → assistant calling two
/// tools in parallel → results (one large) → assistant answer; then a final user message.
fn agentic(turns: usize, result_chars: usize) -> Vec<Value> {
    let mut m = vec![
        json!({"role": "system", "content": "You are a coding agent.", "x_cache": {"ttl": 5}}),
    ];
    for t in 0..turns {
        m.push(json!({"role": "user", "content": format!("Step {t}: fix the bug in src/mod_{t}.rs (ticket ABC-{t})")}));
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("call_{t}_a"), "type": "function", "function": {"name": "bash", "arguments": json!({"command": format!("cargo test mod_{t}")}).to_string()}},
            {"id": format!("call_{t}_b"), "type": "function", "function": {"name": "read_file", "arguments": json!({"path": format!("src/mod_{t}.rs")}).to_string()}}
        ]}));
        m.push(json!({"role": "tool", "tool_call_id": format!("call_{t}_a"), "content": format!("running 3 tests\n{}\nexit code: 1", "ok ".repeat(result_chars / 3)), "x_meta": t}));
        m.push(json!({"role": "tool", "tool_call_id": format!("call_{t}_b"), "content": format!("fn f{t}() {{}}")}));
        m.push(json!({"role": "assistant", "content": format!("Fixed src/mod_{t}.rs; took 120 ms. TODO: update docs for ABC-{t}.")}));
    }
    m.push(json!({"role": "user", "content": "Now write the changelog entry for these fixes."}));
    m
}

#[test]
fn strategy_names_round_trip() {
    for s in Strategy::ALL {
        assert_eq!(s.to_string().parse::<Strategy>().unwrap(), s);
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, format!("\"{s}\""));
        assert_eq!(serde_json::from_str::<Strategy>(&json).unwrap(), s);
    }
    assert_eq!(Strategy::default(), Strategy::Recency);
    assert_eq!(
        "llm_replace".parse::<Strategy>().unwrap(),
        Strategy::LlmReplace
    );
    assert!("summary".parse::<Strategy>().is_err());
}

#[test]
fn settings_have_documented_defaults_and_reject_unknown_keys() {
    let s: Settings = toml::from_str("").unwrap();
    assert_eq!(s, Settings::default());
    assert_eq!(s.protect_head, 3);
    assert_eq!(s.tail_budget_ratio, 0.2);
    assert_eq!(s.summary_role, SummaryRole::User);
    let s: Settings = toml::from_str("summary_role = \"system\"\nprotect_head = 1").unwrap();
    assert_eq!(s.summary_role, SummaryRole::System);
    assert_eq!(s.protect_head, 1);
    assert!(toml::from_str::<Settings>("protect_heads = 1").is_err());
    let round: Settings = toml::from_str(&toml::to_string(&Settings::default()).unwrap()).unwrap();
    assert_eq!(round, Settings::default());
    assert!(Settings::default().check().is_ok());
    let bad = Settings {
        tail_budget_ratio: 1.5,
        ..Settings::default()
    };
    assert!(bad.check().unwrap_err().contains("tail_budget_ratio"));
}

#[test]
fn recency_keeps_head_and_tail_and_digests_bulky_results() {
    let msgs = agentic(12, 6000);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let total = e.messages(&messages);
    let budget = total / 3;
    let plan = run(
        Strategy::Recency,
        &input(&messages, budget, &e),
        &Settings::default(),
        never,
    )
    .unwrap();
    validate(&messages, &plan).unwrap();
    assert_eq!(plan.strategy, Strategy::Recency);
    assert_eq!(plan.fallback, None);
    assert!(
        plan.tokens_after <= budget,
        "{} > {budget}",
        plan.tokens_after
    );
    assert_eq!(plan.tokens_after, forwarded_tokens(&messages, &plan, &e));
    assert_eq!(plan.tokens_before, total);
    // Head: system, first user message, and (turn boundary) the first tool exchange.
    assert_eq!(plan.head, 5, "{plan:?}");
    let out = forwarded_json(&messages, &plan);
    assert_eq!(out[0], msgs[0]);
    assert_eq!(out.last().unwrap(), msgs.last().unwrap());
    let marker = out[plan.head]["content"].as_str().unwrap();
    assert!(marker.starts_with(FRAME), "{marker}");
    assert!(marker.contains("earlier messages"), "{marker}");
    assert_eq!(out[plan.head]["role"], "user");
    // The kept part starts with an assistant message (roles alternate around the marker).
    assert_eq!(out[plan.head + 1]["role"], "assistant", "{out:#?}");
    // Bulky tool results in the kept part are digests; unknown fields kept.
    let digests: Vec<&Value> = out
        .iter()
        .filter(|m| {
            m["content"]
                .as_str()
                .is_some_and(|c| c.starts_with("[abridge: tool output elided]"))
        })
        .collect();
    assert!(!digests.is_empty(), "{out:#?}");
    for d in &digests {
        let c = d["content"].as_str().unwrap();
        assert!(c.contains("bash(command=\"cargo test"), "{c}");
        assert!(c.contains("exit status 1"), "{c}");
        assert!(c.contains("first line: \"running 3 tests\""), "{c}");
        assert!(d.get("x_meta").is_some());
    }
}

#[test]
fn cannot_compact_says_why() {
    let e = Estimator::approx();
    let settings = Settings::default();
    // No user message.
    let b = body(&[json!({"role": "system", "content": "s"})]);
    let m = parse(&b);
    let err = run(Strategy::Recency, &input(&m, 10, &e), &settings, never).unwrap_err();
    assert_eq!(err, CannotCompact::NoFinalTurn);
    // Nothing between head and final turn.
    let b = body(&[
        json!({"role": "system", "content": "s"}),
        json!({"role": "user", "content": "hi"}),
    ]);
    let m = parse(&b);
    let err = run(Strategy::Recency, &input(&m, 10, &e), &settings, never).unwrap_err();
    assert_eq!(err, CannotCompact::NothingToReplace);
    // Final turn alone over the budget.
    let b = body(&[
        json!({"role": "system", "content": "s"}),
        json!({"role": "user", "content": "hi"}),
        json!({"role": "assistant", "content": "hello"}),
        json!({"role": "user", "content": "x ".repeat(5000)}),
    ]);
    let m = parse(&b);
    for strategy in Strategy::ALL {
        match run(strategy, &input(&m, 100, &e), &settings, echo).unwrap_err() {
            CannotCompact::TooLarge { estimate, budget } => {
                assert_eq!(budget, 100);
                assert!(estimate > 1000, "{estimate}");
            }
            other => panic!("{other}"),
        }
    }
}

#[test]
fn deterministic_summary_lists_what_happened() {
    let msgs = agentic(10, 100);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let budget = e.messages(&messages) / 2;
    let settings = Settings::default();
    let plan = run(
        Strategy::Deterministic,
        &input(&messages, budget, &e),
        &settings,
        never,
    )
    .unwrap();
    assert_eq!(
        plan.strategy,
        Strategy::Deterministic,
        "{:?}",
        plan.fallback
    );
    validate(&messages, &plan).unwrap();
    assert!(plan.tokens_after <= budget);
    let text: Value = serde_json::from_str(plan.replacement[0].get()).unwrap();
    let text = text["content"].as_str().unwrap();
    assert!(text.starts_with(FRAME));
    for want in [
        "user,",
        "Tools used: bash ×",
        "read_file ×",
        "Files mentioned:",
        "src/mod_",
        "Latest user requests:",
        "Pending work mentioned:",
        "TODO: update docs",
        "Timeline:",
        "more messages",
    ] {
        assert!(text.contains(want), "{want} missing in\n{text}");
    }
    let again = run(
        Strategy::Deterministic,
        &input(&messages, budget, &e),
        &settings,
        never,
    )
    .unwrap();
    assert_eq!(again.replacement[0].get(), plan.replacement[0].get());
}

/// A summary a good summariser would write for `agentic`.
fn good_summary(request: &SummaryRequest) -> String {
    let ids: Vec<String> = super::text::identifiers(&request.prompt);
    format!(
        "## Goal\nFix bugs, then write the changelog entry.\n## Constraints & Preferences\n(none)\n\
         ## Progress\n### Done\nFixed modules.\n## Key Decisions\n(none)\n## Relevant Files\n{}\n\
         ## Next Steps\nUpdate docs; changelog.\n## Critical Context\nfix the bug, tickets\n",
        ids.join(", ")
    )
}

#[test]
fn structured_summarises_the_middle_and_updates_iteratively() {
    let msgs = agentic(16, 300);
    let e = Estimator::approx();
    let settings = Settings::default();
    // First compaction on the conversation up to turn 10.
    let first_len = 1 + 5 * 10;
    let mut first = msgs[..first_len].to_vec();
    first.push(json!({"role": "user", "content": "Continue with the next module please."}));
    let b1 = body(&first);
    let m1 = parse(&b1);
    let budget = e.messages(&m1) / 2;
    let seen = RefCell::new(Vec::new());
    let summarise = |r: SummaryRequest| {
        seen.borrow_mut().push(r.clone());
        let answer = good_summary(&r);
        async move { Ok(answer) }
    };
    let plan1 = run(
        Strategy::Structured,
        &input(&m1, budget, &e),
        &settings,
        summarise,
    )
    .unwrap();
    assert_eq!(plan1.strategy, Strategy::Structured, "{:?}", plan1.fallback);
    validate(&m1, &plan1).unwrap();
    assert!(plan1.tokens_after <= budget);
    let req = seen.borrow()[0].clone();
    assert!(
        req.prompt.contains("[USER]\nStep 1: fix the bug"),
        "{}",
        req.prompt
    );
    assert!(req.prompt.contains("[TOOL CALL bash call_1_a]"));
    assert!(req.prompt.contains("[TOOL RESULT call_1_a (bash)]"));
    assert!(req.prompt.contains("## Critical Context"));
    assert!(!req.prompt.contains("PREVIOUS SUMMARY"));
    assert!(req.system.contains("never instructions"));
    let summary1 = plan1.summary.clone().unwrap();

    // The conversation goes on; the next compaction updates the summary.
    let b2 = body(&msgs);
    let m2 = parse(&b2);
    let mut inp = input(&m2, budget, &e);
    inp.previous = Some(Previous {
        head: plan1.head,
        through: plan1.through,
        replacement: &plan1.replacement,
        summary: plan1.summary.as_deref(),
    });
    let plan2 = run(Strategy::Structured, &inp, &settings, summarise).unwrap();
    assert_eq!(plan2.strategy, Strategy::Structured, "{:?}", plan2.fallback);
    validate(&m2, &plan2).unwrap();
    assert!(plan2.through >= plan1.through);
    assert_eq!(plan2.head, plan1.head);
    let req = seen.borrow()[1].clone();
    assert!(req.prompt.contains("PREVIOUS SUMMARY"));
    assert!(req.prompt.contains(summary1.trim()));
    // Only the new messages are in the transcript, and no framed summary.
    let new_part = req.prompt.split("<new-messages>").nth(1).unwrap();
    assert!(!new_part.contains("Step 1: fix"), "old messages resent");
    assert!(new_part.contains("Step 11: fix") || new_part.contains("Step 12: fix"));
    assert!(!req.prompt.contains(FRAME));
    assert_eq!(frames(&m2, &plan2), 1);
}

#[test]
fn summariser_failures_fall_back_to_recency() {
    let msgs = agentic(12, 300);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let budget = e.messages(&messages) / 2;
    let settings = Settings::default();
    let inp = input(&messages, budget, &e);
    let sections_only = |_: SummaryRequest| async {
        Ok(
            "## Goal\nx\n## Constraints\n## Progress\n## Key Decisions\n## Relevant Files\n\
            ## Next Steps\n## Critical Context\nnothing specific"
                .to_owned(),
        )
    };
    let missing =
        |_: SummaryRequest| async { Ok("Goal: fix things. Next steps: more.".to_owned()) };
    for strategy in [Strategy::Structured, Strategy::LlmReplace] {
        type Expected = fn(&Fallback) -> bool;
        let cases: Vec<(Plan, Expected)> = vec![
            (
                run(strategy, &inp, &settings, |_| async {
                    Err(SummaryError::Status(500))
                })
                .unwrap(),
                |f| matches!(f, Fallback::Summariser(SummaryError::Status(500))),
            ),
            (
                run(strategy, &inp, &settings, |_| async {
                    Err(SummaryError::TimedOut)
                })
                .unwrap(),
                |f| matches!(f, Fallback::Summariser(SummaryError::TimedOut)),
            ),
            (
                run(strategy, &inp, &settings, |_| async {
                    Ok("  \n".to_owned())
                })
                .unwrap(),
                |f| matches!(f, Fallback::EmptySummary),
            ),
            (run(strategy, &inp, &settings, missing).unwrap(), |f| {
                matches!(f, Fallback::Fidelity(Fidelity::MissingSections(_)))
            }),
            (
                run(strategy, &inp, &settings, sections_only).unwrap(),
                |f| matches!(f, Fallback::Fidelity(Fidelity::Identifiers { .. })),
            ),
        ];
        for (plan, expected) in cases {
            let fallback = plan.fallback.as_ref().expect("a fallback");
            assert!(expected(fallback), "{strategy}: {fallback}");
            assert!(!fallback.to_string().is_empty());
            assert_eq!(plan.requested, strategy);
            assert_eq!(plan.strategy, Strategy::Recency);
            validate(&messages, &plan).unwrap();
            assert!(plan.tokens_after <= budget);
        }
        let ok = run(strategy, &inp, &settings, |r| {
            let s = good_summary(&r);
            async move { Ok(s) }
        })
        .unwrap();
        assert_eq!(ok.strategy, strategy, "{:?}", ok.fallback);
    }
}

#[test]
fn latest_ask_must_be_reflected() {
    let mut msgs = agentic(8, 100);
    // The latest request before the final turn.
    msgs[1 + 5 * 7] =
        json!({"role": "user", "content": "Please migrate the database schema to PostgreSQL"});
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let budget = e.messages(&messages) / 2;
    let inp = input(&messages, budget, &e);
    // Sections and identifiers, but nothing of the latest request.
    let plan = run(Strategy::LlmReplace, &inp, &Settings::default(), |r| {
        let s = good_summary(&r);
        async move { Ok(s) }
    })
    .unwrap();
    assert_eq!(
        plan.fallback,
        Some(Fallback::Fidelity(Fidelity::LatestAsk)),
        "{:?}",
        plan.fallback
    );
}

#[test]
fn llm_replace_keeps_only_the_final_turn_and_the_answer_before_it() {
    let msgs = agentic(8, 100);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let budget = e.messages(&messages);
    let plan = run(
        Strategy::LlmReplace,
        &input(&messages, budget, &e),
        &Settings::default(),
        |r| {
            let s = good_summary(&r);
            async move { Ok(s) }
        },
    )
    .unwrap();
    assert_eq!(plan.strategy, Strategy::LlmReplace, "{:?}", plan.fallback);
    let out = forwarded_json(&messages, &plan);
    let n = out.len();
    assert_eq!(out[n - 1], *msgs.last().unwrap());
    assert_eq!(out[n - 2], msgs[msgs.len() - 2]);
    assert_eq!(out[n - 2]["role"], "assistant");
    assert_eq!(out[n - 3]["role"], "user");
    assert!(out[n - 3]["content"].as_str().unwrap().starts_with(FRAME));
    assert_eq!(plan.head, 5);
}

#[test]
fn transcript_truncates_and_redacts() {
    let secret = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX";
    let mut msgs = agentic(6, 100);
    msgs[7] = json!({"role": "user", "content": format!("my key is {secret}; {}END", "y".repeat(20_000))});
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let budget = e.messages(&messages) / 2;
    let seen = RefCell::new(None);
    let _ = run(
        Strategy::Structured,
        &input(&messages, budget, &e),
        &Settings::default(),
        |r: SummaryRequest| {
            *seen.borrow_mut() = Some(r);
            async { Err(SummaryError::TimedOut) }
        },
    )
    .unwrap();
    let prompt = seen.borrow().clone().unwrap().prompt;
    assert!(!prompt.contains(secret));
    assert!(prompt.contains("my key is [REDACTED]"));
    assert!(prompt.contains("characters omitted"));
    assert!(prompt.contains("yyyEND"));
    assert!(!prompt.contains(&"y".repeat(7_600)));
}

#[test]
fn summary_role_system_is_honoured() {
    let msgs = agentic(8, 100);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let settings = Settings {
        summary_role: SummaryRole::System,
        ..Settings::default()
    };
    let plan = run(
        Strategy::Recency,
        &input(&messages, e.messages(&messages) / 2, &e),
        &settings,
        never,
    )
    .unwrap();
    let out = forwarded_json(&messages, &plan);
    assert_eq!(out[plan.head]["role"], "system");
}

#[test]
fn the_validator_rejects_broken_plans() {
    let msgs = agentic(6, 3000);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let good = run(
        Strategy::Recency,
        &input(&messages, e.messages(&messages) / 2, &e),
        &Settings::default(),
        never,
    )
    .unwrap();
    validate(&messages, &good).unwrap();
    assert!(good.origin.iter().any(|o| matches!(o, Origin::Digest(_))));
    let broken = |f: &dyn Fn(&mut Plan)| {
        let mut p = good.clone();
        f(&mut p);
        validate(&messages, &p).unwrap_err()
    };
    assert!(matches!(
        broken(&|p| p.head = 0),
        Violation::SystemMessages { .. }
    ));
    assert!(matches!(
        broken(&|p| p.head = 3),
        Violation::Cut { index: 3 }
    ));
    assert!(matches!(
        broken(&|p| p.through = messages.len() - 1),
        Violation::FinalTurn { .. }
    ));
    assert!(matches!(
        broken(&|p| {
            p.head = 1;
            p.through = 2;
        }),
        Violation::Cut { index: 3 }
    ));
    assert!(matches!(
        broken(&|p| p.through = 0),
        Violation::Range { .. }
    ));
    assert!(matches!(
        broken(&|p| {
            p.origin.pop();
        }),
        Violation::Origins { .. }
    ));
    // An authored message without the frame.
    assert!(matches!(
        broken(&|p| p.replacement[0] =
            RawValue::from_string(r#"{"role":"user","content":"hi"}"#.to_owned()).unwrap()),
        Violation::Unframed { position: 0 }
    ));
    // A "verbatim" copy that is not.
    let verbatim = good
        .origin
        .iter()
        .position(|o| matches!(o, Origin::Verbatim(_)))
        .unwrap();
    assert!(matches!(
        broken(&|p| p.replacement[verbatim] =
            RawValue::from_string(r#"{"role":"assistant","content":"x"}"#.to_owned()).unwrap()),
        Violation::NotVerbatim { .. }
    ));
    // A digest that drops an unknown field.
    let digest = good
        .origin
        .iter()
        .position(|o| matches!(o, Origin::Digest(_)))
        .unwrap();
    assert!(matches!(
        broken(&|p| {
            let mut v: Value = serde_json::from_str(p.replacement[digest].get()).unwrap();
            v.as_object_mut().unwrap().remove("x_meta");
            p.replacement[digest] = RawValue::from_string(v.to_string()).unwrap();
        }),
        Violation::Digest { .. }
    ));
    // A tool result copied without its call.
    assert!(matches!(
        broken(&|p| {
            let call = p
                .origin
                .iter()
                .position(|o| matches!(o, Origin::Verbatim(i) if !messages[*i].calls.is_empty()))
                .unwrap();
            p.replacement.remove(call);
            p.origin.remove(call);
        }),
        Violation::ToolPair { .. }
    ));
    // Unparseable replacement.
    assert!(matches!(
        broken(&|p| p.replacement[0] = RawValue::from_string("[1]".to_owned()).unwrap()),
        Violation::Unreadable { .. }
    ));
}

#[test]
fn exact_estimator_plans_fit_too() {
    let msgs = agentic(10, 2000);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::for_model("gpt-4o");
    let budget = e.messages(&messages) / 3;
    for strategy in Strategy::ALL {
        let plan = run(
            strategy,
            &input(&messages, budget, &e),
            &Settings::default(),
            echo,
        )
        .unwrap();
        validate(&messages, &plan).unwrap();
        assert_eq!(plan.strategy, strategy, "{:?}", plan.fallback);
        assert!(plan.tokens_after <= budget);
        assert_eq!(plan.tokens_after, forwarded_tokens(&messages, &plan, &e));
    }
}

// ---------------------------------------------------------------------------------------
// Property tests over random conversations.

/// Text of many shapes: ASCII, any printable Unicode, identifiers and cues, CJK + emoji.
fn text() -> impl proptest::strategy::Strategy<Value = String> {
    prop_oneof![
        "[a-z ]{0,40}",
        "\\PC{0,30}",
        Just("Edit src/lib.rs, run `cargo test`; TODO: fix ABC-12 (250 ms)".to_owned()),
        (1usize..30).prop_map(|n| "日本語 🦀 é ".repeat(n)),
    ]
}

/// Tool output: short, huge on one line, or many lines.
fn output() -> impl proptest::strategy::Strategy<Value = String> {
    prop_oneof![
        3 => text(),
        1 => (1000usize..30_000).prop_map(|n| format!("{}\nexit code: 1", "x".repeat(n))),
        1 => (100usize..2000).prop_map(|n| "line of output ✓ — ok\n".repeat(n)),
    ]
}

#[derive(Debug, Clone)]
enum Shape {
    Plain,
    Parts,
    PartsWithImage,
    /// A JSON value abridge does not read as content (kept as is).
    Object,
}

fn shape() -> impl proptest::strategy::Strategy<Value = Shape> {
    prop_oneof![
        3 => Just(Shape::Plain),
        1 => Just(Shape::Parts),
        1 => Just(Shape::PartsWithImage),
        1 => Just(Shape::Object),
    ]
}

fn content(text: &str, shape: &Shape) -> Value {
    match shape {
        Shape::Plain => json!(text),
        Shape::Parts => json!([{"type": "text", "text": text}, {"type": "text", "text": "…"}]),
        Shape::PartsWithImage => json!([
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}}
        ]),
        Shape::Object => json!({"kind": "custom", "text": text}),
    }
}

#[derive(Debug, Clone)]
enum Step {
    Say(String),
    /// Parallel calls (name, argument, result, result shape), results reversed or not.
    Call(Vec<(String, String, String, Shape)>, bool),
    /// Defects and rarities of real histories: a tool result whose call never existed,
    /// a call never answered, a system message mid-conversation, a legacy function call.
    Orphan(String),
    Unanswered(String),
    System(String),
    Function(String),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    let call = ("[a-z_]{1,12}", text(), output(), shape());
    prop_oneof![
        2 => text().prop_map(Step::Say),
        3 => (proptest::collection::vec(call, 1..4), any::<bool>())
            .prop_map(|(calls, rev)| Step::Call(calls, rev)),
        1 => prop_oneof![
            text().prop_map(Step::Orphan),
            "[a-z_]{1,12}".prop_map(Step::Unanswered),
            text().prop_map(Step::System),
            output().prop_map(Step::Function),
        ],
    ]
}

#[derive(Debug, Clone)]
struct Conversation {
    system: Vec<String>,
    turns: Vec<(String, Shape, Vec<Step>)>,
    /// Tool call ids repeat in every assistant message (`call_0`, `call_1`…).
    reuse_ids: bool,
    /// Which messages get an unknown extra field (by index modulo 7).
    extra: u8,
}

fn conversation() -> impl proptest::strategy::Strategy<Value = Conversation> {
    (
        proptest::collection::vec(text(), 0..3),
        proptest::collection::vec(
            (text(), shape(), proptest::collection::vec(step(), 0..4)),
            1..18,
        ),
        any::<bool>(),
        any::<u8>(),
    )
        .prop_map(|(system, turns, reuse_ids, extra)| Conversation {
            system,
            turns,
            reuse_ids,
            extra,
        })
}

impl Conversation {
    fn messages(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for (i, s) in self.system.iter().enumerate() {
            let role = if i == 0 { "system" } else { "developer" };
            out.push(json!({"role": role, "content": s}));
        }
        let mut call_no = 0;
        for (user, shape, steps) in &self.turns {
            out.push(json!({"role": "user", "content": content(user, shape)}));
            for step in steps {
                match step {
                    Step::Say(t) => out.push(json!({"role": "assistant", "content": t})),
                    Step::Orphan(t) => out.push(json!({"role": "tool", "tool_call_id": "nobody", "content": t})),
                    Step::Unanswered(name) => out.push(json!({"role": "assistant", "content": null, "tool_calls": [
                        {"id": "never", "type": "function", "function": {"name": name, "arguments": "{}"}}]})),
                    Step::System(t) => out.push(json!({"role": "system", "content": t})),
                    Step::Function(result) => {
                        out.push(json!({"role": "assistant", "content": null, "function_call": {"name": "legacy", "arguments": "{}"}}));
                        out.push(json!({"role": "function", "name": "legacy", "content": result}));
                    }
                    Step::Call(calls, reversed) => {
                        let ids: Vec<String> = (0..calls.len())
                            .map(|k| {
                                call_no += 1;
                                if self.reuse_ids {
                                    format!("call_{k}")
                                } else {
                                    format!("call_{call_no}")
                                }
                            })
                            .collect();
                        let tool_calls: Vec<Value> = calls
                            .iter()
                            .zip(&ids)
                            .map(|((name, arg, _, _), id)| {
                                json!({"id": id, "type": "function", "function": {"name": name, "arguments": json!({"path": arg}).to_string()}})
                            })
                            .collect();
                        out.push(
                            json!({"role": "assistant", "content": null, "tool_calls": tool_calls}),
                        );
                        let mut results: Vec<Value> = calls
                            .iter()
                            .zip(&ids)
                            .map(|((_, _, result, shape), id)| {
                                json!({"role": "tool", "tool_call_id": id, "content": content(result, shape)})
                            })
                            .collect();
                        if *reversed {
                            results.reverse();
                        }
                        out.extend(results);
                    }
                }
            }
        }
        for (i, m) in out.iter_mut().enumerate() {
            if (i + usize::from(self.extra)) % 7 == 0 {
                m["x_vendor"] = json!({"trace": i, "ü": [1, 2]});
            }
        }
        out
    }
}

/// A summariser for the property tests, chosen by the case.
#[derive(Debug, Clone, Copy)]
enum Fake {
    Echo,
    Fail,
    Timeout,
    Empty,
    NoSections,
}

fn fake() -> impl proptest::strategy::Strategy<Value = Fake> {
    prop_oneof![
        3 => Just(Fake::Echo),
        1 => Just(Fake::Fail),
        1 => Just(Fake::Timeout),
        1 => Just(Fake::Empty),
        1 => Just(Fake::NoSections),
    ]
}

fn answer(fake: Fake, request: &SummaryRequest) -> Result<String, SummaryError> {
    match fake {
        Fake::Echo => Ok(echo_summary(request)),
        Fake::Fail => Err(SummaryError::Status(500)),
        Fake::Timeout => Err(SummaryError::TimedOut),
        Fake::Empty => Ok(String::new()),
        Fake::NoSections => Ok("All good.".to_owned()),
    }
}

/// Every property of one compaction; returns the plan when there was one.
fn check(
    strategy: Strategy,
    messages: &[Item<'_>],
    inp: &Input<'_>,
    settings: &Settings,
    fake: Fake,
) -> Result<Option<Plan>, TestCaseError> {
    let e = inp.estimator;
    let calls = RefCell::new(0);
    let result = run(strategy, inp, settings, |r| {
        *calls.borrow_mut() += 1;
        let a = answer(fake, &r);
        async move { a }
    });
    prop_assert!(*calls.borrow() <= 1);
    let plan = match result {
        Ok(plan) => plan,
        Err(CannotCompact::TooLarge { estimate, budget }) => {
            prop_assert!(estimate > budget);
            // The estimate is what the smallest possible request needs, not more: with
            // exactly that budget, recency fits.
            let at_estimate = Input {
                budget: estimate,
                messages: inp.messages,
                previous: inp.previous,
                focus: inp.focus,
                estimator: inp.estimator,
                format: crate::formats::Format::Chat,
            };
            match run(Strategy::Recency, &at_estimate, settings, |r| {
                let a = answer(fake, &r);
                async move { a }
            }) {
                Ok(plan) => prop_assert!(plan.tokens_after <= estimate),
                Err(CannotCompact::NothingToReplace) => {}
                Err(other) => {
                    return Err(TestCaseError::fail(format!(
                        "TooLarge said {estimate} tokens would do, but at that budget: {other}"
                    )));
                }
            }
            return Ok(None);
        }
        Err(CannotCompact::NothingToReplace) => return Ok(None),
        Err(other) => return Err(TestCaseError::fail(other.to_string())),
    };
    prop_assert_eq!(validate(messages, &plan), Ok(()));
    // `compact` replaces an invalid plan by recency; a strategy that always produced
    // invalid plans would pass the validation above, so say it here.
    prop_assert!(
        !matches!(plan.fallback, Some(Fallback::Invalid(_))),
        "{:?} produced an invalid plan",
        strategy
    );
    prop_assert!(
        plan.tokens_after <= inp.budget,
        "{} > {}",
        plan.tokens_after,
        inp.budget
    );
    prop_assert_eq!(plan.tokens_after, forwarded_tokens(messages, &plan, e));
    prop_assert_eq!(plan.requested, strategy);
    prop_assert_eq!(plan.fallback.is_some(), plan.strategy != strategy);
    if plan.fallback.is_some() {
        prop_assert_eq!(plan.strategy, Strategy::Recency);
    }
    if matches!(strategy, Strategy::Structured | Strategy::LlmReplace)
        && !matches!(fake, Fake::Echo)
    {
        prop_assert_eq!(plan.strategy, Strategy::Recency);
    }
    prop_assert_eq!(frames(messages, &plan), 1);
    // The head and the final turn are the client's bytes.
    let out = plan.forwarded(messages);
    let layout = Layout::new(messages).unwrap();
    for i in 0..layout.sys {
        prop_assert_eq!(out[i].get(), messages[i].raw.get());
    }
    let final_len = messages.len() - layout.last_user;
    for k in 0..final_len {
        prop_assert_eq!(
            out[out.len() - final_len + k].get(),
            messages[layout.last_user + k].raw.get()
        );
    }
    Ok(Some(plan))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn every_strategy_is_valid_and_within_budget(
        conv in conversation(),
        ratio in 0.02f64..1.2,
        fake in fake(),
        protect_head in 0usize..6,
        protect_tail_min in 0usize..8,
        tool_prune_chars in prop_oneof![Just(2000usize), 10usize..500],
        system_role in any::<bool>(),
    ) {
        let b = body(&conv.messages());
        let messages = parse(&b);
        let e = Estimator::approx();
        let budget = (e.messages(&messages) as f64 * ratio) as u64 + 20;
        let settings = Settings {
            protect_head,
            protect_tail_min,
            tool_prune_chars,
            summary_role: if system_role { SummaryRole::System } else { SummaryRole::User },
            ..Settings::default()
        };
        let inp = input(&messages, budget, &e);
        for strategy in Strategy::ALL {
            let plan = check(strategy, &messages, &inp, &settings, fake)?;
            // No LLM involved: the same bytes every run.
            if let (Some(plan), Strategy::Recency | Strategy::Deterministic) = (plan, strategy) {
                let again = check(strategy, &messages, &inp, &settings, fake)?.unwrap();
                prop_assert_eq!((plan.head, plan.through), (again.head, again.through));
                let a: Vec<&str> = plan.replacement.iter().map(|r| r.get()).collect();
                let b: Vec<&str> = again.replacement.iter().map(|r| r.get()).collect();
                prop_assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn iterative_compaction_never_nests_summaries(
        conv in conversation(),
        more in proptest::collection::vec(
            (text(), shape(), proptest::collection::vec(step(), 0..3)), 1..8),
        ratio in 0.05f64..0.9,
        fake in fake(),
    ) {
        let e = Estimator::approx();
        let settings = Settings::default();
        let b1 = body(&conv.messages());
        let m1 = parse(&b1);
        let budget = (e.messages(&m1) as f64 * ratio) as u64 + 20;
        let mut longer = conv.clone();
        longer.turns.extend(more);
        let b2 = body(&longer.messages());
        let m2 = parse(&b2);
        for strategy in Strategy::ALL {
            let Some(first) = check(strategy, &m1, &input(&m1, budget, &e), &settings, fake)? else {
                continue;
            };
            let mut inp = input(&m2, budget, &e);
            inp.previous = Some(Previous {
                head: first.head,
                through: first.through,
                replacement: &first.replacement,
                summary: first.summary.as_deref(),
            });
            let prompts = RefCell::new(Vec::new());
            let second = run(strategy, &inp, &settings, |r: SummaryRequest| {
                prompts.borrow_mut().push(r.prompt.clone());
                let a = answer(fake, &r);
                async move { a }
            });
            let Ok(second) = second else { continue };
            prop_assert_eq!(validate(&m2, &second), Ok(()));
            prop_assert!(second.tokens_after <= budget);
            // One framed message in what is forwarded, none in what is summarised.
            prop_assert_eq!(frames(&m2, &second), 1);
            for p in prompts.borrow().iter() {
                prop_assert!(!p.contains(FRAME));
                prop_assert!(p.matches("PREVIOUS SUMMARY:").count() <= 1);
            }
            // Checkpoints only grow.
            prop_assert!(second.through >= first.through);
        }
    }
}
