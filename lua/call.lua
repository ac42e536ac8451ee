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

local function decide_call(KEYS, ARGV)
  local time = nil
  local replies = {}
  local k, a = 0, 1
  while a <= #ARGV do
    local nkeys, nrules = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
    local keys, args = {}, {}
    for i = 1, nkeys do
      keys[i] = KEYS[k + i]
    end
    for i = 1, 5 + nrules do
      args[i] = ARGV[a + 1 + i]
    end
    if args[1] == '' then
      if not time then
        local t = redis.call('TIME')
        time = tonumber(t[1]) * 1000000 + tonumber(t[2])
      end
      args[1] = time
    end
    k, a = k + nkeys, a + 7 + nrules
    local ok, reply = pcall(decide_batch, keys, args)
    if not ok then
      -- Redis 7 raises a command's error as a table with the message in `err`.
      if type(reply) == 'table' then
        reply = reply.err
      end
      reply = { -1, tostring(reply) }
    end
    replies[#replies + 1] = reply
  end
  return replies
end
