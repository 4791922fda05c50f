/* config: environment variables (and --flags that mirror them) -> g_cfg. */
#include "config.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

config g_cfg;

enum opt_type { OPT_INT, OPT_LONG, OPT_STR, OPT_BOOL, OPT_LEVEL, OPT_LOCK, OPT_STOCK, OPT_LEASE };

static const char *const lock_names[] = { "none", "local", "setnx", "owner", "reentrant",
                                          "zk", "pg-table", "pg-advisory",
                                          "multilock", "redlock" };
static const char *const stock_names[] = { "naive", "cas", "optimistic", "pessimistic",
                                           "batched", "redis" };

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

typedef struct option_def {
    const char *env;
    const char *flag;          /* --flag=value or --flag value */
    enum opt_type type;
    size_t offset;             /* into struct config */
    size_t size;               /* OPT_STR buffer size */
    long min, max;             /* OPT_INT / OPT_LONG */
    const char *def;
    const char *help;
} option_def;

#define F(field) offsetof(config, field), sizeof(((config *)0)->field)

static const option_def options[] = {
    { "PORT", "port", OPT_INT, F(port), 1, 65535, "8080", "HTTP port" },
    { "BIND", "bind", OPT_STR, F(bind), 0, 0, "127.0.0.1", "IPv4 address to listen on" },
    { "INSTANCE_ID", "instance-id", OPT_STR, F(instance_id), 0, 0, "",
      "name of this instance in /stats and logs (default: <hostname>-<port>)" },
    { "PG_DSN", "pg-dsn", OPT_STR, F(pg_dsn), 0, 0, "",
      "libpq connection string or URI (empty: PGHOST, PGPORT, ... apply)" },
    { "REDIS_URL", "redis-url", OPT_STR, F(redis_url_text), 0, 0, "redis://127.0.0.1:6379",
      "redis://[[user]:password@]host[:port][/db]" },
    { "THREADS", "threads", OPT_INT, F(threads), 1, 256, "8",
      "worker threads for requests that need Redis or Postgres; each owns one connection to each" },
    { "IO_THREADS", "io-threads", OPT_INT, F(io_threads), 1, 64, "2",
      "HTTP event threads: read requests, answer what memory can (sold out, bad input), "
      "hand the rest to the workers" },
    { "MAX_CONNECTIONS", "max-connections", OPT_INT, F(max_connections), 1, 100000, "1024",
      "open HTTP connections at most" },
    { "CONN_TIMEOUT_S", "conn-timeout", OPT_INT, F(conn_timeout_s), 1, 3600, "15",
      "close an HTTP connection idle this long (seconds)" },
    { "SHUTDOWN_DRAIN_MS", "shutdown-drain-ms", OPT_INT, F(shutdown_drain_ms), 0, 600000, "6000",
      "on SIGTERM, how long the instance keeps serving its open connections (each answer with "
      "Connection: close) for their clients to close them (ms); above nginx's upstream "
      "keepalive_timeout (5 s)" },
    { "STATS_INTERVAL_MS", "stats-interval-ms", OPT_INT, F(stats_interval_ms), 0, 60000, "1000",
      "GET /stats and /metrics read Postgres (one pass over the orders) and Redis at most once "
      "per this interval, on one thread, for every caller (ms)" },
    { "MAX_BODY", "max-body", OPT_LONG, F(max_body), 0, 1L << 30, "65536",
      "largest request body in bytes (413 above)" },
    { "LOCK_LEASE_MS", "lock-lease-ms", OPT_LEASE, F(lock_lease_ms), 1, 86400000L, "10000",
      "lease of the per-user order lock (ms); -1: watchdog mode (WATCHDOG_TIMEOUT_MS, renewed)" },
    { "WATCHDOG_TIMEOUT_MS", "watchdog-timeout-ms", OPT_LONG, F(watchdog_timeout_ms), 300,
      86400000L, "30000", "lease of watchdog-mode locks, renewed every third of it (ms)" },
    { "REDIS_SENTINELS", "redis-sentinels", OPT_STR, F(sentinels_text), 0, 0, "",
      "host:port[,host:port...] of Redis Sentinels: the master is found through them and "
      "followed across failovers (REDIS_URL then gives only the password and db)" },
    { "REDIS_MASTER_NAME", "redis-master-name", OPT_STR, F(master_name), 0, 0, "seckill",
      "name of the master the Sentinels monitor" },
    { "LOCK_SYNC_REPLICAS", "lock-sync-replicas", OPT_INT, F(lock_sync_replicas), 0, 16, "0",
      "a lock grant counts only once this many replicas acknowledged it (WAIT); fewer: "
      "the grant is undone and the buyer gets 503" },
    { "LOCK_SYNC_TIMEOUT_MS", "lock-sync-timeout-ms", OPT_INT, F(lock_sync_timeout_ms), 1,
      60000, "500", "how long a grant waits for those acknowledgements (ms); below REDIS_TIMEOUT_MS" },
    { "LOCK_TOKEN_TTL_MS", "lock-token-ttl-ms", OPT_LONG, F(lock_token_ttl_ms), 0,
      2592000000L, "60000",
      "a lock's fencing-token counter expires this long after its last token (ms; "
      "0: never, as Redisson's RFencedLock)" },
    { "FENCE_HORIZON_MS", "fence-horizon-ms", OPT_LONG, F(fence_horizon_ms), 0, 2592000000L,
      "600000",
      "order writes whose fencing token is older than this (by Postgres's clock) are refused; "
      "tb_lock_fence rows twice as old are deleted (ms; 0: neither, rows kept forever)" },
    { "REDIS_TIMEOUT_MS", "redis-timeout-ms", OPT_INT, F(redis_timeout_ms), 10, 60000, "1000",
      "Redis connect and command timeout (ms)" },
    { "PG_CONNECT_TIMEOUT_S", "pg-connect-timeout", OPT_INT, F(pg_connect_timeout_s), 1, 60, "2",
      "Postgres connect timeout (s)" },
    { "PG_STATEMENT_TIMEOUT_MS", "pg-statement-timeout-ms", OPT_INT,
      F(pg_statement_timeout_ms), 10, 600000, "5000", "Postgres statement timeout (ms)" },
    { "ADMIN_TOKEN", "admin-token", OPT_STR, F(admin_token), 0, 0, "",
      "bearer token of the admin API (empty: admin API answers 403)" },
    { "ADMIN_TOKEN_FILE", "admin-token-file", OPT_STR, F(admin_token_file), 0, 0, "",
      "file holding the admin API's token, read at start (trailing newline stripped); "
      "instead of ADMIN_TOKEN, which must then be empty" },
    { "LOG_LEVEL", "log-level", OPT_LEVEL, F(log_level), 0, 0, "info",
      "error, warn, info (one access line per request) or debug" },
    { "LOG_FORMAT", "log-format", OPT_STR, F(log_format), 0, 0, "text",
      "text, or json: one JSON object per line (access lines carry X-Request-Id)" },
    { "LUA_DIR", "lua-dir", OPT_STR, F(lua_dir), 0, 0, "",
      "directory of the Redis scripts (default: ./lua or next to the binary)" },
    { "ID_PREFIX", "id-prefix", OPT_STR, F(id_prefix), 0, 0, "order",
      "order id counter keys: icr:<prefix>:<yyyy:MM:dd>" },
    { "DEMO_RANDOM_USER", "demo-random-user", OPT_BOOL, F(demo_random_user), 0, 1, "0",
      "1: a seckill request without X-User-Id is a new random user (load tests only)" },
    { "SECKILL_LOCK", "lock", OPT_LOCK, F(lock_strategy), 0, 0, "reentrant",
      "per-user lock: reentrant (Redis), multilock or redlock (several Redis masters), zk "
      "(ZooKeeper), pg-table or pg-advisory (Postgres); "
      "none, local, setnx and owner are the demo ladder's unsafe steps" },
    { "ZK_HOSTS", "zk-hosts", OPT_STR, F(zk_hosts), 0, 0, "",
      "SECKILL_LOCK=zk: the ZooKeeper servers, host:port[,host:port...]" },
    { "ZK_SESSION_TIMEOUT_MS", "zk-session-timeout-ms", OPT_INT, F(zk_session_timeout_ms), 500,
      600000, "6000", "SECKILL_LOCK=zk: session timeout asked of ZooKeeper (ms); the locks of "
      "a process that died go after it" },
    { "LOCK_REDIS_NODES", "lock-redis-nodes", OPT_STR, F(lock_redis_nodes), 0, 0, "",
      "SECKILL_LOCK=multilock or redlock: the independent Redis masters, "
      "redis://host:port[,redis://host:port...] (redlock: at least 3)" },
    { "LOCK_REDIS_NODE_TIMEOUT_MS", "lock-redis-node-timeout-ms", OPT_INT,
      F(lock_redis_node_timeout_ms), 1, 10000, "50",
      "multilock, redlock: each node's connect and command timeout (ms), at most a tenth of "
      "LOCK_LEASE_MS" },
    { "LOCK_PG_SWEEP_MS", "lock-pg-sweep-ms", OPT_INT, F(lock_pg_sweep_ms), 0, 3600000, "0",
      "SECKILL_LOCK=pg-table: delete expired lock rows this often (ms; 0: never, the next "
      "acquire takes an expired row over)" },
    { "SECKILL_STOCK", "stock", OPT_STOCK, F(stock_strategy), 0, 0, "optimistic",
      "stock deduction: naive, cas, optimistic, pessimistic, batched or redis (Redis-first "
      "admission, orders persisted by a consumer; naive oversells)" },
    { "REDIS_ORDER_DURABILITY", "redis-order-durability", OPT_STR, F(redis_order_durability), 0,
      0, "aof", "redis: when an order admitted in Redis is answered 200: aof (Redis must run "
      "appendonly yes, appendfsync always: checked), wait (WAIT for REDIS_ORDER_WAIT_REPLICAS "
      "replicas) or none (unsafe: a Redis crash loses acknowledged orders)" },
    { "REDIS_ORDER_WAIT_REPLICAS", "redis-order-wait-replicas", OPT_INT,
      F(redis_order_wait_replicas), 1, 16, "1", "redis, durability wait: replicas that must "
      "acknowledge an order before its 200" },
    { "REDIS_ORDER_WAIT_MS", "redis-order-wait-ms", OPT_INT, F(redis_order_wait_ms), 1, 60000,
      "200", "redis, durability wait: how long WAIT waits for them (fewer: 503)" },
    { "REDIS_ADMIT_PIPELINES", "redis-admit-pipelines", OPT_INT, F(redis_admit_pipelines), 0,
      16, "2", "redis: admissions are sent to Redis in lots, by at most this many workers at "
      "once, each admitting every queued buyer with one script call; 0: each worker "
      "sends its buyer's alone" },
    { "CONSUMERS", "consumers", OPT_INT, F(consumers), 0, 1, "1",
      "redis: 1 runs a stream consumer in this instance (persists admitted orders to "
      "Postgres); 0: this instance only admits" },
    { "CONSUMER_BATCH_MAX", "consumer-batch-max", OPT_INT, F(consumer_batch_max), 1, 10000,
      "500", "redis: orders the consumer reads from the stream and persists in one transaction "
      "at most" },
    { "CONSUMER_LINGER_MS", "consumer-linger-ms", OPT_INT, F(consumer_linger_ms), 0, 1000,
      "20", "redis: the consumer reads new orders at most once in this many ms unless its "
      "last read was full, so that each transaction carries more of them (0: as they come)" },
    { "CONSUMER_CLAIM_IDLE_MS", "consumer-claim-idle-ms", OPT_INT, F(consumer_claim_idle_ms),
      100, 3600000, "20000", "redis: orders delivered to a consumer that has not acknowledged "
      "them for this long are claimed by another (XAUTOCLAIM); must exceed the slowest batch, "
      "3 x (PG_STATEMENT_TIMEOUT_MS + 1000)" },
    { "CONSUMER_RETRY_MAX_MS", "consumer-retry-max-ms", OPT_INT, F(consumer_retry_max_ms), 10,
      600000, "5000", "redis: a batch Postgres refuses for now (read-only, a lock or statement "
      "timeout, a lost connection) stays pending and is tried again after a pause that doubles "
      "from 50 ms up to this (jittered; at most half of CONSUMER_CLAIM_IDLE_MS), for as long as "
      "it takes" },
    { "STREAM_BACKLOG_MAX", "stream-backlog-max", OPT_INT, F(stream_backlog_max), 0, 100000000,
      "200000", "redis: with more admitted orders than this not yet in Postgres, admission "
      "answers 503 and /ready is not ready until the consumers catch up (0: no bound)" },
    { "CONSUMER_REMOVE_IDLE_MS", "consumer-remove-idle-ms", OPT_INT,
      F(consumer_remove_idle_ms), 1000, 86400000, "60000", "redis: a consumer name in the "
      "group that holds no pending order and was idle this long is removed (XGROUP "
      "DELCONSUMER): what restarts leave behind; a live consumer refreshes its own name every "
      "third of this (at most every 10 s)" },
    { "DEAD_LETTERS_MAX", "dead-letters-max", OPT_INT, F(dead_letters_max), 1, 1000000000,
      "100000", "redis: the dead-letter stream keeps about this many entries, the newest "
      "(XADD MAXLEN ~: within a stream node of it)" },
    { "EARLY_LOCK_RELEASE", "early-lock-release", OPT_BOOL, F(early_lock_release), 0, 1, "1",
      "optimistic: commit without waiting for the WAL flush, so the voucher row is free at once; "
      "answer only after the flush (0: the row lock is held through the flush)" },
    { "BATCH_MAX", "batch-max", OPT_INT, F(batch_max), 1, 1000, "64",
      "batched: buyers settled in one transaction at most" },
    { "BATCH_WINDOW_US", "batch-window-us", OPT_INT, F(batch_window_us), 0, 1000000, "1000",
      "batched: how long a batch gathers buyers (microseconds)" },
    { "BATCH_EARLY_LOCK_RELEASE", "batch-early-lock-release", OPT_BOOL,
      F(batch_early_lock_release), 0, 1, "0",
      "batched: a batch commits without waiting for the WAL flush, so the voucher row is free "
      "at once; a second transaction waits for the flush before anyone is answered" },
    { "BATCH_PIPELINE", "batch-pipeline", OPT_BOOL, F(batch_pipeline), 0, 1, "1",
      "batched: the next batch gathers and takes its locks and ids while the one before it "
      "commits; 0: one batch at a time" },
    { "DEMO_DELAY_MS", "demo-delay-ms", OPT_INT, F(demo_delay_ms), 0, 60000, "0",
      "demo only: sleep this long inside the critical section to widen races" },
    { "DEMO_PAUSE_MS", "demo-pause-ms", OPT_INT, F(demo_pause_ms), 0, 60000, "0",
      "demo only: pause this long after taking the lock (a GC pause: shows fencing)" },
    { "FENCING", "fencing", OPT_BOOL, F(fencing), 0, 1, "1",
      "0, demo only (UNSAFE): order writes skip the fencing token check, so a holder whose "
      "lock was lost still writes" },
    { "TEST_CLOCK_STEP_MS", "test-clock-step-ms", OPT_INT, F(test_clock_step_ms), 0, 3600000,
      "0", "testing only: timed waits read the wall clock this far ahead, as if it were "
      "stepped back by it each time (shows that no wait depends on the wall clock)" },
    { "REQUEST_DEADLINE_MS", "request-deadline-ms", OPT_INT, F(request_deadline_ms), 0, 600000,
      "8000", "work not started this long after a request arrived is answered 503 and not "
      "done (below the proxy's read timeout; 0: no deadline)" },
    { "RETRY_AFTER_S", "retry-after", OPT_INT, F(retry_after_s), 0, 3600, "1",
      "Retry-After seconds sent with 503" },
};

