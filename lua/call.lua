-- The call driver: one call decides one or more batches, each all or nothing on its own, in
-- the order they are given. A store coalesces the batches of requests that wait at the same
-- moment into one call (src/store/redis/dispatch.rs), so the call's fixed costs (entering
-- Redis's Lua, reading TIME, building the reply) are paid once for all of them.
--
-- KEYS: the batches' keys (batch.lua's KEYS), one batch after another.
-- ARGV: per batch, its key count, its rule count, then its ARGV[1…] as batch.lua describes:
--   the instant (or "" for the server's TIME, read at most once per call, so every batch of
--   a call decides at the same instant), max_wait, mode, slack, ARGV[5], one per rule.
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

-- The general path (lua/batch.lua) for the batch whose keys start after KEYS[k] and whose
-- arguments start at ARGV[a].
local function decide_general(KEYS, ARGV, k, a, nkeys, nrules, time)
  local keys, args = {}, {}
  for i = 1, nkeys do
    keys[i] = KEYS[k + i]
  end
  for i = 1, 5 + nrules do
    args[i] = ARGV[a + 1 + i]
  end
  if args[1] == '' then
    args[1] = time
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
  local k, a = 0, 1
  local nargv = #ARGV
  while a <= nargv do
    local nkeys, nrules = number_of(ARGV[a]), number_of(ARGV[a + 1])
    if not time and ARGV[a + 2] == '' then
      -- Read at most once per call, so every batch of a call decides at the same instant.
      local t = redis.call('TIME')
      time = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    -- The common case first (lua/fast.lua), straight from the call's arguments; nil sends
    -- the batch to the general path, with nothing written.
    local ok, reply = pcall(decide_plain, KEYS, k, ARGV, a, time)
    if not ok then
      reply = failed(reply)
    elseif not reply then
      reply = decide_general(KEYS, ARGV, k, a, nkeys, nrules, time)
    end
    replies[#replies + 1] = reply
    k, a = k + nkeys, a + 7 + nrules
  end
  return replies
end
