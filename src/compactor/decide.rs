//! The decision, pure: given a request and what the store had, what to do — forward as
//! it is (with the checkpoint in force), apply a prepared checkpoint, or compact now to
//! a budget. No I/O; it may take CPU (token estimates), so the shell runs it off the
//! async workers for large requests.
//!
//! ```text
//! usage of the deepest history + checkpoints ─► checkpoint in force ─► predicted tokens
//!   under the hard threshold ─► forward with it (the prefix stays byte-stable)
//!   over it ──────────────────► a prepared deeper checkpoint that reaches the target?
//!                               apply it; else compact now, to the target
//! ```
//!
//! Under `compaction.policy = "cost"` (with a price for the model: [`Economics`]) a
//! request over the threshold is compacted only when [`cost::judge`] says so — the
//! window needs it, the operator's threshold says so, or it pays at the provider's
//! prices — and past the soft threshold it compacts earlier where that pays (a cold
//! cache makes it pay at once); it then aims deep
//! (`compaction.target_ratio` of the threshold), so one checkpoint serves many requests.
//!
//! Predicted tokens are the provider's own count for this history's last request,
//! corrected for a head that changed since, plus an estimate of what was appended,
//! scaled by how this provider counts appended turns; without a record, the forwarded
//! view is estimated whole. The target leaves room for `room_turns` turns of the
//! history's growth (see [`target`]); budgets are calibrated to the provider's count.

use crate::config::CompactionConfig;
use crate::controls::Compact;
use crate::conversation::{Item, Role};
use crate::outcome::{Figures, Trigger};
use crate::store::{Checkpoint, Usage};
use crate::tokens::Estimator;

use super::cost::{self, Why};
pub use super::estimate::{
    added, beside, calibration, essential, estimate, forwarded_estimate, scaled, to_record,
    unscaled,
};
use super::growth::answers;
pub use super::growth::{growth, next_ratio, pace, round_trips};
use super::turn::{Decision, Reason, Record, Turn};

/// What the cost policy weighs a request with: the model's prices, its window, whether
/// the strategy summarises (a summary is paid for), and the time (for the cache).
#[derive(Debug, Clone)]
pub struct Economics {
    pub rates: cost::Rates,
    pub window: u64,
    pub summarises: bool,
    pub now_ms: u64,
    /// Where the tenant's other conversations on this model ended, as forwarded,
    /// smallest first (see [`super::horizon`]).
    pub ends: Vec<u64>,
}

/// What to do with a request.
#[derive(Debug, Clone, Copy)]
pub enum Action<'c> {
    /// Under the threshold (or not forced): forward with the checkpoint in force.
    Forward,
    /// Apply a checkpoint prepared ahead; `estimate` is the request with it applied.
    Apply {
        checkpoint: &'c Checkpoint,
        estimate: u64,
    },
    /// Compact now to `budget` (in abridge's estimate).
    Compact { budget: u64, trigger: Trigger },
}

/// The decision and what it was based on.
#[derive(Debug, Clone, Copy)]
pub struct Decided<'c> {
    pub action: Action<'c>,
    pub threshold: u64,
    pub soft: u64,
    /// Predicted prompt tokens of the request as it would go (the provider's count).
    pub predicted: u64,
    /// abridge's estimate of the head (leading system messages).
    pub head_tokens: u64,
    /// abridge's estimate of what was appended since the usage record.
    pub appended: u64,
    /// Tokens the history grows by per turn.
    pub growth: u64,
    /// The pace it keeps, for forecasts (see [`pace`]).
    pub pace: u64,
    /// The provider's count over abridge's estimate for this conversation (1 without a
    /// report, or when no compaction is considered).
    pub ratio: f64,
    /// The usage record the prediction came from.
    pub usage: Option<Usage>,
    /// The checkpoint in force: the one this history's last request was sent with.
    pub active: Option<&'c Checkpoint>,
    /// Checkpoints of this history that can apply, deepest first.
    pub deepest: Option<&'c Checkpoint>,
    /// The operator's scheduled compaction and its focus (empty: none).
    pub scheduled: Option<&'c str>,
    /// Under the cost policy, what was weighed and why it did, or did not, compact.
    pub why: Option<Why>,
    /// Whether a compaction is expected when the history reaches the threshold (so a
    /// checkpoint built ahead will be used): always under the size policy.
    pub expects: bool,
    /// What the cost model weighed (`None`: nothing was).
    pub figures: Option<Figures>,
}

