-- Leases (Store::lease): the ledger of a key's live leases, which caps a token bucket's or
-- GCRA's state. Mirrors src/store/parked.rs.
--
-- The ledger follows the record (record.lua) as little-endian doubles: per lease its id,
-- units and expiry µs, in expiry order, then their count. It belongs to the key: every
-- configuration of the name keeps it, a reset too. A record with one is longer than any
-- without (LEDGERLESS_BYTES), so a key no lease touched keeps its record byte for byte.

-- The record `raw` (longer than LEDGERLESS_BYTES) without its ledger, and the ledger: a
-- flat array of id, units and expiry per lease.
local function split_ledger(raw)
  local n = struct_unpack('<d', raw, #raw - 7)
  local ends = #raw - 8 - 24 * n
  local ledger = { struct_unpack('<' .. string.rep('d', 3 * n), raw, ends + 1) }
  -- struct.unpack's last value is the position after what it read.
  ledger[#ledger] = nil
  return string.sub(raw, 1, ends), ledger
end

-- The bytes the ledger adds to its record, or nil when it is empty (the record then is as
-- if no lease ever touched the key).
local function ledger_bytes(ledger)
  local values = #ledger
  if values == 0 then
    return nil
  end
  ledger[values + 1] = values / 3
  local bytes = struct_pack('<' .. string.rep('d', values + 1), unpack(ledger))
  ledger[values + 1] = nil
  return bytes
end

-- Removes the lease whose values start at `i`; returns its units.
local function remove_lease(ledger, i)
  local units = ledger[i + 1]
  table.remove(ledger, i)
  table.remove(ledger, i)
  table.remove(ledger, i)
  return units
end

-- Algorithm::cap: the state `s` (a fresh one where it is none or expired) holding at most
-- the burst less `parked` units at `at`.
local function cap(c, s, at, parked)
  if not s or c.model.expires_at(c, s) <= at then
    s = c.model.fresh(c, at)
  end
  c.model.cap(c, s, at, parked)
  return s
end

-- Parked::settle of `ledger` at `now` on the state `s` of configuration `c`; returns the
-- settled state.
local function settle(c, s, now, ledger)
  local parked = 0
  for i = 2, #ledger, 3 do
    parked = parked + ledger[i]
  end
  while ledger[3] and ledger[3] <= now do
    s = cap(c, s, ledger[3], parked)
    parked = parked - remove_lease(ledger, 1)
  end
  return cap(c, s, now, parked)
end

-- Until when the key must be kept for its ledger (Parked::kept_until): its last lease's end
-- or, where the ledger caps the state, until a bucket emptied then is full again.
local function ledger_until(c, ledger)
  local last = ledger[#ledger]
  if not c.model.cap then
    return last
  end
  return c.model.expires_at(c, cap(c, nil, last, c.quota))
end

-- Adds the lease `id` of `units` that ends at `expiry`, in expiry order.
local function add_lease(ledger, id, units, expiry)
  local at = #ledger + 1
  while at > 1 and ledger[at - 1] > expiry do
    at = at - 3
  end
  table.insert(ledger, at, expiry)
  table.insert(ledger, at, units)
  table.insert(ledger, at, id)
end

-- Removes the lease `id`; returns its units, or nil when the ledger has none of that id.
local function end_lease(ledger, id)
  for i = 1, #ledger, 3 do
    if ledger[i] == id then
      return remove_lease(ledger, i)
    end
  end
  return nil
end
