-- admit.lua: check every limit of one request and charge all of them, or none.
-- Prepended with common.lua, gcra.lua and periods.lua (quotas/scripts.py).
--
-- Units
--   time     integer µs (Redis TIME unless ARGV[1] injects one); rates per 60 s window
--   tokens   integer tokens: prompt + max completion tokens, reserved up front
--   leases   sorted set, member = lease id, score = expiry in µs
--   budgets  hash {period = day or month id (periods.lua), used = tokens}
--   record   hash of what was charged, read by settle.lua; TTL in ms
-- KEYS     per scope (tenant = 1..9, key = 10..18), in quotas/keys.py SCOPE_PARTS order:
--          +1 limits  +2 rpm  +3 tpm  +4 leases  +5 day  +6 month
--          +7 tier rpm  +8 tier tpm  +9 tier leases;   19 = reservation record
-- ARGV     1 now µs ('' = TIME)  2 tier  3 tokens to reserve  4 max_tokens (completion)
--          5 reservation id (= lease id)  6 lease ttl µs  7 record ttl ms  8 scopes (1 or 2)
-- Reply    {status, limit, scope, retry_after µs (-1 never),
--           requests limit, remaining, reset µs, tokens limit, remaining, reset µs}
--          (-1 in the six header fields: that rate is not limited)
--          status 1 admitted and charged; 0 refused, nothing charged;
--          -1 the limits hash of `scope` is missing, nothing charged (caller loads, retries)
--          (limit 'cancelled': the reservation was refunded already, see settle.lua)

if redis.call('EXISTS', KEYS[19]) == 1 then
  -- This reservation was refunded before it arrived (settle.lua's tombstone): charge nothing.
  return {0, 'cancelled', '', -1, -1, -1, -1, -1, -1, -1}
end

local now = clock(ARGV[1])
local tier, cost, max_tokens, rid = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local lease_ttl, record_ttl, nscopes = tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8])
local day, day_end, month, month_end = periods(now)

local refusal = nil          -- {limit, scope, retry µs}: the one that waits longest
local writes = {}            -- deferred charges, applied only if nothing refuses
-- KEYS indices charged (and the rate limits used, rl/tl), recorded for settle.lua
local charged = {r = {}, t = {}, l = {}, d = {}, m = {}, rl = {}, tl = {}}
local info = {}              -- info.req / info.tok = {limit, remaining, reset}: strictest

local function refuse(limit, scope, retry)
  if refusal == nil or (refusal[3] ~= -1 and (retry == -1 or retry > refusal[3])) then
    refusal = {limit, scope, retry}
  end
end

local function note(kind, lim, remaining, reset)
  local cur = info[kind]
  if cur == nil or remaining < cur[2] or (remaining == cur[2] and reset > cur[3]) then
    info[kind] = {lim, remaining, reset}
  end
end

