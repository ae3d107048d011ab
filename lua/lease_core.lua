-- lease_core.lua: what the function library and scripts/take.lua share:
-- the ack id of a payload, its lease token, and the claim of that token in
-- a queue's lease records. Both texts start with this one (see
-- src/queue/library/mod.rs and script.rs), so a lease taken by either is
-- the same lease to the other. Only locals, no state: as the head of a
-- script it runs at every call.

-- The ack id of a payload. A payload that is not a JSON object, or lacks
-- the field, is its own id: it is still leased, never refused. A string
-- field is its decoded value; a number is its text as written.
-- A field name with dots that is not a top-level key is a path into nested
-- objects (`properties.delivery_tag`, `headers.id`): job frameworks keep
-- their ids there.
local function ack_id(payload, field)
  if field == '' then return payload end
  local ok, obj = pcall(cjson.decode, payload)
  if not ok or type(obj) ~= 'table' then return payload end
  local v = obj[field]
  if type(v) == 'string' then return v end
  -- Numbers and dotted paths need raw_field: the text of field's value at
  -- the top level of the JSON object s (already accepted by cjson), the
  -- last occurrence winning as in cjson's table. Made here, not at the
  -- head: a script headed by this file makes each of its local functions
  -- at every call.
  local function raw_field(s, field)
    -- JSON scanning, for the text of a number exactly as written: cjson
    -- turns 1234567890123456789 into a double, and two ids 1 apart would
    -- collide.
    local function skip_ws(s, i) return string.find(s, '[^ \t\r\n]', i) or (#s + 1) end

    -- The index after the JSON string that starts at i.
    local function string_end(s, i)
      local j = i + 1
      while true do
        local q = string.find(s, '["\\]', j)
        if not q then return nil end
        if string.byte(s, q) == 34 then return q + 1 end
        j = q + 2
      end
    end

    -- The index after the JSON value that starts at i.
    local function value_end(s, i)
      local c = string.sub(s, i, i)
      if c == '"' then return string_end(s, i) end
      if c == '{' or c == '[' then
        local depth, j = 0, i
        while true do
          j = string.find(s, '[%[%]{}"]', j)
          if not j then return nil end
          local d = string.sub(s, j, j)
          if d == '"' then
            j = string_end(s, j)
            if not j then return nil end
          else
            depth = depth + ((d == '{' or d == '[') and 1 or -1)
            j = j + 1
            if depth == 0 then return j end
          end
        end
      end
      local _, e = string.find(s, '^[-+%w%.]+', i)
      return e and e + 1
    end

    local i = skip_ws(s, 1)
    if string.sub(s, i, i) ~= '{' then return nil end
    i = skip_ws(s, i + 1)
    local found
    while string.sub(s, i, i) == '"' do
      local kend = string_end(s, i)
      if not kend then return found end
      local key = string.sub(s, i + 1, kend - 2)
      if string.find(key, '\\', 1, true) then
        local ok, k = pcall(cjson.decode, string.sub(s, i, kend - 1))
        key = ok and k or nil
      end
      i = skip_ws(s, skip_ws(s, kend) + 1)
      local vend = value_end(s, i)
      if not vend then return found end
      if key == field then found = string.sub(s, i, vend - 1) end
      i = skip_ws(s, vend)
      if string.sub(s, i, i) ~= ',' then break end
      i = skip_ws(s, i + 1)
    end
    return found
  end
  if v == nil and string.find(field, '.', 1, true) then
    v = obj
    for part in string.gmatch(field, '[^.]+') do
      if type(v) ~= 'table' then return payload end
      v = v[part]
    end
    if type(v) == 'number' then
      local raw = payload
      for part in string.gmatch(field, '[^.]+') do raw = raw and raw_field(raw, part) end
      return raw or tostring(v)
    end
    if type(v) == 'string' then return v end
    return payload
  end
  if type(v) == 'number' then return raw_field(payload, field) or tostring(v) end
  return payload
end

-- The token of an ack id: the id itself when it is short and has no ':'
-- (which starts a duplicate's suffix), else its SHA1. Hashing every id cost
-- a pop and an ACK more than any command they make.
local SHORT_ID = 40
local function id_key(id)
  if #id <= SHORT_ID and not string.find(id, ':', 1, true) then return 'j' .. id end
  return 'i' .. redis.sha1hex(id)
end

-- A duplicate's token: its id's, then ':' and DUP_DIGITS digits.
local DUP_DIGITS = 12

-- Writes lease record rec under token in msgs (hash) and gives the token
-- it went under: token, or when another message with the same id is in
-- flight, a token of its own one past the highest in flight, indexed in
-- ids (zset), so any number of duplicates fit.
local function claim(msgs, ids, token, rec)
  if redis.call('HSETNX', msgs, token, rec) == 1 then return token end
  local last = redis.call('ZREVRANGEBYLEX', ids, '(' .. token .. ';', '[' .. token .. ':', 'LIMIT', 0, 1)[1]
  local seq = 1
  if last then seq = (tonumber(string.sub(last, #token + 2)) or 0) + 1 end
  token = token .. ':' .. string.format('%0' .. DUP_DIGITS .. 'd', seq)
  redis.call('HSET', msgs, token, rec)
  redis.call('ZADD', ids, 0, token)
  return token
end
