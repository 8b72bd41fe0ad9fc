//! After the response: the usage the provider reported goes to the store, and when the
//! conversation is near its threshold the next checkpoint is built by a background
//! worker, so the turn that crosses the threshold finds it ready. Bounded: a fixed
//! number of workers, a queue of `compaction.background_queue` jobs (more are dropped
//! and counted), one job per conversation at a time.
//!
//! A summary the tenant's budget refuses now waits for it (at most as many jobs as the
//! queue holds, each for at most two minutes) instead of becoming `recency`: the job is
//! put back once the budget refills, with the conversation's latest request by then.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::accounting::Entry;
use crate::controls::Controls;
use crate::identity::Fingerprint;
use crate::outcome::Trigger;
use crate::store::{INDEX_REFRESH_MS, Usage, now_ms};
use crate::strategies::CannotCompact;

use super::Compactor;
use super::build::{Attempt, summary_kind};
use super::decide::{self, applicable, next_ratio, scaled};
use super::turn::{Followup, Turn};

/// The queue and who is in it.
pub(super) struct Background {
    jobs: mpsc::Sender<Followup>,
    queue: Mutex<Option<mpsc::Receiver<Followup>>>,
    /// Conversations with a job queued, running or waiting (std mutex: no `.await`
    /// under it).
    pending: Mutex<HashSet<Fingerprint>>,
    /// Jobs waiting for their tenant's summary budget, the latest request of each
    /// conversation (at most `capacity`).
    waiting: Mutex<HashMap<Fingerprint, Followup>>,
    capacity: usize,
    /// Usage records being written to the store ([`Compactor::record`]).
    recording: AtomicUsize,
}

impl Background {
    pub(super) fn new(capacity: usize) -> Self {
        let (jobs, queue) = mpsc::channel(capacity.max(1));
        Self {
            jobs,
            queue: Mutex::new(Some(queue)),
            pending: Mutex::new(HashSet::new()),
            waiting: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
            recording: AtomicUsize::new(0),
        }
    }

    pub(super) fn pending(&self) -> usize {
        lock(&self.pending).len()
    }

    /// No job queued, running or waiting, and no usage record being written.
    pub(super) fn settled(&self) -> bool {
        self.pending() == 0 && self.recording.load(Ordering::SeqCst) == 0
    }
}