local function rate(limit, scope, idx, lim, n, kind, tag)
  if lim == nil then return end
  local ok, retry, tat, frac = gcra_check(KEYS[idx], lim, n, now)
  local remaining, reset = gcra_view(tat, frac, lim, now)
  note(kind, lim, remaining, reset)
  if not ok then
    refuse(limit, scope, retry)
  elseif n > 0 then
    writes[#writes + 1] = {'gcra', idx, tat, frac, lim}
    table.insert(charged[tag], idx)
    table.insert(charged[tag .. 'l'], lim)
  end
end

local function lease(scope, idx, lim)
  if lim == nil then return end
  redis.call('ZREMRANGEBYSCORE', KEYS[idx], '-inf', int(now))  -- expired: crashed holders
  if redis.call('ZCARD', KEYS[idx]) < lim then
    writes[#writes + 1] = {'lease', idx}
    table.insert(charged.l, idx)
  elseif lim == 0 then
    refuse('concurrency', scope, -1)
  else
    -- Leases are normally released by settlement, long before they expire: retry within 1 s.
    local first = redis.call('ZRANGE', KEYS[idx], 0, 0, 'WITHSCORES')
    refuse('concurrency', scope, math.min(tonumber(first[2]) - now, 1000000))
  end
end

local function budget(limit, scope, idx, lim, period, period_end, tag)
  if lim == nil then return end
  local b = redis.call('HMGET', KEYS[idx], 'period', 'used')
  local used = 0
  if tonumber(b[1]) == period then used = tonumber(b[2]) or 0 end
  if cost > lim then
    refuse(limit, scope, -1)
  elseif used + cost > lim then
    refuse(limit, scope, period_end - now)  -- the budget renews when the period ends
  elseif cost > 0 then
    writes[#writes + 1] = {'budget', idx, period, used + cost, period_end}
    table.insert(charged[tag], idx)
  end
end

-- A tier's share of a scope's limit: the limit of that tier's sub-bucket.
local function scaled(lim, share)
  if lim == nil or share == nil then return nil end
  return math.max(1, math.floor(lim * share))
end

for s = 1, nscopes do
  local b = (s - 1) * 9
  local scope = (s == 1) and 'tenant' or 'key'
  local L = redis.call('HMGET', KEYS[b + 1], 'v', 'rpm', 'tpm', 'conc', 'day', 'month',
    'maxtok', 'tiers', 'shares')
  if not L[1] then
    return {-1, '', scope, -1, -1, -1, -1, -1, -1, -1}
  end
  local rpm, tpm, conc = tonumber(L[2]), tonumber(L[3]), tonumber(L[4])
  if L[8] and not string.find(L[8], ',' .. tier .. ',', 1, true) then
    refuse('tier', scope, -1)
  end
  if L[7] and max_tokens > tonumber(L[7]) then
    refuse('max_tokens', scope, -1)
  end
  local share = nil
  for name, value in string.gmatch(L[9] or '', '([^,=]+)=([^,]+)') do
    if name == tier then share = tonumber(value) end
  end
  lease(scope, b + 4, conc)
  lease(scope, b + 9, scaled(conc, share))
  rate('requests_per_minute', scope, b + 2, rpm, 1, 'req', 'r')
  rate('requests_per_minute', scope, b + 7, scaled(rpm, share), 1, 'req', 'r')
  rate('tokens_per_minute', scope, b + 3, tpm, cost, 'tok', 't')
  rate('tokens_per_minute', scope, b + 8, scaled(tpm, share), cost, 'tok', 't')
  budget('daily_budget', scope, b + 5, tonumber(L[5]), day, day_end, 'd')
  budget('monthly_budget', scope, b + 6, tonumber(L[6]), month, month_end, 'm')
end

local req, tok = info.req or {-1, -1, -1}, info.tok or {-1, -1, -1}
if refusal ~= nil then
  return {0, refusal[1], refusal[2], int(refusal[3]), req[1], req[2], int(req[3]),
          tok[1], tok[2], int(tok[3])}
end

for _, w in ipairs(writes) do
  local key = KEYS[w[2]]
  if w[1] == 'gcra' then
    gcra_store(key, w[3], w[4], w[5], now)
  elseif w[1] == 'lease' then
    redis.call('ZADD', key, int(now + lease_ttl), rid)
    redis.call('PEXPIRE', key, ms_after(lease_ttl))  -- newest lease expires last
  else
    redis.call('HSET', key, 'period', int(w[3]), 'used', int(w[4]))
    redis.call('PEXPIRE', key, ms_after(w[5] - now))
  end
end

redis.call('HSET', KEYS[19], 'tokens', int(cost),
  'r', table.concat(charged.r, ','), 't', table.concat(charged.t, ','),
  'rl', table.concat(charged.rl, ','), 'tl', table.concat(charged.tl, ','),
  'l', table.concat(charged.l, ','), 'd', table.concat(charged.d, ','), 'dp', int(day),
  'm', table.concat(charged.m, ','), 'mp', int(month))
redis.call('PEXPIRE', KEYS[19], record_ttl)
return {1, '', '', 0, req[1], req[2], int(req[3]), tok[1], tok[2], int(tok[3])}
