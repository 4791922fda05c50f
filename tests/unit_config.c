/* unit_config: configuration from the environment and flags (config.h and
 * its parts: config_parse.h, config_show.h, redis_url.h):
 * defaults, parsing and refusals with their messages, flags over the
 * environment, REDIS_URL parsing, ADMIN_TOKEN_FILE, the defaults of
 * INSTANCE_ID and LUA_DIR, and the masked description logged at start.
 * No service. */
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "config_parse.h"
#include "config_show.h"
#include "redis_url.h"
#include "t.h"

static char tmpdir[256];

/* config_load with argv 'seckill' + args, on an environment of exactly the
 * NAME=value strings of 'env' (NULL-terminated). stderr is captured into
 * 'err' (may be NULL), stdout dropped. */
static int load(const char *const *env, const char *const *args, char *err, size_t errlen)
{
    char *argv[16] = { (char *)"seckill" };
    int argc = 1, rc, saved_out, saved_err, fd;
    char path[512];

    clearenv();
    for (; env != NULL && *env != NULL; env++) {
        char kv[1024];
        snprintf(kv, sizeof kv, "%s", *env);
        char *eq = strchr(kv, '=');
        if (eq == NULL)
            continue;
        *eq = '\0';
        setenv(kv, eq + 1, 1);
    }
    for (; args != NULL && *args != NULL && argc < 15; args++)
        argv[argc++] = (char *)*args;
    argv[argc] = NULL;

    snprintf(path, sizeof path, "%s/stderr", tmpdir);
    fflush(stdout);
    fflush(stderr);
    saved_out = dup(1);
    saved_err = dup(2);
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    close(devnull);
    rc = config_load(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, 1);
    dup2(saved_err, 2);
    close(saved_out);
    close(saved_err);
    if (err != NULL && errlen > 0) {
        ssize_t n = pread(fd, err, errlen - 1, 0);
        err[n > 0 ? n : 0] = '\0';
    }
    close(fd);
    return rc;
}

