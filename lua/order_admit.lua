-- order_admit: Redis-first admission (SECKILL_STOCK=redis). A lot of buyers
-- decided in one call, each as if alone and in the lot's order, atomically:
-- the sale window, the stock, the buyer recorded (the one-order-per-user
-- check), then the unit taken, the order id drawn and the order appended to
-- the stream that the consumers persist to Postgres.
--
-- KEYS[1]      the orders stream: "seckill:orders" on one Redis; on a Redis
--              Cluster the voucher's own, "seckill:v:{<id>}:orders"
-- KEYS[2j]     voucher j's hash "seckill:v:{<id>}": stock, initial, begin,
--              end (Unix seconds), gen (the sale's generation, bumped by
--              each reset), for j = 1..m
-- KEYS[2j+1]   voucher j's buyers set "seckill:v:{<id>}:buyers" (user ids)
-- KEYS[2m+2]   the order id counter of the day "icr:<prefix>:<yyyy>:<MM>:<dd>",
--              only when ARGV[3] is 0
-- ARGV[1]      the ids' seconds (since the id epoch): the counter's day
-- ARGV[2]      m, the number of vouchers
-- ARGV[3]      0: the counts are drawn here, from KEYS[2m+2]; else the first
--              of the counts the caller drew before the call, one per buyer
--              (on a Redis Cluster the counter lives in a slot of its own,
--              and a script's keys must share one slot: the caller takes
--              the lot's counts with one INCRBY on the counter's master;
--              those of refused buyers are left unused)
-- ARGV[4..m+3] the vouchers' ids, in the order of their keys
-- then, per buyer, two: the buyer's voucher (1..m) and user id
--
-- Reply: one array per buyer, in the buyers' order:
--        {0, count, stream id}  admitted: the order id is (ARGV[1] << 32) |
--                               count, composed by the caller (Lua numbers
--                               are doubles: 64-bit ids do not fit)
--        {1} sold out   {2} this user already ordered
--        {3} not started   {4} ended (by Redis's clock: one clock for every
--                               instance)
--        {-1} the voucher is not loaded: rebuild it from Postgres, retry
--        {-2} the voucher's hash is malformed (a field missing or not an
--             integer: written by hand?); its buyers only are refused, and
--             nothing is written for them
--
-- The order of the checks is the service's: the window, sold out (a buyer
-- who already ordered hears sold_out once nothing is left), then the
-- buyer, then the deduction. The duplicate check comes before the
-- deduction, so a buyer refused as a duplicate never takes a unit that is
-- then never sold. The commands are gathered: one SMISMEMBER, SADD and
-- HINCRBY per voucher and one INCRBY for the lot, where one call per buyer
-- made four writes each; XADD stays one entry per order. Every field is
-- checked before anything is written, so no write can fail half-way.
local m = tonumber(ARGV[2])
local drawn = tonumber(ARGV[3])
local first = m + 4
local nbuyers = (#ARGV - m - 3) / 2
local now = tonumber(redis.call('time')[1])
local v, stock, asked, known, seen, added = {}, {}, {}, {}, {}, {}
local bv, bu = {}, {}          -- buyer i's voucher (1..m) and user id

local function integer(x)
    return x and string.match(x, '^%-?%d+$') ~= nil
end

for j = 1, m do
    v[j] = redis.call('hmget', KEYS[2 * j], 'stock', 'begin', 'end', 'gen')
    if not v[j][1] then
        stock[j] = nil
    elseif integer(v[j][1]) and integer(v[j][2]) and integer(v[j][3]) and integer(v[j][4]) then
        stock[j] = tonumber(v[j][1])
    else
        stock[j] = false
    end
    asked[j], seen[j], added[j] = {}, {}, {}
end
for i = 1, nbuyers do
    bv[i] = tonumber(ARGV[first + 2 * i - 2])
    bu[i] = ARGV[first + 2 * i - 1]
    local a = asked[bv[i]]
    a[#a + 1] = bu[i]
end
for j = 1, m do
    if stock[j] and #asked[j] > 0 then
        known[j] = redis.call('smismember', KEYS[2 * j + 1], unpack(asked[j]))
    end
end

local verdict, nth, total = {}, {}, 0
for i = 1, nbuyers do
    local j, u = bv[i], bu[i]
    nth[j] = (nth[j] or 0) + 1
    if stock[j] == nil then
        verdict[i] = -1
    elseif stock[j] == false then
        verdict[i] = -2
    elseif now < tonumber(v[j][2]) then
        verdict[i] = 3
    elseif now > tonumber(v[j][3]) then
        verdict[i] = 4
    elseif stock[j] <= 0 then
        verdict[i] = 1
    elseif known[j][nth[j]] == 1 or seen[j][u] then
        verdict[i] = 2
    else
        verdict[i] = 0
        seen[j][u] = true
        stock[j] = stock[j] - 1
        added[j][#added[j] + 1] = u
        total = total + 1
    end
end

local reply = {}
local count = 0
if total > 0 then
    if drawn > 0 then
        count = drawn - 1
    else
        count = redis.call('incrby', KEYS[2 * m + 2], total) - total
    end
    for j = 1, m do
        local n = #added[j]
        if n > 0 then
            redis.call('sadd', KEYS[2 * j + 1], unpack(added[j]))
            redis.call('hincrby', KEYS[2 * j], 'stock', -n)
        end
    end
end
for i = 1, nbuyers do
    if verdict[i] == 0 then
        local j = bv[i]
        count = count + 1
        reply[i] = {0, count, redis.call('xadd', KEYS[1], '*', 'v', ARGV[3 + j], 'u', bu[i],
                                         't', ARGV[1], 'c', count, 'g', v[j][4])}
    else
        reply[i] = {verdict[i]}
    end
end
return reply
