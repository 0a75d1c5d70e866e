-- periods.lua: UTC calendar periods for token budgets, from a µs timestamp.
--
-- Units
--   in      now, integer µs since the Unix epoch (UTC)
--   out     period id (day: days since 1970-01-01; month: year × 12 + month - 1) and the
--           period's end in µs. Budget keys expire at that end; a stored period id that is
--           not the current one counts as zero used.
-- Calendar arithmetic: Howard Hinnant's days_from_civil / civil_from_days (proleptic
-- Gregorian), integer-only so it is exact in Lua doubles.

local DAY_US = 86400000000  -- µs per day

local function civil_from_days(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m
end

local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = m > 2 and m - 3 or m + 9
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

-- (day id, end of day µs, month id, end of month µs) of the UTC instant now.
local function periods(now)
  local day = math.floor(now / DAY_US)
  local y, m = civil_from_days(day)
  local ny, nm = y, m + 1
  if nm > 12 then ny, nm = y + 1, 1 end
  return day, (day + 1) * DAY_US, y * 12 + m - 1, days_from_civil(ny, nm, 1) * DAY_US
end
