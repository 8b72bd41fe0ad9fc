//! `structured` and `llm_replace`: one LLM summary in a fixed section template replaces
//! the middle (structured: between the head and a token-budgeted tail; llm_replace:
//! everything between the head and the final turn).
//!
//! - The summariser sees the transcript [`super::transcript`] writes, and is asked for
//!   what the edges leave of the budget (at most `summary_max_tokens`), in tokens and in
//!   words.
//! - A later compaction with the previous summary at hand sends `PREVIOUS SUMMARY` plus
//!   only the messages since, and asks for an update: never a summary of a summary, and
//!   the cost of an update does not grow with the conversation.
//! - A transcript longer than one request holds (`transcript_max_chars`, or what the
//!   summariser's window leaves beside the prompt, a previous summary and the answer)
//!   is summarised in parts, oldest first, each an update of the summary so far (at
//!   most [`MAX_PARTS`]; older messages are left out, and counted).
//! - Before use, the gate ([`super::gate`]): sections repaired, what the summary dropped
//!   appended, rejected only for inventing. A summary keeping fewer than
//!   `min_identifier_ratio` of the covered messages' identifiers is asked for once more,
//!   listing what it dropped; the better answer is used. An answer cut at the token cap
//!   keeps its complete lines; one over the budget is trimmed by section ([`super::fit`]),
//!   counted as the provider counts it where its reported length tells ([`density`]).
//!   A rejected summary, an empty answer, any summariser error or timeout, or no room
//!   for even a minimal summary: the caller gets recency instead, with the reason in
//!   [`super::Plan::fallback`].

use std::future::Future;

use super::fit;
use super::gate::{self, Covered, Verdict};
use super::redact::redact;
use super::text::identifiers;
pub(crate) use super::transcript::SYSTEM;
use super::transcript::{Transcript, instruction, prompt};
use super::{
    Answer, Cpu, Ctx, Edges, Fallback, InContext, Origin, Plan, Strategy, SummaryError,
    SummaryRequest, Tail, authored,
};

/// Tokens set aside for the framing around the summary body.
const FRAMING_TOKENS: u64 = 96;
/// The smallest summary worth asking for: the edges leave at least this much room.
const MIN_SUMMARY_TOKENS: u64 = 160;
/// Parts one transcript is summarised in at most (older messages are left out).
const MAX_PARTS: usize = 4;
/// Tokens of the summariser's window its instructions and the template take.
const PROMPT_TOKENS: u64 = 1_000;
/// The smallest part worth sending, in characters.
const MIN_PART_CHARS: usize = 4_000;
/// Fewest estimated tokens of an answer its reported length is compared with.
const MIN_MEASURED: u64 = 32;
/// A summary the provider counts at more than this many times its estimate is not
/// believed to be that dense: the count holds what the text does not (a reasoning
/// model's thinking).
const MAX_DENSITY: f64 = 3.0;

pub(super) async fn plan<F, Fut, A>(
    ctx: &Ctx<'_, '_>,
    tail: Tail,
    summarise: &F,
    cpu: &impl Cpu,
) -> Result<Plan, Fallback>
where
    F: Fn(SummaryRequest) -> Fut,
    Fut: Future<Output = Result<A, SummaryError>>,
    A: Into<Answer>,
{
    let strategy = match tail {
        Tail::Budgeted | Tail::Filled { .. } => Strategy::Structured,
        Tail::FinalTurn => Strategy::LlmReplace,
    };
    let permit = cpu.acquire().await;
    let prepared = cpu.run(&permit, || prepare(ctx, tail));
    drop(permit);
    if let Some(room) = prepared.short_of_room {
        // Not even a minimal summary fits beside what every plan keeps: no call paid for
        // an answer that could not be used.
        return Err(Fallback::OverBudget {
            estimate: ctx.input.budget + MIN_SUMMARY_TOKENS - room,
            budget: ctx.input.budget,
        });
    }
    let (asked, previous) = match &prepared.ask {
        None => (None, prepared.previous.map(str::to_owned)),
        Some((parts, max_tokens)) => {
            let asked = (parts.as_slice(), *max_tokens);
            let range = (prepared.previous, prepared.updates, prepared.through);
            let (asked, merged) = in_parts(ctx, asked, range, summarise, cpu).await?;
            (Some(asked), merged)
        }
    };
    let edges = (prepared.head, prepared.through);
    let permit = cpu.acquire().await;
    cpu.run(&permit, || {
        match (asked, prepared.ask.as_ref().and_then(|(p, _)| p.last())) {
            (Some(Asked { judged, density }), Some(transcript)) => {
                // What the gate appends, worked out again for a summary trimmed to fit.
                let carried = previous.as_deref().map(identifiers).unwrap_or_default();
                let covered = Covered {
                    text: "",
                    said: &transcript.said,
                    observed: &transcript.observed,
                    carried: &carried,
                    latest_ask: transcript.latest_ask.as_deref(),
                };
                let remake = |body: &str| gate::appendix(body, &covered).0;
                let gate::Judged {
                    body,
                    appendix,
                    verdict,
                } = judged;
                fitted(
                    ctx,
                    (strategy, edges),
                    (body, appendix),
                    (Some(verdict), density),
                    &remake,
                )
            }
            _ => {
                let previous = previous.unwrap_or_default().trim().to_owned();
                fitted(
                    ctx,
                    (strategy, edges),
                    (previous, String::new()),
                    (None, 1.0),
                    &|_| String::new(),
                )
            }
        }
    })
}

