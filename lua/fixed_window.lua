-- Fixed window. Mirrors src/algorithm/fixed_window.rs.
-- Config: c.p1 = limit, c.p2 = window (µs), c.p3 = anchor (0 epoch, 1 first hit).
-- State fields: start, count.
models[FIXED_WINDOW] = function()
  return {
    fields = 2,
    settled_at = function(c, s)
      return s[1]
    end,
    fresh = function(c, now)
      local start = now
      if c.p3 == 0 then
        start = now - now % c.p2
      end
      return { start, 0 }
    end,
    evaluate = function(c, s, now, cost)
      local limit = c.p1
      local reset = sub0(s[1] + c.p2, now)
      local remaining = sub0(limit, s[2])
      if cost > limit then
        return reject(nil, remaining, reset)
      end
      if cost <= remaining then
        return admit(0, remaining - cost, reset)
      end
      return reject(reset, remaining, reset)
    end,
    apply = function(c, s, now, cost)
      s[2] = s[2] + cost
    end,
    expires_at = function(c, s)
      return s[1] + c.p2
    end,
    -- Takes back an admission of `cost` at `at`, if it still counts in the stored window.
    refund = function(c, s, now, at, cost)
      if s[1] <= at and at < s[1] + c.p2 then
        s[2] = sub0(s[2], cost)
      end
    end,
  }
end
