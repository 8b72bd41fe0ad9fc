//! The summarising strategies (structured, llm_replace): what the summariser is asked,
//! iterative updates, and the fallbacks to recency when its answer cannot be used.

use std::cell::RefCell;

use super::*;

/// A summary a good summariser would write for `agentic`.
fn good_summary(request: &SummaryRequest) -> String {
    let ids: Vec<String> = crate::strategies::text::identifiers(&request.prompt);
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
    inp.previous = Some(previous_of(&plan1));
    let plan2 = run(Strategy::Structured, &inp, &settings, summarise).unwrap();
    assert_eq!(plan2.strategy, Strategy::Structured, "{:?}", plan2.fallback);
    validate(&m2, &plan2).unwrap();
    assert!(plan2.through >= plan1.through);
    assert_eq!(plan2.head, plan1.head);
    let req = seen.borrow()[1].clone();
    assert!(req.prompt.contains("PREVIOUS SUMMARY"));
    assert!(req.prompt.contains(summary1.trim()));
    // Only the new messages are in the transcript, and no framed summary.
    let new_part = req.prompt.split("<new-messages-").nth(1).unwrap();
    assert!(!new_part.contains("Step 1: fix"), "old messages resent");
    assert!(new_part.contains("Step 11: fix") || new_part.contains("Step 12: fix"));
    assert!(!req.prompt.contains(FRAME));
    assert_eq!(frames(&m2, &plan2), 1);
}

/// The first `turns` turns of an [`agentic`] conversation, then a request to go on.
fn first_turns(msgs: &[Value], turns: usize) -> Vec<Value> {
    let mut history = msgs[..1 + 5 * turns].to_vec();
    history.push(json!({"role": "user", "content": "Continue with the next module please."}));
    history
}

/// `plan` as the checkpoint in force for the next compaction (read only for its edges
/// and summary: no kept messages).
fn previous_of(plan: &Plan) -> Previous<'_> {
    Previous {
        head: plan.head,
        through: plan.through,
        replacement: &plan.replacement,
        kept: &[],
        summary: plan.summary.as_deref(),
    }
}

/// Every heading, nothing else.
const SECTIONS_ONLY: &str = "## Goal\nx\n## Constraints\n## Progress\n## Key Decisions\n\
    ## Relevant Files\n## Next Steps\n## Critical Context\nnothing specific";

