//! What abridge knows about a tenant (a credential, by its keyed hash — never the
//! credential itself): whether the provider has accepted it, how many summaries it
//! asked for lately, and whether the provider refused the recall tool with its requests.
//!
//! The tenant here is the credential the route's provider authenticates (the *payer*,
//! see `headers::Credentials::payer`), not every credential header a request carries:
//! a header the provider ignores must not make a fresh tenant with a fresh budget.
//!
//! - **Accepted.** A summary costs the operator money when `summary.upstream` is set (it
//!   is called with the operator's key), and even on the main upstream a request must
//!   not be able to start summaries for a credential the provider would refuse. So a
//!   tenant's summaries are asked for only once the provider has answered one of its
//!   requests with a 2xx. That is remembered in the store (shared by replicas) for
//!   [`ACCEPTED_TTL`] after the last 2xx, and trusted in-process for [`TRUSTED_FOR`]
//!   (then the store is asked again). A 401 or 403 from the provider for the credential
//!   — on a request or on a summary call made with it — clears both at once: a revoked
//!   key spends at most the summary that was already under way when it was revoked.
//!   Until accepted, summarising strategies use `recency` and say why.
//! - **Budget.** A tenant's summaries spend from a budget in tokens per minute and
//!   process (`summary.max_tokens_per_tenant_per_minute`; a summary costs its prompt's
//!   bytes / 4 plus the tokens it may answer with), and optionally a count
//!   (`summary.max_per_tenant_per_minute`, 0: none). A summary may start while the
//!   budget is not overdrawn; its cost is charged when it starts, so one call may
//!   overdraw it. **The floor:** a conversation's first summary is never refused for
//!   what the tenant's other conversations spent: it may start until the tenant has
//!   overdrawn a second minute's budget (the bound that keeps a flood of fresh
//!   conversations from spending without end). A refused update is built in the
//!   background once the budget allows ([`Tenants::wait`]), not replaced by `recency`
//!   when the request still fits.
//! - **Recall refused.** When the provider refuses a tenant's compacted request for the
//!   `abridge_recall` tool and takes it without, that tenant's requests go without the
//!   tool for [`RECALL_REFUSAL_FOR`] (then it is tried again). Per tenant only: what one
//!   tenant's requests earn never changes another's (a client's own tools can make the
//!   provider refuse; see `proxy::recall`). Kept per process, not in the store.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::identity::Fingerprint;
use crate::store::Store;

/// Tenants remembered per process, for each of the two maps (bounded: a flood of new
/// credentials evicts the oldest, which only costs a store read or a fresh bucket).
const MAX_TENANTS: usize = 100_000;
/// How long the store remembers an "accepted" after the last 2xx.
pub const ACCEPTED_TTL: Duration = Duration::from_secs(3600);
/// How long an in-process "accepted" is trusted before the store is asked again (so a
/// refusal another replica saw is heeded within this).
pub const TRUSTED_FOR: Duration = Duration::from_secs(60);
/// A 2xx refreshes the store's mark at most this often per tenant and process.
const REFRESH_EVERY: Duration = Duration::from_secs(30);
/// How long a tenant's requests go without the recall tool after the provider refused it.
pub const RECALL_REFUSAL_FOR: Duration = Duration::from_secs(3600);

pub struct Tenants {
    store: Store,
    budget: Budget,
    /// Tenants known accepted, and since when (std mutex: plain map operations, never
    /// held across an `.await`).
    accepted: Mutex<HashMap<Fingerprint, Instant>>,
    /// Summary budgets: what is left of each (tokens, calls) and when they were last
    /// refilled.
    buckets: Mutex<HashMap<Fingerprint, Left>>,
    /// Tenants whose requests the provider refused for the recall tool, and since when.
    recall_refused: Mutex<HashMap<Fingerprint, Instant>>,
}

/// A tenant's summary budget per minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Tokens per minute (at least 1).
    pub tokens: u64,
    /// Calls per minute; 0: not counted.
    pub calls: u32,
}

