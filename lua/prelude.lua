-- tollgate: helpers shared by the algorithm files and the batch driver.
--
-- The files are concatenated in the order of `FILES` in src/store/redis/script.rs, this one
-- first, and run as one chunk (a script whose last line calls decide_call, or the body of a
-- function library's builder), so every file sees the locals declared before it.
--
-- Arithmetic: every quantity is an integer of magnitude at most 2^53 (see
-- src/algorithm/mod.rs), so doubles hold them exactly. The one sum that may pass 2^53
-- (GCRA's backlog plus a cost) is only compared with a smaller value, which monotonic
-- rounding cannot turn around. Division goes through `div` / `cdiv` (or floor(a / b),
-- ceil(a / b) written out): for |a| < 2^53 and b >= 1 the rounded a/b is never on the wrong
-- side of an integer, so they are the exact integer quotients.

local floor = math.floor
local ceil = math.ceil

local function div(a, b)
  return floor(a / b)
end

local function cdiv(a, b)
  return ceil(a / b)
end

-- a - b, or 0 when b >= a (Rust's saturating_sub).
local function sub0(a, b)
  if a > b then
    return a - b
  end
  return 0
end

local function min(a, b)
  if a < b then
    return a
  end
  return b
end

local function max(a, b)
  if a > b then
    return a
  end
  return b
end

-- The exact range (src/algorithm/mod.rs): MAX_SCALED bounds a parameter and the µs a debt
-- may take to pay off, MAX_PRODUCT a scaled quantity (and a cost, as the caller encodes it).
local MAX_SCALED, MAX_PRODUCT = 1125899906842624, 4503599627370496

-- The most units a window-counting model owes (algorithm::most_owed): what `limit` per
-- `window` pays within MAX_SCALED µs, at least one window's, at most MAX_PRODUCT. The
-- product may pass 2^53 only where it also passes MAX_PRODUCT, which rounding (monotonic)
-- cannot turn around.
local function most_owed(limit, window)
  return min(limit * max(1, div(MAX_SCALED, window)), MAX_PRODUCT)
end

-- Integers as decimal text without exponent (tostring would print 1.7e+15).
local function int(x)
  return string.format('%d', x)
end

-- What a model says about one request: admitted (with a delay) or rejected (with the exact
-- retry, nil when no wait helps), the units remaining and the microseconds until reset.
-- Mirrors `algorithm::Eval`.
local function admit(delay, remaining, reset)
  return { ok = true, wait = delay, remaining = remaining, reset = reset }
end

local function reject(retry, remaining, reset)
  return { ok = false, wait = retry, remaining = remaining, reset = reset }
end

-- The algorithm codes (the first of a rule's packed arguments, record.lua): `Code` in
-- src/store/redis/script/args.rs.
local FIXED_WINDOW, SLIDING_LOG, SLIDING_WINDOW, TOKEN_BUCKET, LEAKY_BUCKET, GCRA = 1, 2, 3, 4, 5, 6

-- What a call does with a batch (call.lua's mode): `Op` in src/store/redis/script.rs.
local MODE_DECIDE, MODE_PEEK, MODE_DENY, MODE_REFUND, MODE_REFUND_HELD, MODE_OVERDRAW, MODE_TRY = 0, 1, 2, 3, 4, 5, 6
local MODE_LEASE, MODE_END, MODE_RESET = 7, 8, 9

-- A batch's reply opens with REPLY_ADMITTED or 0, plus REPLY_AGAIN when it leaves out the
-- instants (they are the batch's just before it in the call), plus REPLY_WIDTH times the
-- values it sends per rule: `REPLY_*` in src/store/redis/script.rs. See record.lua's reply.
local REPLY_ADMITTED, REPLY_AGAIN, REPLY_WIDTH = 1, 2, 4

-- The models by algorithm code, each built when first used in a call. A model has:
-- fresh(c, now), settled_at(c, s) (the instant the state describes: its last admission,
-- later than now after a reservation), evaluate(c, s, now, cost), apply(c, s, now, cost),
-- expires_at(c, s), refund(c, s, now, at, cost, mark) (mark: what mark(c, s, at, delay)
-- said right after the admission, or nil to give back without checking), optionally mark,
-- overdraw(c, s, now, cost) (Algorithm::overdraw: units taken without a check, carried as
-- a debt), and `fields`, the length of its stored state. refund returns false
-- where it gave nothing back, 'none' where what it left is the same as no state
-- (Model::is_unused), and true otherwise.
local models = {}
