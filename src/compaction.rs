//! The plan stage of a chat request: whether to forward the conversation as sent, with a
//! stored checkpoint applied, or compacted now — and, after the response, whether to
//! build the next checkpoint in the background.
//!
//! ```text
//! prefix hashes + store state ─► active checkpoint (the one applied last turn, if it
//!                                still matches) ─► predicted prompt tokens
//!   under the hard threshold ─► forward with the active checkpoint (prefix stays stable)
//!   over it ──────────────────► a deeper prepared checkpoint that fits? apply it
//!                               else compact now (single-flight for LLM strategies)
//! after the response: over the soft threshold ─► background job builds the next one
//! ```
//!
//! Predicted tokens are the provider's own count for the conversation's last request
//! (kept in the store, with the prefix hash and checkpoint it belongs to) plus an
//! estimate of only what was appended since; without a matching record the forwarded
//! view is estimated whole (cheaply first, exactly only near the threshold).
//!
//! Compaction aims for the soft threshold, not the hard one, so a conversation does not
//! need compacting again on the very next turn. `x-abridge-compact: force` aims for half
//! the predicted size (at most the soft threshold); a provider's "context length
//! exceeded" aims for half of what was sent.
//!
//! Nothing here fails a request: a store that does not answer, a summariser that fails,
//! a plan that cannot get under the threshold — each leaves the request forwarded as
//! well as can be, and says so in the report.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::chat::{self, Message, Role};
use crate::compact::{
    self, CannotCompact, Input, Plan, Previous, Settings, Strategy, SummaryError, SummaryRequest,
};
use crate::config::{CompactionConfig, CompactionMode, Config};
use crate::controls::{Compact, Controls, Report};
use crate::identity::Fingerprint;
use crate::models;
use crate::offload::Offload;
use crate::proxy::headers::Credentials;
use crate::stats::{Stats, Trigger};
use crate::store::{Checkpoint, INDEX_REFRESH_MS, Loaded, Lock, Saved, Store, Usage, now_ms};
use crate::summariser::Summariser;
use crate::tenants::Tenants;
use crate::tokens::Estimator;

/// Poll interval while another request or replica builds the checkpoint we need.
const PEER_POLL: Duration = Duration::from_millis(50);

/// Everything the plan stage needs to know about one request.
pub struct Turn<'t, 'a> {
    pub messages: &'t [Message<'a>],
    /// The request's rolling prefix hashes (`prefixes[i]` = h(i)).
    pub prefixes: &'t [Fingerprint],
    /// `None`: not identified (no user message, or no identity key: store down).
    pub conversation: Option<Fingerprint>,
    /// `None`: the store did not answer (or nothing to load for an unidentified request).
    pub loaded: Option<&'t Loaded>,
    pub controls: &'t Controls,
    pub model: &'t str,
    /// The client's credentials (for the summariser on the main upstream).
    pub credentials: &'t Credentials,
    /// The tenant's id (`None`: not identified); summaries are asked for only for a
    /// tenant the provider has accepted (see [`crate::tenants`]).
    pub tenant: Option<Fingerprint>,
    /// Bytes of the request body: how heavy its estimates and compaction are.
    pub size: usize,
}

impl<'t, 'a> Turn<'t, 'a> {
    /// The turn of a parsed request, identified (or not) and with what the store had.
    pub fn new(
        parsed: &'t chat::Parsed<'a>,
        identified: Option<&'t crate::identity::Identified>,
        loaded: Option<&'t Loaded>,
        controls: &'t Controls,
        credentials: &'t Credentials,
        size: usize,
    ) -> Self {
        Self {
            size,
            messages: &parsed.messages,
            prefixes: identified.map_or(&[][..], |i| &i.hashes.prefixes),
            conversation: identified.map(|i| i.conversation),
            loaded,
            controls,
            model: parsed.request.model.as_deref().unwrap_or_default(),
            credentials,
            tenant: identified.map(|i| i.tenant),
        }
    }
}

/// Why the plan stage is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A request arriving.
    Request,
    /// `POST /admin/preview`: decide as for a request, store and count nothing.
    Preview,
    /// The provider answered "context length exceeded" to a request estimated at
    /// `sent` tokens: compact harder and retry once.
    Overflow { sent: u64 },
}

/// What the plan stage decided.
#[derive(Debug, Clone)]
pub struct Decision {
    /// The checkpoint to apply (`None`: forward the messages as sent).
    pub apply: Option<Checkpoint>,
    pub report: Report,
    /// Estimated prompt tokens of what will be forwarded.
    pub estimate: u64,
    /// The hard threshold for this request's model.
    pub threshold: u64,
    /// The soft threshold: over it after the response, the next checkpoint is prepared.
    pub soft: u64,
    /// Compaction may act on this request (not off, not observe).
    pub active: bool,
    /// The strategy this request asked for (or the configured one).
    pub strategy: Strategy,
    /// The usage record the prediction came from (its history's prefix hash), which
    /// this request's report supersedes.
    pub usage: Option<Fingerprint>,
    /// Tokens this history grows by per turn, as observed (see [`growth`]).
    pub growth: u64,
    /// abridge's estimate of the request's head (leading system messages).
    pub head_tokens: u64,
    /// abridge's estimate of what was appended since the usage record (0: no record).
    pub appended: u64,
    /// The record's tokens and ratio, to measure the next ratio (see [`next_ratio`]).
    pub previous: Option<(u64, u32, Option<u32>)>,
    /// When the conversation was last seen (from the store; 0: new).
    pub last_seen_ms: u64,
}