/// What is left of a tenant's budget (negative: overdrawn), as of `at`.
#[derive(Debug, Clone, Copy)]
struct Left {
    tokens: f64,
    calls: f64,
    at: Instant,
}

/// Whether a summary is its conversation's first (the floor applies) or an update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    First,
    Update,
}

/// Why a summary is not asked for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The provider has not accepted this credential yet.
    NotAccepted,
    /// The tenant's summary budget is spent for now.
    RateLimited,
}

impl Refusal {
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::NotAccepted => {
                "summaries start once the provider has accepted this request's credential"
            }
            Refusal::RateLimited => {
                "this credential's summary budget (summary.max_tokens_per_tenant_per_minute, max_per_tenant_per_minute) is spent"
            }
        }
    }
}

impl Tenants {
    pub fn new(store: Store, budget: Budget) -> Self {
        Self {
            store,
            budget: Budget {
                tokens: budget.tokens.max(1),
                ..budget
            },
            accepted: Mutex::new(HashMap::new()),
            buckets: Mutex::new(HashMap::new()),
            recall_refused: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `tenant`'s requests go without the recall tool (the provider refused it
    /// lately, see the module docs).
    pub fn refuses_recall(&self, tenant: Fingerprint) -> bool {
        let mut refused = lock(&self.recall_refused);
        match refused.get(&tenant) {
            Some(since) if since.elapsed() < RECALL_REFUSAL_FOR => true,
            Some(_) => {
                refused.remove(&tenant);
                false
            }
            None => false,
        }
    }

    /// The provider refused `tenant`'s request for the recall tool and took it without.
    pub fn recall_refused(&self, tenant: Fingerprint) {
        bounded_insert(
            &mut lock(&self.recall_refused),
            tenant,
            Instant::now(),
            |since| *since,
        );
    }

    /// The provider answered a request of `tenant` with a 2xx.
    pub fn accepted(&self, tenant: Fingerprint) {
        let now = Instant::now();
        {
            let mut accepted = lock(&self.accepted);
            if accepted
                .get(&tenant)
                .is_some_and(|since| now.duration_since(*since) < REFRESH_EVERY)
            {
                return;
            }
            bounded_insert(&mut accepted, tenant, now, |since| *since);
        }
        self.in_background(async move |store: Store| {
            // Failures are counted and logged by the store; the next 2xx tries again.
            let _ = store.accept_tenant(&tenant, ACCEPTED_TTL).await;
        });
    }

    /// The provider refused `tenant`'s credential (401 or 403): no more summaries for it
    /// until a 2xx, on any replica.
    pub fn refused(&self, tenant: Fingerprint) {
        let known = lock(&self.accepted).remove(&tenant).is_some();
        if known {
            tracing::info!("the provider refused a credential it had accepted: its summaries stop");
        }
        self.in_background(async move |store: Store| {
            let _ = store.reject_tenant(&tenant).await;
        });
    }

    /// Runs a store write without making the request wait for it.
    fn in_background<F>(&self, write: impl FnOnce(Store) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(write(self.store.clone()));
        }
    }

    /// Whether `tenant` may have a summary now: accepted by the provider and within its
    /// budget (see the module docs for the floor of a `Kind::First`). Charges `cost`
    /// tokens (and one call) when it may.
    pub async fn may_summarise(
        &self,
        tenant: Fingerprint,
        kind: Kind,
        cost: u64,
    ) -> Result<(), Refusal> {
        let now = Instant::now();
        let trusted = lock(&self.accepted)
            .get(&tenant)
            .is_some_and(|since| now.duration_since(*since) < TRUSTED_FOR);
        if !trusted {
            match self.store.tenant_accepted(&tenant).await {
                Ok(true) => bounded_insert(&mut lock(&self.accepted), tenant, now, |s| *s),
                // Not accepted, or the store cannot say: no spending on its word.
                _ => {
                    lock(&self.accepted).remove(&tenant);
                    return Err(Refusal::NotAccepted);
                }
            }
        }
        self.spend(tenant, kind, cost)
    }

    /// Whether the budget would refuse a summary of `kind` now (nothing is charged): an
    /// accepted tenant's refusal that waiting would lift.
    pub fn spent(&self, tenant: Fingerprint, kind: Kind) -> bool {
        let left = self.refilled(&lock(&self.buckets), tenant, Instant::now());
        !self.allows(&left, kind)
    }

    /// How long until the budget allows an update again (zero: now).
    pub fn wait(&self, tenant: Fingerprint) -> Duration {
        let left = self.refilled(&lock(&self.buckets), tenant, Instant::now());
        let per_second = |per_minute: f64| per_minute / 60.0;
        let mut wait: f64 = 0.0;
        if left.tokens <= 0.0 {
            wait = wait.max(-left.tokens / per_second(self.budget.tokens as f64) + 0.05);
        }
        if self.budget.calls > 0 && left.calls < 1.0 {
            wait = wait.max((1.0 - left.calls) / per_second(f64::from(self.budget.calls)));
        }
        Duration::from_secs_f64(wait.min(120.0))
    }

    fn spend(&self, tenant: Fingerprint, kind: Kind, cost: u64) -> Result<(), Refusal> {
        let now = Instant::now();
        let mut buckets = lock(&self.buckets);
        let mut left = self.refilled(&buckets, tenant, now);
        let allowed = self.allows(&left, kind);
        if allowed {
            left.tokens -= cost as f64;
            left.calls -= 1.0;
        }
        bounded_insert(&mut buckets, tenant, left, |l| l.at);
        if allowed {
            Ok(())
        } else {
            Err(Refusal::RateLimited)
        }
    }

    /// `tenant`'s budget as of `now`: refilled at its rate, up to a minute's worth.
    fn refilled(
        &self,
        buckets: &HashMap<Fingerprint, Left>,
        tenant: Fingerprint,
        now: Instant,
    ) -> Left {
        let (tokens, calls) = (self.budget.tokens as f64, f64::from(self.budget.calls));
        let Some(left) = buckets.get(&tenant) else {
            return Left {
                tokens,
                calls,
                at: now,
            };
        };
        let minutes = now.duration_since(left.at).as_secs_f64() / 60.0;
        Left {
            tokens: (left.tokens + minutes * tokens).min(tokens),
            calls: (left.calls + minutes * calls).min(calls),
            at: now,
        }
    }

    /// An update starts while nothing is overdrawn; a conversation's first summary
    /// while less than a second minute's budget is.
    fn allows(&self, left: &Left, kind: Kind) -> bool {
        let (tokens, calls) = (self.budget.tokens as f64, f64::from(self.budget.calls));
        let counted = self.budget.calls > 0;
        match kind {
            Kind::Update => left.tokens > 0.0 && (!counted || left.calls >= 1.0),
            Kind::First => left.tokens > -tokens && (!counted || left.calls >= 1.0 - calls),
        }
    }
}

/// Inserts, first dropping the oldest tenth of the map when it is full.
fn bounded_insert<V>(
    map: &mut HashMap<Fingerprint, V>,
    key: Fingerprint,
    value: V,
    age: impl Fn(&V) -> Instant,
) {
    if map.len() >= MAX_TENANTS && !map.contains_key(&key) {
        let mut by_age: Vec<(Instant, Fingerprint)> =
            map.iter().map(|(k, v)| (age(v), *k)).collect();
        by_age.sort_unstable();
        for (_, old) in by_age.iter().take(MAX_TENANTS / 10) {
            map.remove(old);
        }
    }
    map.insert(key, value);
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StoreConfig;

    fn tenant(n: u8) -> Fingerprint {
        Fingerprint::from_hex(&format!("{n:02x}").repeat(32)).unwrap()
    }

    const CALLS: Budget = Budget {
        tokens: 1_000_000,
        calls: 3,
    };

    #[tokio::test]
    async fn summaries_wait_for_a_2xx_and_keep_to_the_rate() {
        let store = Store::from_config(&StoreConfig::default()).unwrap();
        let tenants = Tenants::new(store.clone(), CALLS);
        let update = |t| tenants.may_summarise(t, Kind::Update, 100);
        assert_eq!(update(tenant(1)).await, Err(Refusal::NotAccepted));
        tenants.accepted(tenant(1));
        for _ in 0..3 {
            assert_eq!(update(tenant(1)).await, Ok(()));
        }
        assert_eq!(update(tenant(1)).await, Err(Refusal::RateLimited));
        assert!(tenants.spent(tenant(1), Kind::Update));
        // A call refills in a third of a minute.
        let wait = tenants.wait(tenant(1));
        assert!(
            wait > Duration::from_secs(15) && wait <= Duration::from_secs(20),
            "{wait:?}"
        );
        // Another tenant is neither accepted nor limited by the first.
        assert_eq!(update(tenant(2)).await, Err(Refusal::NotAccepted));
        // The store remembers it for other replicas (and a restarted process).
        tokio::task::yield_now().await;
        let other_replica = Tenants::new(store, CALLS);
        let mut known = false;
        for _ in 0..50 {
            if other_replica
                .may_summarise(tenant(1), Kind::Update, 100)
                .await
                .is_ok()
            {
                known = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(known);
    }

    /// Four conversations on one key: once the updates have spent the minute's tokens,
    /// each conversation's first summary still starts — up to a second minute's
    /// overdraft, and not beyond.
    #[tokio::test]
    async fn a_first_summary_is_not_refused_for_other_conversations_spending() {
        let store = Store::from_config(&StoreConfig::default()).unwrap();
        let tenants = Tenants::new(
            store,
            Budget {
                tokens: 10_000,
                calls: 0,
            },
        );
        tenants.accepted(tenant(1));
        let ask = |kind, cost| tenants.may_summarise(tenant(1), kind, cost);
        assert_eq!(ask(Kind::Update, 6_000).await, Ok(()));
        // Not overdrawn: one more may start, and overdraw.
        assert_eq!(ask(Kind::Update, 6_000).await, Ok(()));
        assert_eq!(ask(Kind::Update, 100).await, Err(Refusal::RateLimited));
        assert!(tenants.spent(tenant(1), Kind::Update));
        assert!(!tenants.spent(tenant(1), Kind::First));
        for _ in 0..3 {
            assert_eq!(ask(Kind::First, 2_000).await, Ok(()));
        }
        // −8,000 now: the last first summary that may start overdraws past −10,000 …
        assert_eq!(ask(Kind::First, 2_500).await, Ok(()));
        // … and after it, none.
        assert_eq!(ask(Kind::First, 100).await, Err(Refusal::RateLimited));
        // The wait is what refills the overdraft at 10,000 a minute: about a minute.
        let wait = tenants.wait(tenant(1));
        assert!(
            wait > Duration::from_secs(60) && wait < Duration::from_secs(64),
            "{wait:?}"
        );
        // Nothing is charged for a refusal (this one would add half a minute's wait).
        assert_eq!(ask(Kind::Update, 5_000).await, Err(Refusal::RateLimited));
        assert!(tenants.wait(tenant(1)) <= wait);
    }

    #[test]
    fn a_refused_recall_tool_is_one_tenants_and_is_tried_again_later() {
        let store = Store::from_config(&StoreConfig::default()).unwrap();
        let tenants = Tenants::new(store, CALLS);
        tenants.recall_refused(tenant(1));
        assert!(tenants.refuses_recall(tenant(1)));
        assert!(!tenants.refuses_recall(tenant(2)), "another tenant's own");
        // Once the refusal is older than RECALL_REFUSAL_FOR, the tool is tried again.
        if let Some(long_ago) = Instant::now().checked_sub(RECALL_REFUSAL_FOR) {
            lock(&tenants.recall_refused).insert(tenant(1), long_ago);
            assert!(!tenants.refuses_recall(tenant(1)));
            assert!(lock(&tenants.recall_refused).is_empty(), "forgotten");
        }
    }
}
