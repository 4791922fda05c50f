/* test_lock: the Redisson-compatible lock against a real Redis (REDIS_URL). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "order_id.h"
#include "lock.h"
#include "script.h"
#include "t.h"

#define OWNER_A "6f1c2b0e-9a43-4d7e-b1f2-0c8d5e7a9b31:1"
#define OWNER_B "6f1c2b0e-9a43-4d7e-b1f2-0c8d5e7a9b31:2"
#define OWNER_C "0d4e1f22-7b65-4c90-a8e3-5f9b2c6d1e47:1"
#define LEASE 10000L

static redisContext *rc;   /* the connection every lock call uses */

/* A key unique to this run and case. */
static void key_for(const char *suffix, char *buf, size_t n)
{
    snprintf(buf, n, "t:lock:%ld:%s", (long)getpid(), suffix);
}

static void token_key_for(const char *key, char *buf, size_t n)
{
    snprintf(buf, n, "redisson_lock_token:{%s}", key);
}

static void del_lock(const char *key)
{
    char tk[512];
    token_key_for(key, tk, sizeof tk);
    redisReply *r = T_CMD(rc, "DEL %s %s", key, tk);
    freeReplyObject(r);
}

/* HGET as a number; -1 when the field is absent, -2 on error. */
static long long hget_count(const char *key, const char *field)
{
    long long v = -2;
    redisReply *r = T_CMD(rc, "HGET %s %s", key, field);
    if (r == NULL)
        return -2;
    if (r->type == REDIS_REPLY_NIL)
        v = -1;
    else if (r->type == REDIS_REPLY_STRING)
        v = strtoll(r->str, NULL, 10);
    freeReplyObject(r);
    return v;
}

static long long int_cmd(const char *fmt, const char *key)
{
    long long v = -100;
    redisReply *r = T_CMD(rc, fmt, key);
    if (r != NULL && r->type == REDIS_REPLY_INTEGER)
        v = r->integer;
    freeReplyObject(r);
    return v;
}

static long long pttl(const char *key)
{
    return int_cmd("PTTL %s", key);
}

static long long exists(const char *key)
{
    return int_cmd("EXISTS %s", key);
}

/* A second connection subscribed to 'channel' (confirmation consumed), or
 * NULL after recording a failure. Its 2 s timeout bounds every wait. */
static redisContext *sub_open(const char *channel)
{
    redisContext *s = t_redis();
    struct timeval tv = {2, 0};
    redisReply *r = T_CMD(s, "SUBSCRIBE %s", channel);
    if (!T_ASSERT(r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 3)) {
        freeReplyObject(r);
        redisFree(s);
        return NULL;
    }
    freeReplyObject(r);
    redisSetTimeout(s, tv);
    return s;
}

/* Next message payload on a subscribed context, into 'buf'; 0 or -1. */
static int sub_next(redisContext *s, const char *channel, char *buf, size_t n)
{
    void *v = NULL;
    int rc_ = -1;
    if (redisGetReply(s, &v) != REDIS_OK || v == NULL)
        goto cleanup;
    redisReply *r = v;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[0]->type != REDIS_REPLY_STRING || strcmp(r->element[0]->str, "message") != 0 ||
        r->element[1]->type != REDIS_REPLY_STRING || strcmp(r->element[1]->str, channel) != 0 ||
        r->element[2]->type != REDIS_REPLY_STRING)
        goto cleanup;
    snprintf(buf, n, "%s", r->element[2]->str);
    rc_ = 0;
cleanup:
    freeReplyObject(v);
    return rc_;
}

/*---- cases ----*/

static void test_layout_and_names(void)
{
    char key[256], ch[512];
    lock_grant g = {0, 0};
    key_for("layout", key, sizeof key);

    lock_channel_name("lock:order:42", ch, sizeof ch);
    T_EQ_STR(ch, "redisson_lock__channel:{lock:order:42}");
    /* Redisson's prefixName: a key with its own hash tag is not re-braced */
    lock_channel_name("lock:{order}:42", ch, sizeof ch);
    T_EQ_STR(ch, "redisson_lock__channel:lock:{order}:42");

    if (!T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, &g), LOCK_OK))
        goto cleanup;
    redisReply *r = T_CMD(rc, "TYPE %s", key);
    T_ASSERT(r != NULL && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "hash") == 0);
    freeReplyObject(r);
    r = T_CMD(rc, "HGETALL %s", key);
    if (T_ASSERT(r != NULL && r->type == REDIS_REPLY_ARRAY) && T_EQ_I64(r->elements, 2)) {
        T_EQ_STR(r->element[0]->str, OWNER_A);
        T_EQ_STR(r->element[1]->str, "1");
    }
    freeReplyObject(r);
    long long t = pttl(key);
    T_ASSERT(t > 0 && t <= LEASE);
    char tk[512];
    token_key_for(key, tk, sizeof tk);
    r = T_CMD(rc, "GET %s", tk);
    T_ASSERT(r != NULL && r->type == REDIS_REPLY_STRING && strtoll(r->str, NULL, 10) == g.token);
    freeReplyObject(r);
    T_EQ_I64(lock_release(rc, key, OWNER_A, LEASE, NULL), LOCK_OK);
cleanup:
    del_lock(key);
}

static void test_reentry_three_deep(void)
{
    char key[256];
    long left = -1;
    key_for("reentry", key, sizeof key);

    for (int i = 0; i < 3; i++)
        T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, NULL), LOCK_OK);
    T_EQ_I64(hget_count(key, OWNER_A), 3);

    T_EQ_I64(lock_release(rc, key, OWNER_A, LEASE, &left), LOCK_OK);
    T_EQ_I64(left, 2);
    T_EQ_I64(hget_count(key, OWNER_A), 2);
    T_EQ_I64(lock_release(rc, key, OWNER_A, LEASE, &left), LOCK_OK);
    T_EQ_I64(left, 1);
    T_EQ_I64(exists(key), 1);
    T_EQ_I64(lock_release(rc, key, OWNER_A, LEASE, &left), LOCK_OK);
    T_EQ_I64(left, 0);
    T_EQ_I64(exists(key), 0);

    left = 99;
    T_EQ_I64(lock_release(rc, key, OWNER_A, LEASE, &left), LOCK_NOT_OWNER);
    T_EQ_I64(left, 99);
    T_EQ_I64(exists(key), 0);
    del_lock(key);
}

