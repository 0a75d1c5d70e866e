-- admit.lua: check every limit of one request and charge all of them, or none.
-- Prepended with common.lua, state.lua, gcra.lua and periods.lua (quotas/scripts.py).
--
-- Units
--   time     integer µs (Redis TIME unless ARGV[1] injects one); rates per 60 s window
--   tokens   integer tokens: prompt + max completion tokens, reserved up front
--   leases   sorted set, member = lease id, score = expiry in µs
--   budgets  state hash fields {day|month}.p = period id (periods.lua), .u = tokens used
--   record   string of what was charged, read by settle.lua and renew.lua; TTL in ms.
--            19 words, space-separated: tokens, day period id, month period id, then for
--            the tenant scope and the key scope: r R t T (limit of the charged rpm bucket,
--            the tier's rpm sub-bucket, tpm, the tier's tpm) l L ('1': a lease, a tier lease)
--            d m ('1': the day, the month budget); '-' where nothing was charged.
--            'void' is the tombstone of a refund that came first (settle.lua).
-- KEYS     1 reservation record (<tenant base>:res:<id>, quotas/keys.py). The scopes' keys are
--          built from their bases (state.lua): all carry the tenant's hash tag, so they are
--          in KEYS[1]'s cluster slot.
--          2 (optional) a stream to add the caller's entry to if admitted (Limiter.admit's
--          enqueue; on Redis Cluster it must share the tenant's slot)
-- ARGV     1 now µs ('' = TIME)  2 tier  3 tokens to reserve  4 max_tokens (completion)
--          5 reservation id (= lease id)  6 lease ttl µs  7 record ttl ms
--          8 tenant scope base  9 key scope base ('' = no key scope)
--          10.. the entry's field, value pairs (with KEYS[2])
-- Reply    {status, limit, scope, retry_after µs (-1 never),
--           requests limit, remaining, reset µs, tokens limit, remaining, reset µs,
--           [entry id: with KEYS[2], when admitted]}
--          (-1 in the six header fields: that rate is not limited)
--          (admitted: the rates with this request charged; refused: the rates as they are)
--          status 1 admitted and charged; 0 refused, nothing charged;
--          -1 the limits hash of `scope` is missing, nothing charged (caller loads, retries)
--          (limit 'cancelled': the reservation was refunded already, see settle.lua)

