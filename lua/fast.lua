-- The streamlined batch: the common case decided without the tables batch.lua builds.
--
-- A batch takes this path when it decides or peeks (mode 0 or 1), no other Cluster slot
-- reserved it ahead (ARGV[5] = 0), and every rule is a plain one: no penalty, not a trial
-- (shadow), not a leaky bucket (whose queue moves the instant a rule counts at), not a
-- sliding log (whose state is a sorted set), and its stored state is absent, expired or its
-- own configuration's (not another configuration's carried units). Then every rule counts
-- the request at `now`, and the batch admits when every rule does. A batch that is denied
-- in wait mode (max_wait > 0) goes back to batch.lua, which looks for a reservation; so
-- does every other batch. Nothing is written before that choice is made, so the general
-- path decides such a batch from the same state. What is decided and written is exactly
-- what decide_batch decides and writes (tests/vectors.rs compares both with the Rust
-- models). Its reply is decide_batch's, except that an admitted batch is answered in short:
-- 2, now, then per rule: its delay, remaining, reset µs and refund mark, which says what
-- the long form would (reserved = now; per rule, outcome 1 with a delay, else 0, and the
-- request counted at now); src/store/redis/script.rs `parse` reads both. It is written
-- straight into the call's one reply (lua/call.lua), with no table of its own.

-- The library functions a decision calls, held in locals once (in a function library, once
-- per library load): a global is a table lookup by name on every use, a local a register
-- or an upvalue. Declared here rather than in prelude.lua: a script (EVALSHA) creates every
-- closure anew on each call, and a closure's capture of a local searches the open upvalues
-- from the newest local down, so capturing these from the prelude would cost a script call
-- ~5,000 instructions (2.7 %); here only fast.lua's and call.lua's closures capture them.
local string_format = string.format
local struct_pack = struct.pack
local struct_unpack = struct.unpack
local redis_call = redis.call
local tonumber = tonumber
local tostring = tostring
local type = type
local pcall = pcall

