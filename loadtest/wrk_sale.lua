-- wrk script for a sale to distinct users:
--   wrk -t2 -c100 -d5s -s loadtest/wrk_sale.lua http://127.0.0.1:8080/voucher/1/seckill
--
-- Every request is a POST with its own X-User-Id: thread i (0-based) uses the
-- ids USER_BASE + i*10^8 + 1, + 2, ... (connections of one thread share its
-- counter), so ids are unique across threads and connections.
--
-- Environment:
--   WRK_USER_BASE  first user id block (default 1000000000)
--   WRK_IDS_FILE   write the orderId of every 200 answer there, one a line
--   WRK_SUMMARY    write a JSON summary there (statuses, latency percentiles, ...)
--   WRK_DELAY_MS   pace: wait this long on average (exponential) between an
--                  answer and the next request
--   WRK_VOUCHERS   voucher ids "1,2,3": each request buys one of them in turn
--                  (/voucher/<id>/seckill), instead of the URL's path
-- The summary line "wrk-statuses: 200=N 409=M ..." is printed in any case.

local threads = {}
local nthreads = 0

function setup(thread)
   thread:set("thread_index", nthreads)
   nthreads = nthreads + 1
   table.insert(threads, thread)
end

function init(args)
   local base = tonumber(os.getenv("WRK_USER_BASE") or "") or 1000000000
   next_user = base + thread_index * 100000000
   statuses = {}
   ids = {}
   bad_bodies = 0
   -- each thread its own sequence of waits
   math.randomseed(os.time() * 1000 + thread_index)
end

-- WRK_DELAY_MS: each connection waits a random time, WRK_DELAY_MS on
-- average, after an answer before its next request: a paced, moderate load,
-- to read latency without the queue of a saturated closed loop (wrk leaves
-- the wait out of the latency). The wait is exponential, not fixed: with a
-- fixed wait the connections, started together and answered alike, stay in
-- step, and the "paced" load arrives as one burst of every connection at
-- once, whose last request waits for all the others.
local pace = tonumber(os.getenv("WRK_DELAY_MS") or "")
if pace and pace > 0 then
   function delay()
      -- wrk takes whole milliseconds: round, so the mean stays the pace.
      return math.floor(-pace * math.log(1 - math.random()) + 0.5)
   end
end

local vouchers = {}
for v in string.gmatch(os.getenv("WRK_VOUCHERS") or "", "%d+") do
   vouchers[#vouchers + 1] = v
end

function request()
   local path = nil
   next_user = next_user + 1
   if #vouchers > 0 then
      path = "/voucher/" .. vouchers[(next_user % #vouchers) + 1] .. "/seckill"
   end
   -- %.0f: tostring() would print large numbers as 1e+15.
   return wrk.format("POST", path, { ["X-User-Id"] = string.format("%.0f", next_user) }, "")
end

function response(status, headers, body)
   local key = tostring(status)
   statuses[key] = (statuses[key] or 0) + 1
   if status == 200 then
      local id = body and string.match(body, '"orderId":"(%d+)"')
      if id then
         ids[#ids + 1] = id
      else
         bad_bodies = bad_bodies + 1
      end
   end
end

local function json_string(s)
   return '"' .. string.gsub(tostring(s), '[%c"\\]', function(c)
      return string.format("\\u%04x", string.byte(c))
   end) .. '"'
end

function done(summary, latency, requests)
   local total = {}
   local all_ids = {}
   local bad = 0
   for _, t in ipairs(threads) do
      for k, v in pairs(t:get("statuses") or {}) do
         total[k] = (total[k] or 0) + v
      end
      for _, id in ipairs(t:get("ids") or {}) do
         all_ids[#all_ids + 1] = id
      end
      bad = bad + (t:get("bad_bodies") or 0)
   end

   local keys = {}
   for k in pairs(total) do keys[#keys + 1] = k end
   table.sort(keys)
   local parts, jparts = {}, {}
   for _, k in ipairs(keys) do
      parts[#parts + 1] = k .. "=" .. total[k]
      jparts[#jparts + 1] = json_string(k) .. ":" .. total[k]
   end
   io.write("wrk-statuses: " .. table.concat(parts, " ") .. "\n")
   if bad > 0 then
      io.write("wrk: " .. bad .. " answers with 200 had no orderId\n")
   end

   local ids_file = os.getenv("WRK_IDS_FILE")
   if ids_file and ids_file ~= "" then
      local f = assert(io.open(ids_file, "w"))
      for _, id in ipairs(all_ids) do f:write(id, "\n") end
      f:close()
   end

   local summary_file = os.getenv("WRK_SUMMARY")
   if summary_file and summary_file ~= "" then
      local e = summary.errors
      local f = assert(io.open(summary_file, "w"))
      f:write("{",
         '"requests":', summary.requests, ",",
         '"durationUs":', summary.duration, ",",
         '"bytes":', summary.bytes, ",",
         '"statuses":{', table.concat(jparts, ","), "},",
         '"orderIds":', #all_ids, ",",
         '"okWithoutOrderId":', bad, ",",
         '"errors":{"connect":', e.connect, ',"read":', e.read, ',"write":', e.write,
         ',"status":', e.status, ',"timeout":', e.timeout, "},",
         '"latencyUs":{"p50":', latency:percentile(50), ',"p90":', latency:percentile(90),
         ',"p99":', latency:percentile(99), ',"max":', latency.max, ',"mean":', latency.mean, "}",
         "}\n")
      f:close()
   end
end