/// What [`Compactor::predict`] worked out.
struct Prediction {
    /// Predicted prompt tokens (the provider's count).
    tokens: u64,
    /// abridge's estimate of the head.
    head: u64,
    /// abridge's estimate of what was appended since the usage record.
    appended: u64,
}

/// The ratio of the provider's count to abridge's estimate of appended messages, after
/// a report: `reported − previous tokens` over the estimate of what was appended, when
/// the same checkpoint applied to both (else the previous ratio stands), averaged with
/// the previous ratio; clamped to 0.5–4.
pub fn next_ratio(
    previous: Option<(u64, u32, Option<u32>)>,
    applied: Option<u32>,
    appended: u64,
    reported: u64,
) -> u32 {
    let Some((tokens, ratio, was_applied)) = previous else {
        return 1000;
    };
    if appended < 16 || was_applied != applied || reported <= tokens {
        return ratio.max(1);
    }
    let measured = ((reported - tokens) * 1000 / appended).clamp(500, 4000) as u32;
    (ratio / 2 + measured / 2).clamp(500, 4000)
}

/// Why even the minimal plan does not fit (the anti-thrash case, for the note and the
/// metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Uncompactable {
    /// The leading system messages (and tools) take most of the threshold.
    Head,
    /// The final turn is too big (an agent's large tool output): usually gone from the
    /// final turn next time.
    FinalTurn,
}

impl Uncompactable {
    pub const ALL: [Uncompactable; 2] = [Uncompactable::Head, Uncompactable::FinalTurn];

    pub fn as_str(self) -> &'static str {
        match self {
            Uncompactable::Head => "head",
            Uncompactable::FinalTurn => "final_turn",
        }
    }

    fn why(self) -> &'static str {
        match self {
            Uncompactable::Head => "the system prompt takes most of it",
            Uncompactable::FinalTurn => "the final turn takes most of it",
        }
    }
}

/// Tokens a history grows by per turn: what this request added to the last report,
/// and at least the mean of that and the growth remembered, so a burst counts at once
/// and a lull wears off slowly.
fn growth(usage: Option<&Usage>, predicted: u64) -> u64 {
    let Some(u) = usage else {
        return 0;
    };
    let now = predicted.saturating_sub(u.tokens);
    now.max(u.growth / 2 + now / 2)
}

/// An estimate in abridge's units as the provider would count it.
fn scaled(estimate: u64, ratio: f64) -> u64 {
    (estimate as f64 * ratio) as u64
}

/// A provider count in abridge's units.
fn unscaled(tokens: u64, ratio: f64) -> u64 {
    (tokens as f64 / ratio) as u64
}

/// A conversation's single-flight lock while this process builds its checkpoint: renewed
/// every third of its TTL until released. Dropped without [`HeldLock::release`] (the
/// request's future was dropped), it stops renewing and releases in the background, so
/// an abandoned build cannot keep waiters waiting.
struct HeldLock {
    store: Store,
    conversation: Fingerprint,
    lock: Option<Lock>,
    refresher: tokio::task::JoinHandle<()>,
}

impl HeldLock {
    fn renewed(store: Store, conversation: Fingerprint, lock: Lock, ttl: Duration) -> Self {
        let refresher = {
            let (store, lock) = (store.clone(), lock.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(ttl / 3).await;
                    if !matches!(
                        store.refresh_lock(&conversation, &lock, ttl).await,
                        Ok(true)
                    ) {
                        break;
                    }
                }
            })
        };
        Self {
            store,
            conversation,
            lock: Some(lock),
            refresher,
        }
    }

    async fn release(mut self) {
        self.refresher.abort();
        if let Some(lock) = self.lock.take() {
            let _ = self.store.unlock(&self.conversation, &lock).await;
        }
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        self.refresher.abort();
        if let Some(lock) = self.lock.take() {
            let (store, conversation) = (self.store.clone(), self.conversation);
            tokio::spawn(async move {
                let _ = store.unlock(&conversation, &lock).await;
            });
        }
    }
}

/// The compaction machinery shared by all requests.
pub struct Compactor {
    config: CompactionConfig,
    settings: Settings,
    summariser: Summariser,
    summary_timeout: Duration,
    store: Store,
    /// Where estimates and strategies run (off the async workers for large requests).
    cpu: Offload,
    /// Which tenants may have summaries now.
    tenants: Arc<Tenants>,
    /// `store.max_checkpoints`: checkpoints each history keeps.
    max_checkpoints: usize,
    stats: Arc<Stats>,
    jobs: mpsc::Sender<Job>,
    queue: Mutex<Option<mpsc::Receiver<Job>>>,
    /// Conversations with a background job queued or running.
    pending: Mutex<HashSet<Fingerprint>>,
    /// The latest compactions, newest last (for the admin API and dashboard).
    recent: Mutex<VecDeque<CompactionEvent>>,
}

/// How many compactions [`Compactor::recent_compactions`] remembers.
const RECENT_COMPACTIONS: usize = 100;

/// One compaction, as the admin API lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompactionEvent {
    pub at_ms: u64,
    pub conversation: Fingerprint,
    pub strategy: Strategy,
    pub requested: Strategy,
    pub trigger: &'static str,
    pub tokens_before: u64,
    pub tokens_after: u64,
    pub messages_replaced: usize,
    pub fallback: Option<String>,
}

