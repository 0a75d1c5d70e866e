-- usage.lua: read one scope's limits and current usage; writes nothing.
-- Prepended with common.lua, state.lua, gcra.lua and periods.lua (quotas/scripts.py).
--
-- Units
--   time     integer µs (Redis TIME unless ARGV[1] injects one)
--   rates    per 60 s window; reset = µs until the bucket is full again
--   tokens   integer tokens
-- KEYS     one scope's 1 limits hash  2 state hash  3 lease set (state.lua names them)
-- ARGV     1 now µs ('' = TIME)
-- Reply    {present, rpm limit, rpm remaining, rpm reset µs, tpm limit, tpm remaining,
--           tpm reset µs, in-flight leases, day used, month used, day end µs, month end µs,
--           now µs}   (-1: not limited)

local now = clock(ARGV[1])
local day, day_end, month, month_end = periods(now)
local L = redis.call('HMGET', KEYS[1], 'v', 'rpm', 'tpm')
local S = redis.call('HMGET', KEYS[2], 'rpm.tat', 'rpm.frac', 'rpm.lim', 'tpm.tat', 'tpm.frac',
  'tpm.lim', 'day.p', 'day.u', 'month.p', 'month.u')

local function rate(i, lim)
  if lim == nil then return -1, -1, -1 end
  local tat, frac = gcra_load(S[i], S[i + 1], S[i + 2], lim, now)
  local remaining, reset = gcra_view(tat, frac, lim, now)
  return lim, remaining, int(reset)
end

local function used(i, period)
  if tonumber(S[i]) == period then return tonumber(S[i + 1]) or 0 end
  return 0
end

local rl, rr, rs = rate(1, tonumber(L[2]))
local tl, tr, ts = rate(4, tonumber(L[3]))
local in_flight = redis.call('ZCOUNT', KEYS[3], '(' .. int(now), '+inf')  -- unexpired leases
return {L[1] and 1 or 0, rl, rr, rs, tl, tr, ts, in_flight, used(7, day), used(9, month),
        int(day_end), int(month_end), int(now)}
