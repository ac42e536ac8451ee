-- The batch driver (the general path): decides a batch of rules for one request all or
-- nothing. Mirrors src/store/batch.rs (the release → evaluate every rule → admits? →
-- reservation in wait mode → commit / report) and src/store/memory/mod.rs's use of it.
--
-- KEYS: per rule in batch order, the rule's key `{prefix}:{<key>}:<rule>` (its record, see
--   record.lua), followed, for a sliding log rule only, by its log
--   `{prefix}:{<key>}:<rule>/log` (a sorted set).
-- Arguments: the batch's shape, instant and floors, as call.lua describes them.
-- Writes: the batch's reply (record.lua's reply) into the call's `out` after its position
--   `o`, admitted or not, with the reservation (the instant the request arrives at); returns
--   the new position.

-- The batch being decided, set by decide_batch, so the helpers below are not closures
-- built anew for every batch; in MODE_LEASE, the lease's id and expiry.
local now, max_wait, mode, slack_ms, release_floor, held_floor, rules, lease_id, lease_expiry

-- Whether the rule's stored state is live at `at` (expired or absent state is none).
local function is_live(r, at)
  return r.state and r.model.expires_at(r, r.state) > at
end

-- Carried::held: the units another configuration's state still holds at `at`.
local function held(r, at)
  if r.carried and at < r.carried.empty_at then
    return min(r.carried.used, r.quota)
  end
  return 0
end

-- Algorithm::adopt, from r.carried.
local function adopt(r, at, extra)
  local s = r.model.fresh(r, at)
  local units = held(r, at) + extra
  if units > 0 then
    r.model.apply(r, s, at, units)
  end
  return s
end

-- Makes `s` the rule's own state, written over another configuration's if any: the rule's
-- reply then says it adopted, so that the deny caches hear of it.
local function make_own(r, s)
  r.adopted = r.adopted or r.carried ~= nil
  r.state, r.own, r.carried = s, true, nil
end

-- Writes over another configuration's state with adopt(r, at, extra).
local function take_over(r, at, extra)
  if r.log_key then
    redis.call('DEL', r.log_key)
  end
  make_own(r, adopt(r, at, extra))
end

-- A cost of 0 asks for nothing and passes, even where reservations took more than is
-- left now.
local function free_passes(cost, e)
  if cost == 0 and not e.ok then
    return admit(0, e.remaining, e.reset)
  end
  return e
end

-- Algorithm::evaluate on the configuration's own state or none (`s` nil). Shared with
-- fast.lua.
local function own_evaluate(c, s, at, cost)
  local model = c.model
  if not s then
    return free_passes(cost, model.evaluate(c, model.fresh(c, at), at, cost))
  end
  local settled = model.settled_at(c, s)
  if settled <= at then
    return free_passes(cost, model.evaluate(c, s, at, cost))
  end
  -- A reservation holds the state until `settled`: nothing is admitted before then,
  -- and what would be admitted then is a retry for now.
  local wait = settled - at
  local later = model.evaluate(c, s, settled, cost)
  local retry = wait
  if not later.ok then
    retry = later.wait and later.wait + wait
  end
  return free_passes(cost, reject(retry, 0, later.reset + wait))
end

-- Whether the rule settles a ledger (parked.lua) before it evaluates or changes its state:
-- a token bucket's or GCRA's key with leases.
local function parks(r)
  return r.parks and r.ledger[1] ~= nil
end

-- The state a ledger settles at `at` (Entry::settle): the rule's own, or another
-- configuration's adopted, so that its units still count (none where it holds none).
local function unsettled(r, at)
  if not r.carried then
    return r.state
  elseif held(r, at) > 0 then
    return adopt(r, at, 0)
  end
  return nil
end

-- Algorithm::evaluate (src/algorithm/mod.rs): what `cost` gets at `at`, changing nothing;
-- a key with leases on a settled copy of its state and ledger.
local function algorithm_evaluate(r, at, cost)
  if parks(r) then
    local s = unsettled(r, at)
    if s and s == r.state then
      s = { s[1], s[2], s[3] }
    end
    s = settle(r, s, at, { unpack(r.ledger) })
    return own_evaluate(r, r.model.expires_at(r, s) > at and s or nil, at, cost)
  end
  local units = held(r, at)
  if units == 0 then
    return own_evaluate(r, is_live(r, at) and r.state or nil, at, cost)
  end
  -- Algorithm::evaluate_carried.
  local e = r.model.evaluate(r, adopt(r, at, 0), at, cost)
  local held_for = r.carried.empty_at - at
  if not e.ok and e.wait ~= nil then
    e = reject(held_for, e.remaining, held_for)
  elseif not (e.ok and cost > 0) then
    e.reset = held_for
  end
  return free_passes(cost, e)
