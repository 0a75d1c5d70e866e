-- settle.lua: settle or refund one reservation made by admit.lua; idempotent.
-- Prepended with common.lua, state.lua and gcra.lua (quotas/scripts.py).
--
-- Units
--   time     integer µs (Redis TIME unless ARGV[1] injects one)
--   tokens   integer tokens; the record holds the tokens reserved at admission
-- KEYS     1 reservation record, as in admit.lua (its header lists the record's words)
-- ARGV     1 now µs ('' = TIME)  2 tokens really used, or -1 to refund everything (the
--          request failed before running: its request count is given back too)
--          3 reservation id (= lease id)  4 record ttl ms (tombstone lifetime)
--          5 tenant scope base  6 key scope base ('' = no key scope)  7 tier, as admitted
-- Reply    {status, reserved tokens, charged tokens}
--          status 1 settled now; 0 unknown reservation (already settled or refunded, or its
--          record expired: then it stays charged in full and its lease has expired)
-- A refund moves GCRA TATs back (tokens/min gets the unused tokens back at once), decrements
-- the budgets of the period the reservation was charged to (not a later one), and releases
-- the lease. Used tokens above the reservation are charged the same way, without a check.

local now = clock(ARGV[1])
local value = redis.call('GET', KEYS[1])
if not value or value == 'void' then
  if tonumber(ARGV[2]) < 0 and ARGV[4] then
    -- A refund may overtake its own admission (the caller was cancelled while admit.lua was
    -- on its way): leave a tombstone so that admission charges nothing when it arrives.
    redis.call('SET', KEYS[1], 'void', 'PX', ARGV[4])
  end
  return {0, 0, 0}
end
local rec = {}  -- the record's words; '-' (nothing charged) as false
for word in string.gmatch(value, '%S+') do rec[#rec + 1] = word ~= '-' and word end
local reserved = tonumber(rec[1])
local refund_all = tonumber(ARGV[2]) < 0
local used = refund_all and 0 or tonumber(ARGV[2])
local back = reserved - used  -- tokens to give back; negative: an overrun to charge
local rid, tier = ARGV[3], ARGV[7]

-- Release a lease, and prune the leases that expired (holders that crashed before settling).
local function release(key)
  redis.call('ZREM', key, rid)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now))
end

local function scope(base, r, R, t, T, l, L, d, m)
  if l then release(leases_key(base)) end
  if L then release(tier_leases_key(base, tier)) end

  local moves = {}  -- {bucket, units (negative: back), limit it was charged under}
  if back ~= 0 then
    if t then moves[#moves + 1] = {'tpm', -back, tonumber(t)} end
    if T then moves[#moves + 1] = {'tpm@' .. tier, -back, tonumber(T)} end
  end
  if refund_all then
    if r then moves[#moves + 1] = {'rpm', -1, tonumber(r)} end
    if R then moves[#moves + 1] = {'rpm@' .. tier, -1, tonumber(R)} end
  end
  local budgets = {}  -- {field prefix, period id charged}
  if back ~= 0 then
    if d then budgets[#budgets + 1] = {'day', rec[2]} end
    if m then budgets[#budgets + 1] = {'month', rec[3]} end
  end
  if #moves == 0 and #budgets == 0 then return end

  local fields = {'exp'}
  for _, mv in ipairs(moves) do
    fields[#fields + 1] = mv[1] .. '.tat'
    fields[#fields + 1] = mv[1] .. '.frac'
    fields[#fields + 1] = mv[1] .. '.lim'
  end
  for _, b in ipairs(budgets) do
    fields[#fields + 1] = b[1] .. '.p'
    fields[#fields + 1] = b[1] .. '.u'
  end
  local key = state_key(base)
  local v = redis.call('HMGET', key, unpack(fields))

  local sets, need, i = {}, nil, 2
  for _, mv in ipairs(moves) do
    local name, n = mv[1], mv[2]
    local tat, frac = tonumber(v[i]), tonumber(v[i + 1]) or 0
    local lim = tonumber(v[i + 2]) or mv[3]  -- the state's own limit; the record's if expired
    i = i + 3
    if not tat or tat < now then
      tat = nil
      if n > 0 then tat, frac = now, 0 end  -- nothing to give back to a full bucket
    end
    if tat then
      tat, frac = gcra_move(tat, frac, n, lim)
      local k = #sets
      sets[k + 1], sets[k + 2] = name .. '.tat', int(tat)
      sets[k + 3], sets[k + 4] = name .. '.frac', frac
      sets[k + 5], sets[k + 6] = name .. '.lim', lim
      if tat >= now and (need == nil or tat + 1 > need) then need = tat + 1 end
    end
  end
  for _, b in ipairs(budgets) do
    if tonumber(v[i]) == tonumber(b[2]) then  -- same period only: an old day is gone
      sets[#sets + 1] = b[1] .. '.u'
      sets[#sets + 1] = int(math.max(0, tonumber(v[i + 1]) - back))
    end
    i = i + 2
  end
  if #sets > 0 then state_write(key, sets, v[1], need, now) end
end

scope(ARGV[5], unpack(rec, 4, 11))
if ARGV[6] ~= '' then scope(ARGV[6], unpack(rec, 12, 19)) end

redis.call('DEL', KEYS[1])
return {1, reserved, used}
