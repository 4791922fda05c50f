-- group_tidy: removes the names of consumers that are gone from the orders
-- stream's group (SECKILL_STOCK=redis).
--
-- KEYS[1]  the orders stream "seckill:orders"
-- ARGV[1]  the group "seckill"
-- ARGV[2]  the idle bound, ms (CONSUMER_REMOVE_IDLE_MS)
-- ARGV[3]  the caller's own consumer name: refreshed, never removed
--
-- Reply: the names removed.
--
-- Each instance process reads under a name of its own
-- ("<INSTANCE_ID>:<uuid8>"), so every restart leaves a name behind in the
-- group. A name is removed (XGROUP DELCONSUMER) when it holds no pending
-- entry and has been idle (XINFO CONSUMERS) longer than the bound. Entries
-- pending to a consumer are lost with it ("any pending messages that the
-- consumer had will become unclaimable after it was deleted",
-- https://redis.io/docs/latest/commands/xgroup-delconsumer/), so a dead
-- consumer keeps its name until another claims its entries (XAUTOCLAIM).
--
-- A live consumer's idle must stay small, and its reads do not see to it:
-- Redis 7.0 refreshes a consumer only when a read delivers something or
-- reads its own history; an XREADGROUP '>' that finds nothing new leaves
-- it as it was (7.2 counts every attempt:
-- https://redis.io/docs/latest/commands/xinfo-consumers/). So each run
-- first refreshes the caller's own name, creating it when missing, with a
-- read of its history past every possible entry: it returns nothing and
-- touches no pending entry. (The id "18446744073709551615-
-- 18446744073709551615" would mean '>'; one below it does not.) The
-- callers run this every third of the bound.
--
-- Atomic: no delivery comes between the reading of 'pending' and the
-- removal. A consumer that reads after its removal is created again by its
-- XREADGROUP, with what that read delivers pending to it.
local removed = {}
local bound = tonumber(ARGV[2])

redis.call('xreadgroup', 'group', ARGV[1], ARGV[3], 'count', 1, 'streams', KEYS[1],
           '18446744073709551615-18446744073709551614')

for _, c in ipairs(redis.call('xinfo', 'consumers', KEYS[1], ARGV[1])) do
    local f = {}
    for i = 1, #c, 2 do
        f[c[i]] = c[i + 1]
    end
    if f['name'] ~= ARGV[3] and f['pending'] == 0 and f['idle'] > bound then
        redis.call('xgroup', 'delconsumer', KEYS[1], ARGV[1], f['name'])
        removed[#removed + 1] = f['name']
    end
end
return removed
