-- take: the entries of a model's lanes that one worker has room for, in one call.
-- KEYS: the lanes, highest tier first (lanes:{model}:{tier}).
-- ARGV: group, consumer, claim (1: first a dead worker's entries idle for min_idle_ms, by XAUTOCLAIM),
--       min_idle_ms, free, tiers (1: the engine orders by priority), then per lane: displacing.
-- free and displacing are the engine's Room (engine/scheduler/room.py), in requests; a lane is read
-- for as many entries as Room.count allows after every entry taken before it in this call.
-- Returns per lane {claimed entries, new entries}, each entry {id, {field, value, ...}}.
local group, consumer = ARGV[1], ARGV[2]
local claim, min_idle = ARGV[3] == "1", ARGV[4]
local free, tiers = tonumber(ARGV[5]), ARGV[6] == "1"
local taken, out = {}, {}
for i = 1, #KEYS do
  taken[i], out[i] = 0, { {}, {} }
end

local function room(i) -- Room.count of lane i, its priority below every earlier lane's
  local all, ahead = 0, 0
  for j = 1, #KEYS do
    all = all + taken[j]
    if j <= i or not tiers then
      ahead = ahead + taken[j]
    end
  end
  return math.max(free - all, tonumber(ARGV[6 + i]) - ahead)
end

if claim then
  for i, lane in ipairs(KEYS) do
    local n = room(i)
    if n > 0 then
      local entries = {}
      for _, entry in ipairs(redis.call("XAUTOCLAIM", lane, group, consumer, min_idle, "0-0", "COUNT", n)[2]) do
        if type(entry) == "table" and type(entry[2]) == "table" then -- deleted entries carry no fields
          entries[#entries + 1] = entry
        end
      end
      out[i][1], taken[i] = entries, taken[i] + #entries
    end
  end
end
for i, lane in ipairs(KEYS) do
  local n = room(i)
  if n > 0 then
    local reply = redis.call("XREADGROUP", "GROUP", group, consumer, "COUNT", n, "STREAMS", lane, ">")
    if reply then
      out[i][2], taken[i] = reply[1][2], taken[i] + #reply[1][2]
    end
  end
end
return out