/// Decides for `turn` (see the module docs). `threshold` is the model's.
pub fn decide<'c>(
    config: &CompactionConfig,
    (threshold, economics): (u64, Option<&Economics>),
    turn: &Turn<'c, '_>,
    reason: Reason,
) -> Decided<'c> {
    let soft = ((threshold as f64) * config.soft_ratio) as u64;
    let (usage, matching, active) = history(turn);
    let prediction = predict(turn, usage.as_ref(), active, threshold);
    let since = usage.map_or(1, |u| {
        round_trips(&turn.messages[(u.messages as usize).min(turn.messages.len())..])
    });
    let growth = growth(usage.as_ref(), prediction.tokens, since);
    let pace = pace(usage.as_ref(), prediction.tokens, since);
    let scheduled = turn
        .loaded
        .and_then(|l| l.state.as_ref())
        .and_then(|s| s.scheduled.as_deref());
    let mut decided = Decided {
        action: Action::Forward,
        threshold,
        soft,
        predicted: prediction.tokens,
        head_tokens: prediction.head,
        appended: prediction.appended,
        growth,
        pace,
        // Until a compaction needs the exact one: the ratio learned from the reports
        // (what a forwarded request's saving is scaled by to be counted as the
        // provider counts).
        ratio: usage.map_or(1.0, |u| u.ratio()),
        usage,
        active,
        deepest: matching.first().copied(),
        scheduled,
        why: None,
        expects: true,
        figures: None,
    };
    let forced = turn.controls.compact == Compact::Force
        || matches!(reason, Reason::Overflow { .. })
        || scheduled.is_some();
    // What the provider reported is exact; what was appended since is an estimate, and
    // a twentieth of it (and a two-hundredth of the threshold, for its calibration) is
    // allowed for its error, so a request predicted just under the threshold is not one
    // the provider counts just over it.
    let margin = prediction.appended / 20 + threshold / 200;
    let over = prediction.tokens.saturating_add(margin) > threshold;
    if let Some(e) = economics {
        let weighed = weigh(config, e, turn, &decided, margin);
        (decided.why, decided.expects, decided.figures) = weighed;
        // The provider said the request did not fit: compacted for the window, whatever
        // the model weighed from abridge's estimate.
        if matches!(reason, Reason::Overflow { .. }) {
            decided.why = Some(Why::Window);
        }
        if !forced && !decided.why.is_some_and(Why::compacts) {
            return decided;
        }
    } else if !forced && !over {
        return decided;
    }
    decided.ratio = calibration(turn, usage.as_ref(), active);
    let target = match economics {
        Some(_) => deep(config, threshold, growth),
        None => target(config, threshold, soft, growth),
    };
    if !forced {
        // A prepared checkpoint was built for the target up to two turns ago; the
        // history has grown since by about that much.
        let reach = target.saturating_add(growth.saturating_mul(2));
        if let Some(action) = prepared(turn, (&matching, active), threshold, (reach, decided.ratio))
        {
            decided.action = action;
            return decided;
        }
    }
    decided.action = compaction(turn, reason, forced, &decided, target);
    decided
}

/// The compaction `decided` calls for (`target`: where it aims): its budget, in
/// abridge's estimate, and what started it.
fn compaction<'c>(
    turn: &Turn<'_, '_>,
    reason: Reason,
    forced: bool,
    decided: &Decided<'c>,
    target: u64,
) -> Action<'c> {
    let (threshold, soft, growth) = (decided.threshold, decided.soft, decided.growth);
    let (budget, trigger, ceiling) = match reason {
        Reason::Overflow { sent } => (
            (sent / 2).min(target),
            Trigger::Retry,
            (sent / 2).max(soft.min(sent / 10 * 9)),
        ),
        _ if forced => ((decided.predicted / 2).min(target), Trigger::Forced, soft),
        _ => (target, Trigger::Threshold, soft),
    };
    let ceiling = ceiling.min(raised_at_most(threshold, growth));
    let budget = with_room(turn, budget, ceiling, decided.ratio);
    Action::Compact {
        // The strategies plan the messages; the recall tool, the tools and the system
        // prompt go beside them.
        budget: items_budget(turn, budget, decided.ratio),
        trigger,
    }
}

