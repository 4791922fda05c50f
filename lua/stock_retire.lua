-- stock_retire: a voucher's Redis-first state that is behind Postgres's sale
-- is dropped (SECKILL_STOCK=redis), so that the next buyer rebuilds it from
-- Postgres (lua/stock_load.lua "rebuild").
--
-- KEYS[1]  voucher hash "seckill:v:{<id>}"
-- KEYS[2]  buyers set "seckill:v:{<id>}:buyers"
-- ARGV[1]  the voucher's sale in Postgres (tb_voucher.sale_gen)
--
-- Reply: 1 dropped (the hash held an older sale); 0 left (absent, or the
-- same sale or a newer one).
--
-- A consumer calls it when Postgres refused orders as of an older sale: a
-- reset whose load into Redis failed leaves the hash on the old sale, and
-- every order admitted there would be dropped as stale until a person
-- reset the voucher again. Dropped, the hash is rebuilt at the next buyer
-- with Postgres's sale, stock and buyers.
local held = redis.call('hget', KEYS[1], 'gen')
if held and tonumber(held) < tonumber(ARGV[1]) then
    redis.call('del', KEYS[1], KEYS[2])
    return 1
end
return 0
