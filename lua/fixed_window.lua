-- Fixed window. Mirrors src/algorithm/fixed_window.rs.
-- Config: c.p1 = limit, c.p2 = window (µs), c.p3 = anchor (0 epoch, 1 first hit).
-- State fields: start, count. A count above the limit is a debt that each window after
-- pays `limit` of (FixedWindow::at).
models[FIXED_WINDOW] = function()
  -- The window holding `now` and what is left of the stored count in it.
  local function window_at(c, s, now)
    local turns = div(sub0(now, s[1]), c.p2)
    if turns == 0 then
      return s[1], s[2]
    end
    return s[1] + turns * c.p2, sub0(s[2], turns * c.p1)
  end

  local function expires(c, start, count)
    return start + max(1, cdiv(count, c.p1)) * c.p2
  end

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
      local start, count = window_at(c, s, now)
      local reset = sub0(expires(c, start, count), now)
      local remaining = sub0(limit, count)
      if cost > limit then
        return reject(nil, remaining, reset)
      end
      if cost <= remaining then
        return admit(0, remaining - cost, reset)
      end
      -- Each window pays `limit` of the count: the first window with room admits.
      local windows = cdiv(sub0(count + cost, limit), limit)
      return reject(start + windows * c.p2 - now, remaining, reset)
    end,
    apply = function(c, s, now, cost)
      local start, count = window_at(c, s, now)
      s[1], s[2] = start, count + cost
    end,
    -- Model::overdraw: the count carries the debt, up to what the exact range pays.
    overdraw = function(c, s, now, cost)
      local start, count = window_at(c, s, now)
      s[1], s[2] = start, min(count + cost, max(most_owed(c.p1, c.p2), count))
    end,
    expires_at = function(c, s)
      return expires(c, s[1], s[2])
    end,
    -- Takes back an admission of `cost` at `at`, if it still counts in the stored window
    -- (false where it does not); returns 'none' where that leaves a first-hit window that
    -- has started counting nothing, which never started (FixedWindow::is_unused).
    refund = function(c, s, now, at, cost)
      if s[1] <= at and at < s[1] + c.p2 then
        s[2] = sub0(s[2], cost)
        if c.p3 == 1 and s[2] == 0 and s[1] <= now then
          return 'none'
        end
        return true
      end
      return false
    end,
  }
end
