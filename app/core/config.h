/* config: the process configuration, read once from the environment (and
 * mirrored flags) before any thread starts, then read-only. config.c holds
 * the settings, one row each (config_parse.h says what a row gives);
 * config_parse turns their text into values, config_check applies the rules
 * between them, config_machine fills what the machine supplies, and
 * config_show prints them with the secrets masked. */
#ifndef SECKILL_CONFIG_H
#define SECKILL_CONFIG_H

#include "redis_url.h"

#include <stddef.h>
#include <stdint.h>

/* The demo ladder: none, local, setnx and owner exist to be measured;
 * reentrant (the default) and the other lock services' backends are safe.
 * Of the stock strategies, naive oversells. */
enum lock_strategy { LOCKS_NONE, LOCKS_LOCAL, LOCKS_SETNX, LOCKS_OWNER, LOCKS_REENTRANT,
                     LOCKS_ZK, LOCKS_PG_TABLE, LOCKS_PG_ADVISORY,
                     LOCKS_MULTILOCK, LOCKS_REDLOCK };
enum stock_strategy { STOCKS_NAIVE, STOCKS_CAS, STOCKS_OPTIMISTIC, STOCKS_PESSIMISTIC,
                      STOCKS_BATCHED, STOCKS_REDIS };
/* REDIS_ORDER_DURABILITY: when an order admitted in Redis is answered. */
enum order_durability { DURABILITY_AOF, DURABILITY_WAIT, DURABILITY_NONE };
/* LOG_FORMAT */
enum log_format { LOGS_TEXT, LOGS_JSON };

#define CONFIG_MAX_SENTINELS 16
#define CONFIG_REDIS_URL_DEFAULT "redis://127.0.0.1:6379"

/* One Sentinel of REDIS_SENTINELS. */
typedef struct sentinel_addr {
    char host[256];
    int port;
} sentinel_addr;

typedef struct config {
    int port;
    char bind[64];
    char instance_id[64];
    char pg_dsn[1024];          /* empty: libpq reads PGHOST, PGPORT, ... */
    char redis_url_text[512];
    redis_url redis;
    char sentinels_text[1024];  /* REDIS_SENTINELS as given; empty: one Redis at REDIS_URL */
    sentinel_addr sentinels[CONFIG_MAX_SENTINELS];
    int n_sentinels;            /* 0: no Sentinel */
    char master_name[128];      /* REDIS_MASTER_NAME: the master the Sentinels watch */
    char cluster_nodes_text[1024]; /* REDIS_CLUSTER_NODES: seed nodes; empty: no cluster */
    int lock_sync_replicas;     /* a grant counts once this many replicas acknowledged it */
    int lock_sync_timeout_ms;   /* WAIT's timeout for those acknowledgements */
    int fencing;                /* 0 (demo only): order writes do not check the fencing token */
    int threads;                /* worker threads, each with its own connections */
    int io_threads;             /* libmicrohttpd event threads: never block on Redis/Postgres */
    int max_connections;
    int conn_timeout_s;         /* idle HTTP connection timeout */
    int shutdown_drain_ms;      /* SIGTERM: serve open connections this long at most */
    int stats_interval_ms;      /* /stats and /metrics: one refresh per interval at most */
    long max_body;              /* bytes; larger bodies get 413 */
    long lock_lease_ms;         /* per-user order lock lease; -1 = watchdog */
    long watchdog_timeout_ms;   /* watchdog-mode lease, renewed every third of it */
    long lock_token_ttl_ms;     /* fencing-token counter lifetime after its last token; 0: forever */
    long fence_horizon_ms;      /* older tokens refused, rows twice as old swept; 0: off */
    int redis_timeout_ms;       /* connect and command timeout */
    int pg_connect_timeout_s;
    int pg_statement_timeout_ms;
    int pg_ha;                  /* orders only on sessions whose commits wait for a standby */
    char admin_token[256];      /* empty: admin API disabled (403) */
    char admin_token_file[1024]; /* ADMIN_TOKEN_FILE: admin_token read from it at start */
    int log_level;              /* enum log_level */
    int log_format;             /* enum log_format */
    char lua_dir[1024];
    char id_prefix[64];         /* icr:{prefix}:{yyyy:MM:dd} */
    int demo_random_user;
    int retry_after_s;
    int request_deadline_ms;    /* work not started by then: 503, not done (0: none) */
    int lock_strategy;          /* enum lock_strategy (SECKILL_LOCK) */
    char zk_hosts[1024];        /* SECKILL_LOCK=zk: "host:port[,host:port...]" */
    int zk_session_timeout_ms;  /* asked of ZooKeeper; a dead holder's lock goes after it */
    char lock_redis_nodes[2048]; /* multilock, redlock: redis://h:p,redis://h:p,... */
    int lock_redis_node_timeout_ms; /* each node's connect and command timeout */
    int lock_pg_sweep_ms;       /* pg-table: delete expired rows this often (0: never) */
    int stock_strategy;         /* enum stock_strategy (SECKILL_STOCK) */
    int demo_delay_ms;          /* sleep between the reads and the writes (demo only) */
    int demo_pause_ms;          /* sleep after taking the lock, before the transaction */
    int batch_max;              /* batched: buyers settled in one transaction at most */
    int early_lock_release;     /* optimistic: async commit, then wait for the flush */
    int batch_window_us;        /* batched: how long a batch gathers buyers */
    int batch_pipeline;         /* batched: overlap a batch's commit with the next */
    int batch_early_lock_release; /* batched: async commit, then wait for the flush */
    int redis_order_durability; /* redis: enum order_durability */
    int redis_order_wait_replicas;
    int redis_order_wait_ms;
    int consumers;              /* redis: 1 runs a stream consumer here */
    int redis_admit_pipelines;  /* redis: workers sending admissions in lots at once (0: none) */
    int consumer_batch_max;     /* redis: stream entries persisted in one transaction */
    int consumer_linger_ms;     /* redis: least time between two reads of new entries */
    int consumer_claim_idle_ms; /* redis: XAUTOCLAIM's min-idle-time */
    int consumer_retry_max_ms;  /* redis: longest pause between two tries of a refused batch */
    int stream_backlog_max;     /* redis: unsettled orders past which admission stops (0: none) */
    int consumer_remove_idle_ms; /* redis: a consumer name idle this long, nothing pending, goes */
    int dead_letters_max;       /* redis: the dead-letter stream's cap (XADD MAXLEN ~) */
    int test_clock_step_ms;     /* testing only: util_set_test_clock_step_ms */
    char instance_uuid[37];     /* random per process; lock owner prefix */
} config;

/* The one process-wide configuration. Written only by config_load. */
extern config g_cfg;

/* Fills g_cfg from the environment and argv. Returns 0, or -1 after
 * logging a clear message (log_error: stderr, before LOG_FORMAT applies);
 * returns 1 when --help was printed. Reads ADMIN_TOKEN_FILE when set
 * (ADMIN_TOKEN must then be empty). An unset INSTANCE_ID becomes
 * "<hostname>-<port>": in a container the hostname is the container's
 * (distinct for each replica), and on one host the port keeps instances
 * apart. */
int config_load(int argc, char **argv);

/* Every setting, in the order of --help and of the start-up log. */
struct config_setting;
const struct config_setting *config_settings(size_t *n);

/* "reentrant", "optimistic", "aof", ...; "unknown" out of range. */
const char *config_lock_name(int s);
const char *config_stock_name(int s);
const char *config_durability_name(int d);

/* 1 when the strategies in force can oversell or sell twice to one user
 * (a demo strategy, a demo delay or pause, or FENCING=0). */
int config_unsafe(void);

#endif
