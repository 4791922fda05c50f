/* config: the settings, one row each, and their loading into g_cfg. */
#include "config.h"
#include "config_check.h"
#include "config_machine.h"
#include "config_parse.h"

#include <stddef.h>
#include <string.h>

config g_cfg;

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* The names of the enum settings' values, indexed by their enums. */
static const char *const lock_names[] = { "none", "local", "setnx", "owner", "reentrant",
                                          "zk", "pg-table", "pg-advisory",
                                          "multilock", "redlock" };
static const char *const stock_names[] = { "naive", "cas", "optimistic", "pessimistic",
                                           "batched", "redis" };
static const char *const durability_names[] = { "aof", "wait", "none" };
static const char *const log_format_names[] = { "text", "json" };

_Static_assert(NELEM(lock_names) == LOCKS_REDLOCK + 1, "a lock strategy without a name");
_Static_assert(NELEM(stock_names) == STOCKS_REDIS + 1, "a stock strategy without a name");
_Static_assert(NELEM(durability_names) == DURABILITY_NONE + 1, "a durability without a name");
_Static_assert(NELEM(log_format_names) == LOGS_JSON + 1, "a log format without a name");

static const config_choices locks = { lock_names, NELEM(lock_names) };
static const config_choices stocks = { stock_names, NELEM(stock_names) };
static const config_choices durabilities = { durability_names, NELEM(durability_names) };
static const config_choices log_formats = { log_format_names, NELEM(log_format_names) };

/* One row per setting (config_parse.h): variable, flag, field, bounds or
 * values, default, help. The order is that of --help and the start-up log. */
#define F(field) offsetof(config, field), sizeof(((config *)0)->field)
#define ROW(env, flag, type, field, min, max, choices, show, def, help) \
    { env, flag, type, F(field), min, max, choices, show, def, help }
#define INT(env, flag, field, min, max, def, help) \
    ROW(env, flag, CONFIG_INT, field, min, max, NULL, CONFIG_SHOW_PLAIN, def, help)
#define LONG(env, flag, field, min, max, def, help) \
    ROW(env, flag, CONFIG_LONG, field, min, max, NULL, CONFIG_SHOW_PLAIN, def, help)
#define LEASE(env, flag, field, min, max, def, help) \
    ROW(env, flag, CONFIG_LEASE, field, min, max, NULL, CONFIG_SHOW_PLAIN, def, help)
#define BOOL(env, flag, field, def, help) \
    ROW(env, flag, CONFIG_BOOL, field, 0, 1, NULL, CONFIG_SHOW_PLAIN, def, help)
#define LEVEL(env, flag, field, def, help) \
    ROW(env, flag, CONFIG_LEVEL, field, 0, 0, NULL, CONFIG_SHOW_PLAIN, def, help)
#define ENUM(env, flag, field, choices, def, help) \
    ROW(env, flag, CONFIG_ENUM, field, 0, 0, &choices, CONFIG_SHOW_PLAIN, def, help)
#define STR(env, flag, field, def, help) \
    ROW(env, flag, CONFIG_STR, field, 0, 0, NULL, CONFIG_SHOW_PLAIN, def, help)
#define SECRET(env, flag, field, show, def, help) \
    ROW(env, flag, CONFIG_STR, field, 0, 0, NULL, show, def, help)

