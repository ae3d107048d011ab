-- ACK script of seed 000: "详解redis是如何实现队列消息的ack" (Daniel Cai,
-- 2019-11-05), /work/shared/seeds/000_a71d4ea0ba4cecc1.txt, unchanged (the
-- one adaptation of the pair is in seed000_pop.lua: the time from `TIME`).
--   EVALSHA <sha> 0 <id> <qName>
local key = ARGV[1]
local qName=ARGV[2]
redis.call('ZREM', qName..'BACKUP', key)
redis.call('HDEL', qName..'CONTEXT', key)