#define NOPTIONS (sizeof options / sizeof options[0])

void config_usage(FILE *out)
{
    fprintf(out,
            "usage: seckill [--flag=value ...]\n\n"
            "Flash-sale service. Every setting is an environment variable; the flag\n"
            "beside it overrides it.\n\n");
    for (size_t i = 0; i < NOPTIONS; i++) {
        const option_def *o = &options[i];
        fprintf(out, "  %-24s --%-24s %s", o->env, o->flag, o->help);
        if (o->def[0] != '\0')
            fprintf(out, " [%s]", o->def);
        fputc('\n', out);
    }
    fprintf(out, "\n  --help                    this text\n"
                 "  --version                 version, and the versions of the libraries\n");
}

static int set_option(const option_def *o, const char *val, const char *origin)
{
    char *base = (char *)&g_cfg;
    char *end;

    switch (o->type) {
    case OPT_STR:
        if (strlen(val) >= o->size) {
            fprintf(stderr, "seckill: %s is too long (at most %zu bytes)\n", origin, o->size - 1);
            return -1;
        }
        memcpy(base + o->offset, val, strlen(val) + 1);
        return 0;
    case OPT_INT:
    case OPT_LONG:
    case OPT_BOOL: {
        errno = 0;
        long v = strtol(val, &end, 10);
        if (val[0] == '\0' || *end != '\0' || errno != 0 || v < o->min || v > o->max) {
            fprintf(stderr, "seckill: invalid %s='%s': expected an integer in %ld..%ld\n",
                    origin, val, o->min, o->max);
            return -1;
        }
        if (o->type == OPT_LONG)
            *(long *)(base + o->offset) = v;
        else
            *(int *)(base + o->offset) = (int)v;
        return 0;
    }
    case OPT_LOCK:
    case OPT_STOCK: {
        const char *const *names = o->type == OPT_LOCK ? lock_names : stock_names;
        size_t n = o->type == OPT_LOCK ? NELEM(lock_names) : NELEM(stock_names);
        for (size_t i = 0; i < n; i++) {
            if (strcmp(val, names[i]) == 0) {
                *(int *)(base + o->offset) = (int)i;
                return 0;
            }
        }
        fprintf(stderr, "seckill: invalid %s='%s': expected one of", origin, val);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %s", names[i]);
        fputc('\n', stderr);
        return -1;
    }
    case OPT_LEASE: {
        errno = 0;
        long v = strtol(val, &end, 10);
        if (val[0] == '\0' || *end != '\0' || errno != 0 || (v != -1 && (v < o->min || v > o->max))) {
            fprintf(stderr, "seckill: invalid %s='%s': expected a lease in ms (%ld..%ld) "
                            "or -1 for watchdog mode\n", origin, val, o->min, o->max);
            return -1;
        }
        *(long *)(base + o->offset) = v;
        return 0;
    }
    case OPT_LEVEL: {
        enum log_level lvl;
        if (log_parse_level(val, &lvl) != 0) {
            fprintf(stderr, "seckill: invalid %s='%s': expected error, warn, info or debug\n",
                    origin, val);
            return -1;
        }
        *(int *)(base + o->offset) = (int)lvl;
        return 0;
    }
    }
    return -1;
}

