-- The streamlined batch: the common case decided without the tables batch.lua builds.
--
-- A batch takes this path when it decides or peeks, no other Cluster slot reserved it
-- ahead (its floors are 0), and every rule is plain: no penalty, not shadow, not a leaky
-- bucket or sliding log, its state absent, expired or its own configuration's. Every other batch,
-- and one denied in wait mode, goes to batch.lua, with nothing written. What is decided
-- and written is exactly what decide_batch would (tests/vectors.rs checks both), and so is
-- its reply (record.lua's open_reply).

-- Library functions held in locals, declared near their closures (see record.lua).
local tonumber = tonumber
local tostring = tostring
local type = type
local pcall = pcall

-- Batch shapes (lua/call.lua's ARGV) by their bytes, parsed once: a store sends the same
-- few. Emptied once it holds `SHAPES_MAX`. call.lua looks a shape up itself and calls
-- shape_of only for one it has not seen.
local shapes = {}
local shape_count = 0
local SHAPES_MAX = 256

local function shape_of(bytes)
  local newline = string.find(bytes, '\n', 1, true)
  local nkeys, nrules, max_wait, mode, slack, extra
  if newline then
    nkeys, nrules, max_wait, mode, slack, extra =
      string.match(string.sub(bytes, 1, newline - 1), '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d)$')
  end
  nrules = tonumber(nrules)
  if not nrules or #bytes ~= newline + nrules * RULE_BYTES then
    error('tollgate: a malformed batch shape')
  end
  nkeys, max_wait, mode = tonumber(nkeys), tonumber(max_wait), tonumber(mode)
  local h = {
    nkeys = nkeys,
    nrules = nrules,
    max_wait = max_wait,
    mode = mode,
    slack = tonumber(slack),
    -- Whether the instant and floors follow as arguments (else "" and "0").
    extra = extra == '1',
    -- The rules' packed arguments and configurations (record.lua's rule_args).
    rules = {},
    configs = {},
    -- Whether the batch may take the streamlined path (its rules' states decide the rest),
    -- whether it writes what it admits, and whether a denial sends it to the general path,
    -- which looks for a reservation.
    fast = nkeys == nrules and (mode == MODE_DECIDE or mode == MODE_PEEK),
    writes = mode == MODE_DECIDE,
    waits = mode == MODE_DECIDE and max_wait > 0,
  }
  for i = 1, nrules do
    local from = newline + (i - 1) * RULE_BYTES + 1
    local rule = string.sub(bytes, from, from + RULE_BYTES - 1)
    local c = rule_args(rule)
    -- A GCRA decides on plain numbers (gcra_evaluate, gcra_apply), with no tables.
    c.gcra = c.code == GCRA
    h.rules[i], h.configs[i] = rule, c
    -- Whether the rule may take this path at all; its stored state decides the rest.
    if c.after ~= 0 or c.shadow or c.code == LEAKY_BUCKET or c.code == SLIDING_LOG then
      h.fast = false
    end
  end
  if shape_count >= SHAPES_MAX then
    shapes, shape_count = {}, 0
  end
  shapes[bytes] = h
  shape_count = shape_count + 1
  return h
end

-- The batch's rules, reused from batch to batch: per rule, its state (nil when absent or
-- expired; a GCRA's as f_tat, f_fraction), its penalty fields (kept as they are: they
-- belong to the name) and what its model says: ok, then in record.lua's said_value the
-- delay or retry (nil: no wait helps), and in said_remaining and said_reset what it reports.
local f_state, f_pen1, f_pen2, f_pen3 = {}, {}, {}, {}
local f_tat, f_fraction = {}, {}
local f_ok = {}

-- Writes the admitted batch's records (in MODE_DECIDE) and its reply into `out` after
-- position `o` (record.lua's open_reply): per rule its remaining, reset and mark, then its
-- delay when one is `delayed` (the rest are 0). Returns the new position.
local function admit_plain(KEYS, k, h, now, delayed, o)
  local configs, slack = h.configs, h.slack
  local writes = h.writes
  local width = delayed and 4 or 3
  o = open_reply(o, true, now, 0, h.nrules, width)
  for i = 1, h.nrules do
    local c = configs[i]
    local mark = 0
    if writes and c.cost > 0 then
      -- `sub0` and `max` are written out: every admission pays for them.
      local p1 = f_pen1[i]
      local used = c.quota - said_remaining[i]
      if used < 0 then
        used = 0
      end
      local expires_at, f1, f2, f3
      if c.gcra then
        f1, f2 = gcra_apply(c, f_tat[i], f_fraction[i], now, c.cost)
        expires_at = f2 > 0 and f1 + 1 or f1
        -- Algorithm::mark: the scaled backlog the admission left.
        if f1 > now then
          mark = (f1 - now) * c.p3 + f2
        else
          mark = f2
        end
      else
        local model = c.model
        local s = f_state[i]
        if not s then
          s = model.fresh(c, now)
        end
        model.apply(c, s, now, c.cost)
        expires_at = model.expires_at(c, s)
        f1, f2, f3 = s[1], s[2], s[3]
        if model.mark then
          mark = model.mark(c, s, now, said_value[i])
        end
      end
      -- The penalty's state belongs to the name: the record lasts as long as its lock and
      -- its count do (penalty.lua's penalty_expires_at).
      local keep = expires_at
      if p1 > keep then
        keep = p1
      end
      if f_pen2[i] > 0 and f_pen3[i] > keep then
        keep = f_pen3[i]
      end
      write_record(c, KEYS[k + i], keep, now, slack, c.fingerprint, used, expires_at, f1, f2, f3, p1, f_pen2[i], f_pen3[i])
    end
    out[o + 1], out[o + 2], out[o + 3] = said_remaining[i], said_reset[i], mark
    if delayed then
      out[o + 4] = said_value[i]
    end
    o = o + width
  end
  return o
end

-- What the denied batch's rules say (decide_batch's); nothing is written to Redis. The
-- reply goes into `out` after position `o`. Returns the new position.
local function deny_plain(h, now, o)
  local configs = h.configs
  for i = 1, h.nrules do
    local c = configs[i]
    local outcome, value = 0, 0
    if not f_ok[i] then
      local wait = said_value[i]
      if wait == nil then
        outcome = 3
      else
        outcome, value = 1, wait
      end
    end
    -- What a cost of 0 would see.
    local remaining, reset
    if c.gcra then
      local _
      _, _, remaining, reset = gcra_evaluate(c, f_tat[i], f_fraction[i], now, 0)
    else
      local info = own_evaluate(c, f_state[i], now, 0)
      remaining, reset = info.remaining, info.reset
    end
    said_remaining[i], said_reset[i], said_mark[i] = remaining, reset, 0
    said_value[i], said_outcome[i] = value, outcome
  end
  return reply(o, false, now, 0, h.nrules, 5)
end

-- Decides the batch whose keys start after KEYS[k], of shape `h`, at `now` µs with `floors`
-- (call.lua's). Writes its reply into `out` after `o` and returns the new position, or nil
-- (nothing written) for the general path.
local function decide_plain(KEYS, k, h, now, floors, o)
  -- "0" is the only text of 0 a store sends as floors.
  if not h.fast or floors ~= '0' then
    return nil
  end
  -- Every rule's record read and evaluated into the f_ arrays.
  local configs, admitted, delayed = h.configs, true, false
  for i = 1, h.nrules do
    local c = configs[i]
    -- get_record, written out: every decision pays for it.
    local key = KEYS[k + i]
    local raw = slot[key]
    if raw then
      raw = written_record[raw]
    else
      raw = redis_call('GET', key)
    end
    local kind, f1, f2, f3, l1, l2, l3 = read_record(c, raw)
    if kind == 'foreign' then
      -- Another configuration's record: the general path decides.
      return nil
    end
    local ok, wait, remaining, reset
    if c.gcra then
      -- Expired or absent: a fresh state.
      local tat, fraction = now, 0
      if kind == 'own' and (f2 > 0 and f1 + 1 or f1) > now then
        tat, fraction = f1, f2
      end
      f_tat[i], f_fraction[i] = tat, fraction
      ok, wait, remaining, reset = gcra_evaluate(c, tat, fraction, now, c.cost)
      -- A cost of 0 asks for nothing and passes (free_passes).
      if c.cost == 0 and not ok then
        ok, wait = true, 0
      end
    else
      local s = kind == 'own' and { f1, f2, f3 } or nil
      if s and c.model.expires_at(c, s) <= now then
        s = nil
      end
      f_state[i] = s
      local e = own_evaluate(c, s, now, c.cost)
      ok, wait, remaining, reset = e.ok, e.wait, e.remaining, e.reset
    end
    f_pen1[i], f_pen2[i], f_pen3[i] = l1, l2, l3
    f_ok[i], said_value[i], said_remaining[i], said_reset[i] = ok, wait, remaining, reset
    if not ok then
      admitted = false
    elseif wait > 0 then
      delayed = true
    end
  end
  if admitted then
    return admit_plain(KEYS, k, h, now, delayed, o)
  end
  -- In wait mode batch.lua looks for a reservation.
  return not h.waits and deny_plain(h, now, o) or nil
end
