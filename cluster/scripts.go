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

// luaHoldLeft reads a provider's hold: the milliseconds left of its
// failure cooldown, that cooldown's streak, and the milliseconds left of
// its skip (0 when not running), on Redis' clock.
const luaHoldLeft = `
local function holdLeft(key)
  local h = redis.call('HMGET', key, 'until', 'streak', 'skip')
  local cd, sk = tonumber(h[1]), tonumber(h[3])
  local cdLeft, skLeft = 0, 0
  if cd and cd > now then cdLeft = cd - now end
  if sk and sk > now then skLeft = sk - now end
  return cdLeft, tonumber(h[2]) or 0, skLeft
end
`

// acquireScript drops the dead leases of a provider, checks its shared
// cooldown and skip, and takes a slot when fewer than its cap are live:
// max, or with a learnt cap (ARGV[6] > 0) the cap learnt so far, raised by
// one first when an interval has passed since it was last set and it was
// reached since.
//
// KEYS[1] lease set, KEYS[2] cooldown hash, KEYS[3] learnt cap hash
// (cap, since, reached).
// ARGV[1] max (0 unlimited), ARGV[2] member, ARGV[3] TTL ms, ARGV[4] channel,
// ARGV[5] "released" event, published when dead leases were dropped and
// room remains, ARGV[6] the learnt cap's interval in ms (0: not learnt),
// ARGV[7] the "wanted" event, published when full (nodes keeping spare
// slots of the provider give them back), ARGV[8…] leases of this node
// released and not yet given back: removed first, in the same round trip.
//
// Returns {status, cooldown ms left, streak, live, skip ms left, learnt
// cap}: status 0 held (a cooldown or skip runs; no lease taken), 1 taken,
// 2 full (live, which may be above max after a partition, counts every
// live lease).
var acquireScript = redis.NewScript(luaNow + luaExpireWithLast + luaHoldLeft + `
local swept = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
for i = 8, #ARGV do
  swept = swept + redis.call('ZREM', KEYS[1], ARGV[i])
end
local cdLeft, streak, skLeft = holdLeft(KEYS[2])
local live = redis.call('ZCARD', KEYS[1])
local max = tonumber(ARGV[1])
local learn = tonumber(ARGV[6])
local cap = 0
if learn > 0 then
  local c = redis.call('HMGET', KEYS[3], 'cap', 'since', 'reached')
  cap = tonumber(c[1]) or 0
  if cap > 0 and c[3] == '1' and now - (tonumber(c[2]) or 0) >= learn then
    cap = cap + 1
    redis.call('HSET', KEYS[3], 'cap', cap, 'since', now, 'reached', 0)
    redis.call('PEXPIRE', KEYS[3], 86400000)
  end
  if cap > 0 then max = cap end
end
if cdLeft > 0 or skLeft > 0 then
  return {0, cdLeft, streak, live, skLeft, cap}
end
local exp = now + tonumber(ARGV[3])
if redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  -- this very lease is already in: a call whose reply was lost
  redis.call('ZADD', KEYS[1], exp, ARGV[2])
  expireWithLast(KEYS[1], tonumber(ARGV[3]))
  return {1, 0, 0, live, 0, cap}
end
if max > 0 and live >= max then
  if cap > 0 then redis.call('HSET', KEYS[3], 'reached', 1) end
  redis.call('PUBLISH', ARGV[4], ARGV[7])
  return {2, 0, 0, live, 0, cap}
end
redis.call('ZADD', KEYS[1], exp, ARGV[2])
expireWithLast(KEYS[1], tonumber(ARGV[3]))
if cap > 0 and live + 1 >= cap then redis.call('HSET', KEYS[3], 'reached', 1) end
if swept > 0 and max > 0 and live + 1 < max then
  -- slots freed and room left: news for the waiters of other nodes (no
  -- one waits for an unlimited provider)
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
return {1, 0, 0, live + 1, 0, cap}
`)

// learnCapScript sets a provider's learnt cap to its live leases over
// every node, less the refused attempt's own, when at least one is live.
//
// KEYS[1] lease set, KEYS[2] learnt cap hash. Returns the cap set (0:
// nothing live, nothing learnt).
var learnCapScript = redis.NewScript(luaNow + `
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local live = redis.call('ZCARD', KEYS[1]) - 1
if live < 1 then return 0 end
redis.call('HSET', KEYS[2], 'cap', live, 'since', now, 'reached', 0)
redis.call('PEXPIRE', KEYS[2], 86400000)
return live
`)

