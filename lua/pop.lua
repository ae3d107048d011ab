-- pop.lua: pop and lease, atomically, for every pop form.
--
-- KEYS: for each candidate source, in the client's order: a queue group of 7
--       keys (see common.lua) or 1 plain key; then, for move forms, the
--       destination list.
-- ARGV[1] number of sources G
-- ARGV[2] end to pop: 'L' | 'R'
-- ARGV[3] count: pop up to this many from the first source that has any
--         (0 allowed: only says whether the source exists)
-- ARGV[4] move: '' | 'L' | 'R' (push each popped value onto the destination
--         at that end)
-- ARGV[5] at most this many expired leases of a queue source are returned to
--         it before popping
-- then per source: 'q' followed by its 5 rule values, or 'p'.
--
-- Returns false when no source has anything; otherwise {g, v1, ..., vn}
-- where g is the 1-based source that was popped (just {g} when count is 0
-- and source g exists). A source holding a non-list, or a destination that
-- is not a list, gives Redis's WRONGTYPE error and nothing is popped.
-- Work per call: the requeue bound, count pops, and at most 100 copies
-- skipped because a late ACK cancelled them.

local G = tonumber(ARGV[1])
local pop_cmd = ARGV[2] == 'L' and 'LPOP' or 'RPOP'
local count = tonumber(ARGV[3])
local push = ARGV[4]
local bound = tonumber(ARGV[5])
local dest = ''
if push ~= '' then
  dest = KEYS[#KEYS]
  local t = redis.call('TYPE', dest)['ok']
  if t ~= 'list' and t ~= 'none' then
    return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
  end
end
local push_cmd = push == 'L' and 'LPUSH' or 'RPUSH'
local now = now_ms()
local ki, ai = 1, 6
for g = 1, G do
  local kind = ARGV[ai]
  ai = ai + 1
  if kind == 'q' then
    local k = group(ki)
    local r = rule(ai)
    ki, ai = ki + 7, ai + 5
    requeue_expired(k, r, now, bound)
    if count == 0 then
      local t = redis.call('TYPE', k.q)['ok']
      if t == 'list' then return { g } end
      if t ~= 'none' then
        return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
      end
    else
      local out = { g }
      local skipped = 0
      while #out - 1 < count do
        local v = redis.pcall(pop_cmd, k.q)
        if type(v) == 'table' then return v end
        if not v then break end
        local deliveries = popped(k, r, v)
        if deliveries then
          if dest ~= '' then redis.call(push_cmd, dest, v) end
          new_lease(k, r, v, deliveries, dest, push, now)
          out[#out + 1] = v
        else
          skipped = skipped + 1
          if skipped >= 100 then break end
        end
      end
      -- A list that held only cancelled copies counts as empty.
      if #out > 1 then return out end
    end
  else
    local key = KEYS[ki]
    ki = ki + 1
    if count == 0 then
      local t = redis.call('TYPE', key)['ok']
      if t == 'list' then return { g } end
      if t ~= 'none' then
        return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
      end
    else
      local vs = redis.pcall(pop_cmd, key, count)
      if type(vs) == 'table' and vs['err'] then return vs end
      if vs then
        local out = { g }
        for _, v in ipairs(vs) do
          if dest ~= '' then redis.call(push_cmd, dest, v) end
          out[#out + 1] = v
        end
        return out
      end
    end
  end
end
return false
