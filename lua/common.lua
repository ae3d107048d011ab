-- common.lua: functions shared by every ackproxy script. It is prepended to
-- each script at build time, so each script stays one atomic EVAL.
--
-- A queue's keys always arrive as a group of 7 consecutive KEYS:
--   queue (list), leases (zset), mleases (zset), msgs (hash), ids (zset),
--   retry (hash), dead (list)
-- and a queue's rule as 5 consecutive ARGV:
--   lease_ms, max_deliveries, ack field ('' = whole payload),
--   redeliver ('next' | 'last'), pop end ('L' | 'R')
--
-- A lease's token is 'i'..sha1(ack_id) (41 bytes): ACK finds it without an
-- index. Only a second message with the same id in flight at the same time
-- gets a longer token, 'i'..sha1(ack_id)..':'..ms..':'..n, which is indexed.
-- msgs: token -> cmsgpack(payload, ack_id, deliveries, dest, dest_end, started_ms)
-- ids:  score 0, members: the longer tokens, and for move leases
--       'd'..sha1(dest.."\0"..payload)..'|'..token.
-- retry: 'i'..sha1(ack_id) -> cmsgpack(copies back in the list, deliveries,
--        copies cancelled by a late ACK).

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function group(base)
  return {
    q = KEYS[base], leases = KEYS[base + 1], mleases = KEYS[base + 2],
    msgs = KEYS[base + 3], ids = KEYS[base + 4], retry = KEYS[base + 5],
    dead = KEYS[base + 6],
  }
end

local function rule(at)
  return {
    lease = tonumber(ARGV[at]), max = tonumber(ARGV[at + 1]), field = ARGV[at + 2],
    redeliver = ARGV[at + 3], pop_end = ARGV[at + 4],
  }
end

-- The ack id of a payload. A payload that is not a JSON object, or lacks
-- the field, is its own id: it is still leased, never refused.
local function ack_id(payload, field)
  if field == '' then return payload end
  local ok, obj = pcall(cjson.decode, payload)
  if ok and type(obj) == 'table' then
    local v = obj[field]
    if type(v) == 'string' then return v end
    if type(v) == 'number' then return tostring(v) end
  end
  return payload
end

local function id_key(id) return 'i' .. redis.sha1hex(id) end
local function dest_key(dest, payload) return 'd' .. redis.sha1hex(dest .. '\0' .. payload) end

local ID_KEY_LEN = 41

-- The tokens of the leases with this id key: the plain one first, then up
-- to n - 1 duplicates.
local function tokens_of(k, ik, n)
  local out = {}
  if redis.call('HEXISTS', k.msgs, ik) == 1 then out[1] = ik end
  if #out < n then
    local dups = redis.call('ZRANGEBYLEX', k.ids, '[' .. ik .. ':', '(' .. ik .. ';', 'LIMIT', 0, n - #out)
    for _, t in ipairs(dups) do out[#out + 1] = t end
  end
  return out
end

-- The leases whose copy of payload sits in dest (move pops), at most n.
local function tokens_in_dest(k, dest, payload, n)
  local dk = dest_key(dest, payload) .. '|'
  local members = redis.call('ZRANGEBYLEX', k.ids, '[' .. dk, '(' .. dk .. '\255', 'LIMIT', 0, n)
  local out = {}
  for i, m in ipairs(members) do out[i] = string.sub(m, #dk + 1) end
  return out
end

local function new_lease(k, r, payload, deliveries, dest, dest_end, now)
  local id = ack_id(payload, r.field)
  local token = id_key(id)
  local rec = cmsgpack.pack(payload, id, deliveries, dest, dest_end, now)
  if redis.call('HSETNX', k.msgs, token, rec) == 0 then
    -- Another message with this id is in flight: a token of its own.
    local base = token .. ':' .. now .. ':'
    for n = 1, 1000 do
      token = base .. n
      if redis.call('HSETNX', k.msgs, token, rec) == 1 then break end
    end
    redis.call('ZADD', k.ids, 0, token)
  end
  redis.call('ZADD', dest == '' and k.leases or k.mleases, now + r.lease, token)
  if dest ~= '' then redis.call('ZADD', k.ids, 0, dest_key(dest, payload) .. '|' .. token) end
end

-- Reads a lease record: payload, id, deliveries, dest, dest_end, started.
local function record(k, token)
  local raw = redis.call('HGET', k.msgs, token)
  if not raw then return nil end
  return cmsgpack.unpack(raw)
end

-- Removes every trace of a lease.
local function drop(k, token, payload, dest)
  redis.call('ZREM', dest == '' and k.leases or k.mleases, token)
  redis.call('HDEL', k.msgs, token)
  if #token > ID_KEY_LEN then redis.call('ZREM', k.ids, token) end
  if dest ~= '' then redis.call('ZREM', k.ids, dest_key(dest, payload) .. '|' .. token) end
end

-- Ends a lease without an ACK: the message goes back to the list (and a
-- retry entry keeps its delivery count), or past max deliveries its raw
-- payload goes to the dead-letter list. Returns requeued, deadlettered.
local function expire(k, r, token)
  local payload, id, deliveries, dest = record(k, token)
  if not payload then
    redis.call('ZREM', k.leases, token)
    redis.call('ZREM', k.mleases, token)
    return 0, 0
  end
  drop(k, token, payload, dest)
  if deliveries >= r.max then
    redis.call('RPUSH', k.dead, payload)
    return 0, 1
  end
  local at_pop_end = (r.redeliver == 'next')
  local right = (r.pop_end == 'R') == at_pop_end
  redis.call(right and 'RPUSH' or 'LPUSH', k.q, payload)
  local rk = id_key(id)
  local pending, seen, cancelled = 0, 0, 0
  local raw = redis.call('HGET', k.retry, rk)
  if raw then pending, seen, cancelled = cmsgpack.unpack(raw) end
  if deliveries > seen then seen = deliveries end
  redis.call('HSET', k.retry, rk, cmsgpack.pack(pending + 1, seen, cancelled))
  return 1, 0
end

-- Bookkeeping for a payload just popped from a queue. Returns the delivery
-- number this pop is, or nil when a late ACK cancelled this copy.
local function popped(k, r, payload)
  local rk = id_key(ack_id(payload, r.field))
  local raw = redis.call('HGET', k.retry, rk)
  if not raw then return 1 end
  local pending, seen, cancelled = cmsgpack.unpack(raw)
  pending = pending - 1
  local deliveries = seen + 1
  if cancelled > 0 then
    cancelled = cancelled - 1
    deliveries = nil
  end
  if pending <= 0 then
    redis.call('HDEL', k.retry, rk)
  else
    redis.call('HSET', k.retry, rk, cmsgpack.pack(pending, seen, cancelled))
  end
  return deliveries
end

-- Ends up to n expired plain leases, oldest first. With redeliver 'next'
-- each one is pushed at the pop end, so they are pushed newest first to be
-- popped again in their original order. Returns requeued, deadlettered.
local function requeue_expired(k, r, now, n)
  local expired = redis.call('ZRANGEBYSCORE', k.leases, '-inf', now, 'LIMIT', 0, n)
  local requeued, dead = 0, 0
  local from, to, step = 1, #expired, 1
  if r.redeliver == 'next' then from, to, step = #expired, 1, -1 end
  for i = from, to, step do
    local a, b = expire(k, r, expired[i])
    requeued, dead = requeued + a, dead + b
  end
  return requeued, dead
end
