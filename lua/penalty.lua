-- Penalty lockouts. Mirrors src/penalty.rs.
-- Config: c.lock_for (µs), c.after (denials; 0 = the rule has no penalty), c.within (µs).
-- State: p = { locked_until, denials, window_end }, stored after the algorithm's fields. It
-- belongs to the name: a configuration without the penalty writing the key keeps it until
-- it expires, which the state says itself.

-- Microseconds of lock left at `now`, or nil.
local function locked_for(p, now)
  if p[1] > now then
    return p[1] - now
  end
  return nil
end

-- Records a denial at `now`; returns whether it locked the key.
local function record_denial(c, p, now)
  if p[2] == 0 or p[3] <= now then
    p[3] = now + c.within
    p[2] = 0
  end
  p[2] = p[2] + 1
  if p[2] >= c.after then
    p[1] = now + c.lock_for
    p[2] = 0
    return true
  end
  return false
end

local function penalty_expires_at(p)
  local counting = 0
  if p[2] > 0 then
    counting = p[3]
  end
  return max(counting, p[1])
end
