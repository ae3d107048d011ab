-- scripts/take_move.lua: a move pop of one value (RPOPLPUSH, LMOVE and
-- their blocking forms, from one queue) on a rule that tracks no
-- connection, when nothing is due: the library's pop of that shape, for
-- the common case, run with EVALSHA for the reason release.lua gives. Its
-- placeholder for lua/lease_core.lua (that file's name in capitals, used
-- below) stands for that file made into a table of its helpers, as in
-- take.lua.
--
-- KEYS[1] the queue (list), KEYS[2] the prefix of its aux keys (see
--         CALL_KEYS in src/queue/library/keys.rs): its leases (zset),
--         lease records (msgs, hash), ids index (zset) and move leases
--         (mleases, zset) are the prefix and those names; KEYS[3] the
--         destination (list); with totals to add, KEYS[4] its stats hash.
-- ARGV[1] the end to pop ('L' | 'R'; 'l' | 'r': the same, and this call
--         makes the move leases set a skiplist), ARGV[2] the rule's lease
--         (ms), ARGV[3] the rule's JSON field of the ack id ('' = the
--         payload), ARGV[4] the end to push at ('L' | 'R'), ARGV[5] the
--         destination's part of the record: its length, '|' and its name
--         (made by the proxy, which saves Redis's Lua a number's
--         formatting); with totals to add, ARGV[6] deliveries and ARGV[7]
--         ACKs this proxy made that the stats hash does not count yet,
--         ARGV[8] the hash's time to live.
-- Returns 0, having changed nothing but the totals, when a lease is due or
-- a mark is set: the proxy then sends the library's pop, which knows the
-- rest. Else what take.lua returns: the value (the library pop's reply in
-- pop1's short form, see short_reply in common.lua), leased; nil when the
-- list is empty; or LMOVE's error (WRONGTYPE for a queue or, when the
-- queue holds a value, a destination of another type), nothing popped.

if KEYS[4] then
  redis.call('HINCRBY', KEYS[4], 'deliveries', ARGV[6])
  redis.call('HINCRBY', KEYS[4], 'acks', ARGV[7])
  redis.call('PEXPIRE', KEYS[4], ARGV[8])
end
local t = redis.call('TIME')
local us = t[2]
-- Redis's time in ms as text, padded only when the microseconds are short.
local now_text = t[1] .. (#us == 6 and string.sub(us, 1, 3) or string.sub(string.rep('0', 6 - #us) .. us, 1, 3))
if redis.call('ZRANGEBYSCORE', KEYS[2] .. 'leases', '-inf', now_text, 'LIMIT', '0', '1')[1] then return 0 end
local dest = KEYS[3]
-- Nothing due, no marks: no copy to skip, so the move is Redis's own,
-- its checks of both keys included.
local v = redis.pcall('LMOVE', KEYS[1], dest, (ARGV[1] == 'L' or ARGV[1] == 'l') and 'LEFT' or 'RIGHT',
  ARGV[4] == 'L' and 'LEFT' or 'RIGHT')
if v and v.err then return v end
if not v then return v end
-- The value's ack id and token (scripts/token.lua).
TAKE_TOKEN
-- new_lease's text record of a first delivery to a destination (see msgs
-- in common.lua); an LREM finds it by the payload's token.
local rec = '\193' .. now_text .. '|' .. ARGV[4] .. ARGV[5] .. (id == v and '|' or #id .. '|' .. id) .. v
local msgs = KEYS[2] .. 'msgs'
if redis.call('HSETNX', msgs, token, rec) == 0 then
  core = core or LEASE_CORE
  token = core.claim(msgs, KEYS[2] .. 'ids', token, rec)
end
-- Its deadline (scripts/deadline.lua).
local deadlines = KEYS[2] .. 'mleases'
TAKE_DEADLINE
return v
