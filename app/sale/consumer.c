/* consumer: stream entries to Postgres rows, in batches (consumer.h). */
#include "consumer.h"
#include "bgthread.h"
#include "config.h"
#include "conn.h"
#include "order_id.h"
#include "log.h"
#include "rcluster.h"
#include "counters.h"
#include "script.h"
#include "stock_redis.h"
#include "store_batch.h"
#include "store_voucher.h"
#include "stream_tidy.h"
#include "util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RETRY_PAUSE_MS 200            /* after a failure of Redis */
#define RETRY_FIRST_MS 50             /* the first pause after Postgres refused for now */
#define WATCH_EVERY_MS 1000           /* stock_redis_watch: durability and backlog */
#define TRIM_EVERY_MS 200             /* settled entries leave the stream (stream_trim.lua) */
#define POLL_IDLE_MS 20               /* a cluster's sweep that read nothing: the next after this */

/* The threads (consumer_start): the watch runs whenever this instance
 * admits, the consumer with CONSUMERS=1. */
static bgthread consumer_bg = BGTHREAD_INIT, watch_bg = BGTHREAD_INIT;
static script_file trim_script = { .name = "stream_trim" };

/* One stream entry, parsed. */
typedef struct entry {
    char id[48];                      /* its stream id, "<ms>-<seq>" */
    int64_t voucher_id, user_id, order_id, gen;
    int readable;                     /* every field present and in range */
    int done;                         /* settled in this round */
} entry;

/* A stream the consumer reads, and where it stands on it: the one stream
 * on one Redis; on a Redis Cluster, each voucher's. */
typedef struct stream_state {
    stock_redis_stream names;
    char cursor[48];                  /* XAUTOCLAIM's, between rounds */
    int own_pending;                  /* entries delivered to us and not settled */
    int64_t next_claim_us, next_trim_us;
    int64_t next_tidy_us;             /* next removal of gone consumers (stream_tidy.h) */
} stream_state;

/* The thread's state: touched by this thread only. */
typedef struct consumer {
    redisContext *c;                  /* on a cluster: the current stream's master's,
                                       * owned by 'rc' */
    rcluster *rc;                     /* a Redis Cluster's routing; else NULL */
    PGconn *pg;
    int64_t pg_checked_us;            /* pg opened or last checked (conn_pg_recheck) */
    char name[128];                   /* consumer name in the group */
    stream_state *streams, *s;        /* the streams read, and the current one */
    size_t nstreams;
    int64_t next_list_us;             /* a cluster's next read of the voucher list */
    int redirected;                   /* a reply named a redirection: read the map again */
    int retry_ms;                     /* the last pause after Postgres refused; 0: none */
    int64_t retry_at_us;              /* no batch before this (monotonic): the pause */
    unsigned seed;                    /* the pauses' jitter */
    int64_t next_check_us;
    int64_t next_read_us;             /* next read of new entries: CONSUMER_LINGER_MS
                                       * after the last, 0 after a full one */
    int read_full, read_some;         /* a cluster's sweep: some read was full, or read any */
    entry *e;                         /* CONSUMER_BATCH_MAX of them */
    store_order *orders;
    const char **argv;                /* XACK arguments */
} consumer;

/* Thread 't' sleeps until 'until_us' (monotonic); a stop ends the sleep
 * at once, however long CONSUMER_LINGER_MS is. */
static void linger_until(bgthread *t, int64_t until_us)
{
    int64_t left;

    while ((left = until_us - util_mono_us()) > 0 &&
           !bgthread_sleep(t, (long)((left + 999) / 1000)))
        ;
}

static void redis_drop(consumer *k)
{
    if (k->rc != NULL)
        rcluster_reset(k->rc);        /* the contexts are the handle's */
    else if (k->c != NULL)
        redisFree(k->c);
    k->c = NULL;
    for (size_t i = 0; i < k->nstreams; i++)
        k->streams[i].own_pending = 1; /* whatever we held is ours again on return */
}

/* A reply on a cluster that names a redirection (the slot moved, or is
 * moving): the map is read again before the next sweep. 1 when it did. */
static int redirected(consumer *k, const redisReply *r)
{
    rcluster_redirect rd;

    if (k->rc == NULL || rcluster_redirect_parse(r, &rd) == RCLUSTER_NONE)
        return 0;
    k->redirected = 1;
    return 1;
}

static void pg_drop(consumer *k)
{
    if (k->pg != NULL)
        PQfinish(k->pg);
    k->pg = NULL;
}

/* The group, created with the stream when missing (a new Redis, or one
 * that restarted empty). A voucher's own stream (a cluster) gets its group
 * only once its first order made it: every voucher in Postgres is read,
 * most of which never sell through Redis, and a group made at 0 later
 * still reads the stream from its first entry. 0, or -1. */
