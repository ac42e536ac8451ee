-- The batch driver: decides a batch of rules for one request all or nothing.
-- Mirrors src/batch.rs (evaluate every rule → admits? → reservation in wait mode →
-- commit / report) and src/store/memory.rs's use of it.
--
-- KEYS: per rule in batch order, the rule's key `{prefix}:{<key>}:<rule>`, followed, for a
--   sliding log rule only, by its log `{prefix}:{<key>}:<rule>/log` (a sorted set). The
--   rule's key holds little-endian doubles (struct.pack "<d…", exact for these integers):
--   algorithm code (0 = no algorithm state), the algorithm's state fields, then the
--   penalty's locked_until, denials, window_start.
-- ARGV[1]: the instant in µs since the epoch, or "" to read the server's TIME (once).
-- ARGV[2]: max_wait in µs (wait mode: reserve a later slot if one is within reach).
-- ARGV[3]: mode. 0 decide; 1 peek (decide, write nothing); 2 deny (another slot of a Redis
--   Cluster batch denied: count the penalty denials of the rules that reject, admit nothing);
--   3 refund (take back the admissions a mode 0 call made at ARGV[5]).
-- ARGV[4]: extra milliseconds added to every TTL (the TTL is only garbage collection; the
--   state's own expiry instant is what counts, compared exactly in µs).
-- ARGV[5]: mode 3 only, the instant the admissions to refund were recorded at.
-- ARGV[6…]: one per rule, nine little-endian doubles: algorithm code, cost, p1, p2, p3, p4
--   (the algorithm's parameters, see each algorithm's file), lock_for µs, denials that lock
--   (0 = no penalty), within µs.
--
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local max_wait = tonumber(ARGV[2])
local mode = tonumber(ARGV[3])
local slack_ms = tonumber(ARGV[4])
local refund_at = tonumber(ARGV[5])

local SLIDING_LOG = 2

-- Load every rule's configuration and stored state: one GET per rule (a sliding log: one
-- ZRANGE of its newest member), nothing else before the decision.
local rules = {}
local key_index = 1
local built = {}
local formats = {}
for i = 1, #ARGV - 5 do
  local code, cost, p1, p2, p3, p4, lock_for, after, within =
    struct.unpack('<ddddddddd', ARGV[5 + i])
  local model = built[code]
  if not model then
    model = models[code]()
    built[code] = model
  end
  -- The rule is its own configuration table (`c` in the models and penalty.lua).
  local r = {
    code = code,
    model = model,
    cost = cost,
    p1 = p1,
    p2 = p2,
    p3 = p3,
    p4 = p4,
    lock_for = lock_for,
    after = after,
    within = within,
    key = KEYS[key_index],
    pen = nil,
    state = nil,
  }
  key_index = key_index + 1
  if code == SLIDING_LOG then
    r.log_key = KEYS[key_index]
    key_index = key_index + 1
  end
  if code ~= SLIDING_LOG or after > 0 then
    local raw = redis.call('GET', r.key)
    local n = raw and #raw / 8 or 0
    if n >= 4 and n == math.floor(n) then
      local format = formats[n]
      if not format then
        format = '<' .. string.rep('d', n)
        formats[n] = format
      end
      local t = { struct.unpack(format, raw) }
      r.pen = { t[n - 2], t[n - 1], t[n] }
      -- State of another algorithm (the rule was reconfigured) reads as no state.
      if t[1] == code and code ~= SLIDING_LOG and n == model.fields + 4 then
        -- The state is t[1 .. fields] once the code is gone; what follows is never read.
        table.remove(t, 1)
        r.state = t
      end
    end
  end
  if not r.pen then
    r.pen = { 0, 0, 0 }
  end
  if code == SLIDING_LOG then
    -- Only the newest entry: the model looks up the rest of the log as it needs it.
    r.state = model.load(r)
  end
  rules[i] = r
end

