-- common.lua: the helpers of the ackproxy function library. The library
-- is one text loaded with FUNCTION LOAD (see src/queue/library/mod.rs): a
-- prelude generated from the calling convention (group(keys, i),
-- rule(args, i), GROUP_SIZE, RULE_SIZE, event_names(), STATS_TTL_MS, the
-- per-call bounds and LIB, the library's version), then lease_core.lua
-- (the ack id, the token and its claim), then this file, then one
-- file per operation, each registering one function with register(). The
-- whole text runs once, at load: helpers are built once, not per call.
--
-- A queue arrives as a group of GROUP_SIZE consecutive KEYS: the queue, the
-- prefix of its aux keys and its dead-letter list, read with group(KEYS, i),
-- which names every key of the queue: q (list), leases (zset), mleases
-- (zset), msgs (hash), ids (zset), retry (hash), dead (list), delayed
-- (zset), stats (hash), history (hash), poison (zset) (an aux key's name is
-- made when first read); `base` is i. A queue's rule arrives as RULE_SIZE ARGV (one
-- MessagePack sequence), read with rule(ARGV, i), which decodes each rule
-- version once and keeps it:
-- lease, max, field ('' = whole payload), redeliver ('next' | 'last'),
-- pop_end ('L' | 'R'), backoff ('none' | 'fixed' | 'exp'), base, cap (ms),
-- jitter (0..1), dead_max (0: no limit), ack ('explicit' | 'next-pop'),
-- track (1: record which connection holds each lease), shadow (1: nothing
-- is redelivered, only counted), hold (1: the proxy renews the leases of
-- open connections, see hold.lua), max_hold (ms: no lease is renewed past
-- this long after its delivery), poison (disconnect-ended deliveries that
-- flag a message, 0: never).
--
-- A lease's token is its id key (see id_key: 'j'..ack_id for a short id
-- without ':', else 'i'..sha1(ack_id)): ACK finds it without an index. A
-- second message with the same id in flight gets the token id key..':'..seq
-- (seq DUP_DIGITS digits, one more than the highest in flight), which is
-- indexed in ids.
-- msgs: token -> cmsgpack(the fields of LEASE_FIELDS, in its order),
--       or, for a first delivery by a plain pop on a rule that does not
--       track connections (the common case), text (packing it cost a pop
--       more than any command it makes): 's'..started_ms..'|'..payload
--       when the payload is its own ack id, else
--       't'..started_ms..'|'..#ack_id..'|'..ack_id..payload; for a first
--       delivery by a move pop on such a rule MOVE_REC..started_ms
--       ..'|'..dest_end..#dest..'|'..dest..#ack_id..'|'..ack_id..payload,
--       #ack_id left empty when the payload is its own ack id; and for a
--       first delivery by a plain pop on a rule that tracks connections
--       MOVE_REC..'o'..started_ms..'|'..owner..'|'..#ack_id..'|'..ack_id
--       ..payload, likewise. MOVE_REC is the byte 0xC1, which MessagePack
--       never uses: a proxy of a version before these records refuses one
--       (an error, nothing changed) rather than reading its text as
--       numbers. (A packed record starts with a string's header, never
--       's', 't' or 0xC1.) An older version's short form,
--       cmsgpack(payload, started_ms[, ack_id]), may still be in flight.
--       lease_fields() reads them all.
-- leases: besides the lease tokens, two marks, so that a pop learns with
--       the one ZRANGEBYSCORE it makes anyway whether anything else needs
--       looking at: RETRY_MARK (score 0) while retry holds anything,
--       DELAYED_MARK (score: when the earliest delayed message is due, or
--       earlier) while delayed does. (The take scripts of lua/scripts/
--       make it, and mleases, a skiplist now and then: see
--       scripts/deadline.lua.)
-- ids:  score 0, members: the longer tokens; for move leases of older
--       versions (whose record's field `indexed` is nil)
--       'd'..sha1(dest.."\0"..payload)..'|'..token (an LREM now finds a
--       move lease by its payload's token, as an ACK does); 'c'..retry key
--       while that retry entry holds skip marks. (Older versions kept the
--       entries of owner_key here too: see owned_key.)
-- prefix..'o:'..owner, on rules that track connections (owner_key in
--       lease_core.lua): score 0, members: the tokens of the leases that
--       client connection took, and '~'..retry key for one of a next-pop
--       rule that ran out, whose message is back in the list. An owner is
--       a proxy-wide connection name without '|'.
-- retry: id key -> cmsgpack(copies back in the list, deliveries,
--        copies cancelled by a late ACK, the last payload requeued, nacks,
--        expiries, first delivery, delayed member of a copy waiting for its
--        backoff or false, late-ACK member or false, disconnects, then per
--        body requeued: payload, copies, cancelled copies, in one flat
--        array);
--        '#cancelled' -> cancelled copies still in the list, all ids together.
-- delayed: score = when due (ms), member = a 15-digit sequence number, a
--        flag ('p': enters where producers push, 'n': where consumers pop),
--        then the payload, so any number of identical payloads can wait.
-- stats: event name -> total (see src/queue/library/tally.rs); '#seq' -> the last
--        sequence number of delayed.
-- history: 'h'..sha1(payload) -> cmsgpack(copies of payload in the dead
--        letter list, ack id, deliveries, nacks, expiries, first and last
--        delivery (ms), last reason, when dead-lettered (ms)); at most
--        DEAD_HISTORY of them.
-- poison: score = when flagged (ms), member = the id key of a message
--        flagged as poison (see expire); an index only: whether the message
--        is still there and still poison is read from its lease or retry
--        entry (poison_ids), and entries that are not are removed then. The
--        ACK and pop paths never touch it.
--
-- Every function returns reply(result): what it tallied (see tally below),
-- for the proxy's counters, and its result, in one flat array.

local PAD6 = { '00000', '0000', '000', '00', '0', '' }

-- Redis's clock in ms, as a number and as text: a number handed to
-- redis.call is formatted with %.17g, which costs more than the command.
-- The last time read and its text, which ms_text gives again for free.
local NOW_N, NOW_TEXT = nil, nil
local function now_ms()
  local t = redis.call('TIME')
  local us = t[2]
  local text = t[1] .. string.sub(PAD6[#us] .. us, 1, 3)
  -- Arithmetic reads the digits as tonumber would, without a C call
  -- (each costs Redis's Lua about as much as making a small table).
  NOW_N, NOW_TEXT = text + 0, text
  return NOW_N, text
end

-- An integral number of ms as redis.call's argument (cheaper than %.17g).
local function ms_text(n)
  if n == NOW_N then return NOW_TEXT end
  return string.format('%d', n)
end

local WRONGTYPE = 'WRONGTYPE Operation against a key holding the wrong kind of value'
local CANCELLED = '#cancelled'
local RETRY_MARK = '~r'
local DELAYED_MARK = '~d'

local function is_mark(member) return member == RETRY_MARK or member == DELAYED_MARK end

-- The delayed set holds a message due at `due`: a pop must look at it then.
local function mark_delayed(k, due)
  redis.call('ZADD', k.leases, 'LT', due, DELAYED_MARK)
end

-- What this call did, as flat (group base, event number, amount) triples,
-- and the stats hashes whose time to live it renews. Library locals live
-- as long as the library: register() starts every call with them empty.
-- TOUCHED_ANY says whether TOUCHED holds anything: next(), which ran
-- twice per call, is a C call, and those cost more than plain Lua.
local TALLIED = {}
local TOUCHED, TOUCHED_ANY = {}, false

-- Stats hash `key` gets its time to live renewed at the end of the call.
local function touch(key)
  TOUCHED[key], TOUCHED_ANY = true, true
end

-- Counts n of event `name` (one of event_names()) for queue k: in its
-- stats hash at once (so an error later in the call does not lose it) and
-- in the reply. A count that created the hash (or its field) renews the
-- hash's time to live.
local function tally(k, name, n)
  if not n or n == 0 then return end
  if redis.call('HINCRBY', k.stats, name, n) == n then
    touch(k.stats)
  end
  local at = #TALLIED
  TALLIED[at + 1], TALLIED[at + 2], TALLIED[at + 3] = k.base, EVENT[name], n
end

-- The totals of the events every pop and ACK has (deliveries, acks) are
-- kept here, in the library, between calls, and written to the stats hash
-- in batches: by a call that finds PENDING_WRITE_AT of them, by the
-- reaper's next look at the queue, and before QUEUE INFO reads them.
-- Writing them at every call cost a pop and an ACK a third of their
-- commands. A FUNCTION FLUSH or a restart of Redis loses what is not
-- written yet (fewer than PENDING_WRITE_AT per event and queue).
-- The library is one for every database, and a queue's stats hash has the
-- same name in each: the unwritten totals of a call made in another
-- database than 0 are kept under that database's number and the name
-- (DB, set by the call, see register), so that they are written in the
-- database they were counted in.
local PENDING, PENDING_N, PENDING_KEYS = {}, {}, 0
local DB = nil
local PENDING_WRITE_AT = 100
-- Queues with unwritten totals at most; past it counts are written at once.
local PENDING_MAX_KEYS = 10000

-- Writes the unwritten totals of queue k to its stats hash.
local function write_pending(k)
  local key = k.stats
  local at = DB and DB .. key or key
  local p = PENDING[at]
  if not p then return end
  PENDING[at], PENDING_N[at], PENDING_KEYS = nil, nil, PENDING_KEYS - 1
  for name, n in pairs(p) do redis.call('HINCRBY', key, name, n) end
  touch(key)
end

-- Counts n of a common event (see PENDING) for queue k, in the reply at
-- once and in the stats hash in a batch.
local function tally_soon(k, name, n)
  if not n or n == 0 then return end
  local at = #TALLIED
  TALLIED[at + 1], TALLIED[at + 2], TALLIED[at + 3] = k.base, EVENT[name], n
  local key = k.stats
  local at = DB and DB .. key or key
  local p = PENDING[at]
  if not p then
    if PENDING_KEYS >= PENDING_MAX_KEYS then
      redis.call('HINCRBY', key, name, n)
      touch(key)
      return
    end
    p = {}
    PENDING[at], PENDING_N[at], PENDING_KEYS = p, 0, PENDING_KEYS + 1
  end
  p[name] = (p[name] or 0) + n
  PENDING_N[at] = PENDING_N[at] + n
  if PENDING_N[at] >= PENDING_WRITE_AT then write_pending(k) end
end

-- The reply of every function, one flat array (each nested table costs
-- Redis about as much to send as a small command): {m, events..., result},
-- where the m values after the first are the events (see tally) and the
-- result follows them: spread out when it is a table (m >= 0), as one
-- element when it is not (-m - 1 events; false stands for nil, which would
-- end the array). src/queue/library/tally.rs reads it back.
local function reply(result)
  if TOUCHED_ANY then
    for key in pairs(TOUCHED) do redis.call('PEXPIRE', key, STATS_TTL_MS) end
  end
  local n = #TALLIED
  local out
  if type(result) == 'table' then
    out = { n }
    for i = 1, n do out[i + 1] = TALLIED[i] end
    for i = 1, #result do out[n + 1 + i] = result[i] end
  else
    out = { -n - 1 }
    for i = 1, n do out[i + 1] = TALLIED[i] end
    if result == nil then result = false end
    out[n + 2] = result
  end
  return out
end

-- The reply of pop1 and ack in their common case: `value` alone (the
-- popped value; the lease's start) when the call tallied just the one
-- event that value implies (pop1's delivery of one value, ack's release of
-- one lease) and renewed no stats hash; else reply(result). A table in the
-- reply costs Redis about as much as a small command, and these two run
-- once each for every message. src/queue/library/tally.rs puts the event back.
local function short_reply(value, result)
  if #TALLIED == 3 and not TOUCHED_ANY then return value end
  return reply(result)
end

-- Registers operation `op` as the function ackq_<op>_<LIB>: the version in
-- the name lets two proxy versions share a Redis during a rolling upgrade.
-- Calls made in another database than 0 go to ackq_<op>_db_<LIB>, with the
-- database's number as their last argument (see PENDING).
local function register(op, f)
  redis.register_function('ackq_' .. op .. '_' .. LIB, function(keys, args)
    -- Emptied in place: a new table every call is garbage Redis's Lua
    -- collects, at a cost that grows with the library's size.
    for i = #TALLIED, 1, -1 do TALLIED[i] = nil end
    if TOUCHED_ANY then TOUCHED, TOUCHED_ANY = {}, false end
    DB = nil
    return f(keys, args)
  end)
  redis.register_function('ackq_' .. op .. '_db_' .. LIB, function(keys, args)
    for i = #TALLIED, 1, -1 do TALLIED[i] = nil end
    if TOUCHED_ANY then TOUCHED, TOUCHED_ANY = {}, false end
    DB = args[#args] .. '|'
    args[#args] = nil
    return f(keys, args)
  end)
end

local function is_list_or_none(key)
  local t = redis.call('TYPE', key)['ok']
  return t == 'list' or t == 'none'
end

-- Pushes vals (at most a few hundred) where producers push, so that
-- vals[1] is popped first, as a plain LPUSH of them in order would.
local function push_new(k, r, vals)
  if #vals > 0 then redis.call(r.pop_end == 'R' and 'LPUSH' or 'RPUSH', k.q, unpack(vals)) end
end

-- Puts payload in the delayed set, due at `due` (ms). flag 'p': it will
-- enter the list where producers push. Returns its member.
local SEQ_DIGITS = 15
local function delay(k, payload, due, flag)
  while true do
    -- The counter restarts if the stats hash expired: NX keeps a member
    -- still waiting from being overwritten, and the next number is tried.
    local seq = redis.call('HINCRBY', k.stats, '#seq', 1)
    touch(k.stats)
    local m = string.format('%0' .. SEQ_DIGITS .. '.0f', seq % 1e15) .. flag .. payload
    if redis.call('ZADD', k.delayed, 'NX', due, m) == 1 then
      mark_delayed(k, due)
      return m
    end
  end
end

-- Values pushed per command, well below Lua's unpack limit.
local PUSH_CHUNK = 100

-- Puts payloads (at most PUSH_CHUNK) in the delayed set, all due at `due`,
-- in order: one counter increment and one ZADD for all of them.
local function delay_all(k, payloads, due, flag)
  if #payloads == 0 then return end
  local last = redis.call('HINCRBY', k.stats, '#seq', #payloads)
  touch(k.stats)
  local members = {}
  for i, p in ipairs(payloads) do
    members[i] = string.format('%0' .. SEQ_DIGITS .. '.0f', (last - #payloads + i) % 1e15) .. flag .. p
  end
  -- A member still waiting under the same number (the counter restarted)
  -- is not overwritten: that payload goes in on its own with a fresh one.
  local taken = redis.call('ZMSCORE', k.delayed, unpack(members))
  local args = {}
  for i, m in ipairs(members) do
    if taken[i] then
      delay(k, payloads[i], due, flag)
    else
      args[#args + 1] = due
      args[#args + 1] = m
    end
  end
  if #args > 0 then
    redis.call('ZADD', k.delayed, unpack(args))
    mark_delayed(k, due)
  end
end

-- Pushes vals[from or 1], vals[from + 1], ... (any number) where producers
-- push, so that the first is popped first, as LPUSH of them in order would.
local function push_all_new(k, r, vals, from)
  local chunk = {}
  for i = from or 1, #vals do
    chunk[#chunk + 1] = vals[i]
    if #chunk == PUSH_CHUNK then
      push_new(k, r, chunk)
      chunk = {}
    end
  end
  push_new(k, r, chunk)
end

-- Pushes vals (any number) at the end consumers pop from, so that vals[1]
-- is popped first: the last one is pushed first.
local function push_all_next(k, r, vals)
  local cmd = r.pop_end == 'R' and 'RPUSH' or 'LPUSH'
  local i = #vals
  while i >= 1 do
    local chunk = {}
    for j = i, math.max(1, i - PUSH_CHUNK + 1), -1 do chunk[#chunk + 1] = vals[j] end
    redis.call(cmd, k.q, unpack(chunk))
    i = i - PUSH_CHUNK
  end
end

-- Moves up to n messages due by `now` from the delayed set into the list,
-- the earliest due first, so that they are popped in the order they fell
-- due: new messages ('p') where producers push, redeliveries of a
-- redeliver = 'next' rule ('n') where consumers pop. Nothing moves while
-- the list key holds another type (the pop then reports WRONGTYPE).
-- Returns how many moved.
local function promote(k, r, now, n)
  if n < 1 then return 0 end
  local due = redis.call('ZRANGEBYSCORE', k.delayed, '-inf', now, 'LIMIT', 0, n)
  if #due == 0 or not is_list_or_none(k.q) then return 0 end
  local new, next = {}, {}
  for _, m in ipairs(due) do
    local into = string.byte(m, SEQ_DIGITS + 1) == 110 and next or new
    into[#into + 1] = string.sub(m, SEQ_DIGITS + 2)
  end
  push_all_new(k, r, new)
  push_all_next(k, r, next)
  -- Everything due has a lower score than anything not due: the ones just
  -- read are the lowest ranks.
  redis.call('ZREMRANGEBYRANK', k.delayed, 0, #due - 1)
  tally(k, 'promoted', #due)
  return #due
end

-- Moves what is due (see promote), then puts the delayed mark at the next
-- due time, or removes it when nothing waits.
local function promote_and_mark(k, r, now, n)
  local moved = promote(k, r, now, n)
  local first = redis.call('ZRANGE', k.delayed, 0, 0, 'WITHSCORES')
  if first[2] then
    redis.call('ZADD', k.leases, first[2], DELAYED_MARK)
  else
    redis.call('ZREM', k.leases, DELAYED_MARK)
  end
  return moved
end

-- The token the library gave the id before short ids kept theirs, for
-- leases taken by an older proxy during a rolling upgrade.
local function legacy_id_key(id)
  if #id <= SHORT_ID and not string.find(id, ':', 1, true) then return 'i' .. redis.sha1hex(id) end
  return nil
end

-- The tokens of the leases with this id key: the plain one first, then up
-- to n - 1 duplicates.
local function tokens_of(k, ik, n)
  local out = {}
  if redis.call('HEXISTS', k.msgs, ik) == 1 then out[1] = ik end
  if #out < n then
    local dups = redis.call('ZRANGEBYLEX', k.ids, '[' .. ik .. ':', '(' .. ik .. ';', 'LIMIT', 0, n - #out)
    for _, t in ipairs(dups) do out[#out + 1] = t end
  end
  return out
end

-- A lease record packed in the order of LEASE_FIELDS, from a table of them
-- by name; what is nil at the end is left out.
local PACKED = {}
local function pack_lease(l)
  local n = 0
  for i = 1, #LEASE_FIELDS do
    local v = l[LEASE_FIELDS[i]]
    PACKED[i] = v
    if v ~= nil then n = i end
  end
  return cmsgpack.pack(unpack(PACKED, 1, n))
end

-- The first lease with this id key, its token and its record (see
-- lease_fields), or nil: one HGET in the common case of a single message
-- with that id in flight. raw: the record under ik when the caller read it
-- already (false: none).
local function first_lease(k, ik, raw)
  local token = ik
  if raw == nil then raw = redis.call('HGET', k.msgs, ik) end
  if not raw then
    token = redis.call('ZRANGEBYLEX', k.ids, '[' .. ik .. ':', '(' .. ik .. ';', 'LIMIT', 0, 1)[1]
    if not token then return nil end
    raw = redis.call('HGET', k.msgs, token)
    if not raw then return nil end
  end
  return token, lease_fields(raw)
end

-- The decimal text of the lengths of most ids: a number in a
-- concatenation is formatted with sprintf, on every pop that writes a
-- text record.
local LENGTH_TEXT = {}
for n = 1, 64 do LENGTH_TEXT[n] = '' .. n end

-- Leases payload, whose ack id is id (id key token). h: its history as
-- the lease carries it (deliveries so far, this one included, NACKs,
-- expiries and disconnects so far, when it was first delivered), or true
-- for a first delivery. owner: the connection taking it, on a rule that tracks it,
-- else ''.
-- The text record of a first delivery by a move pop (see msgs above).
local function move_text(payload, id, dest, dest_end, started)
  local idn = id == payload and '|' or (LENGTH_TEXT[#id] or #id) .. '|' .. id
  return MOVE_REC .. started .. '|' .. dest_end .. (LENGTH_TEXT[#dest] or #dest) .. '|' .. dest .. idn .. payload
end

-- The text record of a first delivery by a plain pop with an owner.
local function owned_text(payload, id, owner, started)
  local idn = id == payload and '|' or (LENGTH_TEXT[#id] or #id) .. '|' .. id
  return MOVE_REC .. 'o' .. started .. '|' .. owner .. '|' .. idn .. payload
end

local function new_lease(k, r, payload, id, token, h, dest, dest_end, now, owner)
  local rec
  if h == true and owner ~= '' and dest == '' then
    rec = owned_text(payload, id, owner, ms_text(now))
  elseif h == true and owner == '' then
    if dest ~= '' then
      rec = move_text(payload, id, dest, dest_end, ms_text(now))
    elseif id == payload then
      rec = 's' .. ms_text(now) .. '|' .. payload
    else
      rec = 't' .. ms_text(now) .. '|' .. (LENGTH_TEXT[#id] or #id) .. '|' .. id .. payload
    end
  else
    if h == true then h = { deliveries = 1, nacks = 0, expiries = 0, first = now } end
    rec = pack_lease({ payload = payload, id = id, deliveries = h.deliveries, dest = dest, dest_end = dest_end,
      started = now, nacks = h.nacks, expiries = h.expiries, first = h.first, owner = owner,
      dc = h.dc and h.dc > 0 and h.dc or nil, indexed = dest ~= '' and 0 or nil })
  end
  token = claim(k.msgs, k.ids, token, rec)
  redis.call('ZADD', dest == '' and k.leases or k.mleases, ms_text(now + r.lease), token)
  if owner ~= '' then redis.call('ZADD', owner_key(k, owner), 0, token) end
end

-- Reads a lease record (see lease_fields), or nil.
local function record(k, token)
  local raw = redis.call('HGET', k.msgs, token)
  if not raw then return nil end
  return lease_fields(raw)
end

-- Marks a move lease as ended (why: 'nacked' | 'disconnected'), with the
-- delay asked for, and due now: the script that removes its copy from the
-- destination then ends it so.
local function mark_ending(k, token, why, delay_ms)
  local l = record(k, token)
  l.nacks, l.expiries, l.first, l.owner = l.nacks or 0, l.expiries or 0, l.first or l.started, l.owner or ''
  l.why, l.delay = why, delay_ms
  redis.call('HSET', k.msgs, token, pack_lease(l))
  redis.call('ZADD', k.mleases, 0, token)
end

-- Up to n of the entries owner has on queue k (n < 0: all; see
-- owner_key): lease tokens, and late marks of leases of a next-pop rule
-- that ran out and whose message is back in the list; and whether it has
-- more.
local function owned_by(k, owner, n)
  local tokens = redis.call('ZRANGE', owner_key(k, owner), 0, n < 0 and -1 or n)
  local more = n >= 0 and #tokens > n
  if more then tokens[#tokens] = nil end
  return tokens, more
end

-- Whether a redelivered copy goes in at the right end of the list.
local function requeue_right(r)
  return (r.pop_end == 'R') == (r.redeliver == 'next')
end

-- How long a message waits before its next delivery, after `deliveries`
-- that ended without an ACK: the rule's backoff, capped, less up to the
-- jitter fraction at random.
local function backoff(r, deliveries)
  if r.backoff == 'none' then return 0 end
  local d = r.base
  if r.backoff == 'exp' then d = r.base * 2 ^ (deliveries - 1) end
  d = math.min(d, r.cap)
  if r.jitter > 0 then d = d - d * r.jitter * math.random() end
  return math.floor(d)
end

-- Bodies one retry entry keeps apart at most: only a producer that reuses
-- an id while earlier copies with it are still in the list needs more
-- than one.
local RETRY_BODIES = 8

-- The retry entry of an id: copies back in the list (or waiting to be),
-- the highest delivery count, copies a late ACK cancelled, the last payload
-- requeued, NACKs, expiries, first delivery, the delayed-set member of the
-- last copy that waits for a backoff (false if none), the ids
-- member by which the next pop of the connection whose lease ran out can
-- still acknowledge it (next-pop rules; false if none), the deliveries
-- that ended with the holder's connection closing, and those copies by
-- body (bodies: {p = payload, n = copies, c = copies cancelled}, the body
-- requeued last at the end). A skip mark belongs to the body it was made
-- for: a later message that reuses the id with another body neither takes
-- it over nor moves it. An entry written by a library that kept no bodies
-- is one body, its last payload.
local function retry_entry(k, rk)
  local e = { pending = 0, seen = 0, cancelled = 0, last = false, nacks = 0, expiries = 0,
    first = false, waiting = false, late = false, dc = 0, bodies = {}, marked = 0 }
  local raw = redis.call('HGET', k.retry, rk)
  if raw then
    local f = { cmsgpack.unpack(raw) }
    e.pending, e.seen, e.cancelled, e.last = f[1], f[2], f[3], f[4]
    e.nacks, e.expiries, e.first, e.waiting, e.late = f[5] or 0, f[6] or 0, f[7] or false, f[8] or false, f[9] or false
    e.dc = f[10] or 0
    local flat = f[11]
    if type(flat) == 'table' then
      e.pending, e.cancelled = 0, 0
      for i = 1, #flat, 3 do
        e.bodies[#e.bodies + 1] = { p = flat[i], n = flat[i + 1], c = flat[i + 2] }
        e.pending, e.cancelled = e.pending + flat[i + 1], e.cancelled + flat[i + 2]
      end
    elseif e.pending > 0 then
      e.bodies[1] = { p = e.last, n = e.pending, c = math.min(e.cancelled, e.pending) }
    end
  end
  -- As stored: set_retry carries a change to '#cancelled' and the index.
  e.marked = e.cancelled
  return e
end

-- The position of payload's body in entry e, or nil; one without a
-- payload (an entry of an older library that kept none) takes any.
local function body_at(e, payload)
  for i = #e.bodies, 1, -1 do
    local p = e.bodies[i].p
    if p == payload or p == false then return i end
  end
  return nil
end

-- The ids member that says the retry entry rk holds skip marks.
local function marks_key(rk) return 'c' .. rk end

-- Pops look at retry entries only while the retry mark is in leases.
local function retry_changed(k)
  if redis.call('EXISTS', k.retry) == 1 then
    redis.call('ZADD', k.leases, 0, RETRY_MARK)
  else
    redis.call('ZREM', k.leases, RETRY_MARK)
  end
end

local function add_cancelled(k, n)
  if redis.call('HINCRBY', k.retry, CANCELLED, n) <= 0 then redis.call('HDEL', k.retry, CANCELLED) end
end

-- Writes entry e back (its totals from its bodies; a body without copies
-- goes), and the cancelled copies' total and index with it.
local function set_retry(k, rk, e)
  local bodies, flat, pending, cancelled = {}, {}, 0, 0
  for _, b in ipairs(e.bodies) do
    if b.n > 0 then
      bodies[#bodies + 1] = b
      flat[#flat + 1], flat[#flat + 2], flat[#flat + 3] = b.p, b.n, b.c
      pending, cancelled = pending + b.n, cancelled + b.c
    end
  end
  e.bodies, e.pending, e.cancelled = bodies, pending, cancelled
  if pending <= 0 then
    redis.call('HDEL', k.retry, rk)
    if e.late then unmark_late(k, e.late) end
  else
    -- The fields before the bodies keep what an older library reads.
    e.last = bodies[#bodies].p
    redis.call('HSET', k.retry, rk, cmsgpack.pack(pending, e.seen, cancelled, e.last, e.nacks,
      e.expiries, e.first, e.waiting, e.late, e.dc, flat))
  end
  if cancelled ~= e.marked then
    add_cancelled(k, cancelled - e.marked)
    if cancelled == 0 then
      redis.call('ZREM', k.ids, marks_key(rk))
    elseif e.marked == 0 then
      redis.call('ZADD', k.ids, 0, marks_key(rk))
    end
    e.marked = cancelled
  end
  retry_changed(k)
end

-- One more copy of payload back in the list, the last requeued. Past
-- RETRY_BODIES bodies the oldest without marks is forgotten (its copies
-- are then delivered as new messages), else the oldest (its cancelled
-- copies are delivered again): a duplicate, never a loss.
local function requeued_copy(e, payload)
  local b = { p = payload, n = 0, c = 0 }
  for i, o in ipairs(e.bodies) do
    if o.p == payload then
      b = table.remove(e.bodies, i)
      break
    end
  end
  b.n = b.n + 1
  e.bodies[#e.bodies + 1] = b
  if #e.bodies > RETRY_BODIES then
    local drop = 1
    for i = 1, #e.bodies - 1 do
      if e.bodies[i].c == 0 then
        drop = i
        break
      end
    end
    table.remove(e.bodies, drop)
  end
end

-- The ack id of the message with id key ik if it is still poison: leased,
-- or back in the queue, with at least the rule's threshold of deliveries
-- ended by a closed connection. Else nil.
local function poison_id(k, r, ik)
  if r.poison < 1 then return nil end
  local token, l = first_lease(k, ik)
  if token and (l.dc or 0) >= r.poison then return l.id end
  local e = retry_entry(k, ik)
  if e.pending > 0 and e.dc >= r.poison and e.last then return ack_id(e.last, r.field) end
  return nil
end

-- Looks at up to n entries of the poison index, oldest first, and removes
-- those whose message is gone (acknowledged, dead-lettered) or no longer
-- poison. Returns the ack ids of the ones that are.
local function poison_ids(k, r, n)
  local ids = {}
  for _, ik in ipairs(redis.call('ZRANGE', k.poison, 0, n - 1)) do
    local id = poison_id(k, r, ik)
    if id then
      ids[#ids + 1] = id
    else
      redis.call('ZREM', k.poison, ik)
    end
  end
  return ids
end

local function history_key(payload) return 'h' .. redis.sha1hex(payload) end

-- One copy of payload left the dead-letter list: its history goes with the
-- last copy.
local function forget_dead(k, payload)
  local hk = history_key(payload)
  local raw = redis.call('HGET', k.history, hk)
  if not raw then return end
  local f = { cmsgpack.unpack(raw) }
  if f[1] <= 1 then
    redis.call('HDEL', k.history, hk)
  else
    f[1] = f[1] - 1
    redis.call('HSET', k.history, hk, cmsgpack.pack(unpack(f, 1, 9)))
  end
end

-- Dead letters dropped per call to bring the list back under dead_max (one
-- per new dead letter is always enough; a lowered limit catches up over
-- the next ones).
local DEAD_DROP_PER_CALL = 10

-- Puts payload at the end of the dead-letter list and its history beside
-- it, keeping at most DEAD_HISTORY histories and dead_max dead letters.
local function dead_letter(k, r, payload, h, now)
  redis.call('RPUSH', k.dead, payload)
  tally(k, 'dead_lettered', 1)
  local hk = history_key(payload)
  local raw = redis.call('HGET', k.history, hk)
  local copies = raw and cmsgpack.unpack(raw) or 0
  redis.call('HSET', k.history, hk, cmsgpack.pack(copies + 1, h.id, h.deliveries, h.nacks,
    h.expiries, h.first, h.last, h.why, now))
  if redis.call('HLEN', k.history) > DEAD_HISTORY then
    -- Past the bound one history goes, chosen at random (its payload stays).
    local other = redis.call('HRANDFIELD', k.history)
    if other == hk then other = redis.call('HRANDFIELD', k.history) end
    redis.call('HDEL', k.history, other)
  end
  if r.dead_max > 0 then
    local over = math.min(redis.call('LLEN', k.dead) - r.dead_max, DEAD_DROP_PER_CALL)
    for _ = 1, over do forget_dead(k, redis.call('LPOP', k.dead)) end
    if over > 0 then tally(k, 'dead_dropped', over) end
  end
end

-- Ends a lease without an ACK. why: 'expired' | 'nacked' | 'disconnected';
-- delay_ms: the wait asked for, or nil for the rule's backoff. The message
-- goes back to the list, at once or after the wait (and a retry entry keeps
-- its history), or past max deliveries its raw payload goes to the
-- dead-letter list. A message each of whose deliveries so far ended with
-- its worker's connection closing is flagged as poison when they reach
-- the rule's threshold. Returns requeued, deadlettered.
local function expire(k, r, token, why, delay_ms, now)
  local l = record(k, token)
  if not l then
    redis.call('ZREM', k.leases, token)
    redis.call('ZREM', k.mleases, token)
    return 0, 0
  end
  local payload, id, deliveries, dest, started, owner = l.payload, l.id, l.deliveries, l.dest, l.started, l.owner
  local nacks, expiries, first, ending, ending_delay, dc = l.nacks, l.expiries, l.first, l.why, l.delay, l.dc
  drop(k, token, l)
  if ending then why, delay_ms = ending, tonumber(ending_delay) end
  nacks, expiries, first = nacks or 0, expiries or 0, first or started
  if why == 'nacked' then
    nacks = nacks + 1
    tally(k, 'nacks', 1)
  else
    -- A lease that ran out and a connection that closed are both a worker
    -- that failed (not a rejection); the queue's totals tell them apart.
    expiries = expiries + 1
    tally(k, why == 'expired' and 'expiries' or 'disconnects', 1)
  end
  if r.shadow == 1 then
    -- Shadow mode: the worker kept the message, as without the proxy.
    tally(k, 'would_redeliver', 1)
    return 0, 0
  end
  dc = dc or 0
  local poisoned = false
  if why == 'disconnected' then
    dc = dc + 1
    -- Counted once, when the last of the threshold's deliveries ends.
    if dc == deliveries and dc == r.poison then
      tally(k, 'poisoned', 1)
      poisoned = true
    end
  end
  -- A dead-letter key holding another type cannot take it: the message is
  -- redelivered rather than lost.
  if deliveries >= r.max and is_list_or_none(k.dead) then
    dead_letter(k, r, payload, { id = id, deliveries = deliveries, nacks = nacks,
      expiries = expiries, first = first, last = started, why = why }, now)
    return 0, 1
  end
  tally(k, 'redeliveries', 1)
  local wait = delay_ms or backoff(r, deliveries)
  local waiting = false
  if wait > 0 then
    waiting = delay(k, payload, now + wait, r.redeliver == 'next' and 'n' or 'p')
  else
    redis.call(requeue_right(r) and 'RPUSH' or 'LPUSH', k.q, payload)
  end
  local rk = id_key(id)
  local e = retry_entry(k, rk)
  if deliveries > e.seen then e.seen = deliveries end
  requeued_copy(e, payload)
  e.nacks, e.expiries, e.first, e.waiting = nacks, expiries, first, waiting
  e.dc = dc
  if poisoned then
    redis.call('ZADD', k.poison, now, rk)
    -- Entries are removed as their messages go (poison_ids); the key
    -- goes on its own if nothing looks at it any more.
    redis.call('PEXPIRE', k.poison, STATS_TTL_MS)
  end
  if why == 'expired' and owner and owner ~= '' and r.ack == 'next-pop' then
    -- A slow worker may still pop again: that is then a late ACK.
    if e.late then unmark_late(k, e.late) end
    e.late = owned_key(owner, '~' .. rk)
    redis.call('ZADD', owner_key(k, owner), 0, '~' .. rk)
  end
  set_retry(k, rk, e)
  return 1, 0
end

-- Bookkeeping for a payload just popped from a queue, whose id key is rk;
-- retried: whether the retry mark said that anything was back in the
-- list. Returns its history as its new lease carries it (true for a first
-- delivery), or nil when a late ACK cancelled this copy.
local function popped(k, payload, rk, now, retried)
  if not retried then return true end
  local e = retry_entry(k, rk)
  if e.pending == 0 then return true end
  -- A new message that reuses the id with another body is none of the
  -- copies counted here (a skip mark cancels only the copy it was made
  -- for).
  local at = body_at(e, payload)
  if not at then return true end
  local b = e.bodies[at]
  local h = { deliveries = e.seen + 1, nacks = e.nacks, expiries = e.expiries, first = e.first or now, dc = e.dc }
  if b.c > 0 then
    b.c = b.c - 1
    h = nil
  end
  -- Redelivered: too late for the earlier worker's next pop to call back.
  if e.late and (payload == e.last or not e.last) then
    unmark_late(k, e.late)
    e.late = false
  end
  b.n = b.n - 1
  set_retry(k, rk, e)
  return h
end

-- Takes one copy of payload out of the list, looking at no more than maxlen
-- elements from the end redelivered copies enter at. Returns whether it
-- did, then, if it did not, whether the copy is known to be gone: the list
-- was looked at whole (someone popped the copy straight from Redis) or is
-- no list any more (deleted).
local function remove_copy(k, r, payload, maxlen)
  if redis.call('TYPE', k.q)['ok'] ~= 'list' then return false, true end
  if maxlen < 1 then return false, false end
  local right = requeue_right(r)
  local pos = redis.call('LPOS', k.q, payload, 'RANK', right and -1 or 1, 'MAXLEN', maxlen)
  if not pos then return false, redis.call('LLEN', k.q) <= maxlen end
  -- LSET by a negative index walks from the tail, where the copy is.
  if right then pos = pos - redis.call('LLEN', k.q) end
  local mark = '\0ackproxy:removed:' .. redis.sha1hex(payload)
  redis.call('LSET', k.q, pos, mark)
  redis.call('LREM', k.q, right and -1 or 1, mark)
  return true, false
end

-- A late ACK for id key rk: the copy waiting for its backoff is taken out
-- of the delayed set; else one of the body requeued last that has copies
-- not yet cancelled: removed when it is found within maxlen elements;
-- forgotten when it is not and the list was looked at whole (the copy is
-- gone), else marked so that a pop of that body skips it. Returns 1 if a
-- copy was waiting, 0 otherwise, and the elements it may have looked at.
local function late_ack(k, r, rk, maxlen)
  local e = retry_entry(k, rk)
  if e.pending <= e.cancelled then return 0, 0 end
  if e.late then
    unmark_late(k, e.late)
    e.late = false
  end
  if e.waiting and redis.call('ZREM', k.delayed, e.waiting) == 1 then
    local at = body_at(e, string.sub(e.waiting, SEQ_DIGITS + 2))
    if at then
      local b = e.bodies[at]
      b.n = b.n - 1
      if b.c > b.n then b.c = b.n end
    end
    e.waiting = false
    set_retry(k, rk, e)
    return 1, 0
  end
  local b
  for i = #e.bodies, 1, -1 do
    if e.bodies[i].n > e.bodies[i].c then
      b = e.bodies[i]
      break
    end
  end
  local removed, gone = false, false
  if b.p then removed, gone = remove_copy(k, r, b.p, maxlen) end
  if removed or gone then
    -- A copy that is gone needs no skipping: a mark would cancel the next
    -- message pushed with this body instead.
    b.n = b.n - 1
  else
    b.c = b.c + 1
  end
  set_retry(k, rk, e)
  return 1, maxlen
end

-- Skip marks dropped per call once their list is gone.
local STALE_MARKS_PER_CALL = 100

-- Queue k's list is gone (emptied or deleted): every copy a late ACK marked
-- went with it, so its mark would only cancel a message pushed later with
-- the same body. Drops up to n entries' marks, with the copies they stood
-- for. (A marked copy still waiting in the delayed set for its backoff is
-- then delivered again: a duplicate, never a loss.)
local function drop_stale_marks(k, n)
  for _, m in ipairs(redis.call('ZRANGEBYLEX', k.ids, '[c', '(d', 'LIMIT', 0, n)) do
    redis.call('ZREM', k.ids, m)
    local rk = string.sub(m, 2)
    local e = retry_entry(k, rk)
    for _, b in ipairs(e.bodies) do b.n, b.c = b.n - b.c, 0 end
    set_retry(k, rk, e)
  end
end

-- Late ACKs looked at per next-pop release, in list elements.
local RELEASE_LATE_SCAN = 2000

-- ack = 'next-pop': a connection that pops again has finished the messages
-- it popped before from this queue. Acknowledges up to n of them (n < 0:
-- all), late ones too (their lease ran out, their copy not yet popped
-- again); returns how many, and whether it holds more.
local function release_owned(k, r, owner, n)
  local tokens, more = owned_by(k, owner, n)
  local done, late, budget = 0, 0, RELEASE_LATE_SCAN
  for _, token in ipairs(tokens) do
    if string.byte(token, 1) == 126 then
      unown(k, owner, token)
      local n_late, looked = late_ack(k, r, string.sub(token, 2), budget)
      late, budget = late + n_late, budget - looked
    else
      local l = record(k, token)
      if l then
        l.owner = owner
        drop(k, token, l)
        done = done + 1
      else
        unown(k, owner, token)
      end
    end
  end
  tally_soon(k, 'acks', done)
  tally(k, 'late_acks', late)
  return done + late, more
end

-- Ends up to n expired plain leases, oldest first (now_text: now as
-- now_ms() gave it, when the caller has it). With redeliver 'next'
-- each one is pushed at the pop end, so they are pushed newest first to be
-- popped again in their original order. Returns requeued, deadlettered,
-- and which marks were due: the retry mark (anything back in the list) and
-- the delayed one (a delayed message may be due).
local function requeue_expired(k, r, now, n, now_text)
  local limit = n == REQUEUE_PER_CALL and REQUEUE_LIMIT or math.max(n, 0) + 2
  local due = redis.call('ZRANGEBYSCORE', k.leases, '-inf', now_text or now, 'LIMIT', '0', limit)
  if #due == 0 then return 0, 0, false, false end
  local expired, retried, delayed = {}, false, false
  for _, m in ipairs(due) do
    if m == RETRY_MARK then
      retried = true
    elseif m == DELAYED_MARK then
      delayed = true
    elseif #expired < n then
      expired[#expired + 1] = m
    end
  end
  local requeued, dead = 0, 0
  local from, to, step = 1, #expired, 1
  if r.redeliver == 'next' then from, to, step = #expired, 1, -1 end
  for i = from, to, step do
    local a, b = expire(k, r, expired[i], 'expired', nil, now)
    requeued, dead = requeued + a, dead + b
  end
  return requeued, dead, retried or requeued > 0, delayed
end

-- Pops up to count values from queue k (source g of the call) and leases
-- each, pushing it onto dest at the `push` end for the move forms. Copies a
-- late ACK cancelled are dropped, at most `skips` of them. Returns the
-- reply's result {status, g, values...} (see pop), or nil when the list
-- held nothing real; then an error reply (WRONGTYPE), or nil; then the
-- skips left.
local function pop_leased(k, r, g, pop_cmd, count, now, retried, dest, push, owner, skips)
  local push_cmd = push == 'L' and 'LPUSH' or 'RPUSH'
  local out = { 0, g }
  while #out - 2 < count do
    local v = redis.pcall(pop_cmd, k.q)
    -- A value or false, else an error table: a value's .err is a string
    -- method's, nil (cheaper than type(), a C call).
    if v and v.err then return nil, v, skips end
    if not v then
      if retried then drop_stale_marks(k, STALE_MARKS_PER_CALL) end
      break
    end
    local id = ack_id(v, r.field)
    local ik = id_key(id)
    local h = popped(k, v, ik, now, retried)
    if h then
      if dest ~= '' then redis.call(push_cmd, dest, v) end
      new_lease(k, r, v, id, ik, h, dest, push, now, r.track == 1 and owner or '')
      out[#out + 1] = v
    else
      skips = skips - 1
      if skips <= 0 then
        out[1] = 1
        tally_soon(k, 'deliveries', #out - 2)
        return out, nil, skips
      end
    end
  end
  -- A list that held only cancelled copies counts as empty.
  if #out > 2 then
    tally_soon(k, 'deliveries', #out - 2)
    return out, nil, skips
  end
  return nil, nil, skips
end

-- Due work a pop does first on queue k, with what one look at the leases
-- says (see the marks): expired leases back, due delayed messages in.
-- Returns whether anything may be back in the list (retry entries), and
-- the budgets left.
local function pop_due(k, r, now, now_text, requeue_budget, promote_budget)
  local back, _, retried, delayed = requeue_expired(k, r, now, requeue_budget, now_text)
  requeue_budget = requeue_budget - back
  if delayed and promote_budget > 0 then
    local moved = promote_and_mark(k, r, now, promote_budget)
    promote_budget = promote_budget - moved
    -- Redeliveries that waited for a backoff have retry entries.
    retried = retried or moved > 0
  end
  return retried, requeue_budget, promote_budget
end