/// The plan that replaces `edges` by the summary (`body` and what the gate appended to
/// it), framed; trimmed by section until it fits the budget (see [`fit`]), never
/// refused for its size unless not even its headings fit. `density`: how many times
/// its estimate the provider counts the summary (see [`density`]); the summary is
/// fitted at that count, while the plan's `tokens_after` stays the estimate.
fn fitted(
    ctx: &Ctx<'_, '_>,
    (strategy, edges): (Strategy, (usize, usize)),
    (body, appendix): (String, String),
    (mut verdict, density): (Option<Verdict>, f64),
    remake: &dyn Fn(&str) -> String,
) -> Result<Plan, Fallback> {
    let budget = ctx.input.budget;
    let tokens = |text: &str| denser(ctx.estimator().text(text), density);
    // The plan as the provider counts it: the summary at its density (only ever above 1
    // with the calibrated estimate, which adds up by the byte: body and appendix apart).
    let counted = |plan: &Plan, body: &str, appendix: &str| {
        if density <= 1.0 {
            return plan.tokens_after;
        }
        let summary = ctx.estimator().text(body) + ctx.estimator().text(appendix);
        plan.tokens_after + denser(summary, density) - summary
    };
    let mut plan = framed(ctx, strategy, edges, format!("{body}{appendix}"));
    let (mut body, mut appendix) = (body, appendix);
    let mut cost = counted(&plan, &body, &appendix);
    let mut taken: Vec<(String, usize)> = Vec::new();
    let mut appendix_trimmed = false;
    // Each round trims what the estimate says is over; bounded (each round takes at
    // least a line, and the appendix it may bring back is trimmed in the end).
    for _ in 0..24 {
        if cost <= budget {
            break;
        }
        // A line's own estimate can be a little under what it costs in the plan.
        let over = cost - budget;
        let over = over + over / 8 + 2;
        if let Some(trimmed) = fit::trim_body(&body, over, &tokens) {
            body = trimmed.body;
            appendix = remake(&body);
            for (name, n) in trimmed.taken {
                match taken.iter_mut().find(|(t, _)| *t == name) {
                    Some((_, total)) => *total += n,
                    None => taken.push((name, n)),
                }
            }
        } else if let Some(trimmed) = fit::trim_appendix(&appendix, over, &tokens) {
            appendix = trimmed;
            appendix_trimmed = true;
        } else {
            break;
        }
        plan = framed(ctx, strategy, edges, format!("{body}{appendix}"));
        cost = counted(&plan, &body, &appendix);
    }
    if cost > budget {
        return Err(Fallback::OverBudget {
            estimate: cost,
            budget,
        });
    }
    if let Some(v) = &mut verdict
        && (!taken.is_empty() || appendix_trimmed)
    {
        let mut what: Vec<String> = taken
            .iter()
            .map(|(name, n)| format!("{n} lines of {name}"))
            .collect();
        if appendix_trimmed {
            what.push("appended identifiers".to_owned());
        }
        let counted = if density > 1.0 {
            format!(" (counted at {density:.1}× its estimate, as the provider counted it)")
        } else {
            String::new()
        };
        v.repaired
            .push(format!("trimmed to fit{counted}: {}", what.join(", ")));
    }
    plan.verdict = verdict;
    Ok(plan)
}

