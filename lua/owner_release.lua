-- Compare-and-delete for the "owner" demo lock (SET key owner NX PX lease).
-- KEYS[1] = lock key; ARGV[1] = our owner value.
-- Returns 1 when we held it and deleted it, 0 when it was not ours any more
-- (our lease expired and another holder took it: we must not delete theirs).
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