static int ensure_group(redisContext *c, const stock_redis_stream *s)
{
    redisReply *r = redisCommand(c, s->voucher_id != 0 ? "XGROUP CREATE %s %s 0"
                                                        : "XGROUP CREATE %s %s 0 MKSTREAM",
                                 s->orders, STOCK_REDIS_GROUP);
    int rc = -1;

    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_STATUS || (r->type == REDIS_REPLY_ERROR &&
                                          (strncmp(r->str, "BUSYGROUP", 9) == 0 ||
                                           (s->voucher_id != 0 &&
                                            strstr(r->str, "requires the key to exist")))))
        rc = 0;
    else
        log_warn("consumer: XGROUP CREATE: %s", r->type == REDIS_REPLY_ERROR ? r->str : "?");
    freeReplyObject(r);
    return rc;
}

static int64_t field_i64(const redisReply *f, const char *name, int *found)
{
    for (size_t i = 0; i + 1 < f->elements; i += 2) {
        const redisReply *k = f->element[i], *v = f->element[i + 1];
        if (k->type == REDIS_REPLY_STRING && v->type == REDIS_REPLY_STRING &&
            strcmp(k->str, name) == 0) {
            char *end;
            long long x = strtoll(v->str, &end, 10);
            if (*end == '\0' && end != v->str) {
                (*found)++;
                return x;
            }
        }
    }
    return 0;
}

/* Fills 'out' from one entry of a reply ([id, [field, value, ...]]).
 * 0, or -1 when the reply has no id at all (nothing to settle). */
static int parse_entry(const redisReply *e, entry *out)
{
    const redisReply *f;
    int found = 0;
    int64_t t, count;

    memset(out, 0, sizeof *out);
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
        e->element[0]->type != REDIS_REPLY_STRING || e->element[0]->len >= sizeof out->id)
        return -1;
    memcpy(out->id, e->element[0]->str, e->element[0]->len + 1);
    f = e->element[1];
    if (f->type != REDIS_REPLY_ARRAY)
        return 0;                     /* deleted meanwhile: unreadable, settled as poison */
    out->voucher_id = field_i64(f, "v", &found);
    out->user_id = field_i64(f, "u", &found);
    t = field_i64(f, "t", &found);
    count = field_i64(f, "c", &found);
    out->gen = field_i64(f, "g", &found);
    out->order_id = order_id_compose(t, count);
    out->readable = found == 5 && out->voucher_id > 0 && out->user_id > 0 && out->order_id > 0;
    return 0;
}

/* Parses an array of entries into k->e from index 'n'. The new count. */
static int take_entries(consumer *k, const redisReply *list, int n)
{
    if (list == NULL || list->type != REDIS_REPLY_ARRAY)
        return n;
    for (size_t i = 0; i < list->elements && n < g_cfg.consumer_batch_max; i++)
        if (parse_entry(list->element[i], &k->e[n]) == 0)
            n++;
    return n;
}

/* XREADGROUP from 'from' (">": new entries, waiting up to 'block_ms';
 * "0": our own pending ones, at once). The number of entries read, or -1. */
static int read_stream(consumer *k, const char *from, int block_ms)
{
    char count[16], block[16];
    const char *argv[11];
    int argc = 0, n = 0;
    redisReply *r;

    snprintf(count, sizeof count, "%d", g_cfg.consumer_batch_max);
    snprintf(block, sizeof block, "%d", block_ms);
    argv[argc++] = "XREADGROUP";
    argv[argc++] = "GROUP";
    argv[argc++] = STOCK_REDIS_GROUP;
    argv[argc++] = k->name;
    argv[argc++] = "COUNT";
    argv[argc++] = count;
    if (block_ms > 0) {
        argv[argc++] = "BLOCK";
        argv[argc++] = block;
    }
    argv[argc++] = "STREAMS";
    argv[argc++] = k->s->names.orders;
    argv[argc++] = from;
    r = redisCommandArgv(k->c, argc, argv, NULL);
    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_ERROR) {
        if (strncmp(r->str, "NOGROUP", 7) == 0)
            ensure_group(k->c, &k->s->names);   /* quietly: a cluster's new voucher */
        else if (!redirected(k, r))
            log_warn("consumer: XREADGROUP %s: %s", k->s->names.orders, r->str);
        n = -1;
    } else if (r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
               r->element[0]->type == REDIS_REPLY_ARRAY && r->element[0]->elements == 2) {
        n = take_entries(k, r->element[0]->element[1], 0);
    }
    freeReplyObject(r);
    return n;
}

/* XAUTOCLAIM: entries another consumer left idle longer than the claim
 * bound become ours. The number claimed, or -1. */