static const config_setting settings[] = {
    INT("PORT", "port", port, 1, 65535, "8080", "HTTP port"),
    STR("BIND", "bind", bind, "127.0.0.1", "IPv4 address to listen on"),
    STR("INSTANCE_ID", "instance-id", instance_id, "",
      "name of this instance in /stats and logs (default: <hostname>-<port>)"),
    SECRET("PG_DSN", "pg-dsn", pg_dsn, CONFIG_SHOW_DSN, "",
      "libpq connection string or URI (empty: PGHOST, PGPORT, ... apply)"),
    SECRET("REDIS_URL", "redis-url", redis_url_text,
      CONFIG_SHOW_REDIS_URL, CONFIG_REDIS_URL_DEFAULT,
      "redis://[[user]:password@]host[:port][/db]"),
    INT("THREADS", "threads", threads, 1, 256, "8",
      "worker threads for requests that need Redis or Postgres; each owns one connection to each"),
    INT("IO_THREADS", "io-threads", io_threads, 1, 64, "2",
      "HTTP event threads: read requests, answer what memory can (sold out, bad input), hand the "
      "rest to the workers"),
    INT("MAX_CONNECTIONS", "max-connections", max_connections, 1, 100000, "1024",
      "open HTTP connections at most"),
    INT("CONN_TIMEOUT_S", "conn-timeout", conn_timeout_s, 1, 3600, "15",
      "close an HTTP connection idle this long (seconds)"),
    INT("SHUTDOWN_DRAIN_MS", "shutdown-drain-ms", shutdown_drain_ms, 0, 600000, "6000",
      "on SIGTERM, how long the instance keeps serving its open connections (each answer with "
      "Connection: close) for their clients to close them (ms); above nginx's upstream "
      "keepalive_timeout (5 s)"),
    INT("STATS_INTERVAL_MS", "stats-interval-ms", stats_interval_ms, 0, 60000, "1000",
      "GET /stats and /metrics read Postgres (one pass over the orders) and Redis at most once "
      "per this interval, on one thread, for every caller (ms)"),
    LONG("MAX_BODY", "max-body", max_body, 0, 1L << 30, "65536",
      "largest request body in bytes (413 above)"),
    LEASE("LOCK_LEASE_MS", "lock-lease-ms", lock_lease_ms, 1, 86400000L, "10000",
      "lease of the per-user order lock (ms); -1: watchdog mode (WATCHDOG_TIMEOUT_MS, renewed)"),
    LONG("WATCHDOG_TIMEOUT_MS", "watchdog-timeout-ms", watchdog_timeout_ms, 300, 86400000L, "30000",
      "lease of watchdog-mode locks, renewed every third of it (ms)"),
    STR("REDIS_SENTINELS", "redis-sentinels", sentinels_text, "",
      "host:port[,host:port...] of Redis Sentinels: the master is found through them and "
      "followed across failovers (REDIS_URL then gives only the password and db)"),
    STR("REDIS_CLUSTER_NODES", "redis-cluster-nodes", cluster_nodes_text, "",
      "host:port[,host:port...] seed nodes of a Redis Cluster: each key goes to the master of "
      "its hash slot, followed across MOVED, ASK and failovers (not with REDIS_SENTINELS or a "
      "REDIS_URL of its own)"),
    STR("REDIS_MASTER_NAME", "redis-master-name", master_name, "seckill",
      "name of the master the Sentinels monitor"),
    INT("LOCK_SYNC_REPLICAS", "lock-sync-replicas", lock_sync_replicas, 0, 16, "0",
      "a lock grant counts only once this many replicas acknowledged it (WAIT); fewer: the grant "
      "is undone and the buyer gets 503"),
    INT("LOCK_SYNC_TIMEOUT_MS", "lock-sync-timeout-ms", lock_sync_timeout_ms, 1, 60000, "500",
      "how long a grant waits for those acknowledgements (ms); below REDIS_TIMEOUT_MS"),
    LONG("LOCK_TOKEN_TTL_MS", "lock-token-ttl-ms", lock_token_ttl_ms, 0, 2592000000L, "60000",
      "a lock's fencing-token counter expires this long after its last token (ms; 0: never, as "
      "Redisson's RFencedLock)"),
    LONG("FENCE_HORIZON_MS", "fence-horizon-ms", fence_horizon_ms, 0, 2592000000L, "600000",
      "order writes whose fencing token is older than this (by Postgres's clock) are refused; "
      "tb_lock_fence rows twice as old are deleted (ms; 0: neither, rows kept forever)"),
    INT("REDIS_TIMEOUT_MS", "redis-timeout-ms", redis_timeout_ms, 10, 60000, "1000",
      "Redis connect and command timeout (ms)"),
    INT("PG_CONNECT_TIMEOUT_S", "pg-connect-timeout", pg_connect_timeout_s, 1, 60, "2",
      "Postgres connect timeout (s)"),
    INT("PG_STATEMENT_TIMEOUT_MS", "pg-statement-timeout-ms", pg_statement_timeout_ms,
      10, 600000, "5000", "Postgres statement timeout (ms)"),
    BOOL("PG_HA", "pg-ha", pg_ha, "0",
      "Postgres has synchronous standbys (pg_auto_failover): a session whose synchronous_commit "
      "is below 'on', or whose primary has no synchronous standby, takes no order (checked at "
      "connect and every second; /ready says why), and each commit is answered only once a "
      "synchronous standby reports it flushed (needs pg_read_all_stats)"),
    SECRET("ADMIN_TOKEN", "admin-token", admin_token, CONFIG_SHOW_SECRET, "",
      "bearer token of the admin API (empty: admin API answers 403)"),
    STR("ADMIN_TOKEN_FILE", "admin-token-file", admin_token_file, "",
      "file holding the admin API's token, read at start (trailing newline stripped); instead of "
      "ADMIN_TOKEN, which must then be empty"),
    LEVEL("LOG_LEVEL", "log-level", log_level, "info",
      "error, warn, info (one access line per request) or debug"),
    ENUM("LOG_FORMAT", "log-format", log_format, log_formats, "text",
      "text, or json: one JSON object per line (access lines carry X-Request-Id)"),
    STR("LUA_DIR", "lua-dir", lua_dir, "",
      "directory of the Redis scripts (default: ./lua or next to the binary)"),
    STR("ID_PREFIX", "id-prefix", id_prefix, "order",
      "order id counter keys: icr:<prefix>:<yyyy:MM:dd>"),
    BOOL("DEMO_RANDOM_USER", "demo-random-user", demo_random_user, "0",
      "1: a seckill request without X-User-Id is a new random user (load tests only)"),
    ENUM("SECKILL_LOCK", "lock", lock_strategy, locks, "reentrant",
      "per-user lock: reentrant (Redis), multilock or redlock (several Redis masters), zk "
      "(ZooKeeper), pg-table or pg-advisory (Postgres); none, local, setnx and owner are the "
      "demo ladder's unsafe steps"),
    STR("ZK_HOSTS", "zk-hosts", zk_hosts, "",
      "SECKILL_LOCK=zk: the ZooKeeper servers, host:port[,host:port...]"),
    INT("ZK_SESSION_TIMEOUT_MS", "zk-session-timeout-ms", zk_session_timeout_ms,
      500, 600000, "6000",
      "SECKILL_LOCK=zk: session timeout asked of ZooKeeper (ms); the locks of a process that "
      "died go after it"),
    SECRET("LOCK_REDIS_NODES", "lock-redis-nodes", lock_redis_nodes, CONFIG_SHOW_REDIS_URLS, "",
      "SECKILL_LOCK=multilock or redlock: the independent Redis masters, "
      "redis://host:port[,redis://host:port...] (redlock: at least 3)"),
    INT("LOCK_REDIS_NODE_TIMEOUT_MS", "lock-redis-node-timeout-ms", lock_redis_node_timeout_ms,
      1, 10000, "50",
      "multilock, redlock: each node's connect and command timeout (ms), at most a tenth of "
      "LOCK_LEASE_MS"),
    INT("LOCK_PG_SWEEP_MS", "lock-pg-sweep-ms", lock_pg_sweep_ms, 0, 3600000, "0",
      "SECKILL_LOCK=pg-table: delete expired lock rows this often (ms; 0: never, the next "
      "acquire takes an expired row over)"),
    ENUM("SECKILL_STOCK", "stock", stock_strategy, stocks, "optimistic",
      "stock deduction: naive, cas, optimistic, pessimistic, batched or redis (Redis-first "
      "admission, orders persisted by a consumer; naive oversells)"),
    ENUM("REDIS_ORDER_DURABILITY", "redis-order-durability", redis_order_durability,
      durabilities, "aof",
      "redis: when an order admitted in Redis is answered 200: aof (Redis must run appendonly "
      "yes, appendfsync always: checked), wait (WAIT for REDIS_ORDER_WAIT_REPLICAS replicas) or "
      "none (unsafe: a Redis crash loses acknowledged orders)"),
    INT("REDIS_ORDER_WAIT_REPLICAS", "redis-order-wait-replicas", redis_order_wait_replicas,
      1, 16, "1", "redis, durability wait: replicas that must acknowledge an order before its 200"),
    INT("REDIS_ORDER_WAIT_MS", "redis-order-wait-ms", redis_order_wait_ms, 1, 60000, "200",
      "redis, durability wait: how long WAIT waits for them (fewer: 503)"),
    INT("REDIS_ADMIT_PIPELINES", "redis-admit-pipelines", redis_admit_pipelines, 0, 16, "2",
      "redis: admissions are sent to Redis in lots, by at most this many workers at once, each "
      "admitting every queued buyer with one script call; 0: each worker sends its buyer's alone"),
    INT("CONSUMERS", "consumers", consumers, 0, 1, "1",
      "redis: 1 runs a stream consumer in this instance (persists admitted orders to Postgres); "
      "0: this instance only admits"),
    INT("CONSUMER_BATCH_MAX", "consumer-batch-max", consumer_batch_max, 1, 10000, "500",
      "redis: orders the consumer reads from the stream and persists in one transaction at most"),
    INT("CONSUMER_LINGER_MS", "consumer-linger-ms", consumer_linger_ms, 0, 1000, "20",
      "redis: the consumer reads new orders at most once in this many ms unless its last read "
      "was full, so that each transaction carries more of them (0: as they come)"),
    INT("CONSUMER_CLAIM_IDLE_MS", "consumer-claim-idle-ms", consumer_claim_idle_ms,
      100, 3600000, "20000",
      "redis: orders delivered to a consumer that has not acknowledged them for this long are "
      "claimed by another (XAUTOCLAIM); must exceed the slowest batch, 3 x "
      "(PG_STATEMENT_TIMEOUT_MS + 1000)"),
    INT("CONSUMER_RETRY_MAX_MS", "consumer-retry-max-ms", consumer_retry_max_ms, 10, 600000, "5000",
      "redis: a batch Postgres refuses for now (read-only, a lock or statement timeout, a lost "
      "connection) stays pending and is tried again after a pause that doubles from 50 ms up to "
      "this (jittered; at most half of CONSUMER_CLAIM_IDLE_MS), for as long as it takes"),
    INT("STREAM_BACKLOG_MAX", "stream-backlog-max", stream_backlog_max, 0, 100000000, "200000",
      "redis: with more admitted orders than this not yet in Postgres, admission answers 503 and "
      "/ready is not ready until the consumers catch up (0: no bound)"),
    INT("CONSUMER_REMOVE_IDLE_MS", "consumer-remove-idle-ms", consumer_remove_idle_ms,
      1000, 86400000, "60000",
      "redis: a consumer name in the group that holds no pending order and was idle this long is "
      "removed (XGROUP DELCONSUMER): what restarts leave behind; a live consumer refreshes its "
      "own name every third of this (at most every 10 s)"),
    INT("DEAD_LETTERS_MAX", "dead-letters-max", dead_letters_max, 1, 1000000000, "100000",
      "redis: the dead-letter stream keeps about this many entries, the newest (XADD MAXLEN ~: "
      "within a stream node of it)"),
    BOOL("EARLY_LOCK_RELEASE", "early-lock-release", early_lock_release, "1",
      "optimistic: commit without waiting for the WAL flush, so the voucher row is free at once; "
      "answer only after the flush (0: the row lock is held through the flush)"),
    INT("BATCH_MAX", "batch-max", batch_max, 1, 1000, "64",
      "batched: buyers settled in one transaction at most"),
    INT("BATCH_WINDOW_US", "batch-window-us", batch_window_us, 0, 1000000, "1000",
      "batched: how long a batch gathers buyers (microseconds)"),
    BOOL("BATCH_EARLY_LOCK_RELEASE", "batch-early-lock-release", batch_early_lock_release, "0",
      "batched: a batch commits without waiting for the WAL flush, so the voucher row is free at "
      "once; a second transaction waits for the flush before anyone is answered"),
    BOOL("BATCH_PIPELINE", "batch-pipeline", batch_pipeline, "1",
      "batched: the next batch gathers and takes its locks and ids while the one before it "
      "commits; 0: one batch at a time"),
    INT("DEMO_DELAY_MS", "demo-delay-ms", demo_delay_ms, 0, 60000, "0",
      "demo only: sleep this long inside the critical section to widen races"),
    INT("DEMO_PAUSE_MS", "demo-pause-ms", demo_pause_ms, 0, 60000, "0",
      "demo only: pause this long after taking the lock (a GC pause: shows fencing)"),
    BOOL("FENCING", "fencing", fencing, "1",
      "0, demo only (UNSAFE): order writes skip the fencing token check, so a holder whose lock "
      "was lost still writes"),
    INT("TEST_CLOCK_STEP_MS", "test-clock-step-ms", test_clock_step_ms, 0, 3600000, "0",
      "testing only: timed waits read the wall clock this far ahead, as if it were stepped back "
      "by it each time (shows that no wait depends on the wall clock)"),
    INT("REQUEST_DEADLINE_MS", "request-deadline-ms", request_deadline_ms, 0, 600000, "8000",
      "work not started this long after a request arrived is answered 503 and not done (below "
      "the proxy's read timeout; 0: no deadline)"),
    INT("RETRY_AFTER_S", "retry-after", retry_after_s, 0, 3600, "1",
      "Retry-After seconds sent with 503"),
};