const char *config_lock_name(int s)
{
    return s >= 0 && (size_t)s < NELEM(lock_names) ? lock_names[s] : "unknown";
}

const char *config_stock_name(int s)
{
    return s >= 0 && (size_t)s < NELEM(stock_names) ? stock_names[s] : "unknown";
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

/* A host name or IPv4 address: letters, digits, '-', '.', '_'. */
static int host_ok(const char *h, size_t n)
{
    if (n == 0 || n >= sizeof ((sentinel_addr *)0)->host)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = h[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '.' || c == '_'))
            return 0;
    }
    return 1;
}

int config_parse_sentinels(const char *s, sentinel_addr *out, int max)
{
    util_list it;
    const char *p;
    size_t len;
    int n = 0;

    util_list_init(&it, s);
    while (util_list_next(&it, &p, &len)) {
        const char *colon = memchr(p, ':', len);
        char port_s[8];
        char *stop;
        long port;

        if (n == max || colon == NULL || !host_ok(p, (size_t)(colon - p)))
            return -1;
        size_t plen = len - (size_t)(colon + 1 - p);
        if (plen == 0 || plen >= sizeof port_s)
            return -1;
        memcpy(port_s, colon + 1, plen);
        port_s[plen] = '\0';
        errno = 0;
        port = strtol(port_s, &stop, 10);
        if (*stop != '\0' || errno != 0 || port < 1 || port > 65535 || port_s[0] == '+' ||
            port_s[0] == '-' || port_s[0] == ' ')
            return -1;
        memcpy(out[n].host, p, (size_t)(colon - p));
        out[n].host[colon - p] = '\0';
        out[n].port = (int)port;
        n++;
    }
    return n;
}