static int claim(consumer *k)
{
    char idle[16], count[16];
    redisReply *r;
    int n = 0;

    snprintf(idle, sizeof idle, "%d", g_cfg.consumer_claim_idle_ms);
    snprintf(count, sizeof count, "%d", g_cfg.consumer_batch_max);
    r = redisCommand(k->c, "XAUTOCLAIM %s %s %s %s %s COUNT %s", k->s->names.orders,
                     STOCK_REDIS_GROUP, k->name, idle, k->s->cursor, count);
    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_ERROR) {
        if (strncmp(r->str, "NOGROUP", 7) == 0)
            ensure_group(k->c, &k->s->names);
        else if (!redirected(k, r))
            log_warn("consumer: XAUTOCLAIM %s: %s", k->s->names.orders, r->str);
        n = -1;
    } else if (r->type == REDIS_REPLY_ARRAY && r->elements >= 2 &&
               r->element[0]->type == REDIS_REPLY_STRING &&
               r->element[0]->len < sizeof k->s->cursor) {
        memcpy(k->s->cursor, r->element[0]->str, r->element[0]->len + 1);
        n = take_entries(k, r->element[1], 0);
        for (int i = 0; i < n; i++)
            counters_note(COUNTERS_STREAM_CLAIMED);
        if (n > 0)
            log_warn("consumer: claimed %d orders left idle over %d ms by another consumer",
                     n, g_cfg.consumer_claim_idle_ms);
    }
    freeReplyObject(r);
    return n;
}

/* Reads every reply of a MULTI ... EXEC of 'cmds' commands sent before;
 * 0 when EXEC ran them all. */
static int exec_replies(redisContext *c, int cmds)
{
    int rc = 0;

    for (int i = 0; i < cmds; i++) {
        void *reply = NULL;
        redisReply *r;
        if (redisGetReply(c, &reply) != REDIS_OK)
            return -1;
        r = reply;
        if (r->type == REDIS_REPLY_ERROR || (i == cmds - 1 && r->type != REDIS_REPLY_ARRAY)) {
            log_warn("consumer: MULTI: %s", r->type == REDIS_REPLY_ERROR ? r->str : "aborted");
            rc = -1;
        }
        freeReplyObject(r);
    }
    return rc;
}

/* The 'n' entries k->e[idx[...]] are settled: XACK and, for persisted
 * ones, the voucher's landed counter, in one MULTI (atomic for
 * stock_load.lua's rebuild, which reads both). trim() removes them from
 * the stream later. When 'dead_reason' is set (n is 1 then) the entry is
 * copied to the dead-letter stream first. 0, or -1 when Redis failed (the
 * entries stay pending: persisting them again changes nothing). */
static int settle(consumer *k, const int *idx, int n, int64_t voucher_id, int landed,
                  const char *dead_reason)
{
    char key[96];
    int cmds = 0;

    k->argv[0] = "XACK";
    k->argv[1] = k->s->names.orders;
    k->argv[2] = STOCK_REDIS_GROUP;
    for (int i = 0; i < n; i++)
        k->argv[3 + i] = k->e[idx[i]].id;
    if (redisAppendCommand(k->c, "MULTI") != REDIS_OK)
        return -1;
    cmds++;
    if (dead_reason != NULL) {
        const entry *e = &k->e[idx[0]];
        stream_tidy_dead d = { .dead = k->s->names.dead, .entry = e->id,
                               .voucher_id = e->voucher_id,
                               .user_id = e->user_id, .order_id = e->order_id, .gen = e->gen,
                               .with_id = e->readable, .reason = dead_reason,
                               .consumer = k->name };
        if (stream_tidy_dead_append(k->c, &d) != 0)
            return -1;
        cmds++;
    }
    if (redisAppendCommandArgv(k->c, 3 + n, k->argv, NULL) != REDIS_OK)
        return -1;
    cmds++;
    if (landed > 0) {
        stock_redis_key(key, sizeof key, voucher_id, ":landed");
        if (redisAppendCommand(k->c, "INCRBY %s %d", key, landed) != REDIS_OK)
            return -1;
        cmds++;
    }
    if (redisAppendCommand(k->c, "EXEC") != REDIS_OK)
        return -1;
    cmds++;
    if (exec_replies(k->c, cmds) != 0)
        return -1;
    for (int i = 0; i < n; i++)
        k->e[idx[i]].done = 1;
    return 0;
}

static int dead_letter(consumer *k, int i, const char *reason)
{
    if (settle(k, &i, 1, k->e[i].voucher_id, 0, reason) != 0)
        return -1;
    counters_note(COUNTERS_STREAM_DEAD_LETTER);
    log_error("consumer: order %" PRId64 " (entry %s, voucher %" PRId64 ", user %" PRId64
              ") moved to %s: %s", k->e[i].order_id, k->e[i].id, k->e[i].voucher_id,
              k->e[i].user_id, k->s->names.dead, reason);
    return 0;
}