static void test_non_owner_release_changes_nothing(void)
{
    char key[256], ch[512], msg[64];
    redisContext *sub = NULL;
    key_for("nonowner", key, sizeof key);
    lock_channel_name(key, ch, sizeof ch);

    if (!T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, NULL), LOCK_OK))
        goto cleanup;
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, NULL), LOCK_OK);
    sub = sub_open(ch);
    if (sub == NULL)
        goto cleanup;
    t_sleep_ms(50);
    long long before = pttl(key);

    /* a longer lease: a wrongful PEXPIRE would show as a bigger PTTL */
    T_EQ_I64(lock_release(rc, key, OWNER_B, 60000, NULL), LOCK_NOT_OWNER);
    T_EQ_I64(lock_release(rc, key, OWNER_C, 60000, NULL), LOCK_NOT_OWNER);

    redisReply *r = T_CMD(rc, "HGETALL %s", key);
    if (T_ASSERT(r != NULL && r->type == REDIS_REPLY_ARRAY) && T_EQ_I64(r->elements, 2)) {
        T_EQ_STR(r->element[0]->str, OWNER_A);
        T_EQ_STR(r->element[1]->str, "2");
    }
    freeReplyObject(r);
    long long after = pttl(key);
    T_ASSERT(after > 0 && after <= before);

    /* Messages arrive in order: if a refused release had published, its
     * "0" would come before this marker. */
    r = T_CMD(rc, "PUBLISH %s marker", ch);
    freeReplyObject(r);
    if (T_EQ_I64(sub_next(sub, ch, msg, sizeof msg), 0))
        T_EQ_STR(msg, "marker");

cleanup:
    redisFree(sub);
    del_lock(key);
}

static void test_release_publishes_zero(void)
{
    char key[256], ch[512], msg[64];
    redisContext *sub = NULL;
    long left = -1;
    key_for("publish", key, sizeof key);
    lock_channel_name(key, ch, sizeof ch);

    sub = sub_open(ch);
    if (sub == NULL)
        goto cleanup;
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, NULL), LOCK_OK);
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, NULL), LOCK_OK);
    /* the inner release must not wake anyone; the final one must */
    T_EQ_I64(lock_release(rc, key, OWNER_A, LEASE, &left), LOCK_OK);
    T_EQ_I64(left, 1);
    T_EQ_I64(lock_release(rc, key, OWNER_A, LEASE, &left), LOCK_OK);
    T_EQ_I64(left, 0);
    if (T_EQ_I64(sub_next(sub, ch, msg, sizeof msg), 0))
        T_EQ_STR(msg, "0");
    redisReply *r = T_CMD(rc, "PUBLISH %s marker", ch);
    freeReplyObject(r);
    if (T_EQ_I64(sub_next(sub, ch, msg, sizeof msg), 0))
        T_EQ_STR(msg, "marker");
cleanup:
    redisFree(sub);
    del_lock(key);
}

static void test_contention_returns_ttl(void)
{
    char key[256];
    lock_grant g = {0, 0};
    long lease = 5000;
    key_for("contention", key, sizeof key);

    if (!T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, lease, NULL), LOCK_OK))
        goto cleanup;
    t_sleep_ms(50);
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_B, 60000, &g), LOCK_BUSY);
    T_ASSERT(g.ttl_ms > 0 && g.ttl_ms <= lease);
    T_ASSERT(g.ttl_ms < lease);   /* the holder's clock, not a fresh lease */
    T_EQ_I64(g.token, -1);
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_C, 60000, NULL), LOCK_BUSY);

    redisReply *r = T_CMD(rc, "HGETALL %s", key);
    if (T_ASSERT(r != NULL && r->type == REDIS_REPLY_ARRAY) && T_EQ_I64(r->elements, 2)) {
        T_EQ_STR(r->element[0]->str, OWNER_A);
        T_EQ_STR(r->element[1]->str, "1");
    }
    freeReplyObject(r);
    long long t = pttl(key);
    T_ASSERT(t > 0 && t <= lease);
    T_EQ_I64(lock_release(rc, key, OWNER_A, lease, NULL), LOCK_OK);
cleanup:
    del_lock(key);
}

static void test_reentry_resets_ttl(void)
{
    char key[256];
    long lease = 1000;
    key_for("reset", key, sizeof key);

    if (!T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, lease, NULL), LOCK_OK))
        goto cleanup;
    t_sleep_ms(400);
    long long t = pttl(key);
    T_ASSERT(t > 0 && t <= 650);
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, lease, NULL), LOCK_OK);
    t = pttl(key);
    /* reset to the lease, not extended by it */
    T_ASSERT(t > 800 && t <= lease);
    t_sleep_ms(300);
    /* an inner release also resets the lease */
    long left = -1;
    T_EQ_I64(lock_release(rc, key, OWNER_A, lease, &left), LOCK_OK);
    T_EQ_I64(left, 1);
    t = pttl(key);
    T_ASSERT(t > 800 && t <= lease);
    T_EQ_I64(lock_release(rc, key, OWNER_A, lease, &left), LOCK_OK);
cleanup:
    del_lock(key);
}

