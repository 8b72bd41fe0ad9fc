//! A compaction in progress ([`Ctx`]): the layout, the per-message costs (counted on
//! first use), and the choice of a plan's edges within the budget; what every strategy
//! builds its plan with.

use std::sync::OnceLock;

use serde_json::value::RawValue;

use crate::conversation::Item;
use crate::json::Raw;
use crate::tokens::Estimator;

use super::layout::{Layout, is_user};
use super::{
    CannotCompact, Input, Origin, Plan, Previous, Settings, Strategy, SummaryRole, authored,
    recency,
};

/// A tool result as `recency` digests it, and its tokens.
pub(crate) type Digest = (Box<RawValue>, u64);

/// How much of the end a strategy keeps verbatim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tail {
    /// Within the tail budget, at least `protect_tail_min` messages, the final turn always.
    Budgeted,
    /// Newest first up to the whole budget (what the head and the replacement leave), at
    /// least `protect_tail_min` messages, the final turn always, and never starting after
    /// `keep_from` (the head gives way first): `recency`, whose replacement is small,
    /// spends the budget on what the agent saw last.
    Filled { keep_from: usize },
    /// The final turn only (and, for role alternation, the assistant message before it).
    FinalTurn,
}

/// A compaction in progress: the layout, per-message costs and the settings.
pub(crate) struct Ctx<'i, 'a> {
    pub input: &'i Input<'a>,
    pub settings: &'i Settings,
    pub layout: Layout<'i, 'a>,
    /// Estimated tokens of each message, computed on first use: only the messages near
    /// the edges are ever counted, which matters with an exact tokenizer (a megabyte takes
    /// tens of milliseconds to encode).
    /// `OnceLock`, not `OnceCell`: the context lives across the summariser's `.await`,
    /// and the request path needs that future to be `Send`.
    costs: Vec<OnceLock<u64>>,
    /// Each tool result as `recency` digests it, and its tokens (`None`: too short to
    /// digest, or not a result), on first use: sized first, copied into the plan later.
    digests: Vec<OnceLock<Option<Digest>>>,
    /// The earliest possible head and the latest possible start of the kept end.
    h_min: usize,
    t_min: usize,
    /// The final turn's tokens as the smallest plan keeps it: whole when that fits the
    /// budget, else with the results it may clear digested (see [`Layout::clearable`]).
    final_turn: u64,
    /// The previous checkpoint, when it is consistent with these messages.
    previous: Option<Previous<'a>>,
    /// Nothing precedes the final turn but the head: a plan can only clear inside it
    /// (`h_min` and `t_min` are then the head's end, and the final turn all after it).
    clear_only: bool,
}

impl<'i, 'a> Ctx<'i, 'a> {
    pub(super) fn new(input: &'i Input<'a>, settings: &'i Settings) -> Result<Self, CannotCompact> {
        let ctx = Self::laid_out(input, settings)?;
        let estimate = ctx.minimal();
        if estimate > input.budget {
            return Err(CannotCompact::TooLarge {
                estimate,
                budget: input.budget,
            });
        }
        Ok(ctx)
    }

    /// The compaction's layout and costs, before the budget is looked at.
    pub(super) fn laid_out(
        input: &'i Input<'a>,
        settings: &'i Settings,
    ) -> Result<Self, CannotCompact> {
        let layout = Layout::new(input.messages)?;
        let costs = (0..layout.len()).map(|_| OnceLock::new()).collect();
        let digests = (0..layout.len()).map(|_| OnceLock::new()).collect();
        // Nothing before the final turn to replace (its ask is the first after the
        // head): a plan may still clear results inside it (see `clear::only`).
        let (h_min, t_min, clear_only) = match layout.smallest() {
            Some((h_min, t_min)) => (h_min, t_min, false),
            None if layout.clear_only_start().is_some() => (layout.sys, layout.sys, true),
            None => return Err(CannotCompact::NothingToReplace),
        };
        // A checkpoint that cleared results of the final turn is not taken as the next
        // plan's floor: that plan works its edges out afresh.
        let previous = input.previous.filter(|p| {
            p.head >= h_min && p.head <= p.through && p.through < t_min && layout.cut_ok[p.head]
        });
        let mut ctx = Self {
            input,
            settings,
            layout,
            costs,
            digests,
            h_min,
            t_min,
            final_turn: 0,
            previous,
            clear_only,
        };
        let n = ctx.layout.len();
        let reserve = ctx.marker_reserve();
        ctx.final_turn = ctx.cost(t_min..n);
        if ctx.total(h_min, reserve, t_min) > input.budget {
            ctx.final_turn = (t_min..n).map(|k| ctx.kept_cost(k, n)).sum();
        }
        Ok(ctx)
    }

