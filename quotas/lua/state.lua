-- state.lua: a scope's keys, built from its base name, and its state hash.
-- Prepended after common.lua (quotas/scripts.py).
--
-- Keys     the scripts get scope base names (quotas/keys.py KeySpace.scope) and build the
--          keys here, with the same suffixes as keys.py. A base carries the tenant's hash tag
--          {tenant}, so every key of a tenant lives in one Redis Cluster slot: the slot of the
--          script's KEYS[1] (a key of the same tenant), on the node that runs the script.
--            <base>:limits              hash of limits (quotas/store.py)
--            <base>:state               hash of rate states and budgets (below)
--            <base>:leases              sorted set of concurrency leases
--            <base>:tier:<tier>:leases  sorted set of one tier's leases (tier shares)
-- State    one hash per scope, read with one HMGET and written with one HSET:
--            <bucket>.tat .frac .lim   GCRA state (gcra.lua) of bucket rpm, tpm, or a tier's
--                                      sub-bucket rpm@<tier>, tpm@<tier>
--            day.p day.u, month.p month.u   budget period id (periods.lua), tokens used in it
--            exp                       µs: the hash lives at least until then
--          A stale GCRA state (tat before now) is a full bucket and a stale period counts as
--          zero used, so one expiry, the longest need of any field, serves the whole hash;
--          PEXPIRE is sent only when a write needs longer than `exp` (with a budget: once per
--          period, as the budget lives to the period's end).

local function limits_key(base) return base .. ':limits' end
local function state_key(base) return base .. ':state' end
local function leases_key(base) return base .. ':leases' end
local function tier_leases_key(base, tier) return base .. ':tier:' .. tier .. ':leases' end

-- HSET `sets` ({field, value, …}) into a state hash whose `exp` field read `exp` (string or
-- nil), keeping the hash until `need` µs at least (nil: nothing written needs more time).
local function state_write(key, sets, exp, need, now)
  exp = tonumber(exp)
  if exp == nil and need == nil then
    need = now  -- a new hash holding nothing that lasts: it must expire all the same
  end
  local extend = need ~= nil and (exp == nil or need > exp)
  if extend then
    sets[#sets + 1] = 'exp'
    sets[#sets + 1] = int(need)
  end
  redis.call('HSET', key, unpack(sets))
  if extend then
    redis.call('PEXPIRE', key, ms_after(need - now))
  end
end
