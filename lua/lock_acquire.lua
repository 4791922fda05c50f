-- lock_acquire: one attempt at a Redisson-compatible reentrant lock, with a
-- fencing token (the hash layout of Redisson's RLock, the reply of its
-- RFencedLock).
--
-- KEYS[1]  lock key: a hash, field = owner id, value = hold count
-- KEYS[2]  token counter "redisson_lock_token:{<lock key>}"
-- ARGV[1]  lease in ms (PEXPIRE)
-- ARGV[2]  owner id "<instance uuid>:<thread id>"
-- ARGV[3]  (optional) the client's deadline, Unix ms; "0": none. Past it the
--          client has given up waiting for this reply (its command timeout),
--          so a grant made now would be held by nobody until the lease ends.
--          That happens when Redis stalls and runs queued commands late.
-- ARGV[4]  (optional) token counter lifetime in ms; "0" or absent: the
--          counter never expires (Redisson's layout)
--
-- Reply: {-1, token}  granted (new or reentry)
--        {pttl, -1}   held by another owner; pttl = holder's remaining ms
--                     (-1 when the key has no expiry)
--        {-2, -2}     refused: the client's deadline has passed
-- The second element tells the cases apart: pttl can itself be -1.
--
-- The token is max(counter + 1, Redis's clock in microseconds): a hybrid
-- of a counter and a clock. It rises by at least one per grant while the
-- counter lives; a counter that is missing or was brought back lower (a
-- restart from an older snapshot, a promoted replica that lagged, a SET by
-- hand) restarts at the clock, above every token handed out before, as
-- long as Redis's clock has not stepped back by more than the time since.
-- So the counter may expire: its key expires ARGV[4] ms after the clock
-- passes the token (PXAT), and then the clock alone is above every token.

local t = redis.call('time')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])

local deadline = tonumber(ARGV[3] or '0')
if deadline and deadline > 0 and math.floor(now_us / 1000) > deadline then
    return {-2, -2}
end

if (redis.call('exists', KEYS[1]) == 0)
        or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
    -- The token first: a counter we cannot read refuses before anything
    -- changes, so no hold is granted that the caller would not know of.
    -- Lua numbers are doubles: integers are exact below 2^53, which the
    -- clock reaches in the year 2255.
    local token = now_us
    local stored = redis.call('get', KEYS[2])
    if stored then
        local n = tonumber(stored)
        if n == nil or n ~= math.floor(n) or n >= 2^53 then
            return redis.error_reply('ERR fencing token counter ' .. KEYS[2] ..
                ' holds ' .. stored .. ', not an integer below 2^53')
        end
        if n + 1 > token then
            token = n + 1
        end
    end
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    -- reentry resets the lease to the full value, it does not add to it
    redis.call('pexpire', KEYS[1], ARGV[1])
    -- %.0f: tostring() would print a number this large in exponent form.
    local ttl = tonumber(ARGV[4] or '0') or 0
    if ttl > 0 then
        redis.call('set', KEYS[2], string.format('%.0f', token),
                   'pxat', string.format('%.0f', math.floor(token / 1000) + ttl))
    else
        redis.call('set', KEYS[2], string.format('%.0f', token))
    end
    return {-1, token}
end
return {redis.call('pttl', KEYS[1]), -1}
