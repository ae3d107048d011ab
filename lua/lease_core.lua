-- lease_core.lua: what the function library and the scripts of
-- lua/scripts/ share: the ack id of a payload, its lease token, the claim
-- of that token in a queue's lease records, a record's fields, a move
-- lease's lookup by its copy, and a lease's removal. The library's text
-- starts with this one (see src/queue/library/mod.rs) and the scripts make
-- it into a table when they need it (script.rs), so a lease taken by
-- either is the same lease to the other. Only locals, no state. A queue k
-- is a table of its keys by name (group() in common.lua).

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

-- An older version's entry in ids for a move lease's copy in dest.
local function dest_key(dest, payload) return 'd' .. redis.sha1hex(dest .. '\0' .. payload) end

-- A connection's entries on queue k: its lease tokens, and '~'..retry key
-- for each lease of a next-pop rule that ran out while it held it (a late
-- mark). A sorted set of its own per connection, in the queue's slot, not
-- members of the shared ids index: Redis keeps a small sorted set as a
-- listpack searched from one end, so a next-pop pop, which replaces its
-- connection's one entry, would walk every connection's.
local function owner_key(k, owner) return k.prefix .. 'o:' .. owner end

-- The entry older versions kept in ids instead: 'o' owner '|' token or
-- late mark. A retry entry still keeps its late mark in this form (its
-- field late), which names the connection.
local function owned_key(owner, rest) return 'o' .. owner .. '|' .. rest end

-- Removes one of owner's entries; when its index has none, the entry an
-- older version may have left in ids.
local function unown(k, owner, entry)
  if redis.call('ZREM', owner_key(k, owner), entry) == 0 then
    redis.call('ZREM', k.ids, owned_key(owner, entry))
  end
end

-- Removes the late mark a retry entry keeps (its late field).
local function unmark_late(k, late)
  local bar = string.find(late, '|', 2, true)
  unown(k, string.sub(late, 2, bar - 1), string.sub(late, bar + 1))
end

local function is_duplicate(token) return string.byte(token, -DUP_DIGITS - 1) == 58 end

