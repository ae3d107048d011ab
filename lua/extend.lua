-- extend.lua: QUEUE EXTEND queue id ms
--
-- KEYS: the queue group (GROUP_SIZE keys).
-- ARGV[1] ack id, ARGV[2] milliseconds (the caller checks the range).
-- Every lease with that id (at most 100) now ends ms from now (Redis time).
-- Returns the number of leases renewed.

register('extend', function(KEYS, ARGV)
  local k = group(KEYS, 1)
  local deadline = now_ms() + tonumber(ARGV[2])
  local n = 0
  for _, token in ipairs(tokens_of(k, id_key(ARGV[1]), 100)) do
    for _, z in ipairs({ k.leases, k.mleases }) do
      if redis.call('ZSCORE', z, token) then
        redis.call('ZADD', z, deadline, token)
        n = n + 1
      end
    end
  end
  return reply(n)
end)
