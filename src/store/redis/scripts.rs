//! The Lua scripts of the Redis backend: each one atomic read-modify-write over the keys
//! of one conversation (one hash tag, so one Cluster slot).

/// Adds a checkpoint unless one for the same depth and history exists; then drops the
/// fields the caller named (its history's shallowest beyond the limit, the oldest of
/// others) and, as a safety net, the shallowest beyond four histories' worth; counts
/// compactions; refreshes TTLs. Atomic in Redis, so concurrent and late writers cannot
/// interleave. ARGV: field, json, safety cap, ttl, then the fields to drop.
pub(super) const SAVE_CHECKPOINT: &str = r#"
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
/// time). Refreshes TTLs and `last_seen`. Adds the request to the conversation's account
/// (its counts, its format, its point on the plot, the latest `max points` kept).
/// Sets what was decided for the request (its verdict, JSON) as the account's latest.
/// KEYS: usage, state, ckpt, account, series. ARGV: field, value, superseded field (or
/// ""), limit, now, ttl, format (or ""), point (or ""), max points, verdict (or ""),
/// then the account's fields and amounts.
pub(super) const RECORD_USAGE: &str = r#"
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
for i = 11, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[4], ARGV[i], ARGV[i + 1])
end
if ARGV[10] ~= '' then
  redis.call('HSET', KEYS[4], 'verdict', ARGV[10])
end
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[4], 'format', ARGV[7])
end
if ARGV[8] ~= '' then
  redis.call('RPUSH', KEYS[5], ARGV[8])
  redis.call('LTRIM', KEYS[5], -tonumber(ARGV[9]), -1)
  redis.call('PEXPIRE', KEYS[5], ARGV[6])
end
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
redis.call('PEXPIRE', KEYS[3], ARGV[6])
if redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('PEXPIRE', KEYS[4], ARGV[6])
end
return 1
"#;

/// Deletes the lock only if it still holds our token.
pub(super) const UNLOCK: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// Extends the lock only if it still holds our token.
pub(super) const REFRESH: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

/// Schedules a compaction of an existing conversation, atomically: a state hash that
/// expired or was deleted meanwhile is not recreated (without a TTL).
pub(super) const SCHEDULE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'scheduled', ARGV[1])
  return 1
end
return 0
"#;

/// Adds a summary call's or recall's counts to a conversation's account, with its TTL
/// (never a key without one). KEYS: account. ARGV: ttl, then fields and amounts.
pub(super) const ADD_TALLY: &str = r#"
for i = 2, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 0
"#;