static void test_lease_expiry_then_other_owner(void)
{
    char key[256];
    lock_grant g = {0, 0};
    key_for("expiry", key, sizeof key);

    if (!T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, 300, NULL), LOCK_OK))
        goto cleanup;
    t_sleep_ms(400);
    T_EQ_I64(exists(key), 0);
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_B, LEASE, &g), LOCK_OK);
    /* the first owner's late release must not free the new owner's lock */
    T_EQ_I64(lock_release(rc, key, OWNER_A, LEASE, NULL), LOCK_NOT_OWNER);
    T_EQ_I64(exists(key), 1);
    T_EQ_I64(hget_count(key, OWNER_B), 1);
    T_EQ_I64(hget_count(key, OWNER_A), -1);
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, NULL), LOCK_BUSY);
    T_EQ_I64(lock_release(rc, key, OWNER_B, LEASE, NULL), LOCK_OK);
cleanup:
    del_lock(key);
}

/* Redis's clock in microseconds (TIME); -1 on error. */
static int64_t redis_now_us(void)
{
    int64_t us = -1;
    redisReply *r = T_CMD(rc, "TIME");
    if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2)
        us = strtoll(r->element[0]->str, NULL, 10) * 1000000 + strtoll(r->element[1]->str, NULL, 10);
    freeReplyObject(r);
    return us;
}

/* The token counter as a number; -1 when it is absent or not a number. */
static int64_t counter_value(const char *tk)
{
    int64_t v = -1;
    redisReply *r = T_CMD(rc, "GET %s", tk);
    if (r != NULL && r->type == REDIS_REPLY_STRING)
        v = strtoll(r->str, NULL, 10);
    freeReplyObject(r);
    return v;
}

/* One grant to OWNER_A and its release; the token, or -1. */
static int64_t grant_token(const char *key)
{
    lock_grant g = {-1, -1};
    if (!T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, &g), LOCK_OK))
        return -1;
    T_EQ_I64(lock_release(rc, key, OWNER_A, LEASE, NULL), LOCK_OK);
    return g.token;
}

static void test_fencing_tokens_increase(void)
{
    char key[256], tk[512];
    lock_grant g = {0, 0};
    int64_t last = 0, first = 0, t0;
    key_for("fencing", key, sizeof key);
    token_key_for(key, tk, sizeof tk);

    /* new grant, two reentries, a full release, another owner, ... */
    const char *seq[] = {OWNER_A, OWNER_A, OWNER_A, NULL, OWNER_B, OWNER_B, NULL, OWNER_A};
    int held = 0;
    const char *holder = NULL;
    t0 = redis_now_us();
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        if (seq[i] == NULL) {
            for (; held > 0; held--)
                T_EQ_I64(lock_release(rc, key, holder, LEASE, NULL), LOCK_OK);
            T_EQ_I64(exists(key), 0);
            T_EQ_I64(exists(tk), 1);   /* the counter outlives the lock */
            continue;
        }
        if (!T_EQ_I64(lock_try_acquire(rc, key, seq[i], LEASE, &g), LOCK_OK))
            break;
        T_ASSERT(g.token > last);
        T_EQ_I64(counter_value(tk), g.token);
        if (first == 0)
            first = g.token;
        last = g.token;
        holder = seq[i];
        held++;
    }
    /* The first token is Redis's clock in microseconds. */
    T_ASSERT(first >= t0 && first < t0 + 60 * 1000000LL);
    /* a refused attempt does not consume a token */
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_C, LEASE, &g), LOCK_BUSY);
    T_EQ_I64(counter_value(tk), last);
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, &g), LOCK_OK);
    T_ASSERT(g.token > last);
    /* Many grants in a row: strictly increasing, also within one
     * microsecond of Redis's clock. */
    for (int i = 0; i < 200; i++) {
        int64_t before = g.token;
        if (!T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, &g), LOCK_OK) ||
            !T_ASSERT(g.token > before))
            break;
        held++;
    }
    for (held++; held > 0; held--)
        T_EQ_I64(lock_release(rc, key, OWNER_A, LEASE, NULL), LOCK_OK);
    T_EQ_I64(exists(key), 0);
    del_lock(key);
}

/* A counter that Redis brings back below tokens already handed out (a
 * restart from an older RDB snapshot, a replica that lagged and was
 * promoted, a SET by hand) must not hand out lower tokens: a grant's token
 * is at least Redis's clock in microseconds, so it is above every token
 * of the past whatever the counter says. A counter ahead of the clock
 * still rises by exactly one. */
static void test_fencing_token_counter_rolled_back(void)
{
    char key[256], tk[512], below[32];
    int64_t before, t, now;
    key_for("rollback", key, sizeof key);
    token_key_for(key, tk, sizeof tk);

    before = grant_token(key);
    snprintf(below, sizeof below, "%lld", (long long)(before - 1000));
    const char *setbacks[][3] = {
        {"SET", tk, "1"}, {"SET", tk, below}, {"DEL", tk, NULL}, {"SET", tk, "-5"},
    };
    for (size_t i = 0; i < sizeof setbacks / sizeof setbacks[0]; i++) {
        redisReply *r = redisCommandArgv(rc, setbacks[i][2] ? 3 : 2, setbacks[i], NULL);
        T_ASSERT(r != NULL && r->type != REDIS_REPLY_ERROR);
        freeReplyObject(r);
        now = redis_now_us();
        t = grant_token(key);
        if (!T_ASSERT(t > before) || !T_ASSERT(t >= now))
            printf("# after %s %s: token %lld, before %lld, Redis clock %lld us\n", setbacks[i][0],
                   setbacks[i][2] ? setbacks[i][2] : "", (long long)t, (long long)before,
                   (long long)now);
        before = t;
    }

    /* Ahead of the clock (a burst, or Redis's clock stepped back): +1. */
    char ahead[32];
    snprintf(ahead, sizeof ahead, "%lld", (long long)(before + 3600LL * 1000000));
    redisReply *r = T_CMD(rc, "SET %s %s", tk, ahead);
    freeReplyObject(r);
    T_EQ_I64(grant_token(key), before + 3600LL * 1000000 + 1);

    /* A counter that is no integer below 2^53 (where tokens stay exact) is
     * refused before anything changes: no hold is granted. */
    const char *bad[] = {"9007199254740992", "12abc", "1.5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        lock_grant g = {-1, -1};
        r = T_CMD(rc, "SET %s %s", tk, bad[i]);
        freeReplyObject(r);
        T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, &g), LOCK_ERR);
        if (!T_EQ_I64(exists(key), 0))
            printf("# counter %s: a hold was granted anyway\n", bad[i]);
        r = T_CMD(rc, "DEL %s", key);
        freeReplyObject(r);
    }
    del_lock(key);
}