    pub fn messages(&self) -> &'i [Item<'a>] {
        self.input.messages
    }

    pub fn estimator(&self) -> &Estimator {
        self.input.estimator
    }

    /// Estimated tokens of `messages[range]`.
    pub fn cost(&self, range: std::ops::Range<usize>) -> u64 {
        range
            .map(|k| *self.costs[k].get_or_init(|| self.estimator().message(&self.messages()[k])))
            .sum()
    }

    /// The whole request's tokens for sizing only: each message's cost where it is known
    /// already, the calibrated estimate where not (encoding a long history with the
    /// model's tokenizer costs more than the rest of a compaction).
    pub fn rough_total(&self) -> u64 {
        let approx = Estimator::approx();
        self.estimator().per_request()
            + (0..self.layout.len())
                .map(|k| match self.costs[k].get() {
                    Some(&cost) => cost,
                    None => approx.message(&self.messages()[k]),
                })
                .sum::<u64>()
    }

    /// Estimated tokens of head + a replacement of `reserve` tokens + `messages[start..]`.
    pub fn total(&self, head: usize, reserve: u64, start: usize) -> u64 {
        self.estimator().per_request()
            + self.cost(0..head)
            + reserve
            + self.cost(start..self.layout.len())
    }

    /// Estimated tokens of the smallest plan: the leading system messages, a marker and
    /// the final turn (its results the model has acted on digested, when it does not
    /// fit whole).
    pub fn minimal(&self) -> u64 {
        self.estimator().per_request()
            + self.cost(0..self.h_min)
            + self.marker_reserve()
            + self.final_turn
    }

    /// Tokens of tool result `k` as `recency` digests it; `None` when it is not one it
    /// digests (see `recency::digest`).
    pub fn digest_cost(&self, k: usize) -> Option<u64> {
        self.digested(k).map(|&(_, tokens)| tokens)
    }

    /// Tool result `k` as `recency` digests it, and its tokens (see [`Self::digest_cost`]).
    pub fn digested(&self, k: usize) -> Option<&Digest> {
        self.digests[k]
            .get_or_init(|| recency::digest(self, k))
            .as_ref()
    }

    /// Tokens of message `k` when every result of the final turn the model has acted on
    /// is digested: what `deterministic`, which clears only to fit, sizes its edges by.
    pub fn cleared_cost(&self, k: usize) -> u64 {
        self.kept_cost(k, self.layout.len())
    }

    /// The last message of the tool exchange result `k` belongs to (before the next turn
    /// boundary).
    pub fn exchange_end(&self, k: usize) -> usize {
        let n = self.layout.len();
        (k + 1..=n).find(|&b| self.layout.cut_ok[b]).unwrap_or(n) - 1
    }

    /// Tokens of message `k` of the final turn when everything before `whole` that may
    /// be cleared is digested.
    fn kept_cost(&self, k: usize, whole: usize) -> u64 {
        let cleared = (k < whole && self.layout.clearable(k))
            .then(|| self.digest_cost(k))
            .flatten();
        cleared.unwrap_or_else(|| self.cost(k..k + 1))
    }

    /// An upper bound of the recency marker's tokens (its counts are at most `n`).
    pub fn marker_reserve(&self) -> u64 {
        let n = self.layout.len();
        let marker = authored(
            self.input.format,
            self.settings.summary_role,
            &recency::marker_text((n, n), n, n, n),
        );
        self.raw_tokens(Raw::from(&*marker))
    }

    /// Chooses the head and the start of the verbatim end for a replacement of about
    /// `reserve` tokens. `cost_kept[k]` is message `k`'s cost when kept at the end (less
    /// than its own for recency's digested tool results). Falls back to the smallest edges
    /// when nothing else fits; the caller checks the final estimate.
    pub fn edges(&self, reserve: u64, tail: Tail, cost_kept: &dyn Fn(usize) -> u64) -> Edges {
        let n = self.layout.len();
        let user_role = self.settings.summary_role == SummaryRole::User;
        let mut head = self.preferred_head(user_role);

        // Running sums from the edges inwards, so every estimate below is O(1).
        let mut sums = EdgeSums {
            front: Sums::new(0, Box::new(|k| self.cost(k - 1..k))),
            kept: Sums::new(
                (self.t_min..n).map(cost_kept).sum(),
                Box::new(|j| cost_kept(self.t_min - j)),
            ),
            t_min: self.t_min,
            fixed: self.estimator().per_request() + reserve,
        };

        if let Tail::Filled { keep_from } = tail {
            head = self.head_leaving(&mut sums, head, keep_from);
        }
        let low = self.floor(head).max(head + 1);
        let mut start = match tail {
            Tail::Budgeted | Tail::Filled { .. } => {
                self.budgeted_start(&mut sums, (head, low), tail)
            }
            Tail::FinalTurn => self.t_min,
        };
        if user_role && is_user(&self.layout.messages[start]) {
            start = self.assistant_start(&mut sums, head, start, low);
        }
        let (head, start) = self.within_budget(&mut sums, head, start);
        let start = start.max(head + 1);
        Edges { head, start }
    }

    /// The earliest turn boundary from which everything up to the final turn can be kept
    /// whole next to the head and a replacement of `reserve` tokens: the most recent
    /// observations, which the agent is working from. (`recency` digests bulky tool
    /// results only before it.) When the final turn does not fit whole, a boundary
    /// inside it: the earliest from which the rest fits with the results before it that
    /// may be cleared digested, at the latest the final turn's newest exchange.
    pub fn newest_whole(&self, reserve: u64) -> usize {
        let head = self.smallest_head();
        let n = self.layout.len();
        let mut total = self.total(head, reserve, self.t_min);
        if total > self.input.budget {
            for w in self.t_min + 1..=self.layout.clear_end {
                total = total + self.kept_cost(w - 1, w) - self.cost(w - 1..w);
                if total <= self.input.budget && self.layout.cut_ok[w] {
                    return w;
                }
            }
            return self.cuts(self.layout.clear_end, n).next().unwrap_or(n);
        }
        let mut k = self.t_min;
        while k > head + 1 {
            total += self.cost(k - 1..k);
            if total > self.input.budget {
                break;
            }
            k -= 1;
        }
        self.cuts(k, self.t_min).next().unwrap_or(self.t_min)
    }

    /// The largest head, at most `head` and not below [`Self::smallest_head`], that leaves
    /// room for keeping everything from `keep_from`: preferably one that still holds the
    /// first ask (the task) and, with the user role, does not end on a user message; else
    /// any (the smallest when none fits).
    fn head_leaving(&self, sums: &mut EdgeSums<'_>, head: usize, keep_from: usize) -> usize {
        let budget = self.input.budget;
        if sums.total(head, keep_from) <= budget {
            return head;
        }
        let l = &self.layout;
        let user_role = self.settings.summary_role == SummaryRole::User;
        let task_end = (l.sys..l.len())
            .find(|&k| is_user(&l.messages[k]))
            .map_or(self.h_min, |k| k + 1);
        let good = |h: usize| h >= task_end && !(user_role && is_user(&l.messages[h - 1]));
        let candidates: Vec<usize> = self.cuts(self.smallest_head(), head).rev().collect();
        let preferred = candidates
            .iter()
            .copied()
            .filter(|&h| good(h))
            .find(|&h| sums.total(h, keep_from) <= budget);
        preferred
            .or_else(|| {
                candidates
                    .iter()
                    .copied()
                    .find(|&h| sums.total(h, keep_from) <= budget)
            })
            .unwrap_or(self.smallest_head())
    }

    /// The smallest head a plan that fills its tail may take: the previous checkpoint's,
    /// whose bytes the provider has cached, else the leading system messages.
    fn smallest_head(&self) -> usize {
        self.previous.map_or(self.h_min, |p| p.head)
    }

    /// The turn boundaries (cuts) in `lo..hi`.
    fn cuts(&self, lo: usize, hi: usize) -> impl DoubleEndedIterator<Item = usize> + '_ {
        (lo..hi).filter(move |&k| self.layout.cut_ok[k])
    }

    /// The head before the budget is looked at: protect_head rounded up to a boundary;
    /// with the user role, not ending on a user message; the previous head when there is
    /// one.
    fn preferred_head(&self, user_role: bool) -> usize {
        let l = &self.layout;
        let ends_user = |h: usize| h > 0 && is_user(&l.messages[h - 1]);
        let target = self.settings.protect_head.max(l.sys);
        let mut head = self
            .cuts(target.min(self.t_min), self.t_min)
            .next()
            .or_else(|| self.cuts(self.h_min, self.t_min).next_back())
            .unwrap_or(self.h_min);
        if user_role && ends_user(head) {
            if let Some(h) = self.cuts(self.h_min, head).rev().find(|&h| !ends_user(h)) {
                head = h;
            }
        }
        if let Some(p) = self.previous {
            head = p.head;
        }
        head
    }

    /// The earliest start of the kept end the previous checkpoint allows: checkpoints
    /// only grow.
    fn floor(&self, head: usize) -> usize {
        match self.previous {
            Some(p) => self
                .cuts(p.through + 1, self.t_min + 1)
                .next()
                .unwrap_or(self.t_min),
            None => head + 1,
        }
    }

    /// The kept end from the final turn backwards, not before `low`, while within the tail
    /// budget — the tail's share, or with [`Tail::Filled`] all the head leaves — or fewer
    /// than protect_tail_min messages.
    fn budgeted_start(
        &self,
        sums: &mut EdgeSums<'_>,
        (head, low): (usize, usize),
        tail: Tail,
    ) -> usize {
        let n = self.layout.len();
        let tail_budget = self.settings.tail_budget(self.input.budget);
        let mut fits = |k: usize| match tail {
            Tail::Filled { .. } => sums.total(head, k) <= self.input.budget,
            Tail::Budgeted | Tail::FinalTurn => sums.kept(k) <= tail_budget,
        };
        let mut start = self.t_min;
        let mut k = self.t_min;
        while k > low {
            k -= 1;
            if !self.layout.cut_ok[k] {
                continue;
            }
            if n - start < self.settings.protect_tail_min || fits(k) {
                start = k;
            } else {
                break;
            }
        }
        start
    }

    /// With the user role, the kept end starts with an assistant message: one cut
    /// earlier than `start` (not before `low`) if that fits, else one later.
    fn assistant_start(
        &self,
        sums: &mut EdgeSums<'_>,
        head: usize,
        start: usize,
        low: usize,
    ) -> usize {
        let messages = self.layout.messages;
        let budget = self.input.budget;
        let earlier = self
            .cuts(low, start)
            .next_back()
            .filter(|&k| !is_user(&messages[k]) && sums.total(head, k) <= budget);
        let later = || {
            self.cuts(start + 1, self.t_min + 1)
                .find(|&k| !is_user(&messages[k]))
        };
        earlier.or_else(later).unwrap_or(start)
    }

    /// Over the budget: a smaller head first (it is the less recent), then a shorter end.
    fn within_budget(&self, sums: &mut EdgeSums<'_>, head: usize, start: usize) -> (usize, usize) {
        let budget = self.input.budget;
        if sums.total(head, start) <= budget {
            return (head, start);
        }
        if let Some(h) = self
            .cuts(self.h_min, head + 1)
            .rev()
            .find(|&h| sums.total(h, start) <= budget)
        {
            return (h, start);
        }
        let head = self.h_min;
        let start = self
            .cuts(start, self.t_min + 1)
            .find(|&s| sums.total(head, s) <= budget)
            .unwrap_or(self.t_min);
        (head, start)
    }

    /// Builds the plan for replacing `messages[head..=through]` by `replacement`.
    pub fn plan(
        &self,
        requested: Strategy,
        strategy: Strategy,
        edges: (usize, usize),
        replacement: Vec<(Box<RawValue>, Origin)>,
        summary: Option<String>,
    ) -> Plan {
        let (head, through) = edges;
        let n = self.layout.len();
        // A verbatim copy costs what its original does, already counted.
        let replacement_tokens: u64 = replacement
            .iter()
            .map(|(raw, origin)| match origin {
                Origin::Verbatim(k) => self.cost(*k..*k + 1),
                Origin::Authored | Origin::Digest(_) => self.raw_tokens(Raw::from(&**raw)),
            })
            .sum();
        let tokens_after = self.estimator().per_request()
            + self.cost(0..head)
            + replacement_tokens
            + self.cost(through + 1..n);
        // Replaced messages are counted for this report only: with an exact tokenizer,
        // by the calibrated estimate instead (encoding them would cost more than the rest
        // of the compaction together).
        let before = |range: std::ops::Range<usize>| -> u64 {
            range
                .map(|k| {
                    if (head..=through).contains(&k) && self.estimator().is_exact() {
                        Estimator::approx().message(&self.messages()[k])
                    } else {
                        self.cost(k..k + 1)
                    }
                })
                .sum()
        };
        let tokens_sent = self.estimator().per_request() + before(0..n);
        let tokens_before = match self.input.previous {
            Some(p) if p.head <= p.through && p.through < n => {
                tokens_sent.saturating_sub(before(p.head..p.through + 1))
                    + p.replacement
                        .iter()
                        .map(|r| self.raw_tokens(Raw::from(&**r)))
                        .sum::<u64>()
                    + p.kept
                        .iter()
                        .filter(|k| (k.of as usize) < n)
                        .map(|k| self.cost(k.of as usize..k.of as usize + 1))
                        .sum::<u64>()
            }
            _ => tokens_sent,
        };
        let (replacement, origin) = replacement.into_iter().unzip();
        Plan {
            requested,
            strategy,
            format: self.input.format,
            fallback: None,
            head,
            through,
            replacement,
            origin,
            summary,
            tokens_before,
            tokens_after,
            tokens_sent,
            messages_replaced: through + 1 - head,
            verdict: None,
        }
    }

    fn raw_tokens(&self, raw: Raw<'_>) -> u64 {
        match self.input.format.item(raw).ok_or(()) {
            Ok(m) => self.estimator().message(&m),
            Err(_) => crate::tokens::approx_text(raw.get()),
        }
    }

    /// Whether a plan can only clear inside the final turn (see `clear::only`).
    pub fn clear_only(&self) -> bool {
        self.clear_only
    }

    pub fn t_min(&self) -> usize {
        self.t_min
    }

    pub fn previous(&self) -> Option<&Previous<'a>> {
        self.previous.as_ref()
    }
}

