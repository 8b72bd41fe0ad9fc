//! The compactor: everything between "this request belongs to that conversation" and
//! "this is what to forward", and after the response, what to remember.
//!
//! - [`decide`] — the decision, pure: forward, apply a prepared checkpoint, or compact
//!   now to a budget (prediction, calibration), said in a [`decided::Decided`];
//!   [`aim`], where a compaction aims; [`weigh`], what the cost policy weighs for a
//!   request; [`cost`], whether a compaction pays; [`horizon`], where a tenant's
//!   conversations end, which bounds what it can.
//! - [`Compactor::plan`] — the short async shell that carries a decision out.
//! - [`build`] — running a strategy, single-flight, saving the checkpoint.
//! - [`background`] — recording usage and the background builds.
//! - [`ring`] — the latest compactions, for the admin API.
//! - [`summariser`] — the one call a summary is; [`summary_wire`], its forms (chat
//!   completions, Anthropic's Messages, Responses); [`in_context`], a summary asked
//!   after the conversation itself, so it rides the provider's prompt cache.
//! - [`overflow`] — recognising a provider's "context length exceeded".
//!
//! The strategies themselves are pure and live in [`crate::strategies`].
//!
//! Nothing here fails a request: a store that does not answer, a summariser that fails,
//! a plan that cannot get under the threshold — each leaves the request forwarded as
//! well as can be, and says so in the report.

mod aim;
mod background;
mod build;
pub mod cost;
pub mod decide;
mod decided;
mod estimate;
mod growth;
pub mod horizon;
mod in_context;
pub mod overflow;
pub mod params;
mod ring;
pub mod summariser;
mod summary_wire;
mod turn;
mod weigh;
mod window;

use std::sync::Arc;
use std::time::Duration;

use crate::config::{CompactionConfig, CompactionMode, Config};
use crate::controls::{Compact, Report};
use crate::json::Raw;
use crate::offload::Offload;
use crate::outcome::Trigger;
use crate::outcome::{Uncompactable, Verdict};
use crate::prices::Prices;
use crate::stats::Stats;
use crate::store::{Checkpoint, Piece, Store};
use crate::strategies::{CannotCompact, Settings, Strategy};
use crate::tenants::{self, Tenants};
use crate::windows::Windows;

/// `x-abridge-reason` of a compaction by size for a model without a price.
const SIZE_NO_PRICE: &str = "size-no-price";

use background::Background;
use build::Attempt;
use decide::{Action, Decided, scaled};
pub use estimate::opening;
pub use ring::CompactionEvent;
use ring::Ring;
use summariser::Summariser;
pub use turn::{Decision, Followup, Reason, Turn};

/// The compaction machinery shared by all requests.
pub struct Compactor {
    config: CompactionConfig,
    settings: Settings,
    summariser: Summariser,
    summary_timeout: Duration,
    store: Store,
    stats: Arc<Stats>,
    /// What a summary call costs, per model.
    prices: Arc<Prices>,
    /// Where estimates and strategies run (off the async workers for large requests).
    cpu: Offload,
    /// Which tenants may have summaries now.
    tenants: Arc<Tenants>,
    /// `store.max_checkpoints`: checkpoints each history keeps.
    max_checkpoints: usize,
    background: Background,
    ring: Ring,
    /// Windows learned from the providers, and what they are learned for.
    windows: Arc<Windows>,
    upstreams: window::Upstreams,
    /// Where each tenant's conversations end (the cost policy's horizon).
    horizons: horizon::Horizons,
}

impl Compactor {
    pub fn new(
        config: &Config,
        summariser: Summariser,
        store: Store,
        (stats, prices): (Arc<Stats>, Arc<Prices>),
        cpu: Offload,
        tenants: Arc<Tenants>,
    ) -> Self {
        Self {
            prices,
            cpu,
            tenants,
            max_checkpoints: config.store.max_checkpoints.max(1),
            config: config.compaction.clone(),
            settings: config.strategies.clone(),
            summariser,
            summary_timeout: config.summary.timeout(),
            stats,
            background: Background::new(config.compaction.background_queue),
            ring: Ring::default(),
            windows: Arc::new(Windows::new(store.clone())),
            upstreams: window::Upstreams::of(config),
            horizons: horizon::Horizons::default(),
            store,
        }
    }