/* ---- the effective configuration, secrets masked ---- */

#define MASK "***"

/* Appends to a bounded buffer; the text is cut, never overrun. */
typedef struct sbuf {
    char *b;
    size_t n, len;
} sbuf;

static void sb_mem(sbuf *sb, const char *s, size_t k)
{
    if (sb->n == 0)
        return;
    if (k > sb->n - 1 - sb->len)
        k = sb->n - 1 - sb->len;
    memcpy(sb->b + sb->len, s, k);
    sb->len += k;
    sb->b[sb->len] = '\0';
}

static void sb_str(sbuf *sb, const char *s)
{
    sb_mem(sb, s, strlen(s));
}

static sbuf sb_init(char *out, size_t n)
{
    sbuf sb = { out, n, 0 };
    if (n > 0)
        out[0] = '\0';
    return sb;
}

void config_mask_redis_urls(const char *list, char *out, size_t n)
{
    sbuf sb = sb_init(out, n);
    util_list it;
    const char *p;
    size_t len;

    util_list_init(&it, list);
    while (util_list_next(&it, &p, &len)) {
        char one[1200], masked[1200];

        if (len >= sizeof one) {       /* longer than any entry the parser takes */
            sb_str(&sb, MASK);
        } else {
            memcpy(one, p, len);
            one[len] = '\0';
            redis_url_mask(one, masked, sizeof masked);
            sb_str(&sb, masked);
        }
        if (!it.last)
            sb_str(&sb, ",");
    }
}

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* A postgres[ql]:// URI (libpq's "connection URI"): user:password@ and any
 * password=... parameter. */