/// `tokens` (an estimate) at `density` times, rounded up.
fn denser(tokens: u64, density: f64) -> u64 {
    if density <= 1.0 {
        return tokens;
    }
    (tokens as f64 * density).ceil() as u64
}

/// How many times its estimate the provider counted `answer`, relative to how it
/// counts this conversation ([`super::Input::summary_ratio`]): at least 1. 1 when that
/// is not known (another model or provider summarises, or the estimate is the model's
/// own tokenizer), when the answer is too short to tell, or when the count is not
/// believable as the text's ([`MAX_DENSITY`]).
fn density(ctx: &Ctx<'_, '_>, answer: &Answer) -> f64 {
    let (Some(ratio), Some(spent)) = (ctx.input.summary_ratio, answer.spent) else {
        return 1.0;
    };
    let estimate = ctx.estimator().text(&answer.text);
    if estimate < MIN_MEASURED || spent.output == 0 {
        return 1.0;
    }
    let measured = spent.output as f64 / estimate as f64;
    if measured > MAX_DENSITY {
        return 1.0;
    }
    (measured / ratio.max(0.5)).max(1.0)
}

/// The plan that replaces `edges` by `body`, framed, whatever its size.
fn framed(
    ctx: &Ctx<'_, '_>,
    strategy: Strategy,
    (head, through): (usize, usize),
    body: String,
) -> Plan {
    // Kept for the next update and stored: no secret, whatever the summariser wrote.
    let body = redact(&body).into_owned();
    let framed = format!(
        "Summary of {} earlier messages ({}), condensed to fit the context window. It is \
         background about what happened, not a request: respond to the latest user message \
         below.\n\n{body}",
        through + 1 - head,
        super::recency::span_ids(head, through + 1 - head),
    );
    let raw = authored(ctx.input.format, ctx.settings.summary_role, &framed);
    ctx.plan(
        strategy,
        strategy,
        (head, through),
        vec![(raw, Origin::Authored)],
        Some(body),
    )
}

/// A summariser's answer put through the gate, and how densely it runs ([`density`]).
struct Asked {
    judged: gate::Judged,
    density: f64,
}

/// Summarises the parts of a transcript in turn, each an update of the summary so far
/// (the first, of `previous` when there is one); the last through [`ask`] like a
/// single transcript. The judged last answer, and the summary it updated.
async fn in_parts<F, Fut, A>(
    ctx: &Ctx<'_, '_>,
    (parts, max_tokens): (&[Transcript], u32),
    (previous, updates, through): (Option<&str>, Option<usize>, usize),
    summarise: &F,
    cpu: &impl Cpu,
) -> Result<(Asked, Option<String>), Fallback>
where
    F: Fn(SummaryRequest) -> Fut,
    Fut: Future<Output = Result<A, SummaryError>>,
    A: Into<Answer>,
{
    let mut so_far = previous.map(str::to_owned);
    let Some((last, earlier)) = parts.split_last() else {
        return Err(Fallback::EmptySummary);
    };
    for part in earlier {
        let asked = ask(
            ctx,
            (part, so_far.as_deref()),
            request(ctx, part, so_far.as_deref(), max_tokens),
            summarise,
            cpu,
        )
        .await?;
        so_far = Some(carried_on(ctx, asked.judged, max_tokens));
    }
    let mut request = request(ctx, last, so_far.as_deref(), max_tokens);
    // One request holds the whole range: it may be asked after the conversation itself.
    if earlier.is_empty() {
        request.in_context = Some(InContext {
            through,
            updates,
            instruction: instruction(last, previous.is_some(), (ctx.input.focus, max_tokens)),
        });
    }
    let mut asked = ask(ctx, (last, so_far.as_deref()), request, summarise, cpu).await?;
    if !earlier.is_empty() {
        asked
            .judged
            .verdict
            .repaired
            .push(format!("summarised in {} parts", parts.len()));
    }
    Ok((asked, so_far))
}