-- A lease record's fields, in the one order a packed record holds them
-- (and QUEUE LEASES shows them to the proxy, which reads them by this
-- list: src/queue/library/lease.rs): the payload, its ack id, deliveries
-- so far (this one included), the move destination ('' for none) and the
-- end it was pushed at, when the lease started (ms), NACKs and expiries
-- so far, when it was first delivered, the connection holding it ('' when
-- the rule tracks none), and, for a move lease that a NACK or a closed
-- connection ended, why it ends and the delay ('' = the rule's backoff),
-- then the deliveries that ended with the holder's connection closing (nil:
-- none), and for a move lease 0 when it has no entry under its destination
-- in ids (nil: an older version's, which has). Records written before the
-- history was kept lack the fields after started.
local LEASE_FIELDS = { 'payload', 'id', 'deliveries', 'dest', 'dest_end', 'started', 'nacks', 'expiries',
  'first', 'owner', 'why', 'delay', 'dc', 'indexed' }

-- A first plain delivery's record, by name.
local function first_delivery(payload, id, started)
  return { payload = payload, id = id, deliveries = 1, dest = '', dest_end = '', started = started,
    nacks = 0, expiries = 0, first = started, owner = '' }
end

-- The first byte of a move pop's or a tracked pop's text record (see msgs
-- in common.lua).
local MOVE_REC = '\193'
-- The second byte of a tracked pop's ('o'); a move pop's is a digit.
local OWNED = 111

-- The end of a move or tracked pop's text record, from index at:
-- '|'..payload when the payload is its own id, else #id..'|'..id..payload.
local function id_and_payload(raw, at)
  local bar = string.find(raw, '|', at, true)
  local idn = tonumber(string.sub(raw, at, bar - 1))
  if not idn then
    local payload = string.sub(raw, bar + 1)
    return payload, payload
  end
  return string.sub(raw, bar + 1, bar + idn), string.sub(raw, bar + idn + 1)
end

-- A lease record (a text one, a packed one of any version) as a table of
-- the fields of LEASE_FIELDS, by name.
local function lease_fields(raw)
  local c = string.byte(raw, 1)
  if c == 193 and string.byte(raw, 2) == OWNED then
    -- MOVE_REC..'o'..started..'|'..owner..'|'..(#id..'|'..id or '|')..payload
    local bar = string.find(raw, '|', 3, true)
    local bar2 = string.find(raw, '|', bar + 1, true)
    local l = first_delivery(nil, nil, tonumber(string.sub(raw, 3, bar - 1)))
    l.owner = string.sub(raw, bar + 1, bar2 - 1)
    l.id, l.payload = id_and_payload(raw, bar2 + 1)
    return l
  end
  if c == 193 then
    -- MOVE_REC..started..'|'..dest_end..#dest..'|'..dest..(#id..'|'..id or '|')..payload
    local bar = string.find(raw, '|', 2, true)
    local l = first_delivery(nil, nil, tonumber(string.sub(raw, 2, bar - 1)))
    l.dest_end = string.sub(raw, bar + 1, bar + 1)
    local bar2 = string.find(raw, '|', bar + 2, true)
    local at = bar2 + tonumber(string.sub(raw, bar + 2, bar2 - 1))
    l.dest = string.sub(raw, bar2 + 1, at)
    l.id, l.payload = id_and_payload(raw, at + 1)
    l.indexed = 0
    return l
  end
  if c == 115 or c == 116 then
    local bar = string.find(raw, '|', 2, true)
    local started = tonumber(string.sub(raw, 2, bar - 1))
    if c == 115 then
      local payload = string.sub(raw, bar + 1)
      return first_delivery(payload, payload, started)
    end
    local bar2 = string.find(raw, '|', bar + 1, true)
    local idn = tonumber(string.sub(raw, bar + 1, bar2 - 1))
    return first_delivery(string.sub(raw, bar2 + idn + 1), string.sub(raw, bar2 + 1, bar2 + idn), started)
  end
  local l = { cmsgpack.unpack(raw) }
  if l[4] == nil then
    -- The short form of a first plain delivery: payload, started[, id].
    return first_delivery(l[1], l[3] or l[1], l[2])
  end
  for i = 1, #LEASE_FIELDS do l[LEASE_FIELDS[i]] = l[i] end
  return l
end

-- Duplicates of one id looked at per call for a move lease's copy.
local DUPS_SCANNED = 1000

-- The leases whose copy of payload sits in dest (move pops), at most n:
-- {token, record (see lease_fields)} each, then the entries of older
-- versions' leases under dest in ids whose record is gone. A lease's token
-- is its payload's (field: the rule's), as for an ACK: one HGET in the
-- common case of one such lease; its duplicates (see claim) after it.
-- Leases of older versions were also indexed under dest: they are looked
-- for there when the tokens fall short (a changed field, say).
local function move_leases(k, dest, payload, field, n)
  local out, seen = {}, {}
  local function consider(token, raw)
    if not raw then return end
    local l = lease_fields(raw)
    if l.dest == dest and l.payload == payload then
      out[#out + 1] = { token, l }
      seen[token] = true
    end
  end
  local ik = id_key(ack_id(payload, field))
  consider(ik, redis.call('HGET', k.msgs, ik))
  if #out < n then
    local dups = redis.call('ZRANGEBYLEX', k.ids, '[' .. ik .. ':', '(' .. ik .. ';', 'LIMIT', 0, DUPS_SCANNED)
    for _, t in ipairs(dups) do
      if #out >= n then break end
      consider(t, redis.call('HGET', k.msgs, t))
    end
  end
  local gone = {}
  if #out < n then
    local dk = dest_key(dest, payload) .. '|'
    local members = redis.call('ZRANGEBYLEX', k.ids, '[' .. dk, '(' .. dk .. '\255', 'LIMIT', 0, n)
    for _, m in ipairs(members) do
      local t = string.sub(m, #dk + 1)
      if #out + #gone < n and not seen[t] then
        local raw = redis.call('HGET', k.msgs, t)
        if raw then
          out[#out + 1] = { t, lease_fields(raw) }
        else
          gone[#gone + 1] = m
        end
      end
    end
  end
  return out, gone
end

-- Removes every trace of lease l (see lease_fields), whose token is token.
local function drop(k, token, l)
  local dest, owner = l.dest, l.owner
  redis.call('ZREM', dest == '' and k.leases or k.mleases, token)
  redis.call('HDEL', k.msgs, token)
  if is_duplicate(token) then redis.call('ZREM', k.ids, token) end
  if dest ~= '' and l.indexed ~= 0 then redis.call('ZREM', k.ids, dest_key(dest, l.payload) .. '|' .. token) end
  if owner and owner ~= '' then unown(k, owner, token) end
end