/// What waiting for another request's (or replica's) summary came to.
enum Peer {
    /// Its checkpoint is stored.
    Built(Checkpoint),
    /// Its lock is gone and no checkpoint came: it died or gave up.
    Gone,
    /// It did not finish in time (or the store stopped answering).
    Slow,
}

/// One run of a strategy.
#[derive(Clone, Copy)]
struct Attempt<'c> {
    strategy: Strategy,
    /// The deepest checkpoint of this history, for an iterative update.
    previous: Option<&'c Checkpoint>,
    budget: u64,
    trigger: Trigger,
    /// Store, count and log it (false: observe mode's dry run).
    real: bool,
    /// Wait for a peer's summary when the single-flight lock is taken (false: give up).
    wait: bool,
    /// What a summary should keep in particular detail (an operator's request).
    focus: Option<&'c str>,
}

/// What the record stage needs about a request, built by the request path.
pub struct Followup {
    pub conversation: Fingerprint,
    /// Messages in the client's request, and the prefix hash through the last of them.
    pub messages: u32,
    pub prefix: Fingerprint,
    /// `through` of the checkpoint applied to the forwarded request.
    pub applied: Option<u32>,
    pub threshold: u64,
    pub soft: u64,
    /// Compaction may act on this conversation (see [`Decision::active`]).
    pub active: bool,
    pub strategy: Strategy,
    /// The usage record this request's report supersedes, and what goes into the new
    /// one (see [`Decision`]).
    pub replaces: Option<Fingerprint>,
    pub growth: u64,
    pub head_tokens: u64,
    pub appended: u64,
    pub previous: Option<(u64, u32, Option<u32>)>,
    /// When the conversation was last seen, per the store (0: new).
    pub last_seen_ms: u64,
    /// For a background build: the client's body, its prefix hashes, the model and the
    /// credentials and tenant for the summariser.
    pub body: Bytes,
    pub prefixes: Vec<Fingerprint>,
    pub model: String,
    pub credentials: Credentials,
    pub tenant: Fingerprint,
    /// The body's share of `limits.max_inflight_body_bytes`, kept while a background
    /// job holds the body.
    pub held: Option<crate::ingress::Held>,
}

/// A background compaction: everything to rebuild the request's view.
struct Job {
    conversation: Fingerprint,
    body: Bytes,
    prefixes: Vec<Fingerprint>,
    model: String,
    credentials: Credentials,
    tenant: Fingerprint,
    strategy: Strategy,
    growth: u64,
    /// Given back when the job is done or dropped.
    _held: Option<crate::ingress::Held>,
}

impl Compactor {
    pub fn new(
        config: &Config,
        summariser: Summariser,
        store: Store,
        stats: Arc<Stats>,
        cpu: Offload,
        tenants: Arc<Tenants>,
    ) -> Self {
        let (jobs, queue) = mpsc::channel(config.compaction.background_queue.max(1));
        Self {
            cpu,
            tenants,
            max_checkpoints: config.store.max_checkpoints.max(1),
            config: config.compaction.clone(),
            settings: config.strategies.clone(),
            summariser,
            summary_timeout: config.summary.timeout(),
            store,
            stats,
            jobs,
            queue: Mutex::new(Some(queue)),
            pending: Mutex::new(HashSet::new()),
            recent: Mutex::new(VecDeque::with_capacity(RECENT_COMPACTIONS)),
        }
    }

    /// The hard threshold for a model.
    pub fn threshold(&self, model: &str) -> u64 {
        if self.config.threshold_tokens > 0 {
            return self.config.threshold_tokens;
        }
        let window = models::context_window(
            model,
            &self.config.context_windows,
            self.config.default_context_window,
        );
        ((window as f64) * self.config.threshold_ratio) as u64
    }

