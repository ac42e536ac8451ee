-- The call driver: one call decides one or more batches (coalesced by
-- src/store/redis/dispatch.rs), each all or nothing on its own, in order.
--
-- KEYS: the batches' keys (batch.lua's KEYS), one batch after another.
-- ARGV: per batch, its shape: "<keys> <rules> <max_wait> <mode> <slack> <extra>\n" as
--   decimal integers, then its rules' packed arguments (record.lua's rule_args, RULE_BYTES
--   each), all one argument (parsed once per distinct value, fast.lua's shape_of), or ""
--   when it is the shape of the batch before it in the call (a coalesced call's batches
--   mostly share one, which Redis would otherwise copy and Lua hash for each); then,
--   when <extra> is 1, its instant and its floors as two more arguments (else "" and "0").
--   keys, rules: how many keys (a sliding log rule has two) and rules the batch holds.
--   max_wait: µs a wait-mode request may be reserved ahead; for MODE_DENY, the µs since
--     the refusals were made, which are judged as of then (Store::count_denials).
--   mode: prelude.lua's MODE_*, each described at `Op` in src/store/redis/script.rs.
--   slack: milliseconds added to every TTL (TTLs are only garbage collection).
--   instant: µs since the epoch, or "" for the server's TIME (read at most once per call).
--   floors: in the refund modes and MODE_END, per rule three little-endian doubles: the
--     admission's instant, its mark and its hold; in MODE_LEASE, the lease's id. Otherwise
--     the least delay in µs (another Cluster slot reserved that far ahead), then optionally
--     a space and the µs after now at which another slot's leaky bucket releases the request.
-- Returns: one flat array: per batch, in order, its reply (record.lua's open_reply), or -1
--   and a message when the batch failed; src/store/redis/script.rs `split_reply` splits it.
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

-- Decides the call's batches into `out`; returns the reply's length.
local function decide_batches(KEYS, ARGV)
  local time = nil
  -- No batch's instants before the call's first (record.lua's reply).
  said_end = nil
  local o = 0
  local k, a = 0, 1
  local nargv = #ARGV
  -- The shape of the batch before: "" stands for it (as the first, shape_of refuses it).
  local h = nil
  while a <= nargv do
    local bytes = ARGV[a]
    h = bytes == '' and h or shapes[bytes] or shape_of(bytes)
    local now, floors = '', '0'
    if h.extra then
      now, floors = ARGV[a + 1], ARGV[a + 2]
      a = a + 3
    else
      a = a + 1
    end
    if not time and now == '' then
      -- Read at most once per call, so every batch of a call decides at the same instant.
      local t = redis_call('TIME')
      time = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    now = now == '' and time or tonumber(now)
    -- The common case first (lua/fast.lua), straight from the call's arguments; nil sends
    -- the batch to the general path (lua/batch.lua), with nothing written.
    local ok, e = pcall(decide_plain, KEYS, k, h, now, floors, o)
    if ok and not e then
      ok, e = pcall(decide_batch, KEYS, k, h, now, floors, o)
    end
    if ok then
      o = e
    else
      o = failed(o, e)
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