/* With a lifetime set, the counter expires that long after Redis's clock
 * passes its token (PXAT token/1000 + ttl), also when the counter runs
 * ahead of the clock; the next grant's token is the clock again, above the
 * last one. With 0 the counter never expires (Redisson's layout). */
static void test_fencing_token_counter_expires(void)
{
    char key[256], tk[512], ahead[32];
    int64_t t1, t2;
    redisReply *r;
    key_for("tokenttl", key, sizeof key);
    token_key_for(key, tk, sizeof tk);

    lock_set_token_ttl(300);
    t1 = grant_token(key);
    T_EQ_I64(int_cmd("PEXPIRETIME %s", tk), t1 / 1000 + 300);
    snprintf(ahead, sizeof ahead, "%lld", (long long)(t1 + 60LL * 1000000));
    r = T_CMD(rc, "SET %s %s", tk, ahead);
    freeReplyObject(r);
    t2 = grant_token(key);
    T_EQ_I64(t2, t1 + 60LL * 1000000 + 1);
    T_EQ_I64(int_cmd("PEXPIRETIME %s", tk), t2 / 1000 + 300);
    r = T_CMD(rc, "DEL %s", tk);
    freeReplyObject(r);
    t1 = grant_token(key);
    t_sleep_ms(400);
    T_EQ_I64(exists(tk), 0);                /* expired */
    t2 = grant_token(key);
    T_ASSERT(t2 > t1 + 400 * 1000);
    lock_set_token_ttl(0);
    grant_token(key);
    T_EQ_I64(int_cmd("PTTL %s", tk), -1);   /* never expires */
    del_lock(key);
}

/* An acquire that Redis runs after the client's deadline (Redis stalled, the
 * client already answered 503) must not grant: nobody would release it. */
static void test_late_acquire_refused(void)
{
    char key[128], tk[160];
    const char *argv[5];
    redisReply *r;

    key_for("late", key, sizeof key);
    token_key_for(key, tk, sizeof tk);
    argv[0] = key;
    argv[1] = tk;
    argv[2] = "10000";
    argv[3] = OWNER_A;
    argv[4] = "1000";                    /* 1970: long past */
    r = script_run(rc, SCRIPT_LOCK_ACQUIRE, 2, 5, argv, NULL);
    if (T_ASSERT(r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2)) {
        T_EQ_I64(r->element[0]->integer, -2);
        T_EQ_I64(r->element[1]->integer, -2);
    }
    freeReplyObject(r);
    T_EQ_I64(exists(key), 0);            /* nothing granted, nothing counted */
    T_EQ_I64(exists(tk), 0);
    argv[4] = "99999999999999";          /* far ahead: granted as usual */
    r = script_run(rc, SCRIPT_LOCK_ACQUIRE, 2, 5, argv, NULL);
    if (T_ASSERT(r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2))
        T_EQ_I64(r->element[0]->integer, -1);
    freeReplyObject(r);
    T_EQ_I64(lock_release(rc, key, OWNER_A, LEASE, NULL), LOCK_OK);
    del_lock(key);
}

static void test_noscript_recovery(void)
{
    char key[256];
    long left = -1;
    key_for("noscript", key, sizeof key);

    redisReply *r = T_CMD(rc, "SCRIPT FLUSH");
    freeReplyObject(r);
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, NULL), LOCK_OK);
    r = T_CMD(rc, "SCRIPT EXISTS %s %s", script_sha(SCRIPT_LOCK_ACQUIRE),
              script_sha(SCRIPT_LOCK_RELEASE));
    if (T_ASSERT(r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2)) {
        T_EQ_I64(r->element[0]->integer, 1);   /* EVAL cached it again */
        T_EQ_I64(r->element[1]->integer, 0);
    }
    freeReplyObject(r);
    r = T_CMD(rc, "SCRIPT FLUSH");
    freeReplyObject(r);
    T_EQ_I64(lock_release(rc, key, OWNER_A, LEASE, &left), LOCK_OK);
    T_EQ_I64(left, 0);
    /* and the cached path after the fallback */
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, NULL), LOCK_OK);
    T_EQ_I64(lock_release(rc, key, OWNER_A, LEASE, &left), LOCK_OK);
    T_EQ_I64(exists(key), 0);
    del_lock(key);
}

