-- Sliding log. Mirrors src/algorithm/sliding_log.rs.
-- Config: c.p1 = limit, c.p2 = window (µs), c.log_key = the log (a sorted set).
-- State: the sorted set holds one member per instant, "<instant>:<cost>:<through>" scored by
-- the instant (admissions at one instant merged, as the model merges them). <through> is the
-- running total modulo 2^52 (Logged::through), so live units are a difference of totals and
-- the entry that frees enough is found by a search on rank: O(log n) lookups, never the
-- whole set.
-- The driver keeps s = { newest = the newest entry, loaded by `load` }; evaluate queries the
-- set, apply and refund leave the commands to send in s.clear (the set is dead: unlink it),
-- s.prune_before (drop up to PRUNE_BATCH members scored at or below it), s.removed and
-- s.added.
models[SLIDING_LOG] = function()
  -- Totals wrap at 2^52: a total plus an entry's units (at most 2^50) stays exact in a
  -- double, and a run of live entries never holds 2^52 units.
  local TOTAL = 4503599627370496
  -- Expired members an admission removes at most (it adds at most one), so no call pays
  -- for a whole window of expired entries at once.
  local PRUNE_BATCH = 64

  local function wrap(total)
    if total >= TOTAL then
      return total - TOTAL
    elseif total < 0 then
      return total + TOTAL
    end
    return total
  end

  local function member(e)
    return int(e.at) .. ':' .. int(e.cost) .. ':' .. int(e.through)
  end

  local function parse(m)
    if not m then
      return nil
    end
    local at, cost, through = string.match(m, '^(%d+):(%d+):(%d+)$')
    if not at then
      return nil
    end
    return { at = tonumber(at), cost = tonumber(cost), through = tonumber(through) }
  end

  -- The first member of a ZRANGE… reply, parsed.
  local function first_of(reply)
    return parse(reply[1])
  end

  local function state(newest)
    return { newest = newest, removed = {}, added = {} }
  end

  -- The oldest entry live at `now`. A call evaluates a rule at one instant more than once
  -- (the decision, then the quota it reports), so the lookup is kept until the log changes.
  local function oldest_live(c, s, now)
    if s.clear then
      -- A fresh log (Algorithm::adopt builds one over another configuration's set): the
      -- set is dead, the log is what was applied since, oldest first.
      for i = 1, #s.added do
        local e = parse(s.added[i][2])
        if e.at + c.p2 > now then
          return e
        end
      end
      return nil
    end
    if s.oldest_for ~= now then
      s.oldest = first_of(redis.call('ZRANGEBYSCORE', c.log_key, '(' .. int(now - c.p2), '+inf',
        'LIMIT', 0, 1))
      s.oldest_for = now
    end
    return s.oldest
  end

  return {
    fields = 0,
    PRUNE_BATCH = PRUNE_BATCH,
    -- The log's state, or nil when the set is empty (or written in another format, which
    -- reads as no log: the next admission replaces it).
    load = function(c)
      local newest = first_of(redis.call('ZRANGE', c.log_key, -1, -1))
      if newest then
        return state(newest)
      end
      return nil
    end,
    settled_at = function(c, s)
      if s.newest then
        return s.newest.at
      end
      return 0
    end,
    fresh = function(c, now)
      -- Whatever the set still holds is dead at `now`.
      local s = state(nil)
      s.clear = true
      return s
    end,
    evaluate = function(c, s, now, cost)
      local limit, window = c.p1, c.p2
      local newest = s.newest
      local used, before, reset = 0, 0, 0
      local oldest = nil
      if newest and newest.at + window > now then
        oldest = oldest_live(c, s, now) or newest
        before = wrap(oldest.through - oldest.cost)
        used = wrap(newest.through - before)
        reset = newest.at + window - now
      end
      local remaining = sub0(limit, used)
      if cost > limit then
        return reject(nil, remaining, reset)
      end
      if cost <= remaining then
        -- An admission logs an entry at `now`, which counts for a whole window.
        if cost > 0 then
          reset = window
        end
        return admit(0, remaining - cost, reset)
      end
      -- Admitted once enough of the oldest units have aged out: after a limit was lowered
      -- more than `limit` units may be live, and all the excess must go too.
      local to_free = used + cost - limit
      local freeing = oldest
      if oldest.cost < to_free then
        -- Search on rank between the oldest live entry (frees too little) and the newest
        -- (frees everything live); `freeing` is the entry at rank `hi`, `lo_units` /
        -- `hi_units` the units freed up to rank lo - 1 and hi. Each probe interpolates; one
        -- that does not halve the range is followed by a bisection, so probes stay within
        -- twice a binary search's. Every probe is an O(log n) ZRANGE.
        local lo = redis.call('ZCOUNT', c.log_key, '-inf', int(now - window)) + 1
        local hi = redis.call('ZCARD', c.log_key) - 1
        local lo_units, hi_units = oldest.cost, used
        local bisect = false
        freeing = newest
        while lo < hi do
          local mid
          if bisect then
            mid = div(lo + hi, 2)
          else
            -- A guess only: a product past 2^53 rounds, which the clamp absorbs.
            mid = lo - 1 + cdiv((to_free - lo_units) * (hi - lo + 1), hi_units - lo_units)
            mid = max(lo, min(mid, hi - 1))
          end
          local e = first_of(redis.call('ZRANGE', c.log_key, mid, mid))
          if not e then
            break
          end
          local width = hi - lo + 1
          local units = wrap(e.through - before)
          if units >= to_free then
            hi, hi_units = mid, units
            freeing = e
          else
            lo, lo_units = mid + 1, units
          end
          bisect = not bisect and (hi - lo + 1) * 2 > width
        end
      end
      return reject(freeing.at + window - now, remaining, reset)
    end,
    apply = function(c, s, now, cost)
      -- Expired members are dropped a batch per admission (store_log), not all at once.
      s.prune_before = now - c.p2
      s.oldest_for = nil
      local newest = s.newest
      if newest and newest.at >= now then
        -- Admissions are never earlier than the newest entry (settled_at); merging one that
        -- were into the newest would only count it longer, never less.
        s.removed[#s.removed + 1] = member(newest)
        newest = {
          at = newest.at,
          cost = newest.cost + cost,
          through = wrap(newest.through + cost),
        }
      else
        local through = cost
        if newest then
          through = wrap(newest.through + cost)
        end
        newest = { at = now, cost = cost, through = through }
      end
      s.added[#s.added + 1] = { newest.at, member(newest) }
      s.newest = newest
    end,
    -- Model::overdraw: logs the overdraft, merged with an entry at `now` or later, where
    -- its last `limit` units fall: ceil(units / limit) - 1 windows on (at most MAX_SCALED
    -- µs from now), as the units left for that window.
    overdraw = function(c, s, now, cost)
      local limit, window = c.p1, c.p2
      s.prune_before = now - window
      s.oldest_for = nil
      local newest = s.newest
      local from, units, total = now, cost, 0
      if newest and newest.at >= now then
        s.removed[#s.removed + 1] = member(newest)
        from, units, total = newest.at, newest.cost + cost, wrap(newest.through - newest.cost)
      elseif newest then
        total = newest.through
      end
      local windows = min(cdiv(units, limit) - 1, div(sub0(now + MAX_SCALED, from), window))
      local left = min(units - windows * limit, limit)
      newest = { at = from + windows * window, cost = left, through = wrap(total + left) }
      s.added[#s.added + 1] = { newest.at, member(newest) }
      s.newest = newest
    end,
    expires_at = function(c, s)
      if s.newest then
        return s.newest.at + c.p2
      end
      return 0
    end,
    -- Takes back an admission of `cost` logged at `at`; the totals of the (few) entries
    -- after it drop by what it gives back.
    refund = function(c, s, now, at, cost)
      local key = c.log_key
      local e = first_of(redis.call('ZRANGEBYSCORE', key, int(at), int(at)))
      if not e then
        return false
      end
      local back = min(e.cost, cost)
      s.oldest_for = nil
      local later = redis.call('ZRANGEBYSCORE', key, '(' .. int(at), '+inf')
      s.removed[#s.removed + 1] = member(e)
      -- An entry left with no units stays until it expires: it keeps the key closed until
      -- `at` (a reservation there pruned the entries that expire by then, and those still
      -- count before it).
      local newest = { at = e.at, cost = e.cost - back, through = wrap(e.through - back) }
      s.added[#s.added + 1] = { newest.at, member(newest) }
      for i = 1, #later do
        local l = parse(later[i])
        if l then
          s.removed[#s.removed + 1] = later[i]
          newest = { at = l.at, cost = l.cost, through = wrap(l.through - back) }
          s.added[#s.added + 1] = { newest.at, member(newest) }
        end
      end
      s.newest = newest
      return true
    end,
  }
end
