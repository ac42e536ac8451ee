-- A rule's packed arguments, its stored record and the batch's reply, read and written here
-- alone: the general path (batch.lua) and the streamlined one (fast.lua) both go through
-- these functions.
--
-- A rule's packed argument (in call.lua's shape): thirteen little-endian doubles,
-- `RuleArgs` in src/store/redis/script/args.rs, read by rule_args.
--
-- The record (a rule's key `{prefix}:{<key>}:<rule>`): little-endian doubles
-- (struct.pack "<d…", exact for these integers): the head, which is the fingerprint of the
-- configuration that wrote the state (0 = no algorithm state), the units it had in use then
-- and the instant it is back to empty (what another configuration reads: src/store/batch.rs
-- `Entry`, src/algorithm/mod.rs `Carried`); then the algorithm's state fields (none for a
-- sliding log, whose entries are in its log); then the penalty's locked_until, denials,
-- window_end; then, on a key a lease touched, its ledger (parked.lua). The functions pass
-- its parts as multiple values, not a table, so the streamlined path builds none.

-- The library functions a decision calls, held in locals (a global is a lookup by name).
-- Declared here rather than in prelude.lua so that only the closures from this file on
-- capture them: a script creates every closure anew on each call.
local struct_pack = struct.pack
local struct_unpack = struct.unpack
local redis_call = redis.call
local string_format = string.format

-- The models built so far, by algorithm code. A model holds no state of its own, so in a
-- function library (FCALL) it is built once per library load; in a script, once per call.
local built = {}

