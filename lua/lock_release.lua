-- lock_release: releases one hold of a Redisson-compatible reentrant lock.
--
-- KEYS[1]  lock key (hash, field = owner id, value = hold count)
-- KEYS[2]  channel "redisson_lock__channel:{<lock key>}"
-- ARGV[1]  unlock message, "0" (Redisson's LockPubSub.UNLOCK_MESSAGE)
-- ARGV[2]  lease in ms, reset while the lock is still held
-- ARGV[3]  owner id "<instance uuid>:<thread id>"
-- (New KEYS/ARGV, e.g. an idempotency latch, go after these so callers and
-- this order stay compatible.)
--
-- Reply: nil  caller does not hold the lock (never did, or the lease
--             expired): nothing changed, nothing published
--        n>0  still held n times (reentrant); lease reset
--        0    fully released: key deleted and ARGV[1] published on KEYS[2]
--             so that waiters retry at once instead of sleeping a TTL

if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then
    return nil
end
local count = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if count > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return count
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 0
