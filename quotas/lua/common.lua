-- common.lua: helpers prepended to every quota script (see quotas/scripts.py).
--
-- Units
--   time   integer microseconds (µs) since the Unix epoch. Lua numbers are doubles, exact
--          for integers below 2^53 (≈ 9.0e15); now ≈ 1.8e15 µs, so µs stay exact.
--   ttl    Redis PEXPIRE takes milliseconds; µs are converted with ms_after().

-- The clock is Redis's own (TIME), never the gateway's. A non-empty argument injects a fixed
-- time in µs: used only by the deterministic test vectors.
-- Expiries follow Redis's real clock. Under an injected clock they cannot track it, so keys
-- then live an hour longer than the injected time needs (tests move time by hours at most).
local ttl_slack_ms = 0

local function clock(injected)
  if injected ~= nil and injected ~= '' then
    ttl_slack_ms = 3600000
    return tonumber(injected)
  end
  local t = redis.call('TIME')  -- {seconds, microseconds}
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Integer to a decimal string: redis.call() would print a large double as 1.7e+15.
local function int(x)
  return string.format('%.0f', x)
end

-- A PEXPIRE argument (ms, ≥ 1) for something that stays relevant for `us` more µs.
local function ms_after(us)
  local ms = math.floor(us / 1000) + 1
  if ms < 1 then ms = 1 end
  return int(ms + ttl_slack_ms)
end
