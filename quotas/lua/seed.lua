-- seed.lua: a scope's budget use, counted by the database, written where Redis holds none for
-- the current period (its state lost with a restarted or flushed server). Prepended with
-- common.lua, state.lua and periods.lua (quotas/scripts.py).
--
-- Units
--   time     integer µs (Redis TIME unless ARGV[1] injects one)
--   periods  ids of periods.lua: the counts are of the day ARGV[2] and the month ARGV[4]; a count
--            of a period that is not Redis's current one is not written (midnight passed since)
--   tokens   integer tokens
-- KEYS     1 the scope's state hash (state.lua)
-- ARGV     1 now µs ('' = TIME)  2 day id  3 tokens used that day  4 month id
--          5 tokens used that month
-- Reply    {day written 0|1, month written 0|1}. A period Redis already counts (its id stored)
--          is kept as it is: Redis's count includes what was admitted since, the database's not.

local now = clock(ARGV[1])
local day, day_end, month, month_end = periods(now)
local S = redis.call('HMGET', KEYS[1], 'exp', 'day.p', 'month.p')
local sets, need, written = {}, nil, {0, 0}
if tonumber(ARGV[2]) == day and tonumber(S[2]) ~= day then
  sets[#sets + 1], sets[#sets + 2] = 'day.p', day
  sets[#sets + 1], sets[#sets + 2] = 'day.u', int(tonumber(ARGV[3]))
  need, written[1] = day_end, 1
end
if tonumber(ARGV[4]) == month and tonumber(S[3]) ~= month then
  sets[#sets + 1], sets[#sets + 2] = 'month.p', month
  sets[#sets + 1], sets[#sets + 2] = 'month.u', int(tonumber(ARGV[5]))
  need, written[2] = month_end, 1
end
if #sets > 0 then
  state_write(KEYS[1], sets, S[1], need, now)
end
return written
