-- The call driver: one call decides one or more batches, each all or nothing on its own, in
-- the order they are given. A store coalesces the batches of requests that wait at the same
-- moment into one call (src/store/redis/dispatch.rs), so the call's fixed costs (entering
-- Redis's Lua, reading TIME, building the reply) are paid once for all of them.
--
-- KEYS: the batches' keys (batch.lua's KEYS), one batch after another.
-- ARGV: per batch, its header "<keys> <rules> <max_wait> <mode> <slack>" (its key and rule
--   counts, then batch.lua's ARGV[2], ARGV[3], ARGV[4], as decimal integers: one argument
--   that a call parses once per distinct text, fast.lua's header_of), then batch.lua's
--   ARGV[1] (the instant, or "" for the server's TIME, read at most once per call, so every
--   batch of a call decides at the same instant), ARGV[5], and one argument per rule.
-- Returns: per batch, an array: batch.lua's reply, or { -1, message } when the batch failed
--   (a Redis error, say); the other batches of the call are decided as if it were alone.

-- A failed batch's reply. Redis 7 raises a command's error as a table with the message in
-- `err`.
local function failed(err)
  if type(err) == 'table' then
    err = err.err
  end
  return { -1, tostring(err) }
end

-- The general path (lua/batch.lua) for the batch whose keys start after KEYS[k], whose
-- header is `h` and whose other arguments start at ARGV[a].
local function decide_general(KEYS, ARGV, k, a, h, time)
  local keys = {}
  for i = 1, h.nkeys do
    keys[i] = KEYS[k + i]
  end
  local now = ARGV[a]
  if now == '' then
    now = time
  end
  local args = { now, h.max_wait, h.mode, h.slack, ARGV[a + 1] }
  for i = 1, h.nrules do
    args[5 + i] = ARGV[a + 1 + i]
  end
  local ok, reply = pcall(decide_batch, keys, args)
  if not ok then
    return failed(reply)
  end
  return reply
end

local function decide_call(KEYS, ARGV)
  local time = nil
  local replies = {}
  local n = 0
  local k, a = 0, 1
  local nargv = #ARGV
  while a <= nargv do
    local h = header_of(ARGV[a])
    a = a + 1
    if not time and ARGV[a] == '' then
      -- Read at most once per call, so every batch of a call decides at the same instant.
      local t = redis.call('TIME')
      time = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    -- The common case first (lua/fast.lua), straight from the call's arguments; nil sends
    -- the batch to the general path, with nothing written.
    local ok, reply = pcall(decide_plain, KEYS, k, ARGV, a, h, time)
    if not ok then
      reply = failed(reply)
    elseif not reply then
      reply = decide_general(KEYS, ARGV, k, a, h, time)
    end
    n = n + 1
    replies[n] = reply
    k, a = k + h.nkeys, a + 2 + h.nrules
  end
  return replies
end