impl Compactor {
    /// record: the usage the provider reported goes to the store (in the background:
    /// the client has its bytes already), for this exact history, with what the request
    /// adds to the conversation's account; near the threshold the next checkpoint is
    /// queued for a background build.
    pub fn record(self: &Arc<Self>, followup: Followup, reported: u64, entry: Entry) {
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
            client_tokens: entry.tally.client_tokens,
            beside: followup.beside,
            at_ms: now_ms(),
        };
        let touch_index = now_ms().saturating_sub(followup.last_seen_ms) >= INDEX_REFRESH_MS;
        let (conversation, replaces) = (followup.conversation, followup.replaces);
        // Prepare the next checkpoint once over the soft threshold, or when the next
        // two turns at this history's pace would cross the hard one — where it will be
        // used (the cost policy may expect the conversation to go on uncompacted).
        let soon = reported.saturating_add(followup.growth.saturating_mul(2)) > followup.threshold;
        let near = reported > followup.soft || soon;
        let job = (self.config.background && followup.active && followup.expects && near)
            .then_some(followup);
        self.background.recording.fetch_add(1, Ordering::SeqCst);
        runtime.spawn(async move {
            // Failures are counted and logged by the store.
            let _ = me
                .store
                .record_usage(&conversation, (usage, &entry), replaces, touch_index)
                .await;
            // Queued once the record is written, so the job loads what this request
            // left: queued beside the write, a job could load the conversation before
            // it, and build from the request before (replay's figures varied from run to
            // run with which came first).
            if let Some(job) = job {
                me.queue_job(job);
            }
            me.background.recording.fetch_sub(1, Ordering::SeqCst);
        });
    }

    fn queue_job(&self, followup: Followup) {
        let conversation = followup.conversation;
        if !self.store.is_healthy() {
            return;
        }
        // Waiting for the budget: it will build with this, the latest request.
        if let Some(waiting) = lock(&self.background.waiting).get_mut(&conversation) {
            *waiting = followup;
            return;
        }
        if !lock(&self.background.pending).insert(conversation) {
            return;
        }
        // The follow-up is the job: it holds the parsed request and the body's share of
        // the byte budget until the job is done or dropped.
        if self.background.jobs.try_send(followup).is_err() {
            lock(&self.background.pending).remove(&conversation);
            self.stats.background_dropped();
        }
    }

    /// Starts the background workers; they stop when `stop` changes (after finishing the
    /// job at hand).
    pub fn start_background(self: &Arc<Self>, stop: watch::Receiver<()>) -> JoinSet<()> {
        let mut set = JoinSet::new();
        let Some(queue) = lock(&self.background.queue).take() else {
            return set;
        };
        // What other replicas and earlier runs learned of the models' windows: now, and
        // every so often.
        let (me, mut stop_refresh) = (self.clone(), stop.clone());
        set.spawn(async move {
            loop {
                me.refresh_windows().await;
                tokio::select! {
                    _ = stop_refresh.changed() => break,
                    () = tokio::time::sleep(crate::windows::REFRESH_EVERY) => {}
                }
            }
        });
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
                    if !me.run_job(job).await {
                        lock(&me.background.pending).remove(&conversation);
                    }
                }
            });
        }
        set
    }

    /// Runs a job; true when it was put off until its tenant's budget refills (the
    /// conversation stays pending).
    async fn run_job(self: &Arc<Self>, job: Followup) -> bool {
        let Ok(loaded) = self.store.load(&job.conversation).await else {
            return false;
        };
        let model = crate::azure::model_of(job.request.model(), job.deployment.as_ref());
        let controls = Controls::default();
        let turn = Turn {
            size: job.request.body().len(),
            body: job.request.body(),
            request: Some(&job.request),
            format: job.request.format(),
            messages: job.request.items(),
            prefixes: &job.prefixes,
            conversation: Some(job.conversation),
            loaded: Some(&loaded),
            controls: &controls,
            model,
            deployment: job.deployment.as_ref(),
            credentials: &job.credentials,
            provider: job.provider,
            payer: Some(job.payer),
            recall_tool: job.recall_tool,
            recall_always: job.recall_always,
            beside: Default::default(),
            tool_prune_chars: self.settings.tool_prune_chars,
        };
        let Some(attempt) = self.job_attempt(&turn, &job).await else {
            return false;
        };
        let (mut attempt, ratio) = attempt;
        if attempt.strategy.summarises() && self.tenants.spent(job.payer, summary_kind(&turn)) {
            let wait = self.tenants.wait(job.payer);
            drop(loaded);
            return self.wait_for_budget(job, wait);
        }
        let mut result = self.compact_now(&turn, attempt).await;
        // Not even the minimal plan fits the target: the minimal plan, if it fits the
        // threshold.
        if let Err(CannotCompact::TooLarge { estimate, .. }) = result
            && scaled(estimate, ratio) + decide::beside(&turn)
                <= self.threshold(job.provider, model, Some(job.payer))
        {
            attempt.budget = estimate;
            result = self.compact_now(&turn, attempt).await;
        }
        if let Err(e) = result {
            tracing::debug!(conversation = %job.conversation, error = %e, "background compaction skipped");
        }
        false
    }

    /// Puts `job` back in the queue after `wait`, with whatever later request of its
    /// conversation arrived meanwhile; false (dropped, counted) when as many jobs wait
    /// already as the queue holds.
    fn wait_for_budget(self: &Arc<Self>, job: Followup, wait: std::time::Duration) -> bool {
        let conversation = job.conversation;
        {
            let mut waiting = lock(&self.background.waiting);
            if waiting.len() >= self.background.capacity {
                self.stats.background_dropped();
                return false;
            }
            waiting.insert(conversation, job);
        }
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let Some(job) = lock(&me.background.waiting).remove(&conversation) else {
                return;
            };
            if me.background.jobs.try_send(job).is_err() {
                lock(&me.background.pending).remove(&conversation);
                me.stats.background_dropped();
            }
        });
        true
    }

    /// What a job builds, and the ratio its budget is calibrated with; `None` when there
    /// is nothing to do: the deepest checkpoint keeps the request at the target, or one
    /// prepared ahead (deeper than the one in use) would still leave room when the hard
    /// threshold is crossed — building again every turn would pay for summaries that
    /// are never forwarded.
    async fn job_attempt<'t>(
        &self,
        turn: &Turn<'t, '_>,
        job: &Followup,
    ) -> Option<(Attempt<'t>, f64)> {
        let threshold = self.threshold(turn.provider, turn.model, turn.payer);
        let soft = ((threshold as f64) * self.config.soft_ratio) as u64;
        let loaded = turn.loaded?;
        let deepest = loaded
            .all_matching(turn.prefixes)
            .find(|c| applicable(c, turn.messages));
        let usage = loaded.usage_for(turn.prefixes).copied();
        let in_use = usage.and_then(|u| u.applied);
        let active = in_use.and_then(|t| {
            loaded
                .all_matching(turn.prefixes)
                .find(|c| c.through == t && applicable(c, turn.messages))
        });
        let permit = self.cpu.permit_for(turn.size).await;
        let (ratio, estimate, target) = self.cpu.run_with(&permit, || {
            let ratio = decide::calibration(turn, usage.as_ref(), active);
            let target = match self.costs(turn.model) {
                true => decide::deep(&self.config, threshold, job.growth),
                false => decide::target(&self.config, threshold, soft, job.growth),
            };
            (
                ratio,
                scaled(decide::estimate(turn, deepest, threshold), ratio) + decide::beside(turn),
                decide::with_room(
                    turn,
                    target,
                    soft.min(decide::raised_at_most(threshold, job.growth)),
                    ratio,
                ),
            )
        });
        drop(permit);
        let prepared = deepest.is_some_and(|d| in_use.is_none_or(|a| d.through > a));
        if estimate <= target || (prepared && estimate <= target + (threshold - target) / 2) {
            return None;
        }
        let attempt = Attempt {
            strategy: job.strategy,
            previous: deepest,
            forwarded: active,
            budget: decide::items_budget(turn, target, ratio),
            ratio,
            trigger: Trigger::Background,
            real: true,
            wait: false,
            focus: None,
        };
        Some((attempt, ratio))
    }
}

