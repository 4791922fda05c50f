/* test_order_id: order id layout, counter keys, limits, and the classic 300 x 100
 * concurrency test against a real Redis (REDIS_URL). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "order_id.h"
#include "t.h"

#define N_THREADS 300
#define N_PER_THREAD 100
#define N_IDS (N_THREADS * N_PER_THREAD)

static redisContext *rc;
static char prefix[64];   /* "test<pid>": fresh counters for this run */

static void del_key(const char *key)
{
    redisReply *r = T_CMD(rc, "DEL %s", key);
    freeReplyObject(r);
}

static void set_key(const char *key, const char *value)
{
    redisReply *r = T_CMD(rc, "SET %s %s", key, value);
    freeReplyObject(r);
}

/*---- pure parts ----*/

static void test_compose_layout(void)
{
    T_EQ_I64(order_id_compose(1, 1), 4294967297LL);
    T_EQ_I64(order_id_compose(0, 0), 0);
    T_EQ_I64(order_id_compose(0, 1), 1);
    T_EQ_I64(order_id_compose(1, 0), 1LL << 32);
    T_EQ_I64(order_id_compose(0, 0xffffffffLL), 0xffffffffLL);
    T_EQ_I64(order_id_compose(0x7fffffffLL, 0xffffffffLL), INT64_MAX);

    int64_t secs = 154569600;   /* 2026-11-25T00:00:00Z - epoch */
    int64_t id = order_id_compose(secs, 123456789);
    T_ASSERT(id > 0);                                   /* sign bit 0 */
    T_EQ_I64((uint64_t)id >> 63, 0);
    T_EQ_I64(id >> 32, secs);
    T_EQ_I64(id & 0xffffffffLL, 123456789);
    T_EQ_I64(id, (secs << 32) | 123456789);
}

static void test_compose_out_of_range(void)
{
    T_EQ_I64(order_id_compose(-1, 1), -1);
    T_EQ_I64(order_id_compose(0x80000000LL, 1), -1);
    T_EQ_I64(order_id_compose(INT64_MAX, 1), -1);
    T_EQ_I64(order_id_compose(1, -1), -1);
    T_EQ_I64(order_id_compose(1, 0x100000000LL), -1);
    T_EQ_I64(order_id_compose(1, INT64_MAX), -1);
}

static void test_key_format(void)
{
    char buf[128];
    order_id_key("order", 1795564800, buf, sizeof buf);        /* 2026-11-25T00:00:00Z */
    T_EQ_STR(buf, "icr:order:2026:11:25");
    order_id_key("order", 1795564800 + 86399, buf, sizeof buf); /* 23:59:59 same day */
    T_EQ_STR(buf, "icr:order:2026:11:25");
    order_id_key("order", 1767657599, buf, sizeof buf);        /* 2026-01-05T23:59:59Z */
    T_EQ_STR(buf, "icr:order:2026:01:05");
    order_id_key("order", 1767657600, buf, sizeof buf);        /* next second */
    T_EQ_STR(buf, "icr:order:2026:01:06");
    order_id_key("x", ORDER_ID_EPOCH, buf, sizeof buf);
    T_EQ_STR(buf, "icr:x:2022:01:01");

    /* UTC even when the local zone is a day ahead */
    const char *old = getenv("TZ");
    char *saved = old != NULL ? strdup(old) : NULL;
    setenv("TZ", "Pacific/Kiritimati", 1);   /* UTC+14 */
    tzset();
    order_id_key("order", 1767657599, buf, sizeof buf);
    T_EQ_STR(buf, "icr:order:2026:01:05");
    if (saved != NULL) {
        setenv("TZ", saved, 1);
        free(saved);
    } else {
        unsetenv("TZ");
    }
    tzset();

    /* truncated, still terminated */
    char small[8];
    order_id_key("order", 1767657599, small, sizeof small);
    T_EQ_STR(small, "icr:ord");
}

/*---- against Redis ----*/

static void test_counter_limits(void)
{
    char key[128];
    int64_t now = 1795564800 + 3600, id = 0;
    order_id_key(prefix, now, key, sizeof key);

    set_key(key, "4294967294");
    T_EQ_I64(order_id_next_at(rc, prefix, now, &id), ORDER_ID_OK);
    T_EQ_I64(id & 0xffffffffLL, 4294967295LL);
    T_EQ_I64(id >> 32, now - ORDER_ID_EPOCH);
    T_ASSERT(id > 0);

    /* the next one would need 33 bits: an error, never a wrap to 0 */
    id = 77;
    T_EQ_I64(order_id_next_at(rc, prefix, now, &id), ORDER_ID_EXHAUSTED);
    T_EQ_I64(id, 77);
    set_key(key, "4294967295");
    T_EQ_I64(order_id_next_at(rc, prefix, now, &id), ORDER_ID_EXHAUSTED);

    /* a counter that is not a number is a Redis error */
    set_key(key, "abc");
    T_EQ_I64(order_id_next_at(rc, prefix, now, &id), ORDER_ID_REDIS);
    del_key(key);

    /* a fresh day starts at 1 */
    T_EQ_I64(order_id_next_at(rc, prefix, now, &id), ORDER_ID_OK);
    T_EQ_I64(id, ((now - ORDER_ID_EPOCH) << 32) | 1);
    del_key(key);
}

