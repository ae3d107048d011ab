-- ack.lua: ACK queue id [id ...]
--
-- KEYS: the queue group (7 keys, see common.lua).
-- ARGV: ack ids.
-- Per id: releases one lease with that id; if none is leased but a copy went
-- back to the list after its lease expired and was not popped again, that
-- copy is cancelled (a late ACK: the next pop skips it).
-- Returns {released, late}. Unknown ids count nothing.

local k = group(1)
local released, late = 0, 0
for i = 1, #ARGV do
  local key = id_key(ARGV[i])
  local token = key
  local raw = redis.call('HGET', k.msgs, token)
  if not raw then
    token = redis.call('ZRANGEBYLEX', k.ids, '[' .. key .. ':', '(' .. key .. ';', 'LIMIT', 0, 1)[1]
    if token then raw = redis.call('HGET', k.msgs, token) end
  end
  if raw then
    local payload, _, _, dest = cmsgpack.unpack(raw)
    drop(k, token, payload, dest)
    released = released + 1
  else
    if token then redis.call('ZREM', k.ids, token) end
    local retry = redis.call('HGET', k.retry, key)
    if retry then
      local pending, seen, cancelled = cmsgpack.unpack(retry)
      if pending > cancelled then
        redis.call('HSET', k.retry, key, cmsgpack.pack(pending, seen, cancelled + 1))
        late = late + 1
      end
    end
  end
end
return { released, late }