    /// plan: see the module docs.
    pub async fn plan(&self, turn: &Turn<'_, '_>, reason: Reason) -> Decision {
        let threshold = self.threshold(turn.model);
        let soft = ((threshold as f64) * self.config.soft_ratio) as u64;
        let strategy = turn.controls.strategy.unwrap_or(self.config.strategy);
        let state = turn.loaded.and_then(|l| l.state.as_ref());
        // The usage the provider reported for the deepest history this request holds.
        let usage = turn
            .loaded
            .and_then(|l| l.usage_for(turn.prefixes))
            .copied();
        // A preview decides exactly as a request would, but changes and counts nothing.
        let dry = reason == Reason::Preview;
        let mut decision = Decision {
            apply: None,
            report: Report {
                conversation: turn.conversation,
                ..Report::default()
            },
            estimate: 0,
            threshold,
            soft,
            active: false,
            strategy,
            usage: usage.map(|u| u.prefix),
            growth: 0,
            head_tokens: 0,
            appended: 0,
            previous: usage.map(|u| (u.tokens, u.ratio_permille, u.applied)),
            last_seen_ms: state.map_or(0, |s| s.last_seen_ms),
        };
        if turn.controls.compact == Compact::Off || self.config.mode == CompactionMode::Off {
            decision.report.note = Some("compaction off".to_owned());
            return decision;
        }
        let observe = self.config.mode == CompactionMode::Observe;
        if turn.loaded.is_none() && turn.conversation.is_some() {
            decision.report.note = Some("store unavailable: no checkpoints this turn".to_owned());
        }

        // Checkpoints of this exact history, deepest first, that can apply to this request.
        let matching: Vec<&Checkpoint> = turn
            .loaded
            .map(|l| {
                l.all_matching(turn.prefixes)
                    .filter(|c| applicable(c, turn.messages))
                    .collect()
            })
            .unwrap_or_default();
        // The checkpoint in force: the one this history's last request was sent with.
        let active = usage
            .and_then(|u| u.applied)
            .and_then(|through| matching.iter().copied().find(|c| c.through == through));
        let permit = self.cpu.permit_for(turn.size).await;
        let prediction = self.cpu.run_with(&permit, || {
            self.predict(turn, usage.as_ref(), active, threshold)
        });
        drop(permit);
        let (predicted, head_tokens) = (prediction.tokens, prediction.head);
        decision.estimate = predicted;
        decision.head_tokens = head_tokens;
        decision.appended = prediction.appended;
        decision.growth = growth(usage.as_ref(), predicted);
        let target = self.target(threshold, soft, decision.growth);
        // An operator's scheduled compaction (POST /admin/conversations/{id}/compact)
        // forces this turn, with its focus for a summary.
        let scheduled = state.and_then(|s| s.scheduled.as_deref());
        let forced = turn.controls.compact == Compact::Force
            || matches!(reason, Reason::Overflow { .. })
            || scheduled.is_some();
        decision.active = !observe;

        if !forced && predicted <= threshold {
            if !observe {
                self.use_checkpoint(&mut decision, active, predicted, dry);
            }
            return decision;
        }
        // How this provider counts next to abridge's estimate, for this conversation.
        let ratio = self.calibration(turn, usage.as_ref(), active).await;

        // Over the threshold: a prepared, deeper checkpoint that brings the request to
        // the target needs no work now.
        if !forced {
            let deeper = matching
                .iter()
                .copied()
                .filter(|c| active.is_none_or(|a| c.through > a.through));
            for candidate in deeper {
                let estimate = scaled(
                    self.estimate_off(turn, Some(candidate), threshold).await,
                    ratio,
                );
                // A checkpoint prepared ahead (see `run_job`) was built for the target up
                // to two turns ago; the history has grown since by about that much.
                if estimate <= target.saturating_add(decision.growth.saturating_mul(2)) {
                    if observe {
                        self.observe(&mut decision, candidate, predicted, estimate, dry);
                    } else {
                        self.use_checkpoint(&mut decision, Some(candidate), estimate, dry);
                    }
                    return decision;
                }
            }
        }

        let (budget, trigger) = match reason {
            Reason::Overflow { sent } => ((sent / 2).min(target), Trigger::Retry),
            _ if forced => ((predicted / 2).min(target), Trigger::Forced),
            _ => (target, Trigger::Threshold),
        };
        // Observe mode: what recency (no LLM, nothing stored) would do.
        let strategy = if observe { Strategy::Recency } else { strategy };
        let mut attempt = Attempt {
            strategy,
            previous: matching.first().copied(),
            // The strategies count in abridge's estimate.
            budget: unscaled(budget, ratio),
            trigger,
            real: !observe && !dry,
            wait: true,
            focus: scheduled.filter(|f| !f.is_empty()),
        };
        let mut result = self.compact_now(turn, attempt).await;
        // Not even the minimal plan (head, marker, final turn) fits the budget: when it
        // still fits the threshold (or, for a retry, is smaller than what was sent),
        // compact to it, which is as small as the request can get.
        if let Err(CannotCompact::TooLarge { estimate, .. }) = result {
            let fits = match reason {
                Reason::Overflow { sent } => scaled(estimate, ratio) < sent,
                _ => scaled(estimate, ratio) <= threshold,
            };
            if fits {
                attempt.budget = estimate;
                result = self.compact_now(turn, attempt).await;
            }
        }
        match result {
            Ok((checkpoint, plan_note)) => {
                let estimate = scaled(
                    self.estimate_off(turn, Some(&checkpoint), threshold).await,
                    ratio,
                );
                if observe {
                    self.observe(&mut decision, &checkpoint, predicted, estimate, dry);
                } else {
                    self.use_checkpoint(&mut decision, Some(&checkpoint), estimate, dry);
                    decision.report.tokens_before = Some(predicted.max(checkpoint.tokens_before));
                    if let Some(note) = plan_note {
                        decision.report.add_note(note);
                    }
                }
                if let (Some(_), Some(conversation), false) =
                    (scheduled, turn.conversation, observe || dry)
                {
                    let _ = self.store.clear_scheduled(&conversation).await;
                }
            }
            Err(cannot) => {
                // Anti-thrash: even the minimal plan is over the threshold. Nothing is
                // suspended: the next turn is judged afresh (an agent's big tool output
                // in the final turn is usually gone from the final turn next time).
                if let CannotCompact::TooLarge { estimate, .. } = &cannot
                    && !dry
                {
                    let case = if scaled(head_tokens, ratio) * 2 > threshold {
                        Uncompactable::Head
                    } else {
                        Uncompactable::FinalTurn
                    };
                    self.stats.anti_thrash(case);
                    decision.report.add_note(format!(
                        "not compacted: the leading system messages and the final turn alone are about {} tokens, over the threshold of {threshold} ({}); forwarded as it was",
                        scaled(*estimate, ratio),
                        case.why()
                    ));
                } else {
                    decision.report.add_note(format!("not compacted: {cannot}"));
                }
                self.use_checkpoint(
                    &mut decision,
                    if observe { None } else { active },
                    predicted,
                    dry,
                );
            }
        }
        decision
    }

