//! The in-process store: the default, nothing to install. State lives as long as the
//! process. Same behaviour as Redis: TTL refreshed on use, bounded checkpoints per
//! conversation (shallowest dropped), first writer wins per depth and history, a lock
//! with expiry and compare-and-delete release; plus bounds on conversations and on the
//! bytes their checkpoints take (least recently used dropped first), since there is no
//! Redis `maxmemory` to do it: a checkpoint can be megabytes when a client names a
//! model with a window of millions of tokens.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{
    Checkpoint, Loaded, Lock, MAX_USAGE, Recent, Saved, State, Usage, checkpoint_field, lock,
    now_ms,
};
use crate::accounting::{Account, Entry, Point, Tally};
use crate::config::StoreConfig;
use crate::identity::Fingerprint;
use crate::secret::Secret;

#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
    ttl: Duration,
    max_checkpoints: usize,
    max_conversations: usize,
    max_bytes: usize,
}

#[derive(Default)]
struct Inner {
    conversations: HashMap<Fingerprint, Conversation>,
    /// Tenants the provider accepted, until when.
    tenants: HashMap<Fingerprint, Instant>,
    secret: Option<Secret>,
    /// Learned context windows, by field (see `crate::windows`).
    windows: HashMap<String, String>,
    /// Writes since the last sweep of expired conversations.
    writes: usize,
    /// Bytes the conversations' checkpoints take, in all.
    bytes: usize,
}

struct Conversation {
    /// By field name (`<depth>:<prefix>`), so iteration is by depth.
    checkpoints: BTreeMap<String, Checkpoint>,
    /// Newest last.
    usage: Vec<Usage>,
    state: Option<State>,
    lock: Option<(String, Instant)>,
    expires: Instant,
    /// What its requests saved and cost, and its latest requests.
    account: Account,
    /// Bytes its checkpoints and its latest requests take.
    bytes: usize,
}

/// What a request's point on the plot takes in memory.
const POINT_BYTES: usize = std::mem::size_of::<Point>();

/// What a checkpoint takes in memory, near enough: its text and a fixed overhead.
fn size_of(c: &Checkpoint) -> usize {
    256 + c.replacement_bytes()
        + c.summary.as_ref().map_or(0, String::len)
        + c.fallback.as_ref().map_or(0, String::len)
}

impl MemoryStore {
    pub fn new(config: &StoreConfig) -> Self {
        Self {
            inner: Arc::default(),
            ttl: config.ttl(),
            max_checkpoints: config.max_checkpoints,
            max_conversations: config.memory_max_conversations.max(1),
            max_bytes: config.memory_max_bytes.max(1),
        }
    }

    // Every method below takes the (std) mutex for a few map operations and never
    // awaits while holding it.

    pub fn load(&self, id: &Fingerprint) -> Loaded {
        let mut inner = lock(&self.inner);
        let now = Instant::now();
        match live(&mut inner, id, now) {
            Some(c) => {
                c.expires = now + self.ttl;
                Loaded {
                    checkpoints: c.checkpoints.values().rev().cloned().collect(),
                    usage: c.usage.iter().rev().copied().collect(),
                    state: c.state.clone(),
                }
            }
            None => Loaded::default(),
        }
    }

    pub fn save_checkpoint(
        &self,
        id: &Fingerprint,
        checkpoint: &Checkpoint,
        drop: &[String],
    ) -> Saved {
        let mut inner = lock(&self.inner);
        let c = self.entry(&mut inner, id);
        let field = checkpoint_field(checkpoint);
        if c.checkpoints.contains_key(&field) {
            return Saved::AlreadyPresent;
        }
        let added = size_of(checkpoint);
        c.checkpoints.insert(field, checkpoint.clone());
        let mut removed = 0;
        for name in drop {
            if let Some(old) = c.checkpoints.remove(name) {
                removed += size_of(&old);
            }
        }
        // A safety net whatever the caller asked: never more than four histories' worth.
        while c.checkpoints.len() > self.max_checkpoints * 4 {
            if let Some((_, old)) = c.checkpoints.pop_first() {
                removed += size_of(&old);
            }
        }
        c.bytes = c.bytes + added - removed;
        c.state.get_or_insert_with(State::default).compactions += 1;
        inner.bytes = inner.bytes + added - removed;
        self.shed_bytes(&mut inner, id);
        Saved::Stored
    }

    pub fn record_usage(
        &self,
        id: &Fingerprint,
        (usage, entry): (Usage, &Entry),
        replaces: Option<Fingerprint>,
    ) {
        let mut inner = lock(&self.inner);
        let c = self.entry(&mut inner, id);
        let grew = c.account.add(entry);
        if grew {
            c.bytes += POINT_BYTES;
        }
        c.usage
            .retain(|u| u.prefix != usage.prefix && Some(u.prefix) != replaces);
        c.usage.push(usage);
        if c.usage.len() > MAX_USAGE {
            let oldest = c
                .usage
                .iter()
                .enumerate()
                .min_by_key(|(_, u)| u.at_ms)
                .map_or(0, |(i, _)| i);
            c.usage.remove(oldest);
        }
        c.state.get_or_insert_with(State::default).last_seen_ms = now_ms();
        if grew {
            inner.bytes += POINT_BYTES;
            self.shed_bytes(&mut inner, id);
        }
    }

