/* sentinel: the master's address from Redis Sentinel, and a thread that
 * follows it across failovers. */
#include "sentinel.h"
#include "bgthread.h"
#include "config.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <hiredis/hiredis.h>

#define ASK_PERIOD_MS   1000   /* the follower asks this often anyway */
#define ASK_MIN_GAP_MS  50     /* and at most this often when told to */
#define RETRY_SUB_MS    1000   /* a lost subscription is tried again after this */
#define SWITCH_CHANNEL  "+switch-master"

/* The master as known now. mu guards every field; gen is also readable
 * without it. */
static struct {
    pthread_mutex_t mu;
    char host[256];
    int port;
    uint64_t changes;          /* master changes seen after the first address */
    int ask_now;               /* a connection reported the master failing */
    int current;               /* index of the Sentinel the follower talks to */
    int efd;                   /* wakes the follower: a suspect, or stop */
} st = { .mu = PTHREAD_MUTEX_INITIALIZER, .efd = -1 };

static bgthread follower = BGTHREAD_INIT;

static _Atomic uint64_t gen;
static atomic_uint_fast64_t n_notices, n_queries, n_query_errors;

int sentinel_enabled(void)
{
    return g_cfg.n_sentinels > 0;
}

static void count(atomic_uint_fast64_t *c)
{
    atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

/* Records host:port as the master ('why': where it was learnt). */
static void set_master(const char *host, int port, const char *why)
{
    pthread_mutex_lock(&st.mu);
    if (port == st.port && strcmp(host, st.host) == 0) {
        pthread_mutex_unlock(&st.mu);
        return;
    }
    if (st.port != 0) {
        st.changes++;
        log_warn("redis: the master '%s' is now %s:%d (was %s:%d; %s): every connection "
                 "moves to it", g_cfg.master_name, host, port, st.host, st.port, why);
    } else {
        log_info("redis: master '%s' at %s:%d (%s)", g_cfg.master_name, host, port, why);
    }
    snprintf(st.host, sizeof st.host, "%s", host);
    st.port = port;
    atomic_fetch_add(&gen, 1);
    pthread_mutex_unlock(&st.mu);
}

static redisContext *connect_sentinel(int i, char *err, size_t errlen)
{
    const sentinel_addr *s = &g_cfg.sentinels[i];
    int ms = g_cfg.redis_timeout_ms;
    struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
    redisContext *c = redisConnectWithTimeout(s->host, s->port, tv);

    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (c->err || redisSetTimeout(c, tv) != REDIS_OK) {
        snprintf(err, errlen, "%s", c->errstr);
        redisFree(c);
        return NULL;
    }
    return c;
}

/* SENTINEL get-master-addr-by-name on 'c'. 1: the address is in host/port;
 * 0: this Sentinel knows no such master; -1: no usable answer (c->err set
 * when the connection failed). 'err' says why when not 1. */
static int ask(redisContext *c, char *host, size_t n, int *port, char *err, size_t errlen)
{
    redisReply *r = redisCommand(c, "SENTINEL get-master-addr-by-name %s", g_cfg.master_name);
    int rc = -1;

    count(&n_queries);
    if (r == NULL) {
        snprintf(err, errlen, "%s", c->errstr);
    } else if (r->type == REDIS_REPLY_NIL) {
        snprintf(err, errlen, "knows no master named '%s'", g_cfg.master_name);
        rc = 0;
    } else if (r->type == REDIS_REPLY_ERROR) {
        snprintf(err, errlen, "%s", r->str);
    } else if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
               r->element[0]->type != REDIS_REPLY_STRING ||
               r->element[1]->type != REDIS_REPLY_STRING) {
        snprintf(err, errlen, "unexpected reply (type %d)", r->type);
    } else {
        char *end;
        long p = strtol(r->element[1]->str, &end, 10);
        if (*end != '\0' || p < 1 || p > 65535 || r->element[0]->len == 0 ||
            r->element[0]->len >= n) {
            snprintf(err, errlen, "bad address %s:%s", r->element[0]->str, r->element[1]->str);
        } else {
            memcpy(host, r->element[0]->str, r->element[0]->len + 1);
            *port = (int)p;
            rc = 1;
        }
    }
    freeReplyObject(r);
    return rc;
}

/*---- the follower thread ----*/

/* Subscribes to +switch-master on Sentinel i. NULL when it cannot. */
static redisContext *subscribe(int i)
{
    char err[256];
    redisContext *c = connect_sentinel(i, err, sizeof err);
    redisReply *r;

    if (c == NULL)
        return NULL;
    r = redisCommand(c, "SUBSCRIBE %s", SWITCH_CHANNEL);
    if (r == NULL || r->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(r);
        redisFree(c);
        return NULL;
    }
    freeReplyObject(r);
    return c;
}