-- Whether the rule's stored state is live at `at` (expired or absent state is none).
local function is_live(r, at)
  return r.state and r.model.expires_at(r, r.state) > at
end

-- Algorithm::evaluate (src/algorithm/mod.rs): what `cost` gets at `at`, changing nothing.
local function algorithm_evaluate(r, at, cost)
  local model, c, s = r.model, r, r.state
  local e
  if not is_live(r, at) then
    e = model.evaluate(c, model.fresh(c, at), at, cost)
  else
    local settled = model.settled_at(c, s)
    if settled <= at then
      e = model.evaluate(c, s, at, cost)
    else
      -- A reservation holds the state until `settled`: nothing is admitted before then,
      -- and what would be admitted then is a retry for now.
      local wait = settled - at
      local later = model.evaluate(c, s, settled, cost)
      local retry = wait
      if not later.ok then
        retry = later.wait and later.wait + wait
      end
      e = reject(retry, 0, later.reset + wait)
    end
  end
  -- A cost of 0 asks for nothing and passes, even where reservations took more than is
  -- left now.
  if cost == 0 and not e.ok then
    return admit(0, e.remaining, e.reset)
  end
  return e
end

-- Step 1 (batch::evaluate): what each rule says at `at`, changing nothing.
local function evaluate_at(at)
  local items = {}
  for i = 1, #rules do
    local r = rules[i]
    local locked = nil
    if r.after > 0 then
      locked = locked_for(r.pen, at)
    end
    items[i] = { eval = algorithm_evaluate(r, at, r.cost), locked = locked, at = at }
  end
  return items
end

local function rejects(item)
  return item.locked ~= nil or not item.eval.ok
end

-- Step 2 (batch::admits).
local function admits(items)
  for i = 1, #items do
    if rejects(items[i]) then
      return false
    end
  end
  return true
end

-- Step 2 in wait mode (batch::reservation): the wait after which the batch admits, if any
-- wait can help and it is within max_wait.
-- Waits are capped at 2^50 µs whatever max_wait says, so instants stay exact.
local function reservation(items)
  local max_wait = min(max_wait, 1125899906842624)
  local wait = 0
  for i = 1, #items do
    local item = items[i]
    if rejects(item) then
      if item.locked ~= nil or item.eval.ok or item.eval.wait == nil then
        return nil
      end
      wait = max(wait, item.eval.wait)
    end
  end
  if wait <= max_wait then
    return wait
  end
  return nil
end

-- Writes a rule's state back with a TTL that ends once it is back to empty.
local function ttl_ms(expires_at)
  return cdiv(expires_at - now, 1000) + slack_ms
end