static void write_file(const char *name, const char *content, char *path, size_t n)
{
    snprintf(path, n, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    if (!T_ASSERT(f != NULL))
        return;
    fputs(content, f);
    fclose(f);
}

/* Expects config_load to refuse and to name 'word' in its message. */
static void refuses(const char *const *env, const char *const *args, const char *word)
{
    char err[1024];
    int rc = load(env, args, err, sizeof err);
    if (!T_EQ_I64(rc, -1) || !T_ASSERT(strstr(err, word) != NULL))
        printf("    env %s, message \"%s\", expected \"%s\" in it\n",
               env && env[0] ? env[0] : "(none)", err, word);
}

static void test_defaults(void)
{
    char host[256] = "", want[128];
    if (!T_EQ_I64(load(NULL, NULL, NULL, 0), 0))
        return;
    T_EQ_I64(g_cfg.port, 8080);
    T_EQ_STR(g_cfg.bind, "127.0.0.1");
    T_EQ_STR(g_cfg.redis.host, "127.0.0.1");
    T_EQ_I64(g_cfg.redis.port, 6379);
    T_EQ_I64(g_cfg.redis.db, 0);
    T_EQ_STR(g_cfg.pg_dsn, "");
    T_EQ_I64(g_cfg.threads, 8);
    T_EQ_I64(g_cfg.io_threads, 2);
    T_EQ_I64(g_cfg.lock_lease_ms, 10000);
    T_EQ_I64(g_cfg.lock_token_ttl_ms, 60000);
    T_EQ_I64(g_cfg.fence_horizon_ms, 600000);
    T_EQ_I64(g_cfg.lock_strategy, LOCKS_REENTRANT);
    T_EQ_I64(g_cfg.stock_strategy, STOCKS_OPTIMISTIC);
    T_EQ_I64(g_cfg.log_format, LOGS_TEXT);
    T_EQ_I64(g_cfg.redis_order_durability, DURABILITY_AOF);
    T_EQ_STR(g_cfg.admin_token, "");
    T_EQ_STR(g_cfg.id_prefix, "order");
    T_ASSERT(!config_unsafe());
    T_EQ_I64(strlen(g_cfg.instance_uuid), 36);
    /* No INSTANCE_ID: the hostname and the port. */
    gethostname(host, sizeof host - 1);
    snprintf(want, sizeof want, "%.56s-8080", host);
    T_EQ_STR(g_cfg.instance_id, want);
}

static void test_environment_and_flags(void)
{
    static const char *const env[] = { "PORT=9001", "THREADS=3", "SECKILL_LOCK=setnx",
                                       "SECKILL_STOCK=batched", "LOG_LEVEL=debug",
                                       "LOG_FORMAT=json", "LOCK_LEASE_MS=-1",
                                       "REDIS_URL=redis://:pw@redis.example:6380/2",
                                       "INSTANCE_ID=shop-a.1", "REDIS_ORDER_DURABILITY=wait",
                                       NULL };
    if (!T_EQ_I64(load(env, NULL, NULL, 0), 0))
        return;
    T_EQ_I64(g_cfg.port, 9001);
    T_EQ_I64(g_cfg.threads, 3);
    T_EQ_I64(g_cfg.lock_strategy, LOCKS_SETNX);
    T_EQ_I64(g_cfg.stock_strategy, STOCKS_BATCHED);
    T_EQ_I64(g_cfg.log_format, LOGS_JSON);
    T_EQ_I64(g_cfg.redis_order_durability, DURABILITY_WAIT);
    T_EQ_STR(config_durability_name(g_cfg.redis_order_durability), "wait");
    T_EQ_I64(g_cfg.lock_lease_ms, -1);
    T_EQ_STR(g_cfg.redis.host, "redis.example");
    T_EQ_I64(g_cfg.redis.port, 6380);
    T_EQ_STR(g_cfg.redis.password, "pw");
    T_EQ_I64(g_cfg.redis.db, 2);
    T_EQ_STR(g_cfg.instance_id, "shop-a.1");
    T_ASSERT(config_unsafe());

    /* A flag overrides its variable, as --flag=value or --flag value. */
    static const char *const args[] = { "--port=9002", "--threads", "5", NULL };
    if (!T_EQ_I64(load(env, args, NULL, 0), 0))
        return;
    T_EQ_I64(g_cfg.port, 9002);
    T_EQ_I64(g_cfg.threads, 5);
    /* Without INSTANCE_ID the default follows the port in force. */
    static const char *const env2[] = { "PORT=9003", NULL };
    load(env2, NULL, NULL, 0);
    T_ASSERT(strlen(g_cfg.instance_id) > 5 &&
             strcmp(g_cfg.instance_id + strlen(g_cfg.instance_id) - 5, "-9003") == 0);
}

static void test_help_returns_one(void)
{
    static const char *const args[] = { "--help", NULL };
    T_EQ_I64(load(NULL, args, NULL, 0), 1);
}

static void test_refusals_name_the_setting(void)
{
#define ENV1(s) ((const char *const[]){ s, NULL })
#define ARGS(...) ((const char *const[]){ __VA_ARGS__, NULL })
    refuses(ENV1("PORT=0"), NULL, "PORT");
    refuses(ENV1("PORT=70000"), NULL, "PORT");
    refuses(ENV1("PORT=80x"), NULL, "PORT");
    refuses(ENV1("PORT="), NULL, "PORT");
    refuses(ENV1("THREADS=0"), NULL, "THREADS");
    refuses(ENV1("LOG_LEVEL=loud"), NULL, "LOG_LEVEL");
    refuses(ENV1("LOG_FORMAT=xml"), NULL, "LOG_FORMAT");
    refuses(ENV1("SECKILL_LOCK=mutex"), NULL, "SECKILL_LOCK");
    refuses(ENV1("SECKILL_STOCK=magic"), NULL, "SECKILL_STOCK");
    refuses(ENV1("LOCK_LEASE_MS=0"), NULL, "LOCK_LEASE_MS");
    refuses(ENV1("LOCK_LEASE_MS=-2"), NULL, "LOCK_LEASE_MS");
    refuses(ENV1("LOCK_TOKEN_TTL_MS=-1"), NULL, "LOCK_TOKEN_TTL_MS");
    refuses(ENV1("FENCE_HORIZON_MS=-1"), NULL, "FENCE_HORIZON_MS");
    refuses(ENV1("FENCE_HORIZON_MS=999"), NULL, "FENCE_HORIZON_MS");
    refuses(ENV1("REDIS_URL=http://127.0.0.1:6379"), NULL, "REDIS_URL");
    refuses(ENV1("INSTANCE_ID=a b"), NULL, "INSTANCE_ID");
    refuses(ENV1("ID_PREFIX=a:b"), NULL, "ID_PREFIX");
    refuses(ENV1("ID_PREFIX="), NULL, "ID_PREFIX");
    refuses(NULL, ARGS("--no-such-flag=1"), "--no-such-flag");
    refuses(NULL, ARGS("--port"), "--port");
    refuses(NULL, ARGS("stray"), "stray");
    refuses(NULL, ARGS("--threads=x"), "--threads");
    refuses(ENV1("REDIS_SENTINELS=127.0.0.1"), NULL, "REDIS_SENTINELS");
    refuses(ENV1("REDIS_SENTINELS=h:1,"), NULL, "REDIS_SENTINELS");
    refuses(ENV1("REDIS_MASTER_NAME="), NULL, "REDIS_MASTER_NAME");
    refuses(ENV1("LOCK_SYNC_REPLICAS=-1"), NULL, "LOCK_SYNC_REPLICAS");
    refuses(ENV1("FENCING=2"), NULL, "FENCING");
    refuses(((const char *const[]){ "LOCK_SYNC_REPLICAS=1", "LOCK_SYNC_TIMEOUT_MS=1000", NULL }),
            NULL, "LOCK_SYNC_TIMEOUT_MS");
    refuses(ENV1("REDIS_ORDER_DURABILITY=sometimes"), NULL, "REDIS_ORDER_DURABILITY");
    /* A WAIT longer than the command timeout breaks the connection (and
     * opens the circuit breaker) instead of answering too few. */
    refuses(((const char *const[]){ "REDIS_ORDER_DURABILITY=wait", "REDIS_ORDER_WAIT_MS=1000",
                                    NULL }),
            NULL, "REDIS_ORDER_WAIT_MS");
    refuses(ENV1("ZK_HOSTS=127.0.0.1:2181,"), NULL, "trailing comma");

    /* A text longer than its setting holds is refused, not cut. */
    char env_long[80], flag_long[80];
    snprintf(env_long, sizeof env_long, "BIND=%064d", 1);
    refuses(ENV1(env_long), NULL, "BIND is too long (at most 63 bytes)");
    snprintf(flag_long, sizeof flag_long, "--bind=%064d", 1);
    refuses(NULL, ARGS(flag_long), "--bind is too long");
}

/* REDIS_SENTINELS: host:port pairs, each checked; FENCING=0 is a demo
 * setting, announced as unsafe. */
static void test_sentinels_and_fencing(void)
{
    sentinel_addr a[CONFIG_MAX_SENTINELS];

    T_EQ_I64(config_parse_sentinels("127.0.0.1:26379", a, CONFIG_MAX_SENTINELS), 1);
    T_EQ_STR(a[0].host, "127.0.0.1");
    T_EQ_I64(a[0].port, 26379);
    T_EQ_I64(config_parse_sentinels("s1:1,s-2.example:65535,10.0.0.3:26379", a, 3), 3);
    T_EQ_STR(a[1].host, "s-2.example");
    T_EQ_I64(a[1].port, 65535);
    T_EQ_I64(a[2].port, 26379);
    T_EQ_I64(config_parse_sentinels("s1:1,s2:2", a, 1), -1);          /* too many */
    static const char *const bad[] = { "", "h", "h:", ":1", "h:0", "h:65536", "h:+1", "h:-1",
                                       "h: 1", "h:1x", "h:1,", ",h:1", "h:1,,h:2", "a b:1",
                                       "h:1:2", "[::1]:1" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (!T_ASSERT(config_parse_sentinels(bad[i], a, CONFIG_MAX_SENTINELS) == -1))
            printf("  accepted '%s'\n", bad[i]);

    T_EQ_I64(load(ENV1("REDIS_SENTINELS=127.0.0.1:1,127.0.0.1:2"), NULL, NULL, 0), 0);
    T_EQ_I64(g_cfg.n_sentinels, 2);
    T_EQ_STR(g_cfg.master_name, "seckill");
    T_EQ_I64(g_cfg.fencing, 1);
    T_EQ_I64(g_cfg.lock_sync_replicas, 0);
    T_EQ_I64(config_unsafe(), 0);
    T_EQ_I64(load(ENV1("FENCING=0"), NULL, NULL, 0), 0);
    T_EQ_I64(g_cfg.n_sentinels, 0);
    T_EQ_I64(config_unsafe(), 1);
}

/* REDIS_CLUSTER_NODES: one way to find Redis, and only the lock
 * strategies whose keys are routed per slot. */
static void test_cluster_nodes(void)
{
#define CL "REDIS_CLUSTER_NODES=127.0.0.1:7000,127.0.0.1:7001"
    T_EQ_I64(load(ENV1(CL), NULL, NULL, 0), 0);
    T_EQ_STR(g_cfg.cluster_nodes_text, "127.0.0.1:7000,127.0.0.1:7001");
    /* An empty REDIS_URL, or its default, says "no other Redis". */
    T_EQ_I64(load(((const char *const[]){ CL, "REDIS_URL=", NULL }), NULL, NULL, 0), 0);
    T_EQ_I64(load(((const char *const[]){ CL, "REDIS_URL=" CONFIG_REDIS_URL_DEFAULT, NULL }),
                  NULL, NULL, 0), 0);
    T_EQ_I64(load(((const char *const[]){ CL, "SECKILL_LOCK=zk", "ZK_HOSTS=127.0.0.1:2181",
                                          "SECKILL_STOCK=pessimistic", NULL }), NULL, NULL, 0), 0);
    refuses(ENV1("REDIS_CLUSTER_NODES=127.0.0.1"), NULL, "REDIS_CLUSTER_NODES");
    refuses(ENV1("REDIS_CLUSTER_NODES=127.0.0.1:7000,"), NULL, "REDIS_CLUSTER_NODES");
    refuses(((const char *const[]){ CL, "REDIS_SENTINELS=127.0.0.1:26379", NULL }), NULL,
            "REDIS_SENTINELS");
    refuses(((const char *const[]){ CL, "REDIS_URL=redis://10.0.0.1:6379/0", NULL }), NULL,
            "REDIS_URL");
    T_EQ_I64(load(((const char *const[]){ CL, "SECKILL_STOCK=batched", NULL }), NULL, NULL, 0), 0);
    /* Every stock strategy, Redis-first too (a stream per voucher). */
    T_EQ_I64(load(((const char *const[]){ CL, "SECKILL_STOCK=redis", NULL }), NULL, NULL, 0), 0);
    refuses(((const char *const[]){ CL, "SECKILL_LOCK=setnx", NULL }), NULL, "SECKILL_LOCK");
    refuses(((const char *const[]){ CL, "SECKILL_LOCK=redlock",
                                    "LOCK_REDIS_NODES=redis://a:1,redis://b:1,redis://c:1",
                                    NULL }), NULL, "SECKILL_LOCK");
    T_EQ_I64(load(((const char *const[]){ CL, "LOCK_LEASE_MS=-1", NULL }), NULL, NULL, 0), 0);
#undef CL
}

static void test_redis_url(void)
{
    redis_url u;
    T_EQ_I64(redis_url_parse("redis://127.0.0.1", &u), 0);
    T_EQ_STR(u.host, "127.0.0.1");
    T_EQ_I64(u.port, 6379);
    T_EQ_I64(u.db, 0);
    T_EQ_STR(u.password, "");
    T_EQ_I64(redis_url_parse("redis://h:7000/3", &u), 0);
    T_EQ_STR(u.host, "h");
    T_EQ_I64(u.port, 7000);
    T_EQ_I64(u.db, 3);
    T_EQ_I64(redis_url_parse("redis://:s3cret@h:1/", &u), 0);
    T_EQ_STR(u.username, "");
    T_EQ_STR(u.password, "s3cret");
    T_EQ_I64(u.db, 0);
    T_EQ_I64(redis_url_parse("redis://alice:s3cret@h", &u), 0);
    T_EQ_STR(u.username, "alice");
    T_EQ_STR(u.password, "s3cret");
    T_EQ_I64(redis_url_parse("redis://s3cret@h", &u), 0);  /* a lone secret: password */
    T_EQ_STR(u.username, "");
    T_EQ_STR(u.password, "s3cret");
    /* a password holding '@', '/' or ':' as it is (the last '@' ends it), or
     * percent-encoded as URLs spell them (%25 for a '%') */
    T_EQ_I64(redis_url_parse("redis://:p@ss@127.0.0.1:7000/3", &u), 0);
    T_EQ_STR(u.password, "p@ss");
    T_EQ_STR(u.host, "127.0.0.1");
    T_EQ_I64(u.port, 7000);
    T_EQ_I64(u.db, 3);
    T_EQ_I64(redis_url_parse("redis://bob:pa/ss:w@h/2", &u), 0);
    T_EQ_STR(u.username, "bob");
    T_EQ_STR(u.password, "pa/ss:w");
    T_EQ_STR(u.host, "h");
    T_EQ_I64(u.db, 2);
    T_EQ_I64(redis_url_parse("redis://b%6Fb:s3cr%3At%40x%2f%25@h", &u), 0);
    T_EQ_STR(u.username, "bob");
    T_EQ_STR(u.password, "s3cr:t@x/%");
    T_EQ_I64(redis_url_parse("redis://:100%@h", &u), 0);   /* no hex after '%': as it is */
    T_EQ_STR(u.password, "100%");

    static const char *const bad[] = { "", "h:6379", "rediss://h", "redis://", "redis://:1",
                                       "redis://h:0", "redis://h:65536", "redis://h:x",
                                       "redis://h:", "redis://h/x", "redis://h/-1",
                                       "redis://h:6379/1/2", "redis://:pw@", "redis://:pw@/1",
                                       "redis://:a%00b@h" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (!T_EQ_I64(redis_url_parse(bad[i], &u), -1))
            printf("    accepted \"%s\"\n", bad[i]);

    /* A user name longer than its buffer (127 bytes) is refused, not cut. */
    char url[400];
    memset(url, 'u', sizeof url);
    memcpy(url, "redis://", 8);
    snprintf(url + 8 + 128, sizeof url - 8 - 128, ":pw@h:1");
    T_EQ_I64(redis_url_parse(url, &u), -1);
    snprintf(url + 8 + 127, sizeof url - 8 - 127, ":pw@h:1");
    if (T_EQ_I64(redis_url_parse(url, &u), 0))
        T_EQ_I64(strlen(u.username), 127);
}

static void test_admin_token_file(void)
{
    char path[512], env_file[600], err[1024];
    const char *env[3] = { env_file, NULL, NULL };

    write_file("token", "tok-123\n", path, sizeof path);
    snprintf(env_file, sizeof env_file, "ADMIN_TOKEN_FILE=%s", path);
    if (T_EQ_I64(load(env, NULL, err, sizeof err), 0))
        T_EQ_STR(g_cfg.admin_token, "tok-123");

    write_file("token-crlf", "tok-456\r\n", path, sizeof path);
    snprintf(env_file, sizeof env_file, "ADMIN_TOKEN_FILE=%s", path);
    if (T_EQ_I64(load(env, NULL, err, sizeof err), 0))
        T_EQ_STR(g_cfg.admin_token, "tok-456");

    write_file("token-bare", "tok-789", path, sizeof path);
    static const char *const args[3] = { "--admin-token-file", NULL, NULL };
    const char *a[3] = { args[0], path, NULL };
    if (T_EQ_I64(load(NULL, a, err, sizeof err), 0))
        T_EQ_STR(g_cfg.admin_token, "tok-789");

    /* An empty ADMIN_TOKEN (compose's default) is "not set". */
    snprintf(env_file, sizeof env_file, "ADMIN_TOKEN_FILE=%s", path);
    env[1] = "ADMIN_TOKEN=";
    if (T_EQ_I64(load(env, NULL, err, sizeof err), 0))
        T_EQ_STR(g_cfg.admin_token, "tok-789");

    env[1] = "ADMIN_TOKEN=other";
    refuses(env, NULL, "both set");
    env[1] = NULL;

    snprintf(env_file, sizeof env_file, "ADMIN_TOKEN_FILE=%s/missing", tmpdir);
    refuses(env, NULL, "cannot read ADMIN_TOKEN_FILE");
    snprintf(env_file, sizeof env_file, "ADMIN_TOKEN_FILE=%s", tmpdir);   /* a directory */
    refuses(env, NULL, "cannot read ADMIN_TOKEN_FILE");
    write_file("token-empty", "\n", path, sizeof path);
    snprintf(env_file, sizeof env_file, "ADMIN_TOKEN_FILE=%s", path);
    refuses(env, NULL, "empty");

    /* A NUL byte in the file: refused (the token would end there). */
    snprintf(path, sizeof path, "%s/token-nul", tmpdir);
    FILE *f = fopen(path, "w");
    if (T_ASSERT(f != NULL)) {
        fwrite("tok\0en\n", 1, 7, f);
        fclose(f);
    }
    snprintf(env_file, sizeof env_file, "ADMIN_TOKEN_FILE=%s", path);
    refuses(env, NULL, "holds a NUL byte");

    char big[400];
    memset(big, 'k', 300);
    big[300] = '\0';
    write_file("token-long", big, path, sizeof path);
    snprintf(env_file, sizeof env_file, "ADMIN_TOKEN_FILE=%s", path);
    refuses(env, NULL, "too long");
    memset(big, 'k', 255);
    big[255] = '\n';
    big[256] = '\0';
    write_file("token-255", big, path, sizeof path);
    snprintf(env_file, sizeof env_file, "ADMIN_TOKEN_FILE=%s", path);
    if (T_EQ_I64(load(env, NULL, err, sizeof err), 0))
        T_EQ_I64(strlen(g_cfg.admin_token), 255);
}

static void mask_redis(const char *in, const char *want)
{
    char out[256];
    redis_url_mask(in, out, sizeof out);
    T_EQ_STR(out, want);
}

static void mask_dsn(const char *in, const char *want)
{
    char out[512];
    config_show_mask_dsn(in, out, sizeof out);
    T_EQ_STR(out, want);
}

static void test_masks(void)
{
    mask_redis("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0");
    mask_redis("redis://:pw@h:6379/0", "redis://:***@h:6379/0");
    mask_redis("redis://alice:pw@h", "redis://alice:***@h");
    mask_redis("redis://pw@h", "redis://***@h");
    mask_redis("redis://:p@w:x@h/1", "redis://:***@h/1");
    /* LOCK_REDIS_NODES: each entry of the list */
    char out[256];
    config_show_mask_redis_urls("redis://:a@h:1,redis://h:2,redis://u:b@h:3/1", out, sizeof out);
    T_EQ_STR(out, "redis://:***@h:1,redis://h:2,redis://u:***@h:3/1");
    config_show_mask_redis_urls("", out, sizeof out);
    T_EQ_STR(out, "");
    /* An entry longer than any the parser takes is masked whole. */
    char list[1400];
    int n = snprintf(list, sizeof list, "redis://:a@h:1,redis://:");
    memset(list + n, 'p', 1250);
    snprintf(list + n + 1250, sizeof list - (size_t)n - 1250, "@h:2");
    config_show_mask_redis_urls(list, out, sizeof out);
    T_EQ_STR(out, "redis://:***@h:1,***");

    mask_dsn("", "");
    mask_dsn("host=127.0.0.1 port=5432 dbname=seckill", "host=127.0.0.1 port=5432 dbname=seckill");
    mask_dsn("host=h password=s3cret user=u", "host=h password=*** user=u");
    mask_dsn("host=h password = 's3 cr\\'et' user=u", "host=h password = *** user=u");
    mask_dsn("password=a\\ b dbname=x", "password=*** dbname=x");
    mask_dsn("  password=x", "  password=***");
    mask_dsn("password=x  ", "password=***  ");
    mask_dsn("host=h passwordx=1", "host=h passwordx=1");
    /* What libpq would refuse is cut, never echoed. */
    mask_dsn("host=h password 's3cret'", "host=h...");
    mask_dsn("host=h password='s3cret", "host=h...");
    mask_dsn("postgresql://u:s3cret@h:5432/db?sslmode=disable",
             "postgresql://u:***@h:5432/db?sslmode=disable");
    mask_dsn("postgres://u@h/db", "postgres://u@h/db");
    mask_dsn("postgresql://h/db?user=u&password=s3cret&sslmode=require",
             "postgresql://h/db?user=u&password=***&sslmode=require");
    mask_dsn("postgresql:///db", "postgresql:///db");
}

static void test_describe_masks_secrets(void)
{
    static const char *const env[] = {
        "ADMIN_TOKEN=tok-SECRET-1", "REDIS_URL=redis://:redis-SECRET-2@127.0.0.1:6390/1",
        "PG_DSN=host=127.0.0.1 port=5433 dbname=seckill password=pg-SECRET-3", "THREADS=4",
        NULL };
    char d[2048];
    if (!T_EQ_I64(load(env, NULL, NULL, 0), 0))
        return;
    config_show_describe(d, sizeof d);
    T_ASSERT(strstr(d, "SECRET") == NULL);
    T_ASSERT(strstr(d, "ADMIN_TOKEN=***") != NULL);
    T_ASSERT(strstr(d, "REDIS_URL=redis://:***@127.0.0.1:6390/1") != NULL);
    T_ASSERT(strstr(d, "PG_DSN=\"host=127.0.0.1 port=5433 dbname=seckill password=***\"") != NULL);
    T_ASSERT(strstr(d, " THREADS=4 ") != NULL);
    T_ASSERT(strstr(d, " SECKILL_LOCK=reentrant ") != NULL);
    T_ASSERT(strstr(d, " LOG_LEVEL=info ") != NULL);
    T_ASSERT(strncmp(d, "PORT=8080 ", 10) == 0);
    if (t_st.case_failed)
        printf("    %s\n", d);

    /* No token: shown as empty, not as ***. A short buffer is cut, not overrun. */
    load(NULL, NULL, NULL, 0);
    config_show_describe(d, sizeof d);
    T_ASSERT(strstr(d, "ADMIN_TOKEN=\"\"") != NULL);
    memset(d, 'x', sizeof d);
    config_show_describe(d, 16);
    T_EQ_I64(strlen(d), 15);
    T_EQ_I64(d[16], 'x');
    d[0] = 'x';
    config_show_describe(d, 0);                      /* no room at all: nothing written */
    T_EQ_I64(d[0], 'x');

    /* A value holding a space, a quote or a backslash is quoted, those two escaped. */
    if (!T_EQ_I64(load(ENV1("LUA_DIR=/opt/a \"b\\c"), NULL, NULL, 0), 0))
        return;
    config_show_describe(d, sizeof d);
    if (!T_ASSERT(strstr(d, " LUA_DIR=\"/opt/a \\\"b\\\\c\" ") != NULL))
        printf("    %s\n", d);
}

/* Without LUA_DIR, run from the checkout: ./lua. Run from elsewhere: the
 * lua/ directory found from the binary's own path (the test binaries live
 * in build/tests/ or build/<variant>/tests/ of the checkout). */
static void test_lua_dir_default(void)
{
    char cwd[PATH_MAX], lua[PATH_MAX + 8], want[PATH_MAX], got[PATH_MAX];
    int rc;

    if (!T_ASSERT(getcwd(cwd, sizeof cwd) != NULL))
        return;
    snprintf(lua, sizeof lua, "%s/lua", cwd);
    if (!T_ASSERT(realpath(lua, want) != NULL))     /* tests/run.sh runs us from the checkout */
        return;
    if (T_EQ_I64(load(NULL, NULL, NULL, 0), 0))
        T_EQ_STR(g_cfg.lua_dir, "lua");
    if (!T_EQ_I64(chdir(tmpdir), 0))
        return;
    rc = load(NULL, NULL, NULL, 0);
    T_EQ_I64(chdir(cwd), 0);
    if (!T_EQ_I64(rc, 0))
        return;
    T_EQ_I64(g_cfg.lua_dir[0], '/');
    if (T_ASSERT(realpath(g_cfg.lua_dir, got) != NULL))
        T_EQ_STR(got, want);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "%s/unit_config.XXXXXX",
             getenv("TEST_TMP") ? getenv("TEST_TMP") : "/tmp");
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        return 2;
    }
    T_RUN(test_defaults);
    T_RUN(test_environment_and_flags);
    T_RUN(test_help_returns_one);
    T_RUN(test_refusals_name_the_setting);
    T_RUN(test_sentinels_and_fencing);
    T_RUN(test_cluster_nodes);
    T_RUN(test_redis_url);
    T_RUN(test_admin_token_file);
    T_RUN(test_masks);
    T_RUN(test_describe_masks_secrets);
    T_RUN(test_lua_dir_default);
    {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0)
            printf("could not remove %s\n", tmpdir);
    }
    return t_done();
}