static void test_script_sha_matches_server(void)
{
    char hex[41];
    /* FIPS 180-4 / RFC 3174 vectors */
    script_sha1_hex("abc", 3, hex);
    T_EQ_STR(hex, "a9993e364706816aba3e25717850c26c9cd0d89d");
    script_sha1_hex("", 0, hex);
    T_EQ_STR(hex, "da39a3ee5e6b4b0d3255bfef95601890afd80709");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    script_sha1_hex(two, strlen(two), hex);
    T_EQ_STR(hex, "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
    static char mil[1000000];
    memset(mil, 'a', sizeof mil);
    script_sha1_hex(mil, sizeof mil, hex);
    T_EQ_STR(hex, "34aa973cd4c4daa4f61eeb2bdbad27316534016f");

    /* the server's own hash of each script equals ours */
    for (int i = 0; i < SCRIPT_COUNT; i++) {
        redisReply *r;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.lua", t_lua_dir(), script_name((enum script_id)i));
        FILE *f = fopen(path, "rb");
        if (!T_ASSERT(f != NULL))
            continue;
        static char buf[65536];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        r = T_CMD(rc, "SCRIPT LOAD %b", buf, n);
        if (T_ASSERT(r != NULL && r->type == REDIS_REPLY_STRING))
            T_EQ_STR(r->str, script_sha((enum script_id)i));
        freeReplyObject(r);
    }
}

static void test_counters_and_errors(void)
{
    char key[256], wrong[256];
    lock_counters a, b;
    key_for("counters", key, sizeof key);
    key_for("wrongtype", wrong, sizeof wrong);

    lock_counters_get(&a);
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, NULL), LOCK_OK);
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, NULL), LOCK_OK);
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_B, LEASE, NULL), LOCK_BUSY);
    T_EQ_I64(lock_release(rc, key, OWNER_B, LEASE, NULL), LOCK_NOT_OWNER);
    T_EQ_I64(lock_release(rc, key, OWNER_A, LEASE, NULL), LOCK_OK);
    T_EQ_I64(lock_release(rc, key, OWNER_A, LEASE, NULL), LOCK_OK);
    /* a Redis error (WRONGTYPE inside the script) is LOCK_ERR */
    redisReply *r = T_CMD(rc, "SET %s notahash", wrong);
    freeReplyObject(r);
    T_EQ_I64(lock_try_acquire(rc, wrong, OWNER_A, LEASE, NULL), LOCK_ERR);
    T_EQ_I64(lock_release(rc, wrong, OWNER_A, LEASE, NULL), LOCK_ERR);
    lock_counters_get(&b);
    T_EQ_I64(b.acquired - a.acquired, 2);
    T_EQ_I64(b.contended - a.contended, 1);
    T_EQ_I64(b.not_owner - a.not_owner, 1);
    T_EQ_I64(b.released - a.released, 2);
    T_EQ_I64(b.errors - a.errors, 2);
    del_lock(key);
    del_lock(wrong);
}

/* Arguments that would corrupt the lock are refused before anything is
 * sent: an empty key or owner (one owner shared by everyone), a lease of 0
 * or below (PEXPIRE 0 deletes the key), a release without a request id.
 * Each is LOCK_ERR, and Redis is left as it was. */
static void test_bad_arguments_refused(void)
{
    char key[256];
    lock_release_req rq;

    key_for("badargs", key, sizeof key);
    T_EQ_I64(lock_try_acquire(rc, "", OWNER_A, LEASE, NULL), LOCK_ERR);
    T_EQ_I64(lock_try_acquire(rc, NULL, OWNER_A, LEASE, NULL), LOCK_ERR);
    T_EQ_I64(lock_try_acquire(rc, key, "", LEASE, NULL), LOCK_ERR);
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, 0, NULL), LOCK_ERR);
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, -5, NULL), LOCK_ERR);
    redisReply *r = T_CMD(rc, "EXISTS %s", key);
    T_ASSERT(r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer == 0);
    freeReplyObject(r);
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, NULL), LOCK_OK);
    T_EQ_I64(lock_release(rc, key, OWNER_A, 0, NULL), LOCK_ERR);
    T_EQ_I64(lock_release_ex(rc, key, OWNER_A, LEASE, NULL, NULL), LOCK_ERR);
    memset(&rq, 0, sizeof rq);                    /* not initialised: no request id */
    T_EQ_I64(lock_release_ex(rc, key, OWNER_A, LEASE, &rq, NULL), LOCK_ERR);
    r = T_CMD(rc, "HGET %s %s", key, OWNER_A);                /* still held, once */
    T_ASSERT(r != NULL && r->type == REDIS_REPLY_STRING && strcmp(r->str, "1") == 0);
    freeReplyObject(r);
    T_EQ_I64(lock_release(rc, key, OWNER_A, LEASE, NULL), LOCK_OK);
    del_lock(key);
}

static void test_dead_connection_is_err(void)
{
    char key[256];
    lock_counters a, b;
    key_for("dead", key, sizeof key);
    redisContext *c = t_redis();
    /* kill our own connection from the server side */
    redisReply *r = T_CMD(c, "CLIENT ID");
    long long id = r != NULL && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    r = T_CMD(rc, "CLIENT KILL ID %lld", id);
    freeReplyObject(r);
    lock_counters_get(&a);
    T_EQ_I64(lock_try_acquire(c, key, OWNER_A, LEASE, NULL), LOCK_ERR);
    T_ASSERT(c->err != 0);
    lock_counters_get(&b);
    T_EQ_I64(b.errors - a.errors, 1);
    redisFree(c);
    del_lock(key);
}

static void test_release_same_request_twice(void)
{
    char key[256], latch[512];
    lock_release_req rq1, rq2, rq3;
    lock_counters a, b;
    long left = -1;
    key_for("idempotent", key, sizeof key);

    lock_counters_get(&a);
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, NULL), LOCK_OK);
    T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, NULL), LOCK_OK);

    /* an inner release, sent twice: the count drops once */
    lock_release_req_init(&rq1);
    T_EQ_I64(lock_release_ex(rc, key, OWNER_A, LEASE, &rq1, &left), LOCK_OK);
    T_EQ_I64(left, 1);
    left = -1;
    T_EQ_I64(lock_release_ex(rc, key, OWNER_A, LEASE, &rq1, &left), LOCK_OK);
    T_EQ_I64(left, 1);
    T_EQ_I64(hget_count(key, OWNER_A), 1);

    /* the final release, sent twice: the retry is not "not owner" */
    lock_release_req_init(&rq2);
    T_ASSERT(strcmp(rq1.id, rq2.id) != 0);
    T_EQ_I64(lock_release_ex(rc, key, OWNER_A, LEASE, &rq2, &left), LOCK_OK);
    T_EQ_I64(left, 0);
    T_EQ_I64(exists(key), 0);
    left = -1;
    T_EQ_I64(lock_release_ex(rc, key, OWNER_A, LEASE, &rq2, &left), LOCK_OK);
    T_EQ_I64(left, 0);

    /* the latch is Redisson's name, short-lived */
    snprintf(latch, sizeof latch, "redisson_unlock_latch:{%s}:%s", key, rq2.id);
    long long t = pttl(latch);
    T_ASSERT(t > 0 && t <= 5000);

    /* a new request of a non-holder is still refused */
    lock_release_req_init(&rq3);
    T_EQ_I64(lock_release_ex(rc, key, OWNER_A, LEASE, &rq3, NULL), LOCK_NOT_OWNER);
    lock_counters_get(&b);
    T_EQ_I64(b.released - a.released, 4);
    T_EQ_I64(b.not_owner - a.not_owner, 1);
    del_lock(key);
}