    /// Where each tenant's conversations ended, as learned here.
    pub fn horizons(&self) -> &horizon::Horizons {
        &self.horizons
    }

    /// The latest compactions, newest first.
    pub fn recent_compactions(&self) -> Vec<CompactionEvent> {
        self.ring.latest()
    }

    /// The summariser every summarising strategy asks (also the provider APIs' items).
    pub fn summariser(&self) -> &Summariser {
        &self.summariser
    }

    /// Background compactions queued or running.
    pub fn pending_jobs(&self) -> usize {
        self.background.pending()
    }

    /// Nothing in flight: no background compaction queued, running or waiting, and no
    /// usage record being written (what `abridge replay` waits for between turns, so the
    /// next turn is decided on everything the last one left).
    pub fn settled(&self) -> bool {
        self.background.settled()
    }

    /// plan: decides (off the async workers for a large request) and carries the
    /// decision out (see [`decide`]).
    pub async fn plan(&self, turn: &Turn<'_, '_>, reason: Reason) -> Decision {
        let threshold = self.threshold(turn.provider, turn.model, turn.payer);
        let mut decision = self.decision(turn, threshold);
        if turn.controls.compact == Compact::Off || self.config.mode == CompactionMode::Off {
            decision.report.note = Some("compaction off".to_owned());
            return decision;
        }
        if turn.loaded.is_none() && turn.conversation.is_some() {
            decision.report.note = Some("store unavailable: no checkpoints this turn".to_owned());
        }
        let decided = self.decided(turn, threshold, reason, &mut decision).await;
        let observe = self.config.mode == CompactionMode::Observe;
        decision.active = !observe;
        let dry = reason == Reason::Preview;
        match decided.action {
            Action::Forward if observe => {}
            Action::Forward => self.use_checkpoint(
                &mut decision,
                decided.active,
                (decided.predicted, decided.ratio),
                dry,
            ),
            Action::Apply {
                checkpoint,
                estimate,
            } if observe => self.observe(&mut decision, checkpoint, estimate, dry),
            Action::Apply {
                checkpoint,
                estimate,
            } => self.use_checkpoint(
                &mut decision,
                Some(checkpoint),
                (estimate, decided.ratio),
                dry,
            ),
            Action::Compact { trigger, .. }
                if !dry && self.defers(turn, &decided, trigger, reason, decision.strategy) =>
            {
                self.stats.summary_deferred();
                self.use_checkpoint(
                    &mut decision,
                    decided.active,
                    (decided.predicted, decided.ratio),
                    false,
                );
                decision.report.add_note(format!(
                    "{}: the summary is built in the background once it refills; forwarded with the checkpoint in force",
                    tenants::Refusal::RateLimited.reason()
                ));
            }
            Action::Compact { budget, trigger } => {
                let attempt = Attempt {
                    // Observe mode: what recency (no LLM, nothing stored) would do.
                    strategy: if observe {
                        Strategy::Recency
                    } else {
                        decision.strategy
                    },
                    previous: decided.deepest,
                    forwarded: decided.active,
                    budget,
                    ratio: decided.ratio,
                    trigger,
                    real: !observe && !dry,
                    wait: true,
                    focus: decided.scheduled.filter(|f| !f.is_empty()),
                };
                // Boxed: compacting (a summary call, the strategies) is most of this
                // future's size, and every request would carry it unboxed.
                Box::pin(self.compact(turn, &decided, reason, attempt, &mut decision)).await;
            }
        }
        // Said only of a compaction by size that happened.
        if !decision.report.compacted && decision.report.reason == Some(SIZE_NO_PRICE) {
            decision.report.reason = None;
        }
        decision
    }