/// A std mutex around plain data; never held across an `.await`.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::formats::{Format, Request};

    fn fingerprint(digit: char) -> Fingerprint {
        Fingerprint::from_hex(&digit.to_string().repeat(64)).unwrap()
    }

    /// A request near its threshold whose next checkpoint is to be built ahead.
    fn followup(conversation: Fingerprint) -> Followup {
        let body = serde_json::json!({
            "model": "gpt-4o",
            "messages": [{"role": "user", "content": "Fix the importer in src/import.rs."}],
        });
        let request = Request::parse(Format::Chat, bytes::Bytes::from(body.to_string())).unwrap();
        Followup {
            conversation,
            messages: 1,
            prefix: fingerprint('b'),
            applied: None,
            threshold: 1_000,
            soft: 500,
            active: true,
            strategy: crate::strategies::Strategy::Recency,
            replaces: None,
            growth: 100,
            head_tokens: 0,
            appended: 0,
            beside: 0,
            previous: None,
            last_seen_ms: 0,
            expects: true,
            verdict: Default::default(),
            request: Arc::new(request),
            prefixes: vec![fingerprint('b')],
            credentials: Default::default(),
            deployment: None,
            provider: Default::default(),
            recall_tool: false,
            recall_always: false,
            payer: fingerprint('c'),
            held: None,
        }
    }

    /// The job a request queues loads what that request left: it is queued once the
    /// request's usage is written, not beside the write (a job that loaded first built
    /// from the request before, and replay's figures varied from run to run).
    #[tokio::test] // One thread: the write runs only when the test awaits.
    async fn a_job_is_queued_once_its_requests_usage_is_written() {
        let state = crate::state::AppState::new(crate::config::Config::default()).unwrap();
        let compactor = state.compactor();
        let conversation = fingerprint('a');
        compactor.record(followup(conversation), 900, Entry::default());
        assert_eq!(compactor.background.pending(), 0, "queued before the write");
        assert!(!compactor.settled(), "the write is in flight");
        for _ in 0..100 {
            if compactor.background.pending() == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(compactor.background.pending(), 1, "queued after the write");
        let loaded = state.store().load(&conversation).await.unwrap();
        assert_eq!(loaded.usage.first().map(|u| u.tokens), Some(900));
    }
}