    /// Adds a summary call's or recall's counts to the conversation's account.
    pub fn add_tally(&self, id: &Fingerprint, tally: &Tally) {
        let mut inner = lock(&self.inner);
        self.entry(&mut inner, id).account.tally.add(tally);
    }

    /// The conversation's account (`None`: no such live conversation).
    pub fn account_of(&self, id: &Fingerprint) -> Option<Account> {
        let mut inner = lock(&self.inner);
        live(&mut inner, id, Instant::now()).map(|c| c.account.clone())
    }

    pub fn try_lock(&self, id: &Fingerprint, lock_: &Lock, ttl: Duration) -> bool {
        let mut inner = lock(&self.inner);
        let now = Instant::now();
        let c = self.entry(&mut inner, id);
        match &c.lock {
            Some((_, until)) if *until > now => false,
            _ => {
                c.lock = Some((lock_.token.clone(), now + ttl));
                true
            }
        }
    }

    pub fn refresh_lock(&self, id: &Fingerprint, lock_: &Lock, ttl: Duration) -> bool {
        let mut inner = lock(&self.inner);
        let now = Instant::now();
        let Some(c) = live(&mut inner, id, now) else {
            return false;
        };
        match &mut c.lock {
            Some((token, until)) if *token == lock_.token && *until > now => {
                *until = now + ttl;
                true
            }
            _ => false,
        }
    }

    pub fn lock_held(&self, id: &Fingerprint) -> bool {
        let mut inner = lock(&self.inner);
        let now = Instant::now();
        live(&mut inner, id, now)
            .is_some_and(|c| c.lock.as_ref().is_some_and(|(_, until)| *until > now))
    }

    pub fn unlock(&self, id: &Fingerprint, lock_: &Lock) -> bool {
        let mut inner = lock(&self.inner);
        let now = Instant::now();
        let Some(c) = live(&mut inner, id, now) else {
            return false;
        };
        match &c.lock {
            Some((token, until)) if *token == lock_.token && *until > now => {
                c.lock = None;
                true
            }
            _ => false,
        }
    }

    pub fn delete(&self, id: &Fingerprint) -> bool {
        let mut inner = lock(&self.inner);
        let now = Instant::now();
        let existed = live(&mut inner, id, now).is_some();
        if let Some(c) = inner.conversations.remove(id) {
            inner.bytes -= c.bytes;
        }
        existed
    }

    pub fn schedule(&self, id: &Fingerprint, focus: Option<&str>) -> bool {
        let mut inner = lock(&self.inner);
        let now = Instant::now();
        let Some(c) = live(&mut inner, id, now) else {
            return false;
        };
        c.state.get_or_insert_with(State::default).scheduled = focus.map(str::to_owned);
        true
    }

    pub fn active_since(&self, since_ms: u64) -> u64 {
        let inner = lock(&self.inner);
        let now = Instant::now();
        inner
            .conversations
            .values()
            .filter(|c| {
                c.expires > now && c.state.as_ref().is_some_and(|s| s.last_seen_ms >= since_ms)
            })
            .count() as u64
    }

    pub fn recent(&self, offset: usize, limit: usize) -> Vec<Recent> {
        let inner = lock(&self.inner);
        let now = Instant::now();
        let mut all: Vec<Recent> = inner
            .conversations
            .iter()
            .filter(|(_, c)| c.expires > now)
            .map(|(id, c)| Recent {
                conversation: *id,
                last_seen_ms: c.state.as_ref().map_or(0, |s| s.last_seen_ms),
            })
            .collect();
        all.sort_by(|a, b| {
            b.last_seen_ms
                .cmp(&a.last_seen_ms)
                .then(a.conversation.cmp(&b.conversation))
        });
        all.into_iter().skip(offset).take(limit).collect()
    }

    pub fn accept_tenant(&self, tenant: &Fingerprint, ttl: Duration) {
        let mut inner = lock(&self.inner);
        let now = Instant::now();
        if inner.tenants.len() >= self.max_conversations {
            inner.tenants.retain(|_, until| *until > now);
            if inner.tenants.len() >= self.max_conversations {
                inner.tenants.clear();
            }
        }
        inner.tenants.insert(*tenant, now + ttl.min(self.ttl));
    }

    pub fn reject_tenant(&self, tenant: &Fingerprint) {
        lock(&self.inner).tenants.remove(tenant);
    }

    pub fn tenant_accepted(&self, tenant: &Fingerprint) -> bool {
        lock(&self.inner)
            .tenants
            .get(tenant)
            .is_some_and(|until| *until > Instant::now())
    }

    /// Writes `set` and removes `forget` among the learned windows (bounded by their
    /// owner, `crate::windows`).
    pub fn write_windows(&self, set: Option<(&str, &str)>, forget: &[String]) {
        let mut inner = lock(&self.inner);
        for field in forget {
            inner.windows.remove(field);
        }
        if let Some((field, value)) = set {
            inner.windows.insert(field.to_owned(), value.to_owned());
        }
    }

