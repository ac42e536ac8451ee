-- The call driver: one call decides one or more batches (coalesced by
-- src/store/redis/dispatch.rs), each all or nothing on its own, in order.
--
-- KEYS: the batches' keys (batch.lua's KEYS), one batch after another.
-- ARGV: per batch, its shape: "<keys> <rules> <max_wait> <mode> <slack> <extra>\n" (its key
--   and rule counts, batch.lua's ARGV[2], ARGV[3], ARGV[4] as decimal integers, and 1 when
--   two more arguments follow, else 0) and then its rules' arguments (batch.lua's ARGV[6…],
--   RULE_BYTES each), all one argument (parsed once per distinct value, fast.lua's
--   shape_of); then, when <extra> is 1, batch.lua's ARGV[1] and ARGV[5]; when 0, they are
--   "" and "0". TIME is read at most once per call.
-- Returns: one flat array: per batch, in order, its reply (record.lua's open_reply), or -1 and a
--   message when the batch failed; src/store/redis/script.rs `split_reply` splits it.
-- Batches of one call on the same key share its record (record.lua's get_record,
-- flush_records), each decided exactly as one call after another would decide it.

-- A failed batch's reply, written into the call's reply `out` after its position `o`;
-- returns the new position. Redis 7 raises a command's error as a table with the message
-- in `err`.
local function failed(o, err)
  if type(err) == 'table' then
    err = err.err
  end
  out[o + 1] = -1
  out[o + 2] = tostring(err)
  return o + 2
end

-- The general path (lua/batch.lua) for the batch whose keys start after KEYS[k], whose
-- shape is `h`, with batch.lua's ARGV[1] `now` and ARGV[5] `arg5`; its reply is written
-- into `out` after position `o`, and the new position returned.
local function decide_general(KEYS, k, h, now, arg5, time, o)
  local keys = {}
  for i = 1, h.nkeys do
    keys[i] = KEYS[k + i]
  end
  if now == '' then
    now = time
  end
  local args = { now, h.max_wait, h.mode, h.slack, arg5 }
  local rules = h.rules
  for i = 1, h.nrules do
    args[5 + i] = rules[i]
  end
  local ok, e = pcall(decide_batch, keys, args, o)
  if not ok then
    return failed(o, e)
  end
  return e
end

-- Decides the call's batches into `out`; returns the reply's length.
local function decide_batches(KEYS, ARGV)
  local time = nil
  -- No batch's instants before the call's first (record.lua's reply).
  said_end = nil
  local o = 0
  local k, a = 0, 1
  local nargv = #ARGV
  while a <= nargv do
    local bytes = ARGV[a]
    local h = shapes[bytes] or shape_of(bytes)
    local now, arg5 = '', '0'
    if h.extra then
      now, arg5 = ARGV[a + 1], ARGV[a + 2]
      a = a + 3
    else
      a = a + 1
    end
    if not time and now == '' then
      -- Read at most once per call, so every batch of a call decides at the same instant.
      local t = redis_call('TIME')
      time = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    -- The common case first (lua/fast.lua), straight from the call's arguments; nil sends
    -- the batch to the general path, with nothing written.
    local ok, e = pcall(decide_plain, KEYS, k, h, now, arg5, time, o)
    if not ok then
      o = failed(o, e)
    elseif not e then
      o = decide_general(KEYS, k, h, now, arg5, time, o)
    else
      o = e
    end
    k = k + h.nkeys
  end
  return o
end

local function decide_call(KEYS, ARGV)
  local ok, o = pcall(decide_batches, KEYS, ARGV)
  -- The records are written once, at the end; also when the call fails after some batches
  -- were decided, whose decisions stand.
  flush_records()
  if not ok then
    error(o, 0)
  end
  -- A batch that failed midway may have written past its end: nothing follows the reply.
  o = o + 1
  while out[o] ~= nil do
    out[o] = nil
    o = o + 1
  end
  return out
end