/// A compaction's budget for the items (in abridge's estimate) when the request is to
/// come to `budget` (the provider's count): what is left beside the recall tool and what
/// the request carries besides its items.
pub fn items_budget(turn: &Turn<'_, '_>, budget: u64, ratio: f64) -> u64 {
    unscaled(budget.saturating_sub(beside(turn)), ratio).saturating_sub(added(turn))
}

/// Under the cost policy, where a compaction aims: `compaction.target_ratio` of the
/// threshold, far below it, so one checkpoint serves many requests — but never below
/// [`DEEP_FLOOR`], which leaves a summary or index room to keep what matters, nor above
/// where the size policy aims (`growth`: the history's, for [`target`]). So on a small
/// window nothing changes.
pub fn deep(config: &CompactionConfig, threshold: u64, growth: u64) -> u64 {
    let (size, deep) = aims(config, threshold, growth);
    size.min(deep)
}

/// Whether [`deep`] goes deeper than the size policy would (the window is large enough).
pub fn deepens(config: &CompactionConfig, threshold: u64, growth: u64) -> bool {
    let (size, deep) = aims(config, threshold, growth);
    deep < size
}

/// Where the size policy aims, and where the cost policy would aim below it.
fn aims(config: &CompactionConfig, threshold: u64, growth: u64) -> (u64, u64) {
    let soft = ((threshold as f64) * config.soft_ratio) as u64;
    let deep = ((threshold as f64) * config.target_ratio) as u64;
    (
        target(config, threshold, soft, growth),
        deep.max(DEEP_FLOOR),
    )
}

/// The fewest tokens a deep compaction leaves (see [`deep`]).
pub const DEEP_FLOOR: u64 = 16_000;

/// The cost policy's verdict on `decided` (see [`cost::judge`]), whether it expects to
/// compact once the history reaches the threshold, and what it weighed.
fn weigh(
    config: &CompactionConfig,
    e: &Economics,
    turn: &Turn<'_, '_>,
    decided: &Decided<'_>,
    margin: u64,
) -> (Option<Why>, bool, Option<Figures>) {
    let threshold = decided.threshold;
    let made = answers(turn.messages);
    let cold = decided
        .usage
        .is_some_and(|u| e.now_ms.saturating_sub(u.at_ms) > config.cache_ttl_ms);
    let prompt = decided.predicted.saturating_add(margin);
    let bounds = cost::Bounds {
        threshold,
        chosen: config.threshold_tokens > 0,
        fits: e.window.saturating_sub(e.window / 50).max(threshold),
        must: e.window.saturating_sub(e.window / 10).max(threshold),
        early: decided.soft,
        deep: deepens(config, threshold, decided.growth),
    };
    // Far from every bound (and from being near one in two requests): nothing to weigh,
    // and no checkpoint to build ahead.
    if prompt.saturating_add(decided.growth.saturating_mul(2)) <= bounds.early {
        return (None, false, None);
    }
    // What the request carries besides its items (tools, a `system` or `instructions`
    // field): it stays whatever a compaction does.
    let beside = beside(turn);
    let head = beside + decided.head_tokens;
    // The first compaction adds the recall tool, and the tools lead the cached prefix:
    // nothing of the old prefix stays cached — unless every request carried it already.
    let cached_head = match decided.active.is_none() && added(turn) > 0 && !turn.recall_always {
        true => 0,
        false => head,
    };
    // How many requests are left before the horizon is counted at the larger of the
    // history's growth and its average since it began, so a lull does not stretch the
    // future a compaction is paid back over: a real Claude Code conversation at 715
    // tokens a request (1,700 on average) was compacted where 20 requests were expected
    // to pay it back; it made 5.
    let forecast = decided
        .growth
        .max(prompt.saturating_sub(head) / made.max(1));
    let outlook = cost::Outlook {
        prompt,
        head: cached_head,
        growth: forecast,
        remaining: cost::remaining(made, prompt, forecast, horizon(e, prompt, &bounds)),
        cold,
    };
    // Where it can get: no lower than what every plan keeps (the head, the final turn,
    // room for a summary or index).
    let floor = beside
        + scaled(
            essential(turn) + added(turn) + REPLACEMENT_FLOOR,
            decided.ratio,
        );
    let target = deep(config, threshold, decided.growth).max(floor);
    let now = summary(e, target, outlook.prompt);
    let why = cost::judge(&outlook, &bounds, &e.rates, target, now);
    let mut figures = cost::figures(&outlook, &e.rates, (threshold, target), now);
    figures.since_ms = decided.usage.map(|u| e.now_ms.saturating_sub(u.at_ms));
    let first = decided.usage.is_some_and(|u| u.growth == 0);
    let pace = (made, decided.pace, first);
    let expects = expects(e, (&outlook, &bounds), pace, target);
    (why, expects, Some(figures))
}