/// The request for one transcript (an update of `previous` when there is one).
fn request(
    ctx: &Ctx<'_, '_>,
    transcript: &Transcript,
    previous: Option<&str>,
    max_tokens: u32,
) -> SummaryRequest {
    SummaryRequest {
        system: SYSTEM.to_owned(),
        prompt: prompt(transcript, previous, (ctx.input.focus, max_tokens)),
        max_tokens,
        in_context: None,
    }
}

/// A part's summary as the next part's previous summary: with what the gate appended
/// (so the next update, and its gate, carry those identifiers on), that list trimmed
/// when the whole is over twice the cap.
fn carried_on(ctx: &Ctx<'_, '_>, judged: gate::Judged, max_tokens: u32) -> String {
    let tokens = |text: &str| ctx.estimator().text(text);
    let cap = 2 * u64::from(max_tokens);
    let whole = tokens(&judged.body) + tokens(&judged.appendix);
    let appendix = match whole.checked_sub(cap) {
        Some(over) if over > 0 => {
            fit::trim_appendix(&judged.appendix, over, &tokens).unwrap_or_default()
        }
        _ => judged.appendix,
    };
    format!("{}{appendix}", judged.body)
}

/// Asks the summariser and puts the answer through the gate. An answer that kept fewer
/// than `min_identifier_ratio` of the covered identifiers — the new messages' and, for
/// an update, the previous summary's, so nothing it carried silently disappears — is
/// followed by one more request that lists what it dropped; the answer that kept more is
/// used, repaired.
async fn ask<F, Fut, A>(
    ctx: &Ctx<'_, '_>,
    (transcript, previous): (&Transcript, Option<&str>),
    request: SummaryRequest,
    summarise: &F,
    cpu: &impl Cpu,
) -> Result<Asked, Fallback>
where
    F: Fn(SummaryRequest) -> Fut,
    Fut: Future<Output = Result<A, SummaryError>>,
    A: Into<Answer>,
{
    let retry = request.clone();
    // What the summary may name without inventing: what the summariser was shown.
    let permit = cpu.acquire().await;
    let shown = cpu.run(&permit, || shown(ctx, &retry));
    drop(permit);
    let carried = previous.map(identifiers).unwrap_or_default();
    let covered = Covered {
        text: &shown,
        said: &transcript.said,
        observed: &transcript.observed,
        carried: &carried,
        latest_ask: transcript.latest_ask.as_deref(),
    };
    let first: Answer = summarise(request)
        .await
        .map_err(Fallback::Summariser)?
        .into();
    let answer = usable(&first);
    if answer.is_empty() {
        return Err(Fallback::EmptySummary);
    }
    let mut cut = first.cut;
    let mut dense = density(ctx, &first);
    let permit = cpu.acquire().await;
    let (dropped, of) = cpu.run(&permit, || gate::dropped(&answer, &covered));
    drop(permit);
    let kept = of - dropped.len();
    let mut best = answer;
    if of > 0 && (kept as f64) < ctx.settings.min_identifier_ratio * of as f64 {
        let again = retry.with_addendum(&format!(
            "A first summary left out these identifiers of the transcript; write the \
             summary again and keep each exactly as written: {}",
            dropped.join(", ")
        ));
        if let Ok(second) = summarise(again).await {
            let second: Answer = second.into();
            let text = usable(&second);
            let permit = cpu.acquire().await;
            let (still, _) = cpu.run(&permit, || gate::dropped(&text, &covered));
            if !text.is_empty() && still.len() < dropped.len() {
                best = text;
                cut = second.cut;
                dense = density(ctx, &second);
            }
        }
    }
    let permit = cpu.acquire().await;
    let mut judged = cpu
        .run(&permit, || gate::judge(&best, &covered))
        .map_err(Fallback::Fidelity)?;
    if cut {
        judged.verdict.repaired.insert(
            0,
            "cut at the token cap: its complete lines kept".to_owned(),
        );
    }
    Ok(Asked {
        judged,
        density: dense,
    })
}

/// What a summary asked with `request` was shown, that it may name without inventing:
/// the transcript and, for an update, the previous summary (the prompt holds both);
/// asked after the conversation itself ([`InContext`]), also the conversation's messages
/// through the end of the range, as sent (the protected head among them, which the
/// transcript leaves out and the summariser reads there).
fn shown(ctx: &Ctx<'_, '_>, request: &SummaryRequest) -> String {
    let Some(in_context) = &request.in_context else {
        return request.prompt.clone();
    };
    let messages = ctx.input.messages.iter().take(in_context.through + 1);
    let mut text = request.prompt.clone();
    for message in messages {
        text.push('\n');
        text.push_str(message.raw.get());
    }
    text
}

