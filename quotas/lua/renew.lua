-- renew.lua: extend the concurrency leases of a reservation still running (long streams).
-- Prepended with common.lua (quotas/scripts.py).
--
-- Units
--   time     integer µs (Redis TIME unless ARGV[1] injects one)
--   leases   sorted set, member = lease id, score = expiry in µs
-- KEYS     the same 19 keys as admit.lua (19 = reservation record)
-- ARGV     1 now µs ('' = TIME)  2 lease id  3 lease ttl µs  4 record ttl ms
-- Reply    number of leases extended; 0 when the reservation is unknown (settled or expired).
-- A lease that already expired is not brought back: its slot may be someone else's now.

local now = clock(ARGV[1])
local idxs = redis.call('HGET', KEYS[19], 'l')
if not idxs then
  return 0
end
local ttl = tonumber(ARGV[3])
local renewed = 0
for _, idx in ipairs(ints(idxs)) do
  local score = redis.call('ZSCORE', KEYS[idx], ARGV[2])
  if score and tonumber(score) > now then
    redis.call('ZADD', KEYS[idx], 'XX', int(now + ttl), ARGV[2])
    redis.call('PEXPIRE', KEYS[idx], ms_after(ttl))
    renewed = renewed + 1
  end
end
redis.call('PEXPIRE', KEYS[19], ARGV[4])
return renewed