/// Running sums `sums[j] = sums[j - 1] + item(j)`, extended on demand.
struct Sums<'c> {
    sums: Vec<u64>,
    item: Box<dyn Fn(usize) -> u64 + 'c>,
}

impl<'c> Sums<'c> {
    fn new(first: u64, item: Box<dyn Fn(usize) -> u64 + 'c>) -> Self {
        Self {
            sums: vec![first],
            item,
        }
    }

    fn at(&mut self, j: usize) -> u64 {
        while self.sums.len() <= j {
            let next = self.sums.len();
            let sum = self.sums[next - 1] + (self.item)(next);
            self.sums.push(sum);
        }
        self.sums[j]
    }
}

/// The estimate of a plan with a given head and kept end, from running sums.
struct EdgeSums<'c> {
    /// `front.at(h)`: tokens of `messages[..h]`.
    front: Sums<'c>,
    /// `kept.at(j)`: tokens of the kept end starting at `t_min - j`.
    kept: Sums<'c>,
    t_min: usize,
    /// Per-request tokens and the replacement's reserve.
    fixed: u64,
}

impl EdgeSums<'_> {
    fn total(&mut self, head: usize, start: usize) -> u64 {
        self.fixed + self.front.at(head) + self.kept(start)
    }

    fn kept(&mut self, start: usize) -> u64 {
        self.kept.at(self.t_min - start)
    }
}

/// The edges of a plan: `messages[..head]` kept, `messages[start..]` kept or digested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Edges {
    pub head: usize,
    pub start: usize,
}
