//! `deterministic`: one summary message built without an LLM — message counts, tools
//! used, the recency index of the replaced messages (asks, tool calls, files,
//! identifiers, decisions and constraints), pending-work cues and a timeline of the
//! first 3 and last 5 replaced messages — between the head and a token-budgeted tail.
//! Same input, same bytes.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::OnceLock;

use regex::Regex;

use super::index;
use super::text::{first_line, paths, scanned, thousands, truncate_chars};
use super::{Ctx, Edges, Fallback, Origin, Plan, Strategy, Tail, authored, is_result};
use crate::conversation::{Item, Role};
use crate::tokens::Estimator;

/// Tokens set aside for the summary while choosing the edges; the real size is checked
/// afterwards.
const RESERVE: u64 = 1024;
const MAX_TOOLS: usize = 20;
const MAX_PATHS: usize = 30;
const MAX_REQUESTS: usize = 5;
const MAX_CUES: usize = 8;
const LINE_CHARS: usize = 200;

pub(super) fn plan(ctx: &Ctx<'_, '_>) -> Result<Plan, Fallback> {
    // The digest is the whole replacement here, so its index may take more than
    // recency's share of a small budget (a quarter of it at most).
    let budget = ctx.input.budget;
    let index_budget = ctx.settings.index_budget(budget).max(512).min(budget / 4);
    let tokens = |text: &str| ctx.estimator().text(text);
    let mut reserve = RESERVE + index_budget;
    let mut attempt = 0;
    loop {
        let Edges { head, start } = ctx.edges(reserve, Tail::Budgeted, &|k| ctx.cleared_cost(k));
        let range = &ctx.messages()[head..start];
        let index = index::index((head, range), index_budget, &tokens);
        let body = format!(
            "Messages {} of the conversation, condensed.\n{}",
            super::recency::span_ids(head, range.len()),
            summary(range, index)
        );
        let raw = authored(ctx.input.format, ctx.settings.summary_role, &body);
        let plan = ctx.plan(
            Strategy::Deterministic,
            Strategy::Deterministic,
            (head, start - 1),
            vec![(raw, Origin::Authored)],
            None,
        );
        // The summary's real size, before any clearing of the final turn.
        let summary = plan.tokens_after - ctx.total(head, 0, start);
        let plan = super::clear::fit(ctx, plan);
        if plan.tokens_after <= budget {
            return Ok(plan);
        }
        // Once more with the summary's real size set aside.
        attempt += 1;
        if attempt == 2 {
            return Err(Fallback::OverBudget {
                estimate: plan.tokens_after,
                budget,
            });
        }
        reserve = summary;
    }
}

/// The digest of `items` whole, no head kept and no tail: what abridge answers a
/// provider's compaction API with (see `crate::provider_apis`). `index_budget`: the
/// tokens its index of the items may take.
pub(crate) fn digest(items: &[Item<'_>], index_budget: u64, estimator: &Estimator) -> String {
    let tokens = |text: &str| estimator.text(text);
    let index = index::index((0, items), index_budget, &tokens);
    summary(items, index)
}

fn cue_pattern() -> &'static Regex {
    static P: OnceLock<Vec<Regex>> = OnceLock::new();
    &P.get_or_init(|| {
        super::text::compile(&[
            r"(?i)\b(?:todo|fixme|next steps?|pending|remaining|still need|not yet|follow[- ]up|left to do|to be done|will (?:now|next)|blocked)\b",
        ])
    })[0]
}

/// What the digest counts and collects over the replaced messages.
#[derive(Default)]
struct Tally {
    users: usize,
    assistants: usize,
    results: usize,
    /// Tool names in first-use order, with their counts; `tool_index` finds a name's
    /// entry in constant time (an agent may call thousands of distinct tools).
    tools: Vec<(String, usize)>,
    tool_index: HashMap<String, usize>,
    /// Path → when it was last mentioned (the latest mentions are listed).
    files: BTreeMap<String, usize>,
    mention: usize,
    requests: Vec<String>,
    cues: Vec<String>,
}

