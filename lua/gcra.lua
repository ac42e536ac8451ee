-- GCRA. Mirrors src/algorithm/gcra.rs.
-- Config: c.p1 = burst, c.p2 = period (µs) and c.p3 = amount of the rate as the Rust side
-- computes with it (in lowest terms, or rounded down): one unit every p2 / p3 µs.
-- State fields: tat, fraction: the theoretical arrival time is tat + fraction / p3 µs, with
-- 0 <= fraction < p3.

-- The model's arithmetic on plain numbers, without tables, so the streamlined path
-- (fast.lua) decides a GCRA rule without building any; the model below wraps it.
-- What `cost` gets at `now` from the state (tat, fraction): ok, then the delay (ok) or the
-- exact retry (nil when no wait helps), the units remaining and the µs until reset.
-- Called for every GCRA decision, so `div`, `cdiv` and `sub0` are written out.
local function gcra_evaluate(c, tat, fraction, now, cost)
  local burst, period, amount = c.p1, c.p2, c.p3
  local tolerance = burst * period
  -- The backlog (TAT - now) in whole µs and scaled units: `whole` may be far beyond the
  -- tolerance after a reservation, so it is scaled only once known to be within it.
  local whole = 0
  if tat >= now then
    whole = tat - now
  else
    fraction = 0
  end
  local backlog = nil
  if whole <= floor(tolerance / amount) then
    backlog = whole * amount + fraction
    -- An admission reports what it leaves, so the units remaining and the reset before
    -- it are worked out below, for a denial only: every admission would pay for them.
    local after = backlog + cost * period
    if cost <= burst and after <= tolerance then
      return true, 0, floor((tolerance - after) / period), ceil(after / amount)
    end
  end
  local reset = whole
  if fraction > 0 then
    reset = whole + 1
  end
  local remaining = 0
  if backlog and tolerance > backlog then
    remaining = floor((tolerance - backlog) / period)
  end
  if cost > burst then
    return false, nil, remaining, reset
  end
  -- Admitted once the backlog has shrunk to tolerance - cost * period.
  local over = fraction + cost * period
  local retry
  if over >= tolerance then
    retry = whole + ceil((over - tolerance) / amount)
  else
    retry = whole - floor((tolerance - over) / amount)
  end
  return false, retry, remaining, reset
end

-- The state (tat, fraction) after `cost` is counted at `now`.
local function gcra_apply(c, tat, fraction, now, cost)
  if tat < now then
    tat, fraction = now, 0
  end
  local amount = c.p3
  fraction = fraction + cost * c.p2
  local carry = floor(fraction / amount)
  return tat + carry, fraction - carry * amount
end

models[GCRA] = function()
  -- Algorithm::mark: the scaled backlog the admission at `at` left.
  local function backlog(c, s, at)
    return sub0(s[1], at) * c.p3 + s[2]
  end
  return {
    fields = 2,
    -- The TAT already says when the next unit is due; a future TAT is no reservation to
    -- wait out but the debt the algorithm measures.
    settled_at = function(c, s)
      return 0
    end,
    fresh = function(c, now)
      return { now, 0 }
    end,
    evaluate = function(c, s, now, cost)
      local ok, wait, remaining, reset = gcra_evaluate(c, s[1], s[2], now, cost)
      if ok then
        return admit(wait, remaining, reset)
      end
      return reject(wait, remaining, reset)
    end,
    apply = function(c, s, now, cost)
      s[1], s[2] = gcra_apply(c, s[1], s[2], now, cost)
    end,
    -- Model::overdraw: the TAT moves past the tolerance by the units taken, at most
    -- MAX_PRODUCT scaled at once and MAX_SCALED µs from now.
    overdraw = function(c, s, now, cost)
      s[1], s[2] = gcra_apply(c, s[1], s[2], now, min(cost, div(MAX_PRODUCT, c.p2)))
      local horizon = now + MAX_SCALED
      if s[1] >= horizon then
        s[1], s[2] = horizon, 0
      end
    end,
    expires_at = function(c, s)
      if s[2] > 0 then
        return s[1] + 1
      end
      return s[1]
    end,
    mark = backlog,
    -- Algorithm::cap (parked.lua): a backlog of at least the parked units, the TAT no
    -- earlier than `at` plus them.
    cap = function(c, s, at, parked)
      local least = min(parked, c.p1) * c.p2
      local ahead = div(least, c.p3)
      local tat, fraction = at + ahead, least - ahead * c.p3
      if s[1] < tat or (s[1] == tat and s[2] < fraction) then
        s[1], s[2] = tat, fraction
      end
    end,
    -- Moves the theoretical arrival time back by the refunded units; with a mark, only while
    -- it is where the admission left it.
    refund = function(c, s, now, at, cost, mark)
      if mark ~= nil and (s[1] < at or backlog(c, s, at) ~= mark) then
        return false
      end
      local fraction = s[2] - cost * c.p2
      local carry = div(fraction, c.p3)
      s[1], s[2] = s[1] + carry, fraction - carry * c.p3
      return true
    end,
  }
end
