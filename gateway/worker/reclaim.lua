-- Re-claim the lane entries a worker runs, only those still pending for it (resets their idle
-- time). Another worker claims an entry whose idle time passed worker_claim_idle_ms: the first
-- worker was frozen (SIGSTOP, a VM pause, a swap storm) or cut off from Redis meanwhile, and the
-- request is the other worker's now. A plain XCLAIM took it back and both ran it.
-- KEYS[1]: the lane stream. ARGV[1]: the consumer group; ARGV[2]: this worker (its consumer);
-- ARGV[3..]: entry ids. Returns {kept ids, taken ids}: pending for this worker (claimed again) or
-- for another one; an id in neither is pending for nobody (ACKed, or lost with a restarted Redis).
local kept, taken = {}, {}
for i = 3, #ARGV do
  local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #pending > 0 then
    if pending[1][2] == ARGV[2] then
      redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
      kept[#kept + 1] = ARGV[i]
    else
      taken[#taken + 1] = ARGV[i]
    end
  end
end
return {kept, taken}
