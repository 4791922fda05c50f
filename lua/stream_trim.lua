-- stream_trim: drops the orders stream's settled entries (SECKILL_STOCK=redis).
--
-- KEYS[1]  the orders stream "seckill:orders"
--
-- Reply: the number of entries removed.
--
-- A consumer acknowledges (XACK) the entries it persisted; this removes
-- them, whole stream nodes at a time (XTRIM MINID ~), instead of one XDEL
-- per entry: Redis finds an entry to delete by walking its node's listpack
-- from the start (up to stream-node-max-entries, 100 by default), which
-- cost the XDELs about a tenth of Redis's CPU during a sale, while a whole
-- node goes at once.
--
-- Nothing unsettled is removed, for any consumer group of the stream: a
-- group delivers entries in id order, so every entry below its smallest
-- pending one (or, with none pending, below its last delivered one) was
-- delivered to it and acknowledged. The trim stays below that id of every
-- group. Atomic, so no delivery comes between the reading and the trim.
-- This holds as long as a group's position only moves by delivery: the
-- service's consumers create theirs at 0 (XGROUP CREATE ... 0); moving a
-- group by hand (XGROUP SETID, or creating one at $) would let this trim
-- entries that group never read.

-- "ms-seq" ids: is a before b?
local function before(a, b)
    local am, as = string.match(a, '^(%d+)-(%d+)$')
    local bm, bs = string.match(b, '^(%d+)-(%d+)$')
    am, bm = tonumber(am), tonumber(bm)
    return am < bm or (am == bm and tonumber(as) < tonumber(bs))
end

local below
for _, g in ipairs(redis.call('xinfo', 'groups', KEYS[1])) do
    local f = {}
    for i = 1, #g, 2 do
        f[g[i]] = g[i + 1]
    end
    local mine = f['last-delivered-id']
    if f['pending'] > 0 then
        mine = redis.call('xpending', KEYS[1], f['name'])[2]
    end
    if below == nil or before(mine, below) then
        below = mine
    end
end
if below == nil or below == '0-0' then
    return 0
end
return redis.call('xtrim', KEYS[1], 'minid', '~', below)