/* "+switch-master <name> <old ip> <old port> <new ip> <new port>". */
static void on_notice(const redisReply *r)
{
    char name[128], old_ip[256], new_ip[256];
    int old_port, new_port;

    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[0]->type != REDIS_REPLY_STRING || strcmp(r->element[0]->str, "message") != 0 ||
        r->element[2]->type != REDIS_REPLY_STRING)
        return;
    if (sscanf(r->element[2]->str, "%127s %255s %d %255s %d", name, old_ip, &old_port, new_ip,
               &new_port) != 5 || strcmp(name, g_cfg.master_name) != 0)
        return;
    count(&n_notices);
    set_master(new_ip, new_port, SWITCH_CHANNEL);
}

/* Asks the current Sentinel, then the next ones, until one answers.
 * '*cmd' is the command connection to Sentinel st.current (kept between
 * calls); a failing Sentinel's connections are dropped ('*sub' too). */
static void query(redisContext **cmd, redisContext **sub)
{
    static int failing;                /* said once until a Sentinel answers again */
    char host[256], err[256] = "";
    int port, i = st.current;

    for (int tried = 0; tried < g_cfg.n_sentinels; tried++) {
        if (*cmd == NULL && (*cmd = connect_sentinel(i, err, sizeof err)) == NULL)
            log_debug("redis sentinel %s:%d: %s", g_cfg.sentinels[i].host,
                      g_cfg.sentinels[i].port, err);
        if (*cmd != NULL) {
            int rc = ask(*cmd, host, sizeof host, &port, err, sizeof err);
            if (rc == 1) {
                st.current = i;
                if (failing)
                    log_info("redis: a Sentinel answers again (%s:%d)", g_cfg.sentinels[i].host,
                             g_cfg.sentinels[i].port);
                failing = 0;
                set_master(host, port, "asked a Sentinel");
                return;
            }
            log_debug("redis sentinel %s:%d: %s", g_cfg.sentinels[i].host,
                      g_cfg.sentinels[i].port, err);
            redisFree(*cmd);
            *cmd = NULL;
        }
        if (*sub != NULL) {                 /* the same Sentinel: move both */
            redisFree(*sub);
            *sub = NULL;
        }
        i = (i + 1) % g_cfg.n_sentinels;
        st.current = i;
    }
    count(&n_query_errors);
    if (!failing)
        log_warn("redis: no Sentinel answered where the master '%s' is (last: %s); keeping "
                 "%s:%d and asking every second", g_cfg.master_name, err, st.host, st.port);
    failing = 1;
}

static int64_t ms_now(void)
{
    return util_mono_us() / 1000;
}

static void follow_main(bgthread *self, void *arg)
{
    redisContext *cmd = NULL, *sub = NULL;
    int64_t next_ask = ms_now() + ASK_PERIOD_MS, last_ask = 0, next_sub = 0;

    (void)arg;
    while (!bgthread_stopping(self)) {
        int64_t now = ms_now();
        int want;

        pthread_mutex_lock(&st.mu);
        want = st.ask_now;
        pthread_mutex_unlock(&st.mu);
        if (sub == NULL && now >= next_sub) {
            sub = subscribe(st.current);
            next_sub = now + RETRY_SUB_MS;
        }
        if (now >= next_ask || (want && now - last_ask >= ASK_MIN_GAP_MS)) {
            pthread_mutex_lock(&st.mu);
            st.ask_now = 0;
            pthread_mutex_unlock(&st.mu);
            query(&cmd, &sub);
            last_ask = now = ms_now();
            next_ask = now + ASK_PERIOD_MS;
            continue;
        }

        int64_t wake = next_ask;
        if (want && last_ask + ASK_MIN_GAP_MS < wake)
            wake = last_ask + ASK_MIN_GAP_MS;
        if (sub == NULL && next_sub < wake)
            wake = next_sub;
        struct pollfd p[2] = { { .fd = st.efd, .events = POLLIN },
                               { .fd = sub != NULL ? sub->fd : -1, .events = POLLIN } };
        int n = poll(p, 2, wake > now ? (int)(wake - now) : 0);
        if (n < 0 && errno != EINTR) {
            log_warn("redis sentinel: poll: %s", strerror(errno));
            continue;
        }
        if (n > 0 && (p[0].revents & POLLIN)) {
            uint64_t v;
            if (read(st.efd, &v, sizeof v) < 0 && errno != EAGAIN)
                log_warn("redis sentinel: eventfd: %s", strerror(errno));
        }
        if (n > 0 && sub != NULL && p[1].revents != 0) {
            void *reply = NULL;
            int ok = redisBufferRead(sub) == REDIS_OK;
            while (ok && (ok = redisGetReplyFromReader(sub, &reply) == REDIS_OK) && reply != NULL) {
                on_notice(reply);
                freeReplyObject(reply);
                reply = NULL;
            }
            if (!ok) {
                log_info("redis sentinel: subscription lost (%s); asking again",
                         sub->err ? sub->errstr : "protocol error");
                redisFree(sub);
                sub = NULL;
                next_ask = ms_now();        /* we may have missed a notice */
            }
        }
    }
    if (sub != NULL)
        redisFree(sub);
    if (cmd != NULL)
        redisFree(cmd);
}