static void test_clock_range(void)
{
    char key[128];
    int64_t id = 77;

    T_EQ_I64(order_id_next_at(rc, prefix, ORDER_ID_EPOCH - 1, &id), ORDER_ID_CLOCK);
    T_EQ_I64(order_id_next_at(rc, prefix, ORDER_ID_EPOCH + 0x80000000LL, &id), ORDER_ID_CLOCK);
    T_EQ_I64(order_id_next_at(rc, prefix, -1, &id), ORDER_ID_CLOCK);
    T_EQ_I64(id, 77);

    /* both ends of the 31-bit range */
    order_id_key(prefix, ORDER_ID_EPOCH, key, sizeof key);
    T_EQ_I64(order_id_next_at(rc, prefix, ORDER_ID_EPOCH, &id), ORDER_ID_OK);
    T_EQ_I64(id, 1);
    del_key(key);
    order_id_key(prefix, ORDER_ID_EPOCH + 0x7fffffffLL, key, sizeof key);
    T_EQ_STR(key + strlen(key) - 11, ":2090:01:19");
    T_EQ_I64(order_id_next_at(rc, prefix, ORDER_ID_EPOCH + 0x7fffffffLL, &id), ORDER_ID_OK);
    T_EQ_I64(id, (0x7fffffffLL << 32) | 1);
    del_key(key);
}

static void test_dead_connection(void)
{
    int64_t id = 0;
    redisContext *c = t_redis();
    redisReply *r = T_CMD(c, "CLIENT ID");
    long long cid = r != NULL && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    r = T_CMD(rc, "CLIENT KILL ID %lld", cid);
    freeReplyObject(r);
    T_EQ_I64(order_id_next(c, prefix, &id), ORDER_ID_REDIS);
    T_ASSERT(c->err != 0);
    redisFree(c);
}

/*---- the classic test: 300 threads x 100 ids ----*/

typedef struct worker {
    int index;
    redisContext *c;
    pthread_barrier_t *start;
    int64_t *ids;       /* N_PER_THREAD slots of the shared array */
    int failures;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    pthread_barrier_wait(w->start);
    for (int i = 0; i < N_PER_THREAD; i++) {
        if (order_id_next(w->c, prefix, &w->ids[i]) != ORDER_ID_OK) {
            w->ids[i] = -1;
            w->failures++;
        }
    }
    return NULL;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void test_concurrent_unique(void)
{
    static int64_t ids[N_IDS];
    static worker workers[N_THREADS];
    static pthread_t tids[N_THREADS];
    pthread_barrier_t start;
    char key_before[128], key_after[128];
    int started = 0, failures = 0;

    /* connect first so the timing covers id generation only */
    for (int i = 0; i < N_THREADS; i++) {
        workers[i] = (worker){i, t_redis(), &start, ids + (size_t)i * N_PER_THREAD, 0};
    }
    pthread_barrier_init(&start, NULL, N_THREADS + 1);
    int64_t t0 = (int64_t)time(NULL);
    order_id_key(prefix, t0, key_before, sizeof key_before);
    for (int i = 0; i < N_THREADS; i++) {
        if (pthread_create(&tids[i], NULL, worker_main, &workers[i]) != 0) {
            fprintf(stderr, "pthread_create failed at %d\n", i);
            exit(2);   /* the barrier would wait forever */
        }
        started++;
    }
    pthread_barrier_wait(&start);
    double m0 = t_now_ms();
    for (int i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    double ms = t_now_ms() - m0;
    int64_t t1 = (int64_t)time(NULL);
    order_id_key(prefix, t1, key_after, sizeof key_after);
    pthread_barrier_destroy(&start);
    for (int i = 0; i < N_THREADS; i++) {
        failures += workers[i].failures;
        redisFree(workers[i].c);
    }

    printf("order_id: %d ids in %.1f ms (%.0f ids/s)\n", N_IDS, ms,
           ms > 0 ? N_IDS / (ms / 1000.0) : 0.0);
    T_EQ_I64(failures, 0);

    int bad_time = 0;
    for (int i = 0; i < N_IDS; i++) {
        int64_t ts = (ids[i] >> 32) + ORDER_ID_EPOCH;
        if (ids[i] <= 0 || ts < t0 - 2 || ts > t1 + 2)
            bad_time++;
    }
    T_EQ_I64(bad_time, 0);

    qsort(ids, N_IDS, sizeof ids[0], cmp_i64);
    int dups = 0;
    for (int i = 1; i < N_IDS; i++)
        dups += ids[i] == ids[i - 1];
    T_EQ_I64(dups, 0);

    /* one day's counter: the counts are exactly 1..30000 */
    if (strcmp(key_before, key_after) == 0) {
        static int64_t counts[N_IDS];
        for (int i = 0; i < N_IDS; i++)
            counts[i] = ids[i] & 0xffffffffLL;
        qsort(counts, N_IDS, sizeof counts[0], cmp_i64);
        int off = 0;
        for (int i = 0; i < N_IDS; i++)
            off += counts[i] != i + 1;
        T_EQ_I64(off, 0);
        redisReply *r = T_CMD(rc, "GET %s", key_before);
        T_ASSERT(r != NULL && r->type == REDIS_REPLY_STRING && atoll(r->str) == N_IDS);
        freeReplyObject(r);
        /* the counter key doubles as a daily count: no expiry */
        r = T_CMD(rc, "TTL %s", key_before);
        T_ASSERT(r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer == -1);
        freeReplyObject(r);
    }
    del_key(key_before);
    del_key(key_after);
}

int main(void)
{
    rc = t_redis();
    snprintf(prefix, sizeof prefix, "test%ld", (long)getpid());

    T_RUN(test_compose_layout);
    T_RUN(test_compose_out_of_range);
    T_RUN(test_key_format);
    T_RUN(test_counter_limits);
    T_RUN(test_clock_range);
    T_RUN(test_dead_connection);
    T_RUN(test_concurrent_unique);
    redisFree(rc);
    return t_done();
}