/* A real lost reply: the server is paused for writes, so the client times
 * out with the release queued; the release runs when the pause ends, and
 * the retry on a fresh connection gets its result. */
static void test_release_retry_after_lost_reply(void)
{
    char key[256];
    lock_release_req rq;
    lock_counters a, b;
    struct timeval short_tv = {0, 100000};
    long left = -1;
    redisContext *c1 = NULL, *c2 = NULL;
    key_for("lostreply", key, sizeof key);

    if (!T_EQ_I64(lock_try_acquire(rc, key, OWNER_A, LEASE, NULL), LOCK_OK))
        goto cleanup;
    c1 = t_redis();
    redisSetTimeout(c1, short_tv);
    lock_counters_get(&a);
    lock_release_req_init(&rq);
    redisReply *r = T_CMD(rc, "CLIENT PAUSE 400 WRITE");
    freeReplyObject(r);
    T_EQ_I64(lock_release_ex(c1, key, OWNER_A, LEASE, &rq, &left), LOCK_ERR);
    T_ASSERT(c1->err != 0);
    t_sleep_ms(600);                  /* the pause is over: the release ran */
    T_EQ_I64(exists(key), 0);

    c2 = t_redis();
    T_EQ_I64(lock_release_ex(c2, key, OWNER_A, LEASE, &rq, &left), LOCK_OK);
    T_EQ_I64(left, 0);
    lock_counters_get(&b);
    T_EQ_I64(b.not_owner - a.not_owner, 0);
cleanup:
    redisFree(c1);
    redisFree(c2);
    del_lock(key);
}

/* An id INCR and an acquire in one round trip, also when the script cache
 * is empty: the acquire's EVAL fallback must not swallow the INCR's reply,
 * and the connection stays in step for the next command. */
static void test_pipelined_acquire_with_id(void)
{
    char key[256];
    lock_acquire_op aop;
    order_id_op iop;
    lock_grant g = { -1, -1 };
    int64_t id = -1, id2 = -1;
    long left = -1;
    key_for("pipelined", key, sizeof key);

    for (int flush = 0; flush < 2; flush++) {
        if (flush) {
            redisReply *r = T_CMD(rc, "SCRIPT FLUSH");
            freeReplyObject(r);
        }
        T_EQ_I64(order_id_send(rc, "tlockpipe", (int64_t)time(NULL), &iop), ORDER_ID_OK);
        T_EQ_I64(lock_acquire_send(rc, &aop, key, OWNER_A, LEASE), LOCK_OK);
        T_EQ_I64(order_id_recv(rc, &iop, flush ? &id2 : &id), ORDER_ID_OK);
        T_EQ_I64(lock_acquire_recv(rc, &aop, &g), LOCK_OK);
        T_ASSERT(g.token >= 1);
        T_EQ_I64(hget_count(key, OWNER_A), flush + 1);
    }
    T_ASSERT(id > 0 && (id2 & 0xffffffffLL) == (id & 0xffffffffLL) + 1);   /* next count */
    /* A busy lock behind an INCR: the INCR still answers. */
    T_EQ_I64(order_id_send(rc, "tlockpipe", (int64_t)time(NULL), &iop), ORDER_ID_OK);
    T_EQ_I64(lock_acquire_send(rc, &aop, key, OWNER_B, LEASE), LOCK_OK);
    T_EQ_I64(order_id_recv(rc, &iop, &id), ORDER_ID_OK);
    T_EQ_I64(lock_acquire_recv(rc, &aop, &g), LOCK_BUSY);
    T_ASSERT(g.ttl_ms > 0 && g.ttl_ms <= LEASE);
    redisReply *r = T_CMD(rc, "PING");
    T_ASSERT(r != NULL && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0);
    freeReplyObject(r);
    T_EQ_I64(lock_release(rc, key, OWNER_A, LEASE, &left), LOCK_OK);
    T_EQ_I64(lock_release(rc, key, OWNER_A, LEASE, &left), LOCK_OK);
    T_EQ_I64(left, 0);
    del_lock(key);
    char icr[64];
    order_id_key("tlockpipe", (int64_t)time(NULL), icr, sizeof icr);
    r = T_CMD(rc, "DEL %s", icr);
    freeReplyObject(r);
}

/* A batch's releases in one round trip: each gets its own outcome, a
 * non-holder changes nothing, an empty script cache is recovered, and a
 * retry of the same request returns the first result. */