static void mask_dsn_uri(const char *dsn, const char *rest, sbuf *sb)
{
    const char *p = rest, *q;

    /* As libpq: a '@' before any '/' closes the user part. */
    while (*p != '\0' && *p != '@' && *p != '/')
        p++;
    if (*p == '@') {
        const char *colon = memchr(rest, ':', (size_t)(p - rest));
        sb_mem(sb, dsn, (size_t)((colon ? colon + 1 : p) - dsn));
        if (colon != NULL)
            sb_str(sb, MASK);
        rest = p;
    } else {
        sb_mem(sb, dsn, (size_t)(rest - dsn));
    }
    q = strchr(rest, '?');
    if (q == NULL) {
        sb_str(sb, rest);
        return;
    }
    sb_mem(sb, rest, (size_t)(q + 1 - rest));
    for (p = q + 1; *p != '\0';) {
        const char *end = strchr(p, '&');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len >= 9 && strncmp(p, "password=", 9) == 0) {
            sb_str(sb, "password=" MASK);
        } else {
            sb_mem(sb, p, len);
        }
        p += len;
        if (*p == '&')
            sb_mem(sb, p++, 1);
    }
}

void config_mask_dsn(const char *dsn, char *out, size_t n)
{
    sbuf sb = sb_init(out, n);
    const char *p = dsn;

    if (strncmp(dsn, "postgresql://", 13) == 0) {
        mask_dsn_uri(dsn, dsn + 13, &sb);
        return;
    }
    if (strncmp(dsn, "postgres://", 11) == 0) {
        mask_dsn_uri(dsn, dsn + 11, &sb);
        return;
    }
    /* keyword = value pairs; a value is 'quoted' (backslash escapes) or runs
     * to the next space. Anything libpq would refuse ends the copy with
     * "...", so a mangled password is never shown either. */
    while (*p != '\0') {
        const char *start = p, *key, *val;
        size_t klen;

        while (is_space(*p))
            p++;
        if (*p == '\0') {
            sb_mem(&sb, start, (size_t)(p - start));
            break;
        }
        key = p;
        while (*p != '\0' && *p != '=' && !is_space(*p))
            p++;
        klen = (size_t)(p - key);
        while (is_space(*p))
            p++;
        if (*p != '=' || klen == 0) {
            sb_str(&sb, "...");
            return;
        }
        p++;
        while (is_space(*p))
            p++;
        val = p;
        if (*p == '\'') {
            for (p++; *p != '\0' && *p != '\''; p++)
                if (*p == '\\' && p[1] != '\0')
                    p++;
            if (*p != '\'') {
                sb_str(&sb, "...");
                return;
            }
            p++;
        } else {
            for (; *p != '\0' && !is_space(*p); p++)
                if (*p == '\\' && p[1] != '\0')
                    p++;
        }
        sb_mem(&sb, start, (size_t)(val - start));
        if (klen == 8 && strncmp(key, "password", 8) == 0)
            sb_str(&sb, MASK);
        else
            sb_mem(&sb, val, (size_t)(p - val));
    }
}

