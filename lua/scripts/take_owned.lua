-- scripts/take_owned.lua: a pop of one value (RPOP/LPOP queue, no count)
-- from a queue whose rule tracks the popping connection (ack =
-- 'next-pop', requeue_on_disconnect, hold = 'connection'), when nothing
-- is due: the library's pop of that shape, for the common case, run with
-- EVALSHA for the reason release.lua gives. A next-pop pop first
-- acknowledges the connection's one earlier lease there, as the library's
-- release_owned does. Its placeholder for lua/lease_core.lua (that file's
-- name in capitals, used below) stands for that file made into a table of
-- its helpers, as in take.lua.
--
-- KEYS[1] the queue (list), KEYS[2] the prefix of its aux keys (see
--         CALL_KEYS in src/queue/library/keys.rs): its leases (zset),
--         lease records (msgs, hash) and ids index (zset) are the prefix
--         and those names, the connection's entries (zset, owner_key in
--         lua/lease_core.lua) the prefix, 'o:' and the connection; with
--         totals to add, KEYS[3] its stats hash.
-- ARGV[1] the end to pop ('L' | 'R'; 'l' | 'r': the same, and this call
--         makes the leases set a skiplist), ARGV[2] the rule's lease (ms),
--         ARGV[3] the rule's JSON field of the ack id ('' = the payload),
--         ARGV[4] the connection (owner), ARGV[5] '1' to acknowledge its
--         earlier lease first (a next-pop pop), else '0', ARGV[6] the token
--         of the one lease the proxy knows the connection holds there, from
--         its last pop ('' when it does not know; see
--         src/queue/leases/held.rs); with totals to add, ARGV[7]
--         deliveries and ARGV[8] ACKs this proxy made that the stats hash
--         does not count yet, ARGV[9] the hash's time to live.
-- Returns 0, having changed nothing but the totals, when a lease is due or
-- a mark is set, or when what the connection held there is not one plain
-- lease still running (late ones, several, a move lease): the proxy then
-- sends the library's pop, which knows the rest.
-- Else the value, leased, or nil when the list is empty, when the pop did
-- what ARGV[5] asked (acknowledged the connection's earlier lease if '1');
-- the same in an array of one ({value} or {false}) when ARGV[5] is '1' and
-- the connection held no lease there to acknowledge. (A table reply costs
-- Redis more than most of a pop's commands; nearly every next-pop pop
-- acknowledges one.) Or a pop's error (a key of another type), the
-- acknowledgement made.

if KEYS[3] then
  redis.call('HINCRBY', KEYS[3], 'deliveries', ARGV[7])
  redis.call('HINCRBY', KEYS[3], 'acks', ARGV[8])
  redis.call('PEXPIRE', KEYS[3], ARGV[9])
end
local t = redis.call('TIME')
local us = t[2]
-- Redis's time in ms as text, padded only when the microseconds are short.
local now_text = t[1] .. (#us == 6 and string.sub(us, 1, 3) or string.sub(string.rep('0', 6 - #us) .. us, 1, 3))
local leases, msgs, ids = KEYS[2] .. 'leases', KEYS[2] .. 'msgs', KEYS[2] .. 'ids'
if redis.call('ZRANGEBYSCORE', leases, '-inf', now_text, 'LIMIT', '0', '1')[1] then return 0 end
local owner = ARGV[4]
local mine = KEYS[2] .. 'o:' .. owner
local acked = false
-- The connection's one lease the proxy named: no entry for it means it
-- holds it no more (it ran out, or was acknowledged), and the lookup below
-- says what the connection holds instead.
local held = ARGV[6]
if ARGV[5] == '1' and held ~= '' and redis.call('ZREM', mine, held) == 1 then
  if redis.call('ZREM', leases, held) == 0 then
    -- Not a plain lease: the library's to end.
    redis.call('ZADD', mine, 0, held)
    return 0
  end
  redis.call('HDEL', msgs, held)
  if string.find(held, ':', 1, true) then redis.call('ZREM', ids, held) end
  acked = true
elseif ARGV[5] == '1' then
  local owned = redis.call('ZRANGE', mine, 0, 1)
  if owned[2] then return 0 end
  local token = owned[1]
  if token then
    -- '~': a lease that ran out, its message back in the list (a late
    -- acknowledgement); not in the leases set: a move lease, or gone.
    if string.byte(token, 1) == 126 or redis.call('ZREM', leases, token) == 0 then return 0 end
    redis.call('HDEL', msgs, token)
    redis.call('ZREM', mine, token)
    -- A duplicate's token (see claim in lease_core.lua) is indexed too.
    if string.find(token, ':', 1, true) then redis.call('ZREM', ids, token) end
    acked = true
  end
end
local v = redis.pcall((ARGV[1] == 'L' or ARGV[1] == 'l') and 'LPOP' or 'RPOP', KEYS[1])
if v and v.err then return v end
if not v then
  if acked or ARGV[5] ~= '1' then return v end
  return { v }
end
-- The value's ack id and token (scripts/token.lua).
TAKE_TOKEN
-- new_lease's text record of a first delivery with an owner (owned_text
-- in common.lua).
local rec = '\193o' .. now_text .. '|' .. owner .. '|' .. (id == v and '|' or #id .. '|' .. id) .. v
if redis.call('HSETNX', msgs, token, rec) == 0 then
  core = core or LEASE_CORE
  token = core.claim(msgs, ids, token, rec)
end
-- Its deadline (scripts/deadline.lua).
local deadlines = leases
TAKE_DEADLINE
redis.call('ZADD', mine, 0, token)
if acked or ARGV[5] ~= '1' then return v end
return { v }