if redis.call('EXISTS', KEYS[1]) == 1 then
  -- This reservation was refunded before it arrived (settle.lua's tombstone): charge nothing.
  return {0, 'cancelled', '', -1, -1, -1, -1, -1, -1, -1}
end

local now = clock(ARGV[1])
local tier, cost, max_tokens, rid = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local lease_ttl = tonumber(ARGV[6])
local day, day_end, month, month_end = periods(now)

local refusal = nil          -- {limit, scope, retry µs}: the one that waits longest
local writes = {}            -- deferred charges, applied only if nothing refuses
local record = {cost, day, month, '-', '-', '-', '-', '-', '-', '-', '-',
                '-', '-', '-', '-', '-', '-', '-', '-'}  -- see the header
local R, RT, T, TT, L, LT, D, M = 0, 1, 2, 3, 4, 5, 6, 7  -- record words, after 3 + 8 × scope
-- info.req / info.tok = {limit, remaining, reset}: the strictest bucket once this request is
-- charged (an admission's headers); held: the same as the buckets are now, nothing charged (a
-- refusal's headers: a refused request takes nothing from the rates it passed)
local info, held = {}, {}

local function refuse(limit, scope, retry)
  if refusal == nil or (refusal[3] ~= -1 and (retry == -1 or retry > refusal[3])) then
    refusal = {limit, scope, retry}
  end
end

local function note(into, kind, lim, remaining, reset)
  local cur = into[kind]
  if cur == nil or remaining < cur[2] or (remaining == cur[2] and reset > cur[3]) then
    into[kind] = {lim, remaining, reset}
  end
end

-- A concurrency lease: unexpired leases are counted (expired ones, of crashed holders, are
-- pruned by settle.lua), then one is added if there is room.
local function lease(scope, key, lim, word)
  if lim == nil then return end
  if redis.call('ZCOUNT', key, '(' .. int(now), '+inf') < lim then
    writes[#writes + 1] = {key}
    record[word] = '1'
  elseif lim == 0 then
    refuse('concurrency', scope, -1)
  else
    -- Leases are normally released by settlement, long before they expire: retry within 1 s.
    local first = redis.call('ZRANGEBYSCORE', key, '(' .. int(now), '+inf', 'WITHSCORES',
      'LIMIT', 0, 1)
    refuse('concurrency', scope, math.min(tonumber(first[2]) - now, 1000000))
  end
end

-- A tier's share of a scope's limit: the limit of that tier's sub-bucket.
local function scaled(lim, share)
  if lim == nil or share == nil then return nil end
  return math.max(1, math.floor(lim * share))
end

-- One GCRA bucket whose state fields read (s_tat, s_frac, s_lim); charges n units into `sets`.
-- Returns the µs the state must be kept for (nil: nothing charged).
local function rate(scope, limit, kind, name, lim, n, s_tat, s_frac, s_lim, sets, word)
  if lim == nil then return nil end
  local tat, frac = gcra_load(s_tat, s_frac, s_lim, lim, now)
  note(held, kind, lim, gcra_view(tat, frac, lim, now))
  local ok, retry
  ok, retry, tat, frac = gcra_check(tat, frac, lim, n, now)
  note(info, kind, lim, gcra_view(tat, frac, lim, now))
  if not ok then
    refuse(limit, scope, retry)
  elseif n > 0 then
    local k = #sets
    sets[k + 1], sets[k + 2] = name .. '.tat', int(tat)
    sets[k + 3], sets[k + 4] = name .. '.frac', frac
    sets[k + 5], sets[k + 6] = name .. '.lim', lim
    record[word] = lim
    return tat + 1
  end
  return nil
end

-- One token budget whose state fields read (s_period, s_used).
local function budget(scope, limit, name, lim, period, period_end, s_period, s_used, sets, word)
  if lim == nil then return nil end
  local used = 0
  if tonumber(s_period) == period then used = tonumber(s_used) or 0 end
  if cost > lim then
    refuse(limit, scope, -1)
  elseif used + cost > lim then
    refuse(limit, scope, period_end - now)  -- the budget renews when the period ends
  elseif cost > 0 then
    local k = #sets
    sets[k + 1], sets[k + 2] = name .. '.p', period
    sets[k + 3], sets[k + 4] = name .. '.u', int(used + cost)
    record[word] = '1'
    return period_end
  end
  return nil
end

local function later(a, b)
  if a == nil or (b ~= nil and b > a) then return b end
  return a
end

-- Rates and budgets of one scope: one HMGET of its state hash, one deferred HSET.
local function rates_and_budgets(scope, w, base, rpm, tpm, share, day_lim, month_lim)
  if not (rpm or tpm or day_lim or month_lim) then return end
  local key = state_key(base)
  local v = redis.call('HMGET', key, 'exp', 'rpm.tat', 'rpm.frac', 'rpm.lim', 'tpm.tat',
    'tpm.frac', 'tpm.lim', 'day.p', 'day.u', 'month.p', 'month.u')
  local sets, need = {}, nil
  need = later(need, rate(scope, 'requests_per_minute', 'req', 'rpm', rpm, 1, v[2], v[3], v[4],
    sets, w + R))
  local tr, tt, t = nil, nil, nil
  if share and (rpm or tpm) then  -- the tier's sub-buckets
    tr, tt = 'rpm@' .. tier, 'tpm@' .. tier
    t = redis.call('HMGET', key, tr .. '.tat', tr .. '.frac', tr .. '.lim', tt .. '.tat',
      tt .. '.frac', tt .. '.lim')
    need = later(need, rate(scope, 'requests_per_minute', 'req', tr, scaled(rpm, share), 1,
      t[1], t[2], t[3], sets, w + RT))
  end
  need = later(need, rate(scope, 'tokens_per_minute', 'tok', 'tpm', tpm, cost, v[5], v[6], v[7],
    sets, w + T))
  if t then
    need = later(need, rate(scope, 'tokens_per_minute', 'tok', tt, scaled(tpm, share), cost,
      t[4], t[5], t[6], sets, w + TT))
  end
  need = later(need, budget(scope, 'daily_budget', 'day', day_lim, day, day_end, v[8], v[9],
    sets, w + D))
  need = later(need, budget(scope, 'monthly_budget', 'month', month_lim, month, month_end,
    v[10], v[11], sets, w + M))
  if #sets > 0 then
    writes[#writes + 1] = {key, sets, v[1], need}
  end
end

local bases = {ARGV[8]}
if ARGV[9] ~= '' then bases[2] = ARGV[9] end
for s, base in ipairs(bases) do
  local scope = (s == 1) and 'tenant' or 'key'
  local w = 4 + 8 * (s - 1)  -- this scope's first record word
  local lim = redis.call('HMGET', limits_key(base), 'v', 'rpm', 'tpm', 'conc', 'day', 'month',
    'maxtok', 'tiers', 'shares')
  if not lim[1] then
    return {-1, '', scope, -1, -1, -1, -1, -1, -1, -1}
  end
  local conc = tonumber(lim[4])
  if lim[8] and not string.find(lim[8], ',' .. tier .. ',', 1, true) then
    refuse('tier', scope, -1)
  end
  if lim[7] and max_tokens > tonumber(lim[7]) then
    refuse('max_tokens', scope, -1)
  end
  local share = nil
  if lim[9] then
    for name, value in string.gmatch(lim[9], '([^,=]+)=([^,]+)') do
      if name == tier then share = tonumber(value) end
    end
  end
  lease(scope, leases_key(base), conc, w + L)
  if share then lease(scope, tier_leases_key(base, tier), scaled(conc, share), w + LT) end
  rates_and_budgets(scope, w, base, tonumber(lim[2]), tonumber(lim[3]), share, tonumber(lim[5]),
    tonumber(lim[6]))
end

if refusal ~= nil then
  local req, tok = held.req or {-1, -1, -1}, held.tok or {-1, -1, -1}
  return {0, refusal[1], refusal[2], refusal[3], req[1], req[2], req[3], tok[1], tok[2], tok[3]}
end

local req, tok = info.req or {-1, -1, -1}, info.tok or {-1, -1, -1}
local entry = false
if KEYS[2] then
  -- Queue the caller's entry, first: an error here leaves nothing charged.
  entry = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 10))
end

for _, w in ipairs(writes) do
  if w[2] then
    state_write(w[1], w[2], w[3], w[4], now)
  else
    redis.call('ZADD', w[1], int(now + lease_ttl), rid)
    redis.call('PEXPIRE', w[1], ms_after(lease_ttl))  -- newest lease expires last
  end
end

redis.call('SET', KEYS[1], table.concat(record, ' '), 'PX', ARGV[7])
return {1, '', '', 0, req[1], req[2], req[3], tok[1], tok[2], tok[3], entry}