// spendScript adds costs to spend totals and returns the new totals; each
// key lives one window past its own. A total that holds no number (a
// foreign or corrupted value) is left as it is, and its place in the
// reply is "" (a script that stopped at it would keep the increments
// made before, and the retry would add them again).
//
// KEYS: the totals. ARGV: for each key its increment, then its expiry
// (Unix ms).
var spendScript = redis.NewScript(`
local out = {}
for i, key in ipairs(KEYS) do
  local total = redis.pcall('INCRBYFLOAT', key, ARGV[2 * i - 1])
  if type(total) == 'table' then
    out[i] = ''
  else
    out[i] = total
    redis.call('PEXPIREAT', key, ARGV[2 * i])
  end
end
return out
`)

// renewScript extends every lease this node holds, putting back those that
// went missing, then drops the dead leases of the providers it watches and
// announces the freed slots.
//
// KEYS: the lease sets. ARGV[1] TTL ms, ARGV[2] channel; then for each key:
// its "released" event, the number n of members, the n members.
//
// Returns the number of members put back, then the live leases of each
// key, in KEYS order.
var renewScript = redis.NewScript(luaNow + luaExpireWithLast + `
local exp = now + tonumber(ARGV[1])
local i = 3
local restored = 0
local out = {0}
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
  out[#out + 1] = redis.call('ZCARD', key)
end
out[1] = restored
return out
`)

// leaseOpsScript writes and removes leases, and announces the freed slots
// of capped providers, each event once.
//
// KEYS: the lease sets, one per operation. ARGV[1] channel, ARGV[2] TTL
// ms; then for each key: "1" (write the member, expiring in TTL) or "0"
// (remove it), the member, and the "released" event to publish when a
// removal freed a slot ("": none; the provider is unlimited).
//
// Returns the number of leases removed.
var leaseOpsScript = redis.NewScript(luaNow + luaExpireWithLast + `
local ttl = tonumber(ARGV[2])
local removed = 0
local told = {}
for k, key in ipairs(KEYS) do
  local op, member, event = ARGV[3 * k], ARGV[3 * k + 1], ARGV[3 * k + 2]
  if op == '1' then
    redis.call('ZADD', key, now + ttl, member)
    expireWithLast(key, ttl)
  elseif redis.call('ZREM', key, member) > 0 then
    removed = removed + 1
    if event ~= '' and not told[event] then
      told[event] = true
      redis.call('PUBLISH', ARGV[1], event)
    end
  end
end
return removed
`)

// publishHoldScript sets a provider's shared cooldown or skip, ending
// after the given milliseconds on Redis' clock, unless a later one of the
// same kind is already set, and announces it.
//
// KEYS[1] cooldown hash. ARGV[1] ms from now, ARGV[2] streak, ARGV[3]
// channel, ARGV[4] the event, ARGV[5] the field: "until" (a cooldown, with
// its streak) or "skip".
//
// Returns 1 when set, 0 when a later one was kept.
var publishHoldScript = redis.NewScript(luaNow + `
local u = now + tonumber(ARGV[1])
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[5]))
if cur and cur > u then return 0 end
if ARGV[5] == 'until' then
  redis.call('HSET', KEYS[1], 'until', u, 'streak', ARGV[2])
else
  redis.call('HSET', KEYS[1], 'skip', u)
end
local h = redis.call('HMGET', KEYS[1], 'until', 'skip')
local last = math.max(tonumber(h[1]) or 0, tonumber(h[2]) or 0)
redis.call('PEXPIREAT', KEYS[1], last)
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
`)

// holdScript reads a provider's hold.
//
// KEYS[1] cooldown hash. Returns {cooldown ms left, streak, skip ms left}.
var holdScript = redis.NewScript(luaNow + luaHoldLeft + `
local cdLeft, streak, skLeft = holdLeft(KEYS[1])
return {cdLeft, streak, skLeft}
`)

// clearCooldownScript ends a provider's shared cooldown and announces it.
//
// KEYS[1] cooldown hash. ARGV[1] channel, ARGV[2] "recovered" event.
var clearCooldownScript = redis.NewScript(`
local n = redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], ARGV[2])
return n
`)

// snapshotScript reads the live leases and hold of providers.
//
// KEYS: for each provider its lease set then its cooldown hash.
//
// Returns for each provider the list of live members, the cooldown's ms
// left and the skip's ms left (0 when not running).
var snapshotScript = redis.NewScript(luaNow + luaHoldLeft + `
local out = {}
for k = 1, #KEYS, 2 do
  out[#out + 1] = redis.call('ZRANGEBYSCORE', KEYS[k], '(' .. string.format('%d', now), '+inf')
  local cdLeft, _, skLeft = holdLeft(KEYS[k + 1])
  out[#out + 1] = cdLeft
  out[#out + 1] = skLeft
end
return out
`)

// secretScript sets a value unless one is set, and returns the value
// kept: the first node's wins.
//
// KEYS[1] the key. ARGV[1] the value proposed.
var secretScript = redis.NewScript(`
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
`)
