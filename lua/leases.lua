-- leases.lua: QUEUE LEASES queue [COUNT n] [OFFSET o]
--
-- KEYS: the queue group (GROUP_SIZE keys).
-- ARGV[1] n (at most 1000), ARGV[2] o (from 0).
-- Returns up to n leases, soonest deadline first, past the first o (on
-- the same deadline the queue's leases before move leases, each set's by
-- token); each as {ms_until_deadline, then its record's fields in the
-- order of LEASE_FIELDS, up to expiries}.
--
-- The leases are two sorted sets, leases (with its marks) and mleases,
-- merged. Where the first o end in each is found by halving, one entry of
-- each set per step, so a page far down costs about 2 log2(o) entries
-- read besides its own, never the sets up to it.

-- The rank in leases of its i-th lease (from 0): each mark (ranks, in
-- order) at or before it holds a rank of its own.
local function lease_rank(marks, i)
  local r = i
  for _, m in ipairs(marks) do
    if m <= r then r = r + 1 end
  end
  return r
end

local function score_at(z, rank)
  return tonumber(redis.call('ZRANGE', z, rank, rank, 'WITHSCORES')[2])
end

-- The record's fields a lease is shown with: LEASE_FIELDS up to expiries.
local SHOWN = 0
for i = 1, #LEASE_FIELDS do
  if LEASE_FIELDS[i] == 'expiries' then SHOWN = i end
end

register('leases', function(KEYS, ARGV)
  local k = group(KEYS, 1)
  local n, o = tonumber(ARGV[1]), tonumber(ARGV[2])
  local now = now_ms()
  local marks = {}
  for _, m in ipairs({ RETRY_MARK, DELAYED_MARK }) do
    local r = redis.call('ZRANK', k.leases, m)
    if r then marks[#marks + 1] = r end
  end
  table.sort(marks)
  local na = redis.call('ZCARD', k.leases) - #marks
  local nb = redis.call('ZCARD', k.mleases)
  -- Past the end nothing is read: a huge o would reach ZRANGE as 1e+18.
  if o >= na + nb then return reply({}) end
  -- The first o are the first i of leases and the first o - i of mleases:
  -- i is the largest for which lease i - 1 comes before move lease o - i.
  local lo, hi = math.max(0, o - nb), math.min(o, na)
  while lo < hi do
    local i = math.floor((lo + hi + 1) / 2)
    if score_at(k.leases, lease_rank(marks, i - 1)) <= score_at(k.mleases, o - i) then
      lo = i
    else
      hi = i - 1
    end
  end
  local a, b = {}, {}
  if lo < na then
    local from = lease_rank(marks, lo)
    -- Two more: the marks are not leases.
    local flat = redis.call('ZRANGE', k.leases, from, from + n + 1, 'WITHSCORES')
    for i = 1, #flat, 2 do
      if not is_mark(flat[i]) then a[#a + 1] = { flat[i], tonumber(flat[i + 1]) } end
    end
  end
  if o - lo < nb then
    local flat = redis.call('ZRANGE', k.mleases, o - lo, o - lo + n - 1, 'WITHSCORES')
    for i = 1, #flat, 2 do b[#b + 1] = { flat[i], tonumber(flat[i + 1]) } end
  end
  local out, ia, ib = {}, 1, 1
  for _ = 1, n do
    local l
    if a[ia] and (not b[ib] or a[ia][2] <= b[ib][2]) then
      l, ia = a[ia], ia + 1
    elseif b[ib] then
      l, ib = b[ib], ib + 1
    else
      break
    end
    local f = record(k, l[1])
    if f then
      f.nacks, f.expiries = f.nacks or 0, f.expiries or 0
      local row = { l[2] - now }
      for i = 1, SHOWN do row[i + 1] = f[LEASE_FIELDS[i]] end
      out[#out + 1] = row
    end
  end
  return reply(out)
end)