static void wake(void)
{
    uint64_t one = 1;

    if (st.efd >= 0 && write(st.efd, &one, sizeof one) < 0 && errno != EAGAIN)
        log_warn("redis sentinel: eventfd: %s", strerror(errno));
}

/* bgthread_stop's wake: the follower blocks in poll() on st.efd. */
static void follower_wake(void *arg)
{
    (void)arg;
    wake();
}

/*---- API ----*/

/* Logs why sentinel_start failed; 'err' says what each Sentinel answered. */
static sentinel_start_status start_failed(sentinel_start_status why, const char *err)
{
    switch (why) {
    case SENTINEL_UNKNOWN_MASTER:
        log_error("REDIS_SENTINELS: no Sentinel knows a master named '%s' (REDIS_MASTER_NAME): %s",
                  g_cfg.master_name, err);
        break;
    case SENTINEL_UNREACHABLE:
        log_error("REDIS_SENTINELS: no Sentinel answered (%s): %s", g_cfg.sentinels_text, err);
        break;
    default:
        log_error("REDIS_SENTINELS: %s", err);
        break;
    }
    return why;
}

sentinel_start_status sentinel_start(void)
{
    char err[1024];
    size_t used = 0, errlen = sizeof err;
    int unknown = 0;

    if (!sentinel_enabled())
        return SENTINEL_STARTED;
    err[0] = '\0';
    for (int i = 0; i < g_cfg.n_sentinels; i++) {
        char why[256], host[256];
        int port, rc = -1;
        redisContext *c = connect_sentinel(i, why, sizeof why);

        if (c != NULL) {
            rc = ask(c, host, sizeof host, &port, why, sizeof why);
            redisFree(c);
            if (rc == 1) {
                st.current = i;
                set_master(host, port, "asked a Sentinel at start");
                break;
            }
            unknown += rc == 0;
        }
        if (used < errlen) {
            int w = snprintf(err + used, errlen - used, "%s%s:%d: %s", used ? "; " : "",
                             g_cfg.sentinels[i].host, g_cfg.sentinels[i].port, why);
            used += w > 0 ? (size_t)w : 0;
        }
    }
    if (atomic_load(&gen) == 0)
        return start_failed(unknown ? SENTINEL_UNKNOWN_MASTER : SENTINEL_UNREACHABLE, err);

    st.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (st.efd < 0) {
        snprintf(err, errlen, "eventfd: %s", strerror(errno));
        return start_failed(SENTINEL_NO_THREAD, err);
    }
    if (bgthread_start(&follower, "sk-sentinel", follow_main, NULL, follower_wake) != 0) {
        snprintf(err, errlen, "cannot start the Sentinel follower thread");
        close(st.efd);
        st.efd = -1;
        return start_failed(SENTINEL_NO_THREAD, err);
    }
    return SENTINEL_STARTED;
}

void sentinel_stop(void)
{
    if (!bgthread_started(&follower))
        return;
    bgthread_stop(&follower);
    close(st.efd);
    st.efd = -1;
}

uint64_t sentinel_master(char *host, size_t n, int *port)
{
    uint64_t g;

    pthread_mutex_lock(&st.mu);
    snprintf(host, n, "%s", st.host);
    *port = st.port;
    g = atomic_load(&gen);
    pthread_mutex_unlock(&st.mu);
    return g;
}

uint64_t sentinel_generation(void)
{
    return atomic_load_explicit(&gen, memory_order_acquire);
}

void sentinel_suspect(const char *host, int port)
{
    int ask_now = 0;

    if (!sentinel_enabled())
        return;
    pthread_mutex_lock(&st.mu);
    if (host != NULL && port == st.port && strcmp(host, st.host) == 0 && !st.ask_now) {
        st.ask_now = 1;
        ask_now = 1;
    }
    pthread_mutex_unlock(&st.mu);
    if (ask_now)
        wake();
}

void sentinel_view_get(sentinel_view *v)
{
    pthread_mutex_lock(&st.mu);
    if (st.port != 0)
        snprintf(v->master, sizeof v->master, "%s:%d", st.host, st.port);
    else
        v->master[0] = '\0';
    v->failovers = st.changes;
    pthread_mutex_unlock(&st.mu);
    v->switch_notices = atomic_load_explicit(&n_notices, memory_order_relaxed);
    v->queries = atomic_load_explicit(&n_queries, memory_order_relaxed);
    v->query_errors = atomic_load_explicit(&n_query_errors, memory_order_relaxed);
}
