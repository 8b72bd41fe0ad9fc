//! The Redis backend: a single server (through `redis`'s `ConnectionManager`, which
//! reconnects by itself), a Redis Cluster (`cluster-async`, which follows MOVED/ASK and
//! topology changes) or a master found through Sentinel (asked again after its
//! connection fails, so a failover is followed), over plain TCP or TLS (`rediss://`,
//! see `tls`). Connected lazily, so abridge starts while Redis is down.
//!
//! Every request-path operation is one round trip: a pipeline or a Lua script over the
//! keys of one conversation, which share a hash tag and so one Cluster slot. The
//! `recent` index is a separate key (another slot), written beside the conversation's
//! keys off the hot path.

mod keys;
mod scripts;
mod sentinel;
mod tls;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::{ErrorKind, RedisError, Script};
use tokio::sync::OnceCell;

use self::keys::{Hex, Key};
use self::scripts::{ADD_TALLY, RECORD_USAGE, REFRESH, SAVE_CHECKPOINT, SCHEDULE, UNLOCK};
use self::sentinel::{Conn, Sentinel};
use self::tls::Transport;
use super::{
    Checkpoint, Loaded, Lock, MAX_USAGE, Recent, Saved, State, StoreError, Usage, checkpoint_field,
    now_ms,
};
use crate::accounting::{Account, Entry, MAX_POINTS, Point, Tally};
use crate::config::StoreConfig;
use crate::identity::Fingerprint;
use crate::secret::Secret;

#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    target: Target,
    /// The connection of a single server or a cluster (they reconnect by themselves).
    conn: OnceCell<Conn>,
    prefix: String,
    ttl_ms: u64,
    max_checkpoints: usize,
    save: Script,
    record: Script,
    unlock: Script,
    refresh: Script,
    schedule: Script,
    add_tally: Script,
}

enum Target {
    Single(redis::Client, ConnectionManagerConfig),
    Cluster(ClusterClient),
    Sentinel(Arc<Sentinel>),
}

