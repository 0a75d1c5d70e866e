-- usage.lua: read one scope's limits and current usage; writes nothing.
-- Prepended with common.lua, gcra.lua and periods.lua (quotas/scripts.py).
--
-- Units
--   time     integer µs (Redis TIME unless ARGV[1] injects one)
--   rates    per 60 s window; reset = µs until the bucket is full again
--   tokens   integer tokens
-- KEYS     one scope's 9 keys in quotas/keys.py SCOPE_PARTS order
-- ARGV     1 now µs ('' = TIME)
-- Reply    {present, rpm limit, rpm remaining, rpm reset µs, tpm limit, tpm remaining,
--           tpm reset µs, in-flight leases, day used, month used, day end µs, month end µs,
--           now µs}   (-1: not limited)

local now = clock(ARGV[1])
local day, day_end, month, month_end = periods(now)
local L = redis.call('HMGET', KEYS[1], 'v', 'rpm', 'tpm')

local function rate(idx, lim)
  if lim == nil then return -1, -1, -1 end
  local tat, frac = gcra_load(KEYS[idx], lim, now)
  local remaining, reset = gcra_view(tat, frac, lim, now)
  return lim, remaining, int(reset)
end

local function used(idx, period)
  local b = redis.call('HMGET', KEYS[idx], 'period', 'used')
  if tonumber(b[1]) == period then return tonumber(b[2]) or 0 end
  return 0
end

local rl, rr, rs = rate(2, tonumber(L[2]))
local tl, tr, ts = rate(3, tonumber(L[3]))
local in_flight = redis.call('ZCOUNT', KEYS[4], '(' .. int(now), '+inf')  -- unexpired leases
return {L[1] and 1 or 0, rl, rr, rs, tl, tr, ts, in_flight, used(5, day), used(6, month),
        int(day_end), int(month_end), int(now)}