/* NAME=value, the value in double quotes when it is empty or holds a space,
 * a quote or a backslash. */
static void describe_pair(sbuf *sb, const char *name, const char *val)
{
    int quote = val[0] == '\0' || strpbrk(val, " \t\"\\") != NULL;

    if (sb->len > 0)
        sb_str(sb, " ");
    sb_str(sb, name);
    sb_str(sb, quote ? "=\"" : "=");
    for (const char *c = val; *c != '\0'; c++) {
        if (quote && (*c == '"' || *c == '\\'))
            sb_str(sb, "\\");
        sb_mem(sb, c, 1);
    }
    if (quote)
        sb_str(sb, "\"");
}

void config_describe(char *buf, size_t n)
{
    static const char *const level_names[] = { "error", "warn", "info", "debug" };
    sbuf sb = sb_init(buf, n);
    const char *base = (const char *)&g_cfg;

    for (size_t i = 0; i < NOPTIONS; i++) {
        const option_def *o = &options[i];
        const void *field = base + o->offset;
        char val[1200];

        switch (o->type) {
        case OPT_STR:
            if (strcmp(o->env, "ADMIN_TOKEN") == 0)
                snprintf(val, sizeof val, "%s", *(const char *)field ? MASK : "");
            else if (strcmp(o->env, "REDIS_URL") == 0)
                redis_url_mask(field, val, sizeof val);
            else if (strcmp(o->env, "LOCK_REDIS_NODES") == 0)
                config_mask_redis_urls(field, val, sizeof val);
            else if (strcmp(o->env, "PG_DSN") == 0)
                config_mask_dsn(field, val, sizeof val);
            else
                snprintf(val, sizeof val, "%s", (const char *)field);
            break;
        case OPT_INT:
        case OPT_BOOL:
            snprintf(val, sizeof val, "%d", *(const int *)field);
            break;
        case OPT_LONG:
        case OPT_LEASE:
            snprintf(val, sizeof val, "%ld", *(const long *)field);
            break;
        case OPT_LEVEL: {
            int l = *(const int *)field;
            snprintf(val, sizeof val, "%s", l >= 0 && l <= LOG_DEBUG ? level_names[l] : "?");
            break;
        }
        case OPT_LOCK:
            snprintf(val, sizeof val, "%s", config_lock_name(*(const int *)field));
            break;
        case OPT_STOCK:
            snprintf(val, sizeof val, "%s", config_stock_name(*(const int *)field));
            break;
        default:
            val[0] = '\0';
            break;
        }
        describe_pair(&sb, o->env, val);
    }
}

/* ---- defaults that depend on the machine ---- */

/* "<hostname>-<port>", the hostname cut and with characters INSTANCE_ID
 * does not allow replaced by '-'; "seckill-<port>" without a hostname. */
static void default_instance_id(void)
{
    char host[256];

    if (gethostname(host, sizeof host) != 0 || host[0] == '\0') {
        snprintf(g_cfg.instance_id, sizeof g_cfg.instance_id, "seckill-%d", g_cfg.port);
        return;
    }
    host[sizeof host - 1] = '\0';
    for (char *c = host; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '-' || *c == '_' || *c == '.'))
            *c = '-';
    /* 63 bytes at most: room for "-65535". */
    snprintf(g_cfg.instance_id, sizeof g_cfg.instance_id, "%.56s-%d", host, g_cfg.port);
}

