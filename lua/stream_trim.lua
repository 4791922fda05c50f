-- stream_trim: drops the orders stream's settled entries (SECKILL_STOCK=redis).
--
-- KEYS[1]  the orders stream "seckill:orders"
-- ARGV[1]  the consumers' group
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
-- Nothing unsettled is removed: the group delivers entries in id order, so
-- every entry below the smallest pending one (or, with none pending, below
-- the last delivered one) was delivered and acknowledged. Atomic, so no
-- delivery comes between the reading and the trim. This holds as long as
-- the group's position only moves by delivery: the consumers create it at
-- 0 (XGROUP CREATE ... 0); moving it by hand (XGROUP SETID, or creating it
-- at $) would let this trim orders never persisted.
local pending = redis.call('xpending', KEYS[1], ARGV[1])
local below
if pending[1] > 0 then
    below = pending[2]
else
    local groups = redis.call('xinfo', 'groups', KEYS[1])
    for _, g in ipairs(groups) do
        local f = {}
        for i = 1, #g, 2 do
            f[g[i]] = g[i + 1]
        end
        if f['name'] == ARGV[1] then
            below = f['last-delivered-id']
        end
    end
end
if not below or below == '0-0' then
    return 0
end
return redis.call('xtrim', KEYS[1], 'minid', '~', below)