-- Rule configurations by their packed argument (thirteen doubles, see batch.lua's ARGV[6…]).
-- Lua interns strings, so the lookup is a hash of a pointer; the coalesced batches of one
-- call usually share their rules, and in a function library the table outlives the call.
-- Costs are part of the argument, so the table is emptied once it holds `CONFIGS_MAX`.
local configs = {}
local config_count = 0
local CONFIGS_MAX = 512

local function config_of(packed)
  local c = configs[packed]
  if c then
    return c
  end
  local code, cost, p1, p2, p3, p4, lock_for, after, within, shadow, fingerprint, quota, key_id =
    struct_unpack('<ddddddddddddd', packed)
  local model = built[code]
  if not model then
    model = models[code]()
    built[code] = model
  end
  c = {
    model = model,
    cost = cost,
    p1 = p1,
    p2 = p2,
    p3 = p3,
    p4 = p4,
    lock_for = lock_for,
    after = after,
    within = within,
    fingerprint = fingerprint,
    quota = quota,
    -- A GCRA decides on plain numbers (gcra_evaluate, gcra_apply), with no tables.
    gcra = code == GCRA,
    -- Whether the rule may take this path at all; its stored state decides the rest.
    plain = after == 0 and shadow == 0 and code ~= LEAKY_BUCKET and code ~= SLIDING_LOG,
    -- The stored record's length in doubles (head, state, penalty) and its format.
    length = model.fields + 6,
    format = '<' .. string.rep('d', model.fields + 6),
  }
  if config_count >= CONFIGS_MAX then
    configs, config_count = {}, 0
  end
  configs[packed] = c
  config_count = config_count + 1
  return c
end

-- Batch shapes (lua/call.lua's ARGV) by their bytes, parsed once: a store sends the same
-- few (counts, max_wait, mode and slack are its configuration, the rules and costs its
-- routes'), and Lua interns strings, so the lookup hashes a pointer. At most `SHAPES_MAX`
-- are kept; the table is emptied once full.
local shapes = {}
local shape_count = 0
local SHAPES_MAX = 256
local RULE_BYTES = 104

local function shape_of(bytes)
  local h = shapes[bytes]
  if h then
    return h
  end
  local newline = string.find(bytes, '\n', 1, true)
  local nkeys, nrules, max_wait, mode, slack, extra
  if newline then
    nkeys, nrules, max_wait, mode, slack, extra =
      string.match(string.sub(bytes, 1, newline - 1), '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d)$')
  end
  if not nkeys then
    error('tollgate: a malformed batch shape')
  end
  nrules = tonumber(nrules)
  if #bytes ~= newline + nrules * RULE_BYTES then
    error('tollgate: a malformed batch shape')
  end
  h = {
    nkeys = tonumber(nkeys),
    nrules = nrules,
    max_wait = tonumber(max_wait),
    mode = tonumber(mode),
    slack = tonumber(slack),
    -- Whether the instant and ARGV[5] follow as arguments (else "" and "0").
    extra = extra == '1',
    -- The rules' arguments (batch.lua's ARGV[6…]) and configurations.
    rules = {},
    configs = {},
    -- Whether every rule may take the streamlined path.
    plain = true,
  }
  for i = 1, nrules do
    local from = newline + (i - 1) * RULE_BYTES + 1
    local rule = string.sub(bytes, from, from + RULE_BYTES - 1)
    local c = config_of(rule)
    h.rules[i], h.configs[i] = rule, c
    if not c.plain then
      h.plain = false
    end
  end
  if shape_count >= SHAPES_MAX then
    shapes, shape_count = {}, 0
  end
  shapes[bytes] = h
  shape_count = shape_count + 1
  return h
end

-- The batch's rules, reused from batch to batch: per rule, its configuration, its state
-- (nil when absent or expired; a GCRA's as f_tat, f_fraction), its penalty fields (kept as
-- they are: a lock belongs to the name) and what its model says (ok, the delay or retry,
-- remaining, reset).
local f_config, f_state, f_pen1, f_pen2, f_pen3 = {}, {}, {}, {}, {}
local f_tat, f_fraction = {}, {}
local f_ok, f_wait, f_remaining, f_reset = {}, {}, {}, {}

-- Decides the batch whose keys start after KEYS[k], whose shape is `h` (shape_of), with
-- batch.lua's ARGV[1] `now` and ARGV[5] `arg5`, at `time` (the call's TIME, or nil).
-- Writes batch.lua's reply into the call's reply `out` after position `o` and returns the
-- new position, or returns nil when the batch needs the general path (nothing written
-- then, to Redis or to `out`).
local function decide_plain(KEYS, k, h, now, arg5, time, out, o)
  -- "0" is the only text of 0 a store sends as ARGV[5].
  if not h.plain or h.nkeys ~= h.nrules or arg5 ~= '0' then
    return nil
  end
  local mode = h.mode
  if mode ~= 0 and mode ~= 1 then
    return nil
  end
  local nrules = h.nrules
  local configs = h.configs
  for i = 1, nrules do
    f_config[i] = configs[i]
  end
  if now == '' then
    now = time
  else
    now = tonumber(now)
  end

  local admitted = true
  for i = 1, nrules do
    local c = f_config[i]
    local raw = redis_call('GET', KEYS[k + i])
    local s, p1, p2, p3 = nil, 0, 0, 0
    local own = false
    local t1, t2, t3, t4, t5, t6, t7, t8, t9
    if raw then
      local n = #raw / 8
      if n == c.length then
        t1, t2, t3, t4, t5, t6, t7, t8, t9 = struct_unpack(c.format, raw)
        -- Fingerprints are never 0: 0 says the record holds no algorithm state.
        own = t1 == c.fingerprint
        if not own and t1 ~= 0 then
          return nil
        end
      elseif n >= 6 and n == floor(n) then
        -- Another length: another configuration's record, or bare penalty fields.
        return nil
      end
    end
    local ok, wait, remaining, reset
    if c.gcra then
      -- The record: head (3), tat, fraction, penalty (3). Expired or absent: a fresh state.
      if t1 then
        p1, p2, p3 = t6, t7, t8
      end
      local tat, fraction = now, 0
      if own and (t5 > 0 and t4 + 1 or t4) > now then
        tat, fraction = t4, t5
      end
      f_tat[i], f_fraction[i] = tat, fraction
      ok, wait, remaining, reset = gcra_evaluate(c, tat, fraction, now, c.cost)
      -- A cost of 0 asks for nothing and passes (free_passes).
      if c.cost == 0 and not ok then
        ok, wait = true, 0
      end
    else
      if t1 then
        -- The penalty fields are the record's last three.
        local model = c.model
        local fields = model.fields
        if fields == 1 then
          p1, p2, p3 = t5, t6, t7
          if own then
            s = { t4 }
          end
        elseif fields == 2 then
          p1, p2, p3 = t6, t7, t8
          if own then
            s = { t4, t5 }
          end
        else
          p1, p2, p3 = t7, t8, t9
          if own then
            s = { t4, t5, t6 }
          end
        end
        if s and model.expires_at(c, s) <= now then
          s = nil
        end
      end
      f_state[i] = s
      local e = own_evaluate(c, s, now, c.cost)
      ok, wait, remaining, reset = e.ok, e.wait, e.remaining, e.reset
    end
    f_pen1[i], f_pen2[i], f_pen3[i] = p1, p2, p3
    f_ok[i], f_wait[i], f_remaining[i], f_reset[i] = ok, wait, remaining, reset
    if not ok then
      admitted = false
    end
  end
  if not admitted and mode == 0 and h.max_wait > 0 then
    -- Wait mode: batch.lua looks for a reservation.
    return nil
  end

  local slack = h.slack
  -- An admission is answered in short (see the header): 2, now, then per rule its delay,
  -- remaining, reset and mark.
  local r
  if admitted then
    out[o + 1] = 2
    out[o + 2] = now
    r = o + 2
  else
    out[o + 1] = 0
    out[o + 2] = now
    out[o + 3] = now
    r = o + 3
  end
  for i = 1, nrules do
    local c = f_config[i]
    local outcome, value, remaining, reset, mark = 0, 0, 0, 0, 0
    if admitted then
      if mode == 0 and c.cost > 0 then
        -- `sub0`, `max` and `cdiv` are written out below: every admission pays for them.
        local p1 = f_pen1[i]
        local used = c.quota - f_remaining[i]
        if used < 0 then
          used = 0
        end
        local packed, expires_at
        if c.gcra then
          local tat, fraction = gcra_apply(c, f_tat[i], f_fraction[i], now, c.cost)
          expires_at = fraction > 0 and tat + 1 or tat
          packed = struct_pack(c.format, c.fingerprint, used, expires_at, tat, fraction, p1, f_pen2[i], f_pen3[i])
          -- Algorithm::mark: the scaled backlog the admission left.
          if tat > now then
            mark = (tat - now) * c.p3 + fraction
          else
            mark = fraction
          end
        else
          local model = c.model
          local s = f_state[i]
          if not s then
            s = model.fresh(c, now)
          end
          model.apply(c, s, now, c.cost)
          expires_at = model.expires_at(c, s)
          local fields = model.fields
          if fields == 1 then
            packed = struct_pack(c.format, c.fingerprint, used, expires_at, s[1], p1, f_pen2[i], f_pen3[i])
          elseif fields == 2 then
            packed = struct_pack(c.format, c.fingerprint, used, expires_at, s[1], s[2], p1, f_pen2[i], f_pen3[i])
          else
            packed = struct_pack(c.format, c.fingerprint, used, expires_at, s[1], s[2], s[3], p1, f_pen2[i], f_pen3[i])
          end
          if model.mark then
            mark = model.mark(c, s, now, f_wait[i])
          end
        end
        local keep = expires_at
        if p1 > keep then
          keep = p1
        end
        if keep > now then
          -- PSETEX rather than SET … PX: fewer arguments for Redis to parse and check.
          redis_call('PSETEX', KEYS[k + i], string_format('%d', ceil((keep - now) / 1000) + slack), packed)
        else
          redis_call('DEL', KEYS[k + i])
        end
      end
      value = f_wait[i]
      if value > 0 then
        outcome = 1
      end
      remaining, reset = f_remaining[i], f_reset[i]
    else
      local wait = f_wait[i]
      if f_ok[i] then
        outcome, value = 0, 0
      elseif wait == nil then
        outcome, value = 4, 0
      else
        outcome, value = 2, wait
      end
      -- What a cost of 0 would see.
      if c.gcra then
        local _
        _, _, remaining, reset = gcra_evaluate(c, f_tat[i], f_fraction[i], now, 0)
      else
        local info = own_evaluate(c, f_state[i], now, 0)
        remaining, reset = info.remaining, info.reset
      end
    end
    if admitted then
      out[r + 1] = value
      out[r + 2] = remaining
      out[r + 3] = reset
      out[r + 4] = mark
      r = r + 4
    else
      out[r + 1] = outcome
      out[r + 2] = value
      out[r + 3] = remaining
      out[r + 4] = reset
      out[r + 5] = mark
      out[r + 6] = 0
      r = r + 6
    end
  end
  return r
end
