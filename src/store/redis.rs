//! The Redis backend: a single server (through `redis`'s `ConnectionManager`, which
//! reconnects by itself), a Redis Cluster (`cluster-async`, which follows MOVED/ASK and
//! topology changes) or a master found through Sentinel (asked again after its
//! connection fails, so a failover is followed). Connected lazily, so abridge starts
//! while Redis is down.
//!
//! Every request-path operation is one round trip: a pipeline or a Lua script over the
//! keys of one conversation, which share a hash tag and so one Cluster slot. The
//! `recent` index is a separate key (another slot), written beside the conversation's
//! keys off the hot path.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisConnectionInfo, RedisError, RedisFuture,
    Script, ServerErrorKind, Value,
};
use tokio::sync::OnceCell;

use super::{
    Checkpoint, Loaded, Lock, MAX_USAGE, Recent, Saved, State, StoreError, Usage, checkpoint_field,
    now_ms,
};
use crate::config::StoreConfig;
use crate::identity::Fingerprint;
use crate::secret::Secret;

/// Adds a checkpoint unless one for the same depth and history exists; then drops the
/// fields the caller named (its history's shallowest beyond the limit, the oldest of
/// others) and, as a safety net, the shallowest beyond four histories' worth; counts
/// compactions; refreshes TTLs. Atomic in Redis, so concurrent and late writers cannot
/// interleave. ARGV: field, json, safety cap, ttl, then the fields to drop.
const SAVE_CHECKPOINT: &str = r#"
local added = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
if added == 1 then
  redis.call('HINCRBY', KEYS[2], 'compactions', 1)
  for i = 5, #ARGV do
    redis.call('HDEL', KEYS[1], ARGV[i])
  end
  local max = tonumber(ARGV[3])
  local n = redis.call('HLEN', KEYS[1])
  if n > max then
    local fields = redis.call('HKEYS', KEYS[1])
    table.sort(fields)
    for i = 1, n - max do
      redis.call('HDEL', KEYS[1], fields[i])
    end
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return added
"#;

/// Records a history's usage: the record it supersedes goes, the new one is set, and
/// beyond the limit the least recently reported history goes (its value ends in its
/// time). Refreshes TTLs and `last_seen`. KEYS: usage, state, ckpt. ARGV: field, value,
/// superseded field (or ""), limit, now, ttl.
const RECORD_USAGE: &str = r#"
if ARGV[3] ~= '' and ARGV[3] ~= ARGV[1] then
  redis.call('HDEL', KEYS[1], ARGV[3])
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if redis.call('HLEN', KEYS[1]) > tonumber(ARGV[4]) then
  local all = redis.call('HGETALL', KEYS[1])
  local oldest, oldest_at = nil, nil
  for i = 1, #all, 2 do
    local at = tonumber(string.match(all[i + 1], '(%d+)$'))
    if at ~= nil and (oldest_at == nil or at < oldest_at) then
      oldest, oldest_at = all[i], at
    end
  end
  if oldest ~= nil then
    redis.call('HDEL', KEYS[1], oldest)
  end
end
redis.call('HSET', KEYS[2], 'last_seen', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
redis.call('PEXPIRE', KEYS[3], ARGV[6])
return 1
"#;

/// Deletes the lock only if it still holds our token.
const UNLOCK: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// Extends the lock only if it still holds our token.
const REFRESH: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

/// Schedules a compaction of an existing conversation, atomically: a state hash that
/// expired or was deleted meanwhile is not recreated (without a TTL).
const SCHEDULE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'scheduled', ARGV[1])
  return 1
end
return 0
"#;

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
}

enum Target {
    Single(redis::Client, ConnectionManagerConfig),
    Cluster(ClusterClient),
    Sentinel(Arc<Sentinel>),
}

/// Either connection, usable wherever `redis` takes a connection.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(MasterConn),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(c) => {
                let failed = c.failed.clone();
                let reply = c.conn.req_packed_command(cmd);
                Box::pin(async move {
                    let reply = reply.await;
                    if reply.as_ref().is_err_and(wrong_master) {
                        failed.store(true, Ordering::Relaxed);
                    }
                    reply
                })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Sentinel(c) => {
                let failed = c.failed.clone();
                let replies = c.conn.req_packed_commands(cmd, offset, count);
                Box::pin(async move {
                    let replies = replies.await;
                    let wrong = match &replies {
                        // A pipeline reports each command's error among the values.
                        Ok(values) => values.iter().any(demoted),
                        Err(e) => wrong_master(e),
                    };
                    if wrong {
                        failed.store(true, Ordering::Relaxed);
                    }
                    replies
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(c) => c.conn.get_db(),
        }
    }
}

/// An error after which the master must be asked of the sentinels again: the connection
/// broke (the master died or moved) or the server is no longer the master (READONLY).
fn wrong_master(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_unrecoverable_error()
        || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}

/// A reply of a server that is no longer the master.
fn demoted(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::ReadOnly))
}

/// Redis behind Sentinel: the master is asked of the sentinels on first use and again
/// once its connection has failed (see [`wrong_master`]).
struct Sentinel {
    /// Asks the sentinels (and checks the answer with `ROLE`); one caller at a time.
    client: tokio::sync::Mutex<SentinelClient>,
    config: AsyncConnectionConfig,
    /// The master's connection while it works. A std mutex: never held across an await.
    current: Mutex<Option<MasterConn>>,
}