    /// The decision for `turn` (off the async workers for a large request), carried into
    /// `decision` with why the cost policy made it (see [`decide`]).
    async fn decided<'t>(
        &self,
        turn: &Turn<'t, '_>,
        threshold: u64,
        reason: Reason,
        decision: &mut Decision,
    ) -> Decided<'t> {
        let mut economics = self.economics(turn, decision.strategy, &mut decision.report);
        let asker = turn.payer.zip(turn.conversation);
        if let (Some(e), Some((tenant, conversation))) = (economics.as_mut(), asker) {
            let soft = ((threshold as f64) * self.config.soft_ratio) as u64;
            e.ends = self.horizons.ends((tenant, turn.model), conversation, soft);
        }
        let permit = self.cpu.permit_for(turn.size).await;
        let decided = self.cpu.run_with(&permit, || {
            decide::decide(&self.config, (threshold, economics.as_ref()), turn, reason)
        });
        drop(permit);
        if let Some((tenant, conversation)) = asker.filter(|_| reason == Reason::Request) {
            let size = decided.as_the_client_sent();
            self.horizons.see((tenant, turn.model), conversation, size);
        }
        decision.carry(&decided, turn);
        if let Some(why) = decided.why {
            self.stats.decided(why);
            decision.report.reason = Some(why.as_str());
        } else if !matches!(decided.action, Action::Compact { .. }) {
            // Said only of a compaction by size (see `economics`).
            decision.report.reason = None;
        }
        decided
    }

    /// Whether the cost policy decides for `model` (configured, and a price known).
    fn costs(&self, model: &str) -> bool {
        self.config.policy == crate::config::Policy::Cost && self.prices.of(model).is_some()
    }

    /// What the cost policy weighs `turn` with (`None`: the size policy decides — as
    /// configured, or, said in `report`, for a model without a price).
    fn economics(
        &self,
        turn: &Turn<'_, '_>,
        strategy: Strategy,
        report: &mut Report,
    ) -> Option<decide::Economics> {
        if self.config.policy != crate::config::Policy::Cost {
            return None;
        }
        let Some(price) = self.prices.of(turn.model) else {
            // Said when it matters: a compaction by size.
            report.reason = Some(SIZE_NO_PRICE);
            return None;
        };
        Some(decide::Economics {
            rates: cost::Rates::of(&price),
            window: self.window(turn.provider, turn.model, turn.payer),
            summarises: strategy.summarises(),
            now_ms: crate::store::now_ms(),
            ends: Vec::new(),
        })
    }

    /// Whether a summary the threshold calls for waits for the background: the tenant's
    /// budget refuses it now (an update; a first summary has its floor), and the request
    /// still fits the model's window with half the room above the threshold to spare.
    /// An overflow, a forced or scheduled compaction, and one without a store or
    /// background workers are compacted now (recency, with the reason, if need be).
    fn defers(
        &self,
        turn: &Turn<'_, '_>,
        decided: &Decided<'_>,
        trigger: Trigger,
        reason: Reason,
        strategy: Strategy,
    ) -> bool {
        let (Some(payer), Some(_), Some(_)) = (turn.payer, turn.conversation, turn.loaded) else {
            return false;
        };
        if !strategy.summarises()
            || reason != Reason::Request
            || trigger != Trigger::Threshold
            || self.config.mode != CompactionMode::On
            || !self.config.background
            || !self.store.is_healthy()
            || !self.tenants.spent(payer, build::summary_kind(turn))
        {
            return false;
        }
        let threshold = decided.threshold;
        let window = self
            .window(turn.provider, turn.model, turn.payer)
            .max(threshold);
        decided.predicted <= threshold + (window - threshold) / 2
    }

    /// The decision before anything is decided: forward as sent.
    /// (What the record stage needs of `decided` is carried by [`Decision::carry`].)
    fn decision(&self, turn: &Turn<'_, '_>, threshold: u64) -> Decision {
        let state = turn.loaded.and_then(|l| l.state.as_ref());
        Decision {
            apply: None,
            report: Report {
                conversation: turn.conversation,
                ..Report::default()
            },
            estimate: 0,
            threshold,
            soft: ((threshold as f64) * self.config.soft_ratio) as u64,
            active: false,
            strategy: turn.controls.strategy.unwrap_or(self.config.strategy),
            usage: None,
            growth: 0,
            head_tokens: 0,
            appended: 0,
            // What the history learned stays learned (see `decide::beside`).
            beside: turn
                .loaded
                .and_then(|l| l.usage_for(turn.prefixes))
                .map_or(0, |u| u.beside),
            previous: None,
            previous_at_ms: None,
            previous_client_tokens: 0,
            last_seen_ms: state.map_or(0, |s| s.last_seen_ms),
            expects: true,
            verdict: Verdict {
                at_ms: crate::store::now_ms(),
                cost: self.config.policy == crate::config::Policy::Cost,
                priced: self.prices.of(turn.model).is_some(),
                ..Verdict::default()
            },
        }
    }

    /// Compacts now. When not even the minimal plan (head, marker, final turn) fits the
    /// budget but it fits the threshold (for a retry: is smaller than what was sent), it
    /// compacts to the minimal plan, as small as the request gets; when it does not fit
    /// the threshold either (anti-thrash), the request goes as it was — nothing is
    /// suspended, the next turn is judged afresh.
    async fn compact(
        &self,
        turn: &Turn<'_, '_>,
        decided: &Decided<'_>,
        reason: Reason,
        mut attempt: Attempt<'_>,
        decision: &mut Decision,
    ) {
        let (threshold, ratio, observe) = (
            decided.threshold,
            decided.ratio,
            self.config.mode == CompactionMode::Observe,
        );
        let dry = reason == Reason::Preview;
        let mut result = self.compact_now(turn, attempt).await;
        if let Err(CannotCompact::TooLarge { estimate, .. }) = result {
            let sent_as = scaled(estimate + decide::added(turn), ratio) + decide::beside(turn);
            let fits = match reason {
                Reason::Overflow { sent } => sent_as < sent,
                _ => sent_as <= threshold,
            };
            if fits {
                attempt.budget = estimate;
                result = self.compact_now(turn, attempt).await;
            }
        }
        let active = if observe { None } else { decided.active };
        match result {
            Ok((checkpoint, plan_note)) => {
                let permit = self.cpu.permit_for(turn.size).await;
                let estimate = self.cpu.run_with(&permit, || {
                    scaled(decide::estimate(turn, Some(&checkpoint), threshold), ratio)
                        + decide::beside(turn)
                });
                drop(permit);
                if observe {
                    self.observe(decision, &checkpoint, estimate, dry);
                } else {
                    self.use_checkpoint(decision, Some(&checkpoint), (estimate, ratio), dry);
                    decision.report.tokens_before = Some(decided.predicted.max(scaled(
                        checkpoint.tokens_sent.max(checkpoint.tokens_before),
                        ratio,
                    )));
                    if let Some(note) = plan_note {
                        decision.report.add_note(note);
                    }
                }
                if let (Some(_), Some(conversation), false) =
                    (decided.scheduled, turn.conversation, observe || dry)
                {
                    let _ = self.store.clear_scheduled(&conversation).await;
                }
            }
            Err(CannotCompact::TooLarge { estimate, .. }) => {
                let case = if scaled(decided.head_tokens, ratio) * 2 > threshold {
                    Uncompactable::Head
                } else {
                    Uncompactable::FinalTurn
                };
                if !dry {
                    self.stats.anti_thrash(case);
                }
                self.use_checkpoint(decision, active, (decided.predicted, ratio), dry);
                decision.report.add_note(format!(
                    "not compacted: the leading system messages and the final turn alone are about {} tokens, over the threshold of {threshold} ({}); forwarded as it was",
                    scaled(estimate, ratio) + decide::beside(turn),
                    case.why()
                ));
            }
            Err(cannot @ CannotCompact::NoSmaller { .. }) if !observe => {
                self.no_deeper(turn, decided, (decision, dry), &cannot);
            }
            Err(cannot) => {
                self.use_checkpoint(decision, active, (decided.predicted, ratio), dry);
                decision.report.add_note(format!("not compacted: {cannot}"));
            }
        }
    }

    /// No plan goes deeper than this history's deepest checkpoint: the request goes with
    /// that one — not with a shallower one in force, nor whole. (The checkpoint in force
    /// is the one the history's last reported request was sent with; when requests were
    /// refused, or their usage never came, the deepest can be ahead of it.)
    fn no_deeper(
        &self,
        turn: &Turn<'_, '_>,
        decided: &Decided<'_>,
        (decision, dry): (&mut Decision, bool),
        cannot: &CannotCompact,
    ) {
        let ratio = decided.ratio;
        let deeper = decided
            .deepest
            .filter(|d| decided.active.is_none_or(|a| a.through < d.through));
        let Some(deepest) = deeper else {
            self.use_checkpoint(decision, decided.active, (decided.predicted, ratio), dry);
            let further = if decision.apply.is_some() {
                " further"
            } else {
                ""
            };
            decision
                .report
                .add_note(format!("not compacted{further}: {cannot}"));
            return;
        };
        let estimate = scaled(
            decide::estimate(turn, Some(deepest), decided.threshold),
            ratio,
        ) + decide::beside(turn);
        self.use_checkpoint(decision, Some(deepest), (estimate, ratio), dry);
        decision
            .report
            .add_note(format!("not compacted further: {cannot}"));
    }

    /// `estimate`: the forwarded request's, in the provider's units (`ratio`: the
    /// provider's count over abridge's estimate, which a checkpoint's own figures are in).
    fn use_checkpoint(
        &self,
        decision: &mut Decision,
        checkpoint: Option<&Checkpoint>,
        (estimate, ratio): (u64, f64),
        dry: bool,
    ) {
        decision.estimate = estimate;
        let Some(c) = checkpoint else {
            return;
        };
        let saved = scaled(c.tokens_saved(), ratio);
        let report = &mut decision.report;
        report.compacted = true;
        report.strategy = Some(c.strategy);
        report.tokens_after = Some(estimate);
        report.tokens_before = Some(estimate.saturating_add(saved));
        report.messages_replaced = Some(c.messages_replaced());
        if let Some(fallback) = &c.fallback {
            report.add_note(fallback.clone());
        }
        decision.apply = Some(c.clone());
        if !dry {
            self.stats.checkpoint_applied();
        }
    }

    /// Observe mode: what would be done, said; nothing forwarded differently.
    fn observe(&self, decision: &mut Decision, checkpoint: &Checkpoint, estimate: u64, dry: bool) {
        let predicted = decision.estimate;
        decision.apply = None;
        let report = &mut decision.report;
        report.compacted = false;
        report.strategy = Some(checkpoint.strategy);
        report.tokens_before = Some(predicted);
        report.tokens_after = Some(estimate);
        report.messages_replaced = Some(checkpoint.messages_replaced());
        report.add_note("observe mode: would compact; forwarded unmodified");
        if !dry {
            self.stats.observed();
        }
    }
}

/// The forwarded messages of `messages` with `checkpoint` applied (its kept messages
/// are the client's own, from `messages`).
pub fn forwarded<'r>(
    messages: &'r [crate::conversation::Item<'r>],
    checkpoint: &'r Checkpoint,
) -> Vec<Raw<'r>> {
    let replacement = checkpoint.pieces().filter_map(|piece| match piece {
        Piece::Stored(raw) => Some(raw),
        Piece::Kept(k) => messages.get(k).map(|m| m.raw),
    });
    crate::strategies::splice(
        messages,
        checkpoint.head as usize,
        checkpoint.through as usize,
        replacement,
    )
}
