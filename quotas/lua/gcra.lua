-- gcra.lua: the Generic Cell Rate Algorithm on a hash, exact in integers.
--
-- Units
--   window   60 s = 60,000,000 µs; `lim` is a count (requests or tokens) per window
--   state    three fields of the scope's state hash (state.lua): <bucket>.tat = integer µs,
--            <bucket>.frac = numerator over lim, <bucket>.lim = the limit the state used.
--            The theoretical arrival time (TAT) is tat + frac/lim µs. The emission interval of
--            one unit is WINDOW/lim µs, generally not an integer: keeping the remainder as a
--            numerator over lim makes N units in a burst of N exactly one window, so a limit
--            of N admits exactly N, never N-1 or N+1 through rounding.
--   burst    = lim: the delay variation tolerance is one whole window, so an idle bucket
--            accepts `lim` units at once and then one unit every WINDOW/lim µs.
-- Pure arithmetic on values: the scripts read and write the fields (one HMGET, one HSET a scope).

local WINDOW = 60000000  -- µs per rate window (one minute)

-- Current TAT of a bucket as (tat µs, frac), never earlier than now, from its stored fields
-- (strings or nil: a missing or stale state is a full bucket).
local function gcra_load(s_tat, s_frac, s_lim, lim, now)
  local tat = tonumber(s_tat)
  if not tat or tat < now then
    return now, 0
  end
  local frac, slim = tonumber(s_frac) or 0, tonumber(s_lim) or lim
  if slim ~= lim then
    -- The limit changed: keep the units used, not the time owed. The debt of
    -- (tat - now + frac/slim) µs is (tat - now)·slim + frac units·µs/window; under the new
    -- limit that is x/lim µs. (x ≤ 60e6 × MAX_RATE 1e8 = 6e15 < 2^53: exact.)
    local x = (tat - now) * slim + frac
    local q = math.floor(x / lim)
    local r = x - q * lim
    if r < 0 then q = q - 1; r = r + lim elseif r >= lim then q = q + 1; r = r - lim end
    return now + q, r
  end
  return tat, frac
end

-- TAT moved by n units (n < 0 moves it back): n × WINDOW/lim µs, as integer + remainder.
local function gcra_move(tat, frac, n, lim)
  local a = n * WINDOW
  local q = math.floor(a / lim)
  local r = a - q * lim
  if r < 0 then q = q - 1; r = r + lim elseif r >= lim then q = q + 1; r = r - lim end
  tat = tat + q
  frac = frac + r
  if frac >= lim then tat = tat + 1; frac = frac - lim end
  return tat, frac
end

-- (remaining units, µs until the bucket is full again) for a TAT not earlier than now.
local function gcra_view(tat, frac, lim, now)
  local d = tat - now
  local remaining = math.floor(((WINDOW - d) * lim - frac) / WINDOW)
  if remaining < 0 then remaining = 0 end
  if frac > 0 then d = d + 1 end  -- round the reset up to whole µs
  return remaining, d
end

-- Would n more units fit in a bucket at (tat, frac) (from gcra_load)? Returns ok,
-- retry_after µs (-1: never, n exceeds the burst), and the TAT to store if ok (the current
-- TAT if not).
local function gcra_check(tat, frac, lim, n, now)
  if n > lim then
    return false, -1, tat, frac
  end
  local t2, f2 = gcra_move(tat, frac, n, lim)
  local over = t2 - now - WINDOW  -- integer µs past the tolerance; f2/lim µs more
  if over > 0 or (over == 0 and f2 > 0) then
    if f2 > 0 then over = over + 1 end
    return false, over, tat, frac
  end
  return true, 0, t2, f2
end