static void test_release_many(void)
{
    char k1[256], k2[256], k3[256];
    lock_release_req rq[3];
    lock_release_item it[3];
    long left = -1;
    key_for("many1", k1, sizeof k1);
    key_for("many2", k2, sizeof k2);
    key_for("many3", k3, sizeof k3);

    for (int flush = 0; flush < 2; flush++) {
        T_EQ_I64(lock_try_acquire(rc, k1, OWNER_A, LEASE, NULL), LOCK_OK);
        T_EQ_I64(lock_try_acquire(rc, k2, OWNER_B, LEASE, NULL), LOCK_OK);
        T_EQ_I64(lock_try_acquire(rc, k2, OWNER_B, LEASE, NULL), LOCK_OK);   /* depth 2 */
        T_EQ_I64(lock_try_acquire(rc, k3, OWNER_C, LEASE, NULL), LOCK_OK);
        if (flush) {
            redisReply *r = T_CMD(rc, "SCRIPT FLUSH");
            freeReplyObject(r);
        }
        for (int i = 0; i < 3; i++)
            lock_release_req_init(&rq[i]);
        it[0] = (lock_release_item){ .key = k1, .owner = OWNER_A, .lease_ms = LEASE, .rq = &rq[0] };
        it[1] = (lock_release_item){ .key = k2, .owner = OWNER_B, .lease_ms = LEASE, .rq = &rq[1] };
        it[2] = (lock_release_item){ .key = k3, .owner = OWNER_A, .lease_ms = LEASE, .rq = &rq[2] };
        lock_release_many(rc, it, 3);
        T_EQ_I64(it[0].st, LOCK_OK);
        T_EQ_I64(it[1].st, LOCK_OK);
        T_EQ_I64(it[2].st, LOCK_NOT_OWNER);
        T_EQ_I64(exists(k1), 0);
        T_EQ_I64(hget_count(k2, OWNER_B), 1);
        T_EQ_I64(hget_count(k3, OWNER_C), 1);
        /* The same request again: the latch answers, nothing is released twice. */
        T_EQ_I64(lock_release_ex(rc, k2, OWNER_B, LEASE, &rq[1], &left), LOCK_OK);
        T_EQ_I64(left, 1);
        T_EQ_I64(hget_count(k2, OWNER_B), 1);
        T_EQ_I64(lock_release(rc, k2, OWNER_B, LEASE, &left), LOCK_OK);
        T_EQ_I64(lock_release(rc, k3, OWNER_C, LEASE, &left), LOCK_OK);
        T_EQ_I64(exists(k2) + exists(k3), 0);
    }
    lock_release_many(rc, it, 0);           /* nothing to do, nothing sent */
    redisReply *r = T_CMD(rc, "PING");
    T_ASSERT(r != NULL && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0);
    freeReplyObject(r);
    del_lock(k1);
    del_lock(k2);
    del_lock(k3);
}

/* A batch's attempts in one round trip behind their ids' INCRs: each its
 * own outcome (a grant with its token, a busy key, the same key twice: the
 * second owner is refused), also with an empty script cache, and the
 * connection stays in step. */
static void test_acquire_many(void)
{
    char k1[256], k2[256];
    lock_acquire_op ops[3];
    lock_grant g[3];
    lock_status st[3];
    order_id_op iop[3];
    int64_t ids[3];
    key_for("amany1", k1, sizeof k1);
    key_for("amany2", k2, sizeof k2);

    for (int flush = 0; flush < 2; flush++) {
        T_EQ_I64(lock_try_acquire(rc, k2, OWNER_C, LEASE, NULL), LOCK_OK);   /* busy */
        if (flush) {
            redisReply *r = T_CMD(rc, "SCRIPT FLUSH");
            freeReplyObject(r);
        }
        for (int i = 0; i < 3; i++)
            T_EQ_I64(order_id_send(rc, "tlockmany", (int64_t)time(NULL), &iop[i]), ORDER_ID_OK);
        T_EQ_I64(lock_acquire_send(rc, &ops[0], k1, OWNER_A, LEASE), LOCK_OK);
        T_EQ_I64(lock_acquire_send(rc, &ops[1], k2, OWNER_A, LEASE), LOCK_OK);
        T_EQ_I64(lock_acquire_send(rc, &ops[2], k1, OWNER_B, LEASE), LOCK_OK);
        for (int i = 0; i < 3; i++)
            T_EQ_I64(order_id_recv(rc, &iop[i], &ids[i]), ORDER_ID_OK);
        T_ASSERT(ids[0] < ids[1] && ids[1] < ids[2]);
        lock_acquire_recv_many(rc, ops, 3, g, st);
        T_EQ_I64(st[0], LOCK_OK);
        T_ASSERT(g[0].token >= 1);
        T_EQ_I64(st[1], LOCK_BUSY);
        T_ASSERT(g[1].ttl_ms > 0 && g[1].ttl_ms <= LEASE);
        T_EQ_I64(st[2], LOCK_BUSY);
        T_EQ_I64(hget_count(k1, OWNER_A), 1);
        T_EQ_I64(hget_count(k2, OWNER_C), 1);
        redisReply *r = T_CMD(rc, "PING");
        T_ASSERT(r != NULL && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0);
        freeReplyObject(r);
        T_EQ_I64(lock_release(rc, k1, OWNER_A, LEASE, NULL), LOCK_OK);
        T_EQ_I64(lock_release(rc, k2, OWNER_C, LEASE, NULL), LOCK_OK);
    }
    lock_acquire_recv_many(rc, ops, 0, g, st);     /* nothing to do, nothing read */
    del_lock(k1);
    del_lock(k2);
    char icr[64];
    order_id_key("tlockmany", (int64_t)time(NULL), icr, sizeof icr);
    redisReply *r = T_CMD(rc, "DEL %s", icr);
    freeReplyObject(r);
}


/* LOCK_SYNC_REPLICAS against a Redis with no replica: WAIT answers 0, so
 * every grant is undone. A new hold leaves no key; a reentrant one goes
 * back to its earlier count with its lease; a busy answer changes nothing
 * (its pipelined WAIT is read and ignored); in a pipelined batch one WAIT
 * covers every attempt. The counters say so. */
