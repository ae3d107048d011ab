-- scripts/take.lua: a pop of one value (RPOP/LPOP queue, no count) from a
-- queue whose rule tracks no connection, when nothing is due. Run with
-- EVALSHA, not from the function library, for the reason release.lua
-- gives. Its placeholder for lua/lease_core.lua (that file's name in
-- capitals, used below) stands for the file made into a table of its
-- helpers ack_id, id_key and claim (see src/queue/library/script.rs),
-- made only on the paths that need them.
--
-- KEYS[1] the queue (list), KEYS[2] the prefix of its aux keys (see
--         CALL_KEYS in src/queue/library/keys.rs): its leases (zset),
--         lease records (msgs, hash) and ids index (zset) are the prefix
--         and those names; with totals to add, KEYS[3] its stats hash.
-- ARGV[1] the end to pop ('L' | 'R'; 'l' | 'r': the same, and this call
--         makes the leases set a skiplist), ARGV[2] the rule's lease (ms),
--         ARGV[3] the rule's JSON field of the ack id ('' = the payload);
--         with totals to add, ARGV[4] deliveries and ARGV[5] ACKs this
--         proxy made (this, release.lua) that the stats hash does not
--         count yet, ARGV[6] the stats hash's time to live (ms).
-- Returns 0, having changed nothing but the totals, when a lease is due
-- or a mark is set (see the marks in common.lua): the proxy then sends
-- the library's pop1, which knows the rest. Else what the pop gives: nil
-- for an empty list, the error for a key of another type, or the value,
-- leased exactly as the library's first delivery by a plain pop
-- (new_lease's text record).

if KEYS[3] then
  redis.call('HINCRBY', KEYS[3], 'deliveries', ARGV[4])
  redis.call('HINCRBY', KEYS[3], 'acks', ARGV[5])
  redis.call('PEXPIRE', KEYS[3], ARGV[6])
end
local t = redis.call('TIME')
local us = t[2]
-- Redis's time in ms as text, padded only when the microseconds are short.
local now_text = t[1] .. (#us == 6 and string.sub(us, 1, 3) or string.sub(string.rep('0', 6 - #us) .. us, 1, 3))
local leases, msgs = KEYS[2] .. 'leases', KEYS[2] .. 'msgs'
if redis.call('ZRANGEBYSCORE', leases, '-inf', now_text, 'LIMIT', '0', '1')[1] then return 0 end
local v = redis.pcall((ARGV[1] == 'L' or ARGV[1] == 'l') and 'LPOP' or 'RPOP', KEYS[1])
if not v or v.err then return v end
-- The value's ack id and token (scripts/token.lua).
TAKE_TOKEN
local rec
if id == v then
  rec = 's' .. now_text .. '|' .. v
else
  rec = 't' .. now_text .. '|' .. #id .. '|' .. id .. v
end
if redis.call('HSETNX', msgs, token, rec) == 0 then
  -- Another message with this id is in flight: claim gives it a token of
  -- its own.
  core = core or LEASE_CORE
  token = core.claim(msgs, KEYS[2] .. 'ids', token, rec)
end
-- Its deadline (scripts/deadline.lua).
local deadlines = leases
TAKE_DEADLINE
return v