end

-- The queue's own state at `at` (batch::queued_hold): another configuration's water held
-- as its own (Algorithm::adopt), or nil when empty.
local function queued_state(r, at)
  if held(r, at) > 0 then
    return adopt(r, at, 0)
  end
  if is_live(r, at) then
    return r.state
  end
  return nil
end

-- Step 0 (batch::release): the instant the rule lets a request arriving at `arrival` pass
-- (later than arrival only for a leaky bucket's queue).
local function released_at(r, arrival)
  local s = r.leaky and r.cost > 0 and not r.shadow and queued_state(r, arrival)
  if s then
    return max(arrival, r.model.expires_at(r, s))
  end
  return arrival
end

-- Step 1 (batch::evaluate): what each rule says about a request arriving at `arrival`
-- (no earlier than release_floor), changing nothing; a leaky bucket holds it until the
-- batch's release (no earlier than held_floor), and rules whose key releases it earlier
-- are pending.
local function evaluate_at(arrival)
  local reserved = max(arrival, release_floor)
  local releases = {}
  local last = max(reserved, held_floor)
  for i = 1, #rules do
    releases[i] = released_at(rules[i], reserved)
    last = max(last, releases[i])
  end
  local items = { reserved = reserved }
  for i = 1, #rules do
    local r = rules[i]
    local release = releases[i]
    for j = 1, #rules do
      if rules[j].key_id == r.key_id then
        release = max(release, releases[j])
      end
    end
    local queue = r.leaky and r.cost > 0 and not r.shadow
    local pending = not queue and release < last and r.cost > 0 and not r.shadow
    local at, held = release, nil
    if pending then
      at = last
    elseif queue then
      at = reserved
      if releases[i] < last then
        held = last
      end
    end
    local locked = nil
    if r.after > 0 then
      locked = locked_for(r.pen, arrival)
    end
    local eval, hold = nil, 0
    if held then
      eval = r.model.evaluate_held(r, at, r.cost, held)
      hold = r.model.hold(r, queued_state(r, at), at, held)
    else
      eval = algorithm_evaluate(r, at, r.cost)
    end
    -- batch::Evaluated::foreign: another configuration's units, which no reservation waits for.
    local foreign = r.carried ~= nil
    items[i] = { eval = eval, locked = locked, at = at, arrival = arrival, shadow = r.shadow, pending = pending, held = held, hold = hold, foreign = foreign }
  end
  return items
end

-- batch::retry_from: µs after `from` until the item's rule admits (nil: no wait helps); the
-- rule's own retry counts from the instant it counts the request at.
local function retry_from(item, from)
  local counted_in = sub0(item.at, from)
  if item.eval.ok then
    return counted_in
  end
  if item.eval.wait == nil then
    return nil
  end
  return counted_in + item.eval.wait
end

local function rejects(item)
  return item.locked ~= nil or not item.eval.ok
end

-- Step 2 (batch::admits): a shadow item never vetoes.
local function admits(items)
  for i = 1, #items do
    if not items[i].shadow and rejects(items[i]) then
      return false
    end
  end
  return true
end

-- Step 2 in wait mode (batch::reservation): the wait after which the batch admits, if any
-- wait can help and it is within max_wait.
-- Waits are capped at 2^50 µs whatever max_wait says, so instants stay exact.
local function reservation(items)
  local max_wait = min(max_wait, 1125899906842624)
  local wait = 0
  for i = 1, #items do
    local item = items[i]
    if not item.shadow and rejects(item) then
      local retry = retry_from(item, item.arrival)
      if item.locked ~= nil or item.foreign or retry == nil then
        return nil
      end
      wait = max(wait, retry)
    end
  end
  if wait <= max_wait then
    return wait
  end
  return nil
end

-- Writes a sliding log's changes to its sorted set, with a TTL that ends once it is back
-- to empty (a rule with a penalty's later: kept_until).
local function store_log(r)
  local s = r.state
  if s.clear then
    -- A dead log may be large: UNLINK frees it off the main thread.
    redis.call('UNLINK', r.log_key)
  elseif s.prune_before then
    local expired = redis.call('ZCOUNT', r.log_key, '-inf', int(s.prune_before))
    if expired > 0 then
      redis.call('ZREMRANGEBYRANK', r.log_key, 0, min(expired, r.model.PRUNE_BATCH) - 1)
    end
  end
  if #s.removed > 0 then
    redis.call('ZREM', r.log_key, unpack(s.removed))
  end
  if #s.added > 0 then
    local args = {}
    for i = 1, #s.added do
      args[#args + 1] = int(s.added[i][1])
      args[#args + 1] = s.added[i][2]
    end
    redis.call('ZADD', r.log_key, unpack(args))
  end
  local expires_at = kept_until(r, r.model.expires_at(r, s))
  if expires_at > now then
    redis.call('PEXPIRE', r.log_key, int(cdiv(expires_at - now, 1000) + slack_ms))
  elseif not s.newest then
    redis.call('DEL', r.log_key)
  end
end

local function store(r)
  -- The penalty's state belongs to the name and the ledger to the key: both live as long
  -- as they count, whichever configuration writes.
  local expires_at = penalty_expires_at(r.pen)
  local ledger = r.ledger and ledger_bytes(r.ledger)
  if ledger then
    expires_at = max(expires_at, ledger_until(r, r.ledger))
  end
  local s, h, p = r.state, r.head, r.pen
  local f1, f2, f3
  local foreign = nil
  if r.own then
    if s then
      expires_at = max(expires_at, r.model.expires_at(r, s))
      f1, f2, f3 = s[1], s[2], s[3]
    end
  else
    if h[1] ~= 0 then
      expires_at = max(expires_at, h[3])
    end
    foreign = r.foreign
  end
  write_record(r, r.key, expires_at, now, slack_ms, h[1], h[2], h[3], f1, f2, f3, p[1], p[2], p[3], foreign, ledger)
end

-- One rule of the batch from its packed argument and KEYS[key_index] (a sliding log's log
-- after it), its state read with one GET or from an earlier batch of the call. Returns the
-- rule and the index of the next rule's key.
local function load_rule(KEYS, key_index, packed)
  -- The rule is its own configuration table (`c` in the models, penalty.lua, record.lua),
  -- which adds: whether it is a leaky bucket (a sliding log is the rule with a `log_key`),
  -- its key, state and penalty fields, and the record's head (fingerprint, units in use and
  -- empty-at instant); `own` when this configuration wrote the state. Otherwise `carried`
  -- holds what another configuration left (its state fields are kept as they are in
  -- `foreign`), and `adopted` says whether this rule wrote over it.
  local r = rule_args(packed)
  local code = r.code
  r.leaky, r.key, r.own, r.foreign, r.adopted = code == LEAKY_BUCKET, KEYS[key_index], false, '', false
  key_index = key_index + 1
  if code == SLIDING_LOG then
    r.log_key = KEYS[key_index]
    key_index = key_index + 1
  end
  local raw = get_record(r.key)
  if raw and #raw > LEDGERLESS_BYTES then
    -- Only a token bucket or GCRA settles the ledger; another algorithm's configuration
    -- keeps it as it is.
    raw, r.ledger = split_ledger(raw)
    r.parks = r.model.cap ~= nil
  end
  local kind, f1, f2, f3, l1, l2, l3, h1, h2, h3 = read_record(r, raw)
  r.head, r.pen = { h1, h2, h3 }, { l1, l2, l3 }
  if kind == 'own' then
    r.own = true
    if code ~= SLIDING_LOG then
      r.state = { f1, f2, f3 }
    end
  elseif kind == 'foreign' then
    -- Another configuration's state: never read as this one's, nor as empty.
    r.carried = { used = h2, empty_at = h3 }
    r.foreign = string.sub(raw, 25, #raw - 24)
  end
  if code == SLIDING_LOG and not r.carried then
    -- Only the newest entry: the model looks up the rest of the log as it needs it.
    r.state = r.model.load(r)
  end
  return r, key_index
end

-- Step 3 (batch::report) for the `i`th rule `r` and its item: what it says in the reply
-- (record.lua's said_*), the request reserved at `reserved`.
local function report(i, r, item, admitted, mark, reserved)
  local e = item.eval
  local outcome, value, remaining, reset, at, hold = 0, 0, nil, nil, 0, 0
  if admitted then
    if e.ok then
      value = (item.at - now) + e.wait
    end
    -- The eval was made at the reserved instant; the reset a client sees counts from now.
    remaining, reset = e.remaining, e.reset + (item.at - now)
    at, hold = item.pending and -1 or item.at - reserved, item.hold
  else
    local retry = retry_from(item, now)
    if retry == nil then
      outcome = 3
    elseif item.locked ~= nil then
      outcome, value = 2, max(retry, item.locked)
    elseif not e.ok then
      outcome, value = 1, retry
    end
    -- Nothing was consumed: report the quota as it stands.
    local info = algorithm_evaluate(r, now, 0)
    remaining, reset = info.remaining, info.reset
  end
  said_remaining[i], said_reset[i], said_mark[i], said_value[i] = remaining, reset, mark, value
  said_outcome[i], said_at[i], said_hold[i], said_adopted[i] = outcome, at, hold, r.adopted and 1 or 0
end

-- Writes the rule's own state with its head: `remaining` units left, or, after a refund or
-- an overdraft, what the state leaves once a sliding log's entries are written.
local function store_own(r, remaining)
  if r.log_key then
    store_log(r)
  end
  remaining = remaining or algorithm_evaluate(r, now, 0).remaining
  r.head = { r.fingerprint, sub0(r.quota, remaining), r.model.expires_at(r, r.state) }
  store(r)
end

-- Settles the rule's ledger at `at` on its state itself (Entry::settle), which is then its
-- own: it takes another configuration's over.
local function settle_own(r, at)
  make_own(r, settle(r, unsettled(r, at), at, r.ledger))
end

-- What a call that decides nothing does to its `i`th rule `r`, by mode; `taken` holds the
-- floors of the refund modes and MODE_END (call.lua), unpacked.
local changes = {}

-- MODE_REFUND and MODE_REFUND_HELD: gives back the rule's admission at its instant; only
-- MODE_REFUND_HELD checks its mark (MODE_REFUND: a Cluster batch refunded right after it
-- was decided).
changes[MODE_REFUND] = function(r, i, taken)
  local at, ends, hold = taken[3 * i - 2], taken[3 * i - 1], taken[3 * i]
  local mark = mode == MODE_REFUND_HELD and ends or nil
  if r.cost > 0 and is_live(r, now) then
    local given = r.model.refund(r, r.state, now, at, r.cost, mark, hold, ends)
    if given == 'none' then
      -- The state is the same as none (Model::is_unused): no state, nothing carried.
      r.state, r.own, r.head, r.foreign = nil, false, { 0, 0, 0 }, ''
      store(r)
    elseif given then
      -- What other configurations read goes back with the units (batch::refund).
      store_own(r)
    end
  end
end
changes[MODE_REFUND_HELD] = changes[MODE_REFUND]

-- MODE_END (a lease's refund, Entry::end_lease): where the rule's lease (the mark in
-- `taken`) is still in its settled ledger, removes it and gives back the rule's cost, at
-- most the lease's units, unconditionally: the cap held them out of the state. Under
-- another configuration's state the lease is left to its term, which only the state's
-- own configuration settles.
changes[MODE_END] = function(r, i, taken)
  if r.own and parks(r) then
    settle_own(r, now)
    local units = end_lease(r.ledger, taken[3 * i - 1])
    if units then
      -- Algorithm::give_back: the state settled with the lease's units parked has room
      -- for them, so a refund without a mark gives them back.
      r.model.refund(r, r.state, now, now, min(r.cost, units), nil)
    end
    -- Settled, as the in-process store writes it: once no lease is left, another
    -- configuration reads the state as carried (algorithm_evaluate).
    store_own(r)
  end
end

-- MODE_RESET (Store::reset): forgets the rule's state, log and lock. The ledger stays,
-- since the leases' holders may still use their units: the next evaluation caps the fresh
-- state.
changes[MODE_RESET] = function(r)
  if r.log_key then
    redis.call('DEL', r.log_key)
  end
  r.state, r.own, r.carried, r.foreign = nil, false, nil, ''
  r.head, r.pen = { 0, 0, 0 }, { 0, 0, 0 }
  -- Leases that ended hold the fresh bucket down no more.
  while r.ledger and r.ledger[3] and r.ledger[3] <= now do
    remove_lease(r.ledger, 1)
  end
  store(r)
end

-- MODE_OVERDRAW (batch::overdraw): takes the rule's whole cost now (Algorithm::overdraw),
-- adopting another configuration's state first.
changes[MODE_OVERDRAW] = function(r)
  -- The cost arrives at most MAX_PRODUCT (script.rs exact_double), as the models take it.
  local cost = min(r.cost, MAX_PRODUCT)
  if cost > 0 then
    if parks(r) then
      settle_own(r, now)
    end
    if r.carried then
      take_over(r, now, 0)
    elseif not is_live(r, now) then
      r.state = r.model.fresh(r, now)
    end
    r.model.overdraw(r, r.state, now, cost)
    r.own = true
    store_own(r)
  end
end

-- Step 3 (batch::commit) for rule `r`: counts an admission in its state, or a denial in its
-- penalty, and writes what changed. Returns the admission's refund mark (0 if none).
local function commit(r, item, admitted)
  if admitted then
    if r.cost == 0 or item.pending then
      return 0
    end
    if parks(r) then
      settle_own(r, item.at)
    end
    if item.held then
      -- LeakyBucket::held: the queue before the hold has drained by its end, another
      -- configuration's too (which this writes over: the rule adopted it).
      make_own(r, r.model.held(r, item.at, r.cost, item.held))
    elseif not r.carried then
      if not is_live(r, item.at) then
        r.state = r.model.fresh(r, item.at)
      end
      r.model.apply(r, r.state, item.at, r.cost)
      r.own = true
    else
      take_over(r, item.at, r.cost)
    end
    if mode == MODE_LEASE then
      -- The units stay parked until the lease ends, its mark is its id (parked.lua).
      r.ledger, r.parks = r.ledger or {}, true
      add_lease(r.ledger, lease_id, r.cost, lease_expiry)
      store_own(r, item.eval.remaining)
      return lease_id
    end
    store_own(r, item.eval.remaining)
    if r.model.mark then
      return r.model.mark(r, r.state, item.at, item.eval.wait)
    end
  elseif r.after > 0 and not r.defers and item.locked == nil and not item.eval.ok and item.eval.wait ~= nil then
    -- batch::counts_denial.
    if record_denial(r, r.pen, item.arrival) then
      item.locked = locked_for(r.pen, item.arrival)
    end
    store(r)
  end
  return 0
end

-- Steps 2 and 3 for the batch's rules: decides, commits and reports; the reply goes into
-- `out` after `o`. Returns the new position.
local function decide_rules(o)
  -- Step 2 (batch::admits, and batch::reservation in wait mode).
  local items = evaluate_at(now)
  local admitted = mode ~= MODE_DENY and admits(items)
  if (mode == MODE_DECIDE or mode == MODE_TRY) and not admitted then
    local wait = reservation(items)
    if wait then
      local reserved = evaluate_at(now + wait)
      if admits(reserved) then
        items, admitted = reserved, true
      end
    end
  end
  -- Step 3 (batch::commit / batch::report).
  for i = 1, #rules do
    local r, item = rules[i], items[i]
    -- batch::admitted: a shadow item that would deny takes a denied item's part.
    local counted = admitted and not (item.shadow and rejects(item))
    local mark = 0
    if mode ~= MODE_PEEK and mode ~= MODE_TRY then
      mark = commit(r, item, counted)
    end
    report(i, r, item, counted, mark, items.reserved)
  end
  return reply(o, admitted, now, items.reserved - now, #rules)
end

-- Decides the batch whose keys start after KEYS[k], of shape `h`, at `at` µs with `floors`
-- (call.lua's), and writes its reply into `out` after `o`; returns the new position.
local function decide_batch(KEYS, k, h, at, floors, o)
  -- The batch being decided: the shared locals above.
  now, max_wait, mode, slack_ms = at, h.max_wait, h.mode, h.slack
  if mode == MODE_DENY then
    now, max_wait = now - max_wait, 0
  elseif mode == MODE_LEASE then
    -- A lease never waits: its max_wait is its term, its floors its id.
    lease_expiry, lease_id, max_wait, floors = now + max_wait, tonumber(floors), 0, '0'
  end
  local decides = mode <= MODE_DENY or mode == MODE_TRY or mode == MODE_LEASE
  release_floor, held_floor = now, now
  if decides then
    local least, held = string.match(floors, '^(%d+) ?(%d*)$')
    release_floor = now + tonumber(least)
    if held ~= '' then
      held_floor = now + tonumber(held)
    end
  end
  -- Every rule's configuration and stored state, nothing else before the decision.
  rules = {}
  local key_index = k + 1
  for i = 1, h.nrules do
    rules[i], key_index = load_rule(KEYS, key_index, h.rules[i])
  end
  if decides then
    return decide_rules(o)
  end
  local taken = {}
  if #rules > 0 and (mode <= MODE_REFUND_HELD or mode == MODE_END) then
    taken = { struct.unpack('<' .. string.rep('d', 3 * #rules), floors) }
  end
  -- Each rule reports as a passing rule of a batch not admitted: its quota as it stands.
  local passes = { eval = { ok = true }, at = now }
  for i = 1, #rules do
    changes[mode](rules[i], i, taken)
  end
  for i = 1, #rules do
    report(i, rules[i], passes, false, 0, now)
  end
  return reply(o, false, now, 0, #rules)
end