-- The model of algorithm `code`, built on first use, with its record's length in bytes and
-- struct format (which a rule's configuration copies for read_record and write_record).
local function model_of(code)
  local model = built[code]
  if not model then
    model = models[code]()
    model.bytes = 8 * (model.fields + 6)
    model.format = '<' .. string.rep('d', model.fields + 6)
    built[code] = model
  end
  return model
end

-- The bytes of a rule's packed argument: thirteen doubles.
local RULE_BYTES = 104

-- The longest record without a ledger: the head, three state fields and the penalty's.
local LEDGERLESS_BYTES = 72

-- A rule's configuration from its packed argument: the algorithm's code, model and
-- parameters p1…p4 (see each algorithm's file), the cost, the penalty (lock_for µs, `after`
-- denials that lock, 0 = none, counted `within` µs), what its refusal does (`Refusal`: 0
-- enforced, 1 shadow, batch::admitted, 2 its quota denials left to the caller,
-- batch::counts_denial), the fingerprint (`Rule::fingerprint`), the capacity (`Algorithm::quota`)
-- and the key id (the index of the batch's first rule on the same client key,
-- batch::key_release). The models, penalty.lua and the functions below read it as `c`.
local function rule_args(packed)
  local code, cost, p1, p2, p3, p4, lock_for, after, within, refusal, fingerprint, quota, key_id =
    struct_unpack('<ddddddddddddd', packed)
  local model = model_of(code)
  return {
    code = code,
    model = model,
    fields = model.fields,
    bytes = model.bytes,
    format = model.format,
    cost = cost,
    p1 = p1,
    p2 = p2,
    p3 = p3,
    p4 = p4,
    lock_for = lock_for,
    after = after,
    within = within,
    shadow = refusal == 1,
    defers = refusal == 2,
    fingerprint = fingerprint,
    quota = quota,
    key_id = key_id,
  }
end

-- The record `raw` (a GET's reply) as configuration `c` reads it: what it holds ('own',
-- 'foreign' or 'none'), c's own state fields f1, f2, f3 (nil past its model's fields, and
-- unless 'own'), the penalty's three fields, and the head. A value that is no record reads
-- as none.
local function read_record(c, raw)
  if raw and #raw == c.bytes then
    local fields = c.fields
    if fields == 2 then
      local t1, t2, t3, t4, t5, t6, t7, t8 = struct_unpack(c.format, raw)
      if t1 == c.fingerprint then
        return 'own', t4, t5, nil, t6, t7, t8, t1, t2, t3
      end
      return t1 == 0 and 'none' or 'foreign', nil, nil, nil, t6, t7, t8, t1, t2, t3
    elseif fields == 3 then
      local t1, t2, t3, t4, t5, t6, t7, t8, t9 = struct_unpack(c.format, raw)
      if t1 == c.fingerprint then
        return 'own', t4, t5, t6, t7, t8, t9, t1, t2, t3
      end
      return t1 == 0 and 'none' or 'foreign', nil, nil, nil, t7, t8, t9, t1, t2, t3
    end
    -- No state fields: the sliding log's record, whose state is its log.
    local t1, t2, t3, t4, t5, t6 = struct_unpack(c.format, raw)
    if t1 == c.fingerprint then
      return 'own', nil, nil, nil, t4, t5, t6, t1, t2, t3
    end
    return t1 == 0 and 'none' or 'foreign', nil, nil, nil, t4, t5, t6, t1, t2, t3
  end
  local n = raw and #raw / 8 or 0
  if n < 6 or n ~= floor(n) then
    return 'none', nil, nil, nil, 0, 0, 0, 0, 0, 0
  end
  if #raw > LEDGERLESS_BYTES then
    -- A ledger follows (parked.lua), which only the general path settles: the streamlined
    -- one hands the record over as it does another configuration's.
    return 'foreign', nil, nil, nil, 0, 0, 0, 0, 0, 0
  end
  -- Another length: another configuration's record, or bare penalty fields.
  local t1, t2, t3 = struct_unpack('<ddd', raw)
  local l1, l2, l3 = struct_unpack('<ddd', raw, #raw - 23)
  return t1 == 0 and 'none' or 'foreign', nil, nil, nil, l1, l2, l3, t1, t2, t3
end

-- The records the call's batches wrote, so that the batches of one call on the same key
-- read it from Redis only until one writes it, and write it once (flush_records): `slot`
-- holds, by key, the index in `written` (the key), `written_record` (the bytes, or false
-- for none) and `written_ttl` (ms for a PSETEX, false for a DEL). A key only read is read
-- from Redis each time. Time stands still within a call, so the last write's TTL is the
-- one that counts.
local slot, written, written_record, written_ttl, written_count = {}, {}, {}, {}, 0

-- What GET `key` answers within the call. Written out on the streamlined path (fast.lua).
local function get_record(key)
  local i = slot[key]
  if i then
    return written_record[i]
  end
  return redis_call('GET', key)
end

-- TTLs in ms as decimal text, by value (a store writes the same few); emptied once it holds
-- `TTL_TEXTS_MAX`. flush_records looks them up; this formats a TTL not seen yet.
local ttl_texts, ttl_text_count = {}, 0
local TTL_TEXTS_MAX = 1024

local function new_ttl_text(ttl)
  local text = string_format('%d', ttl)
  if ttl_text_count >= TTL_TEXTS_MAX then
    ttl_texts, ttl_text_count = {}, 0
  end
  ttl_texts[ttl] = text
  ttl_text_count = ttl_text_count + 1
  return text
end

-- Writes what the call's batches left in their records, each key once, and forgets them.
local function flush_records()
  for i = 1, written_count do
    local key = written[i]
    local ttl = written_ttl[i]
    if ttl then
      -- PSETEX rather than SET … PX: fewer arguments for Redis to parse and check.
      redis_call('PSETEX', key, ttl_texts[ttl] or new_ttl_text(ttl), written_record[i])
    else
      redis_call('DEL', key)
    end
    slot[key] = nil
  end
  written_count = 0
end

-- A rule with a penalty keeps its record (and a sliding log its set) this long (µs) past
-- its end: a refusal counted late finds the state it was refused on
-- (penalty::REFUSALS_KEPT_MICROS).
local REFUSALS_KEPT_US = 3000000

-- Until when `c`'s key is kept, its state ending at `expires_at`.
local function kept_until(c, expires_at)
  return c.after > 0 and expires_at + REFUSALS_KEPT_US or expires_at
end

-- Writes a record to `key` with a TTL that ends `slack` ms after `expires_at` (a rule with
-- a penalty's, REFUSALS_KEPT_US later), or deletes the key once that has passed. The
-- record: the head h1, h2, h3, then the state fields (`foreign`'s bytes as another
-- configuration wrote them, or when nil `c`'s own f1, f2, f3), then the penalty's l1, l2,
-- l3, then the bytes of a ledger (parked.lua) if any.
local function write_record(c, key, expires_at, now, slack, h1, h2, h3, f1, f2, f3, l1, l2, l3, foreign, ledger)
  local record
  if foreign then
    record = struct_pack('<ddd', h1, h2, h3) .. foreign .. struct_pack('<ddd', l1, l2, l3)
  else
    local fields = c.fields
    if fields == 2 then
      record = struct_pack(c.format, h1, h2, h3, f1, f2, l1, l2, l3)
    elseif fields == 3 then
      record = struct_pack(c.format, h1, h2, h3, f1, f2, f3, l1, l2, l3)
    else
      record = struct_pack(c.format, h1, h2, h3, l1, l2, l3)
    end
  end
  if ledger then
    record = record .. ledger
  end
  -- Written at the call's end (flush_records).
  local i = slot[key]
  if not i then
    i = written_count + 1
    written_count, slot[key], written[i] = i, i, key
  end
  expires_at = kept_until(c, expires_at)
  if expires_at > now then
    written_record[i], written_ttl[i] = record, ceil((expires_at - now) / 1000) + slack
  else
    written_record[i], written_ttl[i] = false, false
  end
end

-- What each rule of the batch being answered says, by its index in the batch (filled by
-- batch.lua and fast.lua, read by reply): the units remaining, the µs until reset, the
-- refund mark (0 if none), the value (delay or retry µs), the outcome (0 passes: allowed,
-- or delayed by the value; 1 limited, 2 locked, 3 cost exceeds capacity), the µs after the
-- reservation the rule counted the request at (-1 pending, batch::evaluate), the water a
-- leaky bucket's hold added (LeakyBucket::hold), and 1 when it wrote over another
-- configuration's state (the deny caches must hear of it), else 0.
local said_remaining, said_reset, said_mark, said_value = {}, {}, {}, {}
local said_outcome, said_at, said_hold, said_adopted = {}, {}, {}, {}
local said = { said_remaining, said_reset, said_mark, said_value, said_outcome, said_at, said_hold, said_adopted }

-- The call's reply (lua/call.lua), reused from call to call in a function library; what a
-- longer reply left past the end is cleared as the call ends.
local out = {}

-- Where the last batch's reply ended in `out`, and its instants (call.lua forgets them as
-- a call starts).
local said_end, said_now, said_wait = nil, nil, nil

-- Opens the reply of a batch of `n` rules (admitted or not) decided at `now`, the request
-- reserved `wait` µs later, each rule sending the first `width` of its values above (the
-- rest are 0): writes its opening (prelude.lua's REPLY_*) into `out` after `o`, then now
-- and wait unless they are those of the batch just before it in the call. Returns the
-- position after which the rules' values go, `width` each, in that order.
-- src/store/redis/script.rs `split_reply` reads the reply.
local function open_reply(o, admitted, now, wait, n, width)
  local opening = REPLY_WIDTH * width
  if admitted then
    opening = opening + REPLY_ADMITTED
  end
  if o == said_end and now == said_now and wait == said_wait then
    out[o + 1] = opening + REPLY_AGAIN
    o = o + 1
  else
    out[o + 1], out[o + 2], out[o + 3] = opening, now, wait
    o = o + 3
  end
  said_end, said_now, said_wait = o + n * width, now, wait
  return o
end

-- Writes the reply (open_reply's) of a batch whose rules' values are in the said_ arrays:
-- `width` of them per rule, or when nil as many as the rule with most needs (at least
-- remaining and reset). Returns the new position.
local function reply(o, admitted, now, wait, n, width)
  if not width then
    width = 2
    for i = 1, n do
      for j = 8, width + 1, -1 do
        if said[j][i] ~= 0 then
          width = j
          break
        end
      end
    end
  end
  o = open_reply(o, admitted, now, wait, n, width)
  for i = 1, n do
    for j = 1, width do
      out[o + j] = said[j][i]
    end
    o = o + width
  end
  return o
end