impl Tally {
    fn add(&mut self, m: &Item<'_>) {
        match m.role {
            Role::User => self.users += 1,
            Role::Assistant => self.assistants += 1,
            Role::Tool | Role::Function => self.results += 1,
            Role::System | Role::Developer => {}
        }
        let calls = &m.calls;
        for call in calls {
            match self.tool_index.get(call.name.as_ref()) {
                Some(&at) => self.tools[at].1 += 1,
                None => {
                    self.tool_index
                        .insert(call.name.to_string(), self.tools.len());
                    self.tools.push((call.name.to_string(), 1));
                }
            }
        }
        let text = m.content.text_lossy();
        let (a, b) = scanned(&text);
        let argument_paths = calls.iter().flat_map(|c| paths(&c.arguments));
        for p in paths(a).into_iter().chain(paths(b)).chain(argument_paths) {
            self.mention += 1;
            self.files.insert(p.to_owned(), self.mention);
        }
        if m.role == Role::User {
            let line = first_line(&text, LINE_CHARS);
            if !line.is_empty() {
                self.requests.push(line.into_owned());
            }
        }
        if matches!(m.role, Role::User | Role::Assistant) {
            for line in a.lines().chain(b.lines()) {
                if cue_pattern().is_match(line) {
                    self.cues
                        .push(truncate_chars(line.trim(), LINE_CHARS).into_owned());
                }
            }
        }
    }
}

/// The summary body of `range` (the replaced messages), with its index (which then
/// lists the files and the asks).
fn summary(range: &[Item<'_>], index: Option<String>) -> String {
    let mut tally = Tally::default();
    for m in range {
        tally.add(m);
    }
    let Tally {
        users,
        assistants,
        results,
        tools,
        files,
        requests,
        cues,
        ..
    } = tally;
    let mut out = String::new();
    let other = range.len() - users - assistants - results;
    let _ = write!(
        out,
        "Digest of {} earlier messages, elided to fit the context window (built without a \
         model): {} user, {} assistant, {} tool results",
        thousands(range.len()),
        thousands(users),
        thousands(assistants),
        thousands(results),
    );
    if other > 0 {
        let _ = write!(out, ", {} other", thousands(other));
    }
    out.push_str(".\n");
    if !tools.is_empty() {
        let list: Vec<String> = tools
            .iter()
            .take(MAX_TOOLS)
            .map(|(name, n)| format!("{name} ×{n}"))
            .collect();
        let _ = writeln!(out, "Tools used: {}.", list.join(", "));
    }
    if index.is_none() && !files.is_empty() {
        let mut files: Vec<(usize, String)> = files.into_iter().map(|(p, at)| (at, p)).collect();
        files.sort_unstable();
        let from = files.len().saturating_sub(MAX_PATHS);
        let list: Vec<&str> = files[from..].iter().map(|(_, p)| p.as_str()).collect();
        let _ = writeln!(out, "Files mentioned: {}.", list.join(", "));
    }
    match &index {
        Some(index) => {
            out.push_str(index);
            out.push('\n');
        }
        None => section(&mut out, "Latest user requests", &requests, MAX_REQUESTS),
    }
    section(&mut out, "Pending work mentioned", &cues, MAX_CUES);
    out.push_str("Timeline:\n");
    let n = range.len();
    for (i, m) in range.iter().enumerate() {
        if i == 3 && n > 8 {
            let _ = writeln!(out, "- … {} more messages …", thousands(n - 8));
        }
        if i < 3 || i + 5 >= n {
            let _ = writeln!(out, "- {}", timeline_entry(m));
        }
    }
    out.truncate(out.trim_end().len());
    out
}

/// The last `max` of `items` under a heading, one per line.
fn section(out: &mut String, heading: &str, items: &[String], max: usize) {
    if items.is_empty() {
        return;
    }
    let _ = writeln!(out, "{heading}:");
    for item in &items[items.len().saturating_sub(max)..] {
        let _ = writeln!(out, "- {item}");
    }
}

fn timeline_entry(m: &Item<'_>) -> String {
    let role = match m.role {
        Role::System => "system",
        Role::Developer => "developer",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool | Role::Function => "tool result",
    };
    let text = m.content.text_lossy();
    let line = first_line(&text, 120);
    let calls: Vec<String> = m.calls.iter().map(|c| c.name.to_string()).collect();
    match (calls.is_empty(), line.is_empty()) {
        (false, true) => format!("[{role}] called {}", calls.join(", ")),
        (false, false) => format!("[{role}] {line} (called {})", calls.join(", ")),
        (true, _) if is_result(m) => format!(
            "[{role}] {} characters: {line}",
            thousands(text.chars().count())
        ),
        (true, _) => format!("[{role}] {line}"),
    }
}
