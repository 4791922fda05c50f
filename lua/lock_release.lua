-- lock_release: releases one hold of a Redisson-compatible reentrant lock,
-- idempotently per request id (Redisson's unlock latch, redisson#4871).
--
-- KEYS[1]  lock key (hash, field = owner id, value = hold count)
-- KEYS[2]  channel "redisson_lock__channel:{<lock key>}"
-- KEYS[3]  latch "redisson_unlock_latch:{<lock key>}:<request id>"
-- ARGV[1]  unlock message, "0" (Redisson's LockPubSub.UNLOCK_MESSAGE)
-- ARGV[2]  lease in ms, reset while the lock is still held
-- ARGV[3]  owner id "<instance uuid>:<thread id>"
-- ARGV[4]  latch lifetime in ms: how long a retry of this request id
--          (after a lost reply) gets the first result back
--
-- Reply: nil  caller does not hold the lock (never did, or the lease
--             expired): nothing changed, nothing published
--        n>0  still held n times (reentrant); lease reset
--        0    fully released: key deleted and ARGV[1] published on KEYS[2]
--             so that waiters retry at once instead of sleeping a TTL
-- A request id seen before gets its stored reply and changes nothing: a
-- retry must neither release a second hold nor report "not owner".

local done = redis.call('get', KEYS[3])
if done then
    return tonumber(done)
end
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
    return nil
end
local count = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if count > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
else
    redis.call('del', KEYS[1])
    redis.call('publish', KEYS[2], ARGV[1])
end
redis.call('set', KEYS[3], count, 'px', ARGV[4])
return count