    /// What a compaction aims for: below the hard threshold by room for a few turns of
    /// this history's growth (`compaction.room_turns`), at least the soft threshold's
    /// headroom, so compactions come in steps and the forwarded prefix stays put
    /// between them. It may be 0: the strategies then go as low as the minimal plan.
    fn target(&self, threshold: u64, soft: u64, growth: u64) -> u64 {
        let room = (threshold - soft.min(threshold))
            .max(growth.saturating_mul(u64::from(self.config.room_turns)));
        threshold.saturating_sub(room)
    }

    /// The provider's count over abridge's estimate, for this conversation: what it
    /// reported for this history's last request against the estimate of the same view.
    /// 1 without a report. Clamped to 0.5–4.
    async fn calibration(
        &self,
        turn: &Turn<'_, '_>,
        usage: Option<&Usage>,
        active: Option<&Checkpoint>,
    ) -> f64 {
        let Some(u) = usage else {
            return 1.0;
        };
        let n = (u.messages as usize).min(turn.messages.len());
        let permit = self.cpu.permit_for(turn.size).await;
        let estimate = self.cpu.run_with(&permit, || {
            let estimator = Estimator::for_model_ready(turn.model);
            forwarded_estimate(&estimator, &turn.messages[..n], active)
        });
        if estimate == 0 || u.tokens == 0 {
            return 1.0;
        }
        (u.tokens as f64 / estimate as f64).clamp(0.5, 4.0)
    }

