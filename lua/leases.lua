-- leases.lua: QUEUE LEASES queue [COUNT n]
--
-- KEYS: the queue group (GROUP_SIZE keys).
-- ARGV[1] n (at most 1000).
-- Returns up to n leases, soonest deadline first, each as
-- {ack_id, payload, deliveries, ms_until_deadline, destination or '',
-- nacks, expiries}.

register('leases', function(KEYS, ARGV)
  local k = group(KEYS, 1)
  local n = tonumber(ARGV[1])
  local now = now_ms()
  local all = {}
  for _, z in ipairs({ k.leases, k.mleases }) do
    -- Two more: the marks of the leases set are not leases.
    local flat = redis.call('ZRANGE', z, 0, n + 1, 'WITHSCORES')
    for i = 1, #flat, 2 do
      if not is_mark(flat[i]) then all[#all + 1] = { flat[i], tonumber(flat[i + 1]) } end
    end
  end
  table.sort(all, function(a, b) return a[2] < b[2] end)
  local out = {}
  for i = 1, math.min(n, #all) do
    local payload, id, deliveries, dest, _, _, nacks, expiries = record(k, all[i][1])
    if payload then
      out[#out + 1] = { id, payload, deliveries, all[i][2] - now, dest, nacks or 0, expiries or 0 }
    end
  end
  return reply(out)
end)