static PGconn *pg_get(consumer *k)
{
    char err[256];

    if (k->pg != NULL && (PQstatus(k->pg) != CONNECTION_OK ||
                          conn_pg_recheck(k->pg, &k->pg_checked_us) != 0))
        pg_drop(k);
    if (k->pg == NULL) {
        if ((k->pg = conn_pg_open(err, sizeof err)) == NULL)
            log_warn("consumer: Postgres: %s", err);
        k->pg_checked_us = util_mono_us();
    }
    return k->pg;
}

/* Records the lag of the 'n' entries just committed. */
static void landed(consumer *k, const int *idx, int n)
{
    int64_t now = util_wall_ms();

    counters_landed_batch(n);
    for (int i = 0; i < n; i++)
        counters_landed((now - stock_redis_id_ms(k->e[idx[i]].id)) * 1000);
}

/* Why Postgres refused an order for good: a refusal that will recur
 * whenever it is tried (the data says no). NULL for every other outcome:
 * a refusal for now (read-only, a lock or statement timeout, a
 * serialization failure, a lost connection, a shutdown), after which the
 * order stays pending and is tried again. */
static const char *poison_reason(store_status st)
{
    switch (st) {
    case STORE_SOLD_OUT:
        return "no stock left in Postgres";
    case STORE_NOT_FOUND:
        return "no such voucher";
    case STORE_DUPLICATE:
        return "the user already has another order of this voucher";
    case STORE_INVALID:
        return "refused by a constraint, or its sale is newer than Postgres's";
    case STORE_CONFLICT:
        return "its order id belongs to another order (the id counter went back)";
    default:
        return NULL;
    }
}

/* Entries of a sale that a reset ended: dropped, never written. Redis
 * still admitting in that sale (a reset whose load into Redis failed) is
 * made to rebuild the voucher from Postgres at its next buyer. */
static int drop_stale(consumer *k, int64_t voucher_id, int64_t pg_sale, const int *idx, int n)
{
    if (stock_redis_retire(k->c, voucher_id, pg_sale) < 0 ||
        settle(k, idx, n, voucher_id, 0, NULL) != 0)
        return -1;
    for (int i = 0; i < n; i++)
        counters_note(COUNTERS_STREAM_STALE);
    log_info("consumer: dropped %d orders of voucher %" PRId64 " from before its reset", n,
             voucher_id);
    return 0;
}

/* After a refusal for now: the connection is dropped when it is gone (the
 * next try opens one, through PG_DSN's hosts), and the entries stay pending. */
static int refused_for_now(consumer *k, PGconn *pg)
{
    /* A session left in a transaction or in pipeline mode would fail the
     * same way at every try: a new one. */
    if (PQstatus(pg) != CONNECTION_OK || PQtransactionStatus(pg) != PQTRANS_IDLE ||
        PQpipelineStatus(pg) != PQ_PIPELINE_OFF)
        pg_drop(k);
    counters_note(COUNTERS_STREAM_RETRY);
    return -1;
}

/* store_orders_persist; with PG_HA its commit confirmed by a synchronous
 * standby too (store_ha_confirm), else STORE_UNAVAILABLE: refused for now,
 * the entries kept pending and persisted again later (a no-op but for the
 * row lock, whose commit is confirmed in turn). */
static store_status persist_confirmed(PGconn *pg, int64_t voucher_id, int64_t gen,
                                      const store_order *orders, size_t n, int64_t *inserted,
                                      int64_t *pg_sale)
{
    store_status st = store_orders_persist(pg, voucher_id, gen, orders, n, inserted, pg_sale);

    if (st == STORE_OK && g_cfg.pg_ha)
        st = store_ha_confirm(pg);
    return st;
}

/* Persists the entries idx[0..n-1] of one voucher and one sale. 0 when
 * each is settled (landed, dropped as stale, or dead-lettered), -1 when
 * Postgres refused for now or Redis failed: the rest stay pending to us. */
