//! Building a checkpoint: running a strategy (with the summariser for the summarising
//! ones, only for an accepted tenant), counting and logging it, saving it — and, for
//! summaries with a store, single-flight: one request per conversation (on any replica)
//! builds, the others wait for its checkpoint or take recency.

use std::time::Duration;

use crate::accounting;
use crate::headers::Provider;
use crate::identity::Fingerprint;
use crate::outcome::Trigger;
use crate::store::{Checkpoint, Kept, Lock, Saved, Store, now_ms};
use crate::strategies::{
    self, CannotCompact, Input, Origin, Plan, Previous, Strategy, SummaryError,
};
use crate::tenants::Kind;
use crate::tokens::Estimator;

use super::Compactor;
use super::decide::applicable;
use super::in_context::Forwarded;
use super::ring::CompactionEvent;
use super::summariser::SummaryFailure;
use super::turn::Turn;

/// Poll interval while another request or replica builds the checkpoint we need.
const PEER_POLL: Duration = Duration::from_millis(50);

/// One run of a strategy.
#[derive(Clone, Copy)]
pub(super) struct Attempt<'c> {
    pub strategy: Strategy,
    /// The deepest checkpoint of this history, for an iterative update.
    pub previous: Option<&'c Checkpoint>,
    /// The checkpoint the history's last forwarded request went with (`None`: whole):
    /// a summary asked after the conversation repeats that request's prefix.
    pub forwarded: Option<&'c Checkpoint>,
    /// In abridge's estimate.
    pub budget: u64,
    /// The provider's count over abridge's estimate the budget was converted with.
    pub ratio: f64,
    pub trigger: Trigger,
    /// Store, count and log it (false: observe mode's or a preview's dry run).
    pub real: bool,
    /// Wait for a peer's summary when the single-flight lock is taken (false: give up).
    pub wait: bool,
    /// What a summary should keep in particular detail (an operator's request).
    pub focus: Option<&'c str>,
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

/// What waiting for another request's (or replica's) summary came to.
enum Peer {
    /// Its checkpoint is stored.
    Built(Box<Checkpoint>),
    /// Its lock is gone and no checkpoint came: it died or gave up.
    Gone,
    /// It did not finish in time (or the store stopped answering).
    Slow,
}

/// A checkpoint and the note to add to the report (a fallback, recency without a
/// store).
pub(super) type Built = (Checkpoint, Option<String>);

