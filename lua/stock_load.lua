-- stock_load: a voucher's Redis-first state (SECKILL_STOCK=redis), written
-- from Postgres in one step.
--
-- KEYS[1]  voucher hash "seckill:v:{<id>}" (stock, initial, begin, end, gen)
-- KEYS[2]  buyers set "seckill:v:{<id>}:buyers"
-- KEYS[3]  the orders stream "seckill:orders"
-- KEYS[4]  landed counter "seckill:v:{<id>}:landed": orders of the voucher the
--          consumers persisted and acknowledged
-- ARGV[1]  "fresh" (voucher created or reset: a new sale; the old sale's
--          buyers and undrained orders no longer count) or "rebuild" (the
--          hash is missing: Redis lost it)
-- ARGV[2]  voucher id
-- ARGV[3]  stock in Postgres   ARGV[4] initial stock
-- ARGV[5]  begin   ARGV[6] end (Unix seconds)
-- ARGV[7]  rebuild: the landed counter read before Postgres was read
-- ARGV[8]  title
-- ARGV[9]  the consumers' group
-- ARGV[10] the sale (tb_voucher.sale_gen, read with the rest): the orders
--          admitted now carry it, and the consumers persist them only while
--          Postgres is in the same sale
-- ARGV[11..] rebuild: the buyers in Postgres
--
-- Reply: 1 written; 0 not written: rebuild, but the hash exists (someone
--        else rebuilt it), or fresh, but Redis already holds this sale or a
--        newer one (a reset that came later was loaded first);
--        -1 rebuild, but orders landed since Postgres was read: read again.
--
-- A rebuild counts what Postgres has plus the orders still unsettled in the
-- stream (admitted, not persisted yet) of the current generation: Postgres's
-- stock minus those, its buyers plus theirs. Settled entries (acknowledged:
-- persisted, dropped or dead-lettered) stay in the stream until
-- stream_trim.lua removes them and do not count; the unsettled ones are the
-- group's pending entries and those after its last delivered id. An order
-- persisted between the caller's read of Postgres and this script was
-- acknowledged and moved the landed counter (the consumer does both in one
-- MULTI): ARGV[7] catches it.
local gen = tonumber(ARGV[10])
if ARGV[1] == 'rebuild' then
    if redis.call('exists', KEYS[1]) == 1 then
        return 0
    end
    if tonumber(redis.call('get', KEYS[4]) or '0') ~= tonumber(ARGV[7]) then
        return -1
    end
else
    local held = tonumber(redis.call('hget', KEYS[1], 'gen') or '0')
    if held and held >= gen then
        return 0
    end
end
redis.call('del', KEYS[1], KEYS[2])
local stock = tonumber(ARGV[3])
local buyers = {}
if ARGV[1] == 'rebuild' then
    for i = 11, #ARGV do
        buyers[ARGV[i]] = true
    end
    -- The group's position and its pending entries (none: nothing settled).
    local last, pending = nil, {}
    local groups = redis.pcall('xinfo', 'groups', KEYS[3])
    if type(groups) == 'table' and not groups.err then
        for _, g in ipairs(groups) do
            local f = {}
            for i = 1, #g, 2 do
                f[g[i]] = g[i + 1]
            end
            if f['name'] == ARGV[9] then
                last = f['last-delivered-id']
                if f['pending'] > 0 then
                    for _, p in ipairs(redis.call('xpending', KEYS[3], ARGV[9], '-', '+', f['pending'])) do
                        pending[p[1]] = true
                    end
                end
            end
        end
    end
    -- "ms-seq" ids: is a after b?
    local function after(a, b)
        local am, as = string.match(a, '^(%d+)-(%d+)$')
        local bm, bs = string.match(b, '^(%d+)-(%d+)$')
        am, bm = tonumber(am), tonumber(bm)
        return am > bm or (am == bm and tonumber(as) > tonumber(bs))
    end
    local entries = redis.call('xrange', KEYS[3], '-', '+')
    for _, e in ipairs(entries) do
        local f = {}
        for i = 1, #e[2], 2 do
            f[e[2][i]] = e[2][i + 1]
        end
        local unsettled = last == nil or pending[e[1]] or after(e[1], last)
        if unsettled and f.v == ARGV[2] and tonumber(f.g) == gen and f.u and not buyers[f.u] then
            buyers[f.u] = true
            stock = stock - 1
        end
    end
end
redis.call('hset', KEYS[1], 'stock', stock, 'initial', ARGV[4], 'begin', ARGV[5],
           'end', ARGV[6], 'gen', gen, 'title', ARGV[8])
local batch = {}
for u in pairs(buyers) do
    batch[#batch + 1] = u
    if #batch == 1000 then
        redis.call('sadd', KEYS[2], unpack(batch))
        batch = {}
    end
end
if #batch > 0 then
    redis.call('sadd', KEYS[2], unpack(batch))
end
return 1
