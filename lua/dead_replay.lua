-- dead_replay: puts dead letters back in the orders stream (SECKILL_STOCK=redis).
--
-- KEYS[1]  the dead-letter stream "seckill:orders:dead"
-- KEYS[2]  the orders stream "seckill:orders"
-- ARGV[1]  at most this many entries replayed
--
-- Reply: {replayed, left, unreplayable}: the entries put back, the dead
--        letters still in KEYS[1] after the call, and how many of those
--        the call passed over because they cannot be replayed (all of them
--        when it replayed fewer than ARGV[1], having reached the end).
--
-- A consumer moves an order Postgres refuses on its own (or an unreadable
-- entry) to the dead-letter stream with the order's fields: voucher v,
-- user u, the id's seconds t and count c, the sale's generation g (as
-- lua/order_admit.lua appended it), and its reason. Once the cause is
-- fixed, this walks the dead letters from the oldest and, for each one
-- that has all five fields as integers, appends v, u, t, c, g to the
-- orders stream (a new entry, the same order: the same id) and deletes the
-- dead letter, in the same call: a replay that runs twice, or a second
-- replay after an answer that was lost, never queues an entry twice.
-- Persisting is idempotent on the order id (a row with that id is
-- skipped). An entry without t and c (unreadable, or written before the
-- dead letters carried them) is left where it is.
--
-- Redis's side of the sale must count the order again: a rebuild of the
-- voucher (a Redis that lost it) counts only unsettled entries, so a dead
-- letter's unit and buyer went back on sale. When the voucher's hash holds
-- the letter's sale, the buyer is added back to its buyers set and, if the
-- buyer was not there, one unit is taken (none left: the letter stays, as
-- the order would only be refused again). A letter of another sale (a reset
-- since) stays too. A voucher not in Redis now is counted by its next
-- rebuild, from the stream. These keys follow from the letters, so they
-- are not declared (one Redis, not a cluster).
local max = tonumber(ARGV[1])
local replayed, unreplayable = 0, 0
local from = '-'

local function integer(x)
    return x ~= nil and string.match(x, '^%-?%d+$') ~= nil
end

while replayed < max do
    local batch = redis.call('xrange', KEYS[1], from, '+', 'count', 100)
    if #batch == 0 then
        break
    end
    for _, e in ipairs(batch) do
        if replayed >= max then
            break
        end
        local f = {}
        for i = 1, #e[2], 2 do
            f[e[2][i]] = e[2][i + 1]
        end
        local ok = integer(f['v']) and integer(f['u']) and integer(f['t']) and integer(f['c'])
                   and integer(f['g'])
        if ok then
            local hash = 'seckill:v:{' .. f['v'] .. '}'
            local sale = redis.call('hget', hash, 'gen')
            if sale and tonumber(sale) ~= tonumber(f['g']) then
                ok = false
            elseif sale and redis.call('sadd', hash .. ':buyers', f['u']) == 1 then
                if tonumber(redis.call('hget', hash, 'stock') or '0') > 0 then
                    redis.call('hincrby', hash, 'stock', -1)
                else
                    redis.call('srem', hash .. ':buyers', f['u'])
                    ok = false
                end
            end
        end
        if ok then
            redis.call('xadd', KEYS[2], '*', 'v', f['v'], 'u', f['u'], 't', f['t'],
                       'c', f['c'], 'g', f['g'])
            redis.call('xdel', KEYS[1], e[1])
            replayed = replayed + 1
        else
            unreplayable = unreplayable + 1
        end
        from = '(' .. e[1]
    end
end
return {replayed, redis.call('xlen', KEYS[1]), unreplayable}
