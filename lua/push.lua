-- push.lua: QUEUE PUSH queue payload [payload ...] [DELAY ms | AT unix-ms]
--
-- KEYS: the queue group (GROUP_SIZE keys).
-- ARGV: the queue's rule (RULE_SIZE values), then when: '' (now), 'D' (ms
--       from now) or 'A' (unix time in ms), then that number ('' for now),
--       then the payloads (the caller sends a bounded number per call).
-- A message due now (or in the past) enters the list where producers push,
-- as LPUSH of the payloads in order would put them; a later one waits in the
-- delayed set until a pop or the reaper moves it into the list.
-- Returns {messages accepted, ms until they are due (-1: pushed now)}.
-- A queue key holding another type gives Redis's WRONGTYPE error.

register('push', function(KEYS, ARGV)
  local k = group(KEYS, 1)
  local r = rule(ARGV, 1)
  local when = ARGV[RULE_SIZE + 1]
  local now = now_ms()
  local due = now
  if when == 'D' then
    due = now + tonumber(ARGV[RULE_SIZE + 2])
  elseif when == 'A' then
    due = tonumber(ARGV[RULE_SIZE + 2])
  end
  local first = RULE_SIZE + 3
  if not is_list_or_none(k.q) then return redis.error_reply(WRONGTYPE) end
  if due <= now then
    push_all_new(k, r, ARGV, first)
    return reply({ #ARGV - first + 1, -1 })
  end
  local chunk = {}
  for i = first, #ARGV do
    chunk[#chunk + 1] = ARGV[i]
    if #chunk == PUSH_CHUNK then
      delay_all(k, chunk, due, 'p')
      chunk = {}
    end
  end
  delay_all(k, chunk, due, 'p')
  return reply({ #ARGV - first + 1, due - now })
end)
