-- lock_acquire: one attempt at a Redisson-compatible reentrant lock, with a
-- fencing token (the hash layout of Redisson's RLock, the reply of its
-- RFencedLock).
--
-- KEYS[1]  lock key: a hash, field = owner id, value = hold count
-- KEYS[2]  token counter "redisson_lock_token:{<lock key>}"
-- ARGV[1]  lease in ms (PEXPIRE)
-- ARGV[2]  owner id "<instance uuid>:<thread id>"
--
-- Reply: {-1, token}  granted (new or reentry); token is the INCRed counter,
--                     never reset (no TTL), so it survives release
--        {pttl, -1}   held by another owner; pttl = holder's remaining ms
--                     (-1 when the key has no expiry)
-- The second element tells the cases apart: pttl can itself be -1.

-- ARGV[3]  (optional) the client's deadline, Unix ms: past it the client has
--          given up waiting for this reply (its command timeout), so a grant
--          made now would be held by nobody until the lease ends. That happens
--          when Redis stalls and runs queued commands late. Reply {-2, -2}.
if ARGV[3] then
    local t = redis.call('time')
    if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[3]) then
        return {-2, -2}
    end
end

if (redis.call('exists', KEYS[1]) == 0)
        or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    -- reentry resets the lease to the full value, it does not add to it
    redis.call('pexpire', KEYS[1], ARGV[1])
    -- A counter that is missing (first use, or Redis lost its data in a
    -- restart or failover) starts from the server clock in microseconds, so
    -- tokens keep rising past any that Postgres already accepted: otherwise
    -- every later write of this key would look stale to the fence. Built as
    -- a string: Lua numbers would print in exponent form.
    if redis.call('exists', KEYS[2]) == 0 then
        local t = redis.call('time')
        redis.call('set', KEYS[2], t[1] .. string.format('%06d', tonumber(t[2])))
    end
    local token = redis.call('incr', KEYS[2])
    return {-1, token}
end
return {redis.call('pttl', KEYS[1]), -1}
