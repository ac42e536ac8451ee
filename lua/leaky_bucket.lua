-- Leaky bucket (shaping). Mirrors src/algorithm/leaky_bucket.rs.
-- Config: c.p1 = capacity, c.p2 = drain amount, c.p3 = drain period (µs).
-- State fields: level (scaled: one unit = period; `amount` drains per µs), last.
models[LEAKY_BUCKET] = function()
  local function leaky_level(c, s, now)
    local drained = sub0(now, s[2])
    if drained >= cdiv(s[1], c.p2) then
      return 0
    end
    return s[1] - drained * c.p2
  end

  -- LeakyBucket::mark: the queue's end after the admission at `at`, as water from `at`.
  local function queue_end(c, s, at)
    return sub0(s[2], at) * c.p2 + s[1]
  end
  return {
    fields = 2,
    settled_at = function(c, s)
      return s[2]
    end,
    fresh = function(c, now)
      return { 0, now }
    end,
    evaluate = function(c, s, now, cost)
      local capacity, amount, period = c.p1, c.p2, c.p3
      local full = capacity * period
      local level = leaky_level(c, s, now)
      -- More water than the queue holds when the rule was reconfigured smaller: full.
      local remaining = div(sub0(full, level), period)
      if cost > capacity then
        return reject(nil, remaining, cdiv(level, amount))
      end
      local after = level + cost * period
      if after <= full then
        -- Held until the water queued before it has drained; a request that adds no water
        -- does not queue.
        local delay = 0
        if cost > 0 then
          delay = cdiv(level, amount)
        end
        return admit(delay, div(full - after, period), cdiv(after, amount))
      end
      return reject(cdiv(after - full, amount), remaining, cdiv(level, amount))
    end,
    -- LeakyBucket::evaluate_held: a request of `cost` (at least 1) arriving at `at` that its
    -- batch releases at `release`, later than this queue alone would: the time until then
    -- reads as queued water; the state's own water has drained by then.
    evaluate_held = function(c, at, cost, release)
      local capacity, amount, period = c.p1, c.p2, c.p3
      local full = capacity * period
      local wait = sub0(release, at)
      -- Beyond a full queue the water only decides the retry, computed without it.
      local remaining = div(sub0(full, wait * amount), period)
      if cost > capacity then
        return reject(nil, remaining, wait)
      end
      -- The longest hold the queue has room for, with the request's units after it.
      local slack = div(full - cost * period, amount)
      if wait > slack then
        return reject(wait - slack, remaining, wait)
      end
      local after = wait * amount + cost * period
      return admit(wait, div(full - after, period), cdiv(after, amount))
    end,
    -- LeakyBucket::held: the state after admitting what evaluate_held admitted.
    held = function(c, at, cost, release)
      return { sub0(release, at) * c.p2 + cost * c.p3, at }
    end,
    -- LeakyBucket::hold: the water `held` adds above the queue's own in `s` (nil: empty),
    -- which a refund drains with the units.
    hold = function(c, s, at, release)
      local own = 0
      if s ~= nil then
        own = leaky_level(c, s, at)
      end
      return sub0(sub0(release, at) * c.p2, own)
    end,
    apply = function(c, s, now, cost)
      s[1] = leaky_level(c, s, now) + cost * c.p3
      s[2] = max(now, s[2])
    end,
    -- Model::overdraw: water above the capacity, at most MAX_PRODUCT scaled and drained
    -- within MAX_SCALED µs.
    overdraw = function(c, s, now, cost)
      local level = leaky_level(c, s, now)
      local water = min(cost, div(MAX_PRODUCT, c.p3)) * c.p3
      local most = max(min(MAX_SCALED * c.p2, MAX_PRODUCT), level)
      s[1] = min(level + water, most)
      s[2] = max(now, s[2])
    end,
    expires_at = function(c, s)
      return s[2] + cdiv(s[1], c.p2)
    end,
    mark = queue_end,
    -- Drains `cost` units back out of the queue as of the state's instant; with a mark,
    -- only while nothing queued behind them (the mark is unchanged): requests behind keep
    -- their release. The water a hold added (`hold`) goes with them only while the queue
    -- still ends at `ends` (the admission's mark, given even where they go back without).
    refund = function(c, s, now, at, cost, mark, hold, ends)
      local queued = queue_end(c, s, at)
      if mark ~= nil and queued ~= mark then
        return false
      end
      if queued ~= ends then
        hold = 0
      end
      -- As of the state's own instant (LeakyBucket::refund).
      s[1] = sub0(s[1], cost * c.p3 + hold)
      return true
    end,
  }
end
