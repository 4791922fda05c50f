-- lock_renew: one watchdog tick for a batch of locks (Redisson >= 3.44's
-- LockTask chunk): each lock still held by its owner gets its lease back.
--
-- KEYS[i]    lock key i (hash, field = owner id, value = hold count)
-- ARGV[1]    watchdog lease in ms
-- ARGV[i+1]  owner id of KEYS[i]
--
-- Reply: an array, element i = 1 when KEYS[i] was renewed, 0 when the
-- owner's field is gone (released, expired, taken over, or the key is no
-- longer a hash): the caller stops renewing it. HEXISTS first, so a late
-- tick never re-arms a lock that was released or now belongs to someone
-- else; pcall, so one overwritten key cannot fail the whole batch.

local renewed = {}
for i = 1, #KEYS do
    if redis.pcall('hexists', KEYS[i], ARGV[i + 1]) == 1 then
        redis.call('pexpire', KEYS[i], ARGV[1])
        renewed[i] = 1
    else
        renewed[i] = 0
    end
end
return renewed
