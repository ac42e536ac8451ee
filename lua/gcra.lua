-- GCRA. Mirrors src/algorithm/gcra.rs.
-- Config: c.p1 = burst, c.p2 = emission interval (µs, computed by the Rust side).
-- State fields: tat (theoretical arrival time).
models[6] = function()
  return {
    fields = 1,
    -- The TAT already says when the next unit is due; a future TAT is no reservation to
    -- wait out but the debt the algorithm measures.
    settled_at = function(c, s)
      return 0
    end,
    fresh = function(c, now)
      return { now }
    end,
    evaluate = function(c, s, now, cost)
      local burst, interval = c.p1, c.p2
      local tolerance = burst * interval
      local backlog = max(s[1], now) - now
      local remaining = div(tolerance - min(backlog, tolerance), interval)
      if cost > burst then
        return reject(nil, remaining, backlog)
      end
      local after = backlog + cost * interval
      if after <= tolerance then
        return admit(0, div(tolerance - after, interval), after)
      end
      return reject(after - tolerance, remaining, backlog)
    end,
    apply = function(c, s, now, cost)
      s[1] = max(s[1], now) + cost * c.p2
    end,
    expires_at = function(c, s)
      return s[1]
    end,
    mark = function(c, s, at, delay)
      return s[1]
    end,
    -- Moves the theoretical arrival time back by the refunded units, only while it is where
    -- the admission left it (with a mark).
    refund = function(c, s, now, at, cost, mark)
      if mark ~= nil and s[1] ~= mark then
        return false
      end
      s[1] = sub0(s[1], cost * c.p2)
      return true
    end,
  }
end
