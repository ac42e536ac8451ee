-- Token bucket, smooth or stepped refill. Mirrors src/algorithm/token_bucket.rs.
-- Config: c.p1 = capacity, c.p2 = refill amount, c.p3 = refill period (µs),
-- c.p4 = mode (0 smooth, 1 stepped).
-- State fields: level, last. Smooth: level in scaled units (one token = period units,
-- `amount` units refill per µs) as of `last`. Stepped: whole tokens as of the step `last`.
models[TOKEN_BUCKET] = function()
  -- Smooth refill: the level (scaled) at `now`.
  local function smooth_level(c, s, now)
    local full = c.p1 * c.p3
    local elapsed = sub0(now, s[2])
    local to_full = cdiv(full - min(s[1], full), c.p2)
    if elapsed >= to_full then
      return full
    end
    return s[1] + elapsed * c.p2
  end

  -- Stepped refill: the whole tokens and the step boundary at `now`.
  local function stepped_level(c, s, now)
    local capacity, amount, period = c.p1, c.p2, c.p3
    local steps = div(sub0(now, s[2]), period)
    local steps_to_full = cdiv(capacity - min(s[1], capacity), amount)
    local level = capacity
    if steps < steps_to_full then
      level = s[1] + steps * amount
    end
    return level, s[2] + steps * period
  end

  return {
    fields = 2,
    settled_at = function(c, s)
      return s[2]
    end,
    fresh = function(c, now)
      if c.p4 == 0 then
        return { c.p1 * c.p3, now }
      end
      return { c.p1, now }
    end,
    evaluate = function(c, s, now, cost)
      local capacity, amount, period = c.p1, c.p2, c.p3
      if c.p4 == 0 then
        local full = capacity * period
        local level = smooth_level(c, s, now)
        if cost > capacity then
          return reject(nil, div(level, period), cdiv(full - level, amount))
        end
        local need = cost * period
        if level >= need then
          local after = level - need
          return admit(0, div(after, period), cdiv(full - after, amount))
        end
        return reject(cdiv(need - level, amount), div(level, period), cdiv(full - level, amount))
      end
      local level, last = stepped_level(c, s, now)
      local function reset_for(l)
        local steps = cdiv(capacity - l, amount)
        if steps == 0 then
          return 0
        end
        return sub0(last + steps * period, now)
      end
      if cost > capacity then
        return reject(nil, level, reset_for(level))
      end
      if level >= cost then
        return admit(0, level - cost, reset_for(level - cost))
      end
      local steps = cdiv(cost - level, amount)
      return reject(sub0(last + steps * period, now), level, reset_for(level))
    end,
    apply = function(c, s, now, cost)
      if c.p4 == 0 then
        s[1] = smooth_level(c, s, now) - cost * c.p3
        s[2] = max(now, s[2])
      else
        local level, last = stepped_level(c, s, now)
        s[1], s[2] = level - cost, last
      end
    end,
    expires_at = function(c, s)
      local capacity, amount, period = c.p1, c.p2, c.p3
      if c.p4 == 0 then
        local full = capacity * period
        return s[2] + cdiv(full - min(s[1], full), amount)
      end
      return s[2] + cdiv(capacity - min(s[1], capacity), amount) * period
    end,
    -- Model::overdraw: a level cannot go below zero, so the tokens missing are refill owed
    -- from `now` (or from a refill already owed): the state stands as of the instant the
    -- debt is paid, and reads as held until then (settled_at). At most MAX_PRODUCT scaled
    -- taken at once, and owed at most MAX_SCALED µs from now.
    overdraw = function(c, s, now, cost)
      local amount, period = c.p2, c.p3
      local horizon = now + MAX_SCALED
      if c.p4 == 0 then
        local at = max(now, s[2])
        local need = min(cost, div(MAX_PRODUCT, period)) * period
        local level = smooth_level(c, s, at)
        if level >= need then
          s[1], s[2] = level - need, at
        else
          local wait = cdiv(need - level, amount)
          local most = sub0(horizon, at)
          if wait > most then
            s[1], s[2] = 0, at + most
          else
            s[1], s[2] = wait * amount - (need - level), at + wait
          end
        end
      else
        local level, last = stepped_level(c, s, max(now, s[2]))
        if level >= cost then
          s[1], s[2] = level - cost, last
        else
          local steps = cdiv(cost - level, amount)
          local most = div(sub0(horizon, last), period)
          if steps > most then
            s[1], s[2] = 0, last + most * period
          else
            s[1], s[2] = steps * amount - (cost - level), last + steps * period
          end
        end
      end
    end,
    mark = function(c, s, at, delay)
      return s[2]
    end,
    -- Algorithm::cap (parked.lua): the tokens at `at` (refilled to then, a step boundary
    -- kept), at most the capacity less the parked units.
    cap = function(c, s, at, parked)
      local ceiling = sub0(c.p1, parked)
      if c.p4 == 0 then
        if at > s[2] then
          s[1], s[2] = smooth_level(c, s, at), at
        end
        s[1] = min(s[1], ceiling * c.p3)
      else
        if at > s[2] then
          s[1], s[2] = stepped_level(c, s, at)
        end
        s[1] = min(s[1], ceiling)
      end
    end,
    -- Puts back `cost` tokens (up to a full bucket) as of the state's instant; with a mark,
    -- only while nothing was admitted at a later instant (step).
    refund = function(c, s, now, at, cost, mark)
      if mark ~= nil and s[2] ~= mark then
        return false
      end
      -- As of the state's own instant (TokenBucket::refund).
      if c.p4 == 0 then
        s[1] = min(c.p1 * c.p3, s[1] + cost * c.p3)
      else
        s[1] = min(c.p1, s[1] + cost)
      end
      return true
    end,
  }
end
