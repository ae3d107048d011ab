-- scripts/deadline.lua: not a script but the part every take script ends
-- with, put in place of the line TAKE_DEADLINE in each (see with_core in
-- src/queue/library/script.rs): the lease `token` of the value popped at
-- `now_text` gets its deadline in the lease set named `deadlines`, the
-- rule's lease (ARGV[2]) from now. When ARGV[1], the end letter, is lower
-- case (the proxy's turn, now and then), a member longer than a listpack
-- holds makes the set a skiplist, which it stays once the member is gone
-- (see SKIPLIST_MARK there).
local deadline = string.format('%d', now_text + ARGV[2])
if ARGV[1] == 'l' or ARGV[1] == 'r' then
  redis.call('ZADD', deadlines, deadline, token, 'inf', SKIPLIST_MARK)
  redis.call('ZREM', deadlines, SKIPLIST_MARK)
else
  redis.call('ZADD', deadlines, deadline, token)
end
