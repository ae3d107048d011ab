-- scripts/release.lua: ACK queue id, for one id of a lease this proxy
-- handed out, on a rule that tracks no connection. Run with EVALSHA, not
-- from the function library: Redis's function engine keeps every library
-- in one Lua heap and steps its collector every 50 calls, so an FCALL on
-- a heap the size of the library costs Redis more than the two commands
-- this needs (see src/queue/library/script.rs and bench/RESULTS.md).
--
-- KEYS[1] the prefix of the queue's aux keys (see CALL_KEYS in
--         src/queue/library/keys.rs): its leases (zset) and lease records
--         (msgs, hash) are the prefix and those names; with totals to add,
--         KEYS[2] its stats hash.
-- ARGV[1] the lease token of the ack id (id_key in lua/lease_core.lua,
--         made by the proxy: library::keys::id_key); with totals to add,
--         ARGV[2] deliveries and ARGV[3] ACKs this proxy made (take.lua,
--         this) that the stats hash does not count yet, ARGV[4] the stats
--         hash's time to live (ms).
-- Returns 1 when a plain lease with that id was released (its lease
-- record and deadline removed, as the library's ack does for a lease with
-- no destination and no connection), else 0 and nothing but the totals
-- changed: the proxy then sends the library's ack, which knows the rest
-- (late ACKs, duplicates, move leases, leases of older versions).

if KEYS[2] then
  redis.call('HINCRBY', KEYS[2], 'deliveries', ARGV[2])
  redis.call('HINCRBY', KEYS[2], 'acks', ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
if redis.call('ZREM', KEYS[1] .. 'leases', ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[1] .. 'msgs', ARGV[1])
return 1