static int persist(consumer *k, int64_t voucher_id, int64_t gen, const int *idx, int n)
{
    int64_t inserted, pg_sale;
    store_status st;
    PGconn *pg;

    if ((pg = pg_get(k)) == NULL) {
        counters_note(COUNTERS_STREAM_RETRY);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const entry *e = &k->e[idx[i]];
        k->orders[i] = (store_order){ .order_id = e->order_id, .voucher_id = voucher_id,
                                      .user_id = e->user_id };
    }
    st = persist_confirmed(pg, voucher_id, gen, k->orders, (size_t)n, &inserted, &pg_sale);
    if (st == STORE_OK) {
        if (settle(k, idx, n, voucher_id, n, NULL) != 0)
            return -1;
        landed(k, idx, n);
        return 0;
    }
    if (st == STORE_STALE_SALE)
        return drop_stale(k, voucher_id, pg_sale, idx, n);
    if (poison_reason(st) == NULL)
        return refused_for_now(k, pg);
    /* Refused for good as a whole: one by one, so that the one that cannot
     * be persisted is found and set aside, and the others land. */
    log_warn("consumer: batch of %d orders of voucher %" PRId64 " refused (%d): one by one", n,
             voucher_id, (int)st);
    for (int i = 0; i < n; i++) {
        const char *why;
        st = persist_confirmed(pg, voucher_id, gen, &k->orders[i], 1, &inserted, &pg_sale);
        if (st == STORE_OK) {
            if (settle(k, &idx[i], 1, voucher_id, 1, NULL) != 0)
                return -1;
            landed(k, &idx[i], 1);
        } else if (st == STORE_STALE_SALE) {
            if (drop_stale(k, voucher_id, pg_sale, &idx[i], 1) != 0)
                return -1;
        } else if ((why = poison_reason(st)) == NULL) {
            return refused_for_now(k, pg);
        } else if (dead_letter(k, idx[i], why) != 0) {
            return -1;
        }
    }
    return 0;
}

/* Settles the 'n' entries in k->e: per voucher and sale, persisted (or
 * dropped, when Postgres says a reset ended their sale). 0, or -1 when
 * something stays pending. */
static int process(consumer *k, int n)
{
    int *idx = xmalloc(sizeof *idx * (size_t)(n > 0 ? n : 1));
    int rc = 0;

    for (int i = 0; i < n && rc == 0; i++) {
        entry *e = &k->e[i];
        int m = 0;
        if (e->done)
            continue;
        if (!e->readable) {
            rc = dead_letter(k, i, "unreadable entry");
            continue;
        }
        /* This voucher's entries of the same sale. */
        for (int j = i; j < n; j++)
            if (!k->e[j].done && k->e[j].readable && k->e[j].voucher_id == e->voucher_id &&
                k->e[j].gen == e->gen)
                idx[m++] = j;
        rc = persist(k, e->voucher_id, e->gen, idx, m);
    }
    free(idx);
    return rc;
}

/* Removes the stream's settled entries (stream_trim.lua). A failure
 * leaves them for the next time: only memory is at stake. */
static void trim(consumer *k)
{
    const char *argv[1] = { k->s->names.orders };
    redisReply *r = script_file_run(k->c, &trim_script, 1, 1, argv, NULL);

    if (r != NULL && r->type == REDIS_REPLY_ERROR) {
        if (strstr(r->str, "no such key") != NULL)
            ensure_group(k->c, &k->s->names); /* the stream is gone: as XREADGROUP's NOGROUP */
        else if (!redirected(k, r))
            log_warn("consumer: stream_trim %s: %s", k->s->names.orders, r->str);
    }
    freeReplyObject(r);
}

/* The pause after Postgres refused a batch for now: doubling from
 * RETRY_FIRST_MS up to CONSUMER_RETRY_MAX_MS (and half the claim bound,
 * so that other consumers do not take over entries that are merely
 * waiting), each a random point in its upper half so that the consumers
 * of several instances do not come back in step. */
static int next_retry_ms(consumer *k)
{
    int cap = g_cfg.consumer_retry_max_ms, half_claim = g_cfg.consumer_claim_idle_ms / 2;

    if (cap > half_claim)
        cap = half_claim;
    if (cap < RETRY_FIRST_MS)
        cap = RETRY_FIRST_MS;
    k->retry_ms = k->retry_ms == 0 ? RETRY_FIRST_MS : k->retry_ms * 2;
    if (k->retry_ms > cap)
        k->retry_ms = cap;
    return k->retry_ms / 2 + (int)(rand_r(&k->seed) % (unsigned)(k->retry_ms / 2 + 1));
}

/* One stream's turn, k->s on k->c: claim what crashed consumers left,
 * else our own pending entries, else new ones (waiting up to 'block_ms'
 * for them; 0: not at all; negative: none read, the caller lingers
 * first); persist them. The number of entries read, or -1 when a read
 * failed. */