local function store_log(r)
  local s = r.state
  if s.clear then
    -- A dead log may be large: UNLINK frees it off the main thread.
    redis.call('UNLINK', r.log_key)
  elseif s.prune_before then
    local expired = redis.call('ZCOUNT', r.log_key, '-inf', int(s.prune_before))
    if expired > 0 then
      redis.call('ZREMRANGEBYRANK', r.log_key, 0, min(expired, r.model.PRUNE_BATCH) - 1)
    end
  end
  if #s.removed > 0 then
    redis.call('ZREM', r.log_key, unpack(s.removed))
  end
  if #s.added > 0 then
    local args = {}
    for i = 1, #s.added do
      args[#args + 1] = int(s.added[i][1])
      args[#args + 1] = s.added[i][2]
    end
    redis.call('ZADD', r.log_key, unpack(args))
  end
  local expires_at = r.model.expires_at(r, s)
  if expires_at > now then
    redis.call('PEXPIRE', r.log_key, int(ttl_ms(expires_at)))
  elseif not s.newest then
    redis.call('DEL', r.log_key)
  end
end

local function store(r)
  local expires_at = 0
  if r.after > 0 then
    expires_at = penalty_expires_at(r, r.pen)
  end
  local s = r.state
  local packed
  if r.code ~= SLIDING_LOG and s then
    expires_at = max(expires_at, r.model.expires_at(r, s))
    local n = r.model.fields
    if n == 1 then
      packed = struct.pack('<ddddd', r.code, s[1], r.pen[1], r.pen[2], r.pen[3])
    elseif n == 2 then
      packed = struct.pack('<dddddd', r.code, s[1], s[2], r.pen[1], r.pen[2], r.pen[3])
    else
      packed = struct.pack('<ddddddd', r.code, s[1], s[2], s[3], r.pen[1], r.pen[2], r.pen[3])
    end
  else
    packed = struct.pack('<dddd', 0, r.pen[1], r.pen[2], r.pen[3])
  end
  if expires_at > now then
    redis.call('PSETEX', r.key, int(ttl_ms(expires_at)), packed)
  else
    redis.call('DEL', r.key)
  end
end

-- Writes a rule's state after an admission or a refund: a sliding log keeps its entries
-- in a sorted set of their own.
local function store_state(r)
  if r.code == SLIDING_LOG then
    store_log(r)
  else
    store(r)
  end
end

if mode == 3 then
  for i = 1, #rules do
    local r = rules[i]
    if r.cost > 0 and is_live(r, now) then
      r.model.refund(r, r.state, now, refund_at, r.cost)
      store_state(r)
    end
  end
  -- Each rule now says Allow with its quota as it stands (the batch was denied elsewhere).
  local reply = { 0, refund_at, now }
  for i = 1, #rules do
    local r = rules[i]
    local info = algorithm_evaluate(r, now, 0)
    reply[#reply + 1] = 0
    reply[#reply + 1] = 0
    reply[#reply + 1] = info.remaining
    reply[#reply + 1] = info.reset
  end
  return reply
end

local items = evaluate_at(now)
local admitted = mode ~= 2 and admits(items)
if mode == 0 and not admitted then
  local wait = reservation(items)
  if wait then
    local reserved = evaluate_at(now + wait)
    if admits(reserved) then
      items, admitted = reserved, true
    end
  end
end

-- Step 3 (batch::commit / batch::report).
local reply = { admitted and 1 or 0, items[1] and items[1].at or now, now }
for i = 1, #rules do
  local r, item = rules[i], items[i]
  if mode ~= 1 then
    if admitted then
      if r.cost > 0 then
        if not is_live(r, item.at) then
          r.state = r.model.fresh(r, item.at)
        end
        r.model.apply(r, r.state, item.at, r.cost)
        store_state(r)
      end
    elseif r.after > 0 and item.locked == nil and not item.eval.ok and item.eval.wait ~= nil then
      -- A denial by the quota counts (batch::Evaluated::counts_for_penalty); a request
      -- already locked out or costing more than the rule can ever admit does not.
      if record_denial(r, r.pen, item.at) then
        item.locked = locked_for(r.pen, item.at)
      end
      store(r)
    end
  end
  local e = item.eval
  local outcome, value, remaining, reset
  if admitted then
    local delay = 0
    if e.ok then
      delay = (item.at - now) + e.wait
    end
    outcome = delay > 0 and 1 or 0
    -- The eval was made at the reserved instant; the reset a client sees counts from now.
    value, remaining, reset = delay, e.remaining, e.reset + (item.at - now)
  else
    local retry = e.wait
    if e.ok then
      retry = 0
    end
    if retry == nil then
      outcome, value = 4, 0
    elseif item.locked ~= nil then
      outcome, value = 3, max(retry, item.locked)
    elseif e.ok then
      outcome, value = 0, 0
    else
      outcome, value = 2, retry
    end
    -- Nothing was consumed: report the quota as it stands.
    local info = algorithm_evaluate(r, now, 0)
    remaining, reset = info.remaining, info.reset
  end
  reply[#reply + 1] = outcome
  reply[#reply + 1] = value
  reply[#reply + 1] = remaining
  reply[#reply + 1] = reset
end
return reply