/// A connection to the master and whether it failed in a way that means "ask again".
#[derive(Clone)]
struct MasterConn {
    conn: MultiplexedConnection,
    failed: Arc<AtomicBool>,
}

impl Sentinel {
    fn usable(&self) -> Option<MasterConn> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .filter(|c| !c.failed.load(Ordering::Relaxed))
            .cloned()
    }

    async fn conn(self: &Arc<Self>) -> Result<MasterConn, StoreError> {
        if let Some(conn) = self.usable() {
            return Ok(conn);
        }
        // Spawned: a caller that stops waiting (store.response_timeout_ms) must not
        // cancel the search halfway, or a slow sentinel would be asked forever.
        let me = self.clone();
        tokio::spawn(async move { me.find_master().await })
            .await
            .map_err(|e| StoreError::Backend(format!("asking the sentinels: {e}")))?
    }

    async fn find_master(&self) -> Result<MasterConn, StoreError> {
        let mut client = self.client.lock().await;
        // Someone else may have found it while this one waited for the lock.
        if let Some(conn) = self.usable() {
            return Ok(conn);
        }
        let conn = client
            .get_async_connection_with_config(&self.config)
            .await?;
        let conn = MasterConn {
            conn,
            failed: Arc::default(),
        };
        *self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(conn.clone());
        Ok(conn)
    }
}

impl RedisStore {
    pub fn new(config: &StoreConfig) -> Result<Self, StoreError> {
        let sentinel = &config.sentinel;
        let target = match &config.redis_url {
            None if !sentinel.nodes.is_empty() => {
                let mut master = RedisConnectionInfo::default();
                if let Some(user) = &sentinel.username {
                    master = master.set_username(user);
                }
                if let Some(password) = &sentinel.password {
                    master = master.set_password(password.expose());
                }
                let client = SentinelClient::build(
                    sentinel.nodes.iter().map(Secret::expose).collect(),
                    sentinel.master.clone(),
                    Some(SentinelNodeConnectionInfo::default().set_redis_connection_info(master)),
                    SentinelServerType::Master,
                )
                .map_err(|e| StoreError::Backend(format!("store.sentinel: {e}")))?;
                Target::Sentinel(Arc::new(Sentinel {
                    client: tokio::sync::Mutex::new(client),
                    config: AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(config.connect_timeout()))
                        .set_response_timeout(Some(config.response_timeout())),
                    current: Mutex::new(None),
                }))
            }
            Some(url) => {
                let client = redis::Client::open(url.expose())
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
                let client = ClusterClient::builder(nodes)
                    .connection_timeout(config.connect_timeout())
                    .response_timeout(config.response_timeout())
                    .retries(2)
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

    /// `<prefix>:{<conversation>}:<part>`: the braces are the Cluster hash tag.
    fn key(&self, conversation: &Fingerprint, part: &str) -> String {
        format!("{}:{{{conversation}}}:{part}", self.inner.prefix)
    }

    fn global(&self, name: &str) -> String {
        format!("{}:{name}", self.inner.prefix)
    }

    pub async fn load(&self, conversation: &Fingerprint) -> Result<Loaded, StoreError> {
        let (ckpt, state, usage) = (
            self.key(conversation, "ckpt"),
            self.key(conversation, "state"),
            self.key(conversation, "usage"),
        );
        let ttl = self.inner.ttl_ms as i64;
        let mut pipe = redis::pipe();
        pipe.hgetall(&ckpt)
            .hgetall(&state)
            .hgetall(&usage)
            .pexpire(&ckpt, ttl)
            .ignore()
            .pexpire(&state, ttl)
            .ignore()
            .pexpire(&usage, ttl)
            .ignore();
        // Field/value pairs, not maps: a handful of fields, looked up once each, are
        // cheaper scanned than hashed.
        let (mut fields, state, usage): (Fields, Fields, Fields) =
            pipe.query_async(&mut self.conn().await?).await?;
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
            state: parse_state(&state)?,
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
        usage: Usage,
        replaces: Option<Fingerprint>,
        touch_index: bool,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        let ttl = self.inner.ttl_ms as i64;
        let mut own = self.inner.record.key(self.key(conversation, "usage"));
        own.key(self.key(conversation, "state"))
            .key(self.key(conversation, "ckpt"))
            .arg(usage.prefix.to_hex())
            .arg(usage.encode())
            .arg(replaces.map(|p| p.to_hex()).unwrap_or_default())
            .arg(MAX_USAGE)
            .arg(now)
            .arg(ttl);
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
                    .key(&state)
                    .arg(focus)
                    .invoke_async(&mut conn)
                    .await?;
                Ok(set == 1)
            }
            None => {
                let _: i64 = redis::cmd("HDEL")
                    .arg(&state)
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

    pub async fn accept_tenant(&self, tenant: &Fingerprint) -> Result<(), StoreError> {
        let _: () = redis::cmd("SET")
            .arg(self.key(tenant, "tenant"))
            .arg("1")
            .arg("PX")
            .arg(self.inner.ttl_ms)
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
