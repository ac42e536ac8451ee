-- The call driver: one call decides one or more batches, each all or nothing on its own, in
-- the order they are given. A store coalesces the batches of requests that wait at the same
-- moment into one call (src/store/redis/dispatch.rs), so the call's fixed costs (entering
-- Redis's Lua, reading TIME, building the reply) are paid once for all of them.
--
-- KEYS: the batches' keys (batch.lua's KEYS), one batch after another.
-- ARGV: per batch, its shape: "<keys> <rules> <max_wait> <mode> <slack> <extra>\n" (its key
--   and rule counts, batch.lua's ARGV[2], ARGV[3], ARGV[4] as decimal integers, and 1 when
--   two more arguments follow, else 0) and then its rules' arguments (batch.lua's ARGV[6…],
--   104 bytes each), all one argument, which a call parses once per distinct value
--   (fast.lua's shape_of); then, when <extra> is 1, batch.lua's ARGV[1] (the instant, or ""
--   for the server's TIME) and ARGV[5]; when 0, they are "" and "0". TIME is read at most
--   once per call, so every batch of a call decides at the same instant.
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
-- shape is `h`, with batch.lua's ARGV[1] `now` and ARGV[5] `arg5`.
local function decide_general(KEYS, k, h, now, arg5, time)
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
    local h = shape_of(ARGV[a])
    local now, arg5 = '', '0'
    if h.extra then
      now, arg5 = ARGV[a + 1], ARGV[a + 2]
      a = a + 3
    else
      a = a + 1
    end
    if not time and now == '' then
      -- Read at most once per call, so every batch of a call decides at the same instant.
      local t = redis.call('TIME')
      time = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    -- The common case first (lua/fast.lua), straight from the call's arguments; nil sends
    -- the batch to the general path, with nothing written.
    local ok, reply = pcall(decide_plain, KEYS, k, h, now, arg5, time)
    if not ok then
      reply = failed(reply)
    elseif not reply then
      reply = decide_general(KEYS, k, h, now, arg5, time)
    end
    n = n + 1
    replies[n] = reply
    k = k + h.nkeys
  end
  return replies
end
