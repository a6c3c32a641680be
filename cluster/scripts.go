package cluster

import "github.com/redis/go-redis/v9"

// now is the Lua prelude giving Redis' clock in Unix milliseconds. On Redis
// before 5, replicate_commands makes writes after TIME legal; later
// versions always replicate effects.
const luaNow = `
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`

// luaExpireWithLast makes a lease set expire one more TTL after its
// longest lease: the margin lets the next script see dead leases, and
// announce the freed slots, rather than have the key vanish silently.
const luaExpireWithLast = `
local function expireWithLast(key, ttl)
  local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if top[2] then redis.call('PEXPIREAT', key, tonumber(top[2]) + ttl) end
end
`

// acquireScript drops the dead leases of a provider, checks its shared
// cooldown and takes a slot when fewer than max are live.
//
// KEYS[1] lease set, KEYS[2] cooldown hash.
// ARGV[1] max (0 unlimited), ARGV[2] member, ARGV[3] TTL ms, ARGV[4] channel,
// ARGV[5] "released" event, published when dead leases were dropped and
// room remains.
//
// Returns {status, until, streak, live}: status 0 cooldown (until, streak
// set), 1 taken (until is the lease's expiry), 2 full.
var acquireScript = redis.NewScript(luaNow + luaExpireWithLast + `
local swept = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local cd = redis.call('HMGET', KEYS[2], 'until', 'streak')
local cdUntil = tonumber(cd[1])
if cdUntil and cdUntil > now then
  return {0, cdUntil, tonumber(cd[2]) or 0, 0}
end
local live = redis.call('ZCARD', KEYS[1])
local exp = now + tonumber(ARGV[3])
if redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  -- this very lease is already in: a call whose reply was lost
  redis.call('ZADD', KEYS[1], exp, ARGV[2])
  expireWithLast(KEYS[1], tonumber(ARGV[3]))
  return {1, exp, 0, live}
end
local max = tonumber(ARGV[1])
if max > 0 and live >= max then
  return {2, 0, 0, live}
end
redis.call('ZADD', KEYS[1], exp, ARGV[2])
expireWithLast(KEYS[1], tonumber(ARGV[3]))
if swept > 0 and (max == 0 or live + 1 < max) then
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
return {1, exp, 0, live + 1}
`)

// renewScript extends every lease this node holds, putting back those that
// went missing, then drops the dead leases of the providers it watches and
// announces the freed slots.
//
// KEYS: the lease sets. ARGV[1] TTL ms, ARGV[2] channel; then for each key:
// its "released" event, the number n of members, the n members.
//
// Returns the number of members put back.
var renewScript = redis.NewScript(luaNow + luaExpireWithLast + `
local exp = now + tonumber(ARGV[1])
local i = 3
local restored = 0
for _, key in ipairs(KEYS) do
  local event = ARGV[i]
  local n = tonumber(ARGV[i + 1])
  i = i + 2
  for _ = 1, n do
    restored = restored + redis.call('ZADD', key, exp, ARGV[i])
    i = i + 1
  end
  local swept = redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if n > 0 then expireWithLast(key, tonumber(ARGV[1])) end
  if swept > 0 then redis.call('PUBLISH', ARGV[2], event) end
end
return restored
`)

// releaseScript removes leases and announces each freed slot.
//
// KEYS: the lease sets. ARGV[1] channel; then for each key its member and
// its "released" event.
//
// Returns the number of leases removed.
var releaseScript = redis.NewScript(`
local removed = 0
for k, key in ipairs(KEYS) do
  local n = redis.call('ZREM', key, ARGV[2 * k])
  if n > 0 then
    removed = removed + n
    redis.call('PUBLISH', ARGV[1], ARGV[2 * k + 1])
  end
end
return removed
`)

// publishCooldownScript sets a provider's shared cooldown unless a later
// one is already set, and announces it.
//
// KEYS[1] cooldown hash. ARGV[1] until ms, ARGV[2] streak, ARGV[3] channel,
// ARGV[4] "cooldown" event.
//
// Returns 1 when set, 0 when a later cooldown was kept or until has passed.
var publishCooldownScript = redis.NewScript(luaNow + `
local u = tonumber(ARGV[1])
if u <= now then return 0 end
local cur = tonumber(redis.call('HGET', KEYS[1], 'until'))
if cur and cur > u then return 0 end
redis.call('HSET', KEYS[1], 'until', ARGV[1], 'streak', ARGV[2])
redis.call('PEXPIREAT', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
`)

// clearCooldownScript ends a provider's shared cooldown and announces it.
//
// KEYS[1] cooldown hash. ARGV[1] channel, ARGV[2] "recovered" event.
var clearCooldownScript = redis.NewScript(`
local n = redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], ARGV[2])
return n
`)

// snapshotScript reads the live leases and cooldown of providers.
//
// KEYS: for each provider its lease set then its cooldown hash.
//
// Returns for each provider the list of live members and the cooldown's
// until (0 when none).
var snapshotScript = redis.NewScript(luaNow + `
local out = {}
for k = 1, #KEYS, 2 do
  out[#out + 1] = redis.call('ZRANGEBYSCORE', KEYS[k], '(' .. string.format('%d', now), '+inf')
  local u = tonumber(redis.call('HGET', KEYS[k + 1], 'until'))
  if u and u > now then out[#out + 1] = u else out[#out + 1] = 0 end
end
return out
`)
