-- take: the entries of a model's lanes that one worker has room for, in one call, fair between the
-- tenants of a lane (gateway/lanes/keys.py describes the keys; the engine's VTC, gateway-side).
-- KEYS: per lane, highest tier first: the lane (lanes:{model}:{tier}), its backlog (sorted set of the
--       tenants with entries waiting, scored by virtual counter; a tenant's entries wait in the list
--       <backlog>:<tenant> as "id cost") and its counters (hash tenant -> counter; field "": the lane's
--       virtual time, the counter of the tenant served last).
-- ARGV: group, consumer, claim (1: first a dead worker's entries idle for min_idle_ms, by XAUTOCLAIM),
--       min_idle_ms, free, tiers (1: the engine orders by priority), scan, w_in, fair (0: the
--       engine's policy is not fair between tenants: one queue, first come first served), tokens
--       (-1: none), then per lane: displacing, fresh, tenants (a line of tenant id, a line of its
--       count, for each).
-- free, displacing, fresh, tenants and tokens are the engine's Room (engine/scheduler/room.py), in
-- requests (tokens: in prompt tokens); a lane yields as many entries as Room.count allows after every
-- entry taken before it in this call, then one entry more of each tenant (least-served first) whose
-- own Room.count allows it: the engine starts it by displacing a tenant that holds more than its
-- share. free counts only while the prompts taken in this call leave some of tokens: the rest of a
-- burst waits here, where tenants are weighed by their counters, not in one worker's engine.
-- New entries (up to scan a lane per call) enter the lane's backlog by an XREADGROUP with NOACK: read,
-- yet in no worker's pending list, as "id cost prompt" (prompt: its tokens); a tenant with nothing
-- waiting enters at the least counter of those waiting (the lane's virtual time if none wait), so
-- idling banks no credit. A take serves the tenant of the least counter first and adds the entry's
-- prompt, w_in * prompt / weight (as the engine's VTC books an admission; the worker adds its output
-- as it publishes it, w_out a token / weight), then hands the entry to this worker with XCLAIM FORCE:
-- from then on it is pending, reclaimed from a dead worker like any other.
-- Returns per lane {claimed entries, new entries}, each entry {id, {field, value, ...}}, then the number
-- of lanes whose backlog still holds entries (0: a blocking read on the lanes sees every entry left).
local group, consumer = ARGV[1], ARGV[2]
local claim, min_idle = ARGV[3] == "1", ARGV[4]
local free, tiers = tonumber(ARGV[5]), ARGV[6] == "1"
local scan, w_in = tonumber(ARGV[7]), tonumber(ARGV[8])
local fair = ARGV[9] == "1"
local budget = tonumber(ARGV[10])
local LANE_ARGS = 10
local lanes = #KEYS / 3
local taken, out, spent = {}, {}, 0 -- spent: prompt tokens of the entries taken in this call
for i = 1, lanes do
  taken[i], out[i] = 0, { {}, {} }
end

local function room(i, by_tenant, pending) -- Room.count of lane i, below every earlier lane (of a
  -- tenant whose own count, before this call, is by_tenant), with pending more of lane i taken
  pending = pending or 0
  local all, ahead = pending, pending
  for j = 1, lanes do
    all = all + taken[j]
    if j <= i or not tiers then
      ahead = ahead + taken[j]
    end
  end
  local open = (budget < 0 or spent < budget) and free - all or 0
  local n = math.max(open, tonumber(ARGV[LANE_ARGS + 3 * i - 2]) - ahead)
  return by_tenant and math.max(n, by_tenant - ahead) or n
end

local function cost(fields) -- an entry's tenant, cost and prompt tokens; an unreadable one costs nothing
  -- (the worker drops it)
  for k = 1, #fields, 2 do
    if fields[k] == "body" then
      local ok, body = pcall(cjson.decode, fields[k + 1])
      if ok and type(body) == "table" and type(body.sampling) == "table" then
        local weight = tonumber(body.weight) or 1
        local prompt = type(body.prompt_token_ids) == "table" and #body.prompt_token_ids or 0
        local tenant = (type(body.tenant) == "string" or type(body.tenant) == "number") and body.tenant or "?"
        return fair and tostring(tenant) or "*", w_in * prompt / (weight > 0 and weight or 1), prompt
      end
    end
  end
  return fair and "?" or "*", 0, 0
end

local function least(backlog) -- the tenant waiting with the least counter, and the counter
  local first = redis.call("ZRANGE", backlog, 0, 0, "WITHSCORES")
  return first[1], tonumber(first[2])
end

local function enqueue(lane, backlog, counters) -- new entries of the lane into its backlog
  local reply = redis.call("XREADGROUP", "GROUP", group, consumer, "COUNT", scan, "NOACK", "STREAMS", lane, ">")
  if not reply then
    return
  end
  for _, entry in ipairs(reply[1][2]) do
    local tenant, charge, prompt = cost(entry[2])
    if not redis.call("ZSCORE", backlog, tenant) then
      local _, floor = least(backlog)
      floor = floor or tonumber(redis.call("HGET", counters, "")) or 0
      local own = tonumber(redis.call("HGET", counters, tenant)) or 0
      redis.call("ZADD", backlog, math.max(own, floor), tenant)
    end
    redis.call("RPUSH", backlog .. ":" .. tenant, entry[1] .. " " .. charge .. " " .. prompt)
  end
end

local function pop(backlog, counters, tenant, counter) -- the tenant's oldest entry id, charged (its
  -- prompt's tokens go to spent)
  local queue = backlog .. ":" .. tenant
  local head, id = redis.call("LPOP", queue), nil
  if head then
    local charge, prompt
    id, charge, prompt = string.match(head, "^(%S+) (%S+) ?(%S*)$")
    spent = spent + (tonumber(prompt) or 0)
    redis.call("HSET", counters, "", counter)
    counter = counter + tonumber(charge)
    redis.call("HSET", counters, tenant, counter)
  end
  if redis.call("LLEN", queue) == 0 then
    redis.call("ZREM", backlog, tenant)
  else
    redis.call("ZADD", backlog, counter, tenant)
  end
  return id
end

local function hand(lane, ids, entries) -- the ids, which no worker holds, to this worker; how many
  -- FORCE adds each to this worker's pending list (an id deleted meanwhile, by a test or an
  -- operator, is skipped)
  if #ids == 0 then
    return 0
  end
  local args = { "XCLAIM", lane, group, consumer, 0 }
  for _, id in ipairs(ids) do
    args[#args + 1] = id
  end
  for _, word in ipairs({ "RETRYCOUNT", "1", "FORCE" }) do
    args[#args + 1] = word
  end
  local claimed = redis.call(unpack(args))
  for _, entry in ipairs(claimed) do
    entries[#entries + 1] = entry
  end
  return #claimed
end

if claim then
  for i = 1, lanes do
    local n = room(i)
    if n > 0 then
      local entries = {}
      local reply = redis.call("XAUTOCLAIM", KEYS[3 * i - 2], group, consumer, min_idle, "0-0", "COUNT", n)
      for _, entry in ipairs(reply[2]) do
        if type(entry) == "table" and type(entry[2]) == "table" then -- deleted entries carry no fields
          entries[#entries + 1] = entry
          spent = spent + select(3, cost(entry[2]))
        end
      end
      out[i][1], taken[i] = entries, taken[i] + #entries
    end
  end
end
for i = 1, lanes do
  local lane, backlog, counters = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local fresh, held, most, done = tonumber(ARGV[LANE_ARGS + 3 * i - 1]), {}, 0, {}
  local lines = {}
  for line in string.gmatch(ARGV[LANE_ARGS + 3 * i], "[^\n]+") do
    lines[#lines + 1] = line
  end
  for k = 1, #lines - 1, 2 do
    held[lines[k]] = tonumber(lines[k + 1])
    most = math.max(most, held[lines[k]])
  end
  if room(i, math.max(fresh, most)) > 0 then
    enqueue(lane, backlog, counters)
    local entries, n = out[i][2], room(i)
    while n > 0 do -- the least-served tenants' entries, as many as the room
      local ids = {}
      while room(i, nil, #ids) > 0 do
        local tenant, counter = least(backlog)
        if not tenant then
          break
        end
        done[tenant] = true
        ids[#ids + 1] = pop(backlog, counters, tenant, counter)
      end
      if #ids == 0 then
        break
      end
      taken[i] = taken[i] + hand(lane, ids, entries)
      n = room(i)
    end
    -- then one entry of each other tenant, least-served first, that starts by displacing
    while room(i, math.max(fresh, most)) > 0 do
      local waiting, tenant, counter = redis.call("ZRANGE", backlog, 0, -1, "WITHSCORES"), nil, nil
      for k = 1, #waiting, 2 do
        local t = waiting[k]
        if not done[t] and room(i, held[t] or fresh) > 0 then
          tenant, counter = t, tonumber(waiting[k + 1])
          break
        end
      end
      if not tenant then
        break
      end
      done[tenant] = true
      taken[i] = taken[i] + hand(lane, { pop(backlog, counters, tenant, counter) }, entries)
    end
  end
end
local backlogs = {}
for i = 1, lanes do
  backlogs[i] = KEYS[3 * i - 1]
end
out[lanes + 1] = redis.call("EXISTS", unpack(backlogs)) -- an empty sorted set does not exist
return out