impl Compactor {
    /// Runs a strategy and stores the checkpoint. With a summarising strategy and a
    /// store, only one request per conversation builds at a time (single-flight): the
    /// others wait for its checkpoint (`attempt.wait`) or give up (background jobs).
    pub(super) async fn compact_now(
        &self,
        turn: &Turn<'_, '_>,
        attempt: Attempt<'_>,
    ) -> Result<Built, CannotCompact> {
        let has_store = turn.loaded.is_some() && turn.conversation.is_some();
        let stored = attempt.real && has_store;
        let llm = attempt.strategy.summarises();
        if llm && !has_store {
            // Without a store a summary could not be kept: it would be paid for every
            // turn. Say why the summary was not made: a note, not a silent downgrade.
            let recency = Attempt {
                strategy: Strategy::Recency,
                ..attempt
            };
            let result = self.build(turn, recency, stored).await;
            return result.map(|(checkpoint, note)| {
                let why = "summaries need the store: recency used".to_owned();
                (
                    checkpoint,
                    Some(note.map_or(why.clone(), |n| format!("{n}; {why}"))),
                )
            });
        }
        let (true, true, Some(conversation)) = (stored, llm, turn.conversation) else {
            return self.build(turn, attempt, stored).await;
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
                    let result = self.build(turn, attempt, stored).await;
                    held.release().await;
                    return result;
                }
                Ok(None) if attempt.wait => match self
                    .wait_for_peer(turn, conversation, attempt.previous)
                    .await
                {
                    Peer::Built(found) => return Ok((*found, None)),
                    Peer::Gone => continue,
                    Peer::Slow => break,
                },
                Ok(None) => return Err(CannotCompact::NothingToReplace),
                // The store failed just now: build without the lock (saving is still
                // first-writer-wins).
                Err(_) => return self.build(turn, attempt, stored).await,
            }
        }
        // The peer took too long or vanished twice: recency now, without the LLM.
        let recency = Attempt {
            strategy: Strategy::Recency,
            ..attempt
        };
        self.build(turn, recency, stored).await
    }

    /// Runs the strategy; a real attempt is counted and logged, and saved when
    /// `stored`.
    async fn build(
        &self,
        turn: &Turn<'_, '_>,
        attempt: Attempt<'_>,
        stored: bool,
    ) -> Result<Built, CannotCompact> {
        let plan = self.run_strategy(turn, &attempt).await?;
        // Neither stored nor forwarded: it would change the prefix (and the provider's
        // cache) for nothing.
        if plan.tokens_after >= plan.tokens_before {
            return Err(CannotCompact::NoSmaller {
                before: plan.tokens_before,
                after: plan.tokens_after,
            });
        }
        let checkpoint = checkpoint_of(&plan, turn.prefixes)?;
        let note = checkpoint.fallback.clone();
        if !attempt.real {
            return Ok((checkpoint, note));
        }
        self.account(turn, &plan, &checkpoint, attempt.trigger);
        match (turn.conversation, stored) {
            (Some(conversation), true) => Ok(self.save(turn, conversation, checkpoint, note).await),
            _ => Ok((checkpoint, note)),
        }
    }

    async fn run_strategy(
        &self,
        turn: &Turn<'_, '_>,
        attempt: &Attempt<'_>,
    ) -> Result<Plan, CannotCompact> {
        let estimator = Estimator::for_model_ready(turn.model);
        let input = Input {
            messages: turn.messages,
            budget: attempt.budget,
            previous: attempt.previous.map(|c| Previous {
                head: c.head as usize,
                through: c.through as usize,
                replacement: &c.replacement,
                kept: &c.kept,
                summary: c.summary.as_deref(),
            }),
            focus: attempt.focus,
            estimator: &estimator,
            format: turn.format,
            summary_window: Some(self.window(
                turn.provider,
                self.summariser.model_for(turn.model),
                turn.payer,
            )),
            summary_ratio: (!estimator.is_exact() && self.summariser.counts_like(turn.model))
                .then_some(attempt.ratio),
        };
        let summarise = |request| self.summarise(turn, attempt.forwarded, request);
        strategies::compact(
            attempt.strategy,
            &input,
            &self.settings,
            summarise,
            &self.cpu,
        )
        .await
    }

    /// One summary for `turn`: only for a tenant the provider accepted, and within its
    /// rate; a failure is counted and logged as its class (the provider's own text only
    /// at debug, with secrets taken out: it can quote the credential it refused).
    async fn summarise(
        &self,
        turn: &Turn<'_, '_>,
        forwarded: Option<&Checkpoint>,
        request: strategies::SummaryRequest,
    ) -> Result<strategies::Answer, SummaryError> {
        let Some(payer) = turn.payer else {
            return Err(SummaryError::NotAttempted("the request has no tenant"));
        };
        // Claude Code's OAuth sign-ins are accepted by Anthropic for Claude Code's own
        // requests only: a summary asked with one would be refused (and is not the
        // subscriber's to spend). summary.upstream serves them.
        if turn.provider == Provider::Anthropic
            && self.summariser.uses_client_credentials()
            && turn.credentials.is_subscription_sign_in()
        {
            self.stats.summary_refused();
            return Err(SummaryError::NotAttempted(
                "a Claude subscription sign-in (OAuth) cannot be used for summaries: set summary.upstream to summarise these conversations",
            ));
        }
        // Charged as it starts: its prompt at about four bytes a token, and its cap.
        let cost = (request.system.len() + request.prompt.len()) as u64 / 4
            + u64::from(request.max_tokens);
        if let Err(refusal) = self
            .tenants
            .may_summarise(payer, summary_kind(turn), cost)
            .await
        {
            self.stats.summary_refused();
            return Err(SummaryError::NotAttempted(refusal.reason()));
        }
        self.stats.summary_call();
        let result = self.ask(turn, forwarded, &request).await;
        // The provider refused the client's own credential on the summary call.
        if let Err(SummaryFailure::Status {
            status: 401 | 403, ..
        }) = &result
            && self.summariser.uses_client_credentials()
        {
            self.tenants.refused(payer);
        }
        if let Ok(spent) = result.as_ref().map(|a| a.spent) {
            let model = self.summariser.model_for(turn.model);
            let tally = accounting::summary(spent.unwrap_or_default(), self.prices.of(model));
            self.stats.tally(&tally);
            if let Some(conversation) = turn.conversation {
                let store = self.store.clone();
                // Off the summary's path; failures are counted and logged by the store.
                tokio::spawn(async move { store.add_tally(&conversation, &tally).await });
            }
        }
        if let Err(failure) = &result {
            self.stats.summary_failure();
            tracing::warn!(conversation = ?turn.conversation, error = %failure, "summary failed; recency used");
            if let SummaryFailure::Status { message, .. } = failure {
                tracing::debug!(message = %strategies::redact::redact(message), "summariser's error message");
            }
        }
        result.map_err(SummaryError::from)
    }

    /// The summary call: after the conversation itself where it can be (see
    /// [`super::in_context`]) and the provider's cache may hold it, else — or when that
    /// answer is not a summary — the transcript. The summariser bounds each call by
    /// summary.timeout_ms itself.
    async fn ask(
        &self,
        turn: &Turn<'_, '_>,
        checkpoint: Option<&Checkpoint>,
        request: &strategies::SummaryRequest,
    ) -> Result<strategies::Answer, SummaryFailure> {
        let client = (turn.credentials, turn.provider, turn.deployment);
        if warm(turn, self.config.cache_ttl_ms)
            && let Some(forwarded) = turn.request.map(|request| Forwarded {
                request,
                checkpoint,
                recall_tool: turn.recall_tool && (checkpoint.is_some() || turn.recall_always),
                recall_always: turn.recall_always,
            })
            && let Some(result) = self
                .summariser
                .summarise_in_context(client, turn.model, &forwarded, request)
                .await
        {
            match result {
                Ok(answer) => {
                    self.stats.summary_in_context();
                    return Ok(answer);
                }
                // Gone or slow: the transcript would be no better.
                Err(e @ (SummaryFailure::Timeout(_) | SummaryFailure::Unreachable(_))) => {
                    return Err(e);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "the summary after the conversation failed; the transcript is asked");
                }
            }
        }
        self.summariser
            .summarise(
                (
                    turn.credentials,
                    turn.provider,
                    turn.format,
                    turn.deployment,
                ),
                turn.model,
                request,
            )
            .await
    }

    /// Counts a compaction, lists it in the ring, logs it.
    fn account(&self, turn: &Turn<'_, '_>, plan: &Plan, checkpoint: &Checkpoint, trigger: Trigger) {
        if plan.fallback.is_some() {
            self.stats.fallback();
        }
        if let Some(verdict) = &plan.verdict {
            self.stats.summary_gate(verdict);
        }
        self.stats.compaction(
            plan.strategy,
            trigger,
            plan.tokens_before,
            plan.tokens_after,
        );
        if let Some(conversation) = turn.conversation {
            self.ring.push(CompactionEvent {
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
    }

    /// Saves the checkpoint; when one for the same history was stored first, that one
    /// is forwarded instead, so every replica sends the same bytes.
    async fn save(
        &self,
        turn: &Turn<'_, '_>,
        conversation: Fingerprint,
        checkpoint: Checkpoint,
        note: Option<String>,
    ) -> Built {
        // This history keeps its deepest checkpoints; siblings keep theirs.
        let drop = turn.loaded.map_or_else(Vec::new, |l| {
            l.to_drop(turn.prefixes, &checkpoint, self.max_checkpoints)
        });
        let saved = self
            .store
            .save_checkpoint(&conversation, &checkpoint, &drop)
            .await;
        if let Ok(Saved::AlreadyPresent) = saved
            && let Ok(loaded) = self.store.load(&conversation).await
            && let Some(first) = loaded
                .checkpoints
                .into_iter()
                .find(|c| c.through == checkpoint.through && c.prefix == checkpoint.prefix)
        {
            return (first, None);
        }
        (checkpoint, note)
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
                return Peer::Built(Box::new(found));
            }
            if matches!(self.store.lock_held(&conversation).await, Ok(false)) {
                return Peer::Gone;
            }
        }
        Peer::Slow
    }
}

