/* multi_lock: MultiLock and RedLock over independent Redis masters (multi_lock.h). */
#include "multi_lock.h"
#include "lock.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

/* A node whose connection failed is not tried again before this: a dead
 * or stalled node must not cost every attempt a connect or command timeout.
 * A connection the node closed after answering on it is the exception
 * (closed_after_answers()). */
#define RETRY_MS 250

typedef struct node_conn {
    redis_url node;
    redisContext *c;
    int answered;            /* c has had a reply (it worked before it broke) */
    int64_t retry_at_us;     /* monotonic; 0: may connect now */
} node_conn;

struct multi_lock_set {
    size_t n;
    int timeout_ms;
    node_conn conns[MULTI_LOCK_MAX_NODES];
};

multi_lock_set *multi_lock_set_new(const redis_url *nodes, size_t n, int timeout_ms)
{
    multi_lock_set *s;

    if (n == 0 || n > MULTI_LOCK_MAX_NODES || timeout_ms <= 0)
        return NULL;
    s = xcalloc(1, sizeof *s);
    s->n = n;
    s->timeout_ms = timeout_ms;
    for (size_t i = 0; i < n; i++)
        s->conns[i].node = nodes[i];
    return s;
}

void multi_lock_set_free(multi_lock_set *s)
{
    if (s == NULL)
        return;
    for (size_t i = 0; i < s->n; i++)
        if (s->conns[i].c != NULL)
            redisFree(s->conns[i].c);
    free(s);
}

size_t multi_lock_needed(multi_lock_quorum q, size_t n)
{
    return q == MULTI_LOCK_ALL ? n : n / 2 + 1;
}

long multi_lock_drift_ms(long lease_ms)
{
    return lease_ms / 100 + 2;
}

/* hiredis keeps an I/O error as strerror's text; strerror itself need not
 * be thread-safe, so the two texts are made once. */
static pthread_once_t texts_once = PTHREAD_ONCE_INIT;
static char reset_text[128], pipe_text[128], timeout_text[128];

static void texts_init(void)
{
    snprintf(reset_text, sizeof reset_text, "%s", strerror(ECONNRESET));
    snprintf(pipe_text, sizeof pipe_text, "%s", strerror(EPIPE));
    snprintf(timeout_text, sizeof timeout_text, "%s", strerror(EAGAIN));
}

/* The node did not answer within the timeout: it may be stalled or slow,
 * and may still run what was sent (a closed connection means a node that
 * is gone or refused it). */
static int timed_out(const redisContext *c)
{
    pthread_once(&texts_once, texts_init);
    return c->err == REDIS_ERR_IO && strcmp(c->errstr, timeout_text) == 0;
}

/* The node closed this connection (end of file, reset, broken pipe) after
 * it had answered on it: it restarted, or its process is gone. Either way a
 * new connect answers at once, so it is tried at the next call: after a
 * restart, each of a set's dead connections would otherwise cost one failed
 * attempt and a pause. A timeout (EAGAIN) means a stalled node, and a node
 * that closes new connections before any answer (maxclients, a proxy in
 * front of a dead node) would cost every attempt a connect: both keep the
 * pause. */
static int closed_after_answers(const node_conn *nc)
{
    const redisContext *c = nc->c;

    pthread_once(&texts_once, texts_init);
    return nc->answered &&
           (c->err == REDIS_ERR_EOF ||
            (c->err == REDIS_ERR_IO &&
             (strcmp(c->errstr, reset_text) == 0 || strcmp(c->errstr, pipe_text) == 0)));
}

static void drop(multi_lock_set *s, size_t i)
{
    node_conn *nc = &s->conns[i];
    int at_once = nc->c != NULL && closed_after_answers(nc);

    if (nc->c != NULL)
        redisFree(nc->c);
    nc->c = NULL;
    nc->answered = 0;
    nc->retry_at_us = at_once ? 0 : util_mono_us() + (int64_t)RETRY_MS * 1000;
}

static int reply_ok(redisContext *c, redisReply *r, char *err, size_t errlen, const char *what)
{
    int ok = r != NULL && r->type != REDIS_REPLY_ERROR;

    if (!ok)
        snprintf(err, errlen, "%s: %s", what,
                 r != NULL ? r->str : c->err ? c->errstr : "no reply");
    if (r != NULL)
        freeReplyObject(r);
    return ok;
}

/* Node i's connection, opened if need be; NULL while it is down (err says
 * why). 'now': try even within the reconnect pause (see multi_lock_release). */
static redisContext *conn(multi_lock_set *s, size_t i, int now, char *err, size_t errlen)
{
    node_conn *nc = &s->conns[i];
    struct timeval tv = { s->timeout_ms / 1000, (s->timeout_ms % 1000) * 1000 };
    redisContext *c;
    int rc = -1;

    if (nc->c != NULL && nc->c->err == 0)
        return nc->c;
    if (nc->c != NULL)
        drop(s, i);
    if (!now && util_mono_us() < nc->retry_at_us) {
        snprintf(err, errlen, "not retried yet after a failure");
        return NULL;
    }
    c = redisConnectWithTimeout(nc->node.host, nc->node.port, tv);
    if (c == NULL || c->err) {
        snprintf(err, errlen, "connect: %s", c != NULL ? c->errstr : "out of memory");
        goto out;
    }
    if (redisSetTimeout(c, tv) != REDIS_OK) {
        snprintf(err, errlen, "cannot set the timeout");
        goto out;
    }
    if (nc->node.password[0] != '\0') {
        redisReply *r = nc->node.username[0] != '\0'
                            ? redisCommand(c, "AUTH %s %s", nc->node.username, nc->node.password)
                            : redisCommand(c, "AUTH %s", nc->node.password);
        if (!reply_ok(c, r, err, errlen, "AUTH"))
            goto out;
    }
    if (nc->node.db != 0 && !reply_ok(c, redisCommand(c, "SELECT %d", nc->node.db), err, errlen,
                                      "SELECT"))
        goto out;
    nc->c = c;
    nc->retry_at_us = 0;
    rc = 0;
out:
    if (rc != 0) {
        if (c != NULL)
            redisFree(c);
        c = NULL;
        nc->retry_at_us = util_mono_us() + (int64_t)RETRY_MS * 1000;
    }
    return c;
}