static int stream_turn(consumer *k, int block_ms)
{
    stream_state *s = k->s;
    int64_t now = util_mono_us();
    int n = 0;

    if (now >= s->next_claim_us) {
        int every = g_cfg.consumer_claim_idle_ms / 4;
        s->next_claim_us = now + (int64_t)(every < 100 ? 100 : every) * 1000;
        n = claim(k);
    }
    if (n == 0 && s->own_pending && k->c->err == 0) {
        n = read_stream(k, "0", 0);
        if (n == 0)
            s->own_pending = 0;
    }
    if (n == 0 && k->c->err == 0 && block_ms >= 0) {
        n = read_stream(k, ">", block_ms);
        if (n >= g_cfg.consumer_batch_max)
            k->read_full = 1;
    }
    if (n > 0 && process(k, n) != 0) {
        s->own_pending = 1;
        if (k->c->err == 0)
            k->retry_at_us = util_mono_us() + (int64_t)next_retry_ms(k) * 1000;
    } else if (n > 0) {
        k->retry_ms = 0;
    }
    if (k->c->err == 0 && (now = util_mono_us()) >= s->next_trim_us) {
        s->next_trim_us = now + TRIM_EVERY_MS * 1000LL;
        trim(k);
    }
    if (k->c->err == 0 && (now = util_mono_us()) >= s->next_tidy_us) {
        s->next_tidy_us = now + stream_tidy_every_ms() * 1000LL;
        stream_tidy_consumers(k->c, s->names.orders, k->name);
    }
    return n;
}

/* The pause after Postgres refused a batch; 1 while it lasts (the thread
 * slept meanwhile; on one Redis, up to the next check of the master). */
static int pausing(consumer *k)
{
    int64_t until = k->retry_at_us;

    if (util_mono_us() >= until)
        return 0;
    if (k->rc == NULL && k->next_check_us < until)
        until = k->next_check_us;
    linger_until(&consumer_bg, until);
    return 1;
}

/* One Redis: one stream, read with a blocking wait for new entries. */
static void consume(consumer *k)
{
    int block = g_cfg.redis_timeout_ms / 2 < 200 ? g_cfg.redis_timeout_ms / 2 : 200;
    stream_state *s = k->s;
    int n = 0;

    if (pausing(k))
        return;
    /* Claims and our own pending entries come first, without waiting. */
    if (util_mono_us() >= s->next_claim_us || s->own_pending) {
        k->read_full = 0;
        n = stream_turn(k, -1);
        if (n != 0 || k->c->err)
            goto out;
    }
    linger_until(&consumer_bg, k->next_read_us);
    if (bgthread_stopping(&consumer_bg))
        return;
    k->next_read_us = util_mono_us() + (int64_t)g_cfg.consumer_linger_ms * 1000;
    k->read_full = 0;
    n = stream_turn(k, block < 1 ? 1 : block);
    if (k->read_full)
        k->next_read_us = 0;
out:
    if (n < 0 && k->c->err == 0)
        bgthread_sleep(&consumer_bg, RETRY_PAUSE_MS);
}

/* A Redis Cluster: the streams are the vouchers' in Postgres, read again
 * once a second (a stream that is new keeps nothing: its state starts
 * afresh, its group created at its first read). 0, or -1 when Postgres
 * did not answer (the list stays as it was). */
static int list_streams(consumer *k)
{
    int64_t *ids = NULL;
    size_t n = 0;
    stream_state *next;
    PGconn *pg = pg_get(k);

    if (pg == NULL || store_voucher_ids(pg, &ids, &n) != STORE_OK) {
        if (pg != NULL && PQstatus(pg) != CONNECTION_OK)
            pg_drop(k);
        free(ids);
        return -1;
    }
    next = xcalloc(n > 0 ? n : 1, sizeof *next);
    for (size_t i = 0, j = 0; i < n; i++) {
        while (j < k->nstreams && k->streams[j].names.voucher_id < ids[i])
            j++;
        if (j < k->nstreams && k->streams[j].names.voucher_id == ids[i]) {
            next[i] = k->streams[j];
            continue;
        }
        stock_redis_stream_of(&next[i].names, ids[i]);
        snprintf(next[i].cursor, sizeof next[i].cursor, "0-0");
        next[i].own_pending = 1;
    }
    free(ids);
    free(k->streams);
    k->streams = next;
    k->nstreams = n;
    k->s = NULL;
    return 0;
}

/* A Redis Cluster: one sweep over every voucher's stream, each on its
 * slot's master, none waited on (a wait on one would hold up the others);
 * a sweep that read nothing waits POLL_IDLE_MS (or CONSUMER_LINGER_MS,
 * when longer) before the next. A master that cannot be reached is tried
 * once per sweep (its other streams wait for the next), and the next sweep
 * waits RETRY_PAUSE_MS: a failover takes seconds, and the others' streams
 * go on meanwhile. */