/// What a summary of a `prompt`-token request compacted to `target` costs, in tokens
/// (nothing when the strategy does not summarise).
fn summary(e: &Economics, target: u64, prompt: u64) -> cost::Summary {
    match e.summarises {
        true => cost::Summary {
            input: prompt.saturating_sub(target),
            output: (target / 10).clamp(500, 4000),
        },
        false => cost::Summary::default(),
    }
}

/// Whether a checkpoint built ahead for `outlook` (a conversation that has made `made`
/// requests, at `pace`: see [`pace`]; `first`: its first growth) will be used. Only if
/// the history gets to the threshold: at its pace, within the requests it is expected to
/// make and no more than [`AHEAD_REQUESTS`] from now ([`FIRST_AHEAD`] at its first
/// growth) — a Codex session 60,000 tokens short at 300 a request had a summary built
/// that was never used, 44 % of its bill; and if, there, with as many requests still to
/// come as now and a warm cache, the model compacts. At the pace, not the growth budgets
/// count on: Claude Code's first turn, reading files, grew two real sessions by 32,000
/// tokens, and a summary built on that forecast was never used (−1.7 % and −1.5 % of
/// their bills in replay).
fn expects(
    e: &Economics,
    (outlook, b): (&cost::Outlook, &cost::Bounds),
    (made, pace, first): (u64, u64, bool),
    target: u64,
) -> bool {
    let within = outlook.remaining.min(match first {
        true => FIRST_AHEAD,
        false => AHEAD_REQUESTS,
    });
    let reaches = outlook.prompt.saturating_add(pace.saturating_mul(within)) > b.threshold;
    // Where it crosses — or where it is, when it is over already (the model said now that
    // compacting does not pay, and fewer requests are left the further it goes).
    // With half the requests expected there (see [`AHEAD_SHARE`]).
    let ahead = b.threshold.saturating_add(1).max(outlook.prompt);
    let remaining = cost::remaining(made, ahead, outlook.growth, horizon(e, ahead, b));
    let at = cost::Outlook {
        prompt: ahead,
        cold: false,
        remaining: (remaining / AHEAD_SHARE).max(1),
        ..*outlook
    };
    reaches
        && cost::judge(&at, b, &e.rates, target, summary(e, target, ahead))
            .is_some_and(Why::compacts)
}

/// A checkpoint is built ahead only if, at the threshold, it would pay back within this
/// share (one in `AHEAD_SHARE`) of the requests expected there: a build ahead bets a
/// summary on a future one burst can cut short. A real Codex rollout in a lull (207
/// tokens a request) expected 20 requests at its threshold, paid back in 19, and had a
/// summary built; its next turn added 5,864 tokens, which left 3, and the summary was
/// never used (3.9 % of its bill). Not built ahead, a compaction that pays at the
/// threshold is made there, on its request: the same money, that request's latency.
pub const AHEAD_SHARE: u64 = 2;

/// Under the cost policy, a checkpoint is built ahead (in the background, so the
/// request that crosses the threshold does not wait for a summary) only when the
/// threshold is at most this many requests away at the history's pace: further ahead,
/// the conversation often ends first and the summary is paid for nothing. A burst that
/// crosses it sooner is compacted on its request.
pub const AHEAD_REQUESTS: u64 = 8;

/// …and at most this many at a history's first growth, which is one turn's (often an
/// agent's largest: it reads the files it will work on) and says little of the pace to
/// come.
pub const FIRST_AHEAD: u64 = 2;

