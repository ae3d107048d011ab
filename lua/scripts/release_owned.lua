-- scripts/release_owned.lua: ACK queue id, for one id of a lease this
-- proxy handed out on a rule that tracks the popping connection (ack =
-- 'next-pop', requeue_on_disconnect, hold = 'connection'), sent by that
-- connection. release.lua's work and the connection's entry for the lease
-- (owner_key in lua/lease_core.lua), run with EVALSHA for the reason
-- release.lua gives.
--
-- KEYS[1] the prefix of the queue's aux keys (see CALL_KEYS in
--         src/queue/library/keys.rs): its leases (zset), lease records
--         (msgs, hash) are the prefix and those names, the connection's
--         entries (zset) the prefix, 'o:' and the connection; with totals
--         to add, KEYS[2] its stats hash.
-- ARGV[1] the lease token of the ack id (id_key in lua/lease_core.lua,
--         made by the proxy), ARGV[2] the connection (owner); with totals
--         to add, ARGV[3] deliveries and ARGV[4] ACKs this proxy made that
--         the stats hash does not count yet, ARGV[5] the hash's time to
--         live (ms).
-- Returns 1 when the connection's plain lease with that token was released
-- (its record, deadline and owner entry removed, as the library's ack
-- does), else 0 and nothing but the totals changed: the proxy then sends
-- the library's ack, which knows the rest (another connection's lease, a
-- late ACK, a move lease).

if KEYS[2] then
  redis.call('HINCRBY', KEYS[2], 'deliveries', ARGV[3])
  redis.call('HINCRBY', KEYS[2], 'acks', ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
local mine = KEYS[1] .. 'o:' .. ARGV[2]
if redis.call('ZREM', mine, ARGV[1]) == 0 then return 0 end
if redis.call('ZREM', KEYS[1] .. 'leases', ARGV[1]) == 0 then
  redis.call('ZADD', mine, 0, ARGV[1])
  return 0
end
redis.call('HDEL', KEYS[1] .. 'msgs', ARGV[1])
return 1