static void sweep(consumer *k)
{
    unsigned char failed[RCLUSTER_MAX_NODES] = { 0 };
    int64_t now = util_mono_us();
    int poll = g_cfg.consumer_linger_ms > POLL_IDLE_MS ? g_cfg.consumer_linger_ms : POLL_IDLE_MS;
    int trouble = 0;

    if (now >= k->next_list_us) {
        k->next_list_us = now + WATCH_EVERY_MS * 1000LL;
        list_streams(k);
    }
    if (pausing(k))
        return;
    linger_until(&consumer_bg, k->next_read_us);
    if (bgthread_stopping(&consumer_bg))
        return;
    k->read_full = k->read_some = 0;
    for (size_t i = 0; i < k->nstreams && !bgthread_stopping(&consumer_bg); i++) {
        int n, slot, node;
        k->s = &k->streams[i];
        slot = rcluster_keyslot(k->s->names.orders, strlen(k->s->names.orders));
        if ((node = rcluster_slot_node(k->rc, slot)) >= 0 && failed[node])
            continue;
        if ((k->c = rcluster_slot_context(k->rc, slot)) == NULL) {
            log_debug("consumer: %s: %s", k->s->names.orders, k->rc->errstr);
            trouble = 1;
            if (node < 0)
                break;                      /* no map: the next sweep, after the pause */
            failed[node] = 1;
            continue;
        }
        n = stream_turn(k, 0);
        k->read_some |= n > 0;
        if (k->c->err) {
            redis_drop(k);
            trouble = 1;
            break;
        }
        if (util_mono_us() < k->retry_at_us)
            break;                          /* Postgres refused: the pause, then again */
    }
    k->c = NULL;
    if (k->redirected) {
        rcluster_reset(k->rc);              /* a slot moved: the map read again */
        k->redirected = 0;
    }
    now = util_mono_us();
    if (k->read_full)
        k->next_read_us = 0;
    else
        k->next_read_us = now + (int64_t)(trouble ? RETRY_PAUSE_MS
                                          : k->read_some ? g_cfg.consumer_linger_ms : poll) * 1000;
}

/* One round of consuming. A context that no longer leads to the master (a
 * Sentinel failover) is dropped like a failed one, checked once a second. */
static void round_once(consumer *k)
{
    int64_t now = util_mono_us();

    if (now >= k->next_check_us) {
        k->next_check_us = now + WATCH_EVERY_MS * 1000LL;
        if (!conn_redis_current(k->c)) {
            log_warn("consumer: the Redis master changed: reconnecting");
            redis_drop(k);
            return;
        }
    }
    consume(k);
    if (k->c->err)
        redis_drop(k);
}

static void consumer_free(consumer *k)
{
    redis_drop(k);
    rcluster_free(k->rc);
    pg_drop(k);
    free(k->streams);
    free(k->e);
    free(k->orders);
    free(k->argv);
    free(k);
}

/* Its 'arg', the consumer's state, is the thread's: freed here. */
static void consumer_main(bgthread *self, void *arg)
{
    consumer *k = arg;
    char err[256];

    while (!bgthread_stopping(self)) {
        if (k->rc != NULL) {
            sweep(k);
            continue;
        }
        if (k->c == NULL) {
            if ((k->c = conn_redis_open(err, sizeof err)) == NULL ||
                ensure_group(k->c, &k->s->names) != 0) {
                if (k->c != NULL)
                    redis_drop(k);
                bgthread_sleep(self, RETRY_PAUSE_MS);
                continue;
            }
            k->s->own_pending = 1;
            k->next_check_us = util_mono_us() + WATCH_EVERY_MS * 1000LL;
        }
        round_once(k);
    }
    consumer_free(k);
}

/* The watch on a Redis Cluster: its own routing handle, and the voucher
 * list read from Postgres (kept as it was while Postgres does not answer;
 * the backlog is not judged until a list was read once). */
typedef struct cluster_watch {
    rcluster *rc;
    PGconn *pg;
    int64_t pg_checked_us;
    int64_t *ids;
    size_t n;
    int listed;                       /* a list was read */
    unsigned ticks;
} cluster_watch;

/* Reads the voucher list again, for the next round. */
static void cluster_watch_list(cluster_watch *w)
{
    char err[256];
    int64_t *ids;
    size_t n;

    if (w->pg != NULL && (PQstatus(w->pg) != CONNECTION_OK ||
                          conn_pg_recheck(w->pg, &w->pg_checked_us) != 0)) {
        PQfinish(w->pg);
        w->pg = NULL;
    }
    if (w->pg == NULL) {
        if ((w->pg = conn_pg_open(err, sizeof err)) == NULL)
            log_debug("watch: Postgres: %s", err);
        w->pg_checked_us = util_mono_us();
    }
    if (w->pg != NULL && store_voucher_ids(w->pg, &ids, &n) == STORE_OK) {
        free(w->ids);
        w->ids = ids;
        w->n = n;
        w->listed = 1;
    }
}