/// Where a conversation of `prompt` tokens is expected to be compacted anyway: where
/// the tenant's other conversations that grew as far ended
/// ([`super::horizon::expected_end`]); until one has, midway between the threshold and
/// the window's bound `must` (where agents end conversations: Claude Code compacted
/// itself at 155–173 K of a 200 K window in the real sessions replayed, its users ran
/// `/compact` at 149–166 K); never past `must`.
fn horizon(e: &Economics, prompt: u64, b: &cost::Bounds) -> u64 {
    let unlearned = b.threshold + b.must.saturating_sub(b.threshold) / 2;
    super::horizon::expected_end(&e.ends, prompt)
        .unwrap_or(unlearned)
        .min(b.must)
}

/// Tokens a compaction leaves, where the threshold allows, for what replaces the
/// middle (a summary, an index) beside the leading system messages and the final turn.
pub const REPLACEMENT_FLOOR: u64 = 600;

/// What the store knows of this request's history: the usage record it extends, the
/// checkpoints that apply to it (deepest first) and the one in force at that record.
fn history<'c>(
    turn: &Turn<'c, '_>,
) -> (Option<Usage>, Vec<&'c Checkpoint>, Option<&'c Checkpoint>) {
    let usage = turn
        .loaded
        .and_then(|l| l.usage_for(turn.prefixes))
        .copied();
    let matching: Vec<&'c Checkpoint> = turn
        .loaded
        .map(|l| {
            l.all_matching(turn.prefixes)
                .filter(|c| applicable(c, turn.messages))
                .collect()
        })
        .unwrap_or_default();
    let active = usage
        .and_then(|u| u.applied)
        .and_then(|through| matching.iter().copied().find(|c| c.through == through));
    (usage, matching, active)
}

/// A prepared checkpoint deeper than the one in force whose forwarded request comes
/// within `reach` (the provider's count, `ratio` converts): to apply as it is.
fn prepared<'c>(
    turn: &Turn<'c, '_>,
    (matching, active): (&[&'c Checkpoint], Option<&'c Checkpoint>),
    threshold: u64,
    (reach, ratio): (u64, f64),
) -> Option<Action<'c>> {
    matching
        .iter()
        .copied()
        .filter(|c| active.is_none_or(|a| c.through > a.through))
        .find_map(|candidate| {
            let estimate = scaled(estimate(turn, Some(candidate), threshold), ratio) + beside(turn);
            (estimate <= reach).then_some(Action::Apply {
                checkpoint: candidate,
                estimate,
            })
        })
}

/// `budget` (the provider's count, `ratio` converts), raised where it leaves less than
/// [`REPLACEMENT_FLOOR`] beside what every plan keeps, up to `ceiling` (the soft
/// threshold, and [`raised_at_most`]): a fast-growing history on a small window must
/// not aim so low that no summary or index fits.
pub fn with_room(turn: &Turn<'_, '_>, budget: u64, ceiling: u64, ratio: f64) -> u64 {
    let floor = scaled(essential(turn) + added(turn) + REPLACEMENT_FLOOR, ratio) + beside(turn);
    budget.max(floor.min(ceiling))
}

/// How high a compaction's aim may be raised for room ([`with_room`]): a turn's growth
/// (and a fifth of it, for the estimate's error) below the threshold, so the next turn
/// still fits and compactions keep coming in steps.
pub fn raised_at_most(threshold: u64, growth: u64) -> u64 {
    threshold.saturating_sub(growth.saturating_add(growth / 5))
}

/// What a compaction aims for: below the hard threshold by room for a few turns of
/// this history's growth (`compaction.room_turns`), at least the soft threshold's
/// headroom, so compactions come in steps and the forwarded prefix stays put between
/// them. It may be 0: the strategies then go as low as the minimal plan.
pub fn target(config: &CompactionConfig, threshold: u64, soft: u64, growth: u64) -> u64 {
    let room =
        (threshold - soft.min(threshold)).max(growth.saturating_mul(u64::from(config.room_turns)));
    threshold.saturating_sub(room)
}

/// What [`predict`] worked out.
pub struct Prediction {
    /// Predicted prompt tokens (the provider's count).
    pub tokens: u64,
    /// abridge's estimate of the head.
    pub head: u64,
    /// abridge's estimate of what was appended since the usage record.
    pub appended: u64,
}

