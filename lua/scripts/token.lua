-- scripts/token.lua: not a script but the part every take script shares,
-- put in place of the line TAKE_TOKEN in each (see with_core in
-- src/queue/library/script.rs): the ack id and lease token of the popped
-- value v, with ARGV[3] the rule's JSON field ('' = the payload). It
-- leaves `field`, `id`, `token` and `core` (lease_core.lua's helpers, or
-- nil while none was needed) as locals of the script.
-- The common case without lease_core's helpers: each local function of a
-- script's head is a closure made again at every call. A string id at the
-- top level of the payload (or the payload itself), short and without ':',
-- is its own token (ack_id and id_key in lease_core.lua say the same).
local field, id, token = ARGV[3], nil, nil
if field == '' then
  id = v
else
  local ok, obj = pcall(cjson.decode, v)
  id = ok and type(obj) == 'table' and obj[field]
end
local core
if type(id) ~= 'string' then
  core = LEASE_CORE
  id = core.ack_id(v, field)
end
if #id <= 40 and not string.find(id, ':', 1, true) then
  token = 'j' .. id
else
  core = core or LEASE_CORE
  token = core.id_key(id)
end