/// Whether a summary for `turn` would be its conversation's first (no checkpoint of its
/// history holds one): the tenant budget's floor applies.
pub(super) fn summary_kind(turn: &Turn<'_, '_>) -> Kind {
    let summarised = turn
        .loaded
        .is_some_and(|l| l.all_matching(turn.prefixes).any(|c| c.summary.is_some()));
    if summarised {
        Kind::Update
    } else {
        Kind::First
    }
}

/// The checkpoint of a plan: what abridge wrote, stored; the client's messages it kept
/// verbatim, by reference.
fn checkpoint_of(plan: &Plan, prefixes: &[Fingerprint]) -> Result<Checkpoint, CannotCompact> {
    let prefix = *prefixes
        .get(plan.through)
        .ok_or(CannotCompact::NothingToReplace)?;
    let index = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let mut replacement = Vec::with_capacity(plan.replacement.len());
    let mut kept = Vec::new();
    for (at, (raw, origin)) in plan.replacement.iter().zip(&plan.origin).enumerate() {
        match origin {
            Origin::Verbatim(k) => kept.push(Kept {
                at: index(at),
                of: index(*k),
            }),
            Origin::Authored | Origin::Digest(_) => replacement.push(raw.clone()),
        }
    }
    Ok(Checkpoint {
        through: index(plan.through),
        prefix,
        head: index(plan.head),
        replacement,
        kept,
        summary: plan.summary.clone(),
        strategy: plan.strategy,
        fallback: plan
            .fallback
            .as_ref()
            .map(|f| format!("{} fell back to recency: {f}", plan.requested)),
        tokens_before: plan.tokens_before,
        tokens_after: plan.tokens_after,
        tokens_sent: plan.tokens_sent,
        created_ms: now_ms(),
        gate: plan.verdict.clone(),
    })
}

/// Whether the provider's cache may hold the conversation: a request of it was forwarded
/// within the cache's lifetime. On a cold cache (a conversation resumed, or first seen
/// already long) the conversation asked whole would be paid in full, where the
/// transcript (its items cut) is smaller.
fn warm(turn: &Turn<'_, '_>, cache_ttl_ms: u64) -> bool {
    turn.loaded
        .and_then(|l| l.usage.first())
        .is_some_and(|u| now_ms().saturating_sub(u.at_ms) <= cache_ttl_ms)
}