/* ADMIN_TOKEN_FILE -> g_cfg.admin_token. 0, or -1 after a message. */
static int read_admin_token_file(void)
{
    const char *path = g_cfg.admin_token_file;
    char buf[sizeof g_cfg.admin_token + 8];
    size_t len;
    int rc = -1;
    FILE *f;

    if (g_cfg.admin_token[0] != '\0') {
        fprintf(stderr, "seckill: ADMIN_TOKEN and ADMIN_TOKEN_FILE are both set: set one of them\n");
        return -1;
    }
    f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "seckill: cannot read ADMIN_TOKEN_FILE '%s': %s\n", path, strerror(errno));
        return -1;
    }
    len = fread(buf, 1, sizeof buf - 1, f);
    if (ferror(f)) {
        fprintf(stderr, "seckill: cannot read ADMIN_TOKEN_FILE '%s': %s\n", path, strerror(errno));
        goto out;
    }
    buf[len] = '\0';
    if (memchr(buf, '\0', len) != NULL) {
        fprintf(stderr, "seckill: ADMIN_TOKEN_FILE '%s' holds a NUL byte\n", path);
        goto out;
    }
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
        buf[--len] = '\0';
    if (len == 0) {
        fprintf(stderr, "seckill: ADMIN_TOKEN_FILE '%s' is empty\n", path);
        goto out;
    }
    if (len >= sizeof g_cfg.admin_token || !feof(f)) {
        fprintf(stderr, "seckill: ADMIN_TOKEN_FILE '%s': the token is too long (at most %zu bytes)\n",
                path, sizeof g_cfg.admin_token - 1);
        goto out;
    }
    memcpy(g_cfg.admin_token, buf, len + 1);
    rc = 0;
out:
    fclose(f);
    return rc;
}

static int dir_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* ./lua when run from the checkout, else lua/ beside or above the binary. */
static void default_lua_dir(void)
{
    static const char *const rel[] = { "/../lua", "/../../lua", "/../../../lua", "/lua" };
    char exe[PATH_MAX];
    ssize_t n;

    if (dir_exists("lua")) {
        snprintf(g_cfg.lua_dir, sizeof g_cfg.lua_dir, "lua");
        return;
    }
    n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash != NULL)
            *slash = '\0';
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            char cand[PATH_MAX + 16];
            snprintf(cand, sizeof cand, "%s%s", exe, rel[i]);
            size_t len = strlen(cand);
            if (dir_exists(cand) && len < sizeof g_cfg.lua_dir) {
                memcpy(g_cfg.lua_dir, cand, len + 1);
                return;
            }
        }
    }
    snprintf(g_cfg.lua_dir, sizeof g_cfg.lua_dir, "lua");
}

/* ZK_HOSTS: host:port[,host:port...], required by SECKILL_LOCK=zk. */
static int check_zk_hosts(void)
{
    util_list it;
    const char *p;
    size_t len;
    int n = 0;

    if (g_cfg.zk_hosts[0] == '\0') {
        if (g_cfg.lock_strategy != LOCKS_ZK)
            return 0;
        fprintf(stderr, "seckill: SECKILL_LOCK=zk needs ZK_HOSTS=host:port[,host:port...]\n");
        return -1;
    }
    util_list_init(&it, g_cfg.zk_hosts);
    while (util_list_next(&it, &p, &len)) {
        const char *end = p + len;
        const char *colon = NULL;
        if (len == 0 && it.last && n > 0) {
            fprintf(stderr, "seckill: invalid ZK_HOSTS '%s': trailing comma\n", g_cfg.zk_hosts);
            return -1;
        }
        for (const char *q = p; q < end; q++)
            if (*q == ':')
                colon = q;
        char *num_end;
        long port = colon != NULL ? strtol(colon + 1, &num_end, 10) : 0;
        if (colon == NULL || colon == p || colon + 1 == end || num_end != end || port < 1 ||
            port > 65535 || memchr(p, ' ', (size_t)(end - p)) != NULL ||
            memchr(p, '/', (size_t)(end - p)) != NULL) {
            fprintf(stderr, "seckill: invalid ZK_HOSTS '%s': expected host:port[,host:port...]\n",
                    g_cfg.zk_hosts);
            return -1;
        }
        n++;
    }
    return 0;
}