    pub fn windows(&self) -> Vec<(String, String)> {
        lock(&self.inner)
            .windows
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    pub fn identity_secret(&self, candidate: &Secret) -> Secret {
        lock(&self.inner)
            .secret
            .get_or_insert_with(|| candidate.clone())
            .clone()
    }

    /// The live conversation, created if needed, TTL refreshed; sweeps expired and
    /// evicts least recently used conversations now and then.
    fn entry<'a>(&self, inner: &'a mut Inner, id: &Fingerprint) -> &'a mut Conversation {
        let now = Instant::now();
        inner.writes += 1;
        if inner.writes >= 1024 || inner.conversations.len() >= self.max_conversations {
            inner.writes = 0;
            let mut freed = 0;
            inner.conversations.retain(|_, c| {
                let keep = c.expires > now;
                if !keep {
                    freed += c.bytes;
                }
                keep
            });
            inner.bytes -= freed;
            if inner.conversations.len() >= self.max_conversations {
                // Drop the least recently used tenth (at least one), not one per insert.
                let mut by_age: Vec<(Instant, Fingerprint)> = inner
                    .conversations
                    .iter()
                    .map(|(k, c)| (c.expires, *k))
                    .collect();
                by_age.sort_unstable();
                let excess = inner.conversations.len() + 1 - self.max_conversations;
                let drop = excess.max(self.max_conversations / 10).min(by_age.len());
                for (_, key) in &by_age[..drop] {
                    if let Some(c) = inner.conversations.remove(key) {
                        inner.bytes -= c.bytes;
                    }
                }
            }
        }
        // One lookup: an absent or expired conversation starts afresh.
        let fresh = || Conversation {
            checkpoints: BTreeMap::new(),
            usage: Vec::new(),
            state: None,
            lock: None,
            expires: now,
            account: Account::default(),
            bytes: 0,
        };
        let c = inner.conversations.entry(*id).or_insert_with(fresh);
        let mut freed = 0;
        if c.expires <= now {
            freed = c.bytes;
            *c = fresh();
        }
        c.expires = now + self.ttl;
        inner.bytes -= freed;
        // Borrowck: look the entry up again after the total is updated.
        inner
            .conversations
            .get_mut(id)
            .unwrap_or_else(|| unreachable!("inserted above"))
    }

    /// Over `memory_max_bytes`: drops the least recently used conversations (never
    /// `keep`, the one just written) until under it.
    fn shed_bytes(&self, inner: &mut Inner, keep: &Fingerprint) {
        if inner.bytes <= self.max_bytes {
            return;
        }
        let mut by_age: Vec<(Instant, Fingerprint)> = inner
            .conversations
            .iter()
            .filter(|(k, _)| *k != keep)
            .map(|(k, c)| (c.expires, *k))
            .collect();
        by_age.sort_unstable();
        for (_, key) in by_age {
            if inner.bytes <= self.max_bytes {
                break;
            }
            if let Some(c) = inner.conversations.remove(&key) {
                inner.bytes -= c.bytes;
            }
        }
    }

    /// Bytes the checkpoints take, in all (for tests and the admin API).
    pub fn bytes(&self) -> usize {
        lock(&self.inner).bytes
    }
}

/// The conversation if present and not expired (an expired one is removed).
fn live<'a>(inner: &'a mut Inner, id: &Fingerprint, now: Instant) -> Option<&'a mut Conversation> {
    if inner
        .conversations
        .get(id)
        .is_some_and(|c| c.expires <= now)
        && let Some(c) = inner.conversations.remove(id)
    {
        inner.bytes -= c.bytes;
    }
    inner.conversations.get_mut(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;

    fn id(n: u8) -> Fingerprint {
        Fingerprint::from_hex(&format!("{n:02x}").repeat(32)).unwrap_or_else(|| unreachable!())
    }

    fn checkpoint(through: u32, bytes: usize) -> Checkpoint {
        let text = serde_json::to_string(&"x".repeat(bytes)).unwrap_or_default();
        Checkpoint::sample(
            (1, through),
            id(200),
            vec![RawValue::from_string(text).unwrap_or_else(|_| unreachable!())],
        )
    }

    #[test]
    fn checkpoints_are_bounded_in_bytes_oldest_conversation_first() {
        let store = MemoryStore::new(&StoreConfig {
            memory_max_bytes: 3 * 1024 * 1024,
            ..StoreConfig::default()
        });
        for n in 0..5 {
            store.save_checkpoint(&id(n), &checkpoint(3, 1024 * 1024), &[]);
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(store.bytes() <= 3 * 1024 * 1024, "{}", store.bytes());
        // The newest stay, the oldest went.
        assert!(!store.load(&id(4)).checkpoints.is_empty());
        assert!(store.load(&id(0)).checkpoints.is_empty());
        // What is deleted or replaced is given back.
        store.delete(&id(4));
        store.delete(&id(3));
        store.delete(&id(2));
        assert_eq!(store.bytes(), 0);
    }
}
