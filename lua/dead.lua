-- dead.lua: QUEUE DEAD queue [COUNT n] [OFFSET o]
--
-- KEYS: the queue group (GROUP_SIZE keys).
-- ARGV[1] n (at most 1000), ARGV[2] o (from 0).
-- Returns up to n dead letters, the oldest first, past the o oldest; each
-- as {payload, then its history or falses: ack id, deliveries, nacks,
-- expiries, first delivery (ms), last delivery (ms), last reason,
-- dead-lettered (ms)}. Two dead letters with the same payload show the
-- history of the later one.

register('dead', function(KEYS, ARGV)
  local k = group(KEYS, 1)
  local n, o = tonumber(ARGV[1]), tonumber(ARGV[2])
  if not is_list_or_none(k.dead) then return redis.error_reply(WRONGTYPE) end
  -- Past the end nothing is read: a huge o would reach LRANGE as 1e+18.
  if o > 0 and o >= redis.call('LLEN', k.dead) then return reply({}) end
  local out = {}
  for i, payload in ipairs(redis.call('LRANGE', k.dead, o, o + n - 1)) do
    local raw = redis.call('HGET', k.history, history_key(payload))
    local e = { payload, false, false, false, false, false, false, false, false }
    if raw then
      local f = { cmsgpack.unpack(raw) }
      for j = 2, 9 do e[j] = f[j] end
    end
    out[i] = e
  end
  return reply(out)
end)
