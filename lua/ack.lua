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
  local token = tokens_of(k, key, 1)[1]
  if token then
    local payload, id, _, dest = record(k, token)
    if payload then
      drop(k, token, payload, id, dest)
    else
      redis.call('ZREM', k.ids, key .. token)
    end
    released = released + 1
  else
    local raw = redis.call('HGET', k.retry, key)
    if raw then
      local pending, seen, cancelled = cmsgpack.unpack(raw)
      if pending > cancelled then
        redis.call('HSET', k.retry, key, cmsgpack.pack(pending, seen, cancelled + 1))
        late = late + 1
      end
    end
  end
end
return { released, late }
