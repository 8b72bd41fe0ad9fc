//! Property tests over random conversations: generators of conversations with the
//! shapes and defects of real histories, fake summarisers, and the properties every
//! compaction must have.

use std::cell::RefCell;

use proptest::prelude::{
    Just, ProptestConfig, TestCaseError, any, prop_assert, prop_assert_eq, prop_oneof, proptest,
};
use proptest::strategy::Strategy as _;

use super::*;

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
    // One request, and one more when the first answer dropped most identifiers.
    prop_assert!(*calls.borrow() <= 2);
    let plan = match result {
        Ok(plan) => plan,
        Err(CannotCompact::TooLarge { estimate, budget }) => {
            prop_assert!(estimate > budget);
            check_too_large_estimate(inp, settings, fake, estimate)?;
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
    // Failures fall back; an answer without the template's form is repaired (or, when
    // the repaired summary does not fit, falls back too).
    if strategy.summarises() && !matches!(fake, Fake::Echo | Fake::NoSections) {
        prop_assert_eq!(plan.strategy, Strategy::Recency);
    }
    if let (Some(_), Fake::NoSections) = (&plan.verdict, fake) {
        let summary = plan.summary.as_deref().unwrap_or_default();
        prop_assert!(summary.contains("## Critical Context"), "{}", summary);
    }
    // One frame: abridge's marker or summary; none when nothing precedes the final turn
    // but the head, and the plan only clears inside it.
    let layout = Layout::new(messages).unwrap();
    let clear_only = layout.smallest().is_none();
    prop_assert_eq!(frames(messages, &plan), usize::from(!clear_only));
    if clear_only {
        prop_assert!(plan.head > layout.last_user && plan.summary.is_none());
    }
    check_kept(messages, inp, &plan)?;
    Ok(Some(plan))
}

/// The head and the final turn are the client's bytes: every message of the final turn
/// is there, in order, as it came — but for the results the model has acted on, which
/// recency may digest when the final turn does not fit whole, and then only when it had
/// to (the final turn whole is over the budget).
fn check_kept(messages: &[Item<'_>], inp: &Input<'_>, plan: &Plan) -> Result<(), TestCaseError> {
    let e = inp.estimator;
    let out = plan.forwarded(messages);
    let layout = Layout::new(messages).unwrap();
    for i in 0..layout.sys {
        prop_assert_eq!(out[i].get(), messages[i].raw.get());
    }
    let final_len = messages.len() - layout.last_user;
    let mut digested = 0;
    for k in 0..final_len {
        let (sent, original) = (
            out[out.len() - final_len + k],
            &messages[layout.last_user + k],
        );
        if sent.get() != original.raw.get() {
            prop_assert!(layout.clearable(layout.last_user + k));
            prop_assert!(inp.format.is_digest_of(sent, original.raw));
            digested += 1;
        }
    }
    if digested > 0 {
        let whole = forwarded_tokens(messages, plan, e) + whole_cost(plan, messages, e);
        prop_assert!(whole > inp.budget, "{} ≤ {}", whole, inp.budget);
    }
    Ok(())
}

/// What the final turn's digested results of `plan` would add, sent whole.
fn whole_cost(plan: &Plan, messages: &[Item<'_>], e: &Estimator) -> u64 {
    let last_user = Layout::new(messages).unwrap().last_user;
    let forwarded: u64 = plan
        .origin
        .iter()
        .zip(&plan.replacement)
        .filter_map(|(o, raw)| match *o {
            Origin::Digest(k) if k > last_user => Some((k, raw)),
            _ => None,
        })
        .map(|(k, raw)| {
            let digest = plan.format.item(Raw::from(&**raw)).unwrap();
            e.message(&messages[k]).saturating_sub(e.message(&digest))
        })
        .sum();
    forwarded
}

/// The estimate of [`CannotCompact::TooLarge`] is what the smallest possible request
/// needs, not more: with exactly that budget, recency fits.
fn check_too_large_estimate(
    inp: &Input<'_>,
    settings: &Settings,
    fake: Fake,
    estimate: u64,
) -> Result<(), TestCaseError> {
    let at_estimate = Input {
        budget: estimate,
        messages: inp.messages,
        previous: inp.previous,
        focus: inp.focus,
        estimator: inp.estimator,
        format: crate::formats::Format::Chat,
        summary_window: None,
        summary_ratio: None,
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
    Ok(())
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
                kept: &[],
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
