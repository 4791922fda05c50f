/* user_lock_demo: the demo ladder's lock strategies (none, local, setnx,
 * owner). Each is a broken step of the ladder, kept runnable so that a load
 * test shows its failure as numbers; none gives fencing tokens. Their
 * figures go to counters (the lock library counts its own). */
#include "user_lock.h"
#include "config.h"
#include "counters.h"
#include "script.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define UNAVAILABLE "redis unavailable, retry later"

/*---- none: no lock at all ----*/

static lock_status none_acquire(conn_set *cs, user_lock_hold *h, user_lock_id *id)
{
    (void)cs;
    (void)h;
    (void)id;
    return LOCK_OK;
}

static void none_release(conn_set *cs, user_lock_hold *h)
{
    (void)cs;
    (void)h;
}

const user_lock_backend user_lock_none = {
    .name = "none",
    .unavailable = UNAVAILABLE,
    .acquire = none_acquire,
    .release = none_release,
};

/*---- local: an in-process mutex per user, striped. Correct on one
 * instance, useless across two behind nginx: that is what it shows. ----*/

#define LOCAL_STRIPES 1024
static pthread_mutex_t local_locks[LOCAL_STRIPES];
static pthread_once_t local_once = PTHREAD_ONCE_INIT;

static void local_init(void)
{
    for (int i = 0; i < LOCAL_STRIPES; i++)
        pthread_mutex_init(&local_locks[i], NULL);
}

static pthread_mutex_t *local_lock_of(int64_t user_id)
{
    pthread_once(&local_once, local_init);
    return &local_locks[(uint64_t)user_id * 0x9e3779b97f4a7c15ULL >> 54];
}

/* Blocking, like Java's synchronized: the second request of the user
 * waits, then finds the first one's order. */
static lock_status local_acquire(conn_set *cs, user_lock_hold *h, user_lock_id *id)
{
    (void)cs;
    (void)id;
    pthread_mutex_lock(local_lock_of(h->user_id));
    counters_note(COUNTERS_DEMO_LOCK_ACQUIRED);
    return LOCK_OK;
}

static void local_release(conn_set *cs, user_lock_hold *h)
{
    (void)cs;
    pthread_mutex_unlock(local_lock_of(h->user_id));
    counters_note(COUNTERS_DEMO_LOCK_RELEASED);
}

const user_lock_backend user_lock_local = {
    .name = "local",
    .thread_bound = 1,            /* a mutex is unlocked by the thread that locked it */
    .unavailable = UNAVAILABLE,
    .acquire = local_acquire,
    .release = local_release,
};

/*---- setnx and owner: a Redis string with a lease ----*/

/* These locks have no watchdog: in watchdog mode they get its lease. */
static long plain_lease_ms(const user_lock_hold *h)
{
    return h->lease_ms > 0 ? h->lease_ms : g_cfg.watchdog_timeout_ms;
}

/* setnx: SET NX EX, whole seconds; owner: SET NX PX with our owner id. */
static lock_status string_acquire(conn_set *cs, user_lock_hold *h, int setnx)
{
    redisContext *c = cs->redis;
    long lease = plain_lease_ms(h);
    redisReply *r;
    lock_status st;

    if (setnx)
        r = redisCommand(c, "SET %s %s NX EX %ld", h->key, h->owner, (lease + 999) / 1000);
    else
        r = redisCommand(c, "SET %s %s NX PX %ld", h->key, h->owner, lease);
    r = script_demoted(c, r);
    if (r == NULL || r->type == REDIS_REPLY_ERROR)
        st = LOCK_ERR;
    else
        st = r->type == REDIS_REPLY_NIL ? LOCK_BUSY : LOCK_OK;
    freeReplyObject(r);
    if (c->err)
        conn_redis_broken(cs);
    return counters_lock_attempt(st);
}

static lock_status setnx_acquire(conn_set *cs, user_lock_hold *h, user_lock_id *id)
{
    (void)id;
    return string_acquire(cs, h, 1);
}

/* The bug on show: DEL without an owner check. The GET before it is only
 * there to count the deletes of another holder's lock. */
static void setnx_release(conn_set *cs, user_lock_hold *h)
{
    redisContext *c = cs->redis;    /* NULL if it broke meanwhile: the lease frees it */
    redisReply *r;

    if (c == NULL)
        return;
    r = redisCommand(c, "GET %s", h->key);
    if (r != NULL && (r->type != REDIS_REPLY_STRING || strcmp(r->str, h->owner) != 0))
        counters_note(COUNTERS_DEMO_LOCK_NOT_OWNER);
    freeReplyObject(r);
    r = script_demoted(c, redisCommand(c, "DEL %s", h->key));
    if (r != NULL && r->type == REDIS_REPLY_INTEGER)
        counters_note(COUNTERS_DEMO_LOCK_RELEASED);
    freeReplyObject(r);
    if (c->err)
        conn_redis_broken(cs);
}

const user_lock_backend user_lock_setnx = {
    .name = "setnx",
    .unavailable = UNAVAILABLE,
    .acquire = setnx_acquire,
    .release = setnx_release,
};

/* owner: lua/owner_release.lua, a compare-and-delete. */
static script_file owner_release;

static int owner_start(char *err, size_t errlen)
{
    return script_file_load(&owner_release, g_cfg.lua_dir, "owner_release", err, errlen);
}

static lock_status owner_acquire(conn_set *cs, user_lock_hold *h, user_lock_id *id)
{
    (void)id;
    return string_acquire(cs, h, 0);
}

static void owner_release_hold(conn_set *cs, user_lock_hold *h)
{
    redisContext *c = cs->redis;
    const char *argv[2] = { h->key, h->owner };
    redisReply *r;

    if (c == NULL)
        return;
    r = script_file_run(c, &owner_release, 1, 2, argv, NULL);
    if (r != NULL && r->type == REDIS_REPLY_INTEGER)
        counters_note(r->integer == 1 ? COUNTERS_DEMO_LOCK_RELEASED : COUNTERS_DEMO_LOCK_NOT_OWNER);
    freeReplyObject(r);
    if (c->err)
        conn_redis_broken(cs);
}

const user_lock_backend user_lock_owner = {
    .name = "owner",
    .unavailable = UNAVAILABLE,
    .start = owner_start,
    .acquire = owner_acquire,
    .release = owner_release_hold,
};