impl RedisStore {
    pub fn new(config: &StoreConfig) -> Result<Self, StoreError> {
        let sentinel = &config.sentinel;
        let transport = Transport::new(config);
        let target = match &config.redis_url {
            None if !sentinel.nodes.is_empty() => {
                Target::Sentinel(Arc::new(Sentinel::new(config, &transport)?))
            }
            Some(url) => {
                let client = transport
                    .client(url.expose())
                    .map_err(|e| StoreError::Backend(format!("store.redis_url: {e}")))?;
                let manager = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(config.connect_timeout()))
                    .set_response_timeout(Some(config.response_timeout()))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_secs(2));
                Target::Single(client, manager)
            }
            None => {
                let nodes: Vec<&str> = config.redis_cluster.iter().map(Secret::expose).collect();
                let builder = ClusterClient::builder(nodes)
                    .connection_timeout(config.connect_timeout())
                    .response_timeout(config.response_timeout())
                    .retries(2);
                let client = transport
                    .cluster(builder)
                    .build()
                    .map_err(|e| StoreError::Backend(format!("store.redis_cluster: {e}")))?;
                Target::Cluster(client)
            }
        };
        Ok(Self {
            inner: Arc::new(Inner {
                target,
                conn: OnceCell::new(),
                prefix: config.key_prefix.clone(),
                ttl_ms: config.ttl().as_millis() as u64,
                max_checkpoints: config.max_checkpoints,
                save: Script::new(SAVE_CHECKPOINT),
                record: Script::new(RECORD_USAGE),
                unlock: Script::new(UNLOCK),
                refresh: Script::new(REFRESH),
                schedule: Script::new(SCHEDULE),
                add_tally: Script::new(ADD_TALLY),
            }),
        })
    }

    pub fn kind(&self) -> &'static str {
        match self.inner.target {
            Target::Single(..) => "redis",
            Target::Cluster(_) => "redis-cluster",
            Target::Sentinel(_) => "redis-sentinel",
        }
    }

    /// The shared connection, made on first use (and again after a failed attempt).
    async fn conn(&self) -> Result<Conn, StoreError> {
        if let Target::Sentinel(sentinel) = &self.inner.target {
            return sentinel.conn().await.map(Conn::Sentinel);
        }
        let conn = self
            .inner
            .conn
            .get_or_try_init(|| async {
                match &self.inner.target {
                    Target::Single(client, config) => {
                        ConnectionManager::new_with_config(client.clone(), config.clone())
                            .await
                            .map(Conn::Single)
                    }
                    Target::Cluster(client) => {
                        client.get_async_connection().await.map(Conn::Cluster)
                    }
                    Target::Sentinel(_) => Err(RedisError::from((
                        ErrorKind::Client,
                        "a sentinel connection is made by Sentinel::conn",
                    ))),
                }
            })
            .await?;
        Ok(conn.clone())
    }

    /// How long after its last recorded turn a conversation's TTLs are refreshed by a
    /// read: a seventh of the TTL (a day, by default), at least a second.
    fn refresh_after_ms(&self) -> u64 {
        (self.inner.ttl_ms / 7).max(1000)
    }

    /// `<prefix>:{<conversation>}:<part>`: the braces are the Cluster hash tag.
    fn key<'a>(&'a self, conversation: &'a Fingerprint, part: &'static str) -> Key<'a> {
        Key::new(&self.inner.prefix, conversation, part)
    }

    fn global(&self, name: &str) -> String {
        format!("{}:{name}", self.inner.prefix)
    }

    pub async fn load(&self, conversation: &Fingerprint) -> Result<Loaded, StoreError> {
        let (ckpt, state_key, usage_key) = (
            self.key(conversation, "ckpt"),
            self.key(conversation, "state"),
            self.key(conversation, "usage"),
        );
        // The TTLs are refreshed by the turn's usage record (RECORD_USAGE refreshes all
        // three keys), so the read does not PEXPIRE them (that was half the pipeline's
        // commands and replies); only a conversation no turn has recorded for a while —
        // a provider that reports no usage in streams, clients that stop streams early —
        // is refreshed here, by a second pipeline.
        let mut pipe = redis::pipe();
        pipe.hgetall(ckpt).hgetall(state_key).hgetall(usage_key);
        // Field/value pairs, not maps: a handful of fields, looked up once each, are
        // cheaper scanned than hashed.
        let mut conn = self.conn().await?;
        let (mut fields, state, usage): (Fields, Fields, Fields) =
            pipe.query_async(&mut conn).await?;
        let state = parse_state(&state)?;
        let recorded_ms = state.as_ref().map_or(0, |s| s.last_seen_ms);
        let exists = !(fields.is_empty() && state.is_none() && usage.is_empty());
        if exists && now_ms().saturating_sub(recorded_ms) >= self.refresh_after_ms() {
            let ttl = self.inner.ttl_ms as i64;
            let mut touch = redis::pipe();
            touch
                .pexpire(ckpt, ttl)
                .ignore()
                .pexpire(state_key, ttl)
                .ignore()
                .pexpire(usage_key, ttl)
                .ignore();
            touch.query_async::<()>(&mut conn).await?;
        }
        fields.sort_unstable_by(|a, b| b.0.cmp(&a.0));
        let checkpoints = fields
            .into_iter()
            .map(|(field, json)| {
                serde_json::from_str::<Checkpoint>(&json)
                    .map_err(|e| StoreError::Corrupt(format!("checkpoint {field}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut usage: Vec<Usage> = usage
            .iter()
            .map(|(field, value)| {
                Fingerprint::from_hex(field)
                    .and_then(|prefix| Usage::decode(prefix, value))
                    .ok_or_else(|| StoreError::Corrupt(format!("usage {field}: {value}")))
            })
            .collect::<Result<_, _>>()?;
        usage.sort_unstable_by_key(|u| std::cmp::Reverse(u.at_ms));
        Ok(Loaded {
            checkpoints,
            usage,
            state,
        })
    }

    pub async fn save_checkpoint(
        &self,
        conversation: &Fingerprint,
        checkpoint: &Checkpoint,
        drop: &[String],
    ) -> Result<Saved, StoreError> {
        let json = serde_json::to_string(checkpoint)
            .map_err(|e| StoreError::Backend(format!("encoding a checkpoint: {e}")))?;
        let mut invocation = self.inner.save.key(self.key(conversation, "ckpt"));
        invocation
            .key(self.key(conversation, "state"))
            .arg(checkpoint_field(checkpoint))
            .arg(json)
            .arg(self.inner.max_checkpoints * 4)
            .arg(self.inner.ttl_ms);
        for field in drop {
            invocation.arg(field);
        }
        let added: i64 = invocation.invoke_async(&mut self.conn().await?).await?;
        Ok(if added == 1 {
            Saved::Stored
        } else {
            Saved::AlreadyPresent
        })
    }

    pub async fn record_usage(
        &self,
        conversation: &Fingerprint,
        (usage, entry): (Usage, &Entry),
        replaces: Option<Fingerprint>,
        touch_index: bool,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        let ttl = self.inner.ttl_ms as i64;
        let mut own = self.inner.record.key(self.key(conversation, "usage"));
        own.key(self.key(conversation, "state"))
            .key(self.key(conversation, "ckpt"))
            .key(self.key(conversation, "account"))
            .key(self.key(conversation, "series"))
            .arg(Hex(Some(&usage.prefix)))
            .arg(usage.encode())
            .arg(Hex(replaces.as_ref()))
            .arg(MAX_USAGE)
            .arg(now)
            .arg(ttl)
            .arg(entry.format.unwrap_or_default())
            .arg(entry.point.map(|p| p.encode()).unwrap_or_default())
            .arg(MAX_POINTS)
            .arg(verdict(entry));
        for (field, amount) in entry.tally.fields() {
            if amount > 0 {
                own.arg(field).arg(amount);
            }
        }
        let mut a = self.conn().await?;
        if !touch_index {
            own.invoke_async::<i64>(&mut a).await?;
            return Ok(());
        }
        let recent = self.global("recent");
        let mut index = redis::pipe();
        index
            .zadd(&recent, conversation.to_hex(), now)
            .ignore()
            .zrembyscore(&recent, "-inf", now.saturating_sub(self.inner.ttl_ms))
            .ignore()
            .pexpire(&recent, ttl)
            .ignore();
        // The index is a global key (another node in a Cluster): a second pipeline, sent
        // alongside the conversation's own.
        let mut b = a.clone();
        let (_, ()): (i64, ()) = tokio::try_join!(
            own.invoke_async::<i64>(&mut a),
            index.query_async::<()>(&mut b)
        )?;
        Ok(())
    }

    /// Adds a summary call's or recall's counts to the conversation's account.
    pub async fn add_tally(
        &self,
        conversation: &Fingerprint,
        tally: &Tally,
    ) -> Result<(), StoreError> {
        let mut script = self.inner.add_tally.key(self.key(conversation, "account"));
        script.arg(self.inner.ttl_ms);
        for (field, amount) in tally.fields() {
            if amount > 0 {
                script.arg(field).arg(amount);
            }
        }
        let mut conn = self.conn().await?;
        let _: i64 = script.invoke_async(&mut conn).await?;
        Ok(())
    }

    /// The conversation's account: its counts, format and latest requests.
    pub async fn account(&self, conversation: &Fingerprint) -> Result<Account, StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("HGETALL")
            .arg(self.key(conversation, "account"))
            .cmd("LRANGE")
            .arg(self.key(conversation, "series"))
            .arg(0)
            .arg(-1);
        let (fields, series): (Fields, Vec<String>) =
            pipe.query_async(&mut self.conn().await?).await?;
        let mut account = Account::default();
        for (field, value) in fields {
            if field == "format" {
                account.format = Some(value);
            } else if field == "verdict" {
                // One this replica cannot read (a newer one's) is left out.
                account.verdict = serde_json::from_str(&value).ok();
            } else if let Ok(n) = value.parse() {
                account.tally.set(&field, n);
            }
        }
        account.series = series.iter().filter_map(|p| Point::decode(p)).collect();
        Ok(account)
    }

    /// Sets (`Some`) or clears the scheduled-compaction mark; `false` if the
    /// conversation has no state.
    pub async fn schedule(
        &self,
        conversation: &Fingerprint,
        focus: Option<&str>,
    ) -> Result<bool, StoreError> {
        let state = self.key(conversation, "state");
        let mut conn = self.conn().await?;
        match focus {
            Some(focus) => {
                let set: i64 = self
                    .inner
                    .schedule
                    .key(state)
                    .arg(focus)
                    .invoke_async(&mut conn)
                    .await?;
                Ok(set == 1)
            }
            None => {
                let _: i64 = redis::cmd("HDEL")
                    .arg(state)
                    .arg("scheduled")
                    .query_async(&mut conn)
                    .await?;
                Ok(true)
            }
        }
    }

    pub async fn active_since(&self, since_ms: u64) -> Result<u64, StoreError> {
        let n: u64 = redis::cmd("ZCOUNT")
            .arg(self.global("recent"))
            .arg(since_ms)
            .arg("+inf")
            .query_async(&mut self.conn().await?)
            .await?;
        Ok(n)
    }

    pub async fn try_lock(
        &self,
        conversation: &Fingerprint,
        lock: &Lock,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let set: Option<String> = redis::cmd("SET")
            .arg(self.key(conversation, "lock"))
            .arg(&lock.token)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64)
            .query_async(&mut self.conn().await?)
            .await?;
        Ok(set.is_some())
    }

    pub async fn refresh_lock(
        &self,
        conversation: &Fingerprint,
        lock: &Lock,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let extended: i64 = self
            .inner
            .refresh
            .key(self.key(conversation, "lock"))
            .arg(&lock.token)
            .arg(ttl.as_millis().max(1) as u64)
            .invoke_async(&mut self.conn().await?)
            .await?;
        Ok(extended == 1)
    }

    pub async fn lock_held(&self, conversation: &Fingerprint) -> Result<bool, StoreError> {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(self.key(conversation, "lock"))
            .query_async(&mut self.conn().await?)
            .await?;
        Ok(exists == 1)
    }

    pub async fn unlock(
        &self,
        conversation: &Fingerprint,
        lock: &Lock,
    ) -> Result<bool, StoreError> {
        let deleted: i64 = self
            .inner
            .unlock
            .key(self.key(conversation, "lock"))
            .arg(&lock.token)
            .invoke_async(&mut self.conn().await?)
            .await?;
        Ok(deleted == 1)
    }

    pub async fn delete(&self, conversation: &Fingerprint) -> Result<bool, StoreError> {
        let keys = [
            self.key(conversation, "ckpt"),
            self.key(conversation, "state"),
            self.key(conversation, "usage"),
            self.key(conversation, "lock"),
            self.key(conversation, "account"),
            self.key(conversation, "series"),
        ];
        let mut conn = self.conn().await?;
        let deleted: i64 = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await?;
        let _: i64 = redis::cmd("ZREM")
            .arg(self.global("recent"))
            .arg(conversation.to_hex())
            .query_async(&mut conn)
            .await?;
        Ok(deleted > 0)
    }

    pub async fn recent(&self, offset: usize, limit: usize) -> Result<Vec<Recent>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rows: Vec<(String, f64)> = redis::cmd("ZREVRANGE")
            .arg(self.global("recent"))
            .arg(offset)
            .arg(offset + limit - 1)
            .arg("WITHSCORES")
            .query_async(&mut self.conn().await?)
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(id, score)| {
                Fingerprint::from_hex(&id).map(|conversation| Recent {
                    conversation,
                    last_seen_ms: score as u64,
                })
            })
            .collect())
    }

    pub async fn accept_tenant(
        &self,
        tenant: &Fingerprint,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let _: () = redis::cmd("SET")
            .arg(self.key(tenant, "tenant"))
            .arg("1")
            .arg("PX")
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1))
            .query_async(&mut self.conn().await?)
            .await?;
        Ok(())
    }

    pub async fn reject_tenant(&self, tenant: &Fingerprint) -> Result<(), StoreError> {
        let _: () = redis::cmd("DEL")
            .arg(self.key(tenant, "tenant"))
            .query_async(&mut self.conn().await?)
            .await?;
        Ok(())
    }

    pub async fn tenant_accepted(&self, tenant: &Fingerprint) -> Result<bool, StoreError> {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(self.key(tenant, "tenant"))
            .query_async(&mut self.conn().await?)
            .await?;
        Ok(exists == 1)
    }

    /// Writes `set`, removes `forget` and sets the hash to expire `ttl` from now, in
    /// one round trip (the entries are bounded by their owner, `crate::windows`).
    pub async fn write_windows(
        &self,
        set: Option<(&str, &str)>,
        forget: &[String],
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let key = self.global("windows");
        let mut pipe = redis::pipe();
        if !forget.is_empty() {
            pipe.cmd("HDEL").arg(&key).arg(forget).ignore();
        }
        if let Some((field, value)) = set {
            pipe.cmd("HSET").arg(&key).arg(field).arg(value).ignore();
            pipe.cmd("PEXPIRE")
                .arg(&key)
                .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
                .ignore();
        }
        let () = pipe.query_async(&mut self.conn().await?).await?;
        Ok(())
    }

    pub async fn windows(&self) -> Result<Vec<(String, String)>, StoreError> {
        Ok(redis::cmd("HGETALL")
            .arg(self.global("windows"))
            .query_async(&mut self.conn().await?)
            .await?)
    }

    pub async fn identity_secret(&self, candidate: &Secret) -> Result<Secret, StoreError> {
        let key = self.global("secret");
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(&key)
            .arg(candidate.expose())
            .arg("NX")
            .ignore()
            .get(&key);
        let (secret,): (String,) = pipe.query_async(&mut self.conn().await?).await?;
        Ok(Secret::new(secret))
    }
}

/// A hash's fields and values, as `HGETALL` gives them.
type Fields = Vec<(String, String)>;

fn parse_state(fields: &[(String, String)]) -> Result<Option<State>, StoreError> {
    if fields.is_empty() {
        return Ok(None);
    }
    let get = |name: &str| fields.iter().find(|(f, _)| f == name).map(|(_, v)| v);
    let number = |name: &str| -> Result<u64, StoreError> {
        get(name).map_or(Ok(0), |v| {
            v.parse()
                .map_err(|_| StoreError::Corrupt(format!("state field {name}: {v}")))
        })
    };
    Ok(Some(State {
        scheduled: get("scheduled").cloned(),
        compactions: number("compactions")?,
        last_seen_ms: number("last_seen")?,
    }))
}

/// The request's verdict as the account keeps it (JSON; "": none to set).
fn verdict(entry: &Entry) -> String {
    entry
        .verdict
        .and_then(|v| serde_json::to_string(&v).ok())
        .unwrap_or_default()
}