#[test]
fn summariser_failures_fall_back_to_recency() {
    let msgs = agentic(12, 300);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let budget = e.messages(&messages) / 2;
    let settings = Settings::default();
    let inp = input(&messages, budget, &e);
    let invents = |_: SummaryRequest| async {
        Ok("## Goal\nfix lib/a.rs, lib/b.rs, lib/c.rs and lib/d.rs".to_owned())
    };
    for strategy in [Strategy::Structured, Strategy::LlmReplace] {
        type Expected = fn(&Fallback) -> bool;
        let cases: Vec<(Plan, Expected)> = vec![
            (
                run(strategy, &inp, &settings, |_| async {
                    Err::<String, _>(SummaryError::Status(500))
                })
                .unwrap(),
                |f| matches!(f, Fallback::Summariser(SummaryError::Status(500))),
            ),
            (
                run(strategy, &inp, &settings, |_| async {
                    Err::<String, _>(SummaryError::TimedOut)
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
            (run(strategy, &inp, &settings, invents).unwrap(), |f| {
                matches!(f, Fallback::Fidelity(Fidelity::Invented { .. }))
            }),
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
        good_and_repaired_summaries_are_used(strategy, &inp, &settings, &messages);
    }
}

/// With `strategy`, a good summary is used, and a summary of poor form is repaired,
/// not fatal: what was dropped is asked for once more, then appended (a summary with
/// only headings, or with none, is used).
fn good_and_repaired_summaries_are_used(
    strategy: Strategy,
    inp: &Input<'_>,
    settings: &Settings,
    messages: &[Item<'_>],
) {
    let ok = run(strategy, inp, settings, |r| {
        let s = good_summary(&r);
        async move { Ok(s) }
    })
    .unwrap();
    assert_eq!(ok.strategy, strategy, "{:?}", ok.fallback);
    let calls = std::sync::atomic::AtomicUsize::new(0);
    for answer in [SECTIONS_ONLY, "Goal: fix things. Next steps: more."] {
        calls.store(0, std::sync::atomic::Ordering::Relaxed);
        let plan = run(strategy, inp, settings, |_| {
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move { Ok(answer.to_owned()) }
        })
        .unwrap();
        assert_eq!(plan.strategy, strategy, "{:?}", plan.fallback);
        let summary = plan.summary.as_deref().unwrap();
        for (name, _) in crate::strategies::gate::SECTIONS {
            assert!(summary.contains(&format!("## {name}")), "{name}: {summary}");
        }
        assert!(summary.contains("Also mentioned: "), "{summary}");
        assert!(summary.contains("src/mod_"), "{summary}");
        let verdict = plan.verdict.as_ref().unwrap();
        assert!(verdict.score < 0.5, "{verdict:?}");
        assert!(
            verdict
                .repaired
                .iter()
                .any(|r| r.starts_with("identifiers")),
            "{verdict:?}"
        );
        assert_eq!(
            calls.load(std::sync::atomic::Ordering::Relaxed),
            2,
            "one retry"
        );
        validate(messages, &plan).unwrap();
    }
}

#[test]
fn a_latest_ask_the_summary_missed_is_appended() {
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
    assert_eq!(plan.fallback, None);
    assert_eq!(plan.strategy, Strategy::LlmReplace);
    let summary = plan.summary.as_deref().unwrap();
    assert!(
        summary.contains("The latest request in these messages: Please migrate the database"),
        "{summary}"
    );
    assert!(
        plan.verdict
            .unwrap()
            .repaired
            .contains(&"latest ask".to_owned())
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
            async { Err::<String, _>(SummaryError::TimedOut) }
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

/// Ten successive compactions with a summariser that writes only about the new messages
/// (it forgets the previous summary): what the first summary carried is still there in
/// the tenth, because the gate holds an update to the previous summary's identifiers too.
#[test]
fn ten_iterative_updates_never_lose_what_the_first_carried() {
    let msgs = agentic(44, 200);
    let e = Estimator::approx();
    let settings = Settings::default();
    let forgetful = |r: SummaryRequest| {
        let new = r
            .prompt
            .split("<new-messages-")
            .last()
            .unwrap_or_default()
            .to_owned();
        let ids = crate::strategies::text::identifiers(&new);
        async move {
            Ok(format!(
                "## Goal\nFix bugs.\n## Relevant Files\n{}",
                ids.join(", ")
            ))
        }
    };
    let mut previous: Option<Plan> = None;
    let mut first: Option<String> = None;
    let mut updates = 0;
    for turns in (8..=44).step_by(4) {
        let b = body(&first_turns(&msgs, turns));
        let m = parse(&b);
        let mut inp = input(&m, e.messages(&m) / 2, &e);
        inp.previous = previous.as_ref().map(previous_of);
        let plan = run(Strategy::Structured, &inp, &settings, forgetful).unwrap();
        assert_eq!(plan.strategy, Strategy::Structured, "{:?}", plan.fallback);
        validate(&m, &plan).unwrap();
        let summary = plan.summary.clone().unwrap();
        match &first {
            None => first = Some(summary),
            Some(first) => {
                updates += 1;
                for id in crate::strategies::text::identifiers(first) {
                    assert!(
                        crate::strategies::text::mentions(&summary.replace(' ', ""), &id),
                        "update {updates}: {id} of the first summary is gone:\n{summary}"
                    );
                }
            }
        }
        previous = Some(plan);
    }
    assert!(updates >= 9, "{updates} updates");
}

/// Twenty successive updates by a summariser that rewrites freely — it keeps the whole
/// previous summary, repeats it, and adds the new messages' identifiers — and stops at
/// its token cap the way a model does: every summary stays within its cap (plus what
/// the gate appends), and every identifier of the first is still in the twentieth.
#[test]
fn twenty_free_rewrites_stay_bounded_and_keep_the_first_summarys_identifiers() {
    let msgs = agentic(84, 200);
    let e = Estimator::approx();
    let settings = Settings {
        summary_max_tokens: 400,
        ..Settings::default()
    };
    let rewriter = |r: SummaryRequest| {
        let previous = r
            .prompt
            .split("<previous-summary-")
            .nth(1)
            .and_then(|p| p.split_once('>'))
            .map(|(_, rest)| {
                rest.split("</previous-summary-")
                    .next()
                    .unwrap_or("")
                    .to_owned()
            })
            .unwrap_or_default();
        let new = r.prompt.split("<new-messages-").last().unwrap_or_default();
        let ids = crate::strategies::text::identifiers(new);
        let text = format!(
            "## Goal\nFix bugs.\n{previous}\n{previous}\n## Critical Context\n{}",
            ids.join(", ")
        );
        // A model stops at its cap: about four characters a token.
        let cap = r.max_tokens as usize * 4;
        let cut = text.chars().count() > cap;
        let text: String = text.chars().take(cap).collect();
        async move {
            Ok(Answer {
                text,
                cut,
                spent: None,
            })
        }
    };
    let mut previous: Option<Plan> = None;
    let mut first_ids: Vec<String> = Vec::new();
    let mut updates = 0;
    for turns in (8..=84).step_by(4) {
        let b = body(&first_turns(&msgs, turns));
        let m = parse(&b);
        let mut inp = input(&m, e.messages(&m) / 2, &e);
        inp.previous = previous.as_ref().map(previous_of);
        let plan = run(Strategy::Structured, &inp, &settings, rewriter).unwrap();
        assert_eq!(plan.strategy, Strategy::Structured, "{:?}", plan.fallback);
        assert!(plan.tokens_after <= inp.budget);
        let summary = plan.summary.clone().unwrap();
        if first_ids.is_empty() {
            first_ids = crate::strategies::text::identifiers(&summary);
            assert!(!first_ids.is_empty());
        } else {
            updates += 1;
            for id in &first_ids {
                assert!(
                    crate::strategies::text::mentions(&summary.replace(' ', ""), id),
                    "update {updates}: {id} of the first summary is gone:\n{summary}"
                );
            }
        }
        // Within the cap (in the rewriter's own measure, four characters a token), and
        // what the gate repairs and appends (sections, the first summary's identifiers,
        // the latest ask): it does not grow with the updates.
        let appended: usize = first_ids.iter().map(|id| id.len() + 2).sum::<usize>() + 600;
        let chars = summary.chars().count();
        assert!(
            chars <= settings.summary_max_tokens as usize * 4 + appended,
            "update {updates}: {chars} characters:\n{summary}"
        );
        previous = Some(plan);
    }
    assert!(updates >= 19, "{updates} updates");
}

/// A transcript longer than the summariser's window holds is summarised in parts, oldest
/// first, each an update of the summary so far: every request fits the window, and what
/// the oldest part named reaches the final summary. Without a window, the one request
/// `transcript_max_chars` allows.
#[test]
fn a_transcript_longer_than_the_summarisers_window_is_summarised_in_parts() {
    let msgs = agentic(30, 3000);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let budget = e.messages(&messages) / 4;
    let settings = Settings::default();
    let seen = RefCell::new(Vec::new());
    let summarise = |r: SummaryRequest| {
        seen.borrow_mut().push(r.clone());
        let answer = echo_summary(&r);
        async move { Ok(answer) }
    };
    let window = 16_384;
    let mut inp = input(&messages, budget, &e);
    inp.summary_window = Some(window);
    let plan = run(Strategy::Structured, &inp, &settings, summarise).unwrap();
    assert_eq!(plan.strategy, Strategy::Structured, "{:?}", plan.fallback);
    validate(&messages, &plan).unwrap();
    assert!(plan.tokens_after <= budget);
    let requests = seen.borrow().clone();
    assert!(
        (3..=4).contains(&requests.len()),
        "{} parts",
        requests.len()
    );
    assert!(!requests[0].prompt.contains("PREVIOUS SUMMARY"));
    for (n, r) in requests.iter().enumerate() {
        let size = e.text(&r.system) + e.text(&r.prompt) + u64::from(r.max_tokens);
        assert!(size <= window, "request {n}: {size} tokens");
        if n > 0 {
            assert!(r.prompt.contains("PREVIOUS SUMMARY"), "request {n}");
        }
    }
    // Nothing was left out: the first part starts where the head ends.
    assert!(!requests[0].prompt.contains("left out of this transcript"));
    assert!(requests[0].prompt.contains("Step 1: fix the bug"));
    let summary = plan.summary.as_deref().unwrap();
    for id in ["src/mod_0.rs", "ABC-1", "src/mod_12.rs"] {
        assert!(summary.contains(id), "{id}: {summary}");
    }
    let verdict = plan.verdict.as_ref().unwrap();
    assert!(
        verdict
            .repaired
            .contains(&format!("summarised in {} parts", requests.len())),
        "{verdict:?}"
    );

    seen.borrow_mut().clear();
    inp.summary_window = None;
    let whole = run(Strategy::Structured, &inp, &settings, summarise).unwrap();
    assert_eq!(whole.strategy, Strategy::Structured);
    assert_eq!(seen.borrow().len(), 1);
}

/// A summary the provider counts at more tokens than abridge estimates (ids and numbers
/// run about 2.5× denser on a small model's tokenizer than in the estimate) is fitted
/// as the provider counts it, when its count is the conversation's provider's: trimmed
/// further, and said so. Without that count, or with one no text is dense enough for (a
/// reasoning model's thinking is in it), or for a conversation counted as densely, it is
/// fitted by the estimate as before.
#[test]
fn a_summary_is_fitted_as_the_provider_counts_it() {
    let msgs = agentic(16, 300);
    let b = body(&msgs);
    let m = parse(&b);
    let e = Estimator::approx();
    let budget = e.messages(&m) / 2;
    let settings = Settings::default();
    let summary_with = |times: f64| {
        move |r: SummaryRequest| {
            let mut text = good_summary(&r);
            for n in 0..200 {
                text.push_str(&format!("- step {n}: m{n}, m{}, exit 0\n", n + 1));
            }
            let output = (Estimator::approx().text(&text) as f64 * times) as u64;
            let spent = crate::prices::Tokens {
                output,
                ..Default::default()
            };
            async move {
                Ok(Answer {
                    text,
                    cut: false,
                    spent: Some(spent),
                })
            }
        }
    };
    let plan_with = |ratio: Option<f64>, times: f64| {
        let mut inp = input(&m, budget, &e);
        inp.summary_ratio = ratio;
        let plan = run(Strategy::Structured, &inp, &settings, summary_with(times)).unwrap();
        assert_eq!(plan.strategy, Strategy::Structured, "{:?}", plan.fallback);
        validate(&m, &plan).unwrap();
        assert!(plan.tokens_after <= budget);
        plan
    };
    let summary_tokens = |plan: &Plan| e.text(plan.summary.as_deref().unwrap());
    let plain = plan_with(None, 2.5);
    let dense = plan_with(Some(1.0), 2.5);
    // As the provider counts it, the denser summary fits; the plain one would not.
    let counted = |plan: &Plan| plan.tokens_after + summary_tokens(plan) * 3 / 2;
    assert!(counted(&dense) <= budget, "{} > {budget}", counted(&dense));
    assert!(counted(&plain) > budget, "{} <= {budget}", counted(&plain));
    let repaired = &dense.verdict.as_ref().unwrap().repaired;
    assert!(
        repaired
            .iter()
            .any(|r| r.starts_with("trimmed to fit (counted at 2.5× its estimate")),
        "{repaired:?}"
    );
    for (ratio, times, why) in [
        (Some(1.0), 6.0, "not believable as the text's count"),
        (Some(2.5), 2.5, "the conversation is counted as densely"),
        (Some(1.0), 0.8, "sparser than the estimate"),
    ] {
        let plan = plan_with(ratio, times);
        assert_eq!(plan.summary, plain.summary, "{why}");
    }
}

/// A summary asked after the conversation itself (in context) may name what the
/// summariser read there beside the transcript — the protected head's paths — without
/// the gate taking them for invented; paths found nowhere still are.
#[test]
fn an_in_context_summary_may_name_the_heads_paths() {
    let mut messages = agentic(12, 300);
    messages[0] = json!({"role": "system", "content":
        "You are a coding agent. Settings: cfg/a.toml, cfg/b.toml, cfg/c.toml, cfg/d.toml."});
    let b = body(&messages);
    let m = parse(&b);
    let e = Estimator::approx();
    let inp = input(&m, e.messages(&m) / 2, &e);
    let settings = Settings::default();
    let asked = RefCell::new(Vec::new());
    let names = |paths: &'static str| {
        let asked = &asked;
        move |r: SummaryRequest| {
            asked.borrow_mut().push(r.in_context.is_some());
            let summary = format!("## Goal\nKeep the settings read from {paths}.");
            async move { Ok::<_, SummaryError>(summary) }
        }
    };
    let heads = "cfg/a.toml, cfg/b.toml, cfg/c.toml and cfg/d.toml";
    let plan = run(Strategy::Structured, &inp, &settings, names(heads)).unwrap();
    assert_eq!(plan.strategy, Strategy::Structured, "{:?}", plan.fallback);
    assert!(asked.borrow().iter().all(|in_context| *in_context));
    assert!(plan.summary.unwrap().contains("cfg/d.toml"));
    let nowhere = "etc/w.toml, etc/x.toml, etc/y.toml and etc/z.toml";
    let plan = run(Strategy::Structured, &inp, &settings, names(nowhere)).unwrap();
    assert!(
        matches!(
            plan.fallback,
            Some(Fallback::Fidelity(Fidelity::Invented { .. }))
        ),
        "{:?}",
        plan.fallback
    );
}