/// The text of an answer to use: trimmed, and for one cut at the token cap only its
/// complete lines (the gate then puts back the sections it never reached).
fn usable(answer: &Answer) -> String {
    if answer.cut {
        fit::complete_lines(&answer.text).trim().to_owned()
    } else {
        answer.text.trim().to_owned()
    }
}

/// The edges of a summary plan and what to ask the summariser (`None`: the previous
/// summary covers exactly the range and is reused).
struct Prepared<'p> {
    head: usize,
    through: usize,
    previous: Option<&'p str>,
    /// The `through` of the previous summary (`previous`'s range).
    updates: Option<usize>,
    /// The transcript in parts (oldest first), and the summary's cap.
    ask: Option<(Vec<Transcript>, u32)>,
    /// The room the edges leave, when it is less than a minimal summary.
    short_of_room: Option<u64>,
}

/// The edges first — the head, and the tail within its share of the budget, leaving
/// room for at least a minimal summary ([`MIN_SUMMARY_TOKENS`]; one turn fewer in the
/// tail where that is what it takes) — then the summary's size: what the budget leaves
/// beside them and the framing, at most `summary_max_tokens`.
fn prepare<'p>(ctx: &Ctx<'_, 'p>, tail: Tail) -> Prepared<'p> {
    let reserve = MIN_SUMMARY_TOKENS + FRAMING_TOKENS;
    let Edges { head, start } = ctx.edges(reserve, tail, &|k| ctx.cost(k..k + 1));
    let room = ctx
        .input
        .budget
        .saturating_sub(ctx.total(head, FRAMING_TOKENS, start));
    let max_tokens = u32::try_from(room)
        .unwrap_or(u32::MAX)
        .clamp(1, ctx.settings.summary_max_tokens.max(1));
    let through = start - 1;
    // An update of the previous summary when it covers a prefix of this range.
    let previous = ctx
        .previous()
        .and_then(|p| Some((p.through, p.summary?)))
        .filter(|&(p_through, _)| {
            ctx.previous().is_some_and(|p| p.head == head) && p_through <= through
        });
    let ask = match previous {
        Some((p_through, _)) if p_through == through => None,
        _ => {
            let from = previous.map_or(head, |(p_through, _)| p_through + 1);
            let parts = Transcript::parts(
                ctx,
                from..=through,
                (part_chars(ctx, max_tokens), MAX_PARTS),
            );
            Some((parts, max_tokens))
        }
    };
    Prepared {
        head,
        through,
        previous: previous.map(|(_, s)| s),
        updates: previous.map(|(t, _)| t),
        ask,
        short_of_room: (room < MIN_SUMMARY_TOKENS).then_some(room),
    }
}

/// The most characters of transcript one summary request carries: `transcript_max_chars`,
/// and no more than the summariser's window holds beside the instructions, a previous
/// summary and the answer (at three characters a token: code and logs run denser than
/// prose).
fn part_chars(ctx: &Ctx<'_, '_>, max_tokens: u32) -> usize {
    let configured = ctx.settings.transcript_max_chars;
    let Some(window) = ctx.input.summary_window else {
        return configured;
    };
    let room = window.saturating_sub(PROMPT_TOKENS + 2 * u64::from(max_tokens));
    let chars = usize::try_from(room.saturating_mul(3)).unwrap_or(usize::MAX);
    configured.min(chars).max(MIN_PART_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_found_in_common_markdown_shapes() {
        let full = "## Goal\nx\n**Constraints & Preferences**\n### Progress\n1. Key Decisions\n\
                    # Relevant Files\n- Next Steps:\nCRITICAL CONTEXT\n";
        assert!(gate::sections(full).1.is_empty());
        assert_eq!(
            gate::sections("## Goal\n## Progress").1,
            vec![
                "Constraints & Preferences",
                "Key Decisions",
                "Relevant Files",
                "Next Steps",
                "Critical Context"
            ]
        );
        assert!(
            gate::sections(super::super::transcript::TEMPLATE)
                .1
                .is_empty()
        );
    }
}
