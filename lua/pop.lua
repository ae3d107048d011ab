-- pop.lua: pop and lease, atomically, for every pop form.
--
-- KEYS: for each candidate source, in the client's order: a queue group
--       (GROUP_SIZE keys) or 1 plain key; then, for move forms, the
--       destination list.
-- ARGV[1] number of sources G
-- ARGV[2] end to pop: 'L' | 'R'
-- ARGV[3] count: pop up to this many from the first source that has any
--         (0 allowed: only says whether the source exists)
-- ARGV[4] move: '' | 'L' | 'R' (push each popped value onto the destination
--         at that end)
-- ARGV[5] the client connection popping ('' if none): leases on rules that
--         track it record it
-- ARGV[6] at most this many earlier leases of that connection, over all
--         queue sources with ack = 'next-pop', are acknowledged before
--         popping (0: none, -1: all)
-- then per source: 'q' followed by its rule (RULE_SIZE values), or 'p'.
--
-- Returns (inside reply()) false when no source has anything. Otherwise
-- {status, g, v1..vn}:
-- g is the 1-based source popped from (just {0, g} when count is 0 and
-- source g exists); status 0 means the pop is complete (fewer than count
-- values: source g has no more), status 1 means the skip bound stopped it
-- early: call again from source g to go on; status 2 (nothing popped)
-- means the connection's earlier leases were not all acknowledged yet:
-- call again.
-- A source holding a non-list, or a destination that is not a list, gives
-- Redis's WRONGTYPE error and nothing is popped.
-- Work per call: REQUEUE_PER_CALL expired leases returned, PROMOTE_PER_CALL
-- due messages moved in (over all queue sources), ARGV[6] releases, count
-- pops and SKIP_PER_CALL skips, whatever the queue holds; the caller bounds
-- count and the number of sources.

register('pop', function(KEYS, ARGV)
  local G = tonumber(ARGV[1])
  local pop_cmd = ARGV[2] == 'L' and 'LPOP' or 'RPOP'
  local count = tonumber(ARGV[3])
  local push = ARGV[4]
  local requeue_budget = REQUEUE_PER_CALL
  local skip_budget = SKIP_PER_CALL
  local promote_budget = PROMOTE_PER_CALL
  local owner = ARGV[5]
  local releasing = ARGV[6] ~= '0'
  local release_budget = tonumber(ARGV[6])
  local dest = push ~= '' and KEYS[#KEYS] or ''
  -- As Redis's LMOVE: the destination's type matters only once a source
  -- holds something to move (an empty source gives nil, or blocks).
  local dest_checked = dest == ''
  local function dest_refused(key)
    if dest_checked then return nil end
    local n = redis.pcall('LLEN', key)
    if type(n) ~= 'number' or n == 0 then return nil end
    dest_checked = true
    local t = redis.call('TYPE', dest)['ok']
    if t ~= 'list' and t ~= 'none' then return redis.error_reply(WRONGTYPE) end
  end
  local push_cmd = push == 'L' and 'LPUSH' or 'RPUSH'
  local now, now_text = now_ms()

  local function exists(key)
    local t = redis.call('TYPE', key)['ok']
    if t == 'list' then return true end
    if t ~= 'none' then return nil, redis.error_reply(WRONGTYPE) end
    return false
  end

  -- Sources' ARGV start after the 6 fixed ones above.
  local ki, ai = 1, 7
  for g = 1, G do
    local kind = ARGV[ai]
    ai = ai + 1
    if kind == 'q' then
      local k = group(KEYS, ki)
      local r = rule(ARGV, ai)
      ki, ai = ki + GROUP_SIZE, ai + RULE_SIZE
      if releasing and owner ~= '' and r.ack == 'next-pop' and count > 0 then
        local done, more = release_owned(k, r, owner, release_budget)
        if release_budget > 0 then release_budget = release_budget - done end
        if more then return reply({ 2, g }) end
      end
      local retried
      retried, requeue_budget, promote_budget = pop_due(k, r, now, now_text, requeue_budget, promote_budget)
      if count == 0 then
        local found, err = exists(k.q)
        if err then return err end
        if found then return reply({ 0, g }) end
      else
        local refused = dest_refused(k.q)
        if refused then return refused end
        local out, err
        out, err, skip_budget = pop_leased(k, r, g, pop_cmd, count, now, retried, dest, push, owner, skip_budget)
        if err then return err end
        if out then return reply(out) end
      end
    else
      local key = KEYS[ki]
      ki = ki + 1
      if count == 0 then
        local found, err = exists(key)
        if err then return err end
        if found then return reply({ 0, g }) end
      else
        local refused = dest_refused(key)
        if refused then return refused end
        local vs = redis.pcall(pop_cmd, key, count)
        if type(vs) == 'table' and vs['err'] then return vs end
        if vs then
          local out = { 0, g }
          for _, v in ipairs(vs) do
            if dest ~= '' then redis.call(push_cmd, dest, v) end
            out[#out + 1] = v
          end
          return reply(out)
        end
      end
    end
  end
  return reply(false)
end)

