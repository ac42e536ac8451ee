-- Sliding log. Mirrors src/algorithm/sliding_log.rs.
-- Config: c.p1 = limit, c.p2 = window (µs).
-- State: a sorted set beside the rule's key (its second key), one member per instant,
-- "<instant>:<cost>" scored by the instant. Admissions at the same instant are merged into
-- one member (as the model merges them), so members are unique and no entry is lost when two
-- requests share a microsecond. The driver loads the members in time order into s.entries
-- ({t, cost} pairs); apply and refund leave the commands to send in s.prune_before (remove
-- every member scored at or below it), s.removed and s.added.
models[2] = function()
  local function log_member(t, cost)
    return int(t) .. ':' .. int(cost)
  end

  return {
    fields = 0,
    settled_at = function(c, s)
      local entries = s.entries
      if #entries == 0 then
        return 0
      end
      return entries[#entries][1]
    end,
    fresh = function(c, now)
      -- Whatever the set still holds is dead at `now`.
      return { entries = {}, prune_before = now - c.p2, removed = {}, added = {} }
    end,
    evaluate = function(c, s, now, cost)
      local limit, window = c.p1, c.p2
      local entries = s.entries
      local used = 0
      for i = 1, #entries do
        local e = entries[i]
        if e[1] + window > now then
          used = used + e[2]
        end
      end
      local remaining = sub0(limit, used)
      local newest = now
      if #entries > 0 then
        newest = entries[#entries][1]
      end
      if cost > limit then
        return reject(nil, remaining, sub0(newest + window, now))
      end
      if cost <= remaining then
        return admit(0, remaining - cost, window)
      end
      -- Admitted once enough of the oldest entries have aged out.
      local to_free = cost - remaining
      local retry = nil
      for i = 1, #entries do
        local e = entries[i]
        if e[1] + window > now then
          to_free = sub0(to_free, e[2])
          if to_free == 0 then
            retry = e[1] + window - now
            break
          end
        end
      end
      return reject(retry, remaining, sub0(newest + window, now))
    end,
    apply = function(c, s, now, cost)
      local entries, window = s.entries, c.p2
      local first = 1
      while first <= #entries and entries[first][1] + window <= now do
        first = first + 1
      end
      if first > 1 then
        s.prune_before = now - window
      end
      local kept = {}
      for i = first, #entries do
        kept[#kept + 1] = entries[i]
      end
      -- Entries stay in time order even when a reservation logged one in the future.
      local at = 0
      for i = #kept, 1, -1 do
        if kept[i][1] <= now then
          at = i
          break
        end
      end
      if at > 0 and kept[at][1] == now then
        s.removed[#s.removed + 1] = log_member(now, kept[at][2])
        kept[at] = { now, kept[at][2] + cost }
      else
        at = at + 1
        table.insert(kept, at, { now, cost })
      end
      s.added[#s.added + 1] = { now, log_member(now, kept[at][2]) }
      s.entries = kept
    end,
    expires_at = function(c, s)
      local entries = s.entries
      if #entries == 0 then
        return 0
      end
      return entries[#entries][1] + c.p2
    end,
    -- Takes back an admission of `cost` logged at `at`. An entry left with no units stays
    -- until it expires: it keeps the key closed until `at` (a reservation there pruned the
    -- entries that expire by then, and those still count before it).
    refund = function(c, s, now, at, cost)
      local entries = s.entries
      for i = 1, #entries do
        local e = entries[i]
        if e[1] == at then
          s.removed[#s.removed + 1] = log_member(at, e[2])
          local left = sub0(e[2], cost)
          entries[i] = { at, left }
          s.added[#s.added + 1] = { at, log_member(at, left) }
          return
        end
      end
    end,
  }
end
