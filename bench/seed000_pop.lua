-- Pop script of seed 000: "详解redis是如何实现队列消息的ack" (Daniel Cai,
-- 2019-11-05), /work/shared/seeds/000_a71d4ea0ba4cecc1.txt, as in the article
-- but for one adaptation: the current time comes from Redis `TIME` (ms)
-- instead of ARGV[2], so that a benchmark client needs no clock of its own.
-- ARGV[2] is left unread and ARGV[3] stays where the article has it:
--   EVALSHA <sha> 0 <qName> <unused> <considerAsFailMaxTimeSpan ms>
local not_empty = function(x)
 return (type(x) == "table") and (not x.err) and (#x ~= 0)
end

local qName = ARGV[1] --队列名称
local now = redis.call('TIME') -- adaptation: was `local currentTime = ARGV[2]`
local currentTime = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local considerAsFailMaxTimeSpan = ARGV[3] --超时时间设定,当消息超过一定时间还没有ack则认为此消息需要再次入队

local zsetName= qName ..'BACKUP'
local hashName= qName ..'CONTEXT'

local tmp = redis.call('ZRANGEBYSCORE',zsetName , '-INF', tonumber(currentTime) - tonumber(considerAsFailMaxTimeSpan), 'LIMIT', 0, 1)
if (not_empty(tmp)) then
 redis.call('ZREM', zsetName, tmp[1]) --此处拿出的为消息的唯一id
 redis.call('LPUSH', qName, redis.call('HGET', hashName, tmp[1]))
end
tmp = redis.call('RPOP', qName)
if (tmp) then
 local msg = cjson.decode(tmp)
 local id = msg['id']
 redis.call('ZADD', zsetName, tonumber(currentTime), id)
 redis.call('HSET',hashName , id, tmp)
end
return tmp