const config_setting *config_settings(size_t *n)
{
    *n = NELEM(settings);
    return settings;
}

int config_load(int argc, char **argv)
{
    int rc;

    memset(&g_cfg, 0, sizeof g_cfg);
    rc = config_parse_args(&g_cfg, settings, NELEM(settings), argc, argv);
    if (rc != 0)
        return rc;
    if (config_parse_endpoints(&g_cfg) != 0 || config_check(&g_cfg) != 0 ||
        config_machine_fill(&g_cfg) != 0)
        return -1;
    return 0;
}

const char *config_lock_name(int s)
{
    return config_parse_choice(&locks, s);
}

const char *config_stock_name(int s)
{
    return config_parse_choice(&stocks, s);
}

const char *config_durability_name(int d)
{
    return config_parse_choice(&durabilities, d);
}

/* The lock strategies that keep one order per user. */
static int lock_safe(int s)
{
    return s == LOCKS_REENTRANT || s == LOCKS_ZK || s == LOCKS_PG_TABLE || s == LOCKS_PG_ADVISORY ||
           s == LOCKS_MULTILOCK || s == LOCKS_REDLOCK;
}

int config_unsafe(void)
{
    return !lock_safe(g_cfg.lock_strategy) || g_cfg.stock_strategy == STOCKS_NAIVE ||
           g_cfg.demo_delay_ms > 0 || g_cfg.demo_pause_ms > 0 || !g_cfg.fencing;
}
