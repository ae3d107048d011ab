-- dead.lua: QUEUE DEAD queue [COUNT n]
--
-- KEYS: the queue group (GROUP_SIZE keys).
-- ARGV[1] n (at most 1000).
-- Returns the n oldest dead letters, each as {payload, then its history or
-- falses: ack id, deliveries, nacks, expiries, first delivery (ms), last
-- delivery (ms), last reason, dead-lettered (ms)}. Two dead letters with
-- the same payload show the history of the later one.

register('dead', function(KEYS, ARGV)
  local k = group(KEYS, 1)
  local n = tonumber(ARGV[1])
  if not is_list_or_none(k.dead) then return redis.error_reply(WRONGTYPE) end
  local out = {}
  for i, payload in ipairs(redis.call('LRANGE', k.dead, 0, n - 1)) do
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