    /// Predicted prompt tokens of the request with `applied` applied, and the estimate
    /// of its head (the leading system messages).
    ///
    /// With a usage record of this history sent with the same checkpoint: the
    /// provider's own count, corrected for a head that changed since (a timestamp in
    /// the system prompt), plus an estimate of only what was appended. Otherwise the
    /// forwarded view estimated whole. Saturating: the numbers come from the provider,
    /// and a wrapped sum would read as a tiny conversation and switch compaction off.
    fn predict(
        &self,
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
                let appended: u64 = turn.messages[n..].iter().map(|m| exact.message(m)).sum();
                let scaled = appended.saturating_mul(u64::from(u.ratio_permille.max(1))) / 1000;
                return Prediction {
                    tokens: reported.saturating_add(scaled),
                    head,
                    appended,
                };
            }
        }
        Prediction {
            tokens: self.estimate_with(turn, applied, threshold),
            head,
            appended: 0,
        }
    }

    /// [`Compactor::estimate_with`] off the async workers when the request is large.
    async fn estimate_off(
        &self,
        turn: &Turn<'_, '_>,
        applied: Option<&Checkpoint>,
        threshold: u64,
    ) -> u64 {
        let permit = self.cpu.permit_for(turn.size).await;
        self.cpu
            .run_with(&permit, || self.estimate_with(turn, applied, threshold))
    }

    /// Estimated prompt tokens of the forwarded view with `applied` applied. Cheap
    /// estimate first (0.2 ms per 200 KB); the model's exact tokenizer (~9 ms per 200 KB)
    /// only when the cheap one is close enough to the threshold that the decision could
    /// differ: it reads 0.92–1.22 × the exact count, so below 0.7 × or above 1.4 × the
    /// threshold both sides agree.
    fn estimate_with(
        &self,
        turn: &Turn<'_, '_>,
        applied: Option<&Checkpoint>,
        threshold: u64,
    ) -> u64 {
        let cheap = forwarded_estimate(&Estimator::approx(), turn.messages, applied);
        let exact = Estimator::for_model_ready(turn.model);
        let near = cheap >= threshold / 10 * 7 && cheap <= threshold / 10 * 14;
        if !exact.is_exact() || !near {
            return cheap;
        }
        forwarded_estimate(&exact, turn.messages, applied)
    }

    fn use_checkpoint(
        &self,
        decision: &mut Decision,
        checkpoint: Option<&Checkpoint>,
        estimate: u64,
        dry: bool,
    ) {
        decision.estimate = estimate;
        let Some(c) = checkpoint else {
            return;
        };
        let saved = c.tokens_before.saturating_sub(c.tokens_after);
        let report = &mut decision.report;
        report.compacted = true;
        report.strategy = c.strategy.parse().ok();
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

    fn observe(
        &self,
        decision: &mut Decision,
        checkpoint: &Checkpoint,
        predicted: u64,
        estimate: u64,
        dry: bool,
    ) {
        decision.apply = None;
        decision.estimate = predicted;
        let report = &mut decision.report;
        report.compacted = false;
        report.strategy = checkpoint.strategy.parse().ok();
        report.tokens_before = Some(predicted);
        report.tokens_after = Some(estimate);
        report.messages_replaced = Some(checkpoint.messages_replaced());
        report.add_note("observe mode: would compact; forwarded unmodified");
        if !dry {
            self.stats.observed();
        }
    }

    /// Runs a strategy and stores the checkpoint. With a summarising strategy and a
    /// store, only one request per conversation builds at a time (single-flight): the
    /// others wait for its checkpoint (`attempt.wait`) or give up (background jobs).
    /// Returns the checkpoint and a note when the strategy fell back.
    async fn compact_now(
        &self,
        turn: &Turn<'_, '_>,
        attempt: Attempt<'_>,
    ) -> Result<(Checkpoint, Option<String>), CannotCompact> {
        let has_store = turn.loaded.is_some() && turn.conversation.is_some();
        let stored = attempt.real && has_store;
        let llm = matches!(
            attempt.strategy,
            Strategy::Structured | Strategy::LlmReplace
        );
        // Without a store a summary could not be kept: it would be paid for every turn.
        let attempt = if llm && !has_store {
            Attempt {
                strategy: Strategy::Recency,
                ..attempt
            }
        } else {
            attempt
        };
        if llm && !has_store {
            // Say why the summary was not made: a note, not a silent downgrade.
            let result = self.compact_now_unlocked(turn, attempt, stored).await;
            return result.map(|(checkpoint, note)| {
                let why = "summaries need the store: recency used".to_owned();
                (
                    checkpoint,
                    Some(note.map_or(why.clone(), |n| format!("{n}; {why}"))),
                )
            });
        }
        let (true, true, Some(conversation)) = (stored, llm, turn.conversation) else {
            return self.compact_now_unlocked(turn, attempt, stored).await;
        };
        let ttl = Duration::from_millis(self.config.lock_ttl_ms);
        // Twice at most: a second try when the holder's lock went away with no checkpoint
        // (the holder died); then recency rather than wait again.
        for _ in 0..2 {
            match self.store.try_lock(&conversation, ttl).await {
                Ok(Some(lock)) => {
                    // Kept alive while the summary is built; a holder that dies lets it
                    // expire within the TTL, and waiters take over. The guard also lets
                    // go when this future is dropped (the client left mid-summary).
                    let held = HeldLock::renewed(self.store.clone(), conversation, lock, ttl);
                    let result = self.compact_now_unlocked(turn, attempt, stored).await;
                    held.release().await;
                    return result;
                }
                Ok(None) if attempt.wait => match self
                    .wait_for_peer(turn, conversation, attempt.previous)
                    .await
                {
                    Peer::Built(found) => return Ok((found, None)),
                    Peer::Gone => continue,
                    Peer::Slow => break,
                },
                Ok(None) => return Err(CannotCompact::NothingToReplace),
                // The store failed just now: build without the lock (saving is still
                // first-writer-wins).
                Err(_) => return self.compact_now_unlocked(turn, attempt, stored).await,
            }
        }
        // The peer took too long or vanished twice: recency now, without the LLM.
        let recency = Attempt {
            strategy: Strategy::Recency,
            ..attempt
        };
        self.compact_now_unlocked(turn, recency, stored).await
    }

    async fn compact_now_unlocked(
        &self,
        turn: &Turn<'_, '_>,
        attempt: Attempt<'_>,
        stored: bool,
    ) -> Result<(Checkpoint, Option<String>), CannotCompact> {
        let Attempt {
            strategy,
            previous,
            budget,
            trigger,
            real,
            ..
        } = attempt;
        let estimator = Estimator::for_model_ready(turn.model);
        let previous_replacement: Vec<Box<RawValue>> = previous
            .and_then(|c| serde_json::from_str(c.replacement.get()).ok())
            .unwrap_or_default();
        let input = Input {
            messages: turn.messages,
            budget,
            previous: previous.map(|c| Previous {
                head: c.head as usize,
                through: c.through as usize,
                replacement: &previous_replacement,
                summary: c.summary.as_deref(),
            }),
            focus: attempt.focus,
            estimator: &estimator,
        };
        let summarise = |request: SummaryRequest| async move {
            // The summariser bounds the call by summary.timeout_ms itself.
            // Only for a tenant the provider accepted, and within its rate.
            match turn.tenant {
                Some(tenant) => {
                    if let Err(refusal) = self.tenants.may_summarise(tenant).await {
                        self.stats.summary_refused();
                        return Err(SummaryError::NotAttempted(refusal.reason()));
                    }
                }
                None => return Err(SummaryError::NotAttempted("the request has no tenant")),
            }
            self.stats.summary_call();
            let result = self
                .summariser
                .summarise(turn.credentials, turn.model, &request)
                .await;
            if let Err(failure) = &result {
                self.stats.summary_failure();
                // The class for the operator; the provider's text only at debug, with
                // secrets taken out (it can quote the credential it refused).
                tracing::warn!(conversation = ?turn.conversation, error = %failure, "summary failed; recency used");
                if let crate::summariser::SummaryFailure::Status { message, .. } = failure {
                    tracing::debug!(message = %compact::redact::redact(message), "summariser's error message");
                }
            }
            result.map_err(SummaryError::from)
        };
        let plan = compact::compact(strategy, &input, &self.settings, summarise, &self.cpu).await?;
        let checkpoint = checkpoint_of(&plan, turn.prefixes)?;
        let note = checkpoint.fallback.clone();
        if !real {
            return Ok((checkpoint, note));
        }
        if plan.fallback.is_some() {
            self.stats.fallback();
        }
        self.stats.compaction(
            plan.strategy,
            trigger,
            plan.tokens_before,
            plan.tokens_after,
        );
        if let Some(conversation) = turn.conversation {
            let mut recent = lock(&self.recent);
            if recent.len() == RECENT_COMPACTIONS {
                recent.pop_front();
            }
            recent.push_back(CompactionEvent {
                at_ms: checkpoint.created_ms,
                conversation,
                strategy: plan.strategy,
                requested: plan.requested,
                trigger: trigger.as_str(),
                tokens_before: plan.tokens_before,
                tokens_after: plan.tokens_after,
                messages_replaced: plan.messages_replaced,
                fallback: checkpoint.fallback.clone(),
            });
        }
        tracing::info!(
            conversation = ?turn.conversation,
            strategy = %plan.strategy,
            trigger = ?trigger,
            tokens_before = plan.tokens_before,
            tokens_after = plan.tokens_after,
            messages_replaced = plan.messages_replaced,
            fallback = plan.fallback.as_ref().map(ToString::to_string),
            "compacted"
        );
        let (Some(conversation), true) = (turn.conversation, stored) else {
            return Ok((checkpoint, note));
        };
        // This history keeps its deepest checkpoints; siblings keep theirs.
        let drop = turn.loaded.map_or_else(Vec::new, |l| {
            l.to_drop(turn.prefixes, &checkpoint, self.max_checkpoints)
        });
        match self
            .store
            .save_checkpoint(&conversation, &checkpoint, &drop)
            .await
        {
            Ok(Saved::AlreadyPresent) => {
                // Someone stored one for the same history first: forward theirs, so every
                // replica sends the same bytes.
                if let Ok(loaded) = self.store.load(&conversation).await
                    && let Some(first) = loaded
                        .checkpoints
                        .into_iter()
                        .find(|c| c.through == checkpoint.through && c.prefix == checkpoint.prefix)
                {
                    return Ok((first, None));
                }
                Ok((checkpoint, note))
            }
            Ok(Saved::Stored) | Err(_) => Ok((checkpoint, note)),
        }
    }

    /// Polls the store for the checkpoint a peer is building (deeper than `previous`).
    async fn wait_for_peer(
        &self,
        turn: &Turn<'_, '_>,
        conversation: Fingerprint,
        previous: Option<&Checkpoint>,
    ) -> Peer {
        let deadline = tokio::time::Instant::now() + self.summary_timeout + Duration::from_secs(1);
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(PEER_POLL).await;
            let Ok(loaded) = self.store.load(&conversation).await else {
                return Peer::Slow;
            };
            let found = loaded
                .all_matching(turn.prefixes)
                .find(|c| {
                    applicable(c, turn.messages) && previous.is_none_or(|p| c.through > p.through)
                })
                .cloned();
            if let Some(found) = found {
                self.stats.waited_for_peer();
                return Peer::Built(found);
            }
            if matches!(self.store.lock_held(&conversation).await, Ok(false)) {
                return Peer::Gone;
            }
        }
        Peer::Slow
    }

    /// record: the usage the provider reported goes to the store (in the background:
    /// the client has its bytes already); reports over the threshold although a
    /// checkpoint was applied count towards anti-thrash; over the soft threshold the next
    /// checkpoint is queued for a background build.
    pub fn record(self: &Arc<Self>, followup: Followup, reported: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let me = self.clone();
        let usage = Usage {
            prefix: followup.prefix,
            messages: followup.messages,
            tokens: reported,
            applied: followup.applied,
            head_tokens: followup.head_tokens,
            growth: followup.growth,
            ratio_permille: next_ratio(
                followup.previous,
                followup.applied,
                followup.appended,
                reported,
            ),
            at_ms: now_ms(),
        };
        let touch_index = now_ms().saturating_sub(followup.last_seen_ms) >= INDEX_REFRESH_MS;
        let (conversation, replaces) = (followup.conversation, followup.replaces);
        runtime.spawn(async move {
            // Failures are counted and logged by the store.
            let _ = me
                .store
                .record_usage(&conversation, usage, replaces, touch_index)
                .await;
        });
        // Prepare the next checkpoint once over the soft threshold, or when the next
        // two turns at this history's pace would cross the hard one.
        let soon = reported.saturating_add(followup.growth.saturating_mul(2)) > followup.threshold;
        if self.config.background && followup.active && (reported > followup.soft || soon) {
            self.queue_job(followup);
        }
    }

    /// The latest compactions, newest first.
    pub fn recent_compactions(&self) -> Vec<CompactionEvent> {
        lock(&self.recent).iter().rev().cloned().collect()
    }

    /// Background compactions queued or running.
    pub fn pending_jobs(&self) -> usize {
        lock(&self.pending).len()
    }

    fn queue_job(&self, followup: Followup) {
        let conversation = followup.conversation;
        if !self.store.is_healthy() || !lock(&self.pending).insert(conversation) {
            return;
        }
        let job = Job {
            conversation,
            body: followup.body,
            prefixes: followup.prefixes,
            model: followup.model,
            credentials: followup.credentials,
            tenant: followup.tenant,
            growth: followup.growth,
            _held: followup.held,
            strategy: followup.strategy,
        };
        if self.jobs.try_send(job).is_err() {
            lock(&self.pending).remove(&conversation);
            self.stats.background_dropped();
        }
    }

    /// Starts the background workers; they stop when `stop` changes (after finishing the
    /// job at hand).
    pub fn start_background(self: &Arc<Self>, stop: watch::Receiver<()>) -> JoinSet<()> {
        let mut set = JoinSet::new();
        let Some(queue) = lock(&self.queue).take() else {
            return set;
        };
        let queue = Arc::new(tokio::sync::Mutex::new(queue));
        for _ in 0..self.config.background_workers.max(1) {
            let (me, queue, mut stop) = (self.clone(), queue.clone(), stop.clone());
            set.spawn(async move {
                loop {
                    let job = tokio::select! {
                        _ = stop.changed() => break,
                        job = async { queue.lock().await.recv().await } => job,
                    };
                    let Some(job) = job else { break };
                    let conversation = job.conversation;
                    me.run_job(job).await;
                    lock(&me.pending).remove(&conversation);
                }
            });
        }
        set
    }

    async fn run_job(&self, job: Job) {
        let Ok(parsed) = chat::parse(&job.body) else {
            return;
        };
        let Ok(loaded) = self.store.load(&job.conversation).await else {
            return;
        };
        let controls = Controls::default();
        let turn = Turn {
            size: job.body.len(),
            messages: &parsed.messages,
            prefixes: &job.prefixes,
            conversation: Some(job.conversation),
            loaded: Some(&loaded),
            controls: &controls,
            model: &job.model,
            credentials: &job.credentials,
            tenant: Some(job.tenant),
        };
        let threshold = self.threshold(&job.model);
        let soft = ((threshold as f64) * self.config.soft_ratio) as u64;
        let target = self.target(threshold, soft, job.growth);
        let deepest = loaded
            .all_matching(&job.prefixes)
            .find(|c| applicable(c, &parsed.messages));
        let usage = loaded.usage_for(&job.prefixes).copied();
        let in_use = usage.and_then(|u| u.applied);
        let active = in_use.and_then(|t| {
            loaded
                .all_matching(&job.prefixes)
                .find(|c| c.through == t && applicable(c, &parsed.messages))
        });
        let ratio = self.calibration(&turn, usage.as_ref(), active).await;
        let estimate = scaled(self.estimate_off(&turn, deepest, threshold).await, ratio);
        // Nothing to do while the deepest checkpoint keeps the request at the target, or
        // while one prepared ahead (deeper than the one in use) would still leave room
        // when the hard threshold is crossed: building again every turn would pay for
        // summaries that are never forwarded.
        let prepared = deepest.is_some_and(|d| in_use.is_none_or(|a| d.through > a));
        if estimate <= target || (prepared && estimate <= target + (threshold - target) / 2) {
            return;
        }
        let mut attempt = Attempt {
            strategy: job.strategy,
            previous: deepest,
            budget: unscaled(target, ratio),
            trigger: Trigger::Background,
            real: true,
            wait: false,
            focus: None,
        };
        let mut result = self.compact_now(&turn, attempt).await;
        if let Err(CannotCompact::TooLarge { estimate, .. }) = result
            && scaled(estimate, ratio) <= threshold
        {
            attempt.budget = estimate;
            result = self.compact_now(&turn, attempt).await;
        }
        match result {
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(conversation = %job.conversation, error = %e, "background compaction skipped")
            }
        }
    }
}

