-- order_admit: Redis-first admission (SECKILL_STOCK=redis). One buyer's
-- whole decision, atomically: the sale window, the stock, the buyer recorded
-- (the one-order-per-user check), then the unit taken, the order id drawn and
-- the order appended to the stream that the consumers persist to Postgres.
--
-- KEYS[1]  voucher hash "seckill:v:{<id>}": stock, initial, begin, end (Unix
--          seconds), gen (the sale's generation, bumped by each reset)
-- KEYS[2]  buyers set "seckill:v:{<id>}:buyers" (user ids)
-- KEYS[3]  the orders stream "seckill:orders"
-- KEYS[4]  the order id counter of the day "icr:<prefix>:<yyyy>:<MM>:<dd>"
-- ARGV[1]  voucher id
-- ARGV[2]  user id
-- ARGV[3]  the id's seconds (since the id epoch): the counter's day
--
-- Reply: {0, count, stream id}  admitted: the order id is (ARGV[3] << 32) |
--                               count, composed by the caller (Lua numbers
--                               are doubles: 64-bit ids do not fit)
--        {1} sold out   {2} this user already ordered
--        {3} not started   {4} ended (by Redis's clock: one clock for every
--                               instance)
--        {-1} the voucher is not loaded: rebuild it from Postgres, retry
--
-- The order of the checks is the service's: the window, sold out (a buyer
-- who already ordered hears sold_out once nothing is left), then the
-- buyer, then the deduction. The duplicate check comes before the
-- deduction, so a buyer refused as a duplicate never takes a unit that is
-- then never sold; SADD is that check (0: the buyer was recorded before),
-- one command where SISMEMBER and SADD were two.
local v = redis.call('hmget', KEYS[1], 'stock', 'begin', 'end', 'gen')
if not v[1] then
    return {-1}
end
local now = tonumber(redis.call('time')[1])
if now < tonumber(v[2]) then
    return {3}
end
if now > tonumber(v[3]) then
    return {4}
end
if tonumber(v[1]) <= 0 then
    return {1}
end
if redis.call('sadd', KEYS[2], ARGV[2]) == 0 then
    return {2}
end
redis.call('hincrby', KEYS[1], 'stock', -1)
local count = redis.call('incr', KEYS[4])
local id = redis.call('xadd', KEYS[3], '*', 'v', ARGV[1], 'u', ARGV[2], 't', ARGV[3],
                      'c', count, 'g', v[4])
return {0, count, id}