/* Node i's answer to one attempt: LOCK_OK, LOCK_BUSY or LOCK_ERR (down,
 * not answering in time, or any other failure). '*unanswered' is set when
 * the attempt went out and no answer came in time: the node may run it. */
static lock_status acquire_on(multi_lock_set *s, size_t i, const char *key, const char *owner,
                              long lease_ms, int *unanswered)
{
    lock_acquire_op op;
    char why[256];
    redisContext *c = conn(s, i, 0, why, sizeof why);
    lock_status sent, ls;

    *unanswered = 0;
    if (c == NULL)
        return LOCK_ERR;
    sent = lock_acquire_send_within(c, &op, key, owner, lease_ms, s->timeout_ms);
    ls = lock_acquire_recv(c, &op, NULL);   /* sends, reads, frees the op: runs whatever was sent */
    if (sent != LOCK_OK || (ls != LOCK_OK && ls != LOCK_BUSY))
        ls = LOCK_ERR;
    if (c->err) {
        *unanswered = timed_out(c);
        drop(s, i);
    } else {
        s->conns[i].answered = 1;
    }
    return ls;
}

lock_status multi_lock_acquire(multi_lock_set *s, multi_lock_quorum q, const char *key, const char *owner,
                          long lease_ms, multi_lock_grant *g)
{
    size_t needed = multi_lock_needed(q, s->n), ngranted = 0, left = s->n, i;
    int64_t t0 = util_mono_us();
    lock_status st;

    memset(g, 0, sizeof *g);
    if (lease_ms <= 0) {
        log_warn("multi_lock %s: a fixed lease is required", key);
        return LOCK_ERR;
    }
    /* One node after the other, in the list's order, until the quorum can
     * no longer be reached: contenders then meet at the first node, and the
     * one it grants meets no rival further on (sent to all nodes at once,
     * a storm split the nodes between contenders, and all of them lost). */
    for (i = 0; i < s->n && ngranted + left >= needed; i++) {
        int unanswered;

        left--;
        switch (acquire_on(s, i, key, owner, lease_ms, &unanswered)) {
        case LOCK_OK:
            g->granted |= 1u << i;
            ngranted++;
            break;
        case LOCK_BUSY:
            g->busy |= 1u << i;
            break;
        default:
            g->failed |= 1u << i;
            if (unanswered)
                g->unanswered |= 1u << i;
            break;
        }
    }
    g->elapsed_us = util_mono_us() - t0;
    g->validity_ms = lease_ms - (g->elapsed_us + 999) / 1000 - multi_lock_drift_ms(lease_ms);
    if (ngranted >= needed && g->validity_ms > 0)
        return LOCK_OK;
    /* busy when a rival's holds stand in the way, not failed nodes alone */
    st = g->busy != 0 && ngranted + (size_t)__builtin_popcount(g->busy) + left >= needed
             ? LOCK_BUSY : LOCK_ERR;
    if (ngranted >= needed)
        log_warn("multi_lock %s: granted by %zu nodes but no validity left (%lld ms after %lld us)",
                 key, ngranted, (long long)g->validity_ms, (long long)g->elapsed_us);
    /* A failed attempt: undone wherever it may have been granted. */
    multi_lock_release(s, key, owner, lease_ms, g->granted | g->failed, g->unanswered, NULL);
    return st;
}

int multi_lock_release(multi_lock_set *s, const char *key, const char *owner, long lease_ms,
                  unsigned mask, unsigned reach, int *not_owner)
{
    char why[256];
    int released = 0, refused = 0;

    for (size_t i = 0; i < s->n; i++) {
        redisContext *c;
        lock_status ls;
        if (!(mask & (1u << i)) || (c = conn(s, i, (reach >> i) & 1u, why, sizeof why)) == NULL)
            continue;
        ls = lock_release(c, key, owner, lease_ms, NULL);
        if (ls == LOCK_OK)
            released++;
        else if (ls == LOCK_NOT_OWNER)
            refused++;
        if (c->err)
            drop(s, i);
        else
            s->conns[i].answered = 1;
    }
    if (not_owner != NULL)
        *not_owner = refused;
    return released;
}

int multi_lock_check(multi_lock_set *s, char *err, size_t errlen)
{
    char why[256];

    for (size_t i = 0; i < s->n; i++) {
        const redis_url *nd = &s->conns[i].node;
        redisContext *c = conn(s, i, 0, why, sizeof why);
        if (c == NULL || !reply_ok(c, redisCommand(c, "PING"), why, sizeof why, "PING")) {
            snprintf(err, errlen, "node %zu (%s:%d): %s", i + 1, nd->host, nd->port, why);
            if (c != NULL)
                drop(s, i);
            s->conns[i].retry_at_us = 0;
            return -1;
        }
        s->conns[i].answered = 1;
    }
    return 0;
}