/// Predicted prompt tokens of the request with `applied` applied (see the module docs).
/// Saturating: the numbers come from the provider, and a wrapped sum would read as a
/// tiny conversation and switch compaction off.
pub fn predict(
    turn: &Turn<'_, '_>,
    usage: Option<&Usage>,
    applied: Option<&Checkpoint>,
    threshold: u64,
) -> Prediction {
    let exact = Estimator::for_model_ready(turn.model);
    let head_len = turn
        .messages
        .iter()
        .take_while(|m| matches!(m.role, Role::System | Role::Developer))
        .count();
    let head: u64 = turn.messages[..head_len]
        .iter()
        .map(|m| exact.message(m))
        .sum();
    if let Some(u) = usage {
        let n = u.messages as usize;
        if n <= turn.messages.len() && u.applied == applied.map(|c| c.through) {
            let reported = u.tokens.saturating_sub(u.head_tokens).saturating_add(head);
            let added: u64 = turn.messages[n..].iter().map(|m| exact.message(m)).sum();
            // What the provider read at the report and drops now: a new ask since
            // dropped the reasoning of the turn the report ended in.
            let since = turn.messages[..n]
                .iter()
                .rposition(Item::is_ask)
                .unwrap_or(0);
            let dropped: u64 = turn.messages[since..n]
                .iter()
                .filter(|m| m.dropped)
                .map(|m| exact.read(m))
                .sum();
            let scale = |t: u64| t.saturating_mul(u64::from(u.ratio_permille.max(1))) / 1000;
            return Prediction {
                tokens: reported
                    .saturating_add(scale(added))
                    .saturating_sub(scale(dropped)),
                head,
                // What the history grew by, as the next report will count it.
                appended: added.saturating_sub(dropped),
            };
        }
    }
    Prediction {
        tokens: estimate(turn, applied, threshold) + beside(turn),
        head,
        appended: 0,
    }
}

/// A stored checkpoint fits this request: something of the request follows its range,
/// and not a tool result (a later turn cannot change what was checked when it was
/// built, since the prefix hash matches; this guards against a corrupt store). Its range
/// may reach into the final turn (results the model has acted on, digested: see
/// `crate::strategies`), and then a later request of the same turn applies it too.
pub fn applicable(c: &Checkpoint, messages: &[Item<'_>]) -> bool {
    let (head, through) = (c.head as usize, c.through as usize);
    head <= through + 1
        && c.kept_consistent()
        && messages.iter().any(|m| m.role == Role::User)
        && messages
            .get(through + 1)
            .is_some_and(|m| !matches!(m.role, Role::Tool | Role::Function))
}

impl Decided<'_> {
    /// The request as the client sent it (the provider's count), for the horizon (see
    /// [`super::horizon`]): as predicted when it goes as sent; compacted, the client's
    /// last request the usage record counted, grown by a turn (abridge sees the whole
    /// history still); [`super::horizon::FAR`] when the record does not know it.
    pub fn as_the_client_sent(&self) -> u64 {
        let compacted = self.active.is_some() || !matches!(self.action, Action::Forward);
        match self.usage {
            _ if !compacted => self.predicted,
            Some(u) if u.client_tokens > 0 => u
                .client_tokens
                .saturating_add(self.growth)
                .max(self.predicted),
            _ => super::horizon::FAR,
        }
    }
}

impl Decision {
    /// What the record stage needs of a request's prediction: its figures and the usage
    /// record it came from.
    pub(super) fn carry(&mut self, decided: &Decided<'_>, turn: &Turn<'_, '_>) {
        self.estimate = decided.predicted;
        if let Some(beside) = to_record(turn) {
            self.beside = beside;
        }
        self.head_tokens = decided.head_tokens;
        self.appended = decided.appended;
        self.growth = decided.growth;
        self.usage = decided.usage.map(|u| u.prefix);
        self.previous = decided.usage.map(|u| Record {
            tokens: u.tokens,
            ratio_permille: u.ratio_permille,
            applied: u.applied,
            growth: u.growth,
        });
        self.previous_at_ms = decided.usage.map(|u| u.at_ms);
        self.previous_client_tokens = decided.usage.map_or(0, |u| u.client_tokens);
        self.expects = decided.expects;
        self.verdict.why = decided.why;
        self.verdict.figures = decided.figures;
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
