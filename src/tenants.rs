//! What abridge knows about a tenant (a credential, by its keyed hash — never the
//! credential itself): whether the provider has accepted it, and how many summaries it
//! asked for lately.
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
//! - **Rate.** At most `summary.max_per_tenant_per_minute` summaries per tenant and
//!   process (a token bucket); beyond it, `recency` (and a note) until the bucket
//!   refills.

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

pub struct Tenants {
    store: Store,
    per_minute: u32,
    /// Tenants known accepted, and since when (std mutex: plain map operations, never
    /// held across an `.await`).
    accepted: Mutex<HashMap<Fingerprint, Instant>>,
    /// Summary budgets: tokens left and when they were last refilled.
    buckets: Mutex<HashMap<Fingerprint, (f64, Instant)>>,
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
                "this credential's summary rate (summary.max_per_tenant_per_minute) is spent"
            }
        }
    }
}

impl Tenants {
    pub fn new(store: Store, per_minute: u32) -> Self {
        Self {
            store,
            per_minute,
            accepted: Mutex::new(HashMap::new()),
            buckets: Mutex::new(HashMap::new()),
        }
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
    /// rate. Takes one summary from its budget when it may.
    pub async fn may_summarise(&self, tenant: Fingerprint) -> Result<(), Refusal> {
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
        self.take_token(tenant)
    }

    fn take_token(&self, tenant: Fingerprint) -> Result<(), Refusal> {
        let capacity = f64::from(self.per_minute.max(1));
        let now = Instant::now();
        let mut buckets = lock(&self.buckets);
        let (tokens, at) = buckets.get(&tenant).copied().unwrap_or((capacity, now));
        let refilled =
            (tokens + now.duration_since(at).as_secs_f64() * capacity / 60.0).min(capacity);
        if refilled < 1.0 {
            buckets.insert(tenant, (refilled, now));
            return Err(Refusal::RateLimited);
        }
        bounded_insert(&mut buckets, tenant, (refilled - 1.0, now), |(_, at)| *at);
        Ok(())
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

    #[tokio::test]
    async fn summaries_wait_for_a_2xx_and_keep_to_the_rate() {
        let store = Store::from_config(&StoreConfig::default()).unwrap();
        let tenants = Tenants::new(store.clone(), 3);
        assert_eq!(
            tenants.may_summarise(tenant(1)).await,
            Err(Refusal::NotAccepted)
        );
        tenants.accepted(tenant(1));
        for _ in 0..3 {
            assert_eq!(tenants.may_summarise(tenant(1)).await, Ok(()));
        }
        assert_eq!(
            tenants.may_summarise(tenant(1)).await,
            Err(Refusal::RateLimited)
        );
        // Another tenant is neither accepted nor limited by the first.
        assert_eq!(
            tenants.may_summarise(tenant(2)).await,
            Err(Refusal::NotAccepted)
        );
        // The store remembers it for other replicas (and a restarted process).
        tokio::task::yield_now().await;
        let other_replica = Tenants::new(store, 3);
        let mut known = false;
        for _ in 0..50 {
            if other_replica.may_summarise(tenant(1)).await.is_ok() {
                known = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(known);
    }
}