int config_load(int argc, char **argv)
{
    memset(&g_cfg, 0, sizeof g_cfg);
    for (size_t i = 0; i < NOPTIONS; i++) {
        const char *env = getenv(options[i].env);
        char origin[64];
        if (set_option(&options[i], options[i].def, options[i].env) != 0)
            return -1;
        if (env != NULL) {
            snprintf(origin, sizeof origin, "%s", options[i].env);
            if (set_option(&options[i], env, origin) != 0)
                return -1;
        }
    }
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            config_usage(stdout);
            return 1;
        }
        if (strncmp(arg, "--", 2) != 0) {
            fprintf(stderr, "seckill: unexpected argument '%s' (see --help)\n", arg);
            return -1;
        }
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        const option_def *o = NULL;
        for (size_t i = 0; i < NOPTIONS; i++)
            if (strlen(options[i].flag) == nlen && strncmp(options[i].flag, name, nlen) == 0)
                o = &options[i];
        if (o == NULL) {
            fprintf(stderr, "seckill: unknown option '%s' (see --help)\n", arg);
            return -1;
        }
        const char *val = eq ? eq + 1 : NULL;
        if (val == NULL) {
            if (a + 1 >= argc) {
                fprintf(stderr, "seckill: option --%s needs a value\n", o->flag);
                return -1;
            }
            val = argv[++a];
        }
        char origin[64];
        snprintf(origin, sizeof origin, "--%s", o->flag);
        if (set_option(o, val, origin) != 0)
            return -1;
    }

    if (redis_url_parse(g_cfg.redis_url_text, &g_cfg.redis) != 0) {
        fprintf(stderr, "seckill: invalid REDIS_URL '%s': expected "
                        "redis://[[user]:password@]host[:port][/db]\n", g_cfg.redis_url_text);
        return -1;
    }
    if (strcmp(g_cfg.redis_order_durability, "aof") != 0 &&
        strcmp(g_cfg.redis_order_durability, "wait") != 0 &&
        strcmp(g_cfg.redis_order_durability, "none") != 0) {
        fprintf(stderr, "seckill: invalid REDIS_ORDER_DURABILITY '%s': aof, wait or none\n",
                g_cfg.redis_order_durability);
        return -1;
    }
    if (g_cfg.sentinels_text[0] != '\0') {
        g_cfg.n_sentinels = config_parse_sentinels(g_cfg.sentinels_text, g_cfg.sentinels,
                                                   CONFIG_MAX_SENTINELS);
        if (g_cfg.n_sentinels < 0) {
            fprintf(stderr, "seckill: invalid REDIS_SENTINELS '%s': expected "
                            "host:port[,host:port...] (at most %d)\n",
                    g_cfg.sentinels_text, CONFIG_MAX_SENTINELS);
            return -1;
        }
    }
    if (g_cfg.master_name[0] == '\0' || strpbrk(g_cfg.master_name, " \t\r\n") != NULL) {
        fprintf(stderr, "seckill: invalid REDIS_MASTER_NAME '%s': a name without spaces\n",
                g_cfg.master_name);
        return -1;
    }
    /* WAIT's answer must come back before the socket's read timeout. */
    if (g_cfg.lock_sync_replicas > 0 && g_cfg.lock_sync_timeout_ms >= g_cfg.redis_timeout_ms) {
        fprintf(stderr, "seckill: LOCK_SYNC_TIMEOUT_MS (%d) must be below REDIS_TIMEOUT_MS (%d): "
                        "the answer to WAIT has to arrive within the command timeout\n",
                g_cfg.lock_sync_timeout_ms, g_cfg.redis_timeout_ms);
        return -1;
    }
    if (g_cfg.instance_id[0] == '\0')
        default_instance_id();
    if (g_cfg.admin_token_file[0] != '\0' && read_admin_token_file() != 0)
        return -1;
    for (const char *c = g_cfg.instance_id; *c; c++) {
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '-' || *c == '_' || *c == '.')) {
            fprintf(stderr, "seckill: invalid INSTANCE_ID '%s': use letters, digits, '-', '_', '.'\n",
                    g_cfg.instance_id);
            return -1;
        }
    }
    for (const char *c = g_cfg.id_prefix; *c; c++) {
        if (*c == ':' || *c == ' ' || (unsigned char)*c < 0x21) {
            fprintf(stderr, "seckill: invalid ID_PREFIX '%s'\n", g_cfg.id_prefix);
            return -1;
        }
    }
    if (g_cfg.id_prefix[0] == '\0') {
        fprintf(stderr, "seckill: ID_PREFIX must not be empty\n");
        return -1;
    }
    if (strcmp(g_cfg.log_format, "text") != 0 && strcmp(g_cfg.log_format, "json") != 0) {
        fprintf(stderr, "seckill: invalid LOG_FORMAT '%s': expected text or json\n",
                g_cfg.log_format);
        return -1;
    }
    if (check_zk_hosts() != 0)
        return -1;
    if (g_cfg.fence_horizon_ms > 0 && g_cfg.fence_horizon_ms < 1000) {
        fprintf(stderr, "seckill: invalid FENCE_HORIZON_MS=%ld: expected 0 (no horizon) or at "
                        "least 1000 ms\n", g_cfg.fence_horizon_ms);
        return -1;
    }
    if (g_cfg.lua_dir[0] == '\0')
        default_lua_dir();
    util_uuid4(g_cfg.instance_uuid);
    return 0;
}
