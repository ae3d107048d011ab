-- dead_one.lua: QUEUE REDRIVE queue ID id payload,
-- QUEUE PURGE queue DEAD ID id payload
--
-- KEYS: the queue group (GROUP_SIZE keys).
-- ARGV: the queue's rule (RULE_SIZE values), then 'R' (redrive) or 'D'
--       (delete), the id, the payload.
-- One copy of payload leaves the dead-letter list, if the queue's history
-- of that payload carries this id ('' for a dead letter without a
-- history): the id is what ties a letter of a shared list to this queue.
-- Redriven, it goes back where producers push as a new message. Returns
-- {1} when done, {0} when no such dead letter is there.

register('dead_one', function(KEYS, ARGV)
  local k = group(KEYS, 1)
  local r = rule(ARGV, 1)
  local redrive = ARGV[RULE_SIZE + 1] == 'R'
  local id, payload = ARGV[RULE_SIZE + 2], ARGV[RULE_SIZE + 3]
  if not is_list_or_none(k.dead) or (redrive and not is_list_or_none(k.q)) then
    return redis.error_reply(WRONGTYPE)
  end
  local raw = redis.call('HGET', k.history, history_key(payload))
  local known = ''
  if raw then
    local _, kid = cmsgpack.unpack(raw)
    known = tostring(kid)
  end
  if known ~= id or redis.call('LREM', k.dead, 1, payload) == 0 then return reply({ 0 }) end
  forget_dead(k, payload)
  if redrive then
    push_new(k, r, { payload })
    tally(k, 'redriven', 1)
  end
  return reply({ 1 })
end)