/* Redis first (durability, the backlog of the vouchers listed so far),
 * then the list for the next round: a Postgres that is slow to answer
 * delays no verdict. The map is read afresh after a failure and every
 * tenth round (a master added by a reshard is checked too). */
static void cluster_watch_once(cluster_watch *w)
{
    if (++w->ticks % 10 == 0)
        w->rc->stale = 1;
    if (stock_redis_watch_cluster(w->rc, w->ids, w->n, w->listed) != 0)
        rcluster_reset(w->rc);              /* failed, a failover or a moved slot */
    cluster_watch_list(w);
}

/* The watch, once a second on a connection of its own, on every instance
 * that admits (whatever the consumer is waiting for meanwhile, a Postgres
 * that does not answer included): admission follows its verdicts. */
static void watch_main(bgthread *self, void *arg)
{
    redisContext *c = NULL;
    cluster_watch w = { 0 };
    char err[256];

    (void)arg;
    if (stock_redis_per_voucher() && (w.rc = conn_cluster_open(err, sizeof err)) == NULL)
        log_error("watch: %s", err);
    while (!bgthread_stopping(self)) {
        int64_t next = util_mono_us() + WATCH_EVERY_MS * 1000LL;
        if (w.rc != NULL) {
            cluster_watch_once(&w);
        } else if (!stock_redis_per_voucher()) {
            if (c == NULL && (c = conn_redis_open(err, sizeof err)) == NULL)
                log_debug("watch: Redis: %s", err);
            if (c != NULL) {
                stock_redis_watch(c);
                if (c->err || !conn_redis_current(c)) {
                    redisFree(c);         /* failed, or a failover: open anew */
                    c = NULL;
                }
            }
        }
        linger_until(self, next);
    }
    if (c != NULL)
        redisFree(c);
    rcluster_free(w.rc);
    if (w.pg != NULL)
        PQfinish(w.pg);
    free(w.ids);
}

int consumer_start(void)
{
    char err[256];
    consumer *k;

    if (g_cfg.stock_strategy != STOCKS_REDIS || bgthread_started(&watch_bg))
        return 0;
    if (script_file_load(&trim_script, g_cfg.lua_dir, trim_script.name, err, sizeof err) != 0) {
        log_error("consumer: %s", err);
        return -1;
    }
    if (bgthread_start(&watch_bg, "sk-watch", watch_main, NULL, NULL) != 0) {
        log_error("consumer: cannot start the watch thread");
        return -1;
    }
    if (g_cfg.consumers == 0) {
        log_info("consumer: none in this instance (CONSUMERS=0); its watch checks Redis's "
                 "durability and the stream's backlog every second");
        return 0;
    }
    k = xcalloc(1, sizeof *k);
    /* A name of its own per process: a restarted instance does not take
     * over its predecessor's entries as if they were being worked on; they
     * are claimed once idle, like any dead consumer's. */
    snprintf(k->name, sizeof k->name, "%s:%.8s", g_cfg.instance_id, g_cfg.instance_uuid);
    k->seed = (unsigned)util_mono_us() ^ (unsigned)getpid();
    k->e = xcalloc((size_t)g_cfg.consumer_batch_max, sizeof *k->e);
    k->orders = xcalloc((size_t)g_cfg.consumer_batch_max, sizeof *k->orders);
    k->argv = xcalloc((size_t)g_cfg.consumer_batch_max + 3, sizeof *k->argv);
    if (stock_redis_per_voucher()) {
        if ((k->rc = conn_cluster_open(err, sizeof err)) == NULL) {
            log_error("consumer: %s", err);
            consumer_free(k);
            consumer_stop();
            return -1;
        }
    } else {
        k->streams = xcalloc(1, sizeof *k->streams);
        k->nstreams = 1;
        k->s = &k->streams[0];
        stock_redis_stream_of(&k->s->names, 0);
        snprintf(k->s->cursor, sizeof k->s->cursor, "0-0");
    }
    if (bgthread_start(&consumer_bg, "sk-consumer", consumer_main, k, NULL) != 0) {
        consumer_free(k);
        log_error("consumer: cannot start its thread");
        consumer_stop();
        return -1;
    }
    log_info("consumer %s: persisting %s in batches of up to %d (claim after %d ms idle)",
             k->name, k->rc != NULL ? "each voucher's stream (seckill:v:{<id>}:orders)"
                                    : STOCK_REDIS_STREAM,
             g_cfg.consumer_batch_max, g_cfg.consumer_claim_idle_ms);
    return 0;
}

void consumer_stop(void)
{
    bgthread_stop(&consumer_bg);
    bgthread_stop(&watch_bg);
}