/// Estimated prompt tokens of `messages` with `applied` applied.
fn forwarded_estimate(
    estimator: &Estimator,
    messages: &[Message<'_>],
    applied: Option<&Checkpoint>,
) -> u64 {
    let Some(c) = applied else {
        return estimator.messages(messages);
    };
    let (head, through) = (c.head as usize, c.through as usize);
    let replacement: Vec<&RawValue> = serde_json::from_str(c.replacement.get()).unwrap_or_default();
    let replaced: u64 = replacement
        .iter()
        .filter_map(|raw| Message::parse(raw).ok())
        .map(|m| estimator.message(&m))
        .sum();
    let kept: u64 = messages
        .iter()
        .take(head)
        .chain(messages.iter().skip(through + 1))
        .map(|m| estimator.message(m))
        .sum();
    kept + replaced + estimator.per_request()
}

/// A stored checkpoint fits this request: its cuts lie before the final turn and after
/// it comes no tool result (a later turn cannot change what was checked when it was
/// built, since the prefix hash matches; this guards against a corrupt store).
fn applicable(c: &Checkpoint, messages: &[Message<'_>]) -> bool {
    let (head, through) = (c.head as usize, c.through as usize);
    let last_user = messages.iter().rposition(|m| m.role == Role::User);
    head <= through + 1
        && last_user.is_some_and(|u| through < u)
        && messages
            .get(through + 1)
            .is_some_and(|m| !matches!(m.role, Role::Tool | Role::Function))
}

fn checkpoint_of(plan: &Plan, prefixes: &[Fingerprint]) -> Result<Checkpoint, CannotCompact> {
    let prefix = *prefixes
        .get(plan.through)
        .ok_or(CannotCompact::NothingToReplace)?;
    let raw: Vec<&RawValue> = plan.replacement.iter().map(|r| &**r).collect();
    let replacement =
        serde_json::value::to_raw_value(&raw).map_err(|_| CannotCompact::NothingToReplace)?;
    Ok(Checkpoint {
        through: u32::try_from(plan.through).unwrap_or(u32::MAX),
        prefix,
        head: u32::try_from(plan.head).unwrap_or(u32::MAX),
        replacement,
        summary: plan.summary.clone(),
        strategy: plan.strategy.to_string(),
        fallback: plan
            .fallback
            .as_ref()
            .map(|f| format!("{} fell back to recency: {f}", plan.requested)),
        tokens_before: plan.tokens_before,
        tokens_after: plan.tokens_after,
        created_ms: now_ms(),
    })
}

/// The forwarded messages of `messages` with `checkpoint` applied (`None`: as sent).
pub fn forwarded<'r>(
    messages: &'r [Message<'r>],
    checkpoint: &'r Checkpoint,
) -> Option<Vec<&'r RawValue>> {
    let replacement: Vec<&'r RawValue> = serde_json::from_str(checkpoint.replacement.get()).ok()?;
    let (head, through) = (checkpoint.head as usize, checkpoint.through as usize);
    Some(
        messages
            .iter()
            .take(head)
            .map(|m| m.raw)
            .chain(replacement)
            .chain(messages.iter().skip(through + 1).map(|m| m.raw))
            .collect(),
    )
}

/// A std mutex around plain data; never held across an `.await`.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
