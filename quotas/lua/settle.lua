-- settle.lua: settle or refund one reservation made by admit.lua; idempotent.
-- Prepended with common.lua and gcra.lua (quotas/scripts.py).
--
-- Units
--   time     integer µs (Redis TIME unless ARGV[1] injects one)
--   tokens   integer tokens; the record holds the tokens reserved at admission
-- KEYS     the same 19 keys as admit.lua (19 = reservation record)
-- ARGV     1 now µs ('' = TIME)  2 tokens really used, or -1 to refund everything (the
--          request failed before running: its request count is given back too)
--          3 reservation id (= lease id)  4 record ttl ms (tombstone lifetime)
-- Reply    {status, reserved tokens, charged tokens}
--          status 1 settled now; 0 unknown reservation (already settled or refunded, or its
--          record expired: then it stays charged in full and its lease has expired)
-- A refund moves GCRA TATs back (tokens/min gets the unused tokens back at once), decrements
-- the budgets of the period the reservation was charged to (not a later one), and releases
-- the lease. Used tokens above the reservation are charged the same way, without a check.

local now = clock(ARGV[1])
local rec = redis.call('HMGET', KEYS[19], 'tokens', 'r', 't', 'l', 'd', 'dp', 'm', 'mp',
  'rl', 'tl')
if not rec[1] then
  if tonumber(ARGV[2]) < 0 and ARGV[4] then
    -- A refund may overtake its own admission (the caller was cancelled while admit.lua was
    -- on its way): leave a tombstone so that admission charges nothing when it arrives.
    redis.call('HSET', KEYS[19], 'void', '1')
    redis.call('PEXPIRE', KEYS[19], ARGV[4])
  end
  return {0, 0, 0}
end
local reserved = tonumber(rec[1])
local refund_all = tonumber(ARGV[2]) < 0
local used = refund_all and 0 or tonumber(ARGV[2])
local back = reserved - used  -- tokens to give back; negative: an overrun to charge

-- Move a bucket's TAT by n units (negative: back). `lim` is the limit it was charged under,
-- used when the state has expired meanwhile (a full bucket).
local function move(idx, n, lim)
  local s = redis.call('HMGET', KEYS[idx], 'tat', 'frac', 'lim')
  local tat, frac = tonumber(s[1]), tonumber(s[2]) or 0
  lim = tonumber(s[3]) or lim
  if not tat or tat < now then
    if n <= 0 then return end  -- nothing to give back to a full bucket
    tat, frac = now, 0
  end
  tat, frac = gcra_move(tat, frac, n, lim)
  gcra_store(KEYS[idx], tat, frac, lim, now)
end

local function move_all(idxs, lims, n)
  local l = ints(lims)
  for i, idx in ipairs(ints(idxs)) do move(idx, n, l[i]) end
end

if back ~= 0 then move_all(rec[3], rec[10], -back) end
if refund_all then move_all(rec[2], rec[9], -1) end
for _, idx in ipairs(ints(rec[4])) do redis.call('ZREM', KEYS[idx], ARGV[3]) end

local function unbudget(idxs, period)
  for _, idx in ipairs(ints(idxs)) do
    local b = redis.call('HMGET', KEYS[idx], 'period', 'used')
    if b[1] == period and back ~= 0 then  -- same period only: an old day is gone
      redis.call('HSET', KEYS[idx], 'used', int(math.max(0, tonumber(b[2]) - back)))
    end
  end
end
unbudget(rec[5], rec[6])
unbudget(rec[7], rec[8])

redis.call('DEL', KEYS[19])
return {1, reserved, used}
