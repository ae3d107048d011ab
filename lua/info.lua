-- info.lua: QUEUE INFO queue
--
-- KEYS: the queue group (GROUP_SIZE keys).
-- ARGV: the queue's rule (RULE_SIZE values), then, if any, the deliveries
-- and ACKs the calling proxy made with scripts/take.lua and release.lua
-- that the stats hash does not count yet: written before the totals are
-- read, as the library's own.
-- Returns {ready, leased, dead, oldest_lease_age_ms (-1 if none), distinct
-- ids with copies back in the list after an expiry, delayed, {totals in
-- tally::EVENTS order}, messages flagged as poison, {the ack ids of the
-- first POISON_SHOWN of them}}. Ready does not count copies a late ACK
-- cancelled (and is never below 0). The age looks at the 10 leases due first of each kind, and
-- the poison index is checked POISON_LOOK entries at a time (see
-- poison_ids), so the work stays bounded.

local POISON_LOOK = 100
local POISON_SHOWN = 10

register('info', function(KEYS, ARGV)
  local k = group(KEYS, 1)
  local r = rule(ARGV, 1)
  local function len(key)
    local t = redis.call('TYPE', key)['ok']
    if t == 'list' then return redis.call('LLEN', key) end
    return 0
  end
  local now = now_ms()
  local oldest = -1
  for _, z in ipairs({ k.leases, k.mleases }) do
    for _, token in ipairs(redis.call('ZRANGE', z, 0, 9)) do
      local l = record(k, token)
      if l and now - l.started > oldest then oldest = now - l.started end
    end
  end
  local cancelled = tonumber(redis.call('HGET', k.retry, CANCELLED) or '0')
  local requeued = redis.call('HLEN', k.retry) - (cancelled > 0 and 1 or 0)
  local marks = 0
  for _, score in ipairs(redis.call('ZMSCORE', k.leases, RETRY_MARK, DELAYED_MARK)) do
    if score then marks = marks + 1 end
  end
  local poisoned = poison_ids(k, r, POISON_LOOK)
  -- Those looked at are known poison now; any past them are counted as
  -- the index has them.
  local poison_count = redis.call('ZCARD', k.poison)
  local shown = {}
  for i = 1, math.min(#poisoned, POISON_SHOWN) do shown[i] = poisoned[i] end
  write_pending(k)
  if ARGV[RULE_SIZE + 1] then
    redis.call('HINCRBY', k.stats, 'deliveries', ARGV[RULE_SIZE + 1])
    redis.call('HINCRBY', k.stats, 'acks', ARGV[RULE_SIZE + 2])
    touch(k.stats)
  end
  local names = event_names()
  local totals = redis.call('HMGET', k.stats, unpack(names))
  for i = 1, #names do totals[i] = tonumber(totals[i]) or 0 end
  return reply({
    -- Marks whose copies left the list behind the proxy's back (popped
    -- straight from Redis, deleted) stay until a pop finds the list empty.
    math.max(len(k.q) - cancelled, 0),
    redis.call('ZCARD', k.leases) + redis.call('ZCARD', k.mleases) - marks,
    len(k.dead),
    oldest,
    requeued,
    redis.call('ZCARD', k.delayed),
    totals,
    poison_count,
    shown,
  })
end)