static void test_sync_undoes_unacknowledged_grants(void)
{
    char k1[256], k2[256];
    lock_acquire_op ops[2];
    lock_grant g[2];
    lock_status st[2];
    lock_counters before, after;
    double t0;
    key_for("sync1", k1, sizeof k1);
    key_for("sync2", k2, sizeof k2);

    T_EQ_I64(lock_try_acquire(rc, k1, OWNER_A, LEASE, NULL), LOCK_OK);   /* before sync */
    lock_counters_get(&before);
    lock_sync_set(1, 50);
    t0 = t_now_ms();
    T_EQ_I64(lock_try_acquire(rc, k2, OWNER_A, LEASE, NULL), LOCK_UNSYNCED);
    T_ASSERT(t_now_ms() - t0 >= 45);                       /* WAIT waited its timeout */
    T_EQ_I64(exists(k2), 0);                               /* undone: no lock left */
    T_EQ_I64(lock_try_acquire(rc, k1, OWNER_A, LEASE, NULL), LOCK_UNSYNCED);   /* reentry */
    T_EQ_I64(hget_count(k1, OWNER_A), 1);                  /* the earlier hold stays */
    T_ASSERT(pttl(k1) > 0);
    T_EQ_I64(lock_try_acquire(rc, k1, OWNER_B, LEASE, NULL), LOCK_BUSY);
    /* A batch: one grant (k2) and one busy (k1), one WAIT for both. */
    T_EQ_I64(lock_acquire_send(rc, &ops[0], k2, OWNER_B, LEASE), LOCK_OK);
    T_EQ_I64(lock_acquire_send(rc, &ops[1], k1, OWNER_B, LEASE), LOCK_OK);
    lock_sync_send(rc, ops, 2);
    T_ASSERT(ops[1].wait_follows && !ops[0].wait_follows);
    lock_acquire_recv_many(rc, ops, 2, g, st);
    T_EQ_I64(st[0], LOCK_UNSYNCED);
    T_EQ_I64(st[1], LOCK_BUSY);
    T_EQ_I64(exists(k2), 0);
    redisReply *r = T_CMD(rc, "PING");                     /* the connection is in step */
    T_ASSERT(r != NULL && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0);
    freeReplyObject(r);
    lock_counters_get(&after);
    T_EQ_I64(after.unsynced - before.unsynced, 3);
    T_EQ_I64(after.sync_waits - before.sync_waits, 4);     /* one per attempt or batch */
    T_EQ_I64(after.acquired - before.acquired, 0);
    /* WAIT 0 (no replica needed) grants at once. */
    lock_sync_set(0, 0);
    T_EQ_I64(lock_try_acquire(rc, k2, OWNER_A, LEASE, NULL), LOCK_OK);
    T_EQ_I64(lock_release(rc, k2, OWNER_A, LEASE, NULL), LOCK_OK);
    T_EQ_I64(lock_release(rc, k1, OWNER_A, LEASE, NULL), LOCK_OK);
    del_lock(k1);
    del_lock(k2);
}

/* A NOSCRIPT answer with a WAIT behind it: the WAIT's reply is read first,
 * the acquire re-sent with EVAL, and a WAIT of its own counts that grant. */
static void test_sync_after_noscript(void)
{
    char k[256];
    key_for("syncnoscript", k, sizeof k);
    redisReply *r = T_CMD(rc, "SCRIPT FLUSH");
    freeReplyObject(r);
    lock_sync_set(1, 30);
    T_EQ_I64(lock_try_acquire(rc, k, OWNER_A, LEASE, NULL), LOCK_UNSYNCED);
    lock_sync_set(0, 0);
    T_EQ_I64(exists(k), 0);
    r = T_CMD(rc, "PING");
    T_ASSERT(r != NULL && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0);
    freeReplyObject(r);
    del_lock(k);
}

/* A READONLY reply (the server became a replica while the connection was
 * open) is a failed connection: NULL, c->err set, the caller reconnects. */
static void test_readonly_is_a_failed_connection(void)
{
    redisContext *c = t_redis();
    redisReply *r = malloc(sizeof *r);
    char *msg = strdup("READONLY You can't write against a read only replica.");

    if (!T_ASSERT(c != NULL && r != NULL && msg != NULL))
        return;
    memset(r, 0, sizeof *r);
    r->type = REDIS_REPLY_ERROR;
    r->str = msg;
    r->len = strlen(msg);
    T_ASSERT(script_demoted(c, r) == NULL);                 /* freed */
    T_EQ_I64(c->err, REDIS_ERR_OTHER);
    T_ASSERT(strncmp(c->errstr, "READONLY", 8) == 0);
    redisFree(c);
    c = t_redis();
    r = T_CMD(c, "GET nonexistent:%d", 1);                  /* other replies pass */
    T_ASSERT(script_demoted(c, r) == r && c->err == 0);
    freeReplyObject(r);
    redisFree(c);
}

int main(void)
{
    char err[256];
    rc = t_redis();
    if (script_load_all(t_lua_dir(), err, sizeof err) != 0) {
        fprintf(stderr, "script_load_all: %s\n", err);
        redisFree(rc);
        return 2;
    }
    T_RUN(test_layout_and_names);
    T_RUN(test_reentry_three_deep);
    T_RUN(test_non_owner_release_changes_nothing);
    T_RUN(test_release_publishes_zero);
    T_RUN(test_contention_returns_ttl);
    T_RUN(test_reentry_resets_ttl);
    T_RUN(test_lease_expiry_then_other_owner);
    T_RUN(test_fencing_tokens_increase);
    T_RUN(test_fencing_token_counter_rolled_back);
    T_RUN(test_fencing_token_counter_expires);
    T_RUN(test_late_acquire_refused);
    T_RUN(test_noscript_recovery);
    T_RUN(test_script_sha_matches_server);
    T_RUN(test_counters_and_errors);
    T_RUN(test_bad_arguments_refused);
    T_RUN(test_dead_connection_is_err);
    T_RUN(test_release_same_request_twice);
    T_RUN(test_release_retry_after_lost_reply);
    T_RUN(test_pipelined_acquire_with_id);
    T_RUN(test_release_many);
    T_RUN(test_acquire_many);
    T_RUN(test_sync_undoes_unacknowledged_grants);
    T_RUN(test_sync_after_noscript);
    T_RUN(test_readonly_is_a_failed_connection);
    redisFree(rc);
    return t_done();
}
