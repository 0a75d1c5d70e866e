-- renew.lua: extend the concurrency leases of a reservation still running (long streams).
-- Prepended with common.lua and state.lua (quotas/scripts.py).
--
-- Units
--   time     integer µs (Redis TIME unless ARGV[1] injects one)
--   leases   sorted set, member = lease id, score = expiry in µs
-- KEYS     1 reservation record, as in admit.lua (its header lists the record's words)
-- ARGV     1 now µs ('' = TIME)  2 lease id  3 lease ttl µs  4 record ttl ms
--          5 tenant scope base  6 key scope base ('' = no key scope)  7 tier, as admitted
-- Reply    number of leases extended; 0 when the reservation is unknown (settled or expired).
-- A lease that already expired is not brought back: its slot may be someone else's now.

local now = clock(ARGV[1])
local value = redis.call('GET', KEYS[1])
if not value or value == 'void' then
  return 0
end
local rec = {}
for word in string.gmatch(value, '%S+') do rec[#rec + 1] = word end
local keys = {}  -- the lease sets this reservation holds a lease in (record words 8, 9, 16, 17)
if rec[8] == '1' then keys[#keys + 1] = leases_key(ARGV[5]) end
if rec[9] == '1' then keys[#keys + 1] = tier_leases_key(ARGV[5], ARGV[7]) end
if ARGV[6] ~= '' then
  if rec[16] == '1' then keys[#keys + 1] = leases_key(ARGV[6]) end
  if rec[17] == '1' then keys[#keys + 1] = tier_leases_key(ARGV[6], ARGV[7]) end
end
local ttl = tonumber(ARGV[3])
local renewed = 0
for _, key in ipairs(keys) do
  local score = redis.call('ZSCORE', key, ARGV[2])
  if score and tonumber(score) > now then
    redis.call('ZADD', key, 'XX', int(now + ttl), ARGV[2])
    redis.call('PEXPIRE', key, ms_after(ttl))
    renewed = renewed + 1
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return renewed
