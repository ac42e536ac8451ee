-- Sliding window counter. Mirrors src/algorithm/sliding_window.rs.
-- Config: c.p1 = limit, c.p2 = window (µs).
-- State fields: start (of the current window), previous, current.
models[3] = function()
  -- The counters as they stand at `now` (a stored state may belong to the window before).
  local function counters_at(c, s, now)
    if now < s[1] + c.p2 then
      return s[1], s[2], s[3]
    end
    return s[1] + c.p2, s[3], 0
  end

  return {
    fields = 3,
    settled_at = function(c, s)
      return s[1]
    end,
    fresh = function(c, now)
      return { now - now % c.p2, 0, 0 }
    end,
    evaluate = function(c, s, now, cost)
      local limit, w = c.p1, c.p2
      local start, previous, current = counters_at(c, s, now)
      local elapsed = min(sub0(now, start), w)
      -- Everything below is scaled by the window: "units × µs".
      local capacity = limit * w
      local used = previous * (w - elapsed) + current * w
      local remaining = div(sub0(capacity, used), w)
      local reset = 0
      if current > 0 then
        reset = start + 2 * w - now
      elseif previous > 0 then
        reset = start + w - now
      end
      if cost > limit then
        return reject(nil, remaining, reset)
      end
      if used + cost * w <= capacity then
        local after = capacity - used - cost * w
        return admit(0, div(after, w), start + 2 * w - now)
      end
      local retry_at
      if current + cost <= limit then
        -- previous × (w − e) ≤ (limit − current − cost) × w, within this window.
        retry_at = start + w - div((limit - current - cost) * w, previous)
      else
        -- current × (w − e) ≤ (limit − cost) × w, in the next window.
        retry_at = start + 2 * w - div((limit - cost) * w, current)
      end
      return reject(sub0(retry_at, now), remaining, reset)
    end,
    apply = function(c, s, now, cost)
      local start, previous, current = counters_at(c, s, now)
      s[1], s[2], s[3] = start, previous, current + cost
    end,
    expires_at = function(c, s)
      return s[1] + 2 * c.p2
    end,
    -- Takes back an admission of `cost` at `at` from whichever counter holds it.
    refund = function(c, s, now, at, cost)
      local window_of_at = at - at % c.p2
      if s[1] == window_of_at then
        s[3] = sub0(s[3], cost)
      elseif s[1] == window_of_at + c.p2 then
        s[2] = sub0(s[2], cost)
      end
    end,
  }
end
