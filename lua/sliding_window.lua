-- Sliding window counter. Mirrors src/algorithm/sliding_window.rs.
-- Config: c.p1 = limit, c.p2 = window (µs), c.p3 = the weight's step (µs, 1 = exact),
-- c.p4 = steps per window (ceil(window / step)).
-- State fields: start (of the current window), previous, current. A current count above
-- the limit is a debt: each window after pays `limit` of it and carries the rest
-- (SlidingWindow::at).
models[SLIDING_WINDOW] = function()
  -- The counters as they stand at `now` (a stored state may belong to a window before).
  local function counters_at(c, s, now)
    local turns = div(sub0(now, s[1]), c.p2)
    if turns == 0 then
      return s[1], s[2], s[3]
    end
    local before = sub0(s[3], (turns - 1) * c.p1)
    return s[1] + turns * c.p2, min(before, c.p1), sub0(before, c.p1)
  end

  -- The instant from which `count`, weighted as the previous window of the window starting
  -- at `start`, weighs at most `room` (SlidingWindow::weighs_at_most).
  local function weighs_at_most(c, start, count, room)
    local steps = c.p4
    local k = sub0(steps, div(room * steps, max(count, 1)))
    return start + min(k * c.p3, c.p2)
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
      local limit, w, steps = c.p1, c.p2, c.p4
      local start, previous, current = counters_at(c, s, now)
      local elapsed = min(sub0(now, start), w)
      -- The previous window's weight in whole units, rounded up, at the step's resolution.
      local left = sub0(steps, div(elapsed, c.p3))
      local used = cdiv(previous * left, steps) + current
      local remaining = sub0(limit, used)
      local reset = 0
      if current > 0 then
        reset = start + (1 + cdiv(current, limit)) * w - now
      elseif previous > 0 then
        reset = start + w - now
      end
      if cost > limit then
        return reject(nil, remaining, reset)
      end
      if used + cost <= limit then
        return admit(0, remaining - cost, start + 2 * w - now)
      end
      -- Within the first window whose carried count leaves room, once the window before
      -- it weighs little enough (the current one when it has room already).
      local turns = cdiv(sub0(current + cost, limit), limit)
      local then_start, then_previous, then_current =
        counters_at(c, { start, previous, current }, start + turns * w)
      local retry_at = weighs_at_most(c, then_start, then_previous, limit - then_current - cost)
      return reject(sub0(retry_at, now), remaining, reset)
    end,
    apply = function(c, s, now, cost)
      local start, previous, current = counters_at(c, s, now)
      s[1], s[2], s[3] = start, previous, current + cost
    end,
    -- Model::overdraw: the current count carries the debt, up to what the exact range pays.
    overdraw = function(c, s, now, cost)
      local start, previous, current = counters_at(c, s, now)
      s[1], s[2], s[3] = start, previous, min(current + cost, max(most_owed(c.p1, c.p2), current))
    end,
    expires_at = function(c, s)
      return s[1] + (1 + max(1, cdiv(s[3], c.p1))) * c.p2
    end,
    -- Takes back an admission of `cost` at `at` from whichever counter holds it; false
    -- where neither does.
    refund = function(c, s, now, at, cost)
      local window_of_at = at - at % c.p2
      if s[1] == window_of_at then
        s[3] = sub0(s[3], cost)
      elseif s[1] == window_of_at + c.p2 then
        s[2] = sub0(s[2], cost)
      else
        return false
      end
      return true
    end,
  }
end
